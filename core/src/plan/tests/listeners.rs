//! Host listeners: a socket on the node holds its port against the Services.

use super::*;

/// A dual-stack LoadBalancer Service `default/<name>` on `ports` (name, port, protocol), with
/// one ready endpoint per family.
fn dual(w: World, name: &str, ports: &[(&str, u16, &str)]) -> World {
    let mut svc = Svc::lb("default", name)
        .created("2024-01-01T00:00:00Z")
        .dual_stack();
    for (n, p, proto) in ports {
        svc = svc.port(n, *p, proto);
    }
    let slice = |fam: &str, addr: &str| {
        let s = Slice::of("default", &format!("{name}-{fam}"), name, fam);
        let s = ports
            .iter()
            .fold(s, |s, (n, p, proto)| s.port(n, 10000 + p, proto));
        s.endpoint(addr)
    };
    w.service(svc)
        .slice(slice("IPv4", "198.51.100.10"))
        .slice(slice("IPv6", "2001:db8:b::10"))
}

const TCP_7000: &[(&str, u16, &str)] = &[("tcp", 7000, "TCP")];

fn held_by(spec: &str) -> PortResult {
    PortResult::HostListener {
        listener: listener(spec),
    }
}

#[test]
fn a_host_listener_on_the_wildcard_blocks_the_port() {
    let w = dual(World::new(), "web", TCP_7000).listener("TCP 0.0.0.0 7000 socat");
    let p = w.plan();
    assert_eq!(
        p.port("default/web", IpFamily::V4),
        &held_by("TCP 0.0.0.0 7000 socat")
    );
    assert!(
        !p.v4().contains("default/web"),
        "no rule, element or counter for the Service in IPv4:\n{}",
        p.v4()
    );
    assert_eq!(
        p.outcome("default/web").to_string(),
        "served: IPv4 [203.0.113.1] tcp/TCP/7000 no rules: in use on the node by socat on 0.0.0.0; IPv6 [2001:db8::1] tcp/TCP/7000 forwards to 1 endpoints;"
    );
    // The socket gets the Service's IPv4 traffic, untouched.
    let out = w.trace(Packet::tcp(CLIENT, NODE_V4, 7000));
    assert!(untouched(&out), "{out}");
    // An IPv4 wildcard socket is IPv4's only: the Service keeps IPv6.
    let out = w.trace(Packet::tcp(CLIENT_V6, NODE_V6, 7000));
    assert_eq!(out.endpoints(), eps(&["[2001:db8:b::10]:17000"]), "{out}");
    assert_eq!(p.port("default/web", IpFamily::V6), &forwards(1));
}

#[test]
fn a_listener_on_a_served_address_blocks_the_port() {
    let w = dual(World::new(), "web", TCP_7000)
        .listener(&format!("TCP {NODE_V4} 7000"))
        .listener(&format!("TCP {NODE_V6} 7000 nginx"));
    let p = w.plan();
    assert_eq!(
        p.port("default/web", IpFamily::V4),
        &held_by(&format!("TCP {NODE_V4} 7000"))
    );
    assert_eq!(
        p.port("default/web", IpFamily::V6),
        &held_by(&format!("TCP {NODE_V6} 7000 nginx"))
    );
    assert!(p.outcome("default/web").programmed_families().is_empty());
    for (client, node) in [(CLIENT, NODE_V4), (CLIENT_V6, NODE_V6)] {
        let out = w.trace(Packet::tcp(client, node, 7000));
        assert!(untouched(&out), "{out}");
    }
}

