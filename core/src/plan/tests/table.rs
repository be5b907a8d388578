//! The table as a whole: comments, determinism, the base chains' priorities.

use super::*;

#[test]
fn every_rule_and_element_of_a_service_carries_its_comment() {
    let p = World::new()
        .service(web().spec("loadBalancerSourceRanges", json!(["192.0.2.0/24"])))
        .slice(web_slice("web-1", &["198.51.100.10"]))
        .plan();
    let t = &p.tables[0];
    let rules = &t.chains["svc-default/web-tcp-80"].rules;
    assert_eq!(rules.len(), 2);
    for rule in rules {
        let comment = rule.comment.as_deref().unwrap_or_default();
        assert!(comment.starts_with("default/web:http"), "{rule:?}");
    }
    for set in [
        "services",
        "endpoints",
        "masq-services",
        "lb-services",
        "hairpin",
    ] {
        let elements = &t.sets[set].elements;
        assert!(!elements.is_empty(), "{set}");
        for e in elements.values() {
            assert_eq!(e.comment.as_deref(), Some("default/web:http"), "{set}");
        }
    }
}

#[test]
fn the_plan_is_deterministic() {
    use nodelb_netfilter::{ElemData, Key, L4Proto, Value, Values};
    let w = World::new()
        .service(web())
        .service(
            Svc::lb("default", "b")
                .created("2024-01-01T00:00:00Z")
                .bare_port(81),
        )
        .slice(web_slice(
            "web-1",
            &["198.51.100.12", "198.51.100.10", "198.51.100.11"],
        ));
    let a = w.plan();
    let b = w.plan();
    assert_eq!(a.tables, b.tables);
    // Endpoints are indexed in address order whatever the slice's order.
    let endpoints = &a.tables[0].sets["endpoints"].elements;
    for (i, host) in ["198.51.100.10", "198.51.100.11", "198.51.100.12"]
        .into_iter()
        .enumerate()
    {
        let key = [
            Value::Proto(L4Proto::Tcp),
            Value::Port(80),
            Value::U32(i as u32),
        ];
        let ip: IpAddr = host.parse().unwrap();
        let to = Values::from([Value::from(ip), Value::Port(8080)]);
        assert_eq!(
            endpoints[&Key::Values(Values::from(key))].data,
            Some(ElemData::Values(to)),
            "{i}"
        );
    }
}

#[test]
fn dispatch_runs_before_every_other_dstnat_chain() {
    let p = World::new()
        .service(
            Svc::lb("default", "web")
                .created("2024-01-01T00:00:00Z")
                .bare_port(80),
        )
        .plan();
    for family in [IpFamily::V4, IpFamily::V6] {
        let t = p
            .tables
            .iter()
            .find(|t| t.family == family.netfilter())
            .unwrap();
        for name in ["prerouting", "output"] {
            let base = t.chains[name].base.as_ref().unwrap();
            assert_eq!(
                base.chain_type,
                nodelb_netfilter::ChainType::Nat,
                "{family} {name}"
            );
            // dstnat is -100 (kube-proxy, CNI hostPort/portmap, Docker): nodelb's DNAT first.
            assert_eq!(base.priority, -110, "{family} {name}");
        }
        // Masquerading stays at srcnat, the filter chains at filter.
        assert_eq!(t.chains["postrouting"].base.as_ref().unwrap().priority, 100);
        assert_eq!(t.chains["forward"].base.as_ref().unwrap().priority, 0);
    }
}
