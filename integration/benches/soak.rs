//! Soak under churn: three release `nodelb-agent`s in three node namespaces of the e2e harness,
//! against its real kube-apiserver with etcd, serving 1,000 LoadBalancer Services x 5 endpoints
//! while EndpointSlices change 20 times a second for 5 minutes, with the status leader killed
//! in the middle.
//!
//! 1. Load: `NODELB_BENCH_SOAK_SERVICES` (default 1,000) Services and their slices through the
//!    API ([`lb_services`]: one TCP port each outside the reserved ports, no NodePorts; endpoint
//!    `k` on node `k mod 3`). The three agents start; the bench waits until each programs every
//!    Service, every Service lists the three nodes' addresses, and the status writer is quiet:
//!    converged. From here on nothing should change any status but the kill (3.).
//! 2. Churn: `NODELB_BENCH_SOAK_RATE` (default 20) EndpointSlice PUTs a second for
//!    `NODELB_BENCH_SOAK_SECONDS` (default 300), on a fixed schedule, Services round robin,
//!    each moving one endpoint to an address the slice does not hold. An [`ElementWatch`] in
//!    each node namespace decodes what every nftables transaction adds to the agent's
//!    `endpoints` map, so an update reached a node's kernel when an element with its Service's
//!    port and its new address was added after the PUT was sent: matched by content, not by
//!    order, whatever transactions coalesce or lag.
//! 3. Half way, the `nodelb-status` holder is SIGKILLed, as a crash. It is started again (as
//!    the DaemonSet would restart it) once another agent holds the Lease and at least
//!    `RESTART_DELAY` later: a restart within the Lease's 15 s would find the Lease still its
//!    own (same Pod, same identity) and keep it. The churn goes on throughout.
//! 4. Then the bench waits for every update to reach every kernel, and reads: per agent the
//!    event-to-kernel latency (PUT sent -> transaction seen) over the run and excluding the
//!    agent's own downtime (updates sent before it was ready again and not in its kernel
//!    before the kill), `nodelb_syncs_total{result="error"}` (the killed process's read just
//!    before the kill), its CPU seconds an hour over the churn (`/proc/<pid>/stat`, for an
//!    agent not restarted meanwhile; a figure, no goal), `VmRSS` at one fifth of the run
//!    (minute 1) and at its end (minute 5),
//!    Service status writes and Events after convergence (kube-apiserver's audit log, by the
//!    agent's source address), warnings in its log; the kernel's endpoint map against the
//!    slices; and every Service's status.
//!
//! Goals, printed PASS/MISS beside the number and never asserted: no sync error; RSS growth
//! from minute 1 to minute 5 at most 10% (more is a leak to find; for the agent that took
//! `nodelb-status` over, from its first sample as the leader); no status write and no
//! Event after convergence but the killed node's leaving and return (the new leader judges the
//! silent holder's node from its last renewal, so an agent down about a lease duration may be
//! dropped from every status and added back: at most two writes per Service, Events that list
//! every node or every node but that one); no Service with a wrong status at the end; every
//! update in every kernel; and the project's event-to-kernel goal, p99 < 100 ms, outside the agent's downtime.
//! Errors (an agent that never programs, a cluster that does not converge) fail the run.
//!
//! The agent is `NODELB_AGENT_BIN`, else `target/release/nodelb-agent` (build it with
//! `cargo build --release -p nodelb-agent`). Needs root, `etcd` and the pinned kube-apiserver
//! (as the e2e tests); without root prints SKIP and exits 0, or 1 when `CI=true`.
//! Run: `cargo bench -p nodelb-integration --bench soak`.

use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::api::{Api, PostParams};
use nix::sys::signal::Signal;
use nodelb_integration::bench::{
    command_output, cpu_seconds, env_usize, goal, loadavg, memory, mib, ms, release_agent_binary,
    stats, tail, wait_until, Memory, Stats,
};
use nodelb_integration::control_plane::{received_after, AuditRecord};
use nodelb_integration::e2e::{
    agent_pod_name, ingress_ips, metric_sum, metric_value, Cluster, ClusterOptions,
};
use nodelb_integration::element_watch::{ElementWatch, Seen};
use nodelb_integration::lb_services::{self, TARGET_PORT};
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::net::Ipv4Addr;
use std::process::ExitCode;
use std::time::{Duration, Instant};

type Res<T> = Result<T, String>;

const NODES: usize = 3;
const ENDPOINTS: usize = 5;
/// The agent's default `--resync-interval` (the harness's tests use 30 s).
const AGENT_RESYNC: Duration = Duration::from_secs(300);
/// The killed leader stays down at least this long (a crashed container's restart).
const RESTART_DELAY: Duration = Duration::from_secs(5);
/// Longest wait for another agent to take `nodelb-status` before the killed one is restarted
/// anyway (twice the agent's default `--lease-duration`).
const TAKEOVER_WAIT: Duration = Duration::from_secs(30);
/// Memory is sampled this often (and at minute 1 and at the end).
const SAMPLE_EVERY: Duration = Duration::from_secs(10);
/// After the churn, how long the last updates may take to reach every kernel.
const SETTLE: Duration = Duration::from_secs(30);
const READY_TIMEOUT: Duration = Duration::from_secs(180);
const QUIET_TIMEOUT: Duration = Duration::from_secs(300);
/// Churn addresses: 198.51.100.(CHURN_FIRST + c mod CHURN_SPAN), never one the slice holds.
const CHURN_FIRST: u8 = 20;
const CHURN_SPAN: u32 = 230;
const GOAL_RSS_GROWTH: f64 = 0.10;
const GOAL_P99_MS: f64 = 100.0;
/// The memory timeline printed: a sample every this many seconds.
const TIMELINE_EVERY: u64 = 30;
/// Warnings of an agent's log shown, distinct messages.
const WARNINGS_SHOWN: usize = 5;

fn main() -> ExitCode {
    nodelb_integration::netns::bench_main("soak", run)
}

struct Config {
    services: usize,
    duration: Duration,
    rate: usize,
    concurrency: usize,
    kill: bool,
}

