//! Protocols: TCP, UDP and SCTP ports.

use super::*;

#[test]
fn tcp_udp_and_sctp_ports_are_programmed() {
    let w = World::new()
        .service(
            Svc::lb("default", "web")
                .created("2024-01-01T00:00:00Z")
                .port("a", 80, "TCP")
                .port("b", 80, "UDP")
                .port("c", 80, "SCTP"),
        )
        .slice(
            Slice::ipv4("default", "web-1", "web")
                .port("a", 8080, "TCP")
                .port("b", 8081, "UDP")
                .port("c", 8082, "SCTP")
                .endpoint("198.51.100.10"),
        );
    for (p, port) in [
        (Packet::tcp(CLIENT, NODE_V4, 80), 8080),
        (Packet::udp(CLIENT, NODE_V4, 80), 8081),
        (Packet::sctp(CLIENT, NODE_V4, 80), 8082),
    ] {
        let out = w.trace(p.clone());
        let ep = format!("198.51.100.10:{port}");
        assert_eq!(out.endpoints(), eps(&[&ep]), "{p}: {out}");
        assert!(out.masqueraded(), "{p}: {out}");
    }
}
