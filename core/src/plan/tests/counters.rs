//! Counters: every Service port's traffic counter, and the names that parse back to it.

use super::*;

#[test]
fn every_service_port_has_a_counter_reached_from_each_served_address() {
    let p = World::new()
        .service(web())
        .slice(web_slice("web-1", &["198.51.100.10"]))
        .plan();
    let v4 = p.v4();
    assert!(
        v4.contains("counter svc/default/web/http {\n\t\tcomment \"default/web:http\"\n\t\tpackets 0 bytes 0\n\t}"),
        "{v4}"
    );
    let map = set_block(&v4, "svc-counters");
    assert!(
        map.contains("type ipv4_addr . inet_proto . inet_service : counter"),
        "{map}"
    );
    assert!(
        map.contains(
            "203.0.113.1 . tcp . 80 comment \"default/web:http\" : \"svc/default/web/http\""
        ),
        "{map}"
    );
    // Both directions of every DNATed connection, on whichever hook the packet crosses.
    for chain in ["forward", "input", "filter-output"] {
        let c = chain_block(&v4, chain);
        assert!(
            c.contains("meta l4proto tcp ct status dnat counter name ct original ip daddr . meta l4proto . ct original proto-dst map @svc-counters"),
            "{chain}: {c}"
        );
    }
    // Counted before `forward` accepts, and before the rejects of `input`.
    let fwd = chain_block(&v4, "forward");
    assert!(fwd.find("map @svc-counters").unwrap() < fwd.find("@lb-services accept").unwrap());
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
