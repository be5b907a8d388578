//! Event-to-kernel latency, peak memory and leader takeover of the real release `nodelb-agent`
//! against a real kube-apiserver: the e2e harness's control plane (etcd, and kube-apiserver built
//! from the pinned `k8s.io/kubernetes` module by `scripts/kubernetes.sh`, in a control-plane
//! namespace), with agents in node namespaces of the harness (never the host's netfilter).
//!
//! Per size N (`NODELB_BENCH_LATENCY_SERVICES`, default `1000,10000`), on a fresh cluster:
//! 1. Load: N LoadBalancer Services (one TCP port each, outside the reserved ranges, with
//!    `allocateLoadBalancerNodePorts: false`: nodelb uses no NodePort, and the default NodePort
//!    range holds only 2,768) and one EndpointSlice of `NODELB_BENCH_LATENCY_ENDPOINTS`
//!    documentation-address endpoints each (5 by default; at 15, 150,000 endpoints at 10,000
//!    Services, the goals are issue 30's: peak RSS under 96 MiB, and a p99 under 10 ms from
//!    the PUT's response),
//!    created through the API by the admin client with `NODELB_BENCH_LATENCY_LOAD_CONCURRENCY`
//!    requests in flight (default 32); the load time is printed (it grows quadratically: see
//!    [`load`]). No kube-controller-manager runs, so no EndpointSlice controller: the bench
//!    writes the slices it would. Then the agent starts, and the bench waits for `/readyz`, for
//!    `nodelb_services_programmed == N`, and for the status writer and syncs to go quiet (a
//!    leader first writes N statuses and N `EnsuredLoadBalancer` Events, one at a time, paced at
//!    100 requests a second after a burst of 200: about 200 s at 10,000).
//! 2. Latency: `NODELB_BENCH_LATENCY_SAMPLES` times (default 200), spaced
//!    `NODELB_BENCH_LATENCY_SPACING_MS` apart (default 50, so syncs do not coalesce), one
//!    EndpointSlice is replaced by a PUT through the admin client (one endpoint address
//!    changed). "Visible in the kernel" is the first nftables transaction touching nodelb's
//!    tables with element changes, by another process (the agent), reported to an
//!    `NFNLGRP_NFTABLES` subscriber (`nodelb_netfilter::Watcher`) running in the node
//!    namespace, after the PUT was sent. Every `VERIFY_EVERY`th sample is then checked with
//!    `nft get element`: the new address is in the Service's endpoint map entries and the old
//!    one is gone; if not, that transaction was someone else's and the next one is taken. At
//!    the end `nft list map` shows every Service's endpoints and every moved address.
//!    Latency is printed from the PUT being sent (an upper bound; the goal is judged on it:
//!    it includes the server's admission, the etcd write and the watch fan-out) and from its
//!    response (the write accepted), with p50/p99/max; the agent's own per-sync timings (its
//!    debug log) break the time down.
//! 3. Memory: `VmHWM` and `VmRSS` of the agent from `/proc/<pid>/status`, after the load and
//!    after the latency run and a full replace (drift made by the bench: a foreign chain in
//!    nodelb's table, which the agent removes), so the peak includes the moment the agent
//!    holds the committed model and newly assembled tables at once, as on every resync. The
//!    bench's event subscriber is stopped before it: with a listener the kernel builds an event
//!    per object of the replace (the agent pauses its own watch for it).
//! 4. Takeover (the leader run of the largest size; `NODELB_BENCH_LATENCY_TAKEOVER=0` skips
//!    it): a second node's agent joins. By default that node is labelled
//!    `node.kubernetes.io/exclude-from-external-load-balancers`, so its joining changes no
//!    status; with `NODELB_BENCH_LATENCY_TAKEOVER=serving` it serves too, and the leader first
//!    adds its address to every Service (N status writes and one `NodeServing` Event on its
//!    Node, for a real change). Once every Service lists the serving nodes and the writer is
//!    quiet, the leader is rolled as a DaemonSet update rolls it: SIGTERM (it releases
//!    `nodelb-status`), and started again once the other agent holds the Lease. The second
//!    agent has taken over N converged Services. From kube-apiserver's audit log the bench
//!    counts what the new leader writes (`create` of `events` in group `events.k8s.io`, and
//!    Service status writes, from its node's address) over one node lease duration (the grace
//!    a new leader gives every node's heartbeat, while the rolled agent restarts) plus
//!    `TAKEOVER_SETTLE`, prints those Events, and checks every Service still lists the same
//!    nodes. Goal: no per-Service Event.
//! 5. Peers, same run: kube-proxy's default minimum sync period (1 s, a constant of its
//!    configuration, not measured), and `nft -f` of the same one-endpoint change as a one-line
//!    incremental script in a scratch namespace holding a copy of the agent's table (process
//!    spawn, parse and kernel commit: the raw cost the agent's end-to-end figure stands on).
//!
//! 6. First round (`NODELB_BENCH_LATENCY_FIRST_ROUND`: `1` by default, at the largest size;
//!    `0` skips it, `only` runs nothing else): a new leader's first status round must not
//!    stall the dataplane. On a fresh cluster two serving nodes' agents start as followers (the
//!    Lease held by another identity) on N Services whose statuses nobody wrote yet, with
//!    `--resync-interval=30s` and an nftables listener in each node namespace; then the Lease
//!    is released and one agent writes N statuses and N Events. EndpointSlice changes, spaced
//!    as in phase 2, are timed to each node's kernel until that round ends (see
//!    `latency/first_round.rs`). Printed: the new leader's and the follower's p50/p99/max,
//!    the round's length, and its status writes and Events per second. Then the fan-out: the
//!    follower's agent is SIGKILLed, and until the leader has dropped its node from every
//!    status, changes are timed to the leader's kernel. Printed: the time from the kill to the
//!    last status without the node (goal: within 30 s of the heartbeat going stale, at 10,000),
//!    the writes per second, the Events (one on the Node, none on Services), and the p99.
//!
//! 7. Cold start (`NODELB_BENCH_LATENCY_COLD_START`: `0` by default, `1` at the largest size,
//!    `only` runs nothing else): from the agent's exec to the kernel programmed and `/readyz`
//!    answering 200, starts into an empty kernel and restarts over the tables left, with the
//!    agent's own start-up line saying where the time went (client, each watch's list, plan,
//!    encode, commit), beside the bench's own paged list of both kinds, server time and decode
//!    apart (see `latency/cold_start.rs`). Phase 1's start is broken down the same way.
//!
//! The single agent is the leader (it writes every Service's status). With
//! `NODELB_BENCH_LATENCY_FOLLOWER=1` every size runs again with the `nodelb-status` Lease held by
//! another identity (renewed by the bench), so the agent is a follower, as most agents of a
//! cluster are.
//!
//! Goals, printed PASS/MISS and never asserted: p99 < 100 ms at 10,000 Services, peak RSS
//! < 64 MiB at 10,000 Services x 5 endpoints (leader and follower), no per-Service Event from a new leader taking
//! over converged Services, a cold start under 1.5 s at 10,000 Services, and during a new leader's first round at 10,000 Services
//! event-to-kernel under 100 ms on the leader and on a follower (p99, and max). Errors (an agent that never programs, a kernel state that does not
//! match, a status that does not converge) fail the run. Every phase's wall time is printed.
//!
//! The agent is `NODELB_AGENT_BIN`, else `target/release/nodelb-agent` of this workspace (build
//! it with `cargo build --release -p nodelb-agent`). Needs root, `etcd` (scripts/deps.sh) and
//! the pinned kube-apiserver (`scripts/kubernetes.sh`, run by the harness when missing);
//! without root prints SKIP and exits 0, or 1 when `CI=true`. Not against
//! `NODELB_E2E_KUBECONFIG`: the takeover reads the audit log of the harness's own server.
//! Run: `cargo bench -p nodelb-integration --bench latency`.

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::api::core::v1::Node;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use k8s_openapi::api::events::v1::Event;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, ListParams, ObjectMeta, Patch, PatchParams, PostParams};
use nix::sys::signal::Signal;
use nodelb_core::vocab::IpFamily;
use nodelb_integration::bench::{
    env_usize, goal, memory, mib, ms, release_agent_binary, wait_until, Memory, Stats,
};
use nodelb_integration::control_plane::AuditRecord;
use nodelb_integration::e2e::{
    agent_pod_name, metric_sum, metric_value, Cluster, ClusterOptions, AGENT_NAMESPACE,
};
use nodelb_integration::element_watch::tgid;
use nodelb_integration::lb_services::{
    initial_address, load, max_services, ports, service_name, TARGET_PORT,
};
use nodelb_integration::netns::Netns;
use nodelb_integration::nft::nft_file;
use nodelb_netfilter::{WatchEvent, Watcher};
use serde_json::json;
use std::net::{IpAddr, Ipv4Addr};
use std::path::PathBuf;
use std::process::{Command, ExitCode};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::sync::Arc;
use std::time::{Duration, Instant};

