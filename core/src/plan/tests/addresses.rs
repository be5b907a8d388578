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
    let p = w.plan();
    let t = p.v4();
    assert!(t.contains("203.0.113.1 . tcp . 80"), "{t}");
    assert!(!t.contains("203.0.113.77 . tcp"), "{t}");
    assert!(!t.contains("192.0.2.254 . tcp"), "{t}");
    // Both Node address kinds count once they are on the host.
    w.local.insert("203.0.113.77".parse().unwrap());
    let t = w.plan().v4();
    assert!(
        t.contains("203.0.113.1 . tcp . 80") && t.contains("203.0.113.77 . tcp . 80"),
        "{t}"
    );
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
    assert!(!p.v4().contains("default/web"));
}
