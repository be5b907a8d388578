//! nodelb side by side with its alternatives on one cluster (issue 40): `scripts/cluster.sh`'s
//! two nodes with nodelb installed from its image and MetalLB (L2, `scripts/cluster.sh peers
//! up`) beside it, the same backend pods behind every path, and the client namespace reaching
//! them through node-a over the same hops each time (client → LAN → node-a → pod).
//!
//! The paths:
//! - **direct**: the pods' own addresses, no NAT: the floor;
//! - **nodelb**: node-a's address and the Service's port (nodelb's DNAT);
//! - **kube-proxy nftables** and **kube-proxy iptables**: node-a's address and the same
//!   Service's NodePort (kube-proxy's DNAT, in each of its modes);
//! - **MetalLB**: the VIP MetalLB's L2 speaker announces for a Service of its class with the
//!   same selector (kube-proxy's DNAT of the LoadBalancer IP, nftables mode).
//!
//! Every Service has `externalTrafficPolicy: Local` and the pods are all on node-a: no path
//! masquerades, and MetalLB announces from node-a, so no path takes a hop the others do not.
//!
//! The data path, in `NODELB_PEERS_ROUNDS` interleaved rounds (the paths' order turns each
//! round; kube-proxy's mode switches to iptables for its row and back): TCP throughput (iperf3
//! from Debian, one stream, to an iperf3 server in a pod's network namespace), the rate of
//! connect-read-close exchanges with its p50 and p99 (this file's client: 4 threads, each a new
//! connection reading the backend's one-line answer; 3 backends, so the server is not the
//! limit) and the UDP request-reply rate (4 threads, a flow each) with its p50 and p99.
//!
//! The control plane, in the same rounds: a new Service to its first answer (nodelb and
//! kube-proxy's NodePort from one Service's creation, MetalLB from its own Service's), an
//! endpoint change (the Services' selector moved to a second Deployment) to the first answer
//! from the new pods, and the connections that failed during a rolling update of the backends
//! under steady load through nodelb, the NodePort and the VIP at once.
//!
//! With `NODELB_PEERS_COST_SECONDS` (0: off), the cost per node, each phase that long: CPU
//! seconds per hour and RSS of each node's nodelb agent (the status leader's apart: it is one
//! per cluster) and MetalLB speaker, of MetalLB's controller (one per cluster) and of node-a's
//! kube-proxy, idle and under 20 EndpointSlice changes a second to a Service of nodelb's and 20
//! to one of MetalLB's at once, and their API requests per minute (kube-apiserver's audit log,
//! which logs nodelb's, MetalLB's and kube-proxy's every request).
//!
//! With `NODELB_PEERS_FAILURE=1`, then a node failure: two backends, one on each node, behind
//! a Service of nodelb's and one of MetalLB's (`externalTrafficPolicy: Local`, so each node
//! sends only to its own backend and the endpoint controller's late view of the cut node's
//! pods is out of the measure); the node that holds MetalLB's VIP has its network cut
//! (`scripts/cluster.sh link N down`) while two clients begin a connection every 50 ms: one
//! to the VIP, one that tries nodelb's published addresses in order, the cut node first while
//! the status publishes it, 500 ms each. For each: the first new connection through, the time
//! from which every connection succeeds, from which nodelb's client needs no second address,
//! and when nodelb's status dropped the cut node.
//!
//! `NODELB_PEERS_SERVICES` (10) LoadBalancer Services of nodelb's exist while it measures (the
//! measured ones and fillers with one port each and no NodePort), so every proxy carries that
//! many. Prints each row's medians with their spread, its ratios to the floor and to kube-proxy
//! nftables, and PASS/MISS against issue 40's goals; it asserts no timing. Run it with
//! `scripts/peers.sh` (as root).

use std::net::{IpAddr, SocketAddr, TcpStream, UdpSocket};
use std::process::{Child, Command, ExitCode, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use nodelb_integration::bench::cpu_seconds;
use nodelb_integration::e2e::ingress_ips;
use nodelb_integration::netns::{self, Netns};
use nodelb_integration::real_cluster::{
    backend_deployment_on, backend_service, json, keyed_lines, pids_of, pod_of, RealCluster,
    TcpLoad, BACKEND_TCP_PORT, BACKEND_UDP_PORT,
};
use nodelb_integration::traffic::{self, Outcome};

const NAMESPACE: &str = "peers";
/// The measured Services' first port (http; udp is FIRST_PORT + 2).
const FIRST_PORT: u16 = 18_100;
/// The iperf3 Services' port, and the server's in its pod.
const IPERF_PORT: u16 = 18_110;
const IPERF_SERVER_PORT: u16 = 5_201;
/// A created Service's port (control plane).
const CREATED_PORT: u16 = 18_120;
/// The fillers' first port.
const FILLER_PORT: u16 = 20_000;
const NODE: &str = "node-a";
const BACKENDS: u32 = 3;
const THREADS: usize = 4;

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Path {
    Direct,
    Nodelb,
    KubeProxyNft,
    KubeProxyIpt,
    Metallb,
}

const PATHS: [Path; 5] = [
    Path::Direct,
    Path::Nodelb,
    Path::KubeProxyNft,
    Path::KubeProxyIpt,
    Path::Metallb,
];

impl Path {
    fn label(self) -> &'static str {
        match self {
            Path::Direct => "direct to the pods (no NAT: the floor)",
            Path::Nodelb => "nodelb (node address, LoadBalancer port)",
            Path::KubeProxyNft => "kube-proxy nftables (node address, NodePort)",
            Path::KubeProxyIpt => "kube-proxy iptables (node address, NodePort)",
            Path::Metallb => "MetalLB L2 VIP (kube-proxy nftables DNAT)",
        }
    }
    fn mode(self) -> &'static str {
        if self == Path::KubeProxyIpt {
            "iptables"
        } else {
            "nftables"
        }
    }
}

/// Where each path sends its TCP exchanges, its UDP flows and its iperf3 stream.
struct Targets {
    tcp: Vec<SocketAddr>,
    udp: Vec<SocketAddr>,
    iperf: SocketAddr,
}

/// A rate and its latency quantiles.
#[derive(Clone, Copy, Debug, Default)]
struct Rate {
    per_second: f64,
    p50_us: f64,
    p99_us: f64,
    failed: usize,
}

#[derive(Default)]
struct Row {
    gbits: Vec<f64>,
    tcp: Vec<Rate>,
    udp: Vec<Rate>,
}

fn main() -> ExitCode {
    let Some((_turn, c)) = RealCluster::managed(
        "peers",
        "SKIP peers: it installs MetalLB on scripts/cluster.sh's own cluster and reads its nodes",
    ) else {
        return ExitCode::SUCCESS;
    };
    netns::bench_main("peers", || run(c))
}

fn env_number(name: &str, default: u64) -> Result<u64, String> {
    match std::env::var(name) {
        Ok(v) => v
            .parse()
            .map_err(|_| format!("{name}={v:?} is not a whole number")),
        Err(_) => Ok(default),
    }
}