#[path = "latency/cold_start.rs"]
mod cold_start;
#[path = "latency/first_round.rs"]
mod first_round;

/// Endpoints per Service: `NODELB_BENCH_LATENCY_ENDPOINTS`, 5 by default (set once by
/// [`config`]).
static ENDPOINTS: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
const GOAL_P99_MS: f64 = 100.0;
const GOAL_RSS_MIB: f64 = 64.0;
/// Issue 30's goals at 10,000 Services x 15 endpoints (150,000 endpoints): the agent's peak
/// RSS, and the p99 from the PUT's response.
const LIMITS_ENDPOINTS: usize = 15;
const LIMITS_RSS_MIB: f64 = 96.0;
const LIMITS_P99_MS: f64 = 10.0;

fn endpoints() -> usize {
    ENDPOINTS.get().copied().unwrap_or(5)
}
/// The size the goals are stated for.
const GOAL_SERVICES: usize = 10_000;
/// kube-proxy's default `minSyncPeriod` (iptables and nftables modes): a configuration
/// constant, quoted, not measured.
const KUBE_PROXY_MIN_SYNC: Duration = Duration::from_secs(1);
/// How long a change may take before a sample counts as lost (an error).
const SAMPLE_TIMEOUT: Duration = Duration::from_secs(10);
/// Upper bounds for the agent to start and program everything, and for the status writer
/// (one server-side apply and one Event per Service) to finish and go quiet.
const READY_TIMEOUT: Duration = Duration::from_secs(180);
const QUIET_TIMEOUT: Duration = Duration::from_secs(300);
/// The agent's default `--resync-interval` (the harness's tests use 30 s).
const AGENT_RESYNC: Duration = Duration::from_secs(300);
/// The agent's default `--node-lease-duration`: a new leader gives every node's heartbeat this
/// much grace.
const NODE_LEASE: Duration = Duration::from_secs(15);
/// How long the takeover is watched beyond the new leader's grace.
const TAKEOVER_SETTLE: Duration = Duration::from_secs(5);
/// Every this many samples, the sample is also checked with `nft get element` (which takes
/// seconds at 10,000 Services: nft 1.0 fetches the whole ruleset first), outside the timing.
const VERIFY_EVERY: usize = 25;
/// Peer runs of `nft -f`.
const PEER_RUNS: usize = 21;
/// The `nodelb-status` holder a follower run invents.
const OTHER_HOLDER: &str = "latency-bench-other-agent";
/// The Node label that keeps a node out of every Service's serving nodes.
const EXCLUDE_LABEL: &str = "node.kubernetes.io/exclude-from-external-load-balancers";
/// Events of the new leader printed in full.
const EVENTS_SHOWN: usize = 20;

type Res<T> = Result<T, String>;

fn main() -> ExitCode {
    nodelb_integration::netns::bench_main("latency", run)
}

struct Config {
    /// `(Services, follower)` runs: a follower's agent finds the `nodelb-status` Lease held by
    /// someone else, so it runs no status writer.
    runs: Vec<(usize, bool)>,
    sizes: Vec<usize>,
    samples: usize,
    spacing: Duration,
    /// Requests in flight while loading.
    concurrency: usize,
    /// The size whose leader run ends with a takeover, and how, if any.
    takeover: Option<(usize, Takeover)>,
    /// The size of the first-round phase, if it runs.
    first_round: Option<usize>,
    /// The size of the cold start phase, if it runs.
    cold_start: Option<usize>,
}

/// How the second node of the takeover takes part (`NODELB_BENCH_LATENCY_TAKEOVER`).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Takeover {
    /// `1` (the default): the second node is labelled
    /// `node.kubernetes.io/exclude-from-external-load-balancers`, as control-plane nodes often
    /// are: its agent runs, heartbeats and can lead, but serves no Service, so its joining
    /// changes no status and the takeover happens over the statuses the first leader wrote.
    Excluded,
    /// `serving`: the second node serves too; the leader first adds its address to every
    /// Service (N status writes and N Events, for a real change, paced: about 3.5 minutes more
    /// at 10,000 Services).
    Serving,
}

impl Takeover {
    fn describe(self) -> &'static str {
        match self {
            Takeover::Excluded => "second node excluded from load balancers",
            Takeover::Serving => "second node serving",
        }
    }
}

fn config() -> Res<Config> {
    let sizes = match std::env::var("NODELB_BENCH_LATENCY_SERVICES") {
        Err(_) => vec![1_000, 10_000],
        Ok(v) => v
            .split(',')
            .map(|s| match s.trim().parse::<usize>() {
                Ok(n) if (1..=max_services()).contains(&n) => Ok(n),
                _ => Err(format!(
                    "NODELB_BENCH_LATENCY_SERVICES={v:?}: expected comma-separated integers in 1..={}",
                    max_services()
                )),
            })
            .collect::<Res<Vec<_>>>()?,
    };
    let samples = env_usize("NODELB_BENCH_LATENCY_SAMPLES", 200, 2)?;
    let follower = env_bool("NODELB_BENCH_LATENCY_FOLLOWER", false)?;
    let takeover = match std::env::var("NODELB_BENCH_LATENCY_TAKEOVER").as_deref() {
        Err(_) | Ok("") | Ok("1") => Some(Takeover::Excluded),
        Ok("0") => None,
        Ok("serving") => Some(Takeover::Serving),
        Ok(v) => {
            return Err(format!(
                "NODELB_BENCH_LATENCY_TAKEOVER={v:?}: expected 0, 1 or serving"
            ))
        }
    };
    let (main, first_round) = match std::env::var("NODELB_BENCH_LATENCY_FIRST_ROUND").as_deref() {
        Err(_) | Ok("") | Ok("1") => (true, true),
        Ok("0") => (true, false),
        Ok("only") => (false, true),
        Ok(v) => {
            return Err(format!(
                "NODELB_BENCH_LATENCY_FIRST_ROUND={v:?}: expected 0, 1 or only"
            ))
        }
    };
    let (main, first_round, cold_start) =
        match std::env::var("NODELB_BENCH_LATENCY_COLD_START").as_deref() {
            Err(_) | Ok("") | Ok("0") => (main, first_round, false),
            Ok("1") => (main, first_round, true),
            Ok("only") => (false, false, true),
            Ok(v) => {
                return Err(format!(
                    "NODELB_BENCH_LATENCY_COLD_START={v:?}: expected 0, 1 or only"
                ))
            }
        };
    let mut runs: Vec<(usize, bool)> = sizes.iter().map(|n| (*n, false)).collect();
    if follower {
        runs.extend(sizes.iter().map(|n| (*n, true)));
    }
    if !main {
        runs.clear();
    }
    let spacing =
        Duration::from_millis(env_usize("NODELB_BENCH_LATENCY_SPACING_MS", 50, 0)? as u64);
    let concurrency = env_usize("NODELB_BENCH_LATENCY_LOAD_CONCURRENCY", 32, 1)?;
    let eps = env_usize("NODELB_BENCH_LATENCY_ENDPOINTS", 5, 1)?;
    if eps > 90 {
        return Err(format!(
            "NODELB_BENCH_LATENCY_ENDPOINTS={eps}: at most 90 (endpoints start at 198.51.100.10-99; moved ones go to 100-249)"
        ));
    }
    ENDPOINTS.set(eps).map_err(|_| "config() runs once")?;
    Ok(Config {
        runs,
        takeover: takeover.and_then(|t| Some((sizes.iter().copied().max()?, t))),
        first_round: sizes.iter().copied().max().filter(|_| first_round),
        cold_start: sizes.iter().copied().max().filter(|_| cold_start),
        sizes,
        samples,
        spacing,
        concurrency,
    })
}

