//! Session affinity: ClientIP keeps a client on its endpoint.

use super::*;

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

#[test]
fn client_ip_affinity_keeps_a_client_on_its_endpoint() {
    let p = World::new()
        .service(sticky_web(Some(60)))
        .slice(web_slice("web-1", &["198.51.100.10", "198.51.100.11"]))
        .plan();
    assert_eq!(p.port("default/web", IpFamily::V4), &forwards(2));
    let t = p.v4();
    // Each endpoint remembers its clients for the timeout, in a set of its own...
    for ep in ["198.51.100.10-8080", "198.51.100.11-8080"] {
        let set = set_block(&t, &format!("affinity-default/web-tcp-80-{ep}"));
        assert!(
            set.contains("type ipv4_addr\n\t\tflags dynamic,timeout\n\t\ttimeout 1m\n\t\tcomment \"default/web:http\""),
            "{set}"
        );
        // ...filled by the endpoint's chain before it DNATs (two rules: a full set must not
        // stop the DNAT).
        let chain = chain_block(&t, &format!("ep-default/web-tcp-80-{ep}"));
        let addr = ep.replace("-", ":");
        assert!(
            chain.contains(&format!("update @affinity-default/web-tcp-80-{ep} {{ ip saddr timeout 1m }} comment \"default/web:http\"\n\t\tmeta l4proto tcp dnat to {addr} comment \"default/web:http\"")),
            "{chain}"
        );
    }
    // The Service port's chain sends a client an endpoint remembers to that endpoint, before
    // it picks one at random for the others: the first with chance 1/2, else the second.
    let svc = chain_block(&t, "svc-default/web-tcp-80");
    let rules: Vec<&str> = svc.lines().map(str::trim).collect();
    let ep = |h: u8| format!("ep-default/web-tcp-80-198.51.100.{h}-8080");
    let set = |h: u8| format!("affinity-default/web-tcp-80-198.51.100.{h}-8080");
    let note = "comment \"default/web:http\"";
    let counted = "counter packets 0 bytes 0";
    assert_eq!(
        rules[1..5],
        [
            format!("ip saddr @{} {counted} goto {} {note}", set(10), ep(10)),
            format!("ip saddr @{} {counted} goto {} {note}", set(11), ep(11)),
            format!("numgen random mod 2 0 {counted} goto {} {note}", ep(10)),
            format!("{counted} goto {} {note}", ep(11)),
        ],
        "{svc}"
    );
    // Not the shared DNAT of Services without affinity.
    assert!(!t.contains("chain endpoints-2"), "{t}");
    assert!(!set_block(&t, "endpoints").contains("198.51.100.10"), "{t}");
    // Masquerading and hairpin as for any Service.
    assert!(
        set_block(&t, "hairpin").contains("198.51.100.10 . 198.51.100.10"),
        "{t}"
    );
    assert!(
        set_block(&t, "masq-services").contains("203.0.113.1 . tcp . 80"),
        "{t}"
    );
}

#[test]
fn a_plain_service_port_dispatches_straight_to_the_shared_endpoint_chain() {
    // No source ranges, no affinity, endpoints to forward to: no chain of its own, under
    // either policy; its counter object and counter-map element stay.
    for policy in ["Cluster", "Local"] {
        let t = World::new()
            .service(web().spec("externalTrafficPolicy", policy))
            .slice(web_slice(
                "web-1",
                &["198.51.100.10 node-a", "198.51.100.11 node-a"],
            ))
            .plan()
            .v4();
        let dispatch = set_block(&t, "services");
        assert!(
            dispatch
                .contains("203.0.113.1 . tcp . 80 comment \"default/web:http\" : goto endpoints-2"),
            "{policy}: {t}"
        );
        assert!(!t.contains("chain svc-"), "{policy}: {t}");
        assert!(t.contains("counter svc/default/web/http"), "{policy}: {t}");
        assert!(
            set_block(&t, "svc-counters").contains(": \"svc/default/web/http\""),
            "{policy}: {t}"
        );
    }
    // With source ranges the port keeps its chain: the check comes before the pick.
    let t = World::new()
        .service(web().spec("loadBalancerSourceRanges", json!(["192.0.2.0/24"])))
        .slice(web_slice("web-1", &["198.51.100.10", "198.51.100.11"]))
        .plan()
        .v4();
    assert!(
        set_block(&t, "services").contains(": goto svc-default/web-tcp-80"),
        "{t}"
    );
    assert!(
        chain_block(&t, "svc-default/web-tcp-80").contains("goto endpoints-2"),
        "{t}"
    );
}

#[test]
fn services_without_affinity_keep_the_shared_endpoint_chains() {
    let plain = World::new()
        .service(web())
        .slice(web_slice("web-1", &["198.51.100.10", "198.51.100.11"]));
    let none = World::new()
        .service(web().spec("sessionAffinity", "None"))
        .slice(web_slice("web-1", &["198.51.100.10", "198.51.100.11"]));
    let t = plain.plan().v4();
    // `None` said aloud changes nothing, and no affinity object appears.
    assert_eq!(t, none.plan().v4());
    for absent in ["affinity", "ep-default", "dynamic"] {
        assert!(!t.contains(absent), "{absent} in\n{t}");
    }
    assert!(
        set_block(&t, "services").contains(": goto endpoints-2"),
        "{t}"
    );
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
        )
        .plan()
        .v4();
    assert!(
        set_block(&mixed, "services")
            .contains("tcp . 80 comment \"default/web:http\" : goto endpoints-2"),
        "{mixed}"
    );
    assert!(!mixed.contains("chain svc-default/web-tcp-80"), "{mixed}");
    assert_eq!(
        chain_block(&mixed, "endpoints-2"),
        chain_block(&t, "endpoints-2")
    );
    assert!(
        chain_block(&mixed, "svc-default/sticky-tcp-81")
            .contains("numgen random mod 2 0 counter packets 0 bytes 0 goto ep-default/sticky-tcp-81-198.51.100.20-8080"),
        "{mixed}"
    );
}