fn run(c: &'static RealCluster) -> Result<(), String> {
    let services = env_number("NODELB_PEERS_SERVICES", 10)?.max(2);
    let rounds = env_number("NODELB_PEERS_ROUNDS", 3)?.max(1);
    let seconds = Duration::from_secs(env_number("NODELB_PEERS_SECONDS", 3)?.max(1));
    println!(
        "nodelb against kube-proxy and MetalLB: NODELB_PEERS_SERVICES={services} \
         NODELB_PEERS_ROUNDS={rounds} NODELB_PEERS_SECONDS={}",
        seconds.as_secs()
    );
    let began = Instant::now();
    c.install("")?;
    let peers = keyed_lines(&c.cluster_sh(&["peers", "up"])?);
    let class = peers
        .get("METALLB_CLASS")
        .ok_or("scripts/cluster.sh peers up printed no METALLB_CLASS=")?
        .clone();
    set_mode(c, "nftables")?;
    // An earlier run's namespace, gone first: at 10,000 Services its deletion takes minutes,
    // longer than the harness's own wait.
    c.delete_namespace(NAMESPACE, Duration::from_secs(900))?;
    let ns = c.namespace(NAMESPACE);
    let ns = ns.name();
    for (app, replicas) in [("web", BACKENDS), ("web2", BACKENDS), ("iperf", 1)] {
        c.apply(&backend_deployment_on(
            ns,
            app,
            c.backend_image(),
            replicas,
            3,
            Some(NODE),
        ))?;
    }
    let local = "  externalTrafficPolicy: Local\n";
    let metallb = format!("  loadBalancerClass: {class}\n{local}");
    c.apply(&backend_service(ns, "web", "web", FIRST_PORT, local))?;
    c.apply(&backend_service(
        ns,
        "web-metallb",
        "web",
        FIRST_PORT,
        &metallb,
    ))?;
    c.apply(&iperf_service(ns, "iperf", local))?;
    c.apply(&iperf_service(ns, "iperf-metallb", &metallb))?;
    // The fillers: nodelb's, with one port each and no NodePort (kube-proxy still gives each
    // its ClusterIP), created 32 at a time (one at a time, as `kubectl create` does, 10,000
    // took over 15 minutes on the loaded 2-core machine).
    create_fillers(c, ns, services - 2)?;
    for app in ["web", "web2", "iperf"] {
        c.rollout_of(ns, &format!("deploy/{app}"), Duration::from_secs(180))?;
    }
    let node = c.node_address(NODE);
    let vip = |svc: &str| -> Result<IpAddr, String> {
        let (ip, _) = c.until(
            &format!("MetalLB's address for {svc}"),
            Duration::from_secs(120),
            || {
                ingress(c, ns, svc)
                    .first()
                    .copied()
                    .ok_or_else(|| format!("{svc} has no address yet"))
            },
        );
        Ok(ip)
    };
    let web_vip = vip("web-metallb")?;
    let iperf_vip = vip("iperf-metallb")?;
    let node_port = |svc: &str, port: &str| -> Result<u16, String> {
        let s = c.service(ns, svc)?;
        s.spec
            .and_then(|s| s.ports)
            .and_then(|p| p.into_iter().find(|p| p.name.as_deref() == Some(port)))
            .and_then(|p| p.node_port)
            .map(|p| p as u16)
            .ok_or_else(|| format!("{svc} has no NodePort for {port}"))
    };
    let web_pods = pod_ips(c, ns, "web")?;
    let iperf_pod = pods(c, ns, "iperf")?
        .into_iter()
        .next()
        .ok_or("no iperf pod")?;
    let kube_proxy = Targets {
        tcp: vec![SocketAddr::new(node, node_port("web", "http")?)],
        udp: vec![SocketAddr::new(node, node_port("web", "udp")?)],
        iperf: SocketAddr::new(node, node_port("iperf", "iperf")?),
    };
    let targets = |p: Path| -> Targets {
        match p {
            Path::Direct => Targets {
                tcp: web_pods
                    .iter()
                    .map(|ip| SocketAddr::new(*ip, BACKEND_TCP_PORT))
                    .collect(),
                udp: web_pods
                    .iter()
                    .map(|ip| SocketAddr::new(*ip, BACKEND_UDP_PORT))
                    .collect(),
                iperf: SocketAddr::new(iperf_pod.1, IPERF_SERVER_PORT),
            },
            Path::Nodelb => Targets {
                tcp: vec![SocketAddr::new(node, FIRST_PORT)],
                udp: vec![SocketAddr::new(node, FIRST_PORT + 2)],
                iperf: SocketAddr::new(node, IPERF_PORT),
            },
            Path::KubeProxyNft | Path::KubeProxyIpt => Targets {
                tcp: kube_proxy.tcp.clone(),
                udp: kube_proxy.udp.clone(),
                iperf: kube_proxy.iperf,
            },
            Path::Metallb => Targets {
                tcp: vec![SocketAddr::new(web_vip, FIRST_PORT)],
                udp: vec![SocketAddr::new(web_vip, FIRST_PORT + 2)],
                iperf: SocketAddr::new(iperf_vip, IPERF_PORT),
            },
        }
    };
    let _iperf = IperfServer::start(&iperf_pod.0)?;
    for p in PATHS {
        if p.mode() != "nftables" {
            continue;
        }
        let t = targets(p);
        answered_within(c, t.tcp[0], Duration::from_secs(60))
            .map_err(|e| format!("{}: {e}", p.label()))?;
    }
    println!(
        "set up in {:.1?}: {services} Services of nodelb's, MetalLB's VIPs {web_vip} and \
         {iperf_vip}, backends {web_pods:?} on {NODE}",
        began.elapsed()
    );

    let mut rows: std::collections::BTreeMap<Path, Row> = Default::default();
    let mut created: std::collections::BTreeMap<&str, Vec<f64>> = Default::default();
    let mut moved: std::collections::BTreeMap<&str, Vec<f64>> = Default::default();
    let mut mode = "nftables";
    for round in 0..rounds as usize {
        // The paths in a turned order each round; the iptables row last or first, so the
        // mode switches once a round.
        let mut order: Vec<Path> = PATHS.to_vec();
        order.rotate_left(round % PATHS.len());
        order.sort_by_key(|p| (p.mode() == mode) as u8 ^ 1);
        for p in order {
            if p.mode() != mode {
                set_mode(c, p.mode())?;
                mode = p.mode();
            }
            let t = targets(p);
            answered_within(c, t.tcp[0], Duration::from_secs(60))
                .map_err(|e| format!("{} in round {round}: {e}", p.label()))?;
            let row = rows.entry(p).or_default();
            let (gbits, tcp, udp) = (
                iperf(c.client(), t.iperf, seconds)?,
                tcp_rate(c.client(), &t.tcp, seconds),
                udp_rate(c.client(), &t.udp, seconds),
            );
            println!(
                "round {round}: {}: {gbits:.1} Gbit/s; TCP {:.0}/s p50 {:.0} µs p99 {:.0} µs, {} failed; \
                 UDP {:.0}/s p50 {:.0} µs p99 {:.0} µs, {} failed",
                p.label(),
                tcp.per_second,
                tcp.p50_us,
                tcp.p99_us,
                tcp.failed,
                udp.per_second,
                udp.p50_us,
                udp.p99_us,
                udp.failed
            );
            row.gbits.push(gbits);
            row.tcp.push(tcp);
            row.udp.push(udp);
        }
        if mode != "nftables" {
            set_mode(c, "nftables")?;
            mode = "nftables";
        }
        // The control plane.
        let (nodelb, kube_proxy) = created_to_answer(c, ns, None, node)?;
        created.entry("nodelb").or_default().push(nodelb);
        created.entry("kube-proxy").or_default().push(kube_proxy);
        let (metallb, _) = created_to_answer(c, ns, Some(&class), node)?;
        created.entry("MetalLB").or_default().push(metallb);
        let np = kube_proxy_target(&targets(Path::KubeProxyNft));
        for to in ["web2", "web"] {
            let times = endpoints_moved(
                c,
                ns,
                to,
                &[
                    ("nodelb", SocketAddr::new(node, FIRST_PORT)),
                    ("kube-proxy", np),
                    ("MetalLB", SocketAddr::new(web_vip, FIRST_PORT)),
                ],
            )?;
            for (k, v) in times {
                moved.entry(k).or_default().push(v);
            }
        }
    }
    let rolled = rolling_update(
        c,
        ns,
        &[
            ("nodelb", SocketAddr::new(node, FIRST_PORT)),
            (
                "kube-proxy",
                kube_proxy_target(&targets(Path::KubeProxyNft)),
            ),
            ("MetalLB", SocketAddr::new(web_vip, FIRST_PORT)),
        ],
    )?;
    report(services, rounds, &rows, &created, &moved, &rolled);
    // The cost before the node failure, whose aftermath (a VIP that moved, an agent that
    // reconnected) it would otherwise measure.
    let cost_seconds = env_number("NODELB_PEERS_COST_SECONDS", 0)?;
    if cost_seconds > 0 {
        cost(c, ns, &class, Duration::from_secs(cost_seconds))?;
    }
    if env_number("NODELB_PEERS_FAILURE", 0)? > 0 {
        node_failure(c, ns, &class)?;
    }
    println!("peers: {:.0?} in all", began.elapsed());
    Ok(())
}

