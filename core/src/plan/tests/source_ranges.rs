//! Source ranges: loadBalancerSourceRanges admit only the listed clients, per family.

use super::*;

#[test]
fn source_ranges_admit_only_listed_clients_per_family() {
    let p = World::new()
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
        .plan();
    let v4 = p.v4();
    let src = set_block(&v4, "src-default/web");
    assert!(
        src.contains("192.0.2.0/24") && !src.contains("2001:db8"),
        "{src}"
    );
    let chain = chain_block(&v4, "svc-default/web-tcp-80");
    assert!(
        chain.contains("ip saddr != @src-default/web counter name \"drops/default/web/http\" drop"),
        "{chain}"
    );
    assert!(
        v4.contains("counter drops/default/web/http {\n\t\tcomment \"default/web:http: source-range drops\""),
        "{v4}"
    );
    let v6 = p.text(IpFamily::V6);
    let src6 = set_block(&v6, "src-default/web");
    assert!(
        src6.contains("2001:db8:c::/64") && !src6.contains("192.0.2"),
        "{src6}"
    );
    // Without source ranges there is no filter.
    let open = World::new()
        .service(web())
        .slice(web_slice("web-1", &["198.51.100.10"]))
        .plan();
    assert!(!open.v4().contains("src-default/web"));
    assert!(!open.v4().contains("drops/default/web"));
}

/// kube-proxy's `MapCIDRsByIPFamily`: ranges are split by family, and a family none of them
/// belongs to is not filtered (it was: its set was empty, so every client of it was dropped).
#[test]
fn a_family_without_source_ranges_is_not_filtered() {
    let p = World::new()
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
        )
        .plan();
    let v4 = p.v4();
    assert!(
        set_block(&v4, "src-default/web").contains("192.0.2.0/24"),
        "{v4}"
    );
    let v6 = p.text(IpFamily::V6);
    assert!(
        !v6.contains("src-default/web") && !v6.contains("drops/default/web"),
        "IPv6 clients are not filtered: {v6}"
    );
    assert!(v6.contains("2001:db8:b::10 . 8080"), "{v6}");
}
