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
    assert_eq!(p.port("default/web", IpFamily::V6), &forwards(1));
    let out = w.trace(to_web());
    assert!(untouched(&out), "{out}");
    let out = w.trace(to_web6());
    assert_eq!(out.endpoints(), eps(&["[2001:db8:b::10]:8080"]), "{out}");
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
    let w = World::new()
        .service(web().spec("clusterIP", "2001:db8:ffff::10"))
        .slice(
            Slice::ipv6("default", "web-6", "web")
                .port("http", 8080, "TCP")
                .endpoint("2001:db8:b::10"),
        );
    let p = w.plan();
    assert_eq!(p.port("default/web", IpFamily::V6), &forwards(1));
    let out = w.trace(to_web6());
    assert_eq!(out.endpoints(), eps(&["[2001:db8:b::10]:8080"]), "{out}");
    let out = w.trace(to_web());
    assert!(untouched(&out), "{out}");
}
