//! Served addresses: the Node's addresses that are on the host, narrowed per Service by
//! `nodelb.io/address-types` and `nodelb.io/address-cidrs` (default: `--address-types`,
//! `--address-cidrs`).

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

/// The node's ExternalIP in the World below, on the host (its InternalIPs are `NODE_V4` and
/// `NODE_V6`).
const EXTERNAL: &str = "192.0.2.1";

/// The World with an ExternalIP on the node and on the host, and `svc` with endpoint
/// 198.51.100.10 behind port 80.
fn two_addresses(svc: Svc) -> World {
    let mut w = World::new()
        .service(svc)
        .slice(web_slice("web-1", &["198.51.100.10"]));
    w.node
        .addresses
        .push((AddressKind::ExternalIP, EXTERNAL.parse().unwrap()));
    w.local.insert(EXTERNAL.parse().unwrap());
    w
}

/// The addresses `svc`'s IPv4 family is served on, as its outcome says.
fn served_v4(p: &Plan, svc: &str) -> Vec<String> {
    let ServiceOutcome::Served { families } = p.outcome(svc) else {
        panic!("{svc}: {}", p.outcome(svc))
    };
    families
        .iter()
        .filter(|f| f.family == IpFamily::V4)
        .flat_map(|f| match &f.state {
            FamilyState::Served { addresses, .. } => addresses.clone(),
            FamilyState::Skipped(_) => Vec::new(),
        })
        .map(|a| a.to_string())
        .collect()
}

#[test]
fn address_types_annotation_serves_only_the_node_addresses_of_those_types() {
    let web_on = |types: &str| web().annotation("nodelb.io/address-types", types);
    let ep = eps(&["198.51.100.10:8080"]);

    let w = two_addresses(web_on("ExternalIP"));
    let out = w.trace(Packet::tcp(CLIENT, EXTERNAL, 80));
    assert_eq!(out.endpoints(), ep, "{out}");
    let out = w.trace(to_web());
    assert!(untouched(&out), "the InternalIP: {out}");
    // The node's own connection to its InternalIP is not the Service's either.
    let out = w.trace(from_node(NODE_V4));
    assert!(untouched(&out), "{out}");
    assert_eq!(served_v4(&w.plan(), "default/web"), [EXTERNAL]);

    let w = two_addresses(web_on("InternalIP"));
    let out = w.trace(to_web());
    assert_eq!(out.endpoints(), ep, "{out}");
    let out = w.trace(Packet::tcp(CLIENT, EXTERNAL, 80));
    assert!(untouched(&out), "the ExternalIP: {out}");

    // Both, in any order and spacing, is every address, as without the annotation.
    for svc in [web_on(" ExternalIP,InternalIP "), web()] {
        let w = two_addresses(svc);
        assert_eq!(served_v4(&w.plan(), "default/web"), [EXTERNAL, NODE_V4]);
        for addr in [EXTERNAL, NODE_V4] {
            let out = w.trace(Packet::tcp(CLIENT, addr, 80));
            assert_eq!(out.endpoints(), ep, "{addr}: {out}");
        }
    }
}

#[test]
fn address_cidrs_annotation_serves_only_the_node_addresses_inside_them() {
    let w = two_addresses(web().annotation("nodelb.io/address-cidrs", "192.0.2.0/24"));
    let out = w.trace(Packet::tcp(CLIENT, EXTERNAL, 80));
    assert_eq!(out.endpoints(), eps(&["198.51.100.10:8080"]), "{out}");
    let out = w.trace(to_web());
    assert!(untouched(&out), "outside the CIDRs: {out}");

    // Types and CIDRs both narrow: an InternalIP inside the CIDRs, and no other.
    let w = two_addresses(
        web()
            .annotation("nodelb.io/address-types", "InternalIP")
            .annotation("nodelb.io/address-cidrs", "192.0.2.0/24, 203.0.113.0/25"),
    );
    assert_eq!(served_v4(&w.plan(), "default/web"), [NODE_V4]);
    let out = w.trace(Packet::tcp(CLIENT, EXTERNAL, 80));
    assert!(untouched(&out), "an ExternalIP inside the CIDRs: {out}");
}