fn config() -> Res<Config> {
    let services = env_usize("NODELB_BENCH_SOAK_SERVICES", 1_000, 1)?;
    if services > lb_services::max_services() {
        return Err(format!(
            "NODELB_BENCH_SOAK_SERVICES={services}: at most {}",
            lb_services::max_services()
        ));
    }
    let kill = match std::env::var("NODELB_BENCH_SOAK_KILL").as_deref() {
        Err(_) | Ok("") | Ok("1") => true,
        Ok("0") => false,
        Ok(v) => return Err(format!("NODELB_BENCH_SOAK_KILL={v:?}: expected 0 or 1")),
    };
    Ok(Config {
        services,
        duration: Duration::from_secs(env_usize("NODELB_BENCH_SOAK_SECONDS", 300, 10)? as u64),
        rate: env_usize("NODELB_BENCH_SOAK_RATE", 20, 1)?,
        concurrency: env_usize("NODELB_BENCH_SOAK_LOAD_CONCURRENCY", 32, 1)?,
        kill,
    })
}

// ---- the run -------------------------------------------------------------------------------

fn run() -> Res<()> {
    let t_all = Instant::now();
    let cfg = config()?;
    let bin = release_agent_binary()?;
    let load_start = loadavg();
    println!(
        "nodelb soak under churn: {NODES} release agents in node namespaces, real kube-apiserver with etcd"
    );
    println!(
        "  {} Services x {ENDPOINTS} endpoints; {} EndpointSlice updates/s for {} s; leader SIGKILL at {} s: {}",
        cfg.services,
        cfg.rate,
        cfg.duration.as_secs(),
        cfg.duration.as_secs() / 2,
        if cfg.kill { "yes" } else { "no (NODELB_BENCH_SOAK_KILL=0)" }
    );
    println!("  agent: {}", bin.display());
    println!(
        "  kernel {}, {} CPUs, load average at the start {load_start}",
        command_output("uname", &["-r"]).trim(),
        std::thread::available_parallelism().map_or(0, |n| n.get()),
    );
    let mut c = Cluster::build(ClusterOptions {
        nodes: NODES,
        backends_per_node: 0,
        resync_interval: AGENT_RESYNC,
        ..ClusterOptions::default()
    });
    let version = c
        .control_plane()
        .ok_or(
            "the soak runs against the harness's own kube-apiserver (unset NODELB_E2E_KUBECONFIG)",
        )?
        .version()
        .to_string();
    println!(
        "  kube-apiserver {version}, cluster built in {:.1} s",
        t_all.elapsed().as_secs_f64()
    );
    let ns = c.namespace().to_string();
    let ports = lb_services::ports(cfg.services);
    let names: Vec<String> = (0..NODES).map(|i| c.node_name(i).to_string()).collect();
    let node_refs: Vec<&str> = names.iter().map(String::as_str).collect();
    let t = Instant::now();
    let mut slices = lb_services::load(&c, &ns, &ports, ENDPOINTS, &node_refs, cfg.concurrency)?;
    println!(
        "  load: {} Services + slices through the API in {:.1} s",
        cfg.services,
        t.elapsed().as_secs_f64()
    );

    let converged = converge(&mut c, cfg.services)?;
    let watches = (0..NODES)
        .map(|i| ElementWatch::start(c.node_ns(i), libc::NFPROTO_IPV4 as u8, "nodelb"))
        .collect::<Res<Vec<_>>>()?;
    let load_churn = loadavg();
    let churned = churn(&mut c, &cfg, &ns, &ports, &mut slices, &watches, &converged)?;
    let load_end = loadavg();
    let report = assess(&c, &cfg, &ports, &slices, &converged, churned)?;
    print_report(&cfg, &report, [&load_start, &load_churn, &load_end]);
    println!(
        "bench soak wall_time_s={:.0} loadavg_start=\"{load_start}\" loadavg_churn_start=\"{load_churn}\" loadavg_churn_end=\"{load_end}\"",
        t_all.elapsed().as_secs_f64()
    );
    Ok(())
}

/// What the bench knows at convergence.
struct Converged {
    /// The three nodes' addresses, as every Service's status lists them.
    want: Vec<String>,
    /// Where convergence is in the audit log (`Cluster::audit_mark`), agent log lengths then.
    audit_mark: String,
    log_marks: Vec<usize>,
    at: k8s_openapi::jiff::Timestamp,
    leader: usize,
}

/// Starts the agents and waits until each programs every Service, every Service lists every
/// node and the status writer is quiet.
fn converge(c: &mut Cluster, n: usize) -> Res<Converged> {
    let t = Instant::now();
    for i in 0..NODES {
        c.start_agent(i);
    }
    for i in 0..NODES {
        wait_programmed(c, i, n, READY_TIMEOUT)?;
    }
    println!(
        "  agents started: every one programmed {n} Services after {:.1} s",
        t.elapsed().as_secs_f64()
    );
    let mut want: Vec<Ipv4Addr> = (0..NODES).map(|i| c.node_v4(i)).collect();
    want.sort();
    let want: Vec<String> = want.iter().map(Ipv4Addr::to_string).collect();
    let ns = c.namespace().to_string();
    wait_until(
        &format!("every Service to list {want:?}"),
        QUIET_TIMEOUT,
        Duration::from_secs(1),
        || Ok((c.services_publishing(&ns, &want)? == n).then_some(())),
    )?;
    // Quiet: no agent wrote a status for 3 s.
    let mut last = f64::NAN;
    let mut still = 0;
    wait_until(
        "the status writers to go quiet",
        QUIET_TIMEOUT,
        Duration::from_secs(1),
        || {
            let mut writes = 0.0;
            for i in 0..NODES {
                writes += metric_sum(&metrics(c, i)?, "nodelb_status_writes_total");
            }
            still = if writes == last { still + 1 } else { 0 };
            last = writes;
            Ok((still >= 3).then_some(()))
        },
    )?;
    let leader = leader(c)?.ok_or("no agent holds nodelb-status after convergence")?;
    println!(
        "  converged {:.1} s after the agents started: every Service lists {want:?}; {} Service status writes so far; leader {}",
        t.elapsed().as_secs_f64(),
        last,
        c.node_name(leader)
    );
    Ok(Converged {
        want,
        audit_mark: c
            .audit_mark()
            .ok_or("no audit log: the soak needs the harness's own kube-apiserver")?,
        log_marks: (0..NODES).map(|i| c.agent_log(i).len()).collect(),
        at: k8s_openapi::jiff::Timestamp::now(),
        leader,
    })
}

