//! The planner's tables, traced: the golden fixtures (`fixtures/*.yaml`, planned for node-a,
//! 203.0.113.10 and 2001:db8:1::10, as `golden/*.nft` holds them) asked where a packet goes,
//! instead of read as text. Pure: no root, no kernel (`traced_dataplane.rs` checks the tracer
//! against the kernel).
//!
//! Run: `cargo test -p nodelb-integration --test traced_plans`.

use nodelb_integration::planning::{plan_fixture, FIXTURE_ADDRESSES};
use nodelb_netfilter::trace::{Chance, Outcomes, Packet, Tracer};
use nodelb_netfilter::{Reject, Table};
use std::collections::BTreeSet;
use std::net::SocketAddr;

const NODE: &str = "203.0.113.10";
const NODE_V6: &str = "2001:db8:1::10";
const CLIENT: &str = "192.0.2.9";
const CLIENT_V6: &str = "2001:db8:9::9";

fn tables(fixture: &str) -> Vec<Table> {
    plan_fixture(fixture).tables
}

fn endpoints(list: &[&str]) -> BTreeSet<SocketAddr> {
    list.iter().map(|e| e.parse().unwrap()).collect()
}

fn trace(tracer: &Tracer<'_>, p: Packet) -> Outcomes {
    tracer.trace(&p).unwrap_or_else(|e| panic!("{p}: {e}"))
}

#[test]
fn a_cluster_service_spreads_clients_over_every_endpoint_masqueraded() {
    let t = tables("cluster-and-local");
    let tracer = Tracer::new(&t).host(FIXTURE_ADDRESSES);
    let out = trace(&tracer, Packet::tcp(CLIENT, NODE, 443));
    let web = endpoints(&[
        "198.51.100.11:8443",
        "198.51.100.12:8443",
        "198.51.100.14:8443",
    ]);
    assert_eq!(out.endpoints(), web, "{out}");
    assert!(out.accepted() && out.masqueraded(), "{out}");
    for e in &web {
        assert_eq!(out.chance_of(*e), Chance::of(1, 3), "{e}: {out}");
    }
    assert_eq!(
        out.counters(),
        BTreeSet::from(["svc/shop/web/https"]),
        "{out}"
    );
}

#[test]
fn a_local_service_keeps_the_client_and_without_a_local_endpoint_serves_only_the_node() {
    let t = tables("cluster-and-local");
    let tracer = Tracer::new(&t).host(FIXTURE_ADDRESSES);
    // infra/dns: Local, one endpoint here (the other, on node-b, is not used).
    let out = trace(&tracer, Packet::udp(CLIENT, NODE, 53));
    assert_eq!(out.endpoints(), endpoints(&["198.51.100.21:5353"]), "{out}");
    assert!(out.accepted() && !out.sometimes_masqueraded(), "{out}");
    // shop/api: Local, both endpoints elsewhere: outside clients are dropped...
    let out = trace(&tracer, Packet::tcp(CLIENT, NODE, 8000));
    assert!(out.dropped(), "{out}");
    // ...the node's own clients go to the endpoints elsewhere, masqueraded.
    let out = trace(&tracer, Packet::tcp(NODE, NODE, 8000).from_host());
    let api = endpoints(&["198.51.100.31:9000", "198.51.100.32:9000"]);
    assert_eq!(out.endpoints(), api, "{out}");
    assert!(out.masqueraded(), "{out}");
}

#[test]
fn a_remembered_client_keeps_its_endpoint_and_sources_outside_the_ranges_are_dropped() {
    let t = tables("session-affinity");
    let mut tracer = Tracer::new(&t).host(FIXTURE_ADDRESSES);
    for (client, node, cart) in [
        (CLIENT, NODE, ["198.51.100.31:8443", "198.51.100.32:8443"]),
        (
            CLIENT_V6,
            NODE_V6,
            ["[2001:db8:2::31]:8443", "[2001:db8:2::32]:8443"],
        ),
    ] {
        let first = trace(&tracer, Packet::tcp(client, node, 8443));
        assert_eq!(first.endpoints(), endpoints(&cart), "{first}");
        let kept: SocketAddr = cart[1].parse().unwrap();
        tracer.learn(first.to(kept).expect("a way to the second endpoint"));
        let again = trace(&tracer, Packet::tcp(client, node, 8443));
        assert_eq!(again.endpoints(), BTreeSet::from([kept]), "{again}");
    }
    // shop/catalog admits 192.0.2.0/24 only; others are dropped and counted.
    let out = trace(&tracer, Packet::tcp(CLIENT, NODE, 8081));
    assert_eq!(out.endpoints(), endpoints(&["198.51.100.51:8081"]), "{out}");
    let out = trace(&tracer, Packet::tcp("198.51.100.200", NODE, 8081));
    assert!(out.dropped(), "{out}");
    assert!(out.counters().contains("drops/shop/catalog/http"), "{out}");
}

#[test]
fn a_port_without_endpoints_refuses_new_connections_but_lets_replies_through() {
    let t = tables("protocols");
    let tracer = Tracer::new(&t).host(FIXTURE_ADDRESSES);
    let out = trace(&tracer, Packet::tcp(CLIENT, NODE, 81));
    assert_eq!(out.rejected(), Some(Reject::TcpReset), "{out}");
    let out = trace(&tracer, Packet::udp(CLIENT, NODE, 82));
    assert_eq!(out.rejected(), Some(Reject::PortUnreachable), "{out}");
    let out = trace(&tracer, Packet::tcp(NODE, NODE, 84).from_host());
    assert_eq!(out.rejected(), Some(Reject::TcpReset), "{out}");
    // A reply to the node's own connection whose source port happened to be 81.
    let reply = Packet::tcp(CLIENT, NODE, 81).sport(443).established();
    assert!(trace(&tracer, reply).delivered_to_host());
}
