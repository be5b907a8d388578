//! What conntrack cleanup costs at scale. N UDP conntrack entries (default 10,000) are made by
//! real datagrams, one from each of N client ports, through a nodelb table (planned by the
//! agent's planner, a UDP Service with two endpoints) in a node namespace to two backend
//! namespaces that answer; then, in the node namespace:
//!
//! - a dump of the node's UDP entries (`Conntrack::dump`), median of several;
//! - a cleanup that matches none of them, as the agent runs it after an endpoint change (one
//!   dump, the matching, no delete): what every cleanup pays at that table size;
//! - a cleanup that deletes every entry of the Service port (dump, then one delete each);
//! - the same two with `conntrack -D` (conntrack-tools, libnetfilter_conntrack) as the peer,
//!   on a table made the same way, timed as a whole process.
//!
//! No goal: it prints the figures. Env: `NODELB_BENCH_ENTRIES` (10000). Needs root; without it
//! prints SKIP and exits 0, or 1 when `CI=true`. Run: `cargo bench -p nodelb-integration
//! --bench conntrack`.

use nodelb_agent::host::conntrack::selectors;
use nodelb_agent::object_files::ObjectFiles;
use nodelb_core::plan::config::Config;
use nodelb_core::plan::endpoints::EndpointAddr;
use nodelb_core::plan::flows::{ServedPort, StaleFlows};
use nodelb_core::plan::node::{AddressKind, NodeInfo};
use nodelb_core::plan::{plan, Input};
use nodelb_core::vocab::{Families, Protocol};
use nodelb_integration::bench::env_usize;
use nodelb_integration::netns::{bench_main, Topology};
use nodelb_integration::nft::nodelb_replace;
use nodelb_integration::traffic::{udp_server, Server};
use nodelb_netfilter::conntrack::{Conntrack, Deleted};
use nodelb_netfilter::{Family, L4Proto};
use std::net::{IpAddr, SocketAddr, UdpSocket};
use std::process::{Command, ExitCode};
use std::time::{Duration, Instant};

const PORT: u16 = 53;
const BACKEND_PORT: u16 = 8053;
/// Client source ports start here.
const FIRST_CLIENT_PORT: u16 = 20000;
const DUMPS: usize = 5;

type Res<T> = Result<T, String>;

fn main() -> ExitCode {
    bench_main("conntrack", run)
}