#[test]
fn a_listener_on_another_address_does_not_block() {
    // Loopback, and an address on the host that is not one of the Node's addresses: neither
    // receives traffic for the node's address.
    let w = dual(World::new(), "web", TCP_7000)
        .listener("TCP 127.0.0.1 7000 socat")
        .listener("TCP 192.0.2.254 7000 socat")
        .listener("TCP ::1 7000 socat")
        .listener("TCP 2001:db8::99 7000 socat");
    let p = w.plan();
    for f in [IpFamily::V4, IpFamily::V6] {
        assert_eq!(p.port("default/web", f), &forwards(1), "{f}");
    }
    let out = w.trace(Packet::tcp(CLIENT, NODE_V4, 7000));
    assert_eq!(out.endpoints(), eps(&["198.51.100.10:17000"]), "{out}");
    let out = w.trace(Packet::tcp(CLIENT_V6, NODE_V6, 7000));
    assert_eq!(out.endpoints(), eps(&["[2001:db8:b::10]:17000"]), "{out}");
}

#[test]
fn a_udp_listener_does_not_block_tcp() {
    let w = World::new()
        .service(
            Svc::lb("default", "tcp")
                .created("2024-01-01T00:00:00Z")
                .raw_port(json!({"port": 53, "protocol": "TCP"})),
        )
        .service(
            Svc::lb("default", "udp")
                .created("2024-01-01T00:00:00Z")
                .raw_port(json!({"port": 53, "protocol": "UDP"})),
        )
        .listener("UDP 0.0.0.0 53 dnsmasq");
    let p = w.plan();
    assert_eq!(
        p.port("default/tcp", IpFamily::V4),
        &PortResult::RejectsNoEndpoints
    );
    assert_eq!(
        p.port("default/udp", IpFamily::V4),
        &held_by("UDP 0.0.0.0 53 dnsmasq")
    );
    let out = w.trace(Packet::tcp(CLIENT, NODE_V4, 53));
    assert_eq!(out.rejected(), Some(Reject::TcpReset), "{out}");
    let out = w.trace(Packet::udp(CLIENT, NODE_V4, 53));
    assert!(untouched(&out), "{out}");
}

#[test]
fn a_dual_stack_wildcard_listener_blocks_both_families() {
    // The host reports an IPv6 wildcard socket without IPV6_V6ONLY as `::` and `0.0.0.0`;
    // one with it as `::` alone.
    let p = dual(World::new(), "web", TCP_7000)
        .listener("TCP :: 7000 java")
        .listener("TCP 0.0.0.0 7000 java")
        .plan();
    assert!(p.outcome("default/web").programmed_families().is_empty());
    let p = dual(World::new(), "web", TCP_7000)
        .listener("TCP :: 7000 java")
        .plan();
    assert_eq!(
        p.outcome("default/web").programmed_families(),
        vec![IpFamily::V4],
        "a v6-only socket leaves IPv4 to the Service"
    );
}

#[test]
fn a_held_port_withholds_the_services_other_ports_in_that_family() {
    let w = dual(
        World::new(),
        "web",
        &[("tcp", 7000, "TCP"), ("udp", 7001, "UDP")],
    )
    .listener("TCP 0.0.0.0 7000 socat");
    let p = w.plan();
    let v4 = p.outcome("default/web").ports(IpFamily::V4).unwrap();
    assert_eq!(v4[0].result, held_by("TCP 0.0.0.0 7000 socat"));
    assert_eq!(
        v4[1].result,
        PortResult::Withheld {
            lost: v4[0].port.clone(),
            holder: PortHolder::Listener(listener("TCP 0.0.0.0 7000 socat")),
        },
        "UDP 7001 is free, but the Service gets nothing in IPv4"
    );
    assert_eq!(
        v4[1].result.to_string(),
        "no rules: 7000/TCP held by socat on 0.0.0.0, on the node (all or nothing)"
    );
    assert!(
        !p.v4().contains("default/web"),
        "no rule, element or counter:\n{}",
        p.v4()
    );
    let tcp = |client, node| Packet::tcp(client, node, 7000);
    let udp = |client, node| Packet::udp(client, node, 7001);
    for packet in [tcp(CLIENT, NODE_V4), udp(CLIENT, NODE_V4)] {
        let out = w.trace(packet.clone());
        assert!(untouched(&out), "{packet}: {out}");
    }
    let out = w.trace(udp(CLIENT_V6, NODE_V6));
    assert_eq!(out.endpoints(), eps(&["[2001:db8:b::10]:17001"]), "{out}");
}