fn create_fillers(c: &RealCluster, ns: &str, count: u64) -> Result<(), String> {
    use futures::{StreamExt, TryStreamExt};
    use k8s_openapi::api::core::v1::Service;
    use kube::api::{Api, PostParams};
    let began = Instant::now();
    let services: Api<Service> = Api::namespaced(c.admin().clone(), ns);
    let filler = |i: u64| -> Result<Service, String> {
        serde_json::from_value(serde_json::json!({
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": {"name": format!("filler-{i}"), "namespace": ns},
            "spec": {
                "type": "LoadBalancer",
                "allocateLoadBalancerNodePorts": false,
                "selector": {"app": "web"},
                "ports": [{"port": FILLER_PORT as u64 + i, "targetPort": BACKEND_TCP_PORT}],
            },
        }))
        .map_err(|e| format!("filler-{i}: {e}"))
    };
    c.block_on(
        futures::stream::iter(0..count)
            .map(|i| {
                let services = &services;
                async move {
                    let svc = filler(i)?;
                    services
                        .create(&PostParams::default(), &svc)
                        .await
                        .map(|_| ())
                        .map_err(|e| format!("creating filler-{i}: {e}"))
                }
            })
            .buffer_unordered(32)
            .try_collect::<Vec<()>>(),
    )?;
    if count > 0 {
        println!("{count} fillers created in {:.1?}", began.elapsed());
    }
    Ok(())
}

fn kube_proxy_target(t: &Targets) -> SocketAddr {
    t.tcp[0]
}

/// The addresses Service `ns/svc` publishes (none while it cannot be read).
fn ingress(c: &RealCluster, ns: &str, svc: &str) -> Vec<IpAddr> {
    c.service(ns, svc)
        .map(|s| ingress_ips(&s))
        .unwrap_or_default()
        .iter()
        .filter_map(|ip| ip.parse().ok())
        .collect()
}

fn iperf_service(ns: &str, name: &str, spec_extra: &str) -> String {
    format!(
        "apiVersion: v1\nkind: Service\nmetadata: {{name: {name}, namespace: {ns}}}\nspec:\n  \
         type: LoadBalancer\n  selector: {{app: iperf}}\n  ports:\n    - {{name: iperf, port: \
         {IPERF_PORT}, targetPort: {IPERF_SERVER_PORT}, protocol: TCP}}\n{spec_extra}"
    )
}

/// kube-proxy's mode on every node, and, in iptables mode, no nftables table of kube-proxy's
/// left in node-a's kernel (a stale one would answer the NodePort instead).
fn set_mode(c: &RealCluster, mode: &str) -> Result<(), String> {
    c.cluster_sh(&["kube-proxy-mode", mode])?;
    if mode == "iptables" {
        c.until(
            "kube-proxy's nftables table gone from node-a",
            Duration::from_secs(60),
            || match c.nft(NODE, &["list", "table", "ip", "kube-proxy"]) {
                Ok(_) => Err("kube-proxy's nftables table is still there".into()),
                Err(_) => Ok(()),
            },
        );
    }
    Ok(())
}

fn answered_within(c: &RealCluster, dst: SocketAddr, limit: Duration) -> Result<(), String> {
    let began = Instant::now();
    loop {
        match traffic::tcp_request(c.client(), dst, Duration::from_millis(500)) {
            Outcome::Answered(_) => return Ok(()),
            other if began.elapsed() > limit => {
                return Err(format!("{dst} not answered within {limit:?}: {other:?}"))
            }
            _ => std::thread::sleep(Duration::from_millis(100)),
        }
    }
}

/// The pods of Deployment `app` (label `app=<app>`): name and address.
fn pods(c: &RealCluster, ns: &str, app: &str) -> Result<Vec<(String, IpAddr)>, String> {
    let v = json(&c.kubectl(&[
        "-n",
        ns,
        "get",
        "pods",
        "-l",
        &format!("app={app}"),
        "-o",
        "json",
    ])?)?;
    let mut out = Vec::new();
    for p in v["items"].as_array().cloned().unwrap_or_default() {
        if p["metadata"]["deletionTimestamp"].is_string() {
            continue;
        }
        let name = p["metadata"]["name"]
            .as_str()
            .unwrap_or_default()
            .to_string();
        if let Some(ip) = p["status"]["podIP"].as_str().and_then(|i| i.parse().ok()) {
            out.push((name, ip));
        }
    }
    Ok(out)
}

