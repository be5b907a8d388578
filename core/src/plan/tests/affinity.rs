//! Session affinity: ClientIP keeps a client on its endpoint.

use super::*;
use nodelb_netfilter::{Expr, L4Proto, MetaKey, Payload, SetType, Stmt, TableRef, Value};
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

/// The key of `affinity-T`: client, protocol, port, slot.
fn client_key(saddr: Payload) -> SetType {
    SetType::Typeof(vec![
        Expr::Payload(saddr),
        Expr::Meta(MetaKey::L4Proto),
        Expr::Payload(Payload::ThDport),
        Expr::random(1),
    ])
}

/// What `affinity-T` holds for a client of TCP port `port` kept on slot `slot`.
fn kept(client: &str, port: u16, slot: u32) -> [Value; 4] {
    let client: IpAddr = client.parse().unwrap();
    [
        Value::from(client),
        Value::Proto(L4Proto::Tcp),
        Value::Port(port),
        Value::U32(slot),
    ]
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
    // Service, through the chain every such port of two endpoints shares; the client's slot
    // (the endpoint's index in the endpoint map) is remembered in the set of its timeout.
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
        assert_eq!(chains(way)[..2], ["prerouting", "affinity-60-2"], "{way}");
        assert_eq!(learned_in(way), ["affinity-60"], "{way}");
        let slot = u32::from(h - 10);
        assert_eq!(way.learned[0].key, kept(CLIENT, 80, slot)[..], "{way}");
    }
    // The set remembers each client for the timeout.
    assert_eq!(
        remembers(t, "affinity-60"),
        (Some(Duration::from_secs(60)), client_key(Payload::IpSaddr))
    );
    // The chain's last rule DNATs without remembering: a full set must not stop the DNAT
    // (the tracer does not model a full set).
    let last = t.chains["affinity-60-2"].rules.last().unwrap();
    let update = last
        .stmts
        .iter()
        .any(|s| matches!(s, Stmt::SetUpdate { .. }));
    let dnat = last.stmts.iter().any(|s| matches!(s, Stmt::NatMap { .. }));
    assert!(dnat && !update, "{last:?}");
    // A client the second endpoint remembers goes there, and is remembered again; another
    // client is drawn anew.
    tracer.learn(first.to(ep(11)).unwrap());
    let again = tracer.trace(&to_web()).unwrap();
    assert_eq!(again.endpoints(), BTreeSet::from([ep(11)]), "{again}");
    assert!(again.masqueraded(), "{again}");
    assert!(
        again.iter().all(|o| learned_in(o) == ["affinity-60"]),
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
    let path = ["prerouting", "affinity-10800-2"];
    assert_eq!(chains(sticky.to(first).unwrap())[..2], path, "{sticky}");
}

#[test]
fn affinity_timeout_defaults_to_three_hours_and_bad_values_are_warned_about() {
    let timeout_of = |w: World| {
        let p = w.slice(web_slice("web-1", &["198.51.100.10"])).plan();
        let mut sets = p.tables[0].sets.values().filter(|s| s.is_dynamic());
        let set = sets.next().expect("a set of clients");
        assert!(sets.next().is_none());
        let t = set.timeout.map(|t| t.as_secs());
        assert_eq!(Some(set.name.clone()), t.map(|t| format!("affinity-{t}")));
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
        assert_eq!(learned_in(way), ["affinity-10"], "{way}");
        assert_eq!(chains(way)[1], "affinity-10-2");
    }
    assert_eq!(
        remembers(t6, "affinity-10"),
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
    assert!(
        out.iter().all(|o| learned_in(o) == ["affinity-10"]),
        "{out}"
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
    let set = "affinity-10800";
    let mut tracer = Tracer::new(&p.tables).host(w.local.iter().copied());
    // Outside clients are dropped, even one the endpoint's set remembers (the drop comes
    // first), and so is the endpoint itself (no hairpin to an endpoint elsewhere).
    tracer.knows(&TableRef::of(&p.tables[0]), set, kept(CLIENT, 80, 0));
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