#[test]
fn a_host_listener_wins_over_the_oldest_service() {
    let w = World::new()
        .service(
            Svc::lb("default", "old")
                .created("2023-01-01T00:00:00Z")
                .bare_port(7000),
        )
        .service(
            Svc::lb("default", "new")
                .created("2024-01-01T00:00:00Z")
                .bare_port(7000),
        )
        .listener("TCP 0.0.0.0 7000 socat");
    let p = w.plan();
    for s in ["default/old", "default/new"] {
        assert_eq!(
            p.port(s, IpFamily::V4),
            &held_by("TCP 0.0.0.0 7000 socat"),
            "{s}"
        );
    }
    let out = w.trace(Packet::tcp(CLIENT, NODE_V4, 7000));
    assert!(untouched(&out), "{out}");
}

#[test]
fn a_listener_that_appears_later_takes_the_port_back() {
    let w = dual(World::new(), "web", TCP_7000).service(
        Svc::lb("default", "other")
            .created("2024-01-01T00:00:00Z")
            .raw_port(json!({"name": "tcp", "port": 8000})),
    );
    let objects = Objects::from_lists(w.services.clone(), w.slices.clone());
    let bare = Context::new(
        w.node.clone(),
        w.local.clone(),
        w.families,
        w.config.clone(),
    );
    let mut planner = Planner::new();
    planner.update(&objects, &bare, None);
    let web = ServiceKey::new("default", "web");
    assert!(
        planner.outcome(&web).unwrap().programmed_families() == vec![IpFamily::V4, IpFamily::V6]
    );
    assert!(planner.taken_ports().is_empty());
    let with = |spec: &str| {
        bare.clone()
            .with_listeners(HostListeners::new([listener(spec)].into_iter().collect()))
    };
    // The listener starts: the Service loses IPv4 in an edit, and nothing else is replanned.
    let u = planner.update(
        &objects,
        &with("TCP 0.0.0.0 7000 socat"),
        Some(&BTreeSet::new()),
    );
    assert_eq!((u.replanned, u.changed.clone()), (1, [web.clone()].into()));
    let TableChange::Edit(edits) = u.change else {
        panic!("a listener does not replace the tables");
    };
    assert_eq!(edits.len(), 1, "IPv4 only: {edits:?}");
    assert!(!edits[0].1.elements["services"].del.is_empty());
    assert_eq!(
        planner.outcome(&web).unwrap().ports(IpFamily::V4).unwrap()[0].result,
        held_by("TCP 0.0.0.0 7000 socat")
    );
    let taken: Vec<_> = planner
        .taken_ports()
        .into_iter()
        .map(|(slot, l, claimed)| (slot, l.process.clone(), claimed))
        .collect();
    assert_eq!(
        taken,
        vec![(
            (IpFamily::V4, Protocol::Tcp, 7000),
            Some("socat".to_string()),
            true
        )]
    );
    let fresh = World {
        listeners: with("TCP 0.0.0.0 7000 socat").listeners,
        ..w
    };
    assert_eq!(
        planner.tables(),
        fresh.plan().tables,
        "as planned from scratch"
    );
    // A listener on a port no Service claims takes it from none.
    let u = planner.update(&objects, &with("TCP 0.0.0.0 9000"), Some(&BTreeSet::new()));
    assert_eq!(u.changed, [web.clone()].into(), "web gets 7000 back");
    assert!(
        !planner.taken_ports()[0].2,
        "9000 taken, from no Service's port"
    );
    // It stops: the Service gets its rules back.
    planner.update(&objects, &bare, Some(&BTreeSet::new()));
    assert_eq!(
        planner.outcome(&web).unwrap().programmed_families(),
        vec![IpFamily::V4, IpFamily::V6]
    );
    assert_eq!(
        planner.tables(),
        World {
            listeners: Default::default(),
            ..fresh
        }
        .plan()
        .tables
    );
}
