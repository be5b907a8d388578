//! Faults on the real cluster, on a schedule, under steady client load (issue 39): nodelb
//! installed from its image on `scripts/cluster.sh`'s two nodes, a Deployment of four backends
//! behind a LoadBalancer Service, and new TCP connections and UDP flows from the client
//! namespace through both node addresses, 40 a second, each counted failed when it is not
//! answered within 0.9 s (`real_cluster::SLOW`).
//!
//! The faults, in turn, each on one node (alternating; the agent's SIGKILL strikes the last
//! node only after the first round, so one agent lives through the run) where it has one:
//! SIGKILL of the node's agent; kubelet restart; containerd restart; kube-apiserver restart;
//! etcd restart; the node's link down for 5 s and up; `nft flush ruleset` in the node (every
//! table, kube-proxy's too, as a foreign tool would); the node's conntrack table filled to 95%
//! of `nf_conntrack_max` for 30 s (UDP from the client to ports nothing serves); a rolling
//! restart of the backends.
//!
//! For each: the connections that failed from its injection to the next fault, and the time to
//! full recovery: every agent Ready, the Service publishing both nodes, its port in both
//! nodes' `services` map, every backend available, and a TCP and a UDP exchange through each
//! node answered within 0.9 s; the last failed connection's time beside it. Per hour: the
//! growth of each agent's RSS and open file descriptors (the longest-lived process of each
//! node, sampled every 30 s).
//!
//! Prints the figures; fails only when a fault is not recovered from within 180 s (nodelb's
//! promise is that it recovers, the figures say how well). Env: `NODELB_SOAK_SECONDS` (600),
//! `NODELB_SOAK_SLOT_SECONDS` (60, at least 40: the conntrack fill lasts 30 s). Run it with
//! `scripts/soak.sh --duration D [--slot S]` (as root).

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use nodelb_integration::e2e::ingress_ips;
use nodelb_integration::netns::Netns;
use nodelb_integration::real_cluster::{
    agent_pids, backend_deployment, backend_service, bounded, RealCluster, NODELB_NAMESPACE, SLOW,
};
use nodelb_integration::traffic::{self, Outcome};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

/// How the load reaches a target.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Transport {
    /// A new TCP connection, reading the backend's one-line answer.
    Tcp,
    /// A datagram from a new socket (a new flow), reading the backend's one back.
    Udp,
}

const NAMESPACE: &str = "soak";
const SERVICE: &str = "soak";
const FIRST_PORT: u16 = 18_000;
const BACKENDS: u32 = 4;
/// Each fault's slot by default: the next fault comes no sooner than this after the last one.
const SLOT_SECONDS: u64 = 60;
/// The shortest slot: the conntrack fill's 30 s and a few seconds of steady load after it.
const MIN_SLOT_SECONDS: u64 = 40;
/// A fault not recovered from within this fails the run.
const RECOVERY_LIMIT: Duration = Duration::from_secs(180);
/// One exchange every this long, over the four targets (two nodes, TCP and UDP).
const INTERVAL: Duration = Duration::from_millis(25);
/// How often the agents' RSS and descriptors are read.
const SAMPLE_EVERY: Duration = Duration::from_secs(30);

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Fault {
    AgentKill,
    KubeletRestart,
    ContainerdRestart,
    ApiserverRestart,
    EtcdRestart,
    LinkDownUp,
    ForeignFlush,
    ConntrackFull,
    BackendRoll,
}

const FAULTS: [Fault; 9] = [
    Fault::AgentKill,
    Fault::KubeletRestart,
    Fault::ContainerdRestart,
    Fault::ApiserverRestart,
    Fault::EtcdRestart,
    Fault::LinkDownUp,
    Fault::ForeignFlush,
    Fault::ConntrackFull,
    Fault::BackendRoll,
];

