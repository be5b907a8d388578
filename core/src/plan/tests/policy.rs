//! Traffic policy: Cluster and Local, masquerading, and the reject of a port without endpoints.

use super::*;

#[test]
fn cluster_policy_uses_every_endpoint_and_masquerades_clients() {
    let p = World::new()
        .service(web().spec("externalTrafficPolicy", "Cluster"))
        .slice(web_slice(
            "web-1",
            &["198.51.100.10 node-a", "198.51.100.11 node-b"],
        ))
        .plan();
    assert_eq!(p.port("default/web", IpFamily::V4), &forwards(2));
    let masq = set_block(&p.v4(), "masq-services");
    assert!(masq.contains("203.0.113.1 . tcp . 80"), "{masq}");
}

#[test]
fn every_masquerade_is_fully_random() {
    let p = World::new()
        .service(web())
        .slice(web_slice("web-1", &["198.51.100.10"]))
        .plan();
    for family in [IpFamily::V4, IpFamily::V6] {
        let post = chain_block(&p.text(family), "postrouting");
        let rules: Vec<&str> = post.lines().filter(|l| l.contains("masquerade")).collect();
        assert_eq!(rules.len(), 9, "{post}");
        assert!(
            rules
                .iter()
                .all(|r| r.contains(" masquerade fully-random ")),
            "{post}"
        );
    }
}

#[test]
fn local_policy_uses_only_this_nodes_endpoints_and_keeps_client_address() {
    let p = World::new()
        .service(web().spec("externalTrafficPolicy", "Local"))
        .slice(web_slice(
            "web-1",
            &[
                "198.51.100.10 node-a",
                "198.51.100.11 node-b",
                "198.51.100.12",
            ],
        ))
        .plan();
    assert_eq!(p.port("default/web", IpFamily::V4), &forwards(1));
    let t = p.v4();
    assert!(
        t.contains("198.51.100.10 . 8080") && !t.contains("198.51.100.11 . 8080"),
        "{t}"
    );
    let masq = set_block(&t, "masq-services");
    assert!(!masq.contains("203.0.113.1 . tcp . 80"), "{masq}");
}

#[test]
fn local_policy_without_local_endpoint_drops() {
    let p = World::new()
        .service(web().spec("externalTrafficPolicy", "Local"))
        .slice(web_slice("web-1", &["198.51.100.11 node-b"]))
        .plan();
    assert_eq!(
        p.port("default/web", IpFamily::V4),
        &PortResult::DropsNoLocalEndpoint { elsewhere: 1 }
    );
    let t = p.v4();
    let chain = chain_block(&t, "svc-default/web-tcp-80");
    assert!(chain.contains("counter packets 0 bytes 0 drop"), "{chain}");
    assert!(
        !set_block(&t, "no-endpoints").contains("203.0.113.1"),
        "{t}"
    );
}

#[test]
fn local_policy_without_local_endpoint_still_answers_the_nodes_own_clients() {
    let p = World::new()
        .service(web().spec("externalTrafficPolicy", "Local"))
        .slice(web_slice("web-1", &["198.51.100.11 node-b"]))
        .plan();
    let t = p.v4();
    let chain = chain_block(&t, "svc-default/web-tcp-80");
    let own = chain.find("ip saddr @local-addresses counter packets 0 bytes 0 goto endpoints-1");
    let drop = chain.find("counter packets 0 bytes 0 drop");
    assert!(own.is_some() && drop.is_some() && own < drop, "{chain}");
    assert!(
        t.contains("tcp . 80 . 0 comment \"default/web:http\" : 198.51.100.11 . 8080"),
        "{t}"
    );
    // Its own clients are masqueraded (the endpoint is elsewhere); outside ones never reach it.
    assert!(
        set_block(&t, "lb-services").contains("203.0.113.1 . tcp . 80"),
        "{t}"
    );
    assert!(!set_block(&t, "hairpin").contains("198.51.100.11"), "{t}");
}

#[test]
fn node_and_hairpin_clients_are_masqueraded_under_both_policies() {
    for policy in ["Cluster", "Local"] {
        let p = World::new()
            .service(web().spec("externalTrafficPolicy", policy))
            .slice(web_slice("web-1", &["198.51.100.10 node-a"]))
            .plan();
        let t = p.v4();
        assert!(
            set_block(&t, "lb-services").contains("203.0.113.1 . tcp . 80"),
            "{t}"
        );
        let local = set_block(&t, "local-addresses");
        assert!(
            local.contains("203.0.113.1") && local.contains("192.0.2.254"),
            "{local}"
        );
        assert!(
            set_block(&t, "hairpin").contains("198.51.100.10 . 198.51.100.10"),
            "{t}"
        );
        let post = chain_block(&t, "postrouting");
        assert!(post.contains("ip saddr @local-addresses ct original ip daddr . meta l4proto . ct original proto-dst @lb-services masquerade"), "{post}");
        assert!(post.contains("ip saddr . ip daddr @hairpin ct original ip daddr . meta l4proto . ct original proto-dst @lb-services masquerade"), "{post}");
    }
}

#[test]
fn service_without_endpoints_rejects() {
    let p = World::new().service(web()).plan();
    assert_eq!(
        p.port("default/web", IpFamily::V4),
        &PortResult::RejectsNoEndpoints
    );
    let t = p.v4();
    assert!(
        set_block(&t, "no-endpoints").contains("203.0.113.1 . tcp . 80"),
        "{t}"
    );
    assert!(
        !set_block(&t, "services").contains("203.0.113.1 . tcp . 80"),
        "{t}"
    );
    let input = chain_block(&t, "input");
    assert!(input.contains("reject with tcp reset"), "{input}");
    assert!(input.contains("@no-endpoints reject"), "{input}");
}

#[test]
fn no_endpoint_reject_matches_new_connections_only() {
    use nodelb_netfilter::{ct_state, ChainType, CtKey, Expr, Payload, Stmt};
    let p = World::new().service(web()).plan();
    for t in &p.tables {
        let mut keyed = 0;
        // Every rule of a filter chain that looks up the packet's destination address and port
        // (what a reply to the node's own connection from that port carries too) first asks
        // for a new connection.
        for chain in t.chains.values() {
            if chain.base.map(|b| b.chain_type) != Some(ChainType::Filter) {
                continue;
            }
            for rule in &chain.rules {
                let on_destination = rule.stmts.iter().position(|s| {
                    matches!(s, Stmt::Lookup { keys, .. }
                        if matches!(keys[0], Expr::Payload(Payload::IpDaddr | Payload::Ip6Daddr))
                            && keys.contains(&Expr::Payload(Payload::ThDport)))
                });
                let Some(at) = on_destination else {
                    continue;
                };
                keyed += 1;
                let new_first = rule.stmts[..at].iter().any(|s| {
                    *s == Stmt::AnyBits {
                        left: Expr::Ct(CtKey::State),
                        bits: ct_state::NEW,
                    }
                });
                assert!(new_first, "{} {}: {rule:?}", t.family, chain.name);
            }
        }
        // The TCP reset and the port unreachable, in input and in filter-output.
        assert_eq!(keyed, 4, "{}", nodelb_netfilter::render_table(t));
    }
    let input = chain_block(&p.v4(), "input");
    assert!(
        input.contains("ct state new meta l4proto tcp ip daddr . meta l4proto . th dport @no-endpoints reject with tcp reset"),
        "{input}"
    );
}
