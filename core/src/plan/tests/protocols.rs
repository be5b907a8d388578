//! Protocols: TCP, UDP and SCTP ports.

use super::*;

#[test]
fn tcp_udp_and_sctp_ports_are_programmed() {
    let p = World::new()
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
        )
        .plan();
    let t = p.v4();
    for (proto, target) in [("tcp", 8080), ("udp", 8081), ("sctp", 8082)] {
        assert!(
            t.contains(&format!("203.0.113.1 . {proto} . 80 ")),
            "{proto}: {t}"
        );
        assert!(
            t.contains(&format!("{proto} . 80 . 0 comment"))
                && t.contains(&format!("198.51.100.10 . {target}")),
            "{proto}: {t}"
        );
    }
}
