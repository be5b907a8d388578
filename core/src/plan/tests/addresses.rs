//! Served addresses: the Node's addresses that are on the host.

use super::*;

#[test]
fn only_node_addresses_assigned_on_the_host_are_served() {
    let mut w = World::new()
        .service(web())
        .slice(web_slice("web-1", &["198.51.100.10"]));
    // Listed on the Node but not on the host: not served.
    w.node
        .addresses
        .push((AddressKind::ExternalIP, "203.0.113.77".parse().unwrap()));
    // On the host but not listed on the Node (192.0.2.254): not served either.
    let to = |addr: &str| w.trace(Packet::tcp(CLIENT, addr, 80));
    let web = eps(&["198.51.100.10:8080"]);
    assert_eq!(to(NODE_V4).endpoints(), web, "{}", to(NODE_V4));
    for addr in ["203.0.113.77", "192.0.2.254"] {
        assert!(untouched(&to(addr)), "{addr}: {}", to(addr));
    }
    // Both Node address kinds count once they are on the host.
    w.local.insert("203.0.113.77".parse().unwrap());
    for addr in [NODE_V4, "203.0.113.77"] {
        let out = w.trace(Packet::tcp(CLIENT, addr, 80));
        assert_eq!(out.endpoints(), web, "{addr}: {out}");
    }
}

#[test]
fn no_served_address_means_no_rules() {
    let mut w = World::new()
        .service(web())
        .slice(web_slice("web-1", &["198.51.100.10"]));
    w.local.clear();
    let p = w.plan();
    assert!(matches!(
        p.outcome("default/web"),
        ServiceOutcome::NoServedAddress { .. }
    ));
    let out = w.trace(to_web());
    assert!(untouched(&out), "{out}");
}
