//! The status leader at N nodes: the heap and the time of a whole status round
//! (`Status::compute` from nothing, as a new leader does) for 10,000 Services × 5 endpoints on
//! N = 10, 100, 1,000 and 5,000 nodes. The nodes fall into a handful of classes (three zones, and
//! every tenth node excluded from load balancers) while each carries labels of its own
//! (`kubernetes.io/hostname`); 30% of the Services are `Local`, one in ten has a node
//! selector on the zone, one in 500 loses its port to an older Service, and each Service's
//! endpoints run on nodes spread over the cluster. The cluster is IPv6 (2001:db8::/32), so
//! every node has an address of its own within the documentation range. Every node's heartbeat
//! says host listeners hold ports there, by daemons and on ports of its own that no Service
//! uses (they must not make each node its own class), and on one node a daemon holds a
//! Service's port.
//!
//! Prints `bench leader nodes=N services=S heap_mib=X round_ms=Y classes=C` per N (heap: the peak of
//! bytes live during the round above the objects and nodes it reads, counted by a wrapping
//! allocator), details, the per-node computation it replaced where that is cheap (up to
//! NODELB_BENCH_LEADER_OLD_NODES nodes, default 10: it grows with the nodes, see
//! docs/benchmarks.md), and
//! each goal as PASS or MISS.
//! The row's `writes_per_s` is the steady API write rate of the agents and the leader together
//! at the agent's default flags, in Pods as the manifests run them (see `steady_writes_per_s`),
//! judged at 5,000 nodes against a budget of one write per node per 60 s.
//! `cargo bench -p nodelb-agent --bench leader`; NODELB_BENCH_LEADER_NODES (`10,100,1000,5000`),
//! NODELB_BENCH_SERVICES (10,000).

mod heap;

use clap::Parser;
use heap::{mib, peak_above, peak_from_now};
use k8s_openapi::api::core::v1::Node;
use nodelb_agent::cli::{Cli, Command};
use nodelb_agent::kube::lease::heartbeat_period;
use nodelb_core::fixtures::{self, heartbeat, Ep, Slice, Svc};
use nodelb_core::objects::wire::{EndpointSlice, Service};
use nodelb_core::plan::config::Config;
use nodelb_core::plan::{Objects, Planner};
use nodelb_core::status::classes::{candidates, node_context};
use nodelb_core::status::heartbeat::Heartbeat;
use nodelb_core::status::{Status, StatusConfig};
use nodelb_core::vocab::Protocol;
use serde_json::json;
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

const ENDPOINTS: usize = 5;
const ZONES: [&str; 3] = ["zone-a", "zone-b", "zone-c"];

fn env(name: &str) -> Option<String> {
    std::env::var(name).ok().filter(|v| !v.is_empty())
}

/// What the leader reads: the objects, the Nodes and their heartbeats.
struct Cluster {
    objects: Objects,
    nodes: Vec<Node>,
    beats: BTreeMap<String, Heartbeat>,
    ages: BTreeMap<String, Duration>,
    slices: Vec<EndpointSlice>,
    cfg: StatusConfig,
}

fn node_name(i: usize) -> String {
    format!("node-{i:04}")
}

/// Node `i`: in zone `i % 3`, excluded from load balancers when `i % 10 == 9`.
fn node(i: usize) -> Node {
    let name = node_name(i);
    let n = fixtures::node(&name)
        .label("kubernetes.io/hostname", &name)
        .label("kubernetes.io/os", "linux")
        .label("topology.kubernetes.io/zone", ZONES[i % 3])
        .label("node.kubernetes.io/instance-type", "m5.large")
        .address("InternalIP", format!("2001:db8:1::{:x}", i + 1))
        .address("Hostname", &name);
    match i % 10 {
        9 => n.label(
            "node.kubernetes.io/exclude-from-external-load-balancers",
            "true",
        ),
        _ => n,
    }
    .k8s()
}

