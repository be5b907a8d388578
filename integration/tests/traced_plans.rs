//! The planner's tables, traced: the golden fixtures (`fixtures/*.yaml`, planned for node-a,
//! 203.0.113.10 and 2001:db8:1::10, as `golden/*.nft` holds them) asked where a packet goes,
//! instead of read as text. Pure: no root, no kernel (`traced_dataplane.rs` checks the tracer
//! against the kernel).
//!
//! Run: `cargo test -p nodelb-integration --test traced_plans`.

use nodelb_integration::models::{inet_sink, kitchen_sink, Fam};
use nodelb_integration::planning::{plan_fixture, FIXTURE_ADDRESSES};
use nodelb_netfilter::trace::{Chance, Outcomes, Packet, Tracer};
use nodelb_netfilter::{L4Proto, Reject, Stmt, Table};
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

/// A matrix of packets for a sink of family `f`: sources in and out of its sets,
/// destinations dispatched or not, every protocol over a spread of ports; each new from a
/// link, new from the host (from the source ports its output chain accepts), established
/// with a mark, and new with a packet and a connection mark.
fn matrix(f: Fam) -> Vec<Packet> {
    let sources = [f.addr(0, 9), f.addr(2, 9), f.addr(1, 7), f.addr(1, 50)];
    let destinations = [f.addr(2, 1), f.addr(1, 9), f.addr(2, 5)];
    let protos = [(L4Proto::Tcp, 1), (L4Proto::Udp, 2), (L4Proto::Sctp, 3)];
    let ports = [80, 53, 8081, 5353, 9, 81, 22, 443, 444, 6443];
    let mut out = Vec::new();
    for src in sources {
        for dst in destinations {
            for (proto, sport) in protos {
                for port in ports {
                    let p = Packet::new(proto, src, dst, port);
                    out.push(p.clone().sport(sport).from_host());
                    out.push(p.clone().established().mark(0x10));
                    out.push(p.clone().mark(1).ct_mark(1));
                    out.push(p);
                }
            }
        }
    }
    out
}

/// A statement's kind, for coverage.
fn kind(s: &Stmt) -> String {
    format!("{s:?}")
        .split([' ', '(', '{'])
        .next()
        .unwrap_or_default()
        .to_string()
}

/// The kitchen sinks use every expression, statement and object kind the model has (as the
/// differential test lists them): traced over a matrix of packets, the tracer evaluates all it
/// reaches without an error, and every kind of statement is in a rule some packet matched but
/// three no packet can match there: `pick-2` and `sticky` (the set update) are reached from
/// no chain, `svc-counters` holds no destination the sinks DNAT to, and the `drops` counter
/// follows a drop of the same sources in prerouting. The planner's tables match all three
/// (`traced_dataplane.rs`, the tracer's unit tests).
#[test]
fn the_kitchen_sinks_trace_without_errors_and_every_statement_kind_matches() {
    let sinks = [
        (kitchen_sink(Fam::V4, "nodelb"), Fam::V4),
        (kitchen_sink(Fam::V6, "nodelb"), Fam::V6),
        (inet_sink("nodelb"), Fam::V4),
        (inet_sink("nodelb"), Fam::V6),
    ];
    let mut used: BTreeSet<String> = BTreeSet::new();
    let mut matched: BTreeSet<String> = BTreeSet::new();
    let mut traced = 0;
    for (t, f) in &sinks {
        let tracer = Tracer::new([t]).host([f.addr(2, 1)]);
        for c in t.chains.values() {
            used.extend(c.rules.iter().flat_map(|r| &r.stmts).map(kind));
        }
        for p in matrix(*f) {
            let out = trace(&tracer, p);
            traced += 1;
            for r in out.iter().flat_map(|o| &o.rules) {
                let rule = &t.chains[&r.chain].rules[r.index];
                matched.extend(rule.stmts.iter().map(kind));
            }
        }
    }
    let missing: Vec<&str> = used.difference(&matched).map(String::as_str).collect();
    let unreachable = ["CounterMap", "CounterRef", "SetUpdate"];
    assert_eq!(missing, unreachable, "no packet of {traced} matched these");
    assert!(used.len() >= 16, "the sinks use only {used:?}");
}