fn pod_ips(c: &RealCluster, ns: &str, app: &str) -> Result<Vec<IpAddr>, String> {
    Ok(pods(c, ns, app)?.into_iter().map(|(_, ip)| ip).collect())
}

/// Debian's iperf3 server, run in a pod's network namespace (the pod's backend process's), so
/// it is reached at the pod's address through every path; killed on drop.
struct IperfServer(Child);

impl IperfServer {
    fn start(pod: &str) -> Result<IperfServer, String> {
        let pid = *pids_of("nodelb-test-backend", None, &format!("POD_NAME={pod}"))
            .first()
            .ok_or_else(|| format!("no process of pod {pod} on this machine"))?;
        let child = Command::new("nsenter")
            .arg(format!("--net=/proc/{pid}/ns/net"))
            .args(["iperf3", "--server", "--port"])
            .arg(IPERF_SERVER_PORT.to_string())
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .spawn()
            .map_err(|e| format!("starting iperf3 in pod {pod}: {e} (apt-get install iperf3)"))?;
        std::thread::sleep(Duration::from_millis(300));
        Ok(IperfServer(child))
    }
}

impl Drop for IperfServer {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// One iperf3 stream from the client namespace for `seconds`: Gbit/s received.
fn iperf(client: &Netns, dst: SocketAddr, seconds: Duration) -> Result<f64, String> {
    let out = client
        .command("iperf3")
        .args([
            "--client",
            &dst.ip().to_string(),
            "--port",
            &dst.port().to_string(),
        ])
        .args([
            "--time",
            &seconds.as_secs().to_string(),
            "--json",
            "--connect-timeout",
            "3000",
        ])
        .output()
        .map_err(|e| format!("running iperf3: {e}"))?;
    let v = json(&String::from_utf8_lossy(&out.stdout))?;
    v["end"]["sum_received"]["bits_per_second"]
        .as_f64()
        .map(|b| b / 1e9)
        .ok_or_else(|| format!("iperf3 to {dst}: {}", v["error"]))
}

fn quantile(sorted: &[u64], q: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    sorted[((sorted.len() - 1) as f64 * q).round() as usize] as f64
}

/// Runs `exchange` on [`THREADS`] threads in the client namespace for `seconds` (each call
/// gets its thread's index and its own count so far); the rate of answered exchanges and
/// their latency quantiles.
fn rate(client: &Netns, seconds: Duration, exchange: impl Fn(usize, usize) -> bool + Sync) -> Rate {
    let stop = AtomicBool::new(false);
    let began = Instant::now();
    let per_thread: Vec<(Vec<u64>, usize)> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..THREADS)
            .map(|t| {
                let (stop, exchange) = (&stop, &exchange);
                s.spawn(move || {
                    client.enter_current_thread();
                    let (mut lat, mut failed) = (Vec::new(), 0);
                    let mut n = 0;
                    while !stop.load(Ordering::Relaxed) {
                        let sent = Instant::now();
                        if exchange(t, n) {
                            lat.push(sent.elapsed().as_micros() as u64);
                        } else {
                            failed += 1;
                        }
                        n += 1;
                    }
                    (lat, failed)
                })
            })
            .collect();
        std::thread::sleep(seconds);
        stop.store(true, Ordering::Relaxed);
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let ran = began.elapsed().as_secs_f64();
    let mut all: Vec<u64> = per_thread
        .iter()
        .flat_map(|(l, _)| l.iter().copied())
        .collect();
    all.sort_unstable();
    Rate {
        per_second: all.len() as f64 / ran,
        p50_us: quantile(&all, 0.5),
        p99_us: quantile(&all, 0.99),
        failed: per_thread.iter().map(|(_, f)| f).sum(),
    }
}

/// New TCP connections, each reading the backend's answer to its end and then closing with a
/// reset (SO_LINGER 0), the threads taking the targets in turn. The reset leaves no TIME_WAIT
/// socket in the backend: the client's ports come round again within a minute at these rates,
/// through every path to the same pods, and a new SYN meeting an old TIME_WAIT socket of
/// another path's would be answered with an ACK and wait a second for its retransmission (a
/// stall of the measuring client, not of any proxy).
fn tcp_rate(client: &Netns, targets: &[SocketAddr], seconds: Duration) -> Rate {
    rate(client, seconds, |t, n| {
        use std::io::Read;
        let dst = targets[(t + n) % targets.len()];
        let Ok(mut s) = TcpStream::connect_timeout(&dst, Duration::from_secs(1)) else {
            return false;
        };
        let _ = s.set_read_timeout(Some(Duration::from_secs(1)));
        let mut buf = Vec::with_capacity(64);
        let answered = s.read_to_end(&mut buf).is_ok() && !buf.is_empty();
        let reset = libc::linger {
            l_onoff: 1,
            l_linger: 0,
        };
        let _ = nix::sys::socket::setsockopt(&s, nix::sys::socket::sockopt::Linger, &reset);
        answered
    })
}

/// A UDP flow per thread, each to one target (the threads take them in turn): a datagram, the
/// backend's answer, again; a flow through a proxy stays on the one backend it chose.
fn udp_rate(client: &Netns, targets: &[SocketAddr], seconds: Duration) -> Rate {
    // Each thread's socket, made in the thread (in the client's namespace).
    thread_local! {
        static SOCKET: std::cell::OnceCell<Option<UdpSocket>> = const { std::cell::OnceCell::new() };
    }
    rate(client, seconds, |t, _| {
        SOCKET.with(|cell| {
            let Some(s) = cell.get_or_init(|| {
                let s = UdpSocket::bind("0.0.0.0:0").ok()?;
                s.connect(targets[t % targets.len()]).ok()?;
                s.set_read_timeout(Some(Duration::from_millis(500))).ok()?;
                Some(s)
            }) else {
                return false;
            };
            let mut buf = [0u8; 256];
            s.send(b"peers").is_ok() && s.recv(&mut buf).is_ok_and(|n| n > 0)
        })
    })
}