impl Fault {
    fn name(self) -> &'static str {
        match self {
            Fault::AgentKill => "agent SIGKILL",
            Fault::KubeletRestart => "kubelet restart",
            Fault::ContainerdRestart => "containerd restart",
            Fault::ApiserverRestart => "kube-apiserver restart",
            Fault::EtcdRestart => "etcd restart",
            Fault::LinkDownUp => "link down 5 s, up",
            Fault::ForeignFlush => "nft flush ruleset",
            Fault::ConntrackFull => "conntrack 95% full, 30 s",
            Fault::BackendRoll => "backend rolling restart",
        }
    }

    /// Whether it strikes one node (else the control plane or the Deployment).
    fn on_a_node(self) -> bool {
        !matches!(
            self,
            Fault::ApiserverRestart | Fault::EtcdRestart | Fault::BackendRoll
        )
    }
}

/// One injected fault and what followed it.
struct Struck {
    fault: Fault,
    node: Option<String>,
    /// Since the load began.
    at: Duration,
    /// How long the injection took (the restarted process back, the link up, the fill over).
    lasted: Duration,
    /// From the fault's end until everything was healthy again (`None`: not within the
    /// limit).
    healthy_after: Option<Duration>,
    /// What the injection itself said (a figure, or why it could not be done).
    note: String,
}

fn main() -> ExitCode {
    // Read before the cluster comes up: a bad setting costs no cluster.
    let timing = match Timing::from_env() {
        Ok(t) => t,
        Err(e) => {
            eprintln!("cluster_soak: {e}");
            return ExitCode::FAILURE;
        }
    };
    let Some((_turn, c)) = RealCluster::managed(
        "cluster_soak",
        "SKIP cluster_soak: it injects faults into scripts/cluster.sh's own cluster",
    ) else {
        return ExitCode::SUCCESS;
    };
    match run(c, &timing) {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::FAILURE,
        Err(e) => {
            eprintln!("cluster_soak: {e}");
            ExitCode::FAILURE
        }
    }
}

/// `name`'s number of seconds, or `default` when it is not set.
fn env_seconds(name: &str, default: u64) -> Result<u64, String> {
    match std::env::var(name) {
        Ok(v) => v
            .parse()
            .map_err(|_| format!("{name}={v:?} is not a number of seconds")),
        Err(_) => Ok(default),
    }
}

/// How long the soak runs, and each fault's slot.
struct Timing {
    duration: Duration,
    slot: Duration,
}

impl Timing {
    /// `NODELB_SOAK_SECONDS` (600) and `NODELB_SOAK_SLOT_SECONDS` (60, at least 40).
    fn from_env() -> Result<Timing, String> {
        let seconds = env_seconds("NODELB_SOAK_SECONDS", 600)?;
        let slot_seconds = env_seconds("NODELB_SOAK_SLOT_SECONDS", SLOT_SECONDS)?;
        if slot_seconds < MIN_SLOT_SECONDS {
            return Err(format!(
                "NODELB_SOAK_SLOT_SECONDS={slot_seconds}: a slot needs {MIN_SLOT_SECONDS} s at \
                 least (the conntrack fill alone lasts 30 s)"
            ));
        }
        Ok(Timing {
            duration: Duration::from_secs(seconds),
            slot: Duration::from_secs(slot_seconds),
        })
    }
}

