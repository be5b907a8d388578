//! One test per rule of docs/design.md's "What a Service gets", each built from small YAML
//! fixtures and named for the rule it proves; then bad input.
//!
//! Assertions read the planned table through its `nft` text (what an operator would read with
//! `nft list table ip nodelb`) or through the outcome the agent logs and reports.

use super::config::Config;
use super::diagnosis::*;
use super::node::{AddressKind, NodeInfo};
use super::topology::{Ignored, Topology};
use super::*;
use crate::fixtures::{node, Ep, Slice, Svc};
use crate::objects::index::{EndpointSlice, Service};
use crate::vocab::{IpFamily, Protocol, ServiceKey};
use serde_json::json;
use std::collections::BTreeSet;

const NODE: &str = "node-a";
const NODE_V4: &str = "203.0.113.1";
const NODE_V6: &str = "2001:db8::1";

struct World {
    services: Vec<Service>,
    slices: Vec<EndpointSlice>,
    node: NodeInfo,
    local: BTreeSet<IpAddr>,
    families: Families,
    config: Config,
    listeners: listeners::HostListeners,
}

impl World {
    fn new() -> World {
        let node = node(NODE)
            .label("kubernetes.io/hostname", NODE)
            .address("InternalIP", NODE_V4)
            .address("InternalIP", NODE_V6)
            .info();
        let local = [NODE_V4, NODE_V6, "192.0.2.254"]
            .iter()
            .map(|a| a.parse().unwrap())
            .collect();
        World {
            services: Vec::new(),
            slices: Vec::new(),
            node,
            local,
            families: Families { v4: true, v6: true },
            config: Config::default(),
            listeners: Default::default(),
        }
    }

    /// A listening socket on the node: `TCP 0.0.0.0 7000 socat` (the process is optional).
    fn listener(mut self, spec: &str) -> World {
        self.listeners.sockets.insert(listener(spec));
        self
    }

    fn service(mut self, s: Svc) -> World {
        self.services.push(s.index());
        self
    }

    fn slice(mut self, s: Slice) -> World {
        self.slices.push(s.index());
        self
    }

    fn plan(&self) -> Plan {
        plan(&Input {
            services: self.services.iter().collect(),
            slices: self.slices.iter().collect(),
            node: &self.node,
            local_addresses: &self.local,
            families: self.families,
            config: &self.config,
            listeners: &self.listeners,
        })
    }
}

impl Plan {
    fn text(&self, family: IpFamily) -> String {
        self.tables
            .iter()
            .find(|t| t.family == family.netfilter())
            .map(nodelb_netfilter::render_table)
            .unwrap_or_default()
    }

    fn v4(&self) -> String {
        self.text(IpFamily::V4)
    }

    fn outcome(&self, ns_name: &str) -> &ServiceOutcome {
        let (ns, name) = ns_name.split_once('/').unwrap();
        self.services
            .get(&ServiceKey::new(ns, name))
            .unwrap_or_else(|| panic!("no outcome for {ns_name}: {:?}", self.services))
    }

    fn port(&self, ns_name: &str, family: IpFamily) -> &PortResult {
        &self.outcome(ns_name).ports(family).expect("family served")[0].result
    }

    fn warned(&self, needle: &str) -> bool {
        self.warnings.iter().any(|w| w.to_string().contains(needle))
    }
}

/// The LoadBalancer Service `default/web` on TCP port 80 (`http`).
fn web() -> Svc {
    Svc::lb("default", "web")
        .created("2024-01-01T00:00:00Z")
        .port("http", 80, "TCP")
}

/// An IPv4 slice of `default/web` with port `http` → 8080 and the given endpoints, in
/// [`Ep::parse`]'s short form.
fn web_slice(name: &str, endpoints: &[&str]) -> Slice {
    Slice::ipv4("default", name, "web")
        .port("http", 8080, "TCP")
        .endpoints(endpoints)
}

fn forwards(n: usize) -> PortResult {
    PortResult::Forwards {
        endpoints: n,
        terminating: false,
        topology: Topology::None,
    }
}

// ---- which Services are nodelb's ---------------------------------------------------------

#[test]
fn handled_when_class_is_nodelb() {
    let p = World::new()
        .service(web().spec("loadBalancerClass", "nodelb.io/nodelb"))
        .slice(web_slice("web-1", &["198.51.100.10"]))
        .plan();
    assert_eq!(p.port("default/web", IpFamily::V4), &forwards(1));
    assert!(
        p.v4()
            .contains("203.0.113.1 . tcp . 80 comment \"default/web:http\" : goto endpoints-1"),
        "{}",
        p.v4()
    );
}

#[test]
fn other_class_is_ignored() {
    let p = World::new()
        .service(web().spec("loadBalancerClass", "example.com/other"))
        .slice(web_slice("web-1", &["198.51.100.10"]))
        .plan();
    assert!(p.services.is_empty());
    assert!(!p.v4().contains("default/web"));
}

#[test]
fn unset_class_is_handled_only_with_default_class() {
    let mut w = World::new()
        .service(web())
        .slice(web_slice("web-1", &["198.51.100.10"]));
    assert_eq!(w.plan().port("default/web", IpFamily::V4), &forwards(1));
    w.config.default_class = false;
    let p = w.plan();
    assert!(p.services.is_empty());
    assert!(!p.v4().contains("default/web"));
}

#[test]
fn non_loadbalancer_services_are_ignored() {
    let p = World::new()
        .service(web().spec("type", "ClusterIP"))
        .slice(web_slice("web-1", &["198.51.100.10"]))
        .plan();
    assert!(p.services.is_empty());
    assert!(!p.v4().contains("default/web"));
}

#[test]
fn service_proxy_name_label_is_left_alone() {
    let labelled = |value: &str| web().label("service.kubernetes.io/service-proxy-name", value);
    for value in ["other-proxy", ""] {
        let p = World::new()
            .service(labelled(value))
            .slice(web_slice("web-1", &["198.51.100.10"]))
            .plan();
        assert!(p.services.is_empty(), "{value:?}: {:?}", p.services);
        assert!(!p.v4().contains("default/web"), "{}", p.v4());
        assert!(p.warnings.is_empty(), "{:?}", p.warnings);
    }
    // Without the label the same Service is nodelb's.
    let p = World::new()
        .service(web())
        .slice(web_slice("web-1", &["198.51.100.10"]))
        .plan();
    assert_eq!(p.port("default/web", IpFamily::V4), &forwards(1));
}

#[test]
fn allowed_namespaces_limit_which_services_are_programmed() {
    let mut w = World::new()
        .service(web())
        .slice(web_slice("web-1", &["198.51.100.10"]));
    w.config.allowed_namespaces = Some(["prod".to_string()].into());
    let p = w.plan();
    assert_eq!(
        p.outcome("default/web"),
        &ServiceOutcome::NamespaceNotAllowed
    );
    assert!(!p.v4().contains("default/web"));
}

// ---- serving nodes -----------------------------------------------------------------------

#[test]
fn node_with_exclusion_label_does_not_serve() {
    let mut w = World::new()
        .service(web())
        .slice(web_slice("web-1", &["198.51.100.10"]));
    w.node.labels.insert(
        "node.kubernetes.io/exclude-from-external-load-balancers".into(),
        "".into(),
    );
    let p = w.plan();
    assert_eq!(
        p.outcome("default/web"),
        &ServiceOutcome::NotServed(NotServed::ExcludedByLabel)
    );
    assert!(!p.v4().contains("default/web"));
}

#[test]
fn node_selector_annotation_limits_serving_nodes() {
    let annotated = |sel: &str| web().annotation("nodelb.io/node-selector", sel);
    let serve = World::new()
        .service(annotated("kubernetes.io/hostname in (node-a,node-b)"))
        .slice(web_slice("web-1", &["198.51.100.10"]))
        .plan();
    assert_eq!(serve.port("default/web", IpFamily::V4), &forwards(1));

    let skip = World::new()
        .service(annotated("kubernetes.io/hostname=node-b"))
        .slice(web_slice("web-1", &["198.51.100.10"]))
        .plan();
    assert!(matches!(
        skip.outcome("default/web"),
        ServiceOutcome::NotServed(NotServed::NodeSelectorMismatch { .. })
    ));
    assert!(!skip.v4().contains("default/web"));
}

#[test]
fn invalid_node_selector_serves_nowhere_with_a_warning() {
    let p = World::new()
        .service(web().annotation("nodelb.io/node-selector", "a in (b"))
        .slice(web_slice("web-1", &["198.51.100.10"]))
        .plan();
    assert!(matches!(
        p.outcome("default/web"),
        ServiceOutcome::NotServed(NotServed::InvalidNodeSelector { .. })
    ));
    assert!(p.warned("nodelb.io/node-selector"));
    assert!(!p.v4().contains("default/web"));
}

// ---- served addresses --------------------------------------------------------------------

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

// ---- endpoints ---------------------------------------------------------------------------