/// Creates a Service (nodelb's when `class` is None, else of that class) for the web pods on
/// CREATED_PORT; for nodelb, ms until node-a's port answers and until its NodePort does (one
/// creation), for MetalLB until its VIP does. Deletes it again.
fn created_to_answer(
    c: &RealCluster,
    ns: &str,
    class: Option<&str>,
    node: IpAddr,
) -> Result<(f64, f64), String> {
    let name = if class.is_some() {
        "created-metallb"
    } else {
        "created"
    };
    let spec = match class {
        Some(class) => format!("  loadBalancerClass: {class}\n  externalTrafficPolicy: Local\n"),
        None => "  externalTrafficPolicy: Local\n".to_string(),
    };
    let yaml = format!(
        "apiVersion: v1\nkind: Service\nmetadata: {{name: {name}, namespace: {ns}}}\nspec:\n  \
         type: LoadBalancer\n  selector: {{app: web}}\n  ports:\n    - {{name: http, port: \
         {CREATED_PORT}, targetPort: {BACKEND_TCP_PORT}}}\n{spec}"
    );
    let began = Instant::now();
    let out = c.kubectl_input(
        &[
            "create",
            "-f",
            "-",
            "-o",
            "jsonpath={.spec.ports[0].nodePort}",
        ],
        Some(&yaml),
    )?;
    let answered = |dst: SocketAddr| -> Result<f64, String> {
        loop {
            if let Outcome::Answered(_) =
                traffic::tcp_request(c.client(), dst, Duration::from_millis(200))
            {
                return Ok(began.elapsed().as_secs_f64() * 1e3);
            }
            if began.elapsed() > Duration::from_secs(120) {
                return Err(format!("{ns}/{name}: {dst} not answered within 120 s"));
            }
            std::thread::sleep(Duration::from_millis(5));
        }
    };
    let result = if class.is_none() {
        let node_port: u16 = out
            .trim()
            .parse()
            .map_err(|_| format!("{name}: no NodePort in {out:?}"))?;
        std::thread::scope(|s| {
            let lb = s.spawn(|| answered(SocketAddr::new(node, CREATED_PORT)));
            let np = answered(SocketAddr::new(node, node_port));
            Ok((lb.join().unwrap()?, np?))
        })
    } else {
        let vip = loop {
            if let Some(ip) = ingress(c, ns, name).first() {
                break *ip;
            }
            if began.elapsed() > Duration::from_secs(120) {
                return Err(format!("{name}: MetalLB gave no address within 120 s"));
            }
            std::thread::sleep(Duration::from_millis(10));
        };
        answered(SocketAddr::new(vip, CREATED_PORT)).map(|t| (t, f64::NAN))
    };
    c.kubectl(&["-n", ns, "delete", "service", name, "--wait=true"])?;
    result
}

