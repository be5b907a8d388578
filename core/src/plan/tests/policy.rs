//! Traffic policy: Cluster and Local, masquerading, and the reject of a port without endpoints.

use super::*;

#[test]
fn cluster_policy_uses_every_endpoint_and_masquerades_clients() {
    let w = World::new()
        .service(web().spec("externalTrafficPolicy", "Cluster"))
        .slice(web_slice(
            "web-1",
            &["198.51.100.10 node-a", "198.51.100.11 node-b"],
        ));
    assert_eq!(w.plan().port("default/web", IpFamily::V4), &forwards(2));
    let out = w.trace(to_web());
    let every = eps(&["198.51.100.10:8080", "198.51.100.11:8080"]);
    assert_eq!(out.endpoints(), every, "{out}");
    assert!(out.masqueraded(), "{out}");
}

#[test]
fn every_masquerade_is_fully_random() {
    use nodelb_netfilter::trace::Snat;
    use nodelb_netfilter::Stmt;
    let w = World::new()
        .service(web().dual_stack())
        .slice(web_slice("web-1", &["198.51.100.10"]))
        .slice(v6_web_slice("web-6", &["2001:db8:b::10".into()]));
    // An outside client (Cluster policy), the node's own and a hairpin one, in each family.
    let packets = [
        to_web(),
        from_node(NODE_V4),
        Packet::tcp("198.51.100.10", NODE_V4, 80),
        to_web6(),
        Packet::tcp(NODE_V6, NODE_V6, 80).from_host(),
        Packet::tcp("2001:db8:b::10", NODE_V6, 80),
    ];
    let random = Some(Snat::Masquerade { fully_random: true });
    for packet in packets {
        let out = w.trace(packet.clone());
        assert!(
            out.masqueraded() && out.iter().all(|o| o.snat == random),
            "{packet}: {out}"
        );
    }
    // The other protocols' masquerades too: the three kinds of client for each of TCP, UDP
    // and SCTP, in each family.
    for t in &w.plan().tables {
        let masquerades: Vec<&Stmt> = t.chains["postrouting"]
            .rules
            .iter()
            .flat_map(|r| &r.stmts)
            .filter(|s| matches!(s, Stmt::Masquerade { .. }))
            .collect();
        assert_eq!(masquerades.len(), 9, "{}", t.family);
        assert!(
            masquerades
                .iter()
                .all(|s| **s == Stmt::Masquerade { fully_random: true }),
            "{}",
            t.family
        );
    }
}

#[test]
fn local_policy_uses_only_this_nodes_endpoints_and_keeps_client_address() {
    let w = World::new()
        .service(web().spec("externalTrafficPolicy", "Local"))
        .slice(web_slice(
            "web-1",
            &[
                "198.51.100.10 node-a",
                "198.51.100.11 node-b",
                "198.51.100.12",
            ],
        ));
    assert_eq!(w.plan().port("default/web", IpFamily::V4), &forwards(1));
    let out = w.trace(to_web());
    assert_eq!(out.endpoints(), eps(&["198.51.100.10:8080"]), "{out}");
    assert!(out.accepted() && !out.sometimes_masqueraded(), "{out}");
}

#[test]
fn local_policy_without_local_endpoint_drops() {
    let w = World::new()
        .service(web().spec("externalTrafficPolicy", "Local"))
        .slice(web_slice("web-1", &["198.51.100.11 node-b"]));
    assert_eq!(
        w.plan().port("default/web", IpFamily::V4),
        &PortResult::DropsNoLocalEndpoint { elsewhere: 1 }
    );
    // Dropped, not rejected: the client tries another node.
    let out = w.trace(to_web());
    assert!(out.dropped(), "{out}");
}

#[test]
fn local_policy_without_local_endpoint_still_answers_the_nodes_own_clients() {
    let w = World::new()
        .service(web().spec("externalTrafficPolicy", "Local"))
        .slice(web_slice("web-1", &["198.51.100.11 node-b"]));
    // Its own clients, from any of its addresses, reach the endpoint elsewhere, masqueraded...
    for from in [NODE_V4, "192.0.2.254"] {
        let out = w.trace(from_node(from));
        assert_eq!(out.endpoints(), eps(&["198.51.100.11:8080"]), "{out}");
        assert!(out.masqueraded(), "{from}: {out}");
    }
    // ...outside ones never reach it, nor does the endpoint itself (no hairpin here).
    for from in [CLIENT, "198.51.100.11"] {
        let out = w.trace(Packet::tcp(from, NODE_V4, 80));
        assert!(out.dropped(), "{from}: {out}");
    }
}

#[test]
fn node_and_hairpin_clients_are_masqueraded_under_both_policies() {
    for policy in ["Cluster", "Local"] {
        let w = World::new()
            .service(web().spec("externalTrafficPolicy", policy))
            .slice(web_slice("web-1", &["198.51.100.10 node-a"]));
        // From any of the host's addresses, and from the endpoint itself (hairpin).
        let packets = [
            from_node(NODE_V4),
            from_node("192.0.2.254"),
            Packet::tcp("198.51.100.10", NODE_V4, 80),
        ];
        for packet in packets {
            let out = w.trace(packet.clone());
            assert_eq!(out.endpoints(), eps(&["198.51.100.10:8080"]), "{out}");
            assert!(out.masqueraded(), "{policy}: {packet}: {out}");
        }
    }
}

#[test]
fn service_without_endpoints_rejects() {
    let w = World::new().service(web());
    assert_eq!(
        w.plan().port("default/web", IpFamily::V4),
        &PortResult::RejectsNoEndpoints
    );
    // Outside clients and the node's own are told at once, by a TCP reset.
    for packet in [to_web(), from_node(NODE_V4)] {
        let out = w.trace(packet.clone());
        assert_eq!(out.rejected(), Some(Reject::TcpReset), "{packet}: {out}");
    }
}

#[test]
fn no_endpoint_reject_matches_new_connections_only() {
    use nodelb_netfilter::{ct_state, ChainType, CtKey, Expr, Payload, Stmt};
    let w = World::new().service(web());
    let p = w.plan();
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
    // A new connection is refused; a reply to the node's own connection that happened to
    // use the port as its source port is let through.
    let out = w.trace(to_web());
    assert_eq!(out.rejected(), Some(Reject::TcpReset), "{out}");
    let out = w.trace(to_web().sport(443).established());
    assert!(out.delivered_to_host(), "{out}");
}