#[test]
fn an_endpoint_forwards_to_its_first_address_only() {
    let p = World::new()
        .service(web())
        .slice(web_slice("web-1", &[]).endpoint(Ep::at("198.51.100.10").address("198.51.100.11")))
        .plan();
    assert_eq!(p.port("default/web", IpFamily::V4), &forwards(1));
    let t = p.v4();
    assert!(t.contains("198.51.100.10 . 8080"), "{t}");
    assert!(!t.contains("198.51.100.11"), "{t}");
}

#[test]
fn slice_port_is_matched_by_name_and_protocol() {
    let p = World::new()
        .service(
            Svc::lb("default", "web")
                .created("2024-01-01T00:00:00Z")
                .port("http", 80, "TCP")
                .port("dns", 53, "UDP"),
        )
        .slice(
            Slice::ipv4("default", "web-1", "web")
                .port("dns", 5353, "TCP")
                .port("dns", 1053, "UDP")
                .port("http", 8080, "TCP")
                .port("other", 9999, "TCP")
                .endpoint("198.51.100.10"),
        )
        .plan();
    let t = p.v4();
    assert!(
        t.contains("tcp . 80 . 0 comment \"default/web:http\" : 198.51.100.10 . 8080"),
        "{t}"
    );
    assert!(
        t.contains("udp . 53 . 0 comment \"default/web:dns\" : 198.51.100.10 . 1053"),
        "{t}"
    );
    assert!(!t.contains("5353") && !t.contains("9999"), "{t}");
}

#[test]
fn unset_ready_counts_as_ready() {
    let p = World::new()
        .service(web())
        .slice(web_slice(
            "web-1",
            &[
                "198.51.100.10",
                "198.51.100.11 ready=false",
                "198.51.100.12 ready=true",
            ],
        ))
        .plan();
    assert_eq!(p.port("default/web", IpFamily::V4), &forwards(2));
    let t = p.v4();
    assert!(
        t.contains("198.51.100.10 . 8080") && t.contains("198.51.100.12 . 8080"),
        "{t}"
    );
    assert!(!t.contains("198.51.100.11 . 8080"), "{t}");
}

#[test]
fn fqdn_slices_are_skipped() {
    let p = World::new()
        .service(web())
        .slice(
            Slice::of("default", "web-fqdn", "web", "FQDN")
                .port("http", 8080, "TCP")
                .endpoint("backend.example.com"),
        )
        .plan();
    assert_eq!(
        p.port("default/web", IpFamily::V4),
        &PortResult::RejectsNoEndpoints
    );
    assert!(p.warnings.is_empty(), "{:?}", p.warnings);
}

#[test]
fn serving_terminating_endpoints_stand_in_when_none_is_ready() {
    let w = World::new().service(web()).slice(web_slice(
        "web-1",
        &[
            "198.51.100.10 ready=false serving=true terminating=true",
            "198.51.100.11 ready=false serving=false terminating=true",
        ],
    ));
    let p = w.plan();
    assert_eq!(
        p.port("default/web", IpFamily::V4),
        &PortResult::Forwards {
            endpoints: 1,
            terminating: true,
            topology: Topology::None,
        }
    );
    assert!(p.v4().contains("198.51.100.10 . 8080"));
    assert!(!p.v4().contains("198.51.100.11 . 8080"));
    // Once one is ready, terminating ones are not used.
    let p = w.slice(web_slice("web-2", &["198.51.100.20"])).plan();
    assert_eq!(p.port("default/web", IpFamily::V4), &forwards(1));
    assert!(!p.v4().contains("198.51.100.10 . 8080"));
}

#[test]
fn endpoints_from_every_slice_of_the_service_are_used() {
    let p = World::new()
        .service(web())
        .slice(web_slice("web-1", &["198.51.100.10"]))
        .slice(web_slice("web-2", &["198.51.100.11"]))
        .slice(
            Slice::ipv4("default", "other-1", "other")
                .port("http", 8080, "TCP")
                .endpoint("198.51.100.99"),
        )
        .plan();
    assert_eq!(p.port("default/web", IpFamily::V4), &forwards(2));
    assert!(p.v4().contains("numgen random mod 2"), "{}", p.v4());
    assert!(!p.v4().contains("198.51.100.99"));
}

// ---- traffic policy ----------------------------------------------------------------------

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

// ---- topology ------------------------------------------------------------------------------

/// The endpoint addresses in the IPv4 table's endpoint map, sorted.
fn endpoint_hosts(p: &Plan) -> Vec<String> {
    let map = set_block(&p.v4(), "endpoints");
    let mut hosts: Vec<String> = map
        .split(" : ")
        .skip(1)
        .filter_map(|e| e.split(" . ").next())
        .filter(|a| a.parse::<IpAddr>().is_ok())
        .map(str::to_string)
        .collect();
    hosts.sort();
    hosts
}

fn forwards_by(n: usize, topology: Topology) -> PortResult {
    PortResult::Forwards {
        endpoints: n,
        terminating: false,
        topology,
    }
}

/// `node-a` in `zone`.
fn in_zone(mut w: World, zone: &str) -> World {
    w.node
        .labels
        .insert("topology.kubernetes.io/zone".into(), zone.into());
    w
}

/// The plan of `node-a` in `zone` for Service `web` and one slice `web-1` of `endpoints`.
fn zoned(zone: &str, web: Svc, endpoints: &[&str]) -> Plan {
    in_zone(World::new(), zone)
        .service(web)
        .slice(web_slice("web-1", endpoints))
        .plan()
}

/// Three endpoints as the EndpointSlice controller hints them for `PreferClose`: .10 and .12
/// in zone-a, .11 in zone-b.
const ZONED: [&str; 3] = [
    "198.51.100.10 node-a for-zones=zone-a",
    "198.51.100.11 node-b for-zones=zone-b",
    "198.51.100.12 node-c for-zones=zone-a",
];

#[test]
fn prefer_close_uses_only_zone_hinted_endpoints() {
    let p = zoned(
        "zone-a",
        web().spec("trafficDistribution", "PreferClose"),
        &ZONED,
    );
    assert_eq!(
        p.port("default/web", IpFamily::V4),
        &forwards_by(2, Topology::SameZone)
    );
    assert_eq!(endpoint_hosts(&p), ["198.51.100.10", "198.51.100.12"]);
    // In zone-b, zone-b's.
    let p = zoned(
        "zone-b",
        web().spec("trafficDistribution", "PreferClose"),
        &ZONED,
    );
    assert_eq!(endpoint_hosts(&p), ["198.51.100.11"]);
    // The hints decide, as in kube-proxy, also without trafficDistribution (the older
    // topology-mode annotation makes the same hints).
    let p = zoned("zone-a", web(), &ZONED);
    assert_eq!(endpoint_hosts(&p), ["198.51.100.10", "198.51.100.12"]);
}

#[test]
fn prefer_same_node_uses_only_node_hinted_endpoints_and_else_its_zones() {
    let hinted = [
        "198.51.100.10 for-zones=zone-a for-nodes=node-a",
        "198.51.100.11 for-zones=zone-b for-nodes=node-b",
        "198.51.100.12 for-zones=zone-a for-nodes=node-c",
    ];
    let p = zoned(
        "zone-a",
        web().spec("trafficDistribution", "PreferSameNode"),
        &hinted,
    );
    assert_eq!(
        p.port("default/web", IpFamily::V4),
        &forwards_by(1, Topology::SameNode)
    );
    assert_eq!(endpoint_hosts(&p), ["198.51.100.10"]);
    // No endpoint for this node: this zone's.
    let mut w = in_zone(World::new(), "zone-a")
        .service(web().spec("trafficDistribution", "PreferSameNode"))
        .slice(web_slice("web-1", &hinted));
    w.node.name = "node-d".into();
    assert_eq!(
        endpoint_hosts(&w.plan()),
        ["198.51.100.10", "198.51.100.12"]
    );
}

#[test]
fn hints_missing_on_one_endpoint_fall_back_to_all() {
    let mut eps = ZONED.to_vec();
    eps.push("198.51.100.13 node-d");
    let p = zoned(
        "zone-a",
        web().spec("trafficDistribution", "PreferClose"),
        &eps,
    );
    assert_eq!(
        p.port("default/web", IpFamily::V4),
        &forwards_by(4, Topology::Ignored(Ignored::MissingHint))
    );
    // A terminating endpoint without hints does not count: only ready ones are looked at.
    eps[3] = "198.51.100.13 node-d ready=false serving=true terminating=true";
    let p = zoned(
        "zone-a",
        web().spec("trafficDistribution", "PreferClose"),
        &eps,
    );
    assert_eq!(endpoint_hosts(&p), ["198.51.100.10", "198.51.100.12"]);
}