fn run(c: &'static RealCluster, timing: &Timing) -> Result<bool, String> {
    let Timing { duration, slot } = *timing;
    println!(
        "nodelb fault soak on the real cluster: NODELB_SOAK_SECONDS={}, a fault every {} s",
        duration.as_secs(),
        slot.as_secs()
    );
    let began_setup = Instant::now();
    c.install("")?;
    let ns = c.namespace(NAMESPACE);
    c.apply(&backend_deployment(
        ns.name(),
        "web",
        c.backend_image(),
        BACKENDS,
        5,
    ))?;
    c.rollout_of(ns.name(), "deploy/web", Duration::from_secs(180))?;
    c.apply(&backend_service(ns.name(), SERVICE, "web", FIRST_PORT, ""))?;
    healthy_within(c, &[], Duration::from_secs(120))
        .ok_or("the Service was not served through both nodes within 120 s of its creation")?;
    println!("set up in {:.1?}", began_setup.elapsed());

    let targets: Vec<(Transport, SocketAddr)> = c
        .nodes()
        .iter()
        .flat_map(|(_, a)| {
            [
                (Transport::Tcp, SocketAddr::new(*a, FIRST_PORT)),
                (Transport::Udp, SocketAddr::new(*a, FIRST_PORT + 2)),
            ]
        })
        .collect();
    let load = Load::start(c.client().name(), targets);
    let load_began = load.began;
    let mut samples = Samples::default();
    samples.take(c, load_began);
    let nodes: Vec<String> = c.nodes().iter().map(|(n, _)| n.clone()).collect();
    let mut struck: Vec<Struck> = Vec::new();
    let mut round = 0usize;
    'soak: loop {
        for fault in FAULTS {
            if load_began.elapsed() + slot > duration {
                break 'soak;
            }
            let node = fault.on_a_node().then(|| {
                // The first round kills each node's agent once in turn; after it only the last
                // node's is killed, so the first node's agent lives through a long run and its
                // RSS and descriptor growth per hour is one process's, not a guess from 18
                // minutes (the other faults leave the agent's process running).
                let i = if fault == Fault::AgentKill && round >= 1 {
                    nodes.len() - 1
                } else {
                    round % nodes.len()
                };
                nodes[i].clone()
            });
            let at = load_began.elapsed();
            let t0 = Instant::now();
            let before: Vec<i32> = node.iter().flat_map(|n| agent_pids(n)).collect();
            let note = inject(c, fault, node.as_deref()).unwrap_or_else(|e| format!("ERROR {e}"));
            // A killed agent has not recovered until another process serves its node.
            let gone = if fault == Fault::AgentKill {
                before
            } else {
                Vec::new()
            };
            // Recovery counts from the fault's end (the link back up, the conntrack fill's 30 s
            // over): failures count from its start.
            let ended = Instant::now();
            let lasted = t0.elapsed();
            let healthy_after = healthy_within(c, &gone, RECOVERY_LIMIT).map(|_| ended.elapsed());
            println!(
                "[{:>7.1?}] {:<26} {:<7} lasted {lasted:.1?}, healthy after {}{}",
                at,
                fault.name(),
                node.as_deref().unwrap_or("-"),
                healthy_after.map_or("NEVER (180 s)".to_string(), |d| format!("{d:.1?}")),
                if note.is_empty() {
                    String::new()
                } else {
                    format!("  ({note})")
                }
            );
            struck.push(Struck {
                fault,
                node,
                at,
                lasted,
                healthy_after,
                note,
            });
            while t0.elapsed() < slot {
                samples.take(c, load_began);
                std::thread::sleep(Duration::from_secs(1));
            }
        }
        round += 1;
    }
    samples.take(c, load_began);
    let report = load.stop();
    drop(ns);

    // Each failure belongs to the fault injected last before the exchange began.
    let mut failed: Vec<Vec<(Duration, Transport)>> = vec![Vec::new(); struck.len()];
    let mut before_any = 0;
    for (t, transport, _, _) in &report.failed {
        match struck.iter().rposition(|s| s.at <= *t) {
            Some(i) => failed[i].push((*t, *transport)),
            None => before_any += 1,
        }
    }
    println!();
    println!(
        "{} exchanges in {:.0?} ({} answered, {} failed: over {SLOW:?} or not answered)",
        report.answered + report.failed.len(),
        report.ran,
        report.answered,
        report.failed.len(),
    );
    let mut kinds: BTreeMap<String, usize> = BTreeMap::new();
    for (_, transport, dst, o) in &report.failed {
        let kind = match o {
            Outcome::Slow(..) => "slow".to_string(),
            other => format!("{other:?}").chars().take(40).collect(),
        };
        *kinds
            .entry(format!("{transport:?} {dst}: {kind}"))
            .or_default() += 1;
    }
    for (k, n) in &kinds {
        println!("  {n:>5} {k}");
    }
    println!("failed before the first fault: {before_any}");
    println!();
    println!(
        "  {:<26} {:<7} {:>9} {:>7} {:>5} {:>5} {:>14} {:>14}  note",
        "fault", "node", "at", "lasted", "TCP", "UDP", "healthy after", "last failure"
    );
    println!(
        "  (healthy after: from the fault's end; last failure: from its start, the last exchange \
         that failed before the next fault)"
    );
    let mut all_recovered = true;
    for (s, f) in struck.iter().zip(&failed) {
        let tcp = f.iter().filter(|(_, t)| *t == Transport::Tcp).count();
        let udp = f.len() - tcp;
        let last = f.last().map(|(t, _)| *t - s.at);
        all_recovered &= s.healthy_after.is_some();
        println!(
            "  {:<26} {:<7} {:>9.1?} {:>7} {:>5} {:>5} {:>14} {:>14}  {}",
            s.fault.name(),
            s.node.as_deref().unwrap_or("-"),
            s.at,
            format!("{:.1} s", s.lasted.as_secs_f64()),
            tcp,
            udp,
            s.healthy_after
                .map_or("NEVER".into(), |d| format!("{:.1} s", d.as_secs_f64())),
            last.map_or("-".into(), |d| format!("{:.1} s", d.as_secs_f64())),
            s.note,
        );
    }
    println!();
    println!(
        "by fault: times struck, connections failed, worst time from its start to full recovery"
    );
    let mut by: BTreeMap<Fault, (usize, usize, Duration)> = BTreeMap::new();
    for (s, f) in struck.iter().zip(&failed) {
        let e = by.entry(s.fault).or_default();
        e.0 += 1;
        e.1 += f.len();
        let last = f.last().map_or(Duration::ZERO, |(t, _)| *t - s.at);
        // From the fault's start: its own time and then the recovery, or its last failure.
        let full = (s.lasted + s.healthy_after.unwrap_or(RECOVERY_LIMIT)).max(last);
        e.2 = e.2.max(full);
    }
    for (fault, (n, lost, worst)) in &by {
        println!(
            "  {:<26} {n:>3} {lost:>6} {:>8.1} s",
            fault.name(),
            worst.as_secs_f64()
        );
        println!(
            "bench soak_fault name={:?} struck={n} failed={lost} worst_recovery_s={:.1}",
            fault.name(),
            worst.as_secs_f64()
        );
    }
    println!();
    samples.print();
    if !all_recovered {
        println!("FAIL: a fault was not recovered from within {RECOVERY_LIMIT:?}");
    }
    Ok(all_recovered)
}

