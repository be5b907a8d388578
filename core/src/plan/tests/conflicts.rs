//! Conflicts and reserved ports: who gets a port two Services ask for, and the ports nodelb
//! leaves alone.

use super::*;

#[test]
fn port_conflict_is_won_by_the_oldest_service() {
    let w = World::new()
        .service(
            Svc::lb("b", "young")
                .created("2024-06-01T00:00:00Z")
                .port("http", 80, "TCP"),
        )
        .service(
            Svc::lb("z", "old")
                .created("2023-01-01T00:00:00Z")
                .port("http", 80, "TCP"),
        )
        .slice(
            Slice::ipv4("b", "y-1", "young")
                .port("http", 8080, "TCP")
                .endpoint("198.51.100.20"),
        )
        .slice(
            Slice::ipv4("z", "o-1", "old")
                .port("http", 8080, "TCP")
                .endpoint("198.51.100.10"),
        );
    let p = w.plan();
    assert_eq!(
        p.port("b/young", IpFamily::V4),
        &PortResult::Conflict {
            holder: ServiceKey::new("z", "old")
        }
    );
    assert_eq!(p.port("z/old", IpFamily::V4), &forwards(1));
    let out = w.trace(to_web());
    assert_eq!(out.endpoints(), eps(&["198.51.100.10:8080"]), "{out}");
    assert_eq!(out.counters(), BTreeSet::from(["svc/z/old/http"]), "{out}");
}

#[test]
fn port_conflict_between_equal_ages_goes_to_namespace_then_name() {
    let p = World::new()
        .service(
            Svc::lb("b", "x")
                .created("2024-01-01T00:00:00Z")
                .bare_port(80),
        )
        .service(
            Svc::lb("a", "y")
                .created("2024-01-01T00:00:00Z")
                .bare_port(80),
        )
        .plan();
    assert_eq!(
        p.port("b/x", IpFamily::V4),
        &PortResult::Conflict {
            holder: ServiceKey::new("a", "y")
        }
    );
    assert_eq!(p.port("a/y", IpFamily::V4), &PortResult::RejectsNoEndpoints);
}

#[test]
fn conflicts_are_per_family_and_protocol() {
    let p = World::new()
        .service(
            Svc::lb("default", "tcp")
                .created("2024-01-01T00:00:00Z")
                .raw_port(json!({"port": 53, "protocol": "TCP"}))
                .spec("ipFamilies", json!(["IPv4"])),
        )
        .service(
            Svc::lb("default", "udp")
                .created("2024-02-01T00:00:00Z")
                .raw_port(json!({"port": 53, "protocol": "UDP"}))
                .spec("ipFamilies", json!(["IPv4"])),
        )
        .service(
            Svc::lb("default", "six")
                .created("2024-03-01T00:00:00Z")
                .raw_port(json!({"port": 53, "protocol": "TCP"}))
                .spec("ipFamilies", json!(["IPv6"])),
        )
        .plan();
    assert_eq!(
        p.port("default/tcp", IpFamily::V4),
        &PortResult::RejectsNoEndpoints
    );
    assert_eq!(
        p.port("default/udp", IpFamily::V4),
        &PortResult::RejectsNoEndpoints
    );
    assert_eq!(
        p.port("default/six", IpFamily::V6),
        &PortResult::RejectsNoEndpoints
    );
}

#[test]
fn a_service_on_other_nodes_does_not_conflict_here() {
    // The older Service is limited to node-b by its selector: it is not served here, so the
    // younger one keeps the port on this node.
    let p = World::new()
        .service(
            Svc::lb("default", "old")
                .created("2023-01-01T00:00:00Z")
                .bare_port(80)
                .annotation("nodelb.io/node-selector", "kubernetes.io/hostname=node-b"),
        )
        .service(
            Svc::lb("default", "young")
                .created("2024-01-01T00:00:00Z")
                .bare_port(80),
        )
        .plan();
    assert_eq!(
        p.port("default/young", IpFamily::V4),
        &PortResult::RejectsNoEndpoints
    );
}

#[test]
fn reserved_ports_are_refused() {
    let w = World::new()
        .service(
            Svc::lb("default", "ssh")
                .created("2024-01-01T00:00:00Z")
                .raw_port(json!({"name": "ssh", "port": 22}))
                .raw_port(json!({"name": "web", "port": 80})),
        )
        .slice(
            Slice::ipv4("default", "ssh-1", "ssh")
                .port("ssh", 22, "TCP")
                .port("web", 80, "TCP")
                .endpoint("198.51.100.10"),
        );
    let p = w.plan();
    assert_eq!(
        p.outcome("default/ssh"),
        &ServiceOutcome::ReservedPorts {
            ports: vec![(Protocol::Tcp, 22)]
        }
    );
    // No rules at all, not even for port 80.
    for port in [22, 80] {
        let out = w.trace(Packet::tcp(CLIENT, NODE_V4, port));
        assert!(untouched(&out), "{port}: {out}");
    }
}