#[test]
fn hints_for_no_endpoint_of_this_zone_or_a_node_without_a_zone_fall_back_to_all() {
    let p = zoned("zone-c", web(), &ZONED);
    assert_eq!(
        p.port("default/web", IpFamily::V4),
        &forwards_by(3, Topology::Ignored(Ignored::NotForThisZone))
    );
    let p = World::new()
        .service(web())
        .slice(web_slice("web-1", &ZONED))
        .plan();
    assert_eq!(
        p.port("default/web", IpFamily::V4),
        &forwards_by(3, Topology::Ignored(Ignored::NodeHasNoZone))
    );
}

#[test]
fn only_terminating_endpoints_left_ignore_their_hints() {
    let eps = [
        "198.51.100.10 ready=false serving=true terminating=true for-zones=zone-a",
        "198.51.100.11 ready=false serving=true terminating=true for-zones=zone-b",
    ];
    let p = zoned(
        "zone-a",
        web().spec("trafficDistribution", "PreferClose"),
        &eps,
    );
    assert_eq!(
        p.port("default/web", IpFamily::V4),
        &PortResult::Forwards {
            endpoints: 2,
            terminating: true,
            topology: Topology::Ignored(Ignored::OnlyTerminating),
        }
    );
}

#[test]
fn topology_hints_do_not_narrow_local_policy() {
    let eps = [
        "198.51.100.10 node-a for-zones=zone-b",
        "198.51.100.11 node-b for-zones=zone-a",
    ];
    let p = zoned(
        "zone-a",
        web()
            .spec("externalTrafficPolicy", "Local")
            .spec("trafficDistribution", "PreferClose"),
        &eps,
    );
    assert_eq!(
        p.port("default/web", IpFamily::V4),
        &forwards_by(1, Topology::None)
    );
    assert_eq!(endpoint_hosts(&p), ["198.51.100.10"]);
}

#[test]
fn a_node_whose_zone_label_changes_uses_the_new_zones_endpoints() {
    // The zone is part of the planner's context: a change replans every Service.
    let w = in_zone(World::new(), "zone-a")
        .service(web())
        .slice(web_slice("web-1", &ZONED));
    let node_b = in_zone(World::new(), "zone-b").node;
    let objects = Objects::from_lists(w.services.clone(), w.slices.clone());
    let ctx =
        |node: &NodeInfo| Context::new(node.clone(), w.local.clone(), w.families, w.config.clone());
    let mut planner = Planner::new();
    planner.update(&objects, &ctx(&w.node), None);
    let before = planner.tables();
    let u = planner.update(&objects, &ctx(&node_b), Some(&BTreeSet::new()));
    assert!(matches!(u.change, TableChange::Rebuild));
    assert_eq!(u.changed, [ServiceKey::new("default", "web")].into());
    let after = planner.tables();
    let text = nodelb_netfilter::render_table(&after[0]);
    assert!(
        text.contains("198.51.100.11 . 8080") && !text.contains("198.51.100.10 . 8080"),
        "{text}"
    );
    assert_ne!(before, after);
}

#[test]
fn malformed_hints_are_warned_about_and_fall_back_to_all() {
    let mut eps = ZONED.to_vec();
    eps[1] = r#"198.51.100.11 node-b hints={"forZones":[{}]}"#;
    let p = zoned("zone-a", web(), &eps);
    assert_eq!(
        p.port("default/web", IpFamily::V4),
        &forwards_by(3, Topology::Ignored(Ignored::MalformedHint))
    );
    assert!(
        p.warned("EndpointSlice default/web-1: endpoint 198.51.100.11: hints are not"),
        "{:?}",
        p.warnings
    );
    // A hint list that is not a list at all reads the same way.
    eps[1] = r#"198.51.100.11 node-b hints={"forZones":"zone-b"}"#;
    let p = zoned("zone-a", web(), &eps);
    assert_eq!(
        p.port("default/web", IpFamily::V4),
        &forwards_by(3, Topology::Ignored(Ignored::MalformedHint))
    );
}

#[test]
fn an_unknown_traffic_distribution_is_warned_about_and_the_hints_still_decide() {
    let p = zoned(
        "zone-a",
        web().spec("trafficDistribution", "PreferFarAway"),
        &ZONED,
    );
    assert!(
        p.warned("trafficDistribution is not PreferClose, PreferSameZone or PreferSameNode"),
        "{:?}",
        p.warnings
    );
    assert_eq!(
        p.port("default/web", IpFamily::V4),
        &forwards_by(2, Topology::SameZone)
    );
}

#[test]
fn a_distribution_without_hints_says_they_are_missing() {
    let p = zoned(
        "zone-a",
        web().spec("trafficDistribution", "PreferClose"),
        &["198.51.100.10", "198.51.100.11"],
    );
    assert_eq!(
        p.port("default/web", IpFamily::V4),
        &forwards_by(2, Topology::Ignored(Ignored::MissingHint))
    );
    let outcome = p.outcome("default/web").to_string();
    assert!(
        outcome.contains(
            "forwards to 2 endpoints (topology hints ignored: an endpoint carries no hint)"
        ),
        "{outcome}"
    );
}

// ---- session affinity --------------------------------------------------------------------

/// `default/web` with `sessionAffinity: ClientIP` and the given timeout (none: the default).
fn sticky_web(timeout: Option<i64>) -> Svc {
    let web = web().spec("sessionAffinity", "ClientIP");
    match timeout {
        Some(t) => web.spec(
            "sessionAffinityConfig",
            json!({"clientIP": {"timeoutSeconds": t}}),
        ),
        None => web,
    }
}

#[test]
fn client_ip_affinity_keeps_a_client_on_its_endpoint() {
    let p = World::new()
        .service(sticky_web(Some(60)))
        .slice(web_slice("web-1", &["198.51.100.10", "198.51.100.11"]))
        .plan();
    assert_eq!(p.port("default/web", IpFamily::V4), &forwards(2));
    let t = p.v4();
    // Each endpoint remembers its clients for the timeout, in a set of its own...
    for ep in ["198.51.100.10-8080", "198.51.100.11-8080"] {
        let set = set_block(&t, &format!("affinity-default/web-tcp-80-{ep}"));
        assert!(
            set.contains("type ipv4_addr\n\t\tflags dynamic,timeout\n\t\ttimeout 1m\n\t\tcomment \"default/web:http\""),
            "{set}"
        );
        // ...filled by the endpoint's chain before it DNATs (two rules: a full set must not
        // stop the DNAT).
        let chain = chain_block(&t, &format!("ep-default/web-tcp-80-{ep}"));
        let addr = ep.replace("-", ":");
        assert!(
            chain.contains(&format!("update @affinity-default/web-tcp-80-{ep} {{ ip saddr timeout 1m }} comment \"default/web:http\"\n\t\tmeta l4proto tcp dnat to {addr} comment \"default/web:http\"")),
            "{chain}"
        );
    }
    // The Service port's chain sends a client an endpoint remembers to that endpoint, before
    // it picks one at random for the others: the first with chance 1/2, else the second.
    let svc = chain_block(&t, "svc-default/web-tcp-80");
    let rules: Vec<&str> = svc.lines().map(str::trim).collect();
    let ep = |h: u8| format!("ep-default/web-tcp-80-198.51.100.{h}-8080");
    let set = |h: u8| format!("affinity-default/web-tcp-80-198.51.100.{h}-8080");
    let note = "comment \"default/web:http\"";
    let counted = "counter packets 0 bytes 0";
    assert_eq!(
        rules[1..5],
        [
            format!("ip saddr @{} {counted} goto {} {note}", set(10), ep(10)),
            format!("ip saddr @{} {counted} goto {} {note}", set(11), ep(11)),
            format!("numgen random mod 2 0 {counted} goto {} {note}", ep(10)),
            format!("{counted} goto {} {note}", ep(11)),
        ],
        "{svc}"
    );
    // Not the shared DNAT of Services without affinity.
    assert!(!t.contains("chain endpoints-2"), "{t}");
    assert!(!set_block(&t, "endpoints").contains("198.51.100.10"), "{t}");
    // Masquerading and hairpin as for any Service.
    assert!(
        set_block(&t, "hairpin").contains("198.51.100.10 . 198.51.100.10"),
        "{t}"
    );
    assert!(
        set_block(&t, "masq-services").contains("203.0.113.1 . tcp . 80"),
        "{t}"
    );
}

#[test]
fn a_plain_service_port_dispatches_straight_to_the_shared_endpoint_chain() {
    // No source ranges, no affinity, endpoints to forward to: no chain of its own, under
    // either policy; its counter object and counter-map element stay.
    for policy in ["Cluster", "Local"] {
        let t = World::new()
            .service(web().spec("externalTrafficPolicy", policy))
            .slice(web_slice(
                "web-1",
                &["198.51.100.10 node-a", "198.51.100.11 node-a"],
            ))
            .plan()
            .v4();
        let dispatch = set_block(&t, "services");
        assert!(
            dispatch
                .contains("203.0.113.1 . tcp . 80 comment \"default/web:http\" : goto endpoints-2"),
            "{policy}: {t}"
        );
        assert!(!t.contains("chain svc-"), "{policy}: {t}");
        assert!(t.contains("counter svc/default/web/http"), "{policy}: {t}");
        assert!(
            set_block(&t, "svc-counters").contains(": \"svc/default/web/http\""),
            "{policy}: {t}"
        );
    }
    // With source ranges the port keeps its chain: the check comes before the pick.
    let t = World::new()
        .service(web().spec("loadBalancerSourceRanges", json!(["192.0.2.0/24"])))
        .slice(web_slice("web-1", &["198.51.100.10", "198.51.100.11"]))
        .plan()
        .v4();
    assert!(
        set_block(&t, "services").contains(": goto svc-default/web-tcp-80"),
        "{t}"
    );
    assert!(
        chain_block(&t, "svc-default/web-tcp-80").contains("goto endpoints-2"),
        "{t}"
    );
}

