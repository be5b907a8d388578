//! Session affinity: ClientIP keeps a client on its endpoint.

use super::*;
use crate::plan::table::affinity_set;
use crate::vocab::ServicePortId;
use nodelb_netfilter::{Expr, Payload, SetType, Stmt, TableRef, Value, Verdict};
use std::time::Duration;

/// `default/web` with `sessionAffinity: ClientIP` and the given timeout (none: the default).
fn sticky_web(timeout: Option<i64>) -> Svc {
    let web = web().spec("sessionAffinity", "ClientIP");
    match timeout {
        Some(t) => web.spec(
            "sessionAffinityConfig",
            json!({"clientIP": {"timeoutSeconds": t}}),
        ),
        None => web,
    }
}

/// The sets a way wrote its client into.
fn learned_in(o: &Outcome) -> Vec<&str> {
    o.learned.iter().map(|l| l.set.as_str()).collect()
}

/// The key of a port's affinity set: client, slot.
fn client_key(saddr: Payload) -> SetType {
    SetType::Typeof(vec![Expr::Payload(saddr), Expr::random(1)])
}

/// What a port's affinity set holds for a client kept on slot `slot`.
fn kept(client: &str, slot: u32) -> [Value; 2] {
    let client: IpAddr = client.parse().unwrap();
    [Value::from(client), Value::U32(slot)]
}

/// The affinity set of TCP port `port` (named `http`) of `default/<service>`.
fn set_of(service: &str, port: u16) -> String {
    let port = ServicePortId {
        name: Some("http".into()),
        protocol: Protocol::Tcp,
        port,
    };
    affinity_set(&ServiceKey::new("default", service), &port)
}

/// `default/web`'s port 80: its chain and its affinity set.
const WEB_CHAIN: &str = "svc-default/web-tcp-80";
fn web_set() -> String {
    set_of("web", 80)
}

/// The affinity set `set` of `t`: how long it remembers a client, and of which type.
fn remembers(t: &Table, set: &str) -> (Option<Duration>, SetType) {
    let s = t.sets.get(set).unwrap_or_else(|| panic!("no set {set}"));
    (s.timeout, s.key.clone())
}

#[test]
fn client_ip_affinity_keeps_a_client_on_its_endpoint() {
    let w = World::new()
        .service(sticky_web(Some(60)))
        .slice(web_slice("web-1", &["198.51.100.10", "198.51.100.11"]));
    let p = w.plan();
    assert_eq!(p.port("default/web", IpFamily::V4), &forwards(2));
    let t = &p.tables[0];
    let ep = |h: u8| {
        format!("198.51.100.{h}:8080")
            .parse::<SocketAddr>()
            .unwrap()
    };
    // A new client is drawn to either endpoint, 1/2 each, masqueraded as for any Cluster
    // Service, in the port's own chain, then the shared chain of its slot (the endpoint's index
    // in the endpoint map), which the port's own set remembers for the client.
    let mut tracer = Tracer::new(&p.tables).host(w.local.iter().copied());
    let first = tracer.trace(&to_web()).unwrap();
    assert_eq!(
        first.endpoints(),
        BTreeSet::from([ep(10), ep(11)]),
        "{first}"
    );
    assert!(first.masqueraded(), "{first}");
    for h in [10, 11] {
        assert_eq!(first.chance_of(ep(h)), Chance::of(1, 2), "{first}");
        let way = first.to(ep(h)).unwrap();
        let slot = u32::from(h - 10);
        let path = ["prerouting", WEB_CHAIN, &format!("slot-{slot}")];
        assert_eq!(chains(way)[..3], path, "{way}");
        assert_eq!(learned_in(way), [web_set()], "{way}");
        assert_eq!(way.learned[0].key, kept(CLIENT, slot)[..], "{way}");
    }
    // The set remembers each client for the timeout.
    assert_eq!(
        remembers(t, &web_set()),
        (Some(Duration::from_secs(60)), client_key(Payload::IpSaddr))
    );
    // The chain's last rule picks an endpoint without remembering: a full set must not stop
    // the DNAT (the tracer does not model a full set).
    let last = t.chains[WEB_CHAIN].rules.last().unwrap();
    assert_eq!(
        last.stmts,
        [Stmt::Verdict(Verdict::Goto("endpoints-2".into()))],
        "{last:?}"
    );
    // A client the second endpoint remembers goes there, and is remembered again; another
    // client is drawn anew.
    tracer.learn(first.to(ep(11)).unwrap());
    let again = tracer.trace(&to_web()).unwrap();
    assert_eq!(again.endpoints(), BTreeSet::from([ep(11)]), "{again}");
    assert!(again.masqueraded(), "{again}");
    assert!(
        again.iter().all(|o| learned_in(o) == [web_set()]),
        "{again}"
    );
    let other = tracer
        .trace(&Packet::tcp("203.0.113.8", NODE_V4, 80))
        .unwrap();
    assert_eq!(
        other.endpoints(),
        BTreeSet::from([ep(10), ep(11)]),
        "{other}"
    );
    // The endpoint itself is masqueraded back to itself (hairpin), as for any Service.
    let hairpin = w.trace(Packet::tcp("198.51.100.10", NODE_V4, 80));
    assert!(hairpin.masqueraded(), "{hairpin}");
}