/// The Service ports, in order: TCP, none reserved; Service `i` reuses its predecessor's port
/// when `i % 500 == 1` (it is younger, and loses the port where both are served).
fn ports(n: usize, cfg: &Config) -> Vec<u16> {
    let mut out: Vec<u16> = Vec::with_capacity(n);
    let mut next = 1024u16;
    for i in 0..n {
        if i % 500 == 1 {
            out.push(out[i - 1]);
            continue;
        }
        while cfg.reserved_ports.contains(Protocol::Tcp, next) {
            next += 1;
        }
        out.push(next);
        next += 1;
    }
    out
}

/// Service `i`: created one second after `i - 1`, Local when `i % 10 < 3`, with a node
/// selector on the zone when `i % 10 == 0`.
fn service(i: usize, port: u16) -> Service {
    let created = format!(
        "2024-01-01T{:02}:{:02}:{:02}Z",
        i / 3600 % 24,
        i / 60 % 60,
        i % 60
    );
    let policy = if i % 10 < 3 { "Local" } else { "Cluster" };
    let s = Svc::lb("bench", &format!("svc-{i}"))
        .created(&created)
        .spec("externalTrafficPolicy", policy)
        .spec("ipFamilies", json!(["IPv6"]))
        .port("http", port, "TCP");
    let selector = match i % 20 {
        0 => Some("topology.kubernetes.io/zone=zone-a"),
        10 => Some("topology.kubernetes.io/zone in (zone-b,zone-c)"),
        _ => None,
    };
    match selector {
        Some(sel) => s.annotation("nodelb.io/node-selector", sel),
        None => s,
    }
    .wire()
}

/// The ports host listeners hold on node `i`, as its heartbeat lists them: daemons of its own
/// on ports no Service uses (the Services' are below 12,000), and on node 3 (at every N) one
/// on the port `held` of a Service.
fn blocked(i: usize, held: u16) -> String {
    let mut list = format!(
        "IPv6/TCP/{}=agent-{},IPv6/UDP/{}=dnsd-{i}",
        20_000 + i % 997,
        i % 13,
        30_000 + (i * 7) % 1000
    );
    if i.is_multiple_of(4) {
        list.push_str(",IPv6/TCP/19100=node_exporter");
    }
    if i == 3 {
        list.push_str(&format!(",IPv6/TCP/{held}=socat"));
    }
    list
}

/// Service `i`'s endpoints, on nodes spread over the cluster (`shift` moves them).
fn slice(i: usize, nodes: usize, shift: usize) -> EndpointSlice {
    let eps = (0..ENDPOINTS).map(|e| {
        let k = i * ENDPOINTS + e;
        let node = (k * 7919 + shift) % nodes;
        // One in fifty Services has an endpoint on its way out.
        let terminating = i.is_multiple_of(50) && e == 0;
        Ep::at(format!("2001:db8:2::{:x}", k % 60_000 + 1))
            .node(&node_name(node))
            .ready(!terminating)
            .serving(true)
            .terminating(terminating)
    });
    Slice::ipv6("bench", &format!("svc-{i}-1"), &format!("svc-{i}"))
        .port("http", 8080, "TCP")
        .endpoints(eps)
        .wire()
}

impl Cluster {
    fn new(nodes: usize, services: usize) -> Cluster {
        let cfg = StatusConfig {
            planner: Config {
                ipv4: false,
                ipv6: true,
                ..Config::default()
            },
            node_lease_duration: Duration::from_secs(15),
        };
        let ports = ports(services, &cfg.planner);
        let slices: Vec<EndpointSlice> = (0..services).map(|i| slice(i, nodes, 0)).collect();
        let objects = Objects::from_lists(
            (0..services).map(|i| service(i, ports[i]).into()),
            slices.iter().cloned().map(Into::into),
        );
        let beats: BTreeMap<String, Heartbeat> = (0..nodes)
            .map(|i| {
                let beat = heartbeat(&node_name(i))
                    .families("IPv6")
                    .blocked(&blocked(i, ports[3]));
                (node_name(i), beat.heartbeat())
            })
            .collect();
        let ages = beats
            .keys()
            .map(|n| (n.clone(), Duration::from_secs(1)))
            .collect();
        Cluster {
            objects,
            nodes: (0..nodes).map(node).collect(),
            beats,
            ages,
            slices,
            cfg,
        }
    }