fn run() -> Res<()> {
    let n = env_usize("NODELB_BENCH_ENTRIES", 10_000, 1)?;
    if n > usize::from(u16::MAX - FIRST_CLIENT_PORT) {
        return Err(format!("at most {} entries", u16::MAX - FIRST_CLIENT_PORT));
    }
    let topo = Topology::new(2);
    let _servers = servers(&topo);
    nodelb_replace(&topo.node, &tables(&topo)?).map_err(|e| format!("programming: {e}"))?;
    let node: IpAddr = topo.node_v4().into();
    let port = ServedPort {
        protocol: Protocol::Udp,
        address: node,
        port: PORT,
    };
    println!("conntrack bench: {n} UDP entries to {node}:{PORT}, DNATed to 2 endpoints");

    // nodelb.
    make_entries(&topo, n)?;
    let dumps: Vec<Duration> = (0..DUMPS)
        .map(|_| timed_dump(&topo, n))
        .collect::<Res<_>>()?;
    println!(
        "  nodelb dump of {n} entries: median {:.1} ms (of {DUMPS}: {})",
        ms(median(dumps.clone())),
        dumps
            .iter()
            .map(|d| format!("{:.1}", ms(*d)))
            .collect::<Vec<_>>()
            .join(", ")
    );
    // An endpoint that was never there: nothing matches.
    let nobody = StaleFlows::Left {
        port,
        endpoint: EndpointAddr {
            addr: IpAddr::from([198, 51, 100, 99]),
            port: BACKEND_PORT,
        },
    };
    let d = cleanup(&topo, &[nobody])?;
    report("nodelb cleanup, nothing to delete", &d, 0);
    // Every entry of the port (as when it opens with endpoints none of them answers).
    let all = StaleFlows::Opened {
        port,
        endpoints: Vec::new(),
    };
    let d = cleanup(&topo, &[all])?;
    report("nodelb cleanup, every entry", &d, n);

    // conntrack(8), on a table made the same way.
    if Command::new("conntrack").arg("--version").output().is_err() {
        println!("  peer: conntrack(8) is not installed (Debian package `conntrack`)");
        return Ok(());
    }
    make_entries(&topo, n)?;
    let node_arg = node.to_string();
    let every = ["-D", "-p", "udp", "--orig-dst", &node_arg, "--dport", "53"];
    let nothing = [&every[..], &["--reply-src", "198.51.100.99"]].concat();
    let (t, out) = peer(&topo, &nothing)?;
    println!("  conntrack -D, nothing to delete: {:.1} ms ({out})", ms(t));
    let (t, out) = peer(&topo, &every)?;
    println!(
        "  conntrack -D, every entry: {:.1} ms, {:.1} µs per entry ({out})",
        ms(t),
        t.as_secs_f64() * 1e6 / n as f64
    );
    Ok(())
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

fn report(what: &str, d: &Deleted, expected: usize) {
    println!(
        "  {what}: dump of {} {:.1} ms + delete of {} {:.1} ms = {:.1} ms{}",
        d.dumped,
        ms(d.dump_time),
        d.deleted,
        ms(d.delete_time),
        ms(d.dump_time + d.delete_time),
        if d.deleted > 0 {
            format!(
                ", {:.1} µs per deleted entry",
                d.delete_time.as_secs_f64() * 1e6 / d.deleted as f64
            )
        } else {
            String::new()
        }
    );
    if d.deleted != expected {
        println!("  (expected {expected} deleted)");
    }
}

/// The planner's tables for a UDP Service on `PORT` with both backends as endpoints.
fn tables(topo: &Topology) -> Res<Vec<nodelb_netfilter::Table>> {
    let yaml = format!(
        "apiVersion: v1\nkind: Service\nmetadata: {{namespace: default, name: dns, creationTimestamp: \"2024-01-01T00:00:00Z\"}}\nspec:\n  type: LoadBalancer\n  ports: [{{name: dns, port: {PORT}, protocol: UDP}}]\n---\napiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata:\n  namespace: default\n  name: dns-1\n  labels: {{kubernetes.io/service-name: dns}}\naddressType: IPv4\nports: [{{name: dns, port: {BACKEND_PORT}, protocol: UDP}}]\nendpoints:\n- addresses: [\"{}\"]\n- addresses: [\"{}\"]\n",
        topo.backend_v4(0),
        topo.backend_v4(1)
    );
    let objects = ObjectFiles::from_text(std::path::Path::new("bench.yaml"), &yaml)
        .map_err(|e| e.to_string())?;
    let node = NodeInfo {
        name: "node-a".into(),
        labels: Default::default(),
        addresses: vec![(AddressKind::InternalIP, topo.node_v4().into())],
    };
    let local = topo.node.addresses();
    let p = plan(&Input {
        services: objects.services.iter().collect(),
        slices: objects.slices.iter().collect(),
        node: &node,
        local_addresses: &local,
        families: Families {
            v4: true,
            v6: false,
        },
        config: &Config::default(),
        listeners: &Default::default(),
    });
    Ok(p.tables)
}

fn servers(topo: &Topology) -> Vec<Server> {
    (0..2)
        .map(|i| {
            let addr = SocketAddr::new(topo.backend_v4(i).into(), BACKEND_PORT);
            udp_server(&topo.backends[i], addr, &format!("b{i}"))
        })
        .collect()
}

/// One datagram from each of `n` client ports to the Service; waits until the node holds an
/// entry for each.
fn make_entries(topo: &Topology, n: usize) -> Res<()> {
    let t0 = Instant::now();
    let (client, node) = (topo.client_v4(), topo.node_v4());
    topo.client.run(move || -> Res<()> {
        for i in 0..n {
            let s = UdpSocket::bind((client, FIRST_CLIENT_PORT + i as u16))
                .map_err(|e| format!("binding a client port: {e}"))?;
            s.send_to(b"x", (node, PORT))
                .map_err(|e| format!("sending: {e}"))?;
        }
        Ok(())
    })?;
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let have = dump(topo)?.0;
        if have >= n {
            println!(
                "  made {have} entries in {:.1} s",
                t0.elapsed().as_secs_f64()
            );
            return Ok(());
        }
        if Instant::now() > deadline {
            return Err(format!("only {have} of {n} entries after 30 s"));
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// The node's UDP entries of the Service port, and how long the dump took.
fn dump(topo: &Topology) -> Res<(usize, Duration)> {
    topo.node.run(|| {
        let mut ct = Conntrack::open().map_err(|e| e.to_string())?;
        let t0 = Instant::now();
        let entries = ct
            .dump(Family::Ip, L4Proto::Udp)
            .map_err(|e| e.to_string())?;
        let took = t0.elapsed();
        Ok((
            entries
                .iter()
                .filter(|e| e.original.dst.port() == PORT)
                .count(),
            took,
        ))
    })
}

fn timed_dump(topo: &Topology, n: usize) -> Res<Duration> {
    let (have, took) = dump(topo)?;
    if have < n {
        return Err(format!("the dump listed {have} of {n} entries"));
    }
    Ok(took)
}

/// The agent's cleanup of `stale` in the node namespace.
fn cleanup(topo: &Topology, stale: &[StaleFlows]) -> Res<Deleted> {
    let sel = selectors(stale);
    topo.node.run(move || {
        let mut ct = Conntrack::open().map_err(|e| e.to_string())?;
        let done = ct.delete_selected(&sel).map_err(|e| e.to_string())?;
        done.get(&(Family::Ip, L4Proto::Udp))
            .copied()
            .ok_or_else(|| "no UDP cleanup".to_string())
    })
}

/// `conntrack args...` in the node namespace: wall time, and its summary line.
fn peer(topo: &Topology, args: &[&str]) -> Res<(Duration, String)> {
    let t0 = Instant::now();
    let out = topo.node.exec(&[&["conntrack"], args].concat());
    let took = t0.elapsed();
    // conntrack(8) reports on stderr; it exits 1 when it deleted nothing.
    let text = String::from_utf8_lossy(&out.stderr);
    let summary = text
        .lines()
        .find(|l| l.contains("flow entries"))
        .unwrap_or("no summary")
        .trim()
        .to_string();
    if !out.status.success() && !summary.contains(" 0 flow entries") {
        return Err(format!("conntrack {}: {text}", args.join(" ")));
    }
    Ok((took, summary))
}