#[test]
fn a_plain_service_port_dispatches_straight_to_the_shared_endpoint_chain() {
    // No source ranges, no affinity, endpoints to forward to: no chain of its own, under
    // either policy; it is still counted in its counter.
    for policy in ["Cluster", "Local"] {
        let w = World::new()
            .service(web().spec("externalTrafficPolicy", policy))
            .slice(web_slice(
                "web-1",
                &["198.51.100.10 node-a", "198.51.100.11 node-a"],
            ));
        let out = w.trace(to_web());
        assert_eq!(out.endpoints().len(), 2, "{policy}: {out}");
        for o in &out {
            assert_eq!(
                chains(o)[..2],
                ["prerouting", "endpoints-2"],
                "{policy}: {o}"
            );
        }
        assert_eq!(
            out.counters(),
            BTreeSet::from(["svc/default/web/http"]),
            "{policy}: {out}"
        );
    }
    // With source ranges the port keeps its chain: the check comes before the pick.
    let w = World::new()
        .service(web().spec("loadBalancerSourceRanges", json!(["192.0.2.0/24"])))
        .slice(web_slice("web-1", &["198.51.100.10", "198.51.100.11"]));
    let out = w.trace(Packet::tcp("192.0.2.9", NODE_V4, 80));
    assert_eq!(out.endpoints().len(), 2, "{out}");
    for o in &out {
        let path = ["prerouting", "svc-default/web-tcp-80", "endpoints-2"];
        assert_eq!(chains(o)[..3], path, "{o}");
    }
}

#[test]
fn services_without_affinity_keep_the_shared_endpoint_chains() {
    let plain = World::new()
        .service(web())
        .slice(web_slice("web-1", &["198.51.100.10", "198.51.100.11"]));
    let none = World::new()
        .service(web().spec("sessionAffinity", "None"))
        .slice(web_slice("web-1", &["198.51.100.10", "198.51.100.11"]));
    let t = plain.plan().tables;
    // `None` said aloud changes nothing, and no set learns from packets.
    assert_eq!(t, none.plan().tables);
    assert!(t[0].sets.values().all(|s| !s.is_dynamic()));
    let out = plain.trace(to_web());
    assert_eq!(out.endpoints().len(), 2, "{out}");
    for o in &out {
        assert_eq!(chains(o)[..2], ["prerouting", "endpoints-2"], "{o}");
        assert!(o.learned.is_empty(), "{o}");
    }
    // Beside an affinity Service, a plain one keeps that shape.
    let mixed = plain
        .service(
            Svc::lb("default", "sticky")
                .created("2024-01-01T00:00:00Z")
                .port("http", 81, "TCP")
                .spec("sessionAffinity", "ClientIP"),
        )
        .slice(
            Slice::ipv4("default", "sticky-1", "sticky")
                .port("http", 8080, "TCP")
                .endpoints(["198.51.100.20", "198.51.100.21"]),
        );
    assert_eq!(mixed.trace(to_web()), out);
    assert_eq!(
        mixed.plan().tables[0].chains["endpoints-2"],
        t[0].chains["endpoints-2"]
    );
    let sticky = mixed.trace(Packet::tcp(CLIENT, NODE_V4, 81));
    let first: SocketAddr = "198.51.100.20:8080".parse().unwrap();
    assert_eq!(sticky.chance_of(first), Chance::of(1, 2), "{sticky}");
    let path = ["prerouting", "svc-default/sticky-tcp-81", "slot-0"];
    assert_eq!(chains(sticky.to(first).unwrap())[..3], path, "{sticky}");
}