fn env_bool(name: &str, default: bool) -> Res<bool> {
    match std::env::var(name).as_deref() {
        Err(_) | Ok("") => Ok(default),
        Ok("0") => Ok(false),
        Ok("1") => Ok(true),
        Ok(v) => Err(format!("{name}={v:?}: expected 0 or 1")),
    }
}

// ---- ports and objects -------------------------------------------------------------------

/// Sample `k`'s change: a Service (the samples spread over all of them) whose slice's first
/// endpoint moves to a new address. Returns the Service's index, the old address and the new.
fn move_endpoint(slices: &mut [EndpointSlice], k: usize) -> (usize, String, String) {
    let i = (k * 7919 + 13) % slices.len();
    let slice = &mut slices[i];
    let old = slice.endpoints[0].addresses[0].clone();
    let mut new = format!("198.51.100.{}", 100 + k % 150);
    if new == old {
        new = format!("198.51.100.{}", 100 + (k + 1) % 150);
    }
    slice.endpoints[0].addresses = vec![new.clone()];
    (i, old, new)
}

// ---- statistics --------------------------------------------------------------------------

/// The statistics of samples a phase must have taken.
fn stats(v: &[f64]) -> Stats {
    nodelb_integration::bench::stats(v).expect("a phase took no samples")
}

fn print_row(label: &str, s: &Stats) {
    println!(
        "  {label:<52} {:>5} {:>9.2} {:>9.2} {:>9.2} {:>9.2} {:>9.2}",
        s.n, s.min, s.p50, s.p99, s.max, s.mean
    );
}

fn print_header() {
    println!(
        "  {:<52} {:>5} {:>9} {:>9} {:>9} {:>9} {:>9}",
        "ms", "n", "min", "p50", "p99", "max", "mean"
    );
}

/// Wall time per phase of one size's run, printed as each ends and again in the summary.
#[derive(Default)]
struct Phases(Vec<(String, Duration)>);

impl Phases {
    /// Records and prints that `what` took from `since` until now.
    fn done(&mut self, what: &str, since: Instant) {
        let took = since.elapsed();
        println!("  [phase] {what}: {:.1} s", took.as_secs_f64());
        self.0.push((what.to_string(), took));
    }
}

// ---- the nftables watch ------------------------------------------------------------------

/// A transaction by another process on nodelb's tables, stamped when the watcher read it.
struct Seen {
    at: Instant,
    pid: Option<u32>,
    process: Option<String>,
    events: Vec<String>,
    overrun: bool,
}

/// A `Watcher` on `ip nodelb` and `ip6 nodelb` in a thread inside `ns`.
struct KernelWatch {
    rx: mpsc::Receiver<Seen>,
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<Res<()>>>,
}

impl KernelWatch {
    fn start(ns: &Netns) -> Res<KernelWatch> {
        let (tx, rx) = mpsc::channel();
        let (ready_tx, ready_rx) = mpsc::channel::<Res<()>>();
        let stop = Arc::new(AtomicBool::new(false));
        let stop2 = stop.clone();
        let path = ns.path();
        let name = ns.name().to_string();
        let thread = std::thread::Builder::new()
            .name("nft-watch".into())
            .spawn(move || -> Res<()> {
                let fd = std::fs::File::open(&path)
                    .map_err(|e| format!("opening {}: {e}", path.display()))?;
                nix::sched::setns(fd, nix::sched::CloneFlags::CLONE_NEWNET)
                    .map_err(|e| format!("setns into {name}: {e}"))?;
                let nodelb = nodelb_core::plan::config::Config::default();
                let tables = [IpFamily::V4, IpFamily::V6]
                    .into_iter()
                    .map(|f| nodelb.table_ref(f))
                    .collect();
                let mut w = match Watcher::open(tables) {
                    Ok(w) => w,
                    Err(e) => {
                        let _ = ready_tx.send(Err(format!("Watcher::open: {e}")));
                        return Err(format!("Watcher::open: {e}"));
                    }
                };
                let _ = ready_tx.send(Ok(()));
                while !stop2.load(Ordering::Relaxed) {
                    let ev = w
                        .next(Duration::from_millis(100))
                        .map_err(|e| format!("nftables watch: {e}"))?;
                    let at = Instant::now();
                    let seen = match ev {
                        None => continue,
                        Some(WatchEvent::Foreign(c)) => Seen {
                            at,
                            pid: c.pid,
                            process: c.process,
                            events: c.events,
                            overrun: false,
                        },
                        Some(WatchEvent::Overrun) => Seen {
                            at,
                            pid: None,
                            process: None,
                            events: Vec::new(),
                            overrun: true,
                        },
                    };
                    if tx.send(seen).is_err() {
                        break;
                    }
                }
                Ok(())
            })
            .map_err(|e| format!("spawning the watch thread: {e}"))?;
        ready_rx
            .recv_timeout(Duration::from_secs(5))
            .map_err(|e| format!("the watch thread did not start: {e}"))??;
        Ok(KernelWatch {
            rx,
            stop,
            thread: Some(thread),
        })
    }

    /// Everything seen so far.
    fn drain(&self) -> Vec<Seen> {
        self.rx.try_iter().collect()
    }
}

impl Drop for KernelWatch {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            match t.join() {
                Ok(Ok(())) => {}
                Ok(Err(e)) => eprintln!("latency bench: watch thread: {e}"),
                Err(_) => eprintln!("latency bench: watch thread panicked"),
            }
        }
    }
}

// ---- the agent ---------------------------------------------------------------------------

/// One "synced" line of the agent's debug log.
#[derive(Default, Clone, Copy)]
struct SyncLine {
    /// When it was logged (the sync's end).
    at: Option<Timestamp>,
    plan: Option<Duration>,
    encode: Option<Duration>,
    commit: Option<Duration>,
    took: Option<Duration>,
    /// From the agent's receipt of the first watch event the sync took to its commit.
    event_to_kernel: Option<Duration>,
}

/// A `Debug`-printed `Duration` (`12.3µs`, `1.5ms`, `2s`, `40ns`).
fn parse_duration(s: &str) -> Option<Duration> {
    let split = s.find(|c: char| !(c.is_ascii_digit() || c == '.'))?;
    let (num, unit) = s.split_at(split);
    let v: f64 = num.parse().ok()?;
    let secs = match unit {
        "s" => v,
        "ms" => v / 1e3,
        "µs" | "us" => v / 1e6,
        "ns" => v / 1e9,
        _ => return None,
    };
    Some(Duration::from_secs_f64(secs))
}

fn sync_lines(log: &str) -> Vec<SyncLine> {
    log.lines()
        .filter(|l| l.contains(" synced") && l.contains("took="))
        .map(|l| {
            let mut s = SyncLine {
                at: l.split_whitespace().next().and_then(|t| t.parse().ok()),
                ..SyncLine::default()
            };
            for word in l.split_whitespace() {
                if let Some((k, v)) = word.split_once('=') {
                    let v = v
                        .strip_prefix("Some(")
                        .map_or(v, |v| v.trim_end_matches(')'));
                    let d = parse_duration(v);
                    match k {
                        "plan" => s.plan = d,
                        "encode" => s.encode = d,
                        "commit" => s.commit = d,
                        "took" => s.took = d,
                        "event_to_kernel" => s.event_to_kernel = d,
                        _ => {}
                    }
                }
            }
            s
        })
        .collect()
}

// ---- the kernel side ---------------------------------------------------------------------

/// The endpoint map entries of the Service on `port`, as `nft get element` prints them.
fn endpoint_entries(ns: &Netns, port: u16) -> Res<String> {
    let keys: Vec<String> = (0..endpoints())
        .map(|k| format!("tcp . {port} . {k}"))
        .collect();
    ns.sh_ok(&format!(
        "nft get element ip nodelb endpoints '{{ {} }}'",
        keys.join(", ")
    ))
}

fn holds(entries: &str, addr: &str) -> bool {
    entries.contains(&format!(": {addr} . {TARGET_PORT}"))
}

