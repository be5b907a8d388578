//! Endpoints: which of a slice's endpoints and ports a Service port forwards to.

use super::*;

#[test]
fn an_endpoint_forwards_to_its_first_address_only() {
    let w = World::new()
        .service(web())
        .slice(web_slice("web-1", &[]).endpoint(Ep::at("198.51.100.10").address("198.51.100.11")));
    let p = w.plan();
    assert_eq!(p.port("default/web", IpFamily::V4), &forwards(1));
    let out = w.trace(to_web());
    assert_eq!(out.endpoints(), eps(&["198.51.100.10:8080"]), "{out}");
}

#[test]
fn slice_port_is_matched_by_name_and_protocol() {
    let w = World::new()
        .service(
            Svc::lb("default", "web")
                .created("2024-01-01T00:00:00Z")
                .port("http", 80, "TCP")
                .port("dns", 53, "UDP"),
        )
        .slice(
            Slice::ipv4("default", "web-1", "web")
                .port("dns", 5353, "TCP")
                .port("dns", 1053, "UDP")
                .port("http", 8080, "TCP")
                .port("other", 9999, "TCP")
                .endpoint("198.51.100.10"),
        );
    let p = w.plan();
    assert_eq!(p.port("default/web", IpFamily::V4), &forwards(1));
    // TCP 80 is `http` (8080), UDP 53 `dns` over UDP (1053), never `dns` over TCP or `other`.
    let out = w.trace(to_web());
    assert_eq!(out.endpoints(), eps(&["198.51.100.10:8080"]), "{out}");
    let out = w.trace(Packet::udp(CLIENT, NODE_V4, 53));
    assert_eq!(out.endpoints(), eps(&["198.51.100.10:1053"]), "{out}");
    let out = w.trace(Packet::tcp(CLIENT, NODE_V4, 53));
    assert!(untouched(&out), "{out}");
}

#[test]
fn unset_ready_counts_as_ready() {
    let w = World::new().service(web()).slice(web_slice(
        "web-1",
        &[
            "198.51.100.10",
            "198.51.100.11 ready=false",
            "198.51.100.12 ready=true",
        ],
    ));
    let p = w.plan();
    assert_eq!(p.port("default/web", IpFamily::V4), &forwards(2));
    let out = w.trace(to_web());
    let ready = eps(&["198.51.100.10:8080", "198.51.100.12:8080"]);
    assert_eq!(out.endpoints(), ready, "{out}");
}

#[test]
fn fqdn_slices_are_skipped() {
    let p = World::new()
        .service(web())
        .slice(
            Slice::of("default", "web-fqdn", "web", "FQDN")
                .port("http", 8080, "TCP")
                .endpoint("backend.example.com"),
        )
        .plan();
    assert_eq!(
        p.port("default/web", IpFamily::V4),
        &PortResult::RejectsNoEndpoints
    );
    assert!(p.warnings.is_empty(), "{:?}", p.warnings);
}

#[test]
fn serving_terminating_endpoints_stand_in_when_none_is_ready() {
    let w = World::new().service(web()).slice(web_slice(
        "web-1",
        &[
            "198.51.100.10 ready=false serving=true terminating=true",
            "198.51.100.11 ready=false serving=false terminating=true",
        ],
    ));
    let p = w.plan();
    assert_eq!(
        p.port("default/web", IpFamily::V4),
        &PortResult::Forwards {
            endpoints: 1,
            terminating: true,
            topology: Topology::None,
        }
    );
    let out = w.trace(to_web());
    assert_eq!(out.endpoints(), eps(&["198.51.100.10:8080"]), "{out}");
    // Once one is ready, terminating ones are not used.
    let w = w.slice(web_slice("web-2", &["198.51.100.20"]));
    assert_eq!(w.plan().port("default/web", IpFamily::V4), &forwards(1));
    let out = w.trace(to_web());
    assert_eq!(out.endpoints(), eps(&["198.51.100.20:8080"]), "{out}");
}

#[test]
fn endpoints_from_every_slice_of_the_service_are_used() {
    let w = World::new()
        .service(web())
        .slice(web_slice("web-1", &["198.51.100.10"]))
        .slice(web_slice("web-2", &["198.51.100.11"]))
        .slice(
            Slice::ipv4("default", "other-1", "other")
                .port("http", 8080, "TCP")
                .endpoint("198.51.100.99"),
        );
    let p = w.plan();
    assert_eq!(p.port("default/web", IpFamily::V4), &forwards(2));
    let out = w.trace(to_web());
    let both = eps(&["198.51.100.10:8080", "198.51.100.11:8080"]);
    assert_eq!(out.endpoints(), both, "{out}");
    for e in both {
        assert_eq!(out.chance_of(e), Chance::of(1, 2), "{e}: {out}");
    }
}
