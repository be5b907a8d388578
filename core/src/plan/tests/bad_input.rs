//! Bad input: what the planner skips and warns about, serving everything else.

use super::*;

#[test]
fn invalid_endpoint_addresses_are_skipped_with_a_warning() {
    let p = World::new()
        .service(web())
        .slice(web_slice(
            "web-1",
            &["198.51.100.10", "not-an-ip", "198.51.100.300"],
        ))
        .plan();
    assert_eq!(p.port("default/web", IpFamily::V4), &forwards(1));
    assert!(p.warned("EndpointSlice default/web-1: address \"not-an-ip\" is not an IP address"));
    assert!(p.warned("\"198.51.100.300\""));
}

#[test]
fn ipv6_address_in_an_ipv4_slice_is_skipped_with_a_warning() {
    let w = World::new()
        .service(web())
        .slice(web_slice("web-1", &["198.51.100.10", "2001:db8:b::10"]));
    let p = w.plan();
    assert_eq!(p.port("default/web", IpFamily::V4), &forwards(1));
    assert!(p.warned("address 2001:db8:b::10 is not IPv4"));
    let out = w.trace(to_web());
    assert_eq!(out.endpoints(), eps(&["198.51.100.10:8080"]), "{out}");
    let out = w.trace(to_web6());
    assert!(untouched(&out), "{out}");
}

#[test]
fn out_of_range_and_missing_ports_are_skipped_with_a_warning() {
    let p = World::new()
        .service(
            Svc::lb("default", "web")
                .created("2024-01-01T00:00:00Z")
                .raw_port(json!({"name": "zero", "port": 0}))
                .raw_port(json!({"name": "big", "port": 70000}))
                .raw_port(json!({"name": "ok", "port": 80})),
        )
        .slice(
            Slice::ipv4("default", "web-1", "web")
                .raw_port(json!({"name": "ok", "port": 0, "protocol": "TCP"}))
                .endpoint("198.51.100.10"),
        )
        .plan();
    assert!(p.warned("port \"zero\" (0): port must be 1-65535"));
    assert!(p.warned("port \"big\" (70000): port must be 1-65535"));
    assert!(p.warned("EndpointSlice default/web-1: port \"ok\": number Some(0) is not 1-65535"));
    let ports = p.outcome("default/web").ports(IpFamily::V4).unwrap();
    assert_eq!(ports.len(), 1);
    assert_eq!(ports[0].result, PortResult::RejectsNoEndpoints);
}

#[test]
fn service_without_ports_gets_no_rules_and_a_warning() {
    let p = World::new()
        .service(Svc::lb("default", "empty"))
        .service(web())
        .plan();
    assert_eq!(p.outcome("default/empty"), &ServiceOutcome::NoValidPorts);
    assert!(p.warned("Service default/empty: no valid port"));
    assert_eq!(
        p.port("default/web", IpFamily::V4),
        &PortResult::RejectsNoEndpoints
    );
}

#[test]
fn unknown_protocols_are_skipped_with_a_warning() {
    let w = World::new()
        .service(
            Svc::lb("default", "web")
                .created("2024-01-01T00:00:00Z")
                .port("q", 443, "QUIC")
                .raw_port(json!({"name": "http", "port": 80})),
        )
        .slice(web_slice("web-1", &["198.51.100.10"]));
    let p = w.plan();
    assert!(p.warned("protocol \"QUIC\" is not TCP, UDP or SCTP"));
    assert_eq!(p.port("default/web", IpFamily::V4), &forwards(1));
    for quic in [
        Packet::tcp(CLIENT, NODE_V4, 443),
        Packet::udp(CLIENT, NODE_V4, 443),
    ] {
        let out = w.trace(quic.clone());
        assert!(untouched(&out), "{quic}: {out}");
    }
}

#[test]
fn duplicate_endpoint_ready_copy_wins() {
    // A pod IP reused while the pod that had it terminates: the old pod's copy is terminating
    // (still serving) in one slice, the new pod's is ready in another. In either slice order
    // the ready copy counts: a ready endpoint, on the new pod's node, no warning.
    let old = "198.51.100.10 node-b ready=false serving=true terminating=true";
    let new = "198.51.100.10 node-a";
    for (first, second) in [(old, new), (new, old)] {
        let p = World::new()
            .service(web().spec("externalTrafficPolicy", "Local"))
            .slice(web_slice("web-a", &[first]))
            .slice(web_slice("web-b", &[second]))
            .plan();
        assert_eq!(
            p.port("default/web", IpFamily::V4),
            &forwards(1),
            "{first} / {second}"
        );
        assert!(p.warnings.is_empty(), "{:?}", p.warnings);
    }
    // Two copies not terminating: the first in slice name order.
    let p = World::new()
        .service(web().spec("externalTrafficPolicy", "Local"))
        .slice(web_slice("web-a", &["198.51.100.10 node-b"]))
        .slice(web_slice("web-b", &["198.51.100.10 node-a"]))
        .plan();
    assert_eq!(
        p.port("default/web", IpFamily::V4),
        &PortResult::DropsNoLocalEndpoint { elsewhere: 1 }
    );
    // A copy not ready and not terminating (the new pod starting) wins too, as in kube-proxy:
    // the address is not used until that pod is ready.
    let p = World::new()
        .service(web())
        .slice(web_slice("web-a", &[old]))
        .slice(web_slice("web-b", &["198.51.100.10 node-a ready=false"]))
        .plan();
    assert_eq!(
        p.port("default/web", IpFamily::V4),
        &PortResult::RejectsNoEndpoints
    );
}

