//! Session affinity: ClientIP keeps a client on its endpoint.

use super::*;
use nodelb_netfilter::{DataType, Rule, SetType, Stmt, TableRef, Value};
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
    let chain = |h: u8| format!("ep-default/web-tcp-80-198.51.100.{h}-8080");
    let set = |h: u8| format!("affinity-default/web-tcp-80-198.51.100.{h}-8080");
    // A new client is drawn to either endpoint, 1/2 each, masqueraded as for any Cluster
    // Service, through the Service port's chain and the endpoint's own (not the shared
    // DNAT of Services without affinity); the endpoint's set learns the client as it goes.
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
        assert_eq!(
            chains(way)[..3],
            ["prerouting", "svc-default/web-tcp-80", &chain(h)],
            "{way}"
        );
        assert_eq!(learned_in(way), [set(h)], "{way}");
        // Each endpoint remembers its clients for the timeout, in a set of its own.
        let v4 = SetType::Type(vec![DataType::Ipv4Addr]);
        assert_eq!(remembers(t, &set(h)), (Some(Duration::from_secs(60)), v4));
        // The set is filled by a rule of its own before the DNAT's: a full set must not
        // stop the DNAT (the tracer does not model a full set).
        let rules = &t.chains[&chain(h)].rules;
        let update = |r: &Rule| r.stmts.iter().any(|s| matches!(s, Stmt::SetUpdate { .. }));
        let dnat = |r: &Rule| r.stmts.iter().any(|s| matches!(s, Stmt::Nat { .. }));
        assert!(rules.len() == 2 && update(&rules[0]) && dnat(&rules[1]) && !dnat(&rules[0]));
    }
    // A client the second endpoint remembers goes there, and is remembered again; another
    // client is drawn anew.
    tracer.learn(first.to(ep(11)).unwrap());
    let again = tracer.trace(&to_web()).unwrap();
    assert_eq!(again.endpoints(), BTreeSet::from([ep(11)]), "{again}");
    assert!(again.masqueraded(), "{again}");
    assert!(again.iter().all(|o| learned_in(o) == [set(11)]), "{again}");
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
    let path = [
        "prerouting",
        "svc-default/sticky-tcp-81",
        "ep-default/sticky-tcp-81-198.51.100.20-8080",
    ];
    assert_eq!(chains(sticky.to(first).unwrap())[..3], path, "{sticky}");
}

#[test]
fn affinity_timeout_defaults_to_three_hours_and_bad_values_are_warned_about() {
    let timeout_of = |w: World| {
        let p = w.slice(web_slice("web-1", &["198.51.100.10"])).plan();
        let set = &p.tables[0].sets["affinity-default/web-tcp-80-198.51.100.10-8080"];
        (set.timeout.map(|t| t.as_secs()), p)
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
    // IPv6 addresses name chains and sets with `.` for `:` (names hold no `:`).
    let t6 = &p.tables[1];
    let mut tracer = Tracer::new(&p.tables).host(w.local.iter().copied());
    let first = tracer.trace(&to_web6()).unwrap();
    let v6 = SetType::Type(vec![DataType::Ipv6Addr]);
    for (e, name) in [
        ("[2001:db8:b::10]:8080", "2001.db8.b..10-8080"),
        ("[2001:db8:0:1::a]:8080", "2001.db8.0.1..a-8080"),
    ] {
        let e: SocketAddr = e.parse().unwrap();
        assert_eq!(first.chance_of(e), Chance::of(1, 2), "{first}");
        let way = first.to(e).unwrap();
        let set = format!("affinity-default/web-tcp-80-{name}");
        assert_eq!(learned_in(way), [set.as_str()], "{way}");
        assert_eq!(chains(way)[2], format!("ep-default/web-tcp-80-{name}"));
        assert_eq!(
            remembers(t6, &set),
            (Some(Duration::from_secs(10)), v6.clone())
        );
    }
    let kept: SocketAddr = "[2001:db8:0:1::a]:8080".parse().unwrap();
    tracer.learn(first.to(kept).unwrap());
    let again = tracer.trace(&to_web6()).unwrap();
    assert_eq!(again.endpoints(), BTreeSet::from([kept]), "{again}");
    // One endpoint in IPv4: nothing to draw, and it remembers the client all the same.
    let out = w.trace(to_web());
    assert_eq!(out.len(), 1, "{out}");
    assert_eq!(
        out.chance_of("198.51.100.10:8080".parse().unwrap()),
        Chance::CERTAIN
    );
    let set = "affinity-default/web-tcp-80-198.51.100.10-8080";
    assert!(out.iter().all(|o| learned_in(o) == [set]), "{out}");
}

#[test]
fn endpoint_names_never_read_the_same_for_two_addresses() {
    use crate::plan::endpoints::EndpointAddr;
    use crate::plan::table::affinity_set;
    let key = ServiceKey::new("default", "web");
    let port = crate::vocab::ServicePortId {
        name: None,
        protocol: Protocol::Tcp,
        port: 80,
    };
    let name = |a: &str| {
        affinity_set(
            &key,
            &port,
            &EndpointAddr {
                addr: a.parse().unwrap(),
                port: 8080,
            },
        )
    };
    // An IPv4-mapped address has no dotted tail that another address could also spell.
    assert_ne!(name("::ffff:1.2.3.4"), name("::ffff:1:2:3:4"));
    assert_eq!(
        name("::ffff:1.2.3.4"),
        "affinity-default/web-tcp-80-..ffff.102.304-8080"
    );
    assert_eq!(
        name("2001:db8::"),
        "affinity-default/web-tcp-80-2001.db8..-8080"
    );
    assert_eq!(
        name("1:0:0:2:0:0:0:3"),
        "affinity-default/web-tcp-80-1.0.0.2..3-8080"
    );
    assert_eq!(
        name("1:2:3:4:5:6:7:8"),
        "affinity-default/web-tcp-80-1.2.3.4.5.6.7.8-8080"
    );
    assert_eq!(
        name("1:0:2:3:4:5:6:7"),
        "affinity-default/web-tcp-80-1.0.2.3.4.5.6.7-8080"
    );
    assert_eq!(
        name("192.0.2.7"),
        "affinity-default/web-tcp-80-192.0.2.7-8080"
    );
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
    let set = "affinity-default/web-tcp-80-198.51.100.11-8080";
    let mut tracer = Tracer::new(&p.tables).host(w.local.iter().copied());
    // Outside clients are dropped, even one the endpoint's set remembers (the drop comes
    // first), and so is the endpoint itself (no hairpin to an endpoint elsewhere).
    let client: IpAddr = CLIENT.parse().unwrap();
    tracer.knows(&TableRef::of(&p.tables[0]), set, [Value::from(client)]);
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