/// Waits until node `i`'s agent answers `/readyz` and programs `n` Services.
fn wait_programmed(c: &mut Cluster, i: usize, n: usize, timeout: Duration) -> Res<()> {
    let t0 = Instant::now();
    loop {
        if !c.agent_running(i) {
            return Err(format!(
                "node {i}'s agent exited; log:\n{}",
                tail(&c.agent_log(i), 40)
            ));
        }
        if matches!(c.readyz(i), Ok((200, _)))
            && metric_sum(&metrics(c, i)?, "nodelb_services_programmed") as usize == n
        {
            return Ok(());
        }
        if t0.elapsed() > timeout {
            return Err(format!(
                "node {i}'s agent has not programmed {n} Services within {timeout:?}; log:\n{}",
                tail(&c.agent_log(i), 40)
            ));
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// The node whose agent holds `nodelb-status`.
fn leader(c: &Cluster) -> Res<Option<usize>> {
    let holder = c.status_holder()?.unwrap_or_default();
    Ok((0..NODES).find(|i| agent_pod_name(c.node_name(*i)) == holder))
}

// ---- the churn -----------------------------------------------------------------------------

/// One EndpointSlice update.
struct Put {
    svc: usize,
    addr: Ipv4Addr,
    sent: Instant,
    answered: Instant,
}

/// The leader's crash and restart.
#[derive(Clone)]
struct KillRecord {
    victim: usize,
    killed: Instant,
    /// The agent that held `nodelb-status` next, and when the bench saw it.
    new_holder: Option<(usize, Instant)>,
    restarted: Instant,
    /// The restarted agent answers `/readyz` and programs every Service again.
    ready: Instant,
    /// The killed process's `nodelb_syncs_total` by result, read just before the kill.
    syncs_ok: f64,
    sync_errors: f64,
}

enum KillState {
    Off,
    Due(Instant),
    /// Killed; `restarted` and `ready` not yet.
    Down(KillRecord),
    /// Started again; `ready` not yet.
    Restarting(KillRecord),
    Done(KillRecord),
}

/// What the churn did and saw.
struct Churned {
    puts: Vec<Put>,
    started: Instant,
    ended: Instant,
    kill: Option<KillRecord>,
    /// Per node: what its kernel gained, and the agent processes it ran.
    seen: Vec<NodeSeen>,
    pids: Vec<Vec<u32>>,
    /// Per node: memory samples (seconds into the churn, memory).
    memory: Vec<Vec<(f64, Memory)>>,
    /// The PUTs sent more than 100 ms after their slot (the bench or the server fell behind).
    late: usize,
    settle: Duration,
    /// Per node: its agent's CPU seconds an hour over the churn (user + system); `None` for one
    /// restarted meanwhile.
    cpu: Vec<Option<f64>>,
}

fn churn(
    c: &mut Cluster,
    cfg: &Config,
    ns: &str,
    ports: &[u16],
    slices: &mut [EndpointSlice],
    watches: &[ElementWatch],
    conv: &Converged,
) -> Res<Churned> {
    let n = slices.len();
    let total = (cfg.rate as f64 * cfg.duration.as_secs_f64()) as usize;
    let api: Api<EndpointSlice> = Api::namespaced(c.admin().clone(), ns);
    let mut out = Churned {
        puts: Vec::with_capacity(total),
        started: Instant::now(),
        ended: Instant::now(),
        kill: None,
        seen: (0..NODES).map(|_| NodeSeen::default()).collect(),
        pids: (0..NODES)
            .map(|i| c.agent_pid(i).into_iter().collect())
            .collect(),
        memory: vec![Vec::new(); NODES],
        late: 0,
        settle: Duration::ZERO,
        cpu: vec![None; NODES],
    };
    let cpu0: Vec<Option<f64>> = out
        .pids
        .iter()
        .map(|p| p.first().copied().and_then(cpu_seconds))
        .collect();
    let t0 = out.started;
    let mut kill = if cfg.kill {
        KillState::Due(t0 + cfg.duration / 2)
    } else {
        KillState::Off
    };
    let mut marks = memory_marks(cfg.duration).into_iter().peekable();
    let mut counter = 0u32;
    let mut next_poll = t0;
    println!(
        "  churn: {total} updates over {} s (load average {})",
        cfg.duration.as_secs(),
        loadavg()
    );
    for u in 0..total {
        let due = t0 + Duration::from_secs_f64(u as f64 / cfg.rate as f64);
        loop {
            let now = Instant::now();
            while marks.peek().is_some_and(|m| t0 + *m <= now) {
                let m = marks.next().expect("peeked");
                sample_memory(c, &mut out.memory, m);
            }
            if now >= next_poll {
                kill = step_kill(c, kill, n, conv.leader, &mut out.pids, t0)?;
                for (i, w) in watches.iter().enumerate() {
                    out.seen[i].absorb(w.drain());
                }
                next_poll = now + Duration::from_millis(250);
            }
            if now >= due {
                break;
            }
            std::thread::sleep((due - now).min(Duration::from_millis(10)));
        }
        if Instant::now() > due + Duration::from_millis(100) {
            out.late += 1;
        }
        let svc = u % n;
        let put = move_endpoint(c, &api, &mut slices[svc], svc, u / n, &mut counter)?;
        out.puts.push(put);
        if (u + 1) % (cfg.rate * 30) == 0 {
            println!(
                "    {:>4.0} s: {} updates sent; load average {}",
                t0.elapsed().as_secs_f64(),
                u + 1,
                loadavg()
            );
        }
    }
    // The end of the run: the last memory mark, the kill finished.
    std::thread::sleep((t0 + cfg.duration).saturating_duration_since(Instant::now()));
    out.ended = Instant::now();
    let ran = (out.ended - t0).as_secs_f64();
    out.cpu = cpu0
        .iter()
        .enumerate()
        .map(|(i, start)| {
            // The agent that ran the whole churn: still its first process, which still runs.
            let pid = c.agent_pid(i).filter(|p| out.pids[i] == [*p]);
            let end = pid.and_then(cpu_seconds)?;
            Some((end - (*start)?) / ran * 3600.0)
        })
        .collect();
    for m in marks {
        sample_memory(c, &mut out.memory, m);
    }
    while !matches!(kill, KillState::Done(_) | KillState::Off) {
        kill = step_kill(c, kill, n, conv.leader, &mut out.pids, t0)?;
        std::thread::sleep(Duration::from_millis(250));
    }
    if let KillState::Done(k) = kill {
        out.kill = Some(k);
    }
    out.settle = settle(&mut out, watches, ports)?;
    Ok(out)
}

/// Memory marks: every `SAMPLE_EVERY`, one fifth in (minute 1 of 5) and the end.
fn memory_marks(duration: Duration) -> Vec<Duration> {
    let mut marks: BTreeSet<Duration> = (1..)
        .map(|k| SAMPLE_EVERY * k)
        .take_while(|m| *m < duration)
        .collect();
    marks.insert(duration / 5);
    marks.insert(duration);
    marks.into_iter().collect()
}

fn sample_memory(c: &Cluster, samples: &mut [Vec<(f64, Memory)>], mark: Duration) {
    for (i, samples) in samples.iter_mut().enumerate() {
        if let Some(m) = c.agent_pid(i).and_then(|pid| memory(pid).ok()) {
            samples.push((mark.as_secs_f64(), m));
        }
    }
}

/// Moves endpoint `round mod 5` of Service `svc` to an address its slice does not hold and
/// PUTs the slice.
fn move_endpoint(
    c: &Cluster,
    api: &Api<EndpointSlice>,
    slice: &mut EndpointSlice,
    svc: usize,
    round: usize,
    counter: &mut u32,
) -> Res<Put> {
    let held: BTreeSet<&str> = slice
        .endpoints
        .iter()
        .flat_map(|e| e.addresses.iter().map(String::as_str))
        .collect();
    let addr = loop {
        let a = Ipv4Addr::new(198, 51, 100, CHURN_FIRST + (*counter % CHURN_SPAN) as u8);
        *counter += 1;
        if !held.contains(a.to_string().as_str()) {
            break a;
        }
    };
    slice.endpoints[round % ENDPOINTS].addresses = vec![addr.to_string()];
    let name = lb_services::slice_name(svc);
    let sent = Instant::now();
    let stored = c
        .block_on(api.replace(&name, &PostParams::default(), slice))
        .map_err(|e| format!("PUT EndpointSlice {name}: {e}"))?;
    let answered = Instant::now();
    *slice = stored;
    Ok(Put {
        svc,
        addr,
        sent,
        answered,
    })
}

/// Advances the leader's crash: kill when due, see the Lease move, restart, see it ready.
fn step_kill(
    c: &mut Cluster,
    state: KillState,
    n: usize,
    leader_at_start: usize,
    pids: &mut [Vec<u32>],
    t0: Instant,
) -> Res<KillState> {
    match state {
        KillState::Due(at) if Instant::now() >= at => {
            kill_leader(c, leader_at_start, t0).map(KillState::Down)
        }
        KillState::Down(k) => restart_after_takeover(c, k, pids, t0),
        KillState::Restarting(k) => ready_again(c, k, n, t0),
        other => Ok(other),
    }
}

/// SIGKILLs the agent holding `nodelb-status`, its sync counters read just before.
fn kill_leader(c: &mut Cluster, leader_at_start: usize, t0: Instant) -> Res<KillRecord> {
    let victim = leader(c)?.unwrap_or(leader_at_start);
    let m = metrics(c, victim)?;
    let killed = Instant::now();
    c.stop_agent(victim, Signal::SIGKILL);
    println!(
        "    {} s: SIGKILL to the leader, {}'s agent",
        secs_since(t0, killed),
        c.node_name(victim)
    );
    Ok(KillRecord {
        victim,
        killed,
        new_holder: None,
        restarted: killed,
        ready: killed,
        syncs_ok: metric_value(&m, "nodelb_syncs_total{result=\"ok\"}").unwrap_or(0.0),
        sync_errors: metric_value(&m, "nodelb_syncs_total{result=\"error\"}").unwrap_or(0.0),
    })
}

/// Starts the killed agent again once another holds `nodelb-status` (or `TAKEOVER_WAIT`
/// passed), and not before `RESTART_DELAY`.
fn restart_after_takeover(
    c: &mut Cluster,
    mut k: KillRecord,
    pids: &mut [Vec<u32>],
    t0: Instant,
) -> Res<KillState> {
    if k.new_holder.is_none() {
        k.new_holder = leader(c)?
            .filter(|h| *h != k.victim)
            .map(|h| (h, Instant::now()));
    }
    let waited = k.killed.elapsed();
    if waited < RESTART_DELAY || (k.new_holder.is_none() && waited < TAKEOVER_WAIT) {
        return Ok(KillState::Down(k));
    }
    c.start_agent(k.victim);
    pids[k.victim].extend(c.agent_pid(k.victim));
    k.restarted = Instant::now();
    println!(
        "    {} s: {}'s agent started again ({:.1} s after the kill; {})",
        secs_since(t0, k.restarted),
        c.node_name(k.victim),
        (k.restarted - k.killed).as_secs_f64(),
        takeover_text(&k, |i| c.node_name(i).to_string())
    );
    Ok(KillState::Restarting(k))
}

/// `<node>'s agent took nodelb-status <s> after the kill`, or that none did.
fn takeover_text(k: &KillRecord, name: impl Fn(usize) -> String) -> String {
    k.new_holder
        .map_or("no other agent took nodelb-status".to_string(), |(h, t)| {
            format!(
                "{}'s agent took nodelb-status {:.1} s after the kill",
                name(h),
                (t - k.killed).as_secs_f64()
            )
        })
}

/// Done once the restarted agent answers `/readyz` and programs all `n` Services.
fn ready_again(c: &mut Cluster, mut k: KillRecord, n: usize, t0: Instant) -> Res<KillState> {
    if !c.agent_running(k.victim) {
        return Err(format!(
            "the restarted agent exited; log:\n{}",
            tail(&c.agent_log(k.victim), 40)
        ));
    }
    let ready = matches!(c.readyz(k.victim), Ok((200, _)))
        && metric_sum(&metrics(c, k.victim)?, "nodelb_services_programmed") as usize == n;
    if !ready {
        if k.restarted.elapsed() > READY_TIMEOUT {
            return Err("the restarted agent did not program every Service".into());
        }
        return Ok(KillState::Restarting(k));
    }
    k.ready = Instant::now();
    println!(
        "    {} s: the restarted agent programmed {n} Services again, {:.1} s after its start",
        secs_since(t0, k.ready),
        (k.ready - k.restarted).as_secs_f64()
    );
    Ok(KillState::Done(k))
}

/// Seconds since the churn started, for its timeline.
fn secs_since(t0: Instant, at: Instant) -> String {
    format!("{:>4.0}", at.saturating_duration_since(t0).as_secs_f64())
}

/// Waits until every update is in every node's kernel, for at most `SETTLE`.
fn settle(out: &mut Churned, watches: &[ElementWatch], ports: &[u16]) -> Res<Duration> {
    let t = Instant::now();
    loop {
        for (i, w) in watches.iter().enumerate() {
            out.seen[i].absorb(w.drain());
        }
        let missing = out
            .seen
            .iter()
            .map(|s| {
                out.puts
                    .iter()
                    .filter(|p| s.first_after(ports[p.svc], p.addr, p.sent).is_none())
                    .count()
            })
            .sum::<usize>();
        if missing == 0 || t.elapsed() > SETTLE {
            return Ok(t.elapsed());
        }
        std::thread::sleep(Duration::from_millis(250));
    }
}

// ---- what the kernels gained -----------------------------------------------------------------

/// One node's kernel over the churn: when each (Service port, endpoint address) was added to
/// the agent's endpoint map, by which process.
#[derive(Default)]
struct NodeSeen {
    added: HashMap<(u16, Ipv4Addr), Vec<Instant>>,
    transactions: usize,
    /// Transactions by thread groups (pid) other than the agent's.
    by: BTreeMap<Option<u32>, usize>,
    overruns: usize,
}

impl NodeSeen {
    fn absorb(&mut self, seen: Vec<Seen>) {
        for s in seen {
            let t = match s {
                Seen::Overrun(_) => {
                    self.overruns += 1;
                    continue;
                }
                Seen::Transaction(t) => t,
            };
            self.transactions += 1;
            *self.by.entry(t.tgid).or_default() += 1;
            for a in t.added.iter().filter(|a| a.set == "endpoints") {
                if let Some(k) = endpoint(&a.key, &a.data) {
                    self.added.entry(k).or_default().push(t.at);
                }
            }
        }
    }

    /// When `addr` was first added for `port` at or after `after`.
    fn first_after(&self, port: u16, addr: Ipv4Addr, after: Instant) -> Option<Instant> {
        self.added
            .get(&(port, addr))?
            .iter()
            .copied()
            .find(|t| *t >= after)
    }

    /// Transactions by a process other than `pids` (a thread the bench could still name).
    fn foreign(&self, pids: &[u32]) -> usize {
        self.by
            .iter()
            .filter(|(p, _)| p.is_some_and(|p| !pids.contains(&p)))
            .map(|(_, n)| n)
            .sum()
    }
}

/// An endpoint map element: key `l4proto . dport . index`, data `daddr . dport`, each field
/// padded to 4 bytes as the kernel holds a concatenation.
fn endpoint(key: &[u8], data: &[u8]) -> Option<(u16, Ipv4Addr)> {
    let port = u16::from_be_bytes(key.get(4..6)?.try_into().ok()?);
    let addr: [u8; 4] = data.get(0..4)?.try_into().ok()?;
    Some((port, Ipv4Addr::from(addr)))
}

// ---- the assessment ------------------------------------------------------------------------

struct AgentReport {
    node: String,
    all: Option<Stats>,
    outside_downtime: Option<Stats>,
    /// The same updates from the PUT's response.
    from_answer: Option<Stats>,
    /// Updates sent while the agent was down, or pending when it was killed, and how long the
    /// slowest of them took.
    during_downtime: usize,
    lost: usize,
    sync_errors: f64,
    syncs_ok: f64,
    /// The first sample growth is read from: minute 1, or for the agent that took
    /// nodelb-status over, its first as the leader (`took_lead`: when it took it, s).
    minute1: Option<(f64, Memory)>,
    took_lead: Option<f64>,
    end: Option<(f64, Memory)>,
    /// `VmRSS` every `TIMELINE_EVERY` seconds of the churn, and at its end.
    timeline: Vec<(f64, Memory)>,
    restarted: bool,
    /// CPU seconds an hour over the churn (`None`: restarted meanwhile).
    cpu_per_hour: Option<f64>,
    status_writes: usize,
    events: usize,
    warnings: (usize, Vec<String>),
    kernel_mismatches: Vec<String>,
    transactions: usize,
    foreign: usize,
    overruns: usize,
}

struct Report {
    agents: Vec<AgentReport>,
    puts: Stats,
    sent: usize,
    duration: Duration,
    late: usize,
    kill: Option<KillRecord>,
    names: Vec<String>,
    /// Status writes and Events after convergence by anyone, Events' reasons.
    status_writes_total: usize,
    events_after: Vec<String>,
    /// What the kill may change in the statuses: the killed node's address (its agent silent
    /// for about a lease duration, the new leader may drop it and add it back), and how many
    /// Services.
    victim_addr: Option<String>,
    services: usize,
    /// The status writes and Events after convergence against the goal.
    after: AfterConvergence,
    wrong_status: Vec<String>,
    settle: Duration,
}

fn assess(
    c: &Cluster,
    cfg: &Config,
    ports: &[u16],
    slices: &[EndpointSlice],
    conv: &Converged,
    ch: Churned,
) -> Res<Report> {
    let records = audit(c)?;
    let after = &received_after(&records, &conv.audit_mark);
    let mut agents = Vec::new();
    for i in 0..NODES {
        let m = metrics(c, i)?;
        let killed = ch.kill.as_ref().filter(|k| k.victim == i);
        let lat = latencies(&ch, i, ports, killed);
        let memory = &ch.memory[i];
        // The agent that took nodelb-status over grows by the leader's state then: its growth
        // is read from its first sample as the leader.
        let took_lead = ch
            .kill
            .as_ref()
            .and_then(|k| k.new_holder)
            .filter(|(holder, _)| *holder == i)
            .map(|(_, at)| at.saturating_duration_since(ch.started).as_secs_f64());
        let from = took_lead.unwrap_or((cfg.duration / 5).as_secs_f64());
        let minute1 = memory.iter().find(|(s, _)| *s >= from).copied();
        let src = std::net::IpAddr::V4(c.node_api_addr(i));
        let by_agent = after.iter().filter(|r| r.source == src);
        agents.push(AgentReport {
            node: c.node_name(i).to_string(),
            all: stats(&lat.all),
            outside_downtime: stats(&lat.outside),
            from_answer: stats(&lat.outside_from_answer),
            during_downtime: lat.during,
            lost: lat.lost,
            sync_errors: metric_value(&m, "nodelb_syncs_total{result=\"error\"}").unwrap_or(0.0)
                + killed.map_or(0.0, |k| k.sync_errors),
            syncs_ok: metric_value(&m, "nodelb_syncs_total{result=\"ok\"}").unwrap_or(0.0)
                + killed.map_or(0.0, |k| k.syncs_ok),
            minute1,
            took_lead,
            end: memory.last().copied(),
            timeline: memory
                .iter()
                .enumerate()
                .filter(|(k, (t, _))| {
                    (*t as u64).is_multiple_of(TIMELINE_EVERY) || *k + 1 == memory.len()
                })
                .map(|(_, m)| *m)
                .collect(),
            restarted: killed.is_some(),
            cpu_per_hour: ch.cpu[i],
            status_writes: by_agent.clone().filter(|r| r.is_status_write()).count(),
            events: by_agent.filter(|r| r.is_event_create()).count(),
            warnings: warnings(&c.agent_log(i), conv.log_marks[i]),
            kernel_mismatches: kernel_check(c, i, ports, slices)?,
            transactions: ch.seen[i].transactions,
            foreign: ch.seen[i].foreign(&ch.pids[i]),
            overruns: ch.seen[i].overruns,
        });
    }
    let rtt: Vec<f64> = ch.puts.iter().map(|p| ms(p.answered - p.sent)).collect();
    let status_writes_total = after.iter().filter(|r| r.is_status_write()).count();
    let events_after = events_after(c, conv)?;
    let victim_addr = ch.kill.as_ref().map(|k| c.node_v4(k.victim).to_string());
    let after = AfterConvergence::of(
        victim_addr.as_deref(),
        &conv.want,
        ports.len(),
        status_writes_total,
        &events_after,
    );
    Ok(Report {
        agents,
        puts: stats(&rtt).ok_or("no update was sent")?,
        sent: ch.puts.len(),
        duration: ch.ended - ch.started,
        late: ch.late,
        kill: ch.kill.clone(),
        names: (0..NODES).map(|i| c.node_name(i).to_string()).collect(),
        status_writes_total,
        events_after,
        wrong_status: wrong_status(c, &conv.want)?,
        victim_addr,
        services: ports.len(),
        after,
        settle: ch.settle,
    })
}

/// One node's event-to-kernel latencies, in ms.
#[derive(Default)]
struct Latencies {
    /// Every update that reached the kernel, from its PUT being sent.
    all: Vec<f64>,
    /// Outside the agent's downtime, from the PUT being sent and from its response (the write
    /// accepted: without the server's own time).
    outside: Vec<f64>,
    outside_from_answer: Vec<f64>,
    /// Updates in the agent's downtime, and updates that never reached the kernel.
    during: usize,
    lost: usize,
}

/// Node `i`'s latencies; the downtime is from the kill until the restarted agent was ready,
/// for updates not in its kernel before the kill.
fn latencies(ch: &Churned, i: usize, ports: &[u16], killed: Option<&KillRecord>) -> Latencies {
    let mut l = Latencies::default();
    for p in &ch.puts {
        let seen = ch.seen[i].first_after(ports[p.svc], p.addr, p.sent);
        let in_downtime =
            killed.is_some_and(|k| p.sent <= k.ready && seen.is_none_or(|s| s >= k.killed));
        match seen {
            None => l.lost += 1,
            Some(s) => {
                l.all.push(ms(s - p.sent));
                if !in_downtime {
                    l.outside.push(ms(s - p.sent));
                    l.outside_from_answer
                        .push(ms(s.saturating_duration_since(p.answered)));
                }
            }
        }
        l.during += usize::from(in_downtime);
    }
    l
}

/// Node `i`'s endpoint map, listed by `nft`, against the slices: every Service's port maps to
/// exactly its slice's addresses. Returns what differs.
fn kernel_check(
    c: &Cluster,
    i: usize,
    ports: &[u16],
    slices: &[EndpointSlice],
) -> Res<Vec<String>> {
    let text = c
        .node_ns(i)
        .sh_ok("nft list map ip nodelb endpoints")
        .map_err(|e| format!("listing node {i}'s endpoint map: {e}"))?;
    let mut got: HashMap<u16, BTreeSet<String>> = HashMap::new();
    for chunk in text.split("tcp . ").skip(1) {
        let port = chunk.split_whitespace().next().and_then(|p| p.parse().ok());
        // `tcp . <port> . <index> comment "..." : <address> . <target port>`
        let addr = chunk
            .split_once(" : ")
            .and_then(|(_, rest)| rest.split_once(&format!(" . {TARGET_PORT}")))
            .map(|(addr, _)| addr.trim());
        if let (Some(port), Some(addr)) = (port, addr) {
            got.entry(port).or_default().insert(addr.to_string());
        }
    }
    let mut wrong = Vec::new();
    for (svc, slice) in slices.iter().enumerate() {
        let want: BTreeSet<String> = slice
            .endpoints
            .iter()
            .flat_map(|e| e.addresses.iter().cloned())
            .collect();
        let have = got.remove(&ports[svc]).unwrap_or_default();
        if have != want {
            wrong.push(format!(
                "{}: kernel {have:?}, slice {want:?}",
                lb_services::service_name(svc)
            ));
        }
    }
    wrong.extend(
        got.keys()
            .map(|p| format!("port {p}: in the kernel, no Service")),
    );
    Ok(wrong)
}

/// Services whose status is not every node's address with `nodelb.io/Serving` true.
fn wrong_status(c: &Cluster, want: &[String]) -> Res<Vec<String>> {
    Ok(c.services(c.namespace())?
        .iter()
        .filter(|s| {
            let serving = s
                .status
                .as_ref()
                .and_then(|st| st.conditions.as_ref())
                .into_iter()
                .flatten()
                .any(|c| c.type_ == "nodelb.io/Serving" && c.status == "True");
            ingress_ips(s) != want || !serving
        })
        .map(|s| {
            format!(
                "{}: {:?}",
                s.metadata.name.as_deref().unwrap_or("?"),
                ingress_ips(s)
            )
        })
        .collect())
}

/// Events in the Services' namespace since convergence: `reason regarding (reporter): note`.
fn events_after(c: &Cluster, conv: &Converged) -> Res<Vec<String>> {
    use k8s_openapi::api::events::v1::Event;
    let api: Api<Event> = Api::namespaced(c.admin().clone(), c.namespace());
    let list = c
        .block_on(api.list(&Default::default()))
        .map_err(|e| format!("listing Events: {e}"))?;
    Ok(list
        .items
        .iter()
        .filter(|e| {
            let t = e.event_time.as_ref().map(|t| t.0).or(e
                .metadata
                .creation_timestamp
                .as_ref()
                .map(|t| t.0));
            t.is_some_and(|t| t >= conv.at)
        })
        .map(|e| {
            format!(
                "{} {} ({}): {}",
                e.reason.as_deref().unwrap_or("?"),
                e.regarding
                    .as_ref()
                    .and_then(|r| r.name.as_deref())
                    .unwrap_or("?"),
                e.reporting_instance.as_deref().unwrap_or("?"),
                e.note.as_deref().unwrap_or("")
            )
        })
        .collect())
}

/// WARN and ERROR lines of an agent's log after `from`: how many, and the distinct messages
/// (without their time stamps), at most `WARNINGS_SHOWN`.
fn warnings(log: &str, from: usize) -> (usize, Vec<String>) {
    let mut count = 0;
    let mut distinct: Vec<String> = Vec::new();
    for l in log.get(from..).unwrap_or("").lines() {
        let Some(pos) = l.find(" WARN ").or_else(|| l.find(" ERROR ")) else {
            continue;
        };
        count += 1;
        let msg: String = l[pos..].trim().chars().take(200).collect();
        if distinct.len() < WARNINGS_SHOWN && !distinct.contains(&msg) {
            distinct.push(msg);
        }
    }
    (count, distinct)
}

// ---- printing ------------------------------------------------------------------------------

fn growth(a: &AgentReport) -> Option<f64> {
    let (_, m1) = a.minute1?;
    let (_, end) = a.end?;
    Some(end.rss as f64 / m1.rss as f64 - 1.0)
}

fn print_report(cfg: &Config, r: &Report, loads: [&str; 3]) {
    println!();
    println!(
        "  churn: {} updates in {:.1} s ({:.1}/s; {} sent over 100 ms late); PUT round trip p50 {:.1} ms, p99 {:.1} ms, max {:.1} ms; every update in every kernel {:.1} s after the churn",
        r.sent,
        r.duration.as_secs_f64(),
        r.sent as f64 / r.duration.as_secs_f64(),
        r.late,
        r.puts.p50,
        r.puts.p99,
        r.puts.max,
        r.settle.as_secs_f64()
    );
    println!(
        "  machine load average (1, 5, 15 min): {} at the start, {} when the churn started, {} at its end",
        loads[0], loads[1], loads[2]
    );
    if let Some(k) = &r.kill {
        println!(
            "  leader kill: {}'s agent SIGKILLed; {}; restarted after {:.1} s; programmed every Service again {:.1} s after its restart",
            r.names[k.victim],
            takeover_text(k, |i| r.names[i].clone()),
            (k.restarted - k.killed).as_secs_f64(),
            (k.ready - k.restarted).as_secs_f64()
        );
    }
    for a in &r.agents {
        print_agent(cfg, a);
    }
    println!(
        "  after convergence: {} Service status writes (audit log, anyone); {} Events in the Services' namespace",
        r.status_writes_total,
        r.events_after.len()
    );
    for e in r.events_after.iter().take(10) {
        println!("    event: {e}");
    }
    for w in r.wrong_status.iter().take(10) {
        println!("    wrong status: {w}");
    }
    print_goals(r);
}

fn print_agent(cfg: &Config, a: &AgentReport) {
    let row = |s: &Option<Stats>| {
        s.map_or("none".to_string(), |s| {
            format!(
                "n={} p50_ms={:.2} p99_ms={:.2} max_ms={:.2}",
                s.n, s.p50, s.p99, s.max
            )
        })
    };
    let mem = |m: Option<(f64, Memory)>| {
        m.map_or("?".to_string(), |(t, m)| {
            format!(
                "{:.1} MiB at {t:.0} s (VmHWM {:.1})",
                mib(m.rss),
                mib(m.hwm)
            )
        })
    };
    println!();
    println!(
        "  {}{}: event-to-kernel (PUT sent -> transaction seen in its namespace)",
        a.node,
        if a.restarted {
            " (killed and restarted)"
        } else {
            ""
        }
    );
    println!("    all updates:             {}", row(&a.all));
    println!("    outside its downtime:    {}", row(&a.outside_downtime));
    println!("      from the PUT's response: {}", row(&a.from_answer));
    println!(
        "    in its downtime: {}; never reached its kernel: {}; transactions seen {}, by another process {}, watch overruns {}",
        a.during_downtime, a.lost, a.transactions, a.foreign, a.overruns
    );
    println!(
        "    syncs ok {}, errors {}; CPU {} s an hour over the churn; VmRSS {} -> {} ({}); status writes {} and Events {} after convergence",
        a.syncs_ok,
        a.sync_errors,
        a.cpu_per_hour
            .map_or("? (restarted)".into(), |c| format!("{c:.1}")),
        mem(a.minute1),
        mem(a.end),
        growth(a).map_or("?".into(), |g| format!("{:+.1}%", g * 100.0)),
        a.status_writes,
        a.events
    );
    let timeline: Vec<String> = a
        .timeline
        .iter()
        .map(|(t, m)| format!("{t:.0}s:{:.1}", mib(m.rss)))
        .collect();
    println!("    VmRSS MiB over the churn: {}", timeline.join(" "));
    println!(
        "    kernel check (nft list map): {} of {} Services differ from their slice",
        a.kernel_mismatches.len(),
        cfg.services
    );
    for m in a.kernel_mismatches.iter().take(5) {
        println!("      {m}");
    }
    println!(
        "    log: {} WARN/ERROR lines during the churn",
        a.warnings.0
    );
    for w in &a.warnings.1 {
        println!("      {w}");
    }
}

fn print_goals(r: &Report) {
    println!();
    println!("Goals (a MISS is reported, not failed)");
    for a in &r.agents {
        let n = &a.node;
        println!(
            "  {} {n}: sync errors = 0: {}",
            goal(a.sync_errors == 0.0),
            a.sync_errors
        );
        match growth(a) {
            Some(g) => println!(
                "  {} {n}: VmRSS growth from {} to the end <= {:.0}%: {:+.1}% ({:.1} -> {:.1} MiB{})",
                goal(g <= GOAL_RSS_GROWTH),
                match (a.took_lead, a.minute1) {
                    (Some(t), Some((at, _))) => format!(
                        "its first sample as the leader ({at:.0} s; it took nodelb-status at {t:.1} s)"
                    ),
                    _ => "minute 1".to_string(),
                },
                GOAL_RSS_GROWTH * 100.0,
                g * 100.0,
                a.minute1.map_or(0.0, |(_, m)| mib(m.rss)),
                a.end.map_or(0.0, |(_, m)| mib(m.rss)),
                if a.restarted { "; a new process since the kill" } else { "" }
            ),
            None => println!("  MISS {n}: VmRSS growth: not measured"),
        }
        match a.outside_downtime {
            Some(s) => println!(
                "  {} {n}: event-to-kernel p99 outside its downtime < {GOAL_P99_MS:.0} ms: {:.2} ms (p50 {:.2}, max {:.2}; from the PUT's response p99 {:.2})",
                goal(s.p99 < GOAL_P99_MS),
                s.p99,
                s.p50,
                s.max,
                a.from_answer.map_or(f64::NAN, |s| s.p99)
            ),
            None => println!("  MISS {n}: event-to-kernel: no update seen"),
        }
        println!(
            "  {} {n}: every update in its kernel, and the kernel equal to the slices: {} lost, {} Services differ",
            goal(a.lost == 0 && a.kernel_mismatches.is_empty()),
            a.lost,
            a.kernel_mismatches.len()
        );
    }
    let after = &r.after;
    match &r.victim_addr {
        None => {
            println!(
                "  {} no status write after convergence: {}",
                goal(after.writes_ok),
                r.status_writes_total
            );
            println!(
                "  {} no Event after convergence: {}",
                goal(after.events_ok),
                r.events_after.len()
            );
        }
        Some(a) => {
            println!(
                "  {} no status write after convergence but the killed node's leaving and return ({a}: its agent silent about a lease duration; at most 2 per Service, {}): {}",
                goal(after.writes_ok),
                2 * r.services,
                r.status_writes_total
            );
            println!(
                "  {} no Event after convergence but UpdatedLoadBalancer with or without {a}: {} such, {} others",
                goal(after.events_ok),
                r.events_after.len() - after.other_events,
                after.other_events
            );
        }
    }
    println!(
        "  {} Services with a wrong status at the end = 0: {}",
        goal(r.wrong_status.is_empty()),
        r.wrong_status.len()
    );
    println!();
    print_bench_lines(r);
}

fn print_bench_lines(r: &Report) {
    let after = &r.after;
    for a in &r.agents {
        let s = |s: &Option<Stats>, f: fn(&Stats) -> f64| s.as_ref().map_or(f64::NAN, f);
        println!(
            "bench soak node={} p50_ms={:.2} p99_ms={:.2} max_ms={:.2} outside_downtime_p50_ms={:.2} outside_downtime_p99_ms={:.2} outside_downtime_max_ms={:.2} from_response_p99_ms={:.2} in_downtime={} lost={} restarted={}",
            a.node,
            s(&a.all, |s| s.p50),
            s(&a.all, |s| s.p99),
            s(&a.all, |s| s.max),
            s(&a.outside_downtime, |s| s.p50),
            s(&a.outside_downtime, |s| s.p99),
            s(&a.outside_downtime, |s| s.max),
            s(&a.from_answer, |s| s.p99),
            a.during_downtime,
            a.lost,
            a.restarted
        );
        println!(
            "bench soak node={} sync_errors={} {} cpu_s_per_hour={:.1} rss_minute1_mib={:.1} rss_end_mib={:.1} rss_growth_pct={:.1} {} status_writes={} events={}",
            a.node,
            a.sync_errors,
            goal(a.sync_errors == 0.0),
            a.cpu_per_hour.unwrap_or(f64::NAN),
            a.minute1.map_or(f64::NAN, |(_, m)| mib(m.rss)),
            a.end.map_or(f64::NAN, |(_, m)| mib(m.rss)),
            growth(a).map_or(f64::NAN, |g| g * 100.0),
            goal(growth(a).is_some_and(|g| g <= GOAL_RSS_GROWTH)),
            a.status_writes,
            a.events
        );
    }
    println!(
        "bench soak status_writes_after_convergence={} {} events_after_convergence={} {} wrong_status={} {}",
        r.status_writes_total,
        goal(after.writes_ok),
        r.events_after.len(),
        goal(after.events_ok),
        r.wrong_status.len(),
        goal(r.wrong_status.is_empty())
    );
    println!(
        "bench soak updates={} seconds={:.0} put_rtt_p50_ms={:.2} put_rtt_p99_ms={:.2}",
        r.sent,
        r.duration.as_secs_f64(),
        r.puts.p50,
        r.puts.p99
    );
}

/// The status writes and Events after convergence against the goal: none without a kill. With
/// one, the new leader judges the killed holder's node from its last renewal, not from the
/// takeover (`heartbeat::Liveness::after`), so an agent down about a lease duration may be
/// dropped from every status and added back: at most two writes per Service, and only Events
/// that list every node or every node but the killed one.
struct AfterConvergence {
    writes_ok: bool,
    events_ok: bool,
    other_events: usize,
}

impl AfterConvergence {
    /// `victim`: the killed node's address, if one was killed; `want`: the addresses every
    /// Service lists; `services`: how many Services; then the writes and Events (`reason: note`)
    /// after convergence.
    fn of(
        victim: Option<&str>,
        want: &[String],
        services: usize,
        status_writes: usize,
        events: &[String],
    ) -> AfterConvergence {
        let Some(victim) = victim else {
            return AfterConvergence {
                writes_ok: status_writes == 0,
                events_ok: events.is_empty(),
                other_events: events.len(),
            };
        };
        let survivors: Vec<&str> = want
            .iter()
            .map(String::as_str)
            .filter(|a| *a != victim)
            .collect();
        let lists = [want.join(", "), survivors.join(", ")]
            .map(|l| format!(": Updated load balancer: {l}"));
        let other_events = events
            .iter()
            .filter(|e| {
                !(e.starts_with("UpdatedLoadBalancer ") && lists.iter().any(|l| e.ends_with(l)))
            })
            .count();
        AfterConvergence {
            writes_ok: status_writes <= 2 * services,
            events_ok: other_events == 0,
            other_events,
        }
    }
}

// ---- small helpers -------------------------------------------------------------------------

/// `GET /metrics` of node `i`'s agent.
fn metrics(c: &Cluster, i: usize) -> Res<String> {
    c.try_metrics(i)
}

fn audit(c: &Cluster) -> Res<Vec<AuditRecord>> {
    c.audit()
        .ok_or_else(|| "no audit log: the soak needs the harness's own kube-apiserver".into())
}
