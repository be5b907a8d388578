//! Source ranges: loadBalancerSourceRanges admit only the listed clients, per family.

use super::*;

/// `default/web` in both families, admitting 192.0.2.0/24 and 2001:db8:c::/64, with an
/// endpoint in each.
fn ranged_web() -> World {
    World::new()
        .service(
            web()
                .spec("ipFamilies", json!(["IPv4", "IPv6"]))
                .spec("ipFamilyPolicy", "RequireDualStack")
                .spec(
                    "loadBalancerSourceRanges",
                    json!(["192.0.2.0/24", "2001:db8:c::/64"]),
                ),
        )
        .slice(web_slice("web-1", &["198.51.100.10"]))
        .slice(
            Slice::ipv6("default", "web-6", "web")
                .port("http", 8080, "TCP")
                .endpoint("2001:db8:b::10"),
        )
}

#[test]
fn source_ranges_admit_only_listed_clients_per_family() {
    let w = ranged_web();
    // In each family a client in its ranges reaches the endpoint, others are dropped and
    // counted in its drops counter.
    for (admitted, refused, to, ep) in [
        ("192.0.2.9", CLIENT, NODE_V4, "198.51.100.10:8080"),
        ("2001:db8:c::9", CLIENT_V6, NODE_V6, "[2001:db8:b::10]:8080"),
    ] {
        let out = w.trace(Packet::tcp(admitted, to, 80));
        assert_eq!(out.endpoints(), eps(&[ep]), "{out}");
        let out = w.trace(Packet::tcp(refused, to, 80));
        assert!(out.dropped(), "{out}");
        assert_eq!(
            out.counters(),
            BTreeSet::from(["drops/default/web/http"]),
            "{out}"
        );
    }
    let drops = &w.plan().tables[0].counters["drops/default/web/http"];
    assert_eq!(
        drops.comment.as_deref(),
        Some("default/web:http: source-range drops")
    );
    // Without source ranges there is no filter.
    let open = World::new()
        .service(web())
        .slice(web_slice("web-1", &["198.51.100.10"]));
    let out = open.trace(to_web());
    assert_eq!(out.endpoints(), eps(&["198.51.100.10:8080"]), "{out}");
    assert_eq!(
        out.counters(),
        BTreeSet::from(["svc/default/web/http"]),
        "{out}"
    );
    assert!(!open.plan().tables[0]
        .counters
        .contains_key("drops/default/web/http"));
}

/// kube-proxy's `MapCIDRsByIPFamily`: ranges are split by family, and a family none of them
/// belongs to is not filtered (it was: its set was empty, so every client of it was dropped).
#[test]
fn a_family_without_source_ranges_is_not_filtered() {
    let w = World::new()
        .service(
            web()
                .spec("ipFamilies", json!(["IPv4", "IPv6"]))
                .spec("ipFamilyPolicy", "RequireDualStack")
                .spec("loadBalancerSourceRanges", json!(["192.0.2.0/24"])),
        )
        .slice(web_slice("web-1", &["198.51.100.10"]))
        .slice(
            Slice::ipv6("default", "web-6", "web")
                .port("http", 8080, "TCP")
                .endpoint("2001:db8:b::10"),
        );
    let out = w.trace(Packet::tcp(CLIENT, NODE_V4, 80));
    assert!(out.dropped(), "{out}");
    let out = w.trace(Packet::tcp("192.0.2.9", NODE_V4, 80));
    assert_eq!(out.endpoints(), eps(&["198.51.100.10:8080"]), "{out}");
    // IPv6 clients are not filtered.
    let out = w.trace(to_web6());
    assert_eq!(out.endpoints(), eps(&["[2001:db8:b::10]:8080"]), "{out}");
    assert_eq!(
        out.counters(),
        BTreeSet::from(["svc/default/web/http"]),
        "{out}"
    );
}