/// Injects `fault`; returns a note (a figure it reached), or why it could not.
fn inject(c: &RealCluster, fault: Fault, node: Option<&str>) -> Result<String, String> {
    let node = || node.ok_or("a node fault without a node".to_string());
    match fault {
        Fault::AgentKill => {
            let pids = agent_pids(node()?);
            if pids.is_empty() {
                return Err("no agent process on the node".into());
            }
            for pid in &pids {
                nix::sys::signal::kill(
                    nix::unistd::Pid::from_raw(*pid),
                    nix::sys::signal::Signal::SIGKILL,
                )
                .map_err(|e| format!("SIGKILL {pid}: {e}"))?;
            }
            Ok(format!("pid {pids:?}"))
        }
        Fault::KubeletRestart => {
            c.cluster_sh(&["kubelet", "stop", node()?])?;
            c.cluster_sh(&["kubelet", "start", node()?])?;
            Ok(String::new())
        }
        Fault::ContainerdRestart => {
            c.cluster_sh(&["restart", "containerd", node()?])?;
            Ok(String::new())
        }
        Fault::ApiserverRestart => {
            c.cluster_sh(&["restart", "kube-apiserver"])?;
            Ok(String::new())
        }
        Fault::EtcdRestart => {
            c.cluster_sh(&["restart", "etcd"])?;
            Ok(String::new())
        }
        Fault::LinkDownUp => {
            c.cluster_sh(&["link", node()?, "down"])?;
            std::thread::sleep(Duration::from_secs(5));
            c.cluster_sh(&["link", node()?, "up"])?;
            Ok(String::new())
        }
        Fault::ForeignFlush => {
            c.nft(node()?, &["flush", "ruleset"])?;
            Ok(String::new())
        }
        Fault::ConntrackFull => fill_conntrack(c, node()?),
        Fault::BackendRoll => {
            c.kubectl(&["-n", NAMESPACE, "rollout", "restart", "deploy/web"])?;
            c.rollout_of(NAMESPACE, "deploy/web", Duration::from_secs(180))?;
            Ok(String::new())
        }
    }
}

