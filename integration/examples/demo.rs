//! The demo: a client, a node and two backends in network namespaces; nodelb programs the
//! node through its netlink batch, real requests go through, an endpoint goes away with an
//! incremental sync, and the table is shown as an operator would see it.
//!
//! Run as root: `cargo run --release -p nodelb-integration --example demo`.

use nodelb_integration::models::{lb_table, Fam, LbService};
use nodelb_integration::netns::Topology;
use nodelb_integration::nft::list_table;
use nodelb_integration::traffic::{tcp_request, tcp_server, Outcome};
use nodelb_netfilter::{Committer, L4Proto, Nft};
use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

fn main() {
    if unsafe { libc::geteuid() } != 0 {
        eprintln!("demo: needs root (it creates network namespaces and programs nftables in them)");
        std::process::exit(1);
    }
    let topo = Topology::new(2);
    let node = IpAddr::V4(topo.node_v4());
    let _servers: Vec<_> = (0..2)
        .map(|i| {
            let addr = SocketAddr::new(IpAddr::V4(topo.backend_v4(i)), 8080);
            tcp_server(&topo.backends[i], addr, &format!("backend-{i}"))
        })
        .collect();
    let service = |endpoints: Vec<(IpAddr, u16)>| LbService {
        key: "default/web:http".into(),
        proto: L4Proto::Tcp,
        port: 80,
        endpoints,
        masquerade: true,
        source_ranges: vec![],
    };
    let both = vec![
        (IpAddr::V4(topo.backend_v4(0)), 8080),
        (IpAddr::V4(topo.backend_v4(1)), 8080),
    ];

    println!(
        "== nodelb programs node namespace {} (address {node})",
        topo.node.name()
    );
    let table = lb_table(Fam::V4, "nodelb", &[node], &[service(both.clone())]);
    let mut committer = topo
        .node
        .run(|| Committer::new(Nft::open().expect("netlink socket")));
    let stats = topo
        .node
        .run(|| committer.sync(vec![table.clone()]))
        .expect("install");
    println!(
        "   one batch: {} messages, {} bytes, encode {:?}, commit {:?}",
        stats.messages, stats.bytes, stats.encode, stats.commit
    );

    let target = SocketAddr::new(node, 80);
    let ask = |label: &str| {
        println!("== client {} -> {target} ({label})", topo.client_v4());
        for _ in 0..6 {
            match tcp_request(&topo.client, target, Duration::from_secs(2)) {
                Outcome::Answered(reply) => println!("   answered: {reply}"),
                other => println!("   {other:?}"),
            }
        }
    };
    ask("two endpoints; the backend sees the node's address, masqueraded");

    let one = lb_table(Fam::V4, "nodelb", &[node], &[service(both[1..].to_vec())]);
    let stats = topo
        .node
        .run(|| committer.sync(vec![one.clone()]))
        .expect("sync");
    println!(
        "== backend-0 removed: incremental batch of {} messages, {} bytes, commit {:?}",
        stats.messages, stats.bytes, stats.commit
    );
    ask("one endpoint left");

    let none = lb_table(Fam::V4, "nodelb", &[node], &[service(vec![])]);
    topo.node
        .run(|| committer.sync(vec![none.clone()]))
        .expect("sync");
    println!("== no endpoints: the client is refused at once, not left to time out");
    match tcp_request(&topo.client, target, Duration::from_secs(2)) {
        Outcome::Refused { .. } => println!("   refused (TCP reset)"),
        other => println!("   unexpected: {other:?}"),
    }

    topo.node
        .run(|| committer.sync(vec![table.clone()]))
        .expect("sync");
    println!("== nft list table ip nodelb (in the node namespace)");
    print!("{}", list_table(&topo.node, "ip", "nodelb").expect("list"));
}