#[test]
fn overlay_and_routing_ports_are_reserved_per_protocol() {
    let w = World::new()
        .service(
            Svc::lb("default", "vxlan")
                .created("2024-01-01T00:00:00Z")
                .raw_port(json!({"port": 8472, "protocol": "UDP"})),
        )
        .service(
            Svc::lb("default", "bgp")
                .created("2024-01-01T00:00:00Z")
                .raw_port(json!({"port": 179, "protocol": "TCP"})),
        )
        .service(
            Svc::lb("default", "tcp-8472")
                .created("2024-01-01T00:00:00Z")
                .raw_port(json!({"port": 8472, "protocol": "TCP"})),
        )
        .service(
            Svc::lb("default", "udp-179")
                .created("2024-01-01T00:00:00Z")
                .raw_port(json!({"port": 179, "protocol": "UDP"})),
        );
    let p = w.plan();
    assert_eq!(
        p.outcome("default/vxlan"),
        &ServiceOutcome::ReservedPorts {
            ports: vec![(Protocol::Udp, 8472)]
        }
    );
    assert_eq!(
        p.outcome("default/bgp"),
        &ServiceOutcome::ReservedPorts {
            ports: vec![(Protocol::Tcp, 179)]
        }
    );
    for reserved in [
        Packet::udp(CLIENT, NODE_V4, 8472),
        Packet::tcp(CLIENT, NODE_V4, 179),
    ] {
        let out = w.trace(reserved.clone());
        assert!(untouched(&out), "{reserved}: {out}");
    }
    // The same numbers for the other protocol are free: a UDP reservation does not forbid TCP.
    for free in ["default/tcp-8472", "default/udp-179"] {
        assert_eq!(
            p.port(free, IpFamily::V4),
            &PortResult::RejectsNoEndpoints,
            "{free}"
        );
    }
    let out = w.trace(Packet::tcp(CLIENT, NODE_V4, 8472));
    assert_eq!(out.rejected(), Some(Reject::TcpReset), "{out}");
    let out = w.trace(Packet::udp(CLIENT, NODE_V4, 179));
    assert_eq!(out.rejected(), Some(Reject::PortUnreachable), "{out}");
}

#[test]
fn reserved_ports_flag_replaces_the_list() {
    let mut w = World::new()
        .service(
            Svc::lb("default", "ssh")
                .created("2024-01-01T00:00:00Z")
                .bare_port(22),
        )
        .service(
            Svc::lb("default", "web")
                .created("2024-01-01T00:00:00Z")
                .bare_port(8443),
        );
    w.config.reserved_ports = "8443".parse().unwrap();
    let p = w.plan();
    assert_eq!(
        p.port("default/ssh", IpFamily::V4),
        &PortResult::RejectsNoEndpoints
    );
    assert!(matches!(
        p.outcome("default/web"),
        ServiceOutcome::ReservedPorts { .. }
    ));
}

#[test]
fn a_reserved_service_does_not_win_conflicts() {
    let p = World::new()
        .service(
            Svc::lb("default", "old")
                .created("2023-01-01T00:00:00Z")
                .bare_port(80)
                .bare_port(22),
        )
        .service(
            Svc::lb("default", "young")
                .created("2024-01-01T00:00:00Z")
                .bare_port(80),
        )
        .plan();
    assert_eq!(
        p.port("default/young", IpFamily::V4),
        &PortResult::RejectsNoEndpoints
    );
}

#[test]
fn a_service_that_loses_one_port_gets_no_rules_in_that_family() {
    // `old` holds TCP 8081 in IPv4 only; `both` asks TCP and UDP 8081 in both families.
    let w = World::new()
        .service(
            Svc::lb("default", "old")
                .created("2023-01-01T00:00:00Z")
                .port("tcp", 8081, "TCP")
                .spec("ipFamilies", json!(["IPv4"])),
        )
        .service(
            Svc::lb("default", "both")
                .created("2024-01-01T00:00:00Z")
                .port("tcp", 8081, "TCP")
                .port("udp", 8081, "UDP")
                .spec("ipFamilies", json!(["IPv4", "IPv6"]))
                .spec("ipFamilyPolicy", "RequireDualStack"),
        );
    let p = w.plan();
    let v4 = p.outcome("default/both").ports(IpFamily::V4).unwrap();
    let old = ServiceKey::new("default", "old");
    assert_eq!(
        v4[0].result,
        PortResult::Conflict {
            holder: old.clone()
        }
    );
    assert_eq!(
        v4[1].result,
        PortResult::Withheld {
            lost: v4[0].port.clone(),
            holder: PortHolder::Service(old)
        },
        "UDP 8081 did not lose, but the Service gets nothing in IPv4"
    );
    assert!(
        !p.v4().contains("default/both"),
        "no rule, element or counter:\n{}",
        p.v4()
    );
    // In IPv4, TCP 8081 is old's (no endpoints: a reset) and nodelb leaves UDP 8081 alone.
    let out = w.trace(Packet::tcp(CLIENT, NODE_V4, 8081));
    assert_eq!(out.rejected(), Some(Reject::TcpReset), "{out}");
    let out = w.trace(Packet::udp(CLIENT, NODE_V4, 8081));
    assert!(untouched(&out), "{out}");
    // IPv6 has no conflict: both ports are served there (no endpoints: refused).
    let v6 = p.outcome("default/both").ports(IpFamily::V6).unwrap();
    assert!(v6.iter().all(|p| p.result.is_programmed()), "{v6:?}");
    let out = w.trace(Packet::udp(CLIENT_V6, NODE_V6, 8081));
    assert_eq!(out.rejected(), Some(Reject::PortUnreachable), "{out}");
}