/// Node `node`'s conntrack count and limit (`nf_conntrack_count`, `nf_conntrack_max`).
fn conntrack_fill(c: &RealCluster, node: &str) -> Result<(u64, u64), String> {
    let netns = c.in_cluster(node).ok_or("not scripts/cluster.sh's node")?;
    let read = |f: &str| -> Result<u64, String> {
        let out = std::process::Command::new("ip")
            .args(["netns", "exec", &netns, "cat"])
            .arg(format!("/proc/sys/net/netfilter/{f}"))
            .output()
            .map_err(|e| format!("reading {f}: {e}"))?;
        String::from_utf8_lossy(&out.stdout)
            .trim()
            .parse()
            .map_err(|_| format!("{f} of {node} is not a number"))
    };
    Ok((read("nf_conntrack_count")?, read("nf_conntrack_max")?))
}

/// Fills node `node`'s conntrack table to 95% of its limit with UDP flows from the client to
/// ports nothing serves (9 and up; each source port a flow), then waits 30 s, as long as the
/// kernel keeps an unanswered UDP flow: they expire by themselves, nothing is flushed.
fn fill_conntrack(c: &RealCluster, node: &str) -> Result<String, String> {
    let addr = c.node_address(node);
    let (count, max) = conntrack_fill(c, node)?;
    let want = (max * 95 / 100).saturating_sub(count);
    let sent = c.client().run(move || {
        let mut sent = 0u64;
        'ports: for dport in 9u16..64 {
            for sport in 1024u16..=65535 {
                if sent >= want {
                    break 'ports;
                }
                let Ok(s) = std::net::UdpSocket::bind(("0.0.0.0", sport)) else {
                    continue;
                };
                if s.send_to(b"x", SocketAddr::new(addr, dport)).is_ok() {
                    sent += 1;
                }
            }
        }
        sent
    });
    let (reached, _) = conntrack_fill(c, node)?;
    std::thread::sleep(Duration::from_secs(30));
    Ok(format!(
        "{sent} flows sent, {reached} of {max} entries at the peak"
    ))
}

/// Waits until the Service is served again end to end (module doc), by agent processes other
/// than `gone`; `None` after `limit`.
fn healthy_within(c: &RealCluster, gone: &[i32], limit: Duration) -> Option<()> {
    let began = Instant::now();
    while began.elapsed() < limit {
        if healthy(c, gone).is_ok() {
            return Some(());
        }
        std::thread::sleep(Duration::from_millis(500));
    }
    if let Err(e) = healthy(c, gone) {
        println!("  not healthy after {limit:?}: {e}");
    }
    None
}