#[test]
fn duplicate_endpoints_count_once_with_a_warning() {
    let p = World::new()
        .service(web())
        .slice(web_slice("web-1", &["198.51.100.10", "198.51.100.10"]))
        .slice(web_slice("web-2", &["198.51.100.10", "198.51.100.11"]))
        .plan();
    assert_eq!(p.port("default/web", IpFamily::V4), &forwards(2));
    assert!(p.warned("endpoint 198.51.100.10 port 8080 is listed more than once"));
}

#[test]
fn a_thousand_endpoint_slice_is_programmed_whole() {
    let eps: Vec<String> = (0..1000)
        .map(|i| format!("2001:db8:b::{:x}", i + 1))
        .collect();
    let w = World::new()
        .service(web().spec("ipFamilies", json!(["IPv6"])))
        .slice(v6_web_slice("web-1", &eps));
    let p = w.plan();
    assert_eq!(p.port("default/web", IpFamily::V6), &forwards(1000));
    let out = w.trace(to_web6());
    assert_eq!(out.endpoints().len(), 1000);
    for e in out.endpoints() {
        assert_eq!(out.chance_of(e), Chance::of(1, 1000), "{e}");
    }
    let t = p
        .tables
        .iter()
        .find(|t| t.family == nodelb_netfilter::Family::Ip6)
        .unwrap();
    assert_eq!(t.sets["endpoints"].elements.len(), 1000);
}

#[test]
fn endpoints_beyond_the_cap_are_left_out_with_a_warning() {
    let mut w = World::new().service(web().spec("ipFamilies", json!(["IPv6"])));
    for s in 0..11u16 {
        let eps: Vec<String> = (0..1000)
            .map(|i| format!("2001:db8:b:{s:x}::{:x}", i + 1))
            .collect();
        w = w.slice(v6_web_slice(&format!("web-{s}"), &eps));
    }
    let p = w.plan();
    assert_eq!(
        p.port("default/web", IpFamily::V6),
        &forwards(crate::plan::endpoints::MAX_ENDPOINTS)
    );
    assert!(p.warned("11000 endpoints, more than the 10000"));
}

#[test]
fn a_slice_before_its_service_is_harmless_and_used_once_the_service_arrives() {
    let w = World::new().slice(web_slice("web-1", &["198.51.100.10"]));
    let p = w.plan();
    assert!(p.services.is_empty() && p.warnings.is_empty());
    let out = w.trace(to_web());
    assert!(untouched(&out), "{out}");
    let w = w.service(web());
    assert_eq!(w.plan().port("default/web", IpFamily::V4), &forwards(1));
    let out = w.trace(to_web());
    assert_eq!(out.endpoints(), eps(&["198.51.100.10:8080"]), "{out}");
}

#[test]
fn a_bad_service_does_not_disturb_others() {
    let p = World::new()
        .service(
            Svc::lb("default", "bad")
                .created("2024-01-01T00:00:00Z")
                .raw_port(json!({"port": 0, "protocol": "ICMP"}))
                .spec("externalTrafficPolicy", "Sometimes")
                .spec("loadBalancerSourceRanges", json!(["nonsense"]))
                .spec("ipFamilies", json!(["IPv5"])),
        )
        .service(web())
        .slice(web_slice("web-1", &["198.51.100.10"]))
        .plan();
    assert_eq!(p.outcome("default/bad"), &ServiceOutcome::NoValidPorts);
    assert!(p.warned("externalTrafficPolicy \"Sometimes\""));
    assert!(p.warned("\"nonsense\" is not a CIDR"));
    assert!(p.warned("\"IPv5\" is not IPv4 or IPv6"));
    assert_eq!(p.port("default/web", IpFamily::V4), &forwards(1));
}

#[test]
fn names_that_are_not_dns_labels_are_skipped_with_a_warning() {
    let p = World::new()
        .service(
            Svc::lb("default", "Bad_Name")
                .created("2024-01-01T00:00:00Z")
                .bare_port(80),
        )
        .service(
            Svc::lb("default", "web")
                .created("2024-01-01T00:00:00Z")
                .bare_port(81),
        )
        .plan();
    assert!(p.warned("Service default/Bad_Name: namespace or name is not a DNS label"));
    assert_eq!(
        p.port("default/web", IpFamily::V4),
        &PortResult::RejectsNoEndpoints
    );
}

#[test]
fn unknown_slice_address_types_are_skipped_with_a_warning() {
    let p = World::new()
        .service(web())
        .slice(
            Slice::of("default", "web-x", "web", "IPX")
                .port("http", 8080, "TCP")
                .endpoint("198.51.100.10"),
        )
        .plan();
    assert!(p.warned("addressType \"IPX\""));
    assert_eq!(
        p.port("default/web", IpFamily::V4),
        &PortResult::RejectsNoEndpoints
    );
}