#[test]
fn services_without_affinity_keep_the_shared_endpoint_chains() {
    let plain = World::new()
        .service(web())
        .slice(web_slice("web-1", &["198.51.100.10", "198.51.100.11"]));
    let none = World::new()
        .service(web().spec("sessionAffinity", "None"))
        .slice(web_slice("web-1", &["198.51.100.10", "198.51.100.11"]));
    let t = plain.plan().v4();
    // `None` said aloud changes nothing, and no affinity object appears.
    assert_eq!(t, none.plan().v4());
    for absent in ["affinity", "ep-default", "dynamic"] {
        assert!(!t.contains(absent), "{absent} in\n{t}");
    }
    assert!(
        set_block(&t, "services").contains(": goto endpoints-2"),
        "{t}"
    );
    // Beside an affinity Service, a plain one keeps that shape.
    let mixed = plain
        .service(
            Svc::lb("default", "sticky")
                .created("2024-01-01T00:00:00Z")
                .port("http", 81, "TCP")
                .spec("sessionAffinity", "ClientIP"),
        )
        .slice(
            Slice::ipv4("default", "sticky-1", "sticky")
                .port("http", 8080, "TCP")
                .endpoints(["198.51.100.20", "198.51.100.21"]),
        )
        .plan()
        .v4();
    assert!(
        set_block(&mixed, "services")
            .contains("tcp . 80 comment \"default/web:http\" : goto endpoints-2"),
        "{mixed}"
    );
    assert!(!mixed.contains("chain svc-default/web-tcp-80"), "{mixed}");
    assert_eq!(
        chain_block(&mixed, "endpoints-2"),
        chain_block(&t, "endpoints-2")
    );
    assert!(
        chain_block(&mixed, "svc-default/sticky-tcp-81")
            .contains("numgen random mod 2 0 counter packets 0 bytes 0 goto ep-default/sticky-tcp-81-198.51.100.20-8080"),
        "{mixed}"
    );
}

#[test]
fn affinity_timeout_defaults_to_three_hours_and_bad_values_are_warned_about() {
    let timeout_of = |w: World| {
        let p = w.slice(web_slice("web-1", &["198.51.100.10"])).plan();
        let set = set_block(&p.v4(), "affinity-default/web-tcp-80-198.51.100.10-8080");
        let line = set
            .lines()
            .find(|l| l.contains("timeout ") && !l.contains("flags"));
        (line.unwrap_or_default().trim().to_string(), p)
    };
    let (t, p) = timeout_of(World::new().service(sticky_web(None)));
    assert_eq!(t, "timeout 3h");
    assert!(p.warnings.is_empty(), "{:?}", p.warnings);
    let (t, _) = timeout_of(World::new().service(sticky_web(Some(86_400))));
    assert_eq!(t, "timeout 1d");
    for bad in [0, -5, 86_401] {
        let (t, p) = timeout_of(World::new().service(sticky_web(Some(bad))));
        assert_eq!(t, "timeout 3h", "{bad}");
        assert!(
            p.warned(&format!(
                "sessionAffinityConfig.clientIP.timeoutSeconds {bad} is not 1-86400; using 10800"
            )),
            "{bad}: {:?}",
            p.warnings
        );
    }
    let p = World::new()
        .service(web().spec("sessionAffinity", "Sticky"))
        .slice(web_slice("web-1", &["198.51.100.10"]))
        .plan();
    assert!(p.warned("sessionAffinity \"Sticky\" is not None or ClientIP; no affinity"));
    assert!(!p.v4().contains("affinity"), "{}", p.v4());
}

#[test]
fn client_ip_affinity_in_both_families() {
    let p = World::new()
        .service(sticky_web(Some(10)).dual_stack())
        .slice(web_slice("web-1", &["198.51.100.10"]))
        .slice(v6_web_slice(
            "web-6",
            &["2001:db8:b::10".into(), "2001:db8:0:1::a".into()],
        ))
        .plan();
    assert_eq!(p.port("default/web", IpFamily::V6), &forwards(2));
    let t6 = p.text(IpFamily::V6);
    // IPv6 addresses name chains and sets with `.` for `:` (names hold no `:`).
    for ep in ["2001.db8.b..10-8080", "2001.db8.0.1..a-8080"] {
        let set = set_block(&t6, &format!("affinity-default/web-tcp-80-{ep}"));
        assert!(
            set.contains("type ipv6_addr\n\t\tflags dynamic,timeout\n\t\ttimeout 10s"),
            "{set}"
        );
        let chain = chain_block(&t6, &format!("ep-default/web-tcp-80-{ep}"));
        assert!(
            chain.contains(&format!(
                "update @affinity-default/web-tcp-80-{ep} {{ ip6 saddr timeout 10s }}"
            )),
            "{chain}"
        );
    }
    assert!(
        chain_block(&t6, "ep-default/web-tcp-80-2001.db8.b..10-8080")
            .contains("meta l4proto tcp dnat to [2001:db8:b::10]:8080"),
        "{t6}"
    );
    // One endpoint: nothing to draw.
    let v4 = chain_block(&p.v4(), "svc-default/web-tcp-80");
    assert!(!v4.contains("numgen"), "{v4}");
    let svc6 = chain_block(&t6, "svc-default/web-tcp-80");
    assert!(
        svc6.contains("numgen random mod 2 0 counter packets 0 bytes 0 goto ep-default/web-tcp-80-2001.db8.0.1..a-8080"),
        "{svc6}"
    );
}

#[test]
fn endpoint_names_never_read_the_same_for_two_addresses() {
    use super::endpoints::EndpointAddr;
    use super::table::affinity_set;
    let key = ServiceKey::new("default", "web");
    let port = crate::vocab::ServicePortId {
        name: None,
        protocol: Protocol::Tcp,
        port: 80,
    };
    let name = |a: &str| {
        affinity_set(
            &key,
            &port,
            &EndpointAddr {
                addr: a.parse().unwrap(),
                port: 8080,
            },
        )
    };
    // An IPv4-mapped address has no dotted tail that another address could also spell.
    assert_ne!(name("::ffff:1.2.3.4"), name("::ffff:1:2:3:4"));
    assert_eq!(
        name("::ffff:1.2.3.4"),
        "affinity-default/web-tcp-80-..ffff.102.304-8080"
    );
    assert_eq!(
        name("2001:db8::"),
        "affinity-default/web-tcp-80-2001.db8..-8080"
    );
    assert_eq!(
        name("1:0:0:2:0:0:0:3"),
        "affinity-default/web-tcp-80-1.0.0.2..3-8080"
    );
    assert_eq!(
        name("1:2:3:4:5:6:7:8"),
        "affinity-default/web-tcp-80-1.2.3.4.5.6.7.8-8080"
    );
    assert_eq!(
        name("1:0:2:3:4:5:6:7"),
        "affinity-default/web-tcp-80-1.0.2.3.4.5.6.7-8080"
    );
    assert_eq!(
        name("192.0.2.7"),
        "affinity-default/web-tcp-80-192.0.2.7-8080"
    );
}

#[test]
fn local_policy_affinity_without_local_endpoint_serves_only_the_nodes_own_clients() {
    let p = World::new()
        .service(sticky_web(None).spec("externalTrafficPolicy", "Local"))
        .slice(web_slice("web-1", &["198.51.100.11 node-b"]))
        .plan();
    assert_eq!(
        p.port("default/web", IpFamily::V4),
        &PortResult::DropsNoLocalEndpoint { elsewhere: 1 }
    );
    let t = p.v4();
    let chain = chain_block(&t, "svc-default/web-tcp-80");
    let drop = chain
        .find("ip saddr != @local-addresses counter packets 0 bytes 0 drop comment \"default/web:http: Local policy, no endpoint on this node\"")
        .expect(&chain);
    let known = chain
        .find("ip saddr @affinity-default/web-tcp-80-198.51.100.11-8080")
        .expect(&chain);
    let pick = chain
        .find("\t\tcounter packets 0 bytes 0 goto ep-default/web-tcp-80-198.51.100.11-8080 comment \"default/web:http: Local policy, this node's own clients\"")
        .expect(&chain);
    assert!(drop < known && known < pick, "{chain}");
    assert!(!set_block(&t, "hairpin").contains("198.51.100.11"), "{t}");
}