#[test]
fn affinity_timeout_defaults_to_three_hours_and_bad_values_are_warned_about() {
    let timeout_of = |w: World| {
        let p = w.slice(web_slice("web-1", &["198.51.100.10"])).plan();
        let mut sets = p.tables[0].sets.values().filter(|s| s.is_dynamic());
        let set = sets.next().expect("a set of clients");
        assert!(sets.next().is_none());
        let t = set.timeout.map(|t| t.as_secs());
        assert_eq!(set.name, web_set());
        (t, p)
    };
    let (t, p) = timeout_of(World::new().service(sticky_web(None)));
    assert_eq!(t, Some(3 * 3600));
    assert!(p.warnings.is_empty(), "{:?}", p.warnings);
    let (t, _) = timeout_of(World::new().service(sticky_web(Some(86_400))));
    assert_eq!(t, Some(86_400));
    for bad in [0, -5, 86_401] {
        let (t, p) = timeout_of(World::new().service(sticky_web(Some(bad))));
        assert_eq!(t, Some(3 * 3600), "{bad}");
        assert!(
            p.warned(&format!(
                "sessionAffinityConfig.clientIP.timeoutSeconds {bad} is not 1-86400; using 10800"
            )),
            "{bad}: {:?}",
            p.warnings
        );
    }
    let w = World::new()
        .service(web().spec("sessionAffinity", "Sticky"))
        .slice(web_slice("web-1", &["198.51.100.10"]));
    let p = w.plan();
    assert!(p.warned("sessionAffinity \"Sticky\" is not None or ClientIP; no affinity"));
    let out = w.trace(to_web());
    assert_eq!(out.endpoints(), eps(&["198.51.100.10:8080"]), "{out}");
    for o in &out {
        assert_eq!(chains(o)[..2], ["prerouting", "endpoints-1"], "{o}");
        assert!(o.learned.is_empty(), "{o}");
    }
}

#[test]
fn client_ip_affinity_in_both_families() {
    let w = World::new()
        .service(sticky_web(Some(10)).dual_stack())
        .slice(web_slice("web-1", &["198.51.100.10"]))
        .slice(v6_web_slice(
            "web-6",
            &["2001:db8:b::10".into(), "2001:db8:0:1::a".into()],
        ));
    let p = w.plan();
    assert_eq!(p.port("default/web", IpFamily::V6), &forwards(2));
    let t6 = &p.tables[1];
    let mut tracer = Tracer::new(&p.tables).host(w.local.iter().copied());
    let first = tracer.trace(&to_web6()).unwrap();
    for e in ["[2001:db8:b::10]:8080", "[2001:db8:0:1::a]:8080"] {
        let e: SocketAddr = e.parse().unwrap();
        assert_eq!(first.chance_of(e), Chance::of(1, 2), "{first}");
        let way = first.to(e).unwrap();
        assert_eq!(learned_in(way), [web_set()], "{way}");
        assert_eq!(chains(way)[1], WEB_CHAIN);
    }
    assert_eq!(
        remembers(t6, &web_set()),
        (Some(Duration::from_secs(10)), client_key(Payload::Ip6Saddr))
    );
    let stays: SocketAddr = "[2001:db8:0:1::a]:8080".parse().unwrap();
    tracer.learn(first.to(stays).unwrap());
    let again = tracer.trace(&to_web6()).unwrap();
    assert_eq!(again.endpoints(), BTreeSet::from([stays]), "{again}");
    // One endpoint in IPv4: nothing to draw, and it remembers the client all the same.
    let out = w.trace(to_web());
    assert_eq!(out.len(), 1, "{out}");
    assert_eq!(
        out.chance_of("198.51.100.10:8080".parse().unwrap()),
        Chance::CERTAIN
    );
    assert!(out.iter().all(|o| learned_in(o) == [web_set()]), "{out}");
}

#[test]
fn local_policy_affinity_without_local_endpoint_serves_only_the_nodes_own_clients() {
    let w = World::new()
        .service(sticky_web(None).spec("externalTrafficPolicy", "Local"))
        .slice(web_slice("web-1", &["198.51.100.11 node-b"]));
    let p = w.plan();
    assert_eq!(
        p.port("default/web", IpFamily::V4),
        &PortResult::DropsNoLocalEndpoint { elsewhere: 1 }
    );
    let set = &web_set();
    let mut tracer = Tracer::new(&p.tables).host(w.local.iter().copied());
    // Outside clients are dropped, even one the endpoint's set remembers (the drop comes
    // first), and so is the endpoint itself (no hairpin to an endpoint elsewhere).
    tracer.knows(&TableRef::of(&p.tables[0]), set, kept(CLIENT, 0));
    for from in [CLIENT, "198.51.100.11"] {
        let out = tracer.trace(&Packet::tcp(from, NODE_V4, 80)).unwrap();
        assert!(out.dropped(), "{from}: {out}");
    }
    // The node's own clients reach the endpoint elsewhere, masqueraded, and are remembered;
    // remembered, they go on reaching it.
    let own = tracer.trace(&from_node(NODE_V4)).unwrap();
    assert_eq!(own.endpoints(), eps(&["198.51.100.11:8080"]), "{own}");
    assert!(own.masqueraded(), "{own}");
    assert!(own.iter().all(|o| learned_in(o) == [set]), "{own}");
    tracer.learn(own.iter().next().unwrap());
    let again = tracer.trace(&from_node(NODE_V4)).unwrap();
    assert_eq!(again.endpoints(), eps(&["198.51.100.11:8080"]), "{again}");
    assert!(again.masqueraded(), "{again}");
}