/// Moves Services `web` and `web-metallb` to the pods of Deployment `to`: ms from the change
/// until each target's answer names a pod of `to`.
fn endpoints_moved(
    c: &RealCluster,
    ns: &str,
    to: &str,
    targets: &[(&'static str, SocketAddr)],
) -> Result<Vec<(&'static str, f64)>, String> {
    let patch = format!("{{\"spec\":{{\"selector\":{{\"app\":\"{to}\"}}}}}}");
    let prefix = format!("{to}-");
    let began = Instant::now();
    std::thread::scope(|s| {
        let watchers: Vec<_> = targets
            .iter()
            .map(|(name, dst)| {
                let prefix = &prefix;
                s.spawn(move || loop {
                    if let Outcome::Answered(r) =
                        traffic::tcp_request(c.client(), *dst, Duration::from_millis(200))
                    {
                        if pod_of(&r).starts_with(prefix.as_str()) {
                            return Ok((*name, began.elapsed().as_secs_f64() * 1e3));
                        }
                    }
                    if began.elapsed() > Duration::from_secs(120) {
                        return Err(format!(
                            "{name}: {dst} not answered by {prefix}* within 120 s"
                        ));
                    }
                    std::thread::sleep(Duration::from_millis(5));
                })
            })
            .collect();
        for svc in ["web", "web-metallb"] {
            c.kubectl(&[
                "-n",
                ns,
                "patch",
                "service",
                svc,
                "--type=merge",
                "-p",
                &patch,
            ])?;
        }
        watchers.into_iter().map(|w| w.join().unwrap()).collect()
    })
}

/// A rolling restart of the web backends under load through each target at once (a new
/// connection every 20 ms each): the connections that failed, per target.
fn rolling_update(
    c: &RealCluster,
    ns: &str,
    targets: &[(&'static str, SocketAddr)],
) -> Result<Vec<(&'static str, usize, usize)>, String> {
    let loads: Vec<_> = targets
        .iter()
        .map(|(name, dst)| {
            (
                *name,
                TcpLoad::start(c.client(), vec![*dst], Duration::from_millis(20)),
            )
        })
        .collect();
    std::thread::sleep(Duration::from_secs(2));
    c.kubectl(&["-n", ns, "rollout", "restart", "deploy/web"])?;
    c.rollout_of(ns, "deploy/web", Duration::from_secs(180))?;
    std::thread::sleep(Duration::from_secs(5));
    Ok(loads
        .into_iter()
        .map(|(name, load)| {
            let r = load.stop();
            (name, r.failed.len(), r.total())
        })
        .collect())
}

fn median(v: &[f64]) -> f64 {
    let mut s: Vec<f64> = v.iter().copied().filter(|x| !x.is_nan()).collect();
    if s.is_empty() {
        return f64::NAN;
    }
    s.sort_by(|a, b| a.partial_cmp(b).unwrap());
    s[s.len() / 2]
}

fn spread(v: &[f64]) -> String {
    let lo = v.iter().copied().fold(f64::INFINITY, f64::min);
    let hi = v.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    format!("{lo:.0}–{hi:.0}")
}

fn report(
    services: u64,
    rounds: u64,
    rows: &std::collections::BTreeMap<Path, Row>,
    created: &std::collections::BTreeMap<&str, Vec<f64>>,
    moved: &std::collections::BTreeMap<&str, Vec<f64>>,
    rolled: &[(&'static str, usize, usize)],
) {
    let m = |p: Path, f: &dyn Fn(&Row) -> Vec<f64>| {
        rows.get(&p).map(|r| median(&f(r))).unwrap_or(f64::NAN)
    };
    let gbits = |r: &Row| r.gbits.clone();
    let conns = |r: &Row| r.tcp.iter().map(|x| x.per_second).collect::<Vec<_>>();
    let udps = |r: &Row| r.udp.iter().map(|x| x.per_second).collect::<Vec<_>>();
    println!();
    println!(
        "data path at {services} Services, medians of {rounds} interleaved rounds (spread: min–max; \
         ×floor, ×kp-nft: the median's ratio to direct's and to kube-proxy nftables'):"
    );
    println!(
        "| path | TCP Gbit/s (iperf3, 1 stream) | connect-read-close /s | p50 µs | p99 µs | UDP request-reply /s | p50 µs | p99 µs | failed TCP / UDP |"
    );
    println!("|---|---|---|---|---|---|---|---|---|");
    let floor = [
        m(Path::Direct, &gbits),
        m(Path::Direct, &conns),
        m(Path::Direct, &udps),
    ];
    let kp = [
        m(Path::KubeProxyNft, &gbits),
        m(Path::KubeProxyNft, &conns),
        m(Path::KubeProxyNft, &udps),
    ];
    for p in PATHS {
        let Some(r) = rows.get(&p) else { continue };
        let ratio = |i: usize, v: f64| {
            if p == Path::Direct {
                String::new()
            } else {
                format!(" ({:.2}× floor, {:.2}× kp-nft)", v / floor[i], v / kp[i])
            }
        };
        let g = median(&r.gbits);
        let cr = median(&conns(r));
        let ur = median(&udps(r));
        let q = |v: &[Rate], f: fn(&Rate) -> f64| median(&v.iter().map(f).collect::<Vec<_>>());
        println!(
            "| {} | {:.1} ({:.1}–{:.1}){} | {:.0} ({}){} | {:.0} | {:.0} | {:.0} ({}){} | {:.0} | {:.0} | {} / {} |",
            p.label(),
            g,
            r.gbits.iter().copied().fold(f64::INFINITY, f64::min),
            r.gbits.iter().copied().fold(f64::NEG_INFINITY, f64::max),
            ratio(0, g),
            cr,
            spread(&conns(r)),
            ratio(1, cr),
            q(&r.tcp, |x| x.p50_us),
            q(&r.tcp, |x| x.p99_us),
            ur,
            spread(&udps(r)),
            ratio(2, ur),
            q(&r.udp, |x| x.p50_us),
            q(&r.udp, |x| x.p99_us),
            r.tcp.iter().map(|x| x.failed).sum::<usize>(),
            r.udp.iter().map(|x| x.failed).sum::<usize>(),
        );
    }
    println!();
    println!(
        "control plane at {services} Services, medians of {rounds} rounds (ms; spread min–max):"
    );
    println!("| | nodelb | kube-proxy NodePort | MetalLB VIP |");
    println!("|---|---|---|---|");
    let cell = |t: &std::collections::BTreeMap<&str, Vec<f64>>, k: &str| {
        t.get(k)
            .map(|v| format!("{:.0} ({})", median(v), spread(v)))
            .unwrap_or_else(|| "—".into())
    };
    println!(
        "| Service created → first answer | {} | {} | {} |",
        cell(created, "nodelb"),
        cell(created, "kube-proxy"),
        cell(created, "MetalLB")
    );
    println!(
        "| endpoints changed → first answer from the new pods | {} | {} | {} |",
        cell(moved, "nodelb"),
        cell(moved, "kube-proxy"),
        cell(moved, "MetalLB")
    );
    let roll = |k: &str| {
        rolled
            .iter()
            .find(|(n, _, _)| *n == k)
            .map(|(_, f, t)| format!("{f} of {t}"))
            .unwrap_or_default()
    };
    println!(
        "| failed connections during a rolling update (one, a connection every 20 ms) | {} | {} | {} |",
        roll("nodelb"),
        roll("kube-proxy"),
        roll("MetalLB")
    );
    println!();
    let goal = |what: &str, ok: bool, figures: String| {
        println!("{} {what}: {figures}", if ok { "PASS" } else { "MISS" });
    };
    for (i, what) in [
        "TCP throughput",
        "connect-read-close rate",
        "UDP request-reply rate",
    ]
    .iter()
    .enumerate()
    {
        let n = [
            m(Path::Nodelb, &gbits),
            m(Path::Nodelb, &conns),
            m(Path::Nodelb, &udps),
        ][i];
        goal(
            &format!("nodelb's {what} at least 1.0× kube-proxy nftables'"),
            n >= kp[i],
            format!("{:.3}×", n / kp[i]),
        );
        goal(
            &format!("nodelb's {what} at least 0.97× the floor"),
            n >= 0.97 * floor[i],
            format!("{:.3}×", n / floor[i]),
        );
    }
    for (what, t) in [
        ("Service created → first answer", created),
        ("endpoints changed → first answer", moved),
    ] {
        let (n, mlb) = (median(&t["nodelb"]), median(&t["MetalLB"]));
        goal(
            &format!("nodelb ahead of MetalLB on {what}"),
            n < mlb,
            format!("{n:.0} ms against {mlb:.0} ms"),
        );
    }
    let failed = |k: &str| {
        rolled
            .iter()
            .find(|(n, _, _)| *n == k)
            .map(|x| x.1)
            .unwrap_or(0)
    };
    goal(
        "nodelb not behind MetalLB on failed connections during a rolling update",
        failed("nodelb") <= failed("MetalLB"),
        format!("{} against {}", failed("nodelb"), failed("MetalLB")),
    );
}

fn rss_mib(pid: i32) -> Option<f64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let kib: f64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))?
        .trim()
        .trim_end_matches("kB")
        .trim()
        .parse()
        .ok()?;
    Some(kib / 1024.0)
}

/// The processes whose cost is compared, each with the audit log's user and source address of
/// its API requests (`None`: any address).
struct Costed {
    name: String,
    pid: i32,
    user: &'static str,
    source: Option<IpAddr>,
}

fn costed(c: &RealCluster) -> Result<Vec<Costed>, String> {
    let one = |what: &str, pids: Vec<i32>| -> Result<i32, String> {
        match pids.as_slice() {
            [p] => Ok(*p),
            other => Err(format!(
                "{what}: {} processes ({other:?}), not one",
                other.len()
            )),
        }
    };
    // The agent that holds the status Lease also writes every Service's status and renews the
    // Lease (one per cluster); the others are what each further node costs.
    let holder = c.kubectl(&[
        "-n",
        "nodelb-system",
        "get",
        "lease",
        "nodelb-status",
        "-o",
        "jsonpath={.spec.holderIdentity}",
    ])?;
    let leader_node = c.kubectl(&[
        "-n",
        "nodelb-system",
        "get",
        "pod",
        holder.trim(),
        "-o",
        "jsonpath={.spec.nodeName}",
    ])?;
    let leader_node = leader_node.trim().to_string();
    let kube_proxy: i32 = std::fs::read_to_string(format!(
        "{}/pids/kube-proxy-{NODE}",
        std::env::var("NODELB_CLUSTER_DIR").unwrap_or_else(|_| "/var/lib/nodelb-cluster".into())
    ))
    .map_err(|e| format!("kube-proxy's pid file: {e}"))?
    .trim()
    .parse()
    .map_err(|e| format!("kube-proxy's pid file: {e}"))?;
    let mut out = Vec::new();
    for (node, addr) in c.nodes() {
        let role = if *node == leader_node {
            "the status leader, one per cluster"
        } else {
            "every other node"
        };
        out.push(Costed {
            name: format!("nodelb agent ({node}: {role})"),
            pid: one(
                &format!("nodelb's agent on {node}"),
                nodelb_integration::real_cluster::agent_pids(node),
            )?,
            user: "system:serviceaccount:nodelb-system:",
            source: Some(*addr),
        });
    }
    for (node, addr) in c.nodes() {
        out.push(Costed {
            name: format!("MetalLB speaker ({node})"),
            pid: one(
                &format!("MetalLB's speaker on {node}"),
                pids_of("/speaker", None, &format!("METALLB_NODE_NAME={node}")),
            )?,
            user: "system:serviceaccount:metallb-system:speaker",
            source: Some(*addr),
        });
    }
    out.push(Costed {
        name: "MetalLB controller (one per cluster)".into(),
        pid: one(
            "MetalLB's controller",
            pids_of("/controller", None, "METALLB_DEPLOYMENT=controller"),
        )?,
        user: "system:serviceaccount:metallb-system:controller",
        source: None,
    });
    out.push(Costed {
        name: format!("kube-proxy nftables ({NODE}; both need it)"),
        pid: kube_proxy,
        user: "system:kube-proxy",
        source: Some(c.node_address(NODE)),
    });
    Ok(out)
}

/// The cost per node, idle and under EndpointSlice churn: see the module's documentation.
fn cost(c: &RealCluster, ns: &str, class: &str, window: Duration) -> Result<(), String> {
    use k8s_openapi::api::discovery::v1::EndpointSlice;
    use kube::api::{Api, Patch, PatchParams};
    let procs = costed(c)?;
    // Two selector-less Services, nodelb's and MetalLB's, whose EndpointSlices this writes.
    let mut yaml = String::new();
    for (svc, extra) in [
        ("churn", String::new()),
        ("churn-metallb", format!("  loadBalancerClass: {class}\n")),
    ] {
        yaml += &format!(
            "apiVersion: v1\nkind: Service\nmetadata: {{name: {svc}, namespace: {ns}}}\nspec:\n  \
             type: LoadBalancer\n  ports:\n    - {{name: http, port: 18130, targetPort: 8080}}\n{extra}---\n\
             apiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata:\n  name: {svc}-1\n  \
             namespace: {ns}\n  labels: {{kubernetes.io/service-name: {svc}, \
             endpointslice.kubernetes.io/managed-by: peers.nodelb.test}}\naddressType: IPv4\n\
             ports: [{{name: http, port: 8080, protocol: TCP}}]\nendpoints: []\n---\n"
        );
    }
    c.apply(&yaml)?;
    let endpoints = |round: usize| -> serde_json::Value {
        let list: Vec<serde_json::Value> = (0..10)
            .map(|i| {
                serde_json::json!({
                    "addresses": [format!("198.51.100.{}", 100 + i)],
                    "conditions": {"ready": !(i + round).is_multiple_of(10)},
                })
            })
            .collect();
        serde_json::json!({ "endpoints": list })
    };
    let slices: Api<EndpointSlice> = Api::namespaced(c.admin().clone(), ns);
    let audit = |p: &Costed, recs: &[nodelb_integration::control_plane::AuditRecord]| {
        recs.iter()
            .filter(|r| r.user.starts_with(p.user) && p.source.is_none_or(|s| s == r.source))
            .count()
    };
    let mut lines = Vec::new();
    for phase in ["idle", "20 EndpointSlice changes/s to each"] {
        let cpu0: Vec<f64> = procs
            .iter()
            .map(|p| cpu_seconds(p.pid as u32).unwrap_or(f64::NAN))
            .collect();
        let recs0 = c.audit_records().unwrap_or_default();
        let began = Instant::now();
        let mut writes = 0usize;
        if phase == "idle" {
            std::thread::sleep(window);
        } else {
            let mut next = Instant::now();
            let mut round = 0;
            while began.elapsed() < window {
                for svc in ["churn-1", "churn-metallb-1"] {
                    c.block_on(slices.patch(
                        svc,
                        &PatchParams::default(),
                        &Patch::Merge(endpoints(round)),
                    ))
                    .map_err(|e| format!("patching EndpointSlice {svc}: {e}"))?;
                    writes += 1;
                }
                round += 1;
                next += Duration::from_millis(50);
                std::thread::sleep(next.saturating_duration_since(Instant::now()));
            }
        }
        let ran = began.elapsed().as_secs_f64();
        let recs1 = c.audit_records().unwrap_or_default();
        for (i, p) in procs.iter().enumerate() {
            let cpu = cpu_seconds(p.pid as u32).map(|x| (x - cpu0[i]) / ran * 3600.0);
            let requests = (audit(p, &recs1).saturating_sub(audit(p, &recs0))) as f64 / ran * 60.0;
            lines.push(format!(
                "| {} | {phase} | {:.1} | {:.1} | {:.0} |",
                p.name,
                cpu.unwrap_or(f64::NAN),
                rss_mib(p.pid).unwrap_or(f64::NAN),
                requests
            ));
        }
        if writes > 0 {
            println!(
                "cost: {writes} EndpointSlice writes in {ran:.0} s ({:.1}/s)",
                writes as f64 / ran
            );
        }
    }
    println!();
    println!("cost per node, {} s a phase (CPU s/hour from /proc utime+stime; RSS at the end; API requests/min from the audit log):", window.as_secs());
    println!("| process | load | CPU s/hour | RSS MiB | API requests/min |");
    println!("|---|---|---|---|---|");
    for l in lines {
        println!("{l}");
    }
    Ok(())
}

/// The node whose link-layer address the LAN namespace holds for `ip` (who answered its ARP).
fn arp_owner(c: &RealCluster, ip: IpAddr) -> Result<String, String> {
    let neigh = Command::new("ip")
        .args(["-n", "nodelb-lan", "neigh", "show", &ip.to_string()])
        .output()
        .map_err(|e| format!("ip neigh: {e}"))?;
    let neigh = String::from_utf8_lossy(&neigh.stdout);
    let mac = neigh
        .split_whitespace()
        .skip_while(|w| *w != "lladdr")
        .nth(1)
        .ok_or_else(|| format!("the LAN has no neighbour entry for {ip}: {neigh:?}"))?
        .to_string();
    for (name, _) in c.nodes() {
        let link = Command::new("ip")
            .args(["-n", &format!("nodelb-{name}"), "link", "show", "eth0"])
            .output()
            .map_err(|e| format!("ip link: {e}"))?;
        if String::from_utf8_lossy(&link.stdout).contains(&mac) {
            return Ok(name.clone());
        }
    }
    Err(format!(
        "no node has {mac}, the address the LAN holds for {ip}"
    ))
}

/// One connection attempt to each address in turn, `per_try` each: the first that answers.
fn first_answer(c: &RealCluster, addrs: &[SocketAddr], per_try: Duration) -> Option<usize> {
    addrs.iter().position(|a| {
        matches!(
            traffic::tcp_request(c.client(), *a, per_try),
            Outcome::Answered(_)
        )
    })
}

/// One attempt of a failover client: when it began and ended (since the measurement's start)
/// and which address answered (0: the first it tried), if any.
struct Attempt {
    began: Duration,
    ended: Duration,
    answered: Option<usize>,
}

/// What a failover client saw from the cut on (every time after the cut, in seconds).
struct Failover {
    /// The first attempt begun after the cut that succeeded, at its end.
    first_success: Option<f64>,
    /// The end of the last attempt that failed: from then on every attempt succeeded.
    last_failure: Option<f64>,
    /// The end of the last attempt that needed a second address.
    last_fallback: Option<f64>,
    failed: usize,
    total: usize,
}

fn failover(attempts: &[Attempt], cut: Duration) -> Failover {
    let after: Vec<&Attempt> = attempts.iter().filter(|a| a.began >= cut).collect();
    let since = |d: Duration| d.saturating_sub(cut).as_secs_f64();
    Failover {
        first_success: after
            .iter()
            .find(|a| a.answered.is_some())
            .map(|a| since(a.ended)),
        last_failure: after
            .iter()
            .filter(|a| a.answered.is_none())
            .map(|a| since(a.ended))
            .reduce(f64::max),
        last_fallback: after
            .iter()
            .filter(|a| a.answered.is_some_and(|i| i > 0))
            .map(|a| since(a.ended))
            .reduce(f64::max),
        failed: after.iter().filter(|a| a.answered.is_none()).count(),
        total: after.len(),
    }
}

/// The node failure: see the module's documentation.
fn node_failure(c: &RealCluster, ns: &str, class: &str) -> Result<(), String> {
    const PORT: u16 = 18_140;
    const PER_TRY: Duration = Duration::from_millis(500);
    const EVERY: Duration = Duration::from_millis(50);
    // One backend on each node (the Deployment spreads them), and the Local policy, so each
    // node sends only to its own backend: the cut node's backend takes no connection the
    // other node accepts, and what is measured is each model's failover, not the endpoint
    // controller's (which marks the cut node's pods not ready only after the node monitor's
    // grace period).
    c.apply(&nodelb_integration::real_cluster::backend_deployment(
        ns,
        "spread",
        c.backend_image(),
        2,
        3,
    ))?;
    c.rollout_of(ns, "deploy/spread", Duration::from_secs(180))?;
    let local = "  externalTrafficPolicy: Local\n";
    c.apply(&backend_service(ns, "spread", "spread", PORT, local))?;
    c.apply(&backend_service(
        ns,
        "spread-metallb",
        "spread",
        PORT,
        &format!("  loadBalancerClass: {class}\n{local}"),
    ))?;
    let ingress = |svc: &str| ingress(c, ns, svc);
    let both_published = || {
        let now = ingress("spread");
        if now.len() == 2 {
            Ok(())
        } else {
            Err(format!("{now:?}"))
        }
    };
    let (vip, _) = c.until(
        "MetalLB's address for spread-metallb",
        Duration::from_secs(120),
        || {
            ingress("spread-metallb")
                .first()
                .copied()
                .ok_or_else(|| "no address yet".to_string())
        },
    );
    c.until(
        "nodelb publishing both nodes for spread",
        Duration::from_secs(120),
        both_published,
    );
    answered_within(c, SocketAddr::new(vip, PORT), Duration::from_secs(60))?;
    let cut = arp_owner(c, vip)?;
    let cut_ip = c.node_address(&cut);
    let other_ip = c
        .nodes()
        .iter()
        .find(|(n, _)| *n != cut)
        .map(|(_, a)| *a)
        .ok_or("one node only")?;
    for a in [cut_ip, other_ip] {
        answered_within(c, SocketAddr::new(a, PORT), Duration::from_secs(60))?;
    }
    println!("node failure: MetalLB's VIP {vip} is on {cut}; cutting {cut}'s network");
    let stop = AtomicBool::new(false);
    let began = Instant::now();
    // A client that connects every EVERY, each attempt trying `addresses()` in order.
    let client = |addresses: &(dyn Fn() -> Vec<IpAddr> + Sync)| -> Vec<Attempt> {
        let mut attempts = Vec::new();
        while !stop.load(Ordering::Relaxed) {
            let addrs: Vec<SocketAddr> = addresses()
                .into_iter()
                .map(|a| SocketAddr::new(a, PORT))
                .collect();
            let t = began.elapsed();
            let answered = first_answer(c, &addrs, PER_TRY);
            attempts.push(Attempt {
                began: t,
                ended: began.elapsed(),
                answered,
            });
            std::thread::sleep(EVERY);
        }
        attempts
    };
    // nodelb's published addresses, the cut node first while the status publishes it, read
    // again every 500 ms (as a client re-resolving a name would).
    let published = std::sync::Mutex::new(vec![cut_ip, other_ip]);
    let (vip_attempts, nodelb_attempts, cut_at, status_right) = std::thread::scope(|s| {
        let vip_client = s.spawn(|| client(&|| vec![vip]));
        let nodelb_client = s.spawn(|| client(&|| published.lock().unwrap().clone()));
        std::thread::sleep(Duration::from_secs(2));
        let cut_at = began.elapsed();
        let res = c.cluster_sh(&["link", &cut, "down"]);
        let mut status_right = None;
        let limit = Instant::now();
        while limit.elapsed() < Duration::from_secs(120) {
            let now = ingress("spread");
            if !now.is_empty() {
                let mut ordered: Vec<IpAddr> = [cut_ip, other_ip]
                    .into_iter()
                    .filter(|a| now.contains(a))
                    .collect();
                ordered.extend(now.iter().filter(|a| **a != cut_ip && **a != other_ip));
                *published.lock().unwrap() = ordered;
            }
            if status_right.is_none() && !now.is_empty() && !now.contains(&cut_ip) {
                status_right = Some(began.elapsed() - cut_at);
            }
            if status_right.is_some() && limit.elapsed() > Duration::from_secs(15) {
                break;
            }
            std::thread::sleep(Duration::from_millis(500));
        }
        std::thread::sleep(Duration::from_secs(3));
        stop.store(true, Ordering::Relaxed);
        if let Err(e) = res {
            eprintln!("peers: cutting {cut}: {e}");
        }
        (
            vip_client.join().unwrap(),
            nodelb_client.join().unwrap(),
            cut_at,
            status_right,
        )
    });
    c.cluster_sh(&["link", &cut, "up"])?;
    c.until(
        "both nodes published again after the link came back",
        Duration::from_secs(180),
        both_published,
    );
    let secs = |d: Option<f64>| d.map(|d| format!("{d:.1} s")).unwrap_or_else(|| "–".into());
    let none_failed = |d: Option<f64>| {
        d.map(|d| format!("{d:.1} s"))
            .unwrap_or_else(|| "the cut (none failed)".into())
    };
    let (v, n) = (
        failover(&vip_attempts, cut_at),
        failover(&nodelb_attempts, cut_at),
    );
    println!();
    println!(
        "node failure ({cut}'s network cut; clients begin a connection every {} ms, {} ms a try; \
         times after the cut):",
        EVERY.as_millis(),
        PER_TRY.as_millis()
    );
    println!("| client | first new connection through | every connection succeeds from | needs no second address from | failed / attempts | status right |");
    println!("|---|---|---|---|---|---|");
    println!(
        "| MetalLB: the VIP (one address) | {} | {} | – | {} / {} | the VIP moved |",
        secs(v.first_success),
        none_failed(v.last_failure),
        v.failed,
        v.total
    );
    println!(
        "| nodelb: the published node addresses in order, cut node first | {} | {} | {} | {} / {} | {} |",
        secs(n.first_success),
        none_failed(n.last_failure),
        secs(n.last_fallback),
        n.failed,
        n.total,
        secs(status_right.map(|d| d.as_secs_f64()))
    );
    Ok(())
}
