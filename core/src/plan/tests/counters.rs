//! Counters: every Service port's traffic counter, and the names that parse back to it.

use super::*;

#[test]
fn every_service_port_has_a_counter_reached_from_each_served_address() {
    use nodelb_netfilter::Hook;
    let w = World::new()
        .service(web())
        .slice(web_slice("web-1", &["198.51.100.10"]));
    let p = w.plan();
    let counter = &p.tables[0].counters["svc/default/web/http"];
    assert_eq!(counter.comment.as_deref(), Some("default/web:http"));
    // Every packet of a DNATed connection, on whichever hook it crosses: forwarded to an
    // endpoint elsewhere, sent by the node itself, or delivered to an endpoint on the host
    // (a host-network pod); its first packet and the later ones.
    let ep: SocketAddr = "198.51.100.10:8080".parse().unwrap();
    let mut on_host = w.local.clone();
    on_host.insert(ep.ip());
    for (packet, host, hook) in [
        (to_web(), &w.local, Hook::Forward),
        (from_node(NODE_V4), &w.local, Hook::Output),
        (to_web(), &on_host, Hook::Input),
        (
            to_web().established().dnatted_to(ep),
            &w.local,
            Hook::Forward,
        ),
    ] {
        let out = traced(&p.tables, host, packet.clone());
        assert!(out.accepted(), "{packet}: {out}");
        for o in &out {
            assert!(o.hooks.contains(&hook), "{packet}: {o}");
            let counted: Vec<&str> = o.counters.iter().map(String::as_str).collect();
            assert_eq!(counted, ["svc/default/web/http"], "{packet}: {o}");
        }
    }
}

#[test]
fn a_port_keeps_its_counter_whatever_it_does() {
    let reject = World::new().service(web()).plan();
    let forward = World::new()
        .service(web())
        .slice(web_slice("web-1", &["198.51.100.10"]))
        .plan();
    let counters = |p: &Plan| {
        let t = &p.tables[0];
        (t.counters.clone(), t.sets["svc-counters"].elements.clone())
    };
    assert_eq!(counters(&reject), counters(&forward));
    assert_eq!(counters(&reject).0.len(), 1);
}

#[test]
fn counter_names_parse_back_to_their_service_port() {
    use crate::plan::table::{counter_name, parse_counter_name, CounterKind};
    use crate::vocab::ServicePortId;
    let key = ServiceKey::new("1team", "web");
    let port = ServicePortId {
        name: Some("http".into()),
        protocol: Protocol::Tcp,
        port: 80,
    };
    let n = counter_name(CounterKind::SourceRangeDrops, &key, &port);
    assert_eq!(n, "drops/1team/web/http");
    assert_eq!(
        parse_counter_name(&n),
        Some((CounterKind::SourceRangeDrops, "1team", "web", "http"))
    );
    let unnamed = ServicePortId { name: None, ..port };
    assert_eq!(
        parse_counter_name(&counter_name(CounterKind::Traffic, &key, &unnamed)),
        Some((CounterKind::Traffic, "1team", "web", "80"))
    );
    for foreign in ["alien", "svc/a/b", "svc/a/b/c/d", "svc//b/c", "quota/a/b/c"] {
        assert_eq!(parse_counter_name(foreign), None, "{foreign}");
    }
}