// ---- source ranges -----------------------------------------------------------------------

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

// ---- counters ----------------------------------------------------------------------------

#[test]
fn every_service_port_has_a_counter_reached_from_each_served_address() {
    let p = World::new()
        .service(web())
        .slice(web_slice("web-1", &["198.51.100.10"]))
        .plan();
    let v4 = p.v4();
    assert!(
        v4.contains("counter svc/default/web/http {\n\t\tcomment \"default/web:http\"\n\t\tpackets 0 bytes 0\n\t}"),
        "{v4}"
    );
    let map = set_block(&v4, "svc-counters");
    assert!(
        map.contains("type ipv4_addr . inet_proto . inet_service : counter"),
        "{map}"
    );
    assert!(
        map.contains(
            "203.0.113.1 . tcp . 80 comment \"default/web:http\" : \"svc/default/web/http\""
        ),
        "{map}"
    );
    // Both directions of every DNATed connection, on whichever hook the packet crosses.
    for chain in ["forward", "input", "filter-output"] {
        let c = chain_block(&v4, chain);
        assert!(
            c.contains("meta l4proto tcp ct status dnat counter name ct original ip daddr . meta l4proto . ct original proto-dst map @svc-counters"),
            "{chain}: {c}"
        );
    }
    // Counted before `forward` accepts, and before the rejects of `input`.
    let fwd = chain_block(&v4, "forward");
    assert!(fwd.find("map @svc-counters").unwrap() < fwd.find("@lb-services accept").unwrap());
}

#[test]
fn a_port_keeps_its_counter_whatever_it_does() {
    let reject = World::new().service(web()).plan();
    let forward = World::new()
        .service(web())
        .slice(web_slice("web-1", &["198.51.100.10"]))
        .plan();
    let counters = |p: &Plan| {
        let t = &p.tables[0];
        (t.counters.clone(), t.sets["svc-counters"].elements.clone())
    };
    assert_eq!(counters(&reject), counters(&forward));
    assert_eq!(counters(&reject).0.len(), 1);
}

#[test]
fn counter_names_parse_back_to_their_service_port() {
    use super::table::{counter_name, parse_counter_name, CounterKind};
    use crate::vocab::ServicePortId;
    let key = ServiceKey::new("1team", "web");
    let port = ServicePortId {
        name: Some("http".into()),
        protocol: Protocol::Tcp,
        port: 80,
    };
    let n = counter_name(CounterKind::SourceRangeDrops, &key, &port);
    assert_eq!(n, "drops/1team/web/http");
    assert_eq!(
        parse_counter_name(&n),
        Some((CounterKind::SourceRangeDrops, "1team", "web", "http"))
    );
    let unnamed = ServicePortId { name: None, ..port };
    assert_eq!(
        parse_counter_name(&counter_name(CounterKind::Traffic, &key, &unnamed)),
        Some((CounterKind::Traffic, "1team", "web", "80"))
    );
    for foreign in ["alien", "svc/a/b", "svc/a/b/c/d", "svc//b/c", "quota/a/b/c"] {
        assert_eq!(parse_counter_name(foreign), None, "{foreign}");
    }
}

// ---- protocols ---------------------------------------------------------------------------

#[test]
fn tcp_udp_and_sctp_ports_are_programmed() {
    let p = World::new()
        .service(
            Svc::lb("default", "web")
                .created("2024-01-01T00:00:00Z")
                .port("a", 80, "TCP")
                .port("b", 80, "UDP")
                .port("c", 80, "SCTP"),
        )
        .slice(
            Slice::ipv4("default", "web-1", "web")
                .port("a", 8080, "TCP")
                .port("b", 8081, "UDP")
                .port("c", 8082, "SCTP")
                .endpoint("198.51.100.10"),
        )
        .plan();
    let t = p.v4();
    for (proto, target) in [("tcp", 8080), ("udp", 8081), ("sctp", 8082)] {
        assert!(
            t.contains(&format!("203.0.113.1 . {proto} . 80 ")),
            "{proto}: {t}"
        );
        assert!(
            t.contains(&format!("{proto} . 80 . 0 comment"))
                && t.contains(&format!("198.51.100.10 . {target}")),
            "{proto}: {t}"
        );
    }
}

// ---- families ----------------------------------------------------------------------------

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

// ---- conflicts and reserved ports -------------------------------------------------------

#[test]
fn port_conflict_is_won_by_the_oldest_service() {
    let p = World::new()
        .service(
            Svc::lb("b", "young")
                .created("2024-06-01T00:00:00Z")
                .port("http", 80, "TCP"),
        )
        .service(
            Svc::lb("z", "old")
                .created("2023-01-01T00:00:00Z")
                .port("http", 80, "TCP"),
        )
        .slice(
            Slice::ipv4("b", "y-1", "young")
                .port("http", 8080, "TCP")
                .endpoint("198.51.100.20"),
        )
        .slice(
            Slice::ipv4("z", "o-1", "old")
                .port("http", 8080, "TCP")
                .endpoint("198.51.100.10"),
        )
        .plan();
    assert_eq!(
        p.port("b/young", IpFamily::V4),
        &PortResult::Conflict {
            holder: ServiceKey::new("z", "old")
        }
    );
    assert_eq!(p.port("z/old", IpFamily::V4), &forwards(1));
    let t = p.v4();
    assert!(
        t.contains("198.51.100.10 . 8080") && !t.contains("198.51.100.20"),
        "{t}"
    );
    assert!(!t.contains("svc-b/young"), "{t}");
}

#[test]
fn port_conflict_between_equal_ages_goes_to_namespace_then_name() {
    let p = World::new()
        .service(
            Svc::lb("b", "x")
                .created("2024-01-01T00:00:00Z")
                .bare_port(80),
        )
        .service(
            Svc::lb("a", "y")
                .created("2024-01-01T00:00:00Z")
                .bare_port(80),
        )
        .plan();
    assert_eq!(
        p.port("b/x", IpFamily::V4),
        &PortResult::Conflict {
            holder: ServiceKey::new("a", "y")
        }
    );
    assert_eq!(p.port("a/y", IpFamily::V4), &PortResult::RejectsNoEndpoints);
}

#[test]
fn conflicts_are_per_family_and_protocol() {
    let p = World::new()
        .service(
            Svc::lb("default", "tcp")
                .created("2024-01-01T00:00:00Z")
                .raw_port(json!({"port": 53, "protocol": "TCP"}))
                .spec("ipFamilies", json!(["IPv4"])),
        )
        .service(
            Svc::lb("default", "udp")
                .created("2024-02-01T00:00:00Z")
                .raw_port(json!({"port": 53, "protocol": "UDP"}))
                .spec("ipFamilies", json!(["IPv4"])),
        )
        .service(
            Svc::lb("default", "six")
                .created("2024-03-01T00:00:00Z")
                .raw_port(json!({"port": 53, "protocol": "TCP"}))
                .spec("ipFamilies", json!(["IPv6"])),
        )
        .plan();
    assert_eq!(
        p.port("default/tcp", IpFamily::V4),
        &PortResult::RejectsNoEndpoints
    );
    assert_eq!(
        p.port("default/udp", IpFamily::V4),
        &PortResult::RejectsNoEndpoints
    );
    assert_eq!(
        p.port("default/six", IpFamily::V6),
        &PortResult::RejectsNoEndpoints
    );
}

#[test]
fn a_service_on_other_nodes_does_not_conflict_here() {
    // The older Service is limited to node-b by its selector: it is not served here, so the
    // younger one keeps the port on this node.
    let p = World::new()
        .service(
            Svc::lb("default", "old")
                .created("2023-01-01T00:00:00Z")
                .bare_port(80)
                .annotation("nodelb.io/node-selector", "kubernetes.io/hostname=node-b"),
        )
        .service(
            Svc::lb("default", "young")
                .created("2024-01-01T00:00:00Z")
                .bare_port(80),
        )
        .plan();
    assert_eq!(
        p.port("default/young", IpFamily::V4),
        &PortResult::RejectsNoEndpoints
    );
}

#[test]
fn reserved_ports_are_refused() {
    let p = World::new()
        .service(
            Svc::lb("default", "ssh")
                .created("2024-01-01T00:00:00Z")
                .raw_port(json!({"name": "ssh", "port": 22}))
                .raw_port(json!({"name": "web", "port": 80})),
        )
        .slice(
            Slice::ipv4("default", "ssh-1", "ssh")
                .port("ssh", 22, "TCP")
                .port("web", 80, "TCP")
                .endpoint("198.51.100.10"),
        )
        .plan();
    assert_eq!(
        p.outcome("default/ssh"),
        &ServiceOutcome::ReservedPorts {
            ports: vec![(Protocol::Tcp, 22)]
        }
    );
    assert!(
        !p.v4().contains("default/ssh"),
        "no rules at all, not even for port 80"
    );
}

