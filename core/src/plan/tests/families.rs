//! Families: which tables carry a Service.

use super::*;

#[test]
fn ip_families_decide_which_tables_carry_the_service() {
    let w = World::new()
        .service(web().spec("ipFamilies", json!(["IPv6"])))
        .slice(
            Slice::ipv6("default", "web-6", "web")
                .port("http", 8080, "TCP")
                .endpoint("2001:db8:b::10"),
        )
        .slice(web_slice("web-4", &["198.51.100.10"]));
    let p = w.plan();
    assert!(!p.v4().contains("default/web"), "{}", p.v4());
    let v6 = p.text(IpFamily::V6);
    assert!(
        v6.contains("2001:db8::1 . tcp . 80") && v6.contains("2001:db8:b::10 . 8080"),
        "{v6}"
    );
}

#[test]
fn disabled_or_non_forwarding_family_gets_no_table() {
    let mut w = World::new()
        .service(web().spec("ipFamilies", json!(["IPv4", "IPv6"])))
        .slice(web_slice("web-4", &["198.51.100.10"]));
    w.families = Families {
        v4: true,
        v6: false,
    };
    let p = w.plan();
    assert_eq!(p.tables.len(), 1);
    assert_eq!(p.tables[0].family, nodelb_netfilter::Family::Ip);
    let ServiceOutcome::Served { families } = p.outcome("default/web") else {
        panic!("{:?}", p.outcome("default/web"))
    };
    assert_eq!(
        families[1].state,
        FamilyState::Skipped(FamilySkip::FamilyNotProgrammed)
    );

    w.families = Families {
        v4: false,
        v6: false,
    };
    let p = w.plan();
    assert!(p.tables.is_empty());
    assert!(matches!(
        p.outcome("default/web"),
        ServiceOutcome::NoServedAddress { .. }
    ));
}

#[test]
fn missing_ip_families_follow_the_cluster_ip() {
    let p = World::new()
        .service(web().spec("clusterIP", "2001:db8:ffff::10"))
        .slice(
            Slice::ipv6("default", "web-6", "web")
                .port("http", 8080, "TCP")
                .endpoint("2001:db8:b::10"),
        )
        .plan();
    assert!(p.text(IpFamily::V6).contains("2001:db8::1 . tcp . 80"));
    assert!(!p.v4().contains("default/web"));
}