#[test]
fn a_family_with_no_address_of_the_services_types_and_cidrs_is_skipped_and_says_why() {
    // Dual stack; the CIDRs name only IPv4 addresses: IPv6 is skipped, IPv4 served.
    let w = two_addresses(
        web()
            .spec("ipFamilies", json!(["IPv4", "IPv6"]))
            .annotation("nodelb.io/address-cidrs", "203.0.113.0/24"),
    )
    .slice(v6_web_slice("web-6", &["2001:db8:b::10".to_string()]));
    let p = w.plan();
    let ServiceOutcome::Served { families } = p.outcome("default/web") else {
        panic!("{}", p.outcome("default/web"))
    };
    assert_eq!(
        families[1].state,
        FamilyState::Skipped(FamilySkip::NoAddressAdmitted)
    );
    let out = w.trace(to_web6());
    assert!(untouched(&out), "{out}");
    assert_eq!(w.trace(to_web()).endpoints(), eps(&["198.51.100.10:8080"]));

    // ExternalIP on a node with none: no family served, and the outcome says why.
    let w = World::new()
        .service(web().annotation("nodelb.io/address-types", "ExternalIP"))
        .slice(web_slice("web-1", &["198.51.100.10"]));
    let p = w.plan();
    assert_eq!(
        p.outcome("default/web"),
        &ServiceOutcome::NoServedAddress {
            families: vec![(IpFamily::V4, FamilySkip::NoAddressAdmitted)]
        }
    );
    assert!(
        p.outcome("default/web")
            .to_string()
            .contains("no node address of the Service's address types and CIDRs"),
        "{}",
        p.outcome("default/web")
    );
    let out = w.trace(to_web());
    assert!(untouched(&out), "{out}");
}

#[test]
fn address_flags_are_the_default_of_services_without_the_annotations() {
    let mut w = two_addresses(web()).service(
        Svc::lb("default", "api")
            .created("2024-01-01T00:00:00Z")
            .port("https", 443, "TCP")
            .annotation("nodelb.io/address-types", "InternalIP,ExternalIP")
            .annotation("nodelb.io/address-cidrs", ""),
    );
    w.config.addresses = super::super::addresses::AddressFilter {
        types: [AddressKind::ExternalIP].into(),
        cidrs: vec![super::super::cidr::Cidr::parse("192.0.2.0/24").unwrap()],
    };
    let p = w.plan();
    assert_eq!(served_v4(&p, "default/web"), [EXTERNAL]);
    let out = w.trace(to_web());
    assert!(untouched(&out), "{out}");
    // Each annotation replaces its flag: both types, and an empty list is no CIDR filter.
    assert_eq!(served_v4(&p, "default/api"), [EXTERNAL, NODE_V4]);
}

#[test]
fn invalid_address_annotation_serves_nowhere_with_a_warning() {
    for (annotation, value, warning) in [
        (
            "nodelb.io/address-types",
            "ExternalIP,Public",
            "annotation nodelb.io/address-types \"ExternalIP,Public\": \"Public\" is not InternalIP or ExternalIP; served nowhere",
        ),
        (
            "nodelb.io/address-types",
            "",
            "annotation nodelb.io/address-types \"\": names no address type",
        ),
        (
            "nodelb.io/address-cidrs",
            "192.0.2.0/24,192.0.2.300/32",
            "annotation nodelb.io/address-cidrs \"192.0.2.0/24,192.0.2.300/32\": \"192.0.2.300/32\" is not a CIDR; served nowhere",
        ),
    ] {
        let w = two_addresses(web().annotation(annotation, value));
        let p = w.plan();
        assert!(
            matches!(
                p.outcome("default/web"),
                ServiceOutcome::NotServed(NotServed::InvalidAddresses { .. })
            ),
            "{value}: {}",
            p.outcome("default/web")
        );
        assert!(p.warned(warning), "{:?}", p.warnings);
        for addr in [EXTERNAL, NODE_V4] {
            let out = w.trace(Packet::tcp(CLIENT, addr, 80));
            assert!(untouched(&out), "{value} {addr}: {out}");
        }
    }
}

#[test]
fn invalid_address_annotation_is_warned_about_on_nodes_the_service_skips_too() {
    let mut w = two_addresses(
        web()
            .annotation("nodelb.io/node-selector", "kubernetes.io/hostname=node-b")
            .annotation("nodelb.io/address-types", "Public"),
    );
    let p = w.plan();
    assert!(matches!(
        p.outcome("default/web"),
        ServiceOutcome::NotServed(NotServed::NodeSelectorMismatch { .. })
    ));
    assert!(p.warned("nodelb.io/address-types"), "{:?}", p.warnings);
    w.node.labels.insert(
        "node.kubernetes.io/exclude-from-external-load-balancers".into(),
        "".into(),
    );
    assert!(w.plan().warned("nodelb.io/address-types"));
}