#[test]
fn overlay_and_routing_ports_are_reserved_per_protocol() {
    let p = World::new()
        .service(
            Svc::lb("default", "vxlan")
                .created("2024-01-01T00:00:00Z")
                .raw_port(json!({"port": 8472, "protocol": "UDP"})),
        )
        .service(
            Svc::lb("default", "bgp")
                .created("2024-01-01T00:00:00Z")
                .raw_port(json!({"port": 179, "protocol": "TCP"})),
        )
        .service(
            Svc::lb("default", "tcp-8472")
                .created("2024-01-01T00:00:00Z")
                .raw_port(json!({"port": 8472, "protocol": "TCP"})),
        )
        .service(
            Svc::lb("default", "udp-179")
                .created("2024-01-01T00:00:00Z")
                .raw_port(json!({"port": 179, "protocol": "UDP"})),
        )
        .plan();
    assert_eq!(
        p.outcome("default/vxlan"),
        &ServiceOutcome::ReservedPorts {
            ports: vec![(Protocol::Udp, 8472)]
        }
    );
    assert_eq!(
        p.outcome("default/bgp"),
        &ServiceOutcome::ReservedPorts {
            ports: vec![(Protocol::Tcp, 179)]
        }
    );
    assert!(!p.v4().contains("default/vxlan") && !p.v4().contains("default/bgp"));
    // The same numbers for the other protocol are free: a UDP reservation does not forbid TCP.
    for free in ["default/tcp-8472", "default/udp-179"] {
        assert_eq!(
            p.port(free, IpFamily::V4),
            &PortResult::RejectsNoEndpoints,
            "{free}"
        );
    }
}

#[test]
fn reserved_ports_flag_replaces_the_list() {
    let mut w = World::new()
        .service(
            Svc::lb("default", "ssh")
                .created("2024-01-01T00:00:00Z")
                .bare_port(22),
        )
        .service(
            Svc::lb("default", "web")
                .created("2024-01-01T00:00:00Z")
                .bare_port(8443),
        );
    w.config.reserved_ports = "8443".parse().unwrap();
    let p = w.plan();
    assert_eq!(
        p.port("default/ssh", IpFamily::V4),
        &PortResult::RejectsNoEndpoints
    );
    assert!(matches!(
        p.outcome("default/web"),
        ServiceOutcome::ReservedPorts { .. }
    ));
}

#[test]
fn a_reserved_service_does_not_win_conflicts() {
    let p = World::new()
        .service(
            Svc::lb("default", "old")
                .created("2023-01-01T00:00:00Z")
                .bare_port(80)
                .bare_port(22),
        )
        .service(
            Svc::lb("default", "young")
                .created("2024-01-01T00:00:00Z")
                .bare_port(80),
        )
        .plan();
    assert_eq!(
        p.port("default/young", IpFamily::V4),
        &PortResult::RejectsNoEndpoints
    );
}

// ---- the table as a whole ----------------------------------------------------------------

#[test]
fn every_rule_and_element_of_a_service_carries_its_comment() {
    let p = World::new()
        .service(web().spec("loadBalancerSourceRanges", json!(["192.0.2.0/24"])))
        .slice(web_slice("web-1", &["198.51.100.10"]))
        .plan();
    let t = p.v4();
    let chain = chain_block(&t, "svc-default/web-tcp-80");
    for line in chain.lines().filter(|l| l.contains("counter")) {
        assert!(line.contains("comment \"default/web:http"), "{line}");
    }
    for set in [
        "services",
        "endpoints",
        "masq-services",
        "lb-services",
        "hairpin",
    ] {
        for line in set_block(&t, set).lines().filter(|l| {
            l.contains(" . ") && !l.contains("type") && !l.trim_start().starts_with("comment")
        }) {
            assert!(
                line.contains("comment \"default/web:http\""),
                "{set}: {line}"
            );
        }
    }
}

#[test]
fn the_plan_is_deterministic() {
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
    assert!(a
        .v4()
        .contains("tcp . 80 . 0 comment \"default/web:http\" : 198.51.100.10 . 8080"));
}

// ---- bad input ---------------------------------------------------------------------------

#[test]
fn invalid_endpoint_addresses_are_skipped_with_a_warning() {
    let p = World::new()
        .service(web())
        .slice(web_slice(
            "web-1",
            &["198.51.100.10", "not-an-ip", "198.51.100.300"],
        ))
        .plan();
    assert_eq!(p.port("default/web", IpFamily::V4), &forwards(1));
    assert!(p.warned("EndpointSlice default/web-1: address \"not-an-ip\" is not an IP address"));
    assert!(p.warned("\"198.51.100.300\""));
}

#[test]
fn ipv6_address_in_an_ipv4_slice_is_skipped_with_a_warning() {
    let p = World::new()
        .service(web())
        .slice(web_slice("web-1", &["198.51.100.10", "2001:db8:b::10"]))
        .plan();
    assert_eq!(p.port("default/web", IpFamily::V4), &forwards(1));
    assert!(p.warned("address 2001:db8:b::10 is not IPv4"));
    assert!(!p.text(IpFamily::V6).contains("2001:db8:b::10"));
}

#[test]
fn out_of_range_and_missing_ports_are_skipped_with_a_warning() {
    let p = World::new()
        .service(
            Svc::lb("default", "web")
                .created("2024-01-01T00:00:00Z")
                .raw_port(json!({"name": "zero", "port": 0}))
                .raw_port(json!({"name": "big", "port": 70000}))
                .raw_port(json!({"name": "ok", "port": 80})),
        )
        .slice(
            Slice::ipv4("default", "web-1", "web")
                .raw_port(json!({"name": "ok", "port": 0, "protocol": "TCP"}))
                .endpoint("198.51.100.10"),
        )
        .plan();
    assert!(p.warned("port \"zero\" (0): port must be 1-65535"));
    assert!(p.warned("port \"big\" (70000): port must be 1-65535"));
    assert!(p.warned("EndpointSlice default/web-1: port \"ok\": number Some(0) is not 1-65535"));
    let ports = p.outcome("default/web").ports(IpFamily::V4).unwrap();
    assert_eq!(ports.len(), 1);
    assert_eq!(ports[0].result, PortResult::RejectsNoEndpoints);
}

#[test]
fn service_without_ports_gets_no_rules_and_a_warning() {
    let p = World::new()
        .service(Svc::lb("default", "empty"))
        .service(web())
        .plan();
    assert_eq!(p.outcome("default/empty"), &ServiceOutcome::NoValidPorts);
    assert!(p.warned("Service default/empty: no valid port"));
    assert_eq!(
        p.port("default/web", IpFamily::V4),
        &PortResult::RejectsNoEndpoints
    );
}

#[test]
fn unknown_protocols_are_skipped_with_a_warning() {
    let p = World::new()
        .service(
            Svc::lb("default", "web")
                .created("2024-01-01T00:00:00Z")
                .port("q", 443, "QUIC")
                .raw_port(json!({"name": "http", "port": 80})),
        )
        .slice(web_slice("web-1", &["198.51.100.10"]))
        .plan();
    assert!(p.warned("protocol \"QUIC\" is not TCP, UDP or SCTP"));
    assert_eq!(p.port("default/web", IpFamily::V4), &forwards(1));
    assert!(!p.v4().contains(". 443"));
}

#[test]
fn duplicate_endpoint_ready_copy_wins() {
    // A pod IP reused while the pod that had it terminates: the old pod's copy is terminating
    // (still serving) in one slice, the new pod's is ready in another. In either slice order
    // the ready copy counts: a ready endpoint, on the new pod's node, no warning.
    let old = "198.51.100.10 node-b ready=false serving=true terminating=true";
    let new = "198.51.100.10 node-a";
    for (first, second) in [(old, new), (new, old)] {
        let p = World::new()
            .service(web().spec("externalTrafficPolicy", "Local"))
            .slice(web_slice("web-a", &[first]))
            .slice(web_slice("web-b", &[second]))
            .plan();
        assert_eq!(
            p.port("default/web", IpFamily::V4),
            &forwards(1),
            "{first} / {second}"
        );
        assert!(p.warnings.is_empty(), "{:?}", p.warnings);
    }
    // Two copies not terminating: the first in slice name order.
    let p = World::new()
        .service(web().spec("externalTrafficPolicy", "Local"))
        .slice(web_slice("web-a", &["198.51.100.10 node-b"]))
        .slice(web_slice("web-b", &["198.51.100.10 node-a"]))
        .plan();
    assert_eq!(
        p.port("default/web", IpFamily::V4),
        &PortResult::DropsNoLocalEndpoint { elsewhere: 1 }
    );
    // A copy not ready and not terminating (the new pod starting) wins too, as in kube-proxy:
    // the address is not used until that pod is ready.
    let p = World::new()
        .service(web())
        .slice(web_slice("web-a", &[old]))
        .slice(web_slice("web-b", &["198.51.100.10 node-a ready=false"]))
        .plan();
    assert_eq!(
        p.port("default/web", IpFamily::V4),
        &PortResult::RejectsNoEndpoints
    );
}