    fn round(&self, status: &mut Status) -> usize {
        status
            .compute(
                &self.objects,
                &self.nodes,
                &self.beats,
                &self.ages,
                &self.cfg,
            )
            .len()
    }
}

/// What was measured at one N.
struct Measured {
    nodes: usize,
    heap: usize,
    round: Duration,
}

/// CPU time this thread has used: beside the wall time, what a round costs when other work
/// shares the machine.
fn cpu() -> Duration {
    let mut t = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `t` is a valid timespec for the call to fill.
    unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut t) };
    Duration::new(t.tv_sec as u64, t.tv_nsec as u32)
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

fn measure(nodes: usize, services: usize, old_up_to: usize) -> Measured {
    let mut c = Cluster::new(nodes, services);
    let base = peak_from_now();
    let (t0, cpu0) = (Instant::now(), cpu());
    let mut status = Status::default();
    let changed = c.round(&mut status);
    let (round, round_cpu) = (t0.elapsed(), cpu() - cpu0);
    let heap = peak_above(base);
    let retained = heap::live() - base;
    assert_eq!(changed, services, "every Service gets a status");
    println!(
        "bench leader nodes={nodes} services={services} heap_mib={:.1} round_ms={:.0} classes={} writes_per_s={:.1}",
        mib(heap),
        ms(round),
        status.classes(),
        steady_writes_per_s(nodes).0
    );
    let desired = status.desired();
    let published: usize = desired.values().map(|d| d.ingress.len()).sum();
    let serving = desired.values().filter(|d| d.serving.status).count();
    let in_use = desired
        .values()
        .filter(|d| d.problems.iter().any(|p| p.reason() == "PortInUseOnNode"))
        .count();
    let listeners: usize = c.beats.values().map(|b| b.blocked.ports.len()).sum();
    println!(
        "  the round took {:.0} ms of CPU; kept after it: {:.1} MiB ({} classes of nodes; {serving} Services serving, {published} addresses published in all; {listeners} ports held by host listeners on the nodes; Services with a port in use on a node: {in_use})",
        ms(round_cpu),
        mib(retained),
        status.classes(),
    );

    // The rounds after: one EndpointSlice changed (its endpoints move to other nodes).
    let mut times = Vec::new();
    for k in 0..100 {
        let i = (k * 97) % services;
        c.objects.put_slice(Arc::new(slice(i, nodes, 1 + k).into()));
        let t0 = Instant::now();
        c.round(&mut status);
        times.push(t0.elapsed());
    }
    let one_slice = median(times);
    // One node's heartbeat goes stale and comes back: every Service is decided again, the
    // classes' planners are kept.
    let mut times = Vec::new();
    for stale in [true, false] {
        let age = if stale { 20 } else { 1 };
        c.ages
            .insert(node_name(nodes / 2), Duration::from_secs(age));
        let t0 = Instant::now();
        c.round(&mut status);
        times.push(t0.elapsed());
    }
    println!(
        "  later rounds: one EndpointSlice changed {:.2} ms (median of 100); a node's heartbeat stale, then fresh: {:.0} ms, {:.0} ms",
        ms(one_slice),
        ms(times[0]),
        ms(times[1]),
    );
    drop(status);
    if nodes <= old_up_to {
        old_per_node(&c);
    } else {
        println!(
            "  the per-node computation it replaced: not run at {nodes} nodes (about {:.0} MiB: {nodes} planners of about 4 MiB; NODELB_BENCH_LEADER_OLD_NODES={nodes} runs it)",
            4.0 * nodes as f64
        );
    }
    drop(c.slices);
    Measured { nodes, heap, round }
}