fn healthy(c: &RealCluster, gone: &[i32]) -> Result<(), String> {
    for (node, _) in c.nodes() {
        let pids = agent_pids(node);
        if pids.len() != 1 || gone.contains(&pids[0]) {
            return Err(format!(
                "{node}'s agent processes: {pids:?} (gone: {gone:?})"
            ));
        }
    }
    let ready = c.kubectl(&[
        "-n",
        NODELB_NAMESPACE,
        "get",
        "pods",
        "-l",
        "app.kubernetes.io/name=nodelb,app.kubernetes.io/component=agent",
        "-o",
        "jsonpath={range .items[*]}{.spec.nodeName}={.status.conditions[?(@.type==\"Ready\")].status} {end}",
    ])?;
    for (node, _) in c.nodes() {
        if !ready
            .split_whitespace()
            .any(|p| p == format!("{node}=True"))
        {
            return Err(format!("the agent of {node} is not Ready: {ready}"));
        }
    }
    let published = ingress_ips(&c.service(NAMESPACE, SERVICE)?);
    for (node, addr) in c.nodes() {
        if !published.contains(&addr.to_string()) {
            return Err(format!("{node} is not published: {published:?}"));
        }
        let map = c.nft(node, &["list", "map", "ip", "nodelb", "services"])?;
        if !map.contains(&format!("{addr} . tcp . {FIRST_PORT}")) {
            return Err(format!("{node}'s services map lacks the Service"));
        }
    }
    let available = c.kubectl(&[
        "-n",
        NAMESPACE,
        "get",
        "deploy/web",
        "-o",
        "jsonpath={.status.availableReplicas}/{.status.updatedReplicas}/{.status.replicas}",
    ])?;
    if available != format!("{BACKENDS}/{BACKENDS}/{BACKENDS}") {
        return Err(format!("backends available/updated/all: {available}"));
    }
    for (_, addr) in c.nodes() {
        let tcp = c.tcp_request(SocketAddr::new(*addr, FIRST_PORT));
        let udp = bounded(|| {
            traffic::udp_request(
                c.client(),
                SocketAddr::new(*addr, FIRST_PORT + 2),
                Duration::from_secs(3),
            )
        });
        for (what, o) in [("TCP", tcp), ("UDP", udp)] {
            if !matches!(o, Outcome::Answered(_)) {
                return Err(format!("{what} through {addr}: {o:?}"));
            }
        }
    }
    Ok(())
}

/// Samples of one agent process: (since the load began, RSS KiB, descriptors).
type ProcessSamples = Vec<(Duration, u64, usize)>;

/// The agents' RSS (KiB) and open descriptors, per process, over time.
#[derive(Default)]
struct Samples {
    last: Option<Instant>,
    /// (node, pid) -> [(since the load began, RSS KiB, descriptors)]
    by_process: BTreeMap<(String, i32), ProcessSamples>,
}

impl Samples {
    fn take(&mut self, c: &RealCluster, began: Instant) {
        if self.last.is_some_and(|t| t.elapsed() < SAMPLE_EVERY) {
            return;
        }
        self.last = Some(Instant::now());
        for (node, _) in c.nodes() {
            for pid in agent_pids(node) {
                let rss = nodelb_integration::bench::memory(pid as u32).map(|m| m.rss);
                let fds = std::fs::read_dir(format!("/proc/{pid}/fd")).map(|d| d.count());
                if let (Ok(rss), Ok(fds)) = (rss, fds) {
                    self.by_process
                        .entry((node.clone(), pid))
                        .or_default()
                        .push((began.elapsed(), rss, fds));
                }
            }
        }
    }