#[test]
fn duplicate_endpoints_count_once_with_a_warning() {
    let p = World::new()
        .service(web())
        .slice(web_slice("web-1", &["198.51.100.10", "198.51.100.10"]))
        .slice(web_slice("web-2", &["198.51.100.10", "198.51.100.11"]))
        .plan();
    assert_eq!(p.port("default/web", IpFamily::V4), &forwards(2));
    assert!(p.warned("endpoint 198.51.100.10 port 8080 is listed more than once"));
}

/// An IPv6 slice of `default/web` with port `http` → 8080 and the given endpoints.
fn v6_web_slice(name: &str, endpoints: &[String]) -> Slice {
    Slice::ipv6("default", name, "web")
        .port("http", 8080, "TCP")
        .endpoints(endpoints)
}

#[test]
fn a_thousand_endpoint_slice_is_programmed_whole() {
    let eps: Vec<String> = (0..1000)
        .map(|i| format!("2001:db8:b::{:x}", i + 1))
        .collect();
    let p = World::new()
        .service(web().spec("ipFamilies", json!(["IPv6"])))
        .slice(v6_web_slice("web-1", &eps))
        .plan();
    assert_eq!(p.port("default/web", IpFamily::V6), &forwards(1000));
    assert!(p.text(IpFamily::V6).contains("numgen random mod 1000"));
    let t = p
        .tables
        .iter()
        .find(|t| t.family == nodelb_netfilter::Family::Ip6)
        .unwrap();
    assert_eq!(t.sets["endpoints"].elements.len(), 1000);
}

#[test]
fn endpoints_beyond_the_cap_are_left_out_with_a_warning() {
    let mut w = World::new().service(web().spec("ipFamilies", json!(["IPv6"])));
    for s in 0..11u16 {
        let eps: Vec<String> = (0..1000)
            .map(|i| format!("2001:db8:b:{s:x}::{:x}", i + 1))
            .collect();
        w = w.slice(v6_web_slice(&format!("web-{s}"), &eps));
    }
    let p = w.plan();
    assert_eq!(
        p.port("default/web", IpFamily::V6),
        &forwards(endpoints::MAX_ENDPOINTS)
    );
    assert!(p.warned("11000 endpoints, more than the 10000"));
}

#[test]
fn a_slice_before_its_service_is_harmless_and_used_once_the_service_arrives() {
    let w = World::new().slice(web_slice("web-1", &["198.51.100.10"]));
    let p = w.plan();
    assert!(p.services.is_empty() && p.warnings.is_empty());
    assert!(!p.v4().contains("198.51.100.10"));
    let p = w.service(web()).plan();
    assert_eq!(p.port("default/web", IpFamily::V4), &forwards(1));
}

#[test]
fn a_bad_service_does_not_disturb_others() {
    let p = World::new()
        .service(
            Svc::lb("default", "bad")
                .created("2024-01-01T00:00:00Z")
                .raw_port(json!({"port": 0, "protocol": "ICMP"}))
                .spec("externalTrafficPolicy", "Sometimes")
                .spec("loadBalancerSourceRanges", json!(["nonsense"]))
                .spec("ipFamilies", json!(["IPv5"])),
        )
        .service(web())
        .slice(web_slice("web-1", &["198.51.100.10"]))
        .plan();
    assert_eq!(p.outcome("default/bad"), &ServiceOutcome::NoValidPorts);
    assert!(p.warned("externalTrafficPolicy \"Sometimes\""));
    assert!(p.warned("\"nonsense\" is not a CIDR"));
    assert!(p.warned("\"IPv5\" is not IPv4 or IPv6"));
    assert_eq!(p.port("default/web", IpFamily::V4), &forwards(1));
}

#[test]
fn names_that_are_not_dns_labels_are_skipped_with_a_warning() {
    let p = World::new()
        .service(
            Svc::lb("default", "Bad_Name")
                .created("2024-01-01T00:00:00Z")
                .bare_port(80),
        )
        .service(
            Svc::lb("default", "web")
                .created("2024-01-01T00:00:00Z")
                .bare_port(81),
        )
        .plan();
    assert!(p.warned("Service default/Bad_Name: namespace or name is not a DNS label"));
    assert_eq!(
        p.port("default/web", IpFamily::V4),
        &PortResult::RejectsNoEndpoints
    );
}

#[test]
fn unknown_slice_address_types_are_skipped_with_a_warning() {
    let p = World::new()
        .service(web())
        .slice(
            Slice::of("default", "web-x", "web", "IPX")
                .port("http", 8080, "TCP")
                .endpoint("198.51.100.10"),
        )
        .plan();
    assert!(p.warned("addressType \"IPX\""));
    assert_eq!(
        p.port("default/web", IpFamily::V4),
        &PortResult::RejectsNoEndpoints
    );
}

// ---- helpers to read rendered nft text ---------------------------------------------------

/// The text of `set NAME { ... }` or `map NAME { ... }` in a rendered table.
fn set_block(table: &str, name: &str) -> String {
    block(table, &format!("set {name} {{"))
        .or_else(|| block(table, &format!("map {name} {{")))
        .unwrap_or_else(|| panic!("no set {name} in\n{table}"))
}

fn chain_block(table: &str, name: &str) -> String {
    block(table, &format!("chain {name} {{"))
        .unwrap_or_else(|| panic!("no chain {name} in\n{table}"))
}