/// What the leader kept before classes: an outcomes-only planner per serving candidate, each
/// planned from nothing in a new leader's first round.
fn old_per_node(c: &Cluster) {
    let base = peak_from_now();
    let (t0, cpu0) = (Instant::now(), cpu());
    let candidates = candidates(&c.nodes, &c.beats, &c.ages, c.cfg.node_lease_duration);
    let planners: Vec<Planner> = candidates
        .iter()
        .map(|cand| {
            let mut p = Planner::outcomes_only();
            p.update(&c.objects, &node_context(cand, &c.cfg.planner), None);
            p
        })
        .collect();
    let (took, took_cpu) = (t0.elapsed(), cpu() - cpu0);
    println!(
        "  the per-node computation it replaced, its planners alone: heap_mib={:.1} round_ms={:.0} ({:.0} ms of CPU; {} planners)",
        mib(peak_above(base)),
        ms(took),
        ms(took_cpu),
        planners.len()
    );
}

/// The API writes a second the agents and the leader make together once every status is
/// written, at the agent's default flags, as the manifests run them (in Pods with a readiness
/// probe): an agent writes its heartbeat Lease only when what it carries changes or while its
/// kubelet does not answer (`lease::Heartbeat`), so none at steady state (the real-cluster test
/// `every_verb_of_nodelb_at_steady_state_…` counts them in kube-apiserver's audit log),
/// and the leader renews `nodelb-status` every `--retry-period` (followers only read it). A
/// status is written only when it changes. Also returned: the rate of agents run outside Pods,
/// which renew every `heartbeat_period(--node-lease-duration)`.
fn steady_writes_per_s(nodes: usize) -> (f64, f64) {
    let cli = Cli::try_parse_from(["nodelb-agent", "run", "--node-name", "bench"])
        .expect("the agent's defaults parse");
    let Command::Run(run) = cli.command else {
        unreachable!("parsed as run")
    };
    let election = 1.0 / run.retry_period.as_secs_f64();
    let beat = heartbeat_period(run.node_lease_duration).as_secs_f64();
    (election, nodes as f64 / beat + election)
}

fn verdict(pass: bool) -> &'static str {
    if pass {
        "PASS"
    } else {
        "MISS"
    }
}

fn main() {
    let services: usize = env("NODELB_BENCH_SERVICES")
        .and_then(|v| v.parse().ok())
        .unwrap_or(10_000);
    let sizes: Vec<usize> = env("NODELB_BENCH_LEADER_NODES")
        .unwrap_or_else(|| "10,100,1000,5000".into())
        .split(',')
        .map(|n| {
            n.trim()
                .parse()
                .expect("NODELB_BENCH_LEADER_NODES: numbers")
        })
        .collect();
    let old_up_to: usize = env("NODELB_BENCH_LEADER_OLD_NODES")
        .and_then(|v| v.parse().ok())
        .unwrap_or(10);
    let measured: Vec<Measured> = sizes
        .iter()
        .map(|n| measure(*n, services, old_up_to))
        .collect();
    let at = |n: usize| measured.iter().find(|m| m.nodes == n);
    match at(1000) {
        Some(m) => {
            println!(
                "bench leader goal heap at 1000 nodes < 128 MiB: {:.1} MiB {}",
                mib(m.heap),
                verdict(m.heap < 128 << 20)
            );
            println!(
                "bench leader goal round at 1000 nodes < 1 s: {:.0} ms {}",
                ms(m.round),
                verdict(m.round < Duration::from_secs(1))
            );
        }
        None => println!("bench leader goals at 1000 nodes: not measured"),
    }
    match (at(10), at(1000)) {
        (Some(small), Some(large)) => {
            let ratio = large.heap as f64 / small.heap as f64;
            println!(
                "bench leader goal heap at 1000 nodes <= 1.5 x heap at 10: {:.1} / {:.1} MiB = {ratio:.2} {}",
                mib(large.heap),
                mib(small.heap),
                verdict(ratio <= 1.5)
            );
        }
        _ => println!("bench leader goal heap at 1000 nodes <= 1.5 x heap at 10: not measured"),
    }
    for m in measured.iter().filter(|m| m.nodes == 5000) {
        let (writes, outside_pods) = steady_writes_per_s(m.nodes);
        let budget = m.nodes as f64 / 60.0;
        println!(
            "bench leader goal steady writes at 5000 nodes <= one per node per 60 s ({budget:.1}/s): {writes:.1}/s {} (agents outside Pods: {outside_pods:.1}/s)",
            verdict(writes <= budget)
        );
    }
}