/// The peer: the agent's table copied into a scratch namespace, then the same one-endpoint
/// change as one line of `nft -f` (delete and re-add one endpoint map element), alternating two
/// addresses, `PEER_RUNS` times. Also times `nft -f` of the empty script (spawn and cache only).
fn nft_peer(table_text: &str, port: u16, comment: &str) -> Res<(Vec<f64>, Vec<f64>, Duration)> {
    let ns = Netns::new("bench-peer");
    ns.run(|| -> Res<_> {
        let load = nft_file(table_text)
            .map_err(|e| format!("loading the agent's table with nft -f: {e}"))?;
        let mut change = Vec::new();
        let mut empty = Vec::new();
        for r in 0..PEER_RUNS {
            let addr = format!("198.51.100.{}", 250 + r % 2);
            let script = format!(
                "delete element ip nodelb endpoints {{ tcp . {port} . 0 }}; add element ip nodelb endpoints {{ tcp . {port} . 0 comment \"{comment}\" : {addr} . {TARGET_PORT} }}\n"
            );
            change.push(ms(nft_file(&script)?));
            empty.push(ms(nft_file("\n")?));
        }
        let entries = Command::new("nft")
            .args(["get", "element", "ip", "nodelb", "endpoints"])
            .arg(format!("{{ tcp . {port} . 0 }}"))
            .output()
            .map_err(|e| format!("nft get element: {e}"))?;
        let text = String::from_utf8_lossy(&entries.stdout);
        let last = format!("198.51.100.{}", 250 + (PEER_RUNS - 1) % 2);
        if !holds(&text, &last) {
            return Err(format!(
                "peer: after the nft -f changes the scratch table holds {text:?}, expected {last}"
            ));
        }
        Ok((change, empty, load))
    })
}

/// The final check, by listing the whole endpoint map in `node` (independent of nodelb's
/// code): every Service's endpoints are there, and each of `moved` (Service index, address)
/// maps to its last address. Returns how many endpoint elements are listed.
fn check_moved(
    node: &Netns,
    ns: &str,
    n: usize,
    ports: &[u16],
    moved: &[(usize, String)],
) -> Res<usize> {
    let map = node
        .sh_ok("nft list map ip nodelb endpoints")
        .map_err(|e| format!("listing the endpoint map: {e}"))?;
    let elements = map.matches(&format!("comment \"{ns}/")).count();
    if elements != n * endpoints() {
        return Err(format!(
            "the endpoint map lists {elements} elements, expected {}",
            n * endpoints()
        ));
    }
    for (i, addr) in moved {
        let want = format!("tcp . {} . ", ports[*i]);
        let ok = map
            .lines()
            .any(|l| l.contains(&want) && l.contains(&format!(": {addr} . {TARGET_PORT}")));
        if !ok {
            return Err(format!(
                "after the run, Service {i} (port {}) does not map to {addr}",
                ports[*i]
            ));
        }
    }
    Ok(elements)
}

// ---- the API -----------------------------------------------------------------------------

/// `nodelb-status` held by [`OTHER_HOLDER`] for an hour.
fn other_lease() -> Lease {
    Lease {
        metadata: ObjectMeta {
            name: Some("nodelb-status".into()),
            namespace: Some(AGENT_NAMESPACE.into()),
            ..Default::default()
        },
        spec: Some(LeaseSpec {
            holder_identity: Some(OTHER_HOLDER.into()),
            lease_duration_seconds: Some(3600),
            acquire_time: Some(MicroTime(Timestamp::now())),
            renew_time: Some(MicroTime(Timestamp::now())),
            ..Default::default()
        }),
    }
}

/// Renews `nodelb-status` every 2 s as a live holder would: the agent counts a holder as gone
/// when the Lease record stays unchanged for its own `--lease-duration` (15 s), as client-go
/// does.
async fn renew_other(leases: Api<Lease>) {
    loop {
        tokio::time::sleep(Duration::from_secs(2)).await;
        if let Ok(mut l) = leases.get("nodelb-status").await {
            if let Some(s) = l.spec.as_mut() {
                s.renew_time = Some(MicroTime(Timestamp::now()));
            }
            let _ = leases
                .replace("nodelb-status", &PostParams::default(), &l)
                .await;
        }
    }
}

fn audit(c: &Cluster) -> Res<Vec<AuditRecord>> {
    c.audit()
        .ok_or_else(|| "no audit log: the bench needs the harness's own kube-apiserver".into())
}

// ---- the agent, over time --------------------------------------------------------------------

/// `nodelb_status_writes_total{result="ok"}`.
fn status_ok(metrics: &str) -> f64 {
    metric_value(metrics, "nodelb_status_writes_total{result=\"ok\"}").unwrap_or(0.0)
}