fn block(table: &str, header: &str) -> Option<String> {
    let start = table.find(header)?;
    let mut depth = 0usize;
    for (i, c) in table[start..].char_indices() {
        match c {
            '{' => depth += 1,
            '}' => {
                depth -= 1;
                if depth == 0 {
                    return Some(table[start..start + i + 1].to_string());
                }
            }
            _ => {}
        }
    }
    None
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

#[test]
fn a_service_that_loses_one_port_gets_no_rules_in_that_family() {
    // `old` holds TCP 8081 in IPv4 only; `both` asks TCP and UDP 8081 in both families.
    let p = World::new()
        .service(
            Svc::lb("default", "old")
                .created("2023-01-01T00:00:00Z")
                .port("tcp", 8081, "TCP")
                .spec("ipFamilies", json!(["IPv4"])),
        )
        .service(
            Svc::lb("default", "both")
                .created("2024-01-01T00:00:00Z")
                .port("tcp", 8081, "TCP")
                .port("udp", 8081, "UDP")
                .spec("ipFamilies", json!(["IPv4", "IPv6"]))
                .spec("ipFamilyPolicy", "RequireDualStack"),
        )
        .plan();
    let v4 = p.outcome("default/both").ports(IpFamily::V4).unwrap();
    let old = ServiceKey::new("default", "old");
    assert_eq!(
        v4[0].result,
        PortResult::Conflict {
            holder: old.clone()
        }
    );
    assert_eq!(
        v4[1].result,
        PortResult::Withheld {
            lost: v4[0].port.clone(),
            holder: PortHolder::Service(old)
        },
        "UDP 8081 did not lose, but the Service gets nothing in IPv4"
    );
    assert!(
        !p.v4().contains("default/both"),
        "no rule, element or counter:\n{}",
        p.v4()
    );
    assert!(p.v4().contains("default/old:tcp"));
    // IPv6 has no conflict: both ports are served there.
    let v6 = p.outcome("default/both").ports(IpFamily::V6).unwrap();
    assert!(v6.iter().all(|p| p.result.is_programmed()), "{v6:?}");
    assert!(p.text(IpFamily::V6).contains("default/both:udp"));
}

/// `TCP 0.0.0.0 7000 socat`: protocol, address, port, process (optional).
fn listener(spec: &str) -> crate::vocab::Listener {
    let f: Vec<&str> = spec.split_whitespace().collect();
    crate::vocab::Listener {
        protocol: Protocol::parse(Some(f[0])).unwrap(),
        address: f[1].parse().unwrap(),
        port: f[2].parse().unwrap(),
        process: f.get(3).map(|p| p.to_string()),
    }
}

/// A dual-stack LoadBalancer Service `default/<name>` on `ports` (name, port, protocol), with
/// one ready endpoint per family.
fn dual(w: World, name: &str, ports: &[(&str, u16, &str)]) -> World {
    let mut svc = Svc::lb("default", name)
        .created("2024-01-01T00:00:00Z")
        .dual_stack();
    for (n, p, proto) in ports {
        svc = svc.port(n, *p, proto);
    }
    let slice = |fam: &str, addr: &str| {
        let s = Slice::of("default", &format!("{name}-{fam}"), name, fam);
        let s = ports
            .iter()
            .fold(s, |s, (n, p, proto)| s.port(n, 10000 + p, proto));
        s.endpoint(addr)
    };
    w.service(svc)
        .slice(slice("IPv4", "198.51.100.10"))
        .slice(slice("IPv6", "2001:db8:b::10"))
}

const TCP_7000: &[(&str, u16, &str)] = &[("tcp", 7000, "TCP")];

fn held_by(spec: &str) -> PortResult {
    PortResult::HostListener {
        listener: listener(spec),
    }
}

#[test]
fn a_host_listener_on_the_wildcard_blocks_the_port() {
    let p = dual(World::new(), "web", TCP_7000)
        .listener("TCP 0.0.0.0 7000 socat")
        .plan();
    assert_eq!(
        p.port("default/web", IpFamily::V4),
        &held_by("TCP 0.0.0.0 7000 socat")
    );
    assert!(
        !p.v4().contains("default/web"),
        "no rule, element or counter for the Service in IPv4:\n{}",
        p.v4()
    );
    assert_eq!(
        p.outcome("default/web").to_string(),
        "served: IPv4 [203.0.113.1] tcp/TCP/7000 no rules: in use on the node by socat on 0.0.0.0; IPv6 [2001:db8::1] tcp/TCP/7000 forwards to 1 endpoints;"
    );
    // An IPv4 wildcard socket is IPv4's only: the Service keeps IPv6.
    assert!(p.text(IpFamily::V6).contains("default/web:tcp"));
    assert_eq!(p.port("default/web", IpFamily::V6), &forwards(1));
}

#[test]
fn a_listener_on_a_served_address_blocks_the_port() {
    let p = dual(World::new(), "web", TCP_7000)
        .listener(&format!("TCP {NODE_V4} 7000"))
        .listener(&format!("TCP {NODE_V6} 7000 nginx"))
        .plan();
    assert_eq!(
        p.port("default/web", IpFamily::V4),
        &held_by(&format!("TCP {NODE_V4} 7000"))
    );
    assert_eq!(
        p.port("default/web", IpFamily::V6),
        &held_by(&format!("TCP {NODE_V6} 7000 nginx"))
    );
    assert!(p.outcome("default/web").programmed_families().is_empty());
    assert!(!p.v4().contains("default/web") && !p.text(IpFamily::V6).contains("default/web"));
}

#[test]
fn a_listener_on_another_address_does_not_block() {
    // Loopback, and an address on the host that is not one of the Node's addresses: neither
    // receives traffic for the node's address.
    let p = dual(World::new(), "web", TCP_7000)
        .listener("TCP 127.0.0.1 7000 socat")
        .listener("TCP 192.0.2.254 7000 socat")
        .listener("TCP ::1 7000 socat")
        .listener("TCP 2001:db8::99 7000 socat")
        .plan();
    for f in [IpFamily::V4, IpFamily::V6] {
        assert_eq!(p.port("default/web", f), &forwards(1), "{f}");
    }
    assert!(p.v4().contains("default/web:tcp"));
}

#[test]
fn a_udp_listener_does_not_block_tcp() {
    let p = World::new()
        .service(
            Svc::lb("default", "tcp")
                .created("2024-01-01T00:00:00Z")
                .raw_port(json!({"port": 53, "protocol": "TCP"})),
        )
        .service(
            Svc::lb("default", "udp")
                .created("2024-01-01T00:00:00Z")
                .raw_port(json!({"port": 53, "protocol": "UDP"})),
        )
        .listener("UDP 0.0.0.0 53 dnsmasq")
        .plan();
    assert_eq!(
        p.port("default/tcp", IpFamily::V4),
        &PortResult::RejectsNoEndpoints
    );
    assert_eq!(
        p.port("default/udp", IpFamily::V4),
        &held_by("UDP 0.0.0.0 53 dnsmasq")
    );
    assert!(p.v4().contains("default/tcp:53") && !p.v4().contains("default/udp:53"));
}

#[test]
fn a_dual_stack_wildcard_listener_blocks_both_families() {
    // The host reports an IPv6 wildcard socket without IPV6_V6ONLY as `::` and `0.0.0.0`;
    // one with it as `::` alone.
    let p = dual(World::new(), "web", TCP_7000)
        .listener("TCP :: 7000 java")
        .listener("TCP 0.0.0.0 7000 java")
        .plan();
    assert!(p.outcome("default/web").programmed_families().is_empty());
    let p = dual(World::new(), "web", TCP_7000)
        .listener("TCP :: 7000 java")
        .plan();
    assert_eq!(
        p.outcome("default/web").programmed_families(),
        vec![IpFamily::V4],
        "a v6-only socket leaves IPv4 to the Service"
    );
}

#[test]
fn a_held_port_withholds_the_services_other_ports_in_that_family() {
    let p = dual(
        World::new(),
        "web",
        &[("tcp", 7000, "TCP"), ("udp", 7001, "UDP")],
    )
    .listener("TCP 0.0.0.0 7000 socat")
    .plan();
    let v4 = p.outcome("default/web").ports(IpFamily::V4).unwrap();
    assert_eq!(v4[0].result, held_by("TCP 0.0.0.0 7000 socat"));
    assert_eq!(
        v4[1].result,
        PortResult::Withheld {
            lost: v4[0].port.clone(),
            holder: PortHolder::Listener(listener("TCP 0.0.0.0 7000 socat")),
        },
        "UDP 7001 is free, but the Service gets nothing in IPv4"
    );
    assert_eq!(
        v4[1].result.to_string(),
        "no rules: 7000/TCP held by socat on 0.0.0.0, on the node (all or nothing)"
    );
    assert!(!p.v4().contains("default/web"), "{}", p.v4());
    assert!(p.text(IpFamily::V6).contains("default/web:udp"));
}

#[test]
fn a_host_listener_wins_over_the_oldest_service() {
    let p = World::new()
        .service(
            Svc::lb("default", "old")
                .created("2023-01-01T00:00:00Z")
                .bare_port(7000),
        )
        .service(
            Svc::lb("default", "new")
                .created("2024-01-01T00:00:00Z")
                .bare_port(7000),
        )
        .listener("TCP 0.0.0.0 7000 socat")
        .plan();
    for s in ["default/old", "default/new"] {
        assert_eq!(
            p.port(s, IpFamily::V4),
            &held_by("TCP 0.0.0.0 7000 socat"),
            "{s}"
        );
    }
    assert!(!p.v4().contains(":7000"), "{}", p.v4());
}

#[test]
fn a_listener_that_appears_later_takes_the_port_back() {
    let w = dual(World::new(), "web", TCP_7000).service(
        Svc::lb("default", "other")
            .created("2024-01-01T00:00:00Z")
            .raw_port(json!({"name": "tcp", "port": 8000})),
    );
    let objects = Objects::from_lists(w.services.clone(), w.slices.clone());
    let bare = Context::new(
        w.node.clone(),
        w.local.clone(),
        w.families,
        w.config.clone(),
    );
    let mut planner = Planner::new();
    planner.update(&objects, &bare, None);
    let web = ServiceKey::new("default", "web");
    assert!(
        planner.outcome(&web).unwrap().programmed_families() == vec![IpFamily::V4, IpFamily::V6]
    );
    assert!(planner.taken_ports().is_empty());
    let with = |spec: &str| {
        bare.clone().with_listeners(listeners::HostListeners::new(
            [listener(spec)].into_iter().collect(),
        ))
    };
    // The listener starts: the Service loses IPv4 in an edit, and nothing else is replanned.
    let u = planner.update(
        &objects,
        &with("TCP 0.0.0.0 7000 socat"),
        Some(&BTreeSet::new()),
    );
    assert_eq!((u.replanned, u.changed.clone()), (1, [web.clone()].into()));
    let TableChange::Edit(edits) = u.change else {
        panic!("a listener does not replace the tables");
    };
    assert_eq!(edits.len(), 1, "IPv4 only: {edits:?}");
    assert!(!edits[0].1.elements["services"].del.is_empty());
    assert_eq!(
        planner.outcome(&web).unwrap().ports(IpFamily::V4).unwrap()[0].result,
        held_by("TCP 0.0.0.0 7000 socat")
    );
    let taken: Vec<_> = planner
        .taken_ports()
        .into_iter()
        .map(|(slot, l, claimed)| (slot, l.process.clone(), claimed))
        .collect();
    assert_eq!(
        taken,
        vec![(
            (IpFamily::V4, Protocol::Tcp, 7000),
            Some("socat".to_string()),
            true
        )]
    );
    let fresh = World {
        listeners: with("TCP 0.0.0.0 7000 socat").listeners,
        ..w
    };
    assert_eq!(
        planner.tables(),
        fresh.plan().tables,
        "as planned from scratch"
    );
    // A listener on a port no Service claims takes it from none.
    let u = planner.update(&objects, &with("TCP 0.0.0.0 9000"), Some(&BTreeSet::new()));
    assert_eq!(u.changed, [web.clone()].into(), "web gets 7000 back");
    assert!(
        !planner.taken_ports()[0].2,
        "9000 taken, from no Service's port"
    );
    // It stops: the Service gets its rules back.
    planner.update(&objects, &bare, Some(&BTreeSet::new()));
    assert_eq!(
        planner.outcome(&web).unwrap().programmed_families(),
        vec![IpFamily::V4, IpFamily::V6]
    );
    assert_eq!(
        planner.tables(),
        World {
            listeners: Default::default(),
            ..fresh
        }
        .plan()
        .tables
    );
}