    fn print(&self) {
        println!("agents' RSS and descriptors (the longest-lived process of each node)");
        let mut longest: BTreeMap<&str, (i32, &ProcessSamples)> = BTreeMap::new();
        for ((node, pid), v) in &self.by_process {
            let span = |v: &ProcessSamples| v.last().unwrap().0 - v[0].0;
            let keep = longest
                .get(node.as_str())
                .is_none_or(|(_, old)| span(v) > span(old));
            if keep {
                longest.insert(node, (*pid, v));
            }
        }
        for (node, (pid, v)) in longest {
            let (first, last) = (v[0], v[v.len() - 1]);
            let hours = (last.0 - first.0).as_secs_f64() / 3600.0;
            let per_hour = |a: f64, b: f64| {
                if hours > 0.0 {
                    format!("{:+.1}", (b - a) / hours)
                } else {
                    "-".into()
                }
            };
            println!(
                "  {node} pid {pid}: {:.1} min sampled; RSS {} -> {} KiB ({} KiB/h), descriptors {} -> {} ({}/h)",
                hours * 60.0,
                first.1,
                last.1,
                per_hour(first.1 as f64, last.1 as f64),
                first.2,
                last.2,
                per_hour(first.2 as f64, last.2 as f64),
            );
            println!(
                "bench soak_agent node={node} minutes={:.1} rss_kib_per_hour={} fds_per_hour={}",
                hours * 60.0,
                per_hour(first.1 as f64, last.1 as f64),
                per_hour(first.2 as f64, last.2 as f64)
            );
        }
    }
}

/// A failed exchange: (since the load began when it began, transport, target, outcome).
type Failed = (Duration, Transport, SocketAddr, Outcome);

/// Client load on a schedule: every [`INTERVAL`] a new exchange with the next target, each in
/// a thread of its own (in the client's namespace), so a stalled one never delays the next: a
/// node that is down for 5 s costs the 5 s of exchanges sent to it. Each is bounded by
/// [`SLOW`] ([`bounded`]).
struct Load {
    began: Instant,
    stop: Arc<AtomicBool>,
    dispatcher: Option<std::thread::JoinHandle<()>>,
    answered: Arc<AtomicUsize>,
    /// (since `began` when the exchange began, transport, target, outcome)
    failed: Arc<Mutex<Vec<Failed>>>,
}

/// What a [`Load`] saw.
struct LoadSeen {
    answered: usize,
    failed: Vec<Failed>,
    ran: Duration,
}

impl Load {
    fn start(netns: &str, targets: Vec<(Transport, SocketAddr)>) -> Load {
        let began = Instant::now();
        let stop = Arc::new(AtomicBool::new(false));
        let answered = Arc::new(AtomicUsize::new(0));
        let failed = Arc::new(Mutex::new(Vec::new()));
        let (flag, ok, bad, name) = (
            stop.clone(),
            answered.clone(),
            failed.clone(),
            netns.to_string(),
        );
        let dispatcher = std::thread::spawn(move || {
            let mut workers = Vec::new();
            let mut next = Instant::now();
            let mut i = 0;
            while !flag.load(Ordering::Relaxed) {
                let (transport, dst) = targets[i % targets.len()];
                i += 1;
                let (ok, bad, name) = (ok.clone(), bad.clone(), name.clone());
                workers.push(std::thread::spawn(move || {
                    let at = began.elapsed();
                    let ns = Netns::existing(&name).expect("the client namespace");
                    ns.enter_current_thread();
                    let deadline = Duration::from_secs(2);
                    let o = bounded(|| match transport {
                        Transport::Tcp => traffic::tcp_exchange_here(dst, deadline),
                        Transport::Udp => traffic::udp_exchange_here(dst, deadline),
                    });
                    match o {
                        Outcome::Answered(_) => {
                            ok.fetch_add(1, Ordering::Relaxed);
                        }
                        other => bad.lock().unwrap().push((at, transport, dst, other)),
                    }
                }));
                workers.retain(|w| !w.is_finished());
                next += INTERVAL;
                std::thread::sleep(next.saturating_duration_since(Instant::now()));
            }
            for w in workers {
                let _ = w.join();
            }
        });
        Load {
            began,
            stop,
            dispatcher: Some(dispatcher),
            answered,
            failed,
        }
    }

    fn stop(mut self) -> LoadSeen {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(d) = self.dispatcher.take() {
            let _ = d.join();
        }
        let mut failed = std::mem::take(&mut *self.failed.lock().unwrap());
        failed.sort_by_key(|f| f.0);
        LoadSeen {
            answered: self.answered.load(Ordering::Relaxed),
            failed,
            ran: self.began.elapsed(),
        }
    }
}