/// Waits until node `i`'s agent answers `/readyz` with 200 and programs `n` Services;
/// returns how long each took from `t0`.
fn wait_programmed(c: &mut Cluster, i: usize, n: usize, t0: Instant) -> Res<(Duration, Duration)> {
    loop {
        if !c.agent_running(i) {
            return Err(format!(
                "node {i}'s agent exited during start-up; log:\n{}",
                tail(&c.agent_log(i), 40)
            ));
        }
        if matches!(c.readyz(i), Ok((200, _))) {
            break;
        }
        if t0.elapsed() > READY_TIMEOUT {
            return Err(format!(
                "node {i}'s agent is not ready after {READY_TIMEOUT:?}; log:\n{}",
                tail(&c.agent_log(i), 40)
            ));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let ready = t0.elapsed();
    wait_until(
        &format!("nodelb_services_programmed == {n} on node {i}"),
        READY_TIMEOUT.saturating_sub(ready),
        Duration::from_millis(50),
        || {
            Ok(
                (metric_sum(&c.try_metrics(i)?, "nodelb_services_programmed") as usize == n)
                    .then_some(()),
            )
        },
    )?;
    Ok((ready, t0.elapsed()))
}

/// Waits until node `i`'s status writes and syncs (and the kernel, when watched) stay unchanged
/// for 1.5 s; returns the status writes and syncs then, and how many transactions on nodelb's
/// tables the watch had seen since it was last drained.
fn wait_quiet(c: &Cluster, i: usize, watch: Option<&KernelWatch>) -> Res<(f64, f64, usize)> {
    let t0 = Instant::now();
    let mut last = (f64::NAN, f64::NAN);
    let mut still = 0;
    let mut transactions = 0;
    while still < 3 {
        if t0.elapsed() > QUIET_TIMEOUT {
            return Err(format!(
                "node {i}'s agent did not go quiet within {QUIET_TIMEOUT:?}"
            ));
        }
        std::thread::sleep(Duration::from_millis(500));
        let m = c.try_metrics(i)?;
        let now = (
            metric_sum(&m, "nodelb_status_writes_total") + 0.0,
            metric_sum(&m, "nodelb_syncs_total") + 0.0,
        );
        let seen = watch.map_or(Vec::new(), KernelWatch::drain);
        transactions += seen
            .iter()
            .filter(|e| e.overrun || !e.events.is_empty())
            .count();
        still = if now == last && seen.is_empty() {
            still + 1
        } else {
            0
        };
        last = now;
    }
    Ok((last.0, last.1, transactions))
}

/// Waits until node `i`'s agent, a leader, has written every one of `n` Services' status
/// (`ok_before` + `n` successful writes), then until it is quiet.
fn wait_status_written(c: &Cluster, i: usize, n: usize, ok_before: f64) -> Res<()> {
    wait_until(
        &format!("node {i}'s agent writing {n} Services' status"),
        QUIET_TIMEOUT,
        Duration::from_millis(250),
        || Ok((status_ok(&c.try_metrics(i)?) >= ok_before + n as f64).then_some(())),
    )?;
    wait_quiet(c, i, None).map(|_| ())
}

// ---- one size ----------------------------------------------------------------------------

struct SizeResult {
    follower: bool,
    services: usize,
    version: String,
    from_put: Stats,
    from_accept: Stats,
    hwm_kib: u64,
    rss_kib: u64,
    load: Duration,
    phases: Phases,
    takeover: Option<TakeoverResult>,
}

struct TakeoverResult {
    kind: Takeover,
    services: usize,
    /// The old leader's status writes and Events when the second node joined (a real change).
    join_writes: usize,
    join_events: usize,
    /// SIGTERM to the leader -> the other agent holds `nodelb-status` and says so.
    handover: Duration,
    /// The rolled leader's restart -> it programs every Service again.
    restart: Duration,
    /// From the takeover until the bench stopped watching.
    window: Duration,
    /// The new leader's Event creates in the window: about Services (in their namespace), and
    /// elsewhere (Node Events go to `default`).
    service_events: usize,
    other_events: usize,
    /// The new leader's Service status writes in the window.
    status_writes: usize,
    /// The serving nodes' addresses every Service lists.
    want: Vec<String>,
    /// Services listing `want` at the end.
    converged: usize,
    /// The new leader's Events: `type reason regarding: note`.
    shown: Vec<String>,
}

fn run() -> Res<()> {
    let t_all = Instant::now();
    let cfg = config()?;
    let bin = release_agent_binary()?;
    println!(
        "nodelb event-to-kernel latency benchmark (release agent, real kube-apiserver with etcd, one node; a second for the takeover)"
    );
    println!(
        "  sizes (Services x {} endpoints): {:?}; {} samples per size, spaced {} ms; load with {} requests in flight; takeover at {}",
        endpoints(),
        cfg.sizes,
        cfg.samples,
        cfg.spacing.as_millis(),
        cfg.concurrency,
        cfg.takeover
            .map_or("none".to_string(), |(n, t)| format!("{n} ({})", t.describe()))
    );
    println!("  agent: {}", bin.display());
    println!(
        "  kernel {}, {}, {}, {} CPUs; agent flags: harness defaults, --sync-debounce 10ms (default), --resync-interval {}s (default)",
        sh_out("uname", &["-r"]).trim(),
        sh_out("nft", &["--version"]).trim(),
        sh_out("etcd", &["--version"]).lines().next().unwrap_or("etcd ?").trim(),
        std::thread::available_parallelism().map_or(0, |n| n.get()),
        AGENT_RESYNC.as_secs()
    );
    // The agent's per-sync timings come from its debug log ("synced", where each sync's
    // outcome is recorded; `run::sync` for agents built before `run::record` existed).
    if std::env::var_os("NODELB_E2E_LOG").is_none() {
        std::env::set_var(
            "NODELB_E2E_LOG",
            "info,nodelb_agent::run::record=debug,nodelb_agent::run::sync=debug",
        );
    }
    let mut results = Vec::new();
    for &(n, follower) in &cfg.runs {
        let takeover = cfg
            .takeover
            .filter(|(size, _)| !follower && *size == n)
            .map(|(_, t)| t);
        results.push(one_size(n, follower, takeover, &cfg)?);
    }
    let mut round_phases = Phases::default();
    let round = match cfg.first_round {
        Some(n) => Some(first_round::first_round(n, &cfg, &mut round_phases)?),
        None => None,
    };
    let cold = match cfg.cold_start {
        Some(n) => Some(cold_start::cold_start(n, &cfg)?),
        None => None,
    };
    let version = results
        .first()
        .map(|r| r.version.clone())
        .or_else(|| round.as_ref().map(|r| r.version.clone()))
        .or_else(|| cold.as_ref().map(|r| r.version.clone()))
        .unwrap_or_else(|| "?".to_string());

    println!();
    println!(
        "Summary (sizes run: {:?}; against kube-apiserver {version}; wall time {:.0} s)",
        cfg.sizes,
        t_all.elapsed().as_secs_f64()
    );
    println!(
        "  {:>8} {:>8} {:>10} {:>10} {:>10} {:>10} {:>10} {:>10} {:>10}",
        "Services",
        "agent",
        "p50 ms",
        "p99 ms",
        "max ms",
        "p50 acc",
        "p99 acc",
        "VmHWM MiB",
        "load s"
    );
    for r in &results {
        println!(
            "  {:>8} {:>8} {:>10.2} {:>10.2} {:>10.2} {:>10.2} {:>10.2} {:>10.1} {:>10.1}",
            r.services,
            role(r.follower),
            r.from_put.p50,
            r.from_put.p99,
            r.from_put.max,
            r.from_accept.p50,
            r.from_accept.p99,
            mib(r.hwm_kib),
            r.load.as_secs_f64()
        );
    }
    println!(
        "  (p50/p99/max: PUT sent -> agent's transaction seen in the kernel; \"acc\": from the PUT's response; load: the Services and their EndpointSlices created through the API)"
    );
    println!(
        "  peer: kube-proxy default minimum sync period {} ms (configuration constant, not measured)",
        KUBE_PROXY_MIN_SYNC.as_millis()
    );
    println!("  phases (wall time):");
    for r in &results {
        for (what, took) in &r.phases.0 {
            println!(
                "    {:>6} {:<8} {what}: {:.1} s",
                r.services,
                role(r.follower),
                took.as_secs_f64()
            );
        }
    }
    if let Some(r) = &round {
        r.print_summary(&round_phases);
    }
    if let Some(r) = &cold {
        r.print_summary();
    }
    for t in results.iter().filter_map(|r| r.takeover.as_ref()) {
        println!(
            "  takeover at {} Services ({}): handover {:.1} s after SIGTERM; the rolled agent programmed again {:.1} s after its restart; watched {:.1} s: the new leader created {} Service Events ({} others) and wrote {} statuses; {} of {} Services list {:?}",
            t.services,
            t.kind.describe(),
            t.handover.as_secs_f64(),
            t.restart.as_secs_f64(),
            t.window.as_secs_f64(),
            t.service_events,
            t.other_events,
            t.status_writes,
            t.converged,
            t.services,
            t.want
        );
        for e in t.shown.iter().take(EVENTS_SHOWN) {
            println!("    the new leader's Event: {e}");
        }
        println!(
            "    (when the second node's agent joined, the old leader wrote {} statuses and created {} Events)",
            t.join_writes, t.join_events
        );
    }

    println!();
    println!("Goals (a MISS is reported, not failed), against kube-apiserver {version}");
    // Judged on the leader: every cluster has one, and the goal holds for every node.
    match results
        .iter()
        .find(|r| r.services == GOAL_SERVICES && !r.follower)
    {
        Some(r) => {
            println!(
                "  {} p99 event-to-kernel latency at {GOAL_SERVICES} Services < {GOAL_P99_MS:.0} ms: {:.2} ms (p50 {:.2} ms; from the PUT's response: p99 {:.2} ms)",
                goal(r.from_put.p99 < GOAL_P99_MS),
                r.from_put.p99,
                r.from_put.p50,
                r.from_accept.p99
            );
        }
        None => println!(
            "  not judged: the latency and memory goals are stated at {GOAL_SERVICES} Services, which this run did not include"
        ),
    }
    if let Some(r) = &round {
        r.print_goals(goal);
    }
    if let Some(r) = &cold {
        r.print_goals(goal);
    }
    // Leader and follower alike (a follower runs no status writer, but holds the same tables).
    let (eps, rss_goal) = match endpoints() {
        LIMITS_ENDPOINTS => (LIMITS_ENDPOINTS, LIMITS_RSS_MIB),
        eps => (eps, GOAL_RSS_MIB),
    };
    for r in results
        .iter()
        .filter(|r| r.services == GOAL_SERVICES && eps == LIMITS_ENDPOINTS && !r.follower)
    {
        println!(
            "  {} p99 event-to-kernel latency at {GOAL_SERVICES} Services x {eps} endpoints, from the PUT's response, < {LIMITS_P99_MS:.0} ms: {:.2} ms",
            goal(r.from_accept.p99 < LIMITS_P99_MS),
            r.from_accept.p99
        );
    }
    for r in results.iter().filter(|r| r.services == GOAL_SERVICES) {
        println!(
            "  {} agent peak RSS (VmHWM) at {GOAL_SERVICES} Services x {eps} endpoints, {}, < {rss_goal:.0} MiB: {:.1} MiB (VmRSS at the end {:.1} MiB)",
            goal(mib(r.hwm_kib) < rss_goal),
            if r.follower { "follower" } else { "leader" },
            mib(r.hwm_kib),
            mib(r.rss_kib)
        );
    }
    for t in results.iter().filter_map(|r| r.takeover.as_ref()) {
        println!(
            "  {} no per-Service Event from a new leader taking over {} converged Services ({}): {} Service Events (status writes {}, other Events {})",
            goal(t.service_events == 0),
            t.services,
            t.kind.describe(),
            t.service_events,
            t.status_writes,
            t.other_events
        );
    }
    println!();
    for r in &results {
        let n = format!(
            "{}{}",
            r.services,
            if r.follower { "_follower" } else { "" }
        );
        println!(
            "bench latency_{n}_from_put p50_ms={:.3} p99_ms={:.3} max_ms={:.3}",
            r.from_put.p50, r.from_put.p99, r.from_put.max
        );
        println!(
            "bench latency_{n}_from_accept p50_ms={:.3} p99_ms={:.3} max_ms={:.3}",
            r.from_accept.p50, r.from_accept.p99, r.from_accept.max
        );
        println!(
            "bench agent_memory_{n} vmhwm_mib={:.1} vmrss_mib={:.1}",
            mib(r.hwm_kib),
            mib(r.rss_kib)
        );
        println!(
            "bench load_{n} seconds={:.1} objects={}",
            r.load.as_secs_f64(),
            2 * r.services
        );
        if let Some(t) = &r.takeover {
            println!(
                "bench takeover_{n} service_events={} other_events={} status_writes={} handover_s={:.1} converged={}",
                t.service_events,
                t.other_events,
                t.status_writes,
                t.handover.as_secs_f64(),
                t.converged
            );
        }
    }
    if let Some(r) = &round {
        r.print_bench_line();
    }
    if let Some(r) = &cold {
        r.print_bench_lines();
    }
    println!(
        "bench latency_wall_time seconds={:.0}",
        t_all.elapsed().as_secs_f64()
    );
    Ok(())
}

/// A fresh cluster of the harness (its own kube-apiserver, whose version is returned) with
/// `nodes` node namespaces whose agents run with `--resync-interval` `resync`.
fn cluster(nodes: usize, resync: Duration) -> Res<(Cluster, String)> {
    let c = Cluster::build(ClusterOptions {
        nodes,
        backends_per_node: 0,
        ipv6: false,
        agent_args: Vec::new(),
        resync_interval: resync,
        ..ClusterOptions::default()
    });
    let version = c
        .control_plane()
        .ok_or(
            "the latency bench runs against the harness's own kube-apiserver \
             (unset NODELB_E2E_KUBECONFIG)",
        )?
        .version()
        .to_string();
    Ok((c, version))
}

fn one_size(n: usize, follower: bool, takeover: Option<Takeover>, cfg: &Config) -> Res<SizeResult> {
    println!();
    println!(
        "== {n} Services x {} endpoints, agent {}{} ==",
        endpoints(),
        role(follower),
        takeover.map_or(String::new(), |t| format!(
            ", then a leader takeover ({})",
            t.describe()
        ))
    );
    let mut phases = Phases::default();
    let t = Instant::now();
    let (mut c, version) = cluster(if takeover.is_some() { 2 } else { 1 }, AGENT_RESYNC)?;
    println!(
        "  kube-apiserver {version} (built from the pinned k8s.io/kubernetes module), etcd, in netns {}",
        c.api_ns().name()
    );
    phases.done("cluster (etcd, kube-apiserver, manifests, Nodes)", t);
    let ns = c.namespace().to_string();
    let node = c.node_name(0).to_string();
    let ports = ports(n);
    let runtime = c.block_on(async { tokio::runtime::Handle::current() });
    if takeover == Some(Takeover::Excluded) {
        let nodes: Api<Node> = Api::all(c.admin().clone());
        let patch = json!({"metadata": {"labels": {EXCLUDE_LABEL: ""}}});
        c.block_on(nodes.patch(
            c.node_name(1),
            &PatchParams::default(),
            &Patch::Merge(&patch),
        ))
        .map_err(|e| format!("labelling node 1 {EXCLUDE_LABEL}: {e}"))?;
    }

    // A follower's agent finds the Lease held by another identity that stays alive.
    let renewer = if follower {
        let leases: Api<Lease> = Api::namespaced(c.admin().clone(), AGENT_NAMESPACE);
        c.block_on(leases.create(&PostParams::default(), &other_lease()))
            .map_err(|e| format!("creating the nodelb-status Lease: {e}"))?;
        Some(runtime.spawn(renew_other(leases)))
    } else {
        None
    };

    // 1. Load.
    let t = Instant::now();
    let mut slices = load(
        &c,
        &ns,
        &ports,
        endpoints(),
        &[node.as_str()],
        cfg.concurrency,
    )?;
    let load_time = t.elapsed();
    println!(
        "  load: {n} Services + {n} EndpointSlices created through the API in {:.1} s ({:.0} objects/s, {} requests in flight)",
        load_time.as_secs_f64(),
        (2 * n) as f64 / load_time.as_secs_f64(),
        cfg.concurrency
    );
    phases.done("load through the API", t);

    let watch = KernelWatch::start(c.node_ns(0))?;
    let t = Instant::now();
    c.start_agent(0);
    let pid = c.agent_pid(0).ok_or("no agent pid")?;
    let (ready, programmed) = wait_programmed(&mut c, 0, n, t)?;
    println!(
        "  agent pid {pid}: /readyz 200 after {:.0} ms, nodelb_services_programmed={n} after {:.0} ms",
        ms(ready),
        ms(programmed)
    );
    cold_start::print_timeline(&c.agent_log(0));
    phases.done("agent start until every Service is programmed", t);

    // Quiet: a leader has written every Service's status (and its Event) and nothing moves.
    let t = Instant::now();
    if !follower {
        wait_status_written(&c, 0, n, 0.0)?;
    }
    let (writes, syncs, transactions) = wait_quiet(&c, 0, Some(&watch))?;
    let Memory {
        hwm: hwm_load,
        rss: rss_load,
    } = memory(pid)?;
    println!(
        "  quiet after {:.1} s more (status writes {writes}, syncs {syncs}, transactions on nodelb's tables {transactions}); memory after the load: VmHWM {:.1} MiB, VmRSS {:.1} MiB",
        t.elapsed().as_secs_f64(),
        mib(hwm_load),
        mib(rss_load)
    );
    phases.done(
        if follower {
            "until quiet"
        } else {
            "status of every Service written, until quiet"
        },
        t,
    );
    let first_entries = endpoint_entries(c.node_ns(0), ports[0])?;
    if !holds(&first_entries, &initial_address(0)) {
        return Err(format!(
            "Service 0's endpoints in the kernel: {first_entries:?}"
        ));
    }

    // 2. Latency.
    let t_latency = Instant::now();
    let slices_api: Api<EndpointSlice> = Api::namespaced(c.admin().clone(), &ns);
    let log_before = c.agent_log(0).len();
    let m_before = c.try_metrics(0)?;
    let mut from_put = Vec::new();
    let mut from_accept = Vec::new();
    let mut put_rtt = Vec::new();
    let mut verify_ms = Vec::new();
    let mut background = 0usize;
    let mut skipped = 0usize;
    let mut early = 0usize;
    let mut moved: Vec<(usize, String)> = Vec::new();
    let mut committer: Option<String> = None;
    for s in 0..cfg.samples {
        let (i, old, new) = move_endpoint(&mut slices, s);
        let slice = &mut slices[i];
        let name = format!("{}-1", service_name(i));
        background += watch
            .drain()
            .iter()
            .filter(|e| e.overrun || !e.events.is_empty())
            .count();
        let t_put = Instant::now();
        let stored = c
            .block_on(slices_api.replace(&name, &PostParams::default(), slice))
            .map_err(|e| format!("PUT EndpointSlice {name}: {e}"))?;
        let t_accept = Instant::now();
        *slice = stored;
        // The first element-changing transaction by the agent that shows the new address.
        let deadline = t_put + SAMPLE_TIMEOUT;
        let seen_at = loop {
            let left = deadline.saturating_duration_since(Instant::now());
            let ev = watch.rx.recv_timeout(left).map_err(|_| {
                format!("sample {s}: no agent transaction within {SAMPLE_TIMEOUT:?} of the PUT of {name}")
            })?;
            if ev.overrun {
                return Err(format!("sample {s}: the nftables watch overran"));
            }
            if ev.at < t_put {
                background += 1;
                continue;
            }
            if !ev.events.iter().any(|e| e.contains("element")) {
                skipped += 1;
                continue;
            }
            if let Some(tid) = ev.pid {
                if tgid(tid).is_some_and(|g| g != pid) {
                    skipped += 1;
                    continue;
                }
            }
            let check = s % VERIFY_EVERY == VERIFY_EVERY - 1 || s + 1 == cfg.samples;
            let confirmed = !check || {
                let tv = Instant::now();
                let entries = endpoint_entries(c.node_ns(0), ports[i])?;
                verify_ms.push(ms(tv.elapsed()));
                holds(&entries, &new) && !holds(&entries, &old)
            };
            if confirmed {
                if committer.is_none() {
                    committer = Some(format!(
                        "thread {} ({})",
                        ev.pid.map_or("?".into(), |p| p.to_string()),
                        ev.process.as_deref().unwrap_or("?")
                    ));
                }
                break ev.at;
            }
            skipped += 1;
        };
        from_put.push(ms(seen_at - t_put));
        if seen_at < t_accept {
            early += 1;
        }
        from_accept.push(ms(seen_at.saturating_duration_since(t_accept)));
        put_rtt.push(ms(t_accept - t_put));
        moved.retain(|(j, _)| *j != i);
        moved.push((i, new));
        let next = t_put + cfg.spacing;
        std::thread::sleep(next.saturating_duration_since(Instant::now()));
    }
    let m_after = c.try_metrics(0)?;
    phases.done(
        &format!("latency: {} samples (with checks)", cfg.samples),
        t_latency,
    );
    // The bench's own event subscriber goes before the repair: with any listener the kernel
    // builds an event per object of a full replace (the agent pauses its own watch for it), so
    // the repair is timed as on a node where nothing else listens.
    drop(watch);

    // A full replace at this size, as after drift or on a periodic resync: the moment the
    // agent holds the committed model and newly assembled tables at once, so the peak below
    // includes it. A chain added to nodelb's table by another process (this bench) is drift,
    // which the agent repairs with a full replace that removes it.
    let t = Instant::now();
    let repairs_before = metric_sum(&m_after, "nodelb_drift_repairs_total");
    c.node_ns(0)
        .sh_ok("nft add chain ip nodelb bench-drift")
        .map_err(|e| format!("adding a foreign chain: {e}"))?;
    let t_drift = Instant::now();
    while metric_sum(&c.try_metrics(0)?, "nodelb_drift_repairs_total") <= repairs_before {
        if t_drift.elapsed() > QUIET_TIMEOUT {
            return Err(format!(
                "the agent did not repair drift within {QUIET_TIMEOUT:?}"
            ));
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    let listed = c
        .node_ns(0)
        .sh_ok("nft list chain ip nodelb bench-drift >/dev/null 2>&1 && echo present || echo gone")
        .map_err(|e| format!("looking for the foreign chain: {e}"))?;
    if listed.trim() != "gone" {
        return Err("the drift repair left the foreign chain in nodelb's table".into());
    }
    let log = c.agent_log(0);
    let took = log
        .lines()
        .rev()
        .find(|l| l.contains("repaired drift with a full replace"))
        .and_then(|l| l.split("took=").nth(1))
        .and_then(|t| t.split_whitespace().next())
        .unwrap_or("?")
        .to_string();
    println!(
        "  drift (a foreign chain) repaired by a full replace within {:.0} ms (the agent's sync took {took})",
        ms(t_drift.elapsed())
    );
    let Memory { hwm, rss } = memory(pid)?;

    let elements = check_moved(c.node_ns(0), &ns, n, &ports, &moved)?;
    println!(
        "  kernel check: nft lists {elements} endpoint elements; all {} moved Services map to their last address",
        moved.len()
    );
    phases.done("drift repair and kernel check", t);

    // The agent's own view of those syncs.
    let log = c.agent_log(0);
    let syncs = sync_lines(log.get(log_before..).unwrap_or(""));
    let sync_count =
        metric_sum(&m_after, "nodelb_syncs_total") - metric_sum(&m_before, "nodelb_syncs_total");
    let sync_sum = metric_sum(&m_after, "nodelb_sync_duration_seconds_sum")
        - metric_sum(&m_before, "nodelb_sync_duration_seconds_sum");

    let put = stats(&from_put);
    let acc = stats(&from_accept);
    println!();
    println!(
        "  Event-to-kernel latency against kube-apiserver {version}, {} samples ({} transactions by the agent between samples, {} not ours or not the change, {} seen before the PUT returned)",
        cfg.samples, background, skipped, early
    );
    print_header();
    print_row("PUT sent -> agent's transaction seen", &put);
    print_row("PUT response (accepted) -> transaction seen", &acc);
    print_row(
        "PUT round trip (admin client -> kube-apiserver)",
        &stats(&put_rtt),
    );
    let durs = |f: fn(&SyncLine) -> Option<Duration>| -> Vec<f64> {
        syncs.iter().filter_map(f).map(ms).collect()
    };
    for (label, v) in [
        ("agent sync: plan (debug log)", durs(|s| s.plan)),
        ("agent sync: encode", durs(|s| s.encode)),
        ("agent sync: kernel commit", durs(|s| s.commit)),
        ("agent sync: whole sync (took)", durs(|s| s.took)),
    ] {
        if !v.is_empty() {
            print_row(label, &stats(&v));
        }
    }
    print_row(
        &format!("nft get element check, every {VERIFY_EVERY}th (not timed in)"),
        &stats(&verify_ms),
    );
    println!(
        "  the change was committed by agent {}",
        committer.as_deref().unwrap_or("?")
    );
    println!(
        "  agent syncs during the run: {sync_count} (metrics; mean {:.2} ms), {} synced lines in its log; debounce 10 ms",
        if sync_count > 0.0 { sync_sum / sync_count * 1e3 } else { 0.0 },
        syncs.len()
    );
    println!(
        "  agent memory after the latency run and the drift repair: VmHWM {:.1} MiB, VmRSS {:.1} MiB",
        mib(hwm),
        mib(rss)
    );
    let leader = metric_sum(&m_after, "nodelb_leader");
    if (leader > 0.0) == follower {
        return Err(format!(
            "nodelb_leader is {leader} in a {} run",
            role(follower)
        ));
    }

    // 4. Takeover.
    let takeover = match takeover {
        Some(kind) => Some(take_over(&mut c, n, kind, &mut phases)?),
        None => None,
    };

    // 5. Peer, on a copy of the agent's table.
    let t = Instant::now();
    let table = c
        .node_ns(0)
        .sh_ok("nft list table ip nodelb")
        .map_err(|e| format!("listing the agent's table: {e}"))?;
    if let Some(r) = renewer {
        r.abort();
    }
    drop(c);
    let (change, empty, load) =
        nft_peer(&table, ports[0], &format!("{ns}/{}:tcp", service_name(0)))?;
    println!(
        "  peer: nft -f of the one-line incremental change on a copy of the agent's table ({} bytes as listed), {PEER_RUNS} runs",
        table.len()
    );
    println!(
        "  peer: nft -f of the agent's whole table as listed, into the empty scratch namespace: {:.0} ms",
        ms(load)
    );
    print_header();
    print_row(
        "nft -f one endpoint change (spawn+parse+commit)",
        &stats(&change),
    );
    print_row(
        "nft -f of an empty script (spawn+cache only)",
        &stats(&empty),
    );
    println!(
        "  peer: kube-proxy's default minimum sync period: {} ms (a configuration constant)",
        KUBE_PROXY_MIN_SYNC.as_millis()
    );
    phases.done("teardown and peer (nft -f)", t);
    Ok(SizeResult {
        follower,
        services: n,
        version,
        from_put: put,
        from_accept: acc,
        hwm_kib: hwm,
        rss_kib: rss,
        load: load_time,
        phases,
        takeover,
    })
}

/// The takeover (see the module docs): node 1's agent joins the leader on node 0; once every
/// Service lists the serving nodes, node 0's agent is rolled and node 1's takes over.
fn take_over(
    c: &mut Cluster,
    n: usize,
    kind: Takeover,
    phases: &mut Phases,
) -> Res<TakeoverResult> {
    println!();
    println!(
        "  Takeover ({}): a second node's agent joins, then the leader is rolled (SIGTERM, started again)",
        kind.describe()
    );
    let ns = c.namespace().to_string();
    let mut want = vec![c.node_v4(0)];
    if kind == Takeover::Serving {
        want.push(c.node_v4(1));
    }
    want.sort();
    let want: Vec<String> = want.iter().map(Ipv4Addr::to_string).collect();
    let (old, new) = (
        agent_pod_name(c.node_name(0)),
        agent_pod_name(c.node_name(1)),
    );
    let src = |i: usize| IpAddr::V4(c.node_api_addr(i));
    let (src0, src1) = (src(0), src(1));
    let mark = audit(c)?.len();
    let ok_before = status_ok(&c.try_metrics(0)?);

    // Node 1 joins. Serving, its heartbeat makes it a serving node, so the leader updates
    // every Service; excluded, nothing changes.
    let t = Instant::now();
    c.start_agent(1);
    let serves = if kind == Takeover::Serving { n } else { 0 };
    let (ready, programmed) = wait_programmed(c, 1, serves, t)?;
    let heartbeat = format!("nodelb-node-{}", c.node_name(1));
    let leases: Api<Lease> = Api::namespaced(c.admin().clone(), AGENT_NAMESPACE);
    wait_until(
        &format!("node 1's heartbeat Lease {heartbeat}"),
        READY_TIMEOUT,
        Duration::from_millis(100),
        || {
            c.block_on(leases.get_opt(&heartbeat))
                .map(|l| l.map(|_| ()))
                .map_err(|e| format!("reading Lease {heartbeat}: {e}"))
        },
    )?;
    println!(
        "  node 1's agent: /readyz 200 after {:.0} ms, nodelb_services_programmed={serves} after {:.0} ms, heartbeat after {:.0} ms",
        ms(ready),
        ms(programmed),
        ms(t.elapsed())
    );
    if kind == Takeover::Serving {
        wait_status_written(c, 0, n, ok_before)?;
    } else {
        // The leader notices the new heartbeat, and has nothing to write.
        std::thread::sleep(Duration::from_secs(3));
        wait_quiet(c, 0, None)?;
    }
    wait_until(
        &format!("every Service to list {want:?}"),
        QUIET_TIMEOUT,
        Duration::from_secs(2),
        || Ok((c.services_publishing(&ns, &want)? == n).then_some(())),
    )?;
    let records = audit(c)?;
    let joined = &records[mark.min(records.len())..];
    let join_writes = joined
        .iter()
        .filter(|r| r.source == src0 && AuditRecord::is_status_write(r))
        .count();
    let join_events = joined
        .iter()
        .filter(|r| r.source == src0 && AuditRecord::is_event_create(r))
        .count();
    println!(
        "  every Service lists {want:?} {:.1} s after node 1's agent started: the leader wrote {join_writes} statuses and created {join_events} Events meanwhile",
        t.elapsed().as_secs_f64()
    );
    phases.done("takeover: the second node's agent joins", t);

    // Roll the leader. It is started again once the other agent holds the Lease: a pod's
    // restart takes seconds, and a new process started at once could win the released Lease
    // back before the other agent's next retry.
    let t = Instant::now();
    let holder_then = c.status_holder()?.unwrap_or_default();
    if holder_then != old {
        return Err(format!(
            "nodelb-status is held by {holder_then:?}, expected node 0's agent {old}"
        ));
    }
    let mark = records.len();
    let exit = c.stop_agent(0, Signal::SIGTERM);
    let stopped = t.elapsed();
    wait_until(
        &format!("{new} to hold nodelb-status and say so"),
        NODE_LEASE * 2,
        Duration::from_millis(100),
        || {
            Ok((c.status_holder()?.as_deref() == Some(new.as_str())
                && metric_sum(&c.try_metrics(1)?, "nodelb_leader") == 1.0)
                .then_some(()))
        },
    )?;
    let handover = t.elapsed();
    let t_take = Instant::now();
    println!(
        "  node 0's agent stopped by SIGTERM in {:.1} s ({}); {new} holds nodelb-status {:.1} s after the SIGTERM",
        stopped.as_secs_f64(),
        exit.map_or("no exit status".to_string(), |s| s.to_string()),
        handover.as_secs_f64()
    );
    let t_restart = Instant::now();
    c.start_agent(0);
    let (_, restart) = wait_programmed(c, 0, n, t_restart)?;
    println!(
        "  node 0's agent started again: nodelb_services_programmed={n} after {:.1} s",
        restart.as_secs_f64()
    );
    // Past the grace the new leader gives every heartbeat, and until it is quiet.
    std::thread::sleep((NODE_LEASE + TAKEOVER_SETTLE).saturating_sub(t_take.elapsed()));
    wait_quiet(c, 1, None)?;
    let window = t_take.elapsed();
    let records = audit(c)?;
    let after = &records[mark.min(records.len())..];
    let by_new: Vec<&AuditRecord> = after.iter().filter(|r| r.source == src1).collect();
    let service_events = by_new
        .iter()
        .filter(|r| {
            AuditRecord::is_event_create(r) && r.object.as_ref().is_some_and(|o| o.namespace == ns)
        })
        .count();
    let other_events = by_new
        .iter()
        .filter(|r| AuditRecord::is_event_create(r))
        .count()
        - service_events;
    let status_writes = by_new
        .iter()
        .filter(|r| AuditRecord::is_status_write(r))
        .count();
    let converged = c.services_publishing(&ns, &want)?;

    // The new leader's Events, from the API.
    let events: Api<Event> = Api::namespaced(c.admin().clone(), &ns);
    let list = c
        .block_on(events.list(&ListParams::default()))
        .map_err(|e| format!("listing Events: {e}"))?;
    let shown: Vec<String> = list
        .items
        .iter()
        .filter(|e| e.reporting_instance.as_deref() == Some(new.as_str()))
        .map(|e| {
            format!(
                "{} {} {}/{}: {}",
                e.type_.as_deref().unwrap_or("?"),
                e.reason.as_deref().unwrap_or("?"),
                e.regarding
                    .as_ref()
                    .and_then(|r| r.kind.as_deref())
                    .unwrap_or("?"),
                e.regarding
                    .as_ref()
                    .and_then(|r| r.name.as_deref())
                    .unwrap_or("?"),
                e.note.as_deref().unwrap_or("")
            )
        })
        .collect();
    println!(
        "  watched the new leader for {:.1} s after the takeover (node lease {}s + {}s): {service_events} Service Events, {other_events} other Events, {status_writes} status writes (audit log, from {src1}); {converged} of {n} Services still list {want:?}",
        window.as_secs_f64(),
        NODE_LEASE.as_secs(),
        TAKEOVER_SETTLE.as_secs()
    );
    for e in shown.iter().take(EVENTS_SHOWN) {
        println!("    event by {new}: {e}");
    }
    if shown.len() > EVENTS_SHOWN {
        println!("    ... and {} more", shown.len() - EVENTS_SHOWN);
    }
    phases.done("takeover: roll the leader, watch the new one", t);
    Ok(TakeoverResult {
        kind,
        services: n,
        join_writes,
        join_events,
        handover,
        restart,
        window,
        service_events,
        other_events,
        status_writes,
        want,
        converged,
        shown,
    })
}

/// Load a Service on each of `ports` with a slice of [`endpoints()`] endpoints on node 0, and
/// say how long it took.
fn load_on_node0(c: &Cluster, ns: &str, ports: &[u16], cfg: &Config) -> Res<Vec<EndpointSlice>> {
    let t = Instant::now();
    let node = c.node_name(0).to_string();
    let slices = load(c, ns, ports, endpoints(), &[node.as_str()], cfg.concurrency)?;
    let n = ports.len();
    println!(
        "  load: {n} Services + {n} EndpointSlices in {:.1} s",
        t.elapsed().as_secs_f64()
    );
    Ok(slices)
}

/// Whether a phase ran at the size its goal is stated for; says so when not.
fn at_goal_size(phase: &str, services: usize) -> bool {
    if services != GOAL_SERVICES {
        println!(
            "  not judged: the {phase} goal is stated at {GOAL_SERVICES} Services; this run's phase had {services}"
        );
    }
    services == GOAL_SERVICES
}

fn role(follower: bool) -> &'static str {
    if follower {
        "follower"
    } else {
        "leader"
    }
}

fn tail(text: &str, n: usize) -> String {
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}

fn sh_out(cmd: &str, args: &[&str]) -> String {
    Command::new(cmd)
        .args(args)
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
        .unwrap_or_else(|e| format!("({cmd}: {e})"))
}