#[test]
fn affinity_timeout_defaults_to_three_hours_and_bad_values_are_warned_about() {
    let timeout_of = |w: World| {
        let p = w.slice(web_slice("web-1", &["198.51.100.10"])).plan();
        let set = set_block(&p.v4(), "affinity-default/web-tcp-80-198.51.100.10-8080");
        let line = set
            .lines()
            .find(|l| l.contains("timeout ") && !l.contains("flags"));
        (line.unwrap_or_default().trim().to_string(), p)
    };
    let (t, p) = timeout_of(World::new().service(sticky_web(None)));
    assert_eq!(t, "timeout 3h");
    assert!(p.warnings.is_empty(), "{:?}", p.warnings);
    let (t, _) = timeout_of(World::new().service(sticky_web(Some(86_400))));
    assert_eq!(t, "timeout 1d");
    for bad in [0, -5, 86_401] {
        let (t, p) = timeout_of(World::new().service(sticky_web(Some(bad))));
        assert_eq!(t, "timeout 3h", "{bad}");
        assert!(
            p.warned(&format!(
                "sessionAffinityConfig.clientIP.timeoutSeconds {bad} is not 1-86400; using 10800"
            )),
            "{bad}: {:?}",
            p.warnings
        );
    }
    let p = World::new()
        .service(web().spec("sessionAffinity", "Sticky"))
        .slice(web_slice("web-1", &["198.51.100.10"]))
        .plan();
    assert!(p.warned("sessionAffinity \"Sticky\" is not None or ClientIP; no affinity"));
    assert!(!p.v4().contains("affinity"), "{}", p.v4());
}

#[test]
fn client_ip_affinity_in_both_families() {
    let p = World::new()
        .service(sticky_web(Some(10)).dual_stack())
        .slice(web_slice("web-1", &["198.51.100.10"]))
        .slice(v6_web_slice(
            "web-6",
            &["2001:db8:b::10".into(), "2001:db8:0:1::a".into()],
        ))
        .plan();
    assert_eq!(p.port("default/web", IpFamily::V6), &forwards(2));
    let t6 = p.text(IpFamily::V6);
    // IPv6 addresses name chains and sets with `.` for `:` (names hold no `:`).
    for ep in ["2001.db8.b..10-8080", "2001.db8.0.1..a-8080"] {
        let set = set_block(&t6, &format!("affinity-default/web-tcp-80-{ep}"));
        assert!(
            set.contains("type ipv6_addr\n\t\tflags dynamic,timeout\n\t\ttimeout 10s"),
            "{set}"
        );
        let chain = chain_block(&t6, &format!("ep-default/web-tcp-80-{ep}"));
        assert!(
            chain.contains(&format!(
                "update @affinity-default/web-tcp-80-{ep} {{ ip6 saddr timeout 10s }}"
            )),
            "{chain}"
        );
    }
    assert!(
        chain_block(&t6, "ep-default/web-tcp-80-2001.db8.b..10-8080")
            .contains("meta l4proto tcp dnat to [2001:db8:b::10]:8080"),
        "{t6}"
    );
    // One endpoint: nothing to draw.
    let v4 = chain_block(&p.v4(), "svc-default/web-tcp-80");
    assert!(!v4.contains("numgen"), "{v4}");
    let svc6 = chain_block(&t6, "svc-default/web-tcp-80");
    assert!(
        svc6.contains("numgen random mod 2 0 counter packets 0 bytes 0 goto ep-default/web-tcp-80-2001.db8.0.1..a-8080"),
        "{svc6}"
    );
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
    let p = World::new()
        .service(sticky_web(None).spec("externalTrafficPolicy", "Local"))
        .slice(web_slice("web-1", &["198.51.100.11 node-b"]))
        .plan();
    assert_eq!(
        p.port("default/web", IpFamily::V4),
        &PortResult::DropsNoLocalEndpoint { elsewhere: 1 }
    );
    let t = p.v4();
    let chain = chain_block(&t, "svc-default/web-tcp-80");
    let drop = chain
        .find("ip saddr != @local-addresses counter packets 0 bytes 0 drop comment \"default/web:http: Local policy, no endpoint on this node\"")
        .expect(&chain);
    let known = chain
        .find("ip saddr @affinity-default/web-tcp-80-198.51.100.11-8080")
        .expect(&chain);
    let pick = chain
        .find("\t\tcounter packets 0 bytes 0 goto ep-default/web-tcp-80-198.51.100.11-8080 comment \"default/web:http: Local policy, this node's own clients\"")
        .expect(&chain);
    assert!(drop < known && known < pick, "{chain}");
    assert!(!set_block(&t, "hairpin").contains("198.51.100.11"), "{t}");
}
