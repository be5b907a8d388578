//! `nodelb.io/published-addresses` on Nodes and Services (`published.rs`): what the status
//! publishes in place of the node addresses, and when it does not.

use super::tests::{lb, slice_of, World};
use super::*;
use crate::fixtures::{heartbeat, node};
use serde_json::json;

const ANNOTATION: &str = published::PUBLISHED_ADDRESSES_ANNOTATION;

/// [`World::two_nodes`] with node-a's Node annotated `value`.
fn node_a_published(w: World, value: &str) -> World {
    let mut w = w;
    w.nodes[0] = node("node-a")
        .address("InternalIP", "203.0.113.10")
        .address("InternalIP", "2001:db8::a")
        .label("zone", "a")
        .annotation(ANNOTATION, value)
        .k8s();
    w
}

#[test]
fn a_nodes_published_addresses_replace_its_own_in_every_status_it_serves() {
    let w = node_a_published(
        World::two_nodes()
            .service(lb("web", 80))
            .service(lb("api", 81)),
        " 198.51.100.10 , 198.51.100.11",
    );
    for svc in ["web", "api"] {
        assert_eq!(
            w.ingress(svc),
            vec!["198.51.100.10", "198.51.100.11", "203.0.113.9"],
            "{svc}"
        );
    }
}

#[test]
fn a_family_the_node_annotation_does_not_name_keeps_the_nodes_own() {
    let w = node_a_published(
        World::two_nodes().service(lb("web", 80).dual_stack()),
        "198.51.100.10",
    );
    assert_eq!(
        w.ingress("web"),
        vec!["198.51.100.10", "203.0.113.9", "2001:db8::a", "2001:db8::b"]
    );
    let w = node_a_published(
        World::two_nodes().service(lb("web", 80).dual_stack()),
        "2001:db8:f::a",
    );
    assert_eq!(
        w.ingress("web"),
        vec![
            "203.0.113.9",
            "203.0.113.10",
            "2001:db8::b",
            "2001:db8:f::a"
        ]
    );
    // A single-stack Service never shows the other family's published address.
    assert_eq!(
        node_a_published(World::two_nodes().service(lb("web", 80)), "2001:db8:f::a").ingress("web"),
        vec!["203.0.113.9", "203.0.113.10"]
    );
}

#[test]
fn a_node_publishes_nothing_in_a_family_it_does_not_serve() {
    let mut w = node_a_published(
        World::two_nodes().service(lb("web", 80).dual_stack()),
        "198.51.100.10,2001:db8:f::a",
    );
    w.leases[0] = heartbeat("node-a").renewed_ago(1).families("IPv4").k8s();
    assert_eq!(
        w.ingress("web"),
        vec!["198.51.100.10", "203.0.113.9", "2001:db8::b"]
    );
    // A stale heartbeat: nothing of node-a at all.
    w.leases[0] = heartbeat("node-a")
        .renewed_ago(20)
        .families("IPv4,IPv6")
        .k8s();
    assert_eq!(w.ingress("web"), vec!["203.0.113.9", "2001:db8::b"]);
}

#[test]
fn an_invalid_node_annotation_is_ignored_whole_and_its_agent_says_why() {
    let w = node_a_published(
        World::two_nodes().service(lb("web", 80)),
        "198.51.100.10,nonsense",
    );
    assert_eq!(w.ingress("web"), vec!["203.0.113.9", "203.0.113.10"]);
    // The leader says nothing of it: the node's agent does, from this.
    assert!(w.problems("web").is_empty(), "{:?}", w.problems("web"));
    let warning = published::node_warning(&w.nodes[0]).expect("a warning");
    assert_eq!(
        warning.to_string(),
        "Node node-a: annotation nodelb.io/published-addresses \"198.51.100.10,nonsense\": \"nonsense\" is not an IP address; ignored: the status publishes the node's own addresses"
    );
    assert!(published::node_warning(&w.nodes[1]).is_none());
    let many: Vec<String> = (1..=17).map(|i| format!("198.51.100.{i}")).collect();
    let w = node_a_published(World::two_nodes().service(lb("web", 80)), &many.join(","));
    assert_eq!(w.ingress("web"), vec!["203.0.113.9", "203.0.113.10"]);
}

#[test]
fn published_addresses_follow_the_services_address_types() {
    // node-a: InternalIP and ExternalIP; node-b: InternalIP only, published as 192.0.2.9.
    let world = |svc| {
        let mut w = World::two_nodes().service(svc);
        w.nodes[0] = node("node-a")
            .address("InternalIP", "203.0.113.10")
            .address("ExternalIP", "198.51.100.1")
            .k8s();
        w.nodes[1] = node("node-b")
            .address("InternalIP", "203.0.113.9")
            .annotation(ANNOTATION, "192.0.2.9")
            .k8s();
        w
    };
    let types = |t: &str| lb("web", 80).annotation("nodelb.io/address-types", t);
    // node-b has no ExternalIP: it does not serve, so its published address is not listed.
    assert_eq!(
        world(types("ExternalIP")).ingress("web"),
        vec!["198.51.100.1"]
    );
    assert_eq!(
        world(types("InternalIP")).ingress("web"),
        vec!["192.0.2.9", "203.0.113.10"]
    );
    assert_eq!(
        world(lb("web", 80)).ingress("web"),
        vec!["192.0.2.9", "198.51.100.1"]
    );
}

#[test]
fn a_services_published_addresses_replace_the_nodes_in_its_status() {
    let w = node_a_published(
        World::two_nodes()
            .service(lb("web", 80).annotation(ANNOTATION, "198.51.100.51,198.51.100.50"))
            .service(lb("api", 81))
            .slice(slice_of("web", &["198.51.100.20 node-a"])),
        "198.51.100.10",
    );
    // The Service's own, not the nodes' (published or not); other Services keep theirs.
    assert_eq!(w.ingress("web"), vec!["198.51.100.50", "198.51.100.51"]);
    assert_eq!(w.ingress("api"), vec!["198.51.100.10", "203.0.113.9"]);
    let c = w.serving("web");
    assert!(c.status, "{c:?}");
    assert_eq!(c.message, "served on 2 of 2 nodes");
    // Per family, in the Service's families order.
    let w = World::two_nodes().service(
        lb("web", 80)
            .spec("ipFamilies", json!(["IPv6", "IPv4"]))
            .spec("ipFamilyPolicy", "RequireDualStack")
            .annotation(ANNOTATION, "198.51.100.50"),
    );
    assert_eq!(
        w.ingress("web"),
        vec!["2001:db8::a", "2001:db8::b", "198.51.100.50"]
    );
}

#[test]
fn a_services_published_addresses_are_not_published_when_no_node_serves_it() {
    let mut w = World::two_nodes()
        .service(lb("web", 80).annotation(ANNOTATION, "198.51.100.50,2001:db8:f::50"));
    w.leases.clear();
    assert!(w.ingress("web").is_empty());
    let c = w.serving("web");
    assert!(!c.status);
    assert_eq!(c.reason, "NoServingNodes");
    // A family no node serves it in is left out, whatever the annotation names.
    let mut w = World::two_nodes().service(
        lb("web", 80)
            .dual_stack()
            .annotation(ANNOTATION, "198.51.100.50,2001:db8:f::50"),
    );
    for (i, n) in ["node-a", "node-b"].into_iter().enumerate() {
        w.leases[i] = heartbeat(n).renewed_ago(1).families("IPv4").k8s();
    }
    assert_eq!(w.ingress("web"), vec!["198.51.100.50"]);
}

#[test]
fn an_invalid_service_annotation_falls_back_to_the_nodes_and_the_condition_says_why() {
    let w = World::two_nodes()
        .service(lb("web", 80).annotation(ANNOTATION, "198.51.100.50,203.0.113.0/24"))
        .slice(slice_of("web", &["198.51.100.20 node-a"]));
    assert_eq!(w.ingress("web"), vec!["203.0.113.9", "203.0.113.10"]);
    let notes: Vec<(&str, String)> = w
        .problems("web")
        .iter()
        .map(|p| (p.reason(), p.note()))
        .collect();
    let note = "annotation nodelb.io/published-addresses \"198.51.100.50,203.0.113.0/24\": \"203.0.113.0/24\" is not an IP address; ignored: the serving nodes' addresses are published";
    assert_eq!(notes, vec![("InvalidInput", note.to_string())]);
    let c = w.serving("web");
    assert!(c.status);
    assert_eq!(c.message, format!("served on 2 of 2 nodes; {note}"));
}

#[test]
fn a_node_annotation_changed_recomputes_the_status_it_serves() {
    let mut w = World::two_nodes()
        .service(lb("web", 80))
        .service(lb("outer", 81).annotation(ANNOTATION, "198.51.100.50"));
    let mut s = Status::default();
    let beats = heartbeat::read(&w.leases);
    let ages: BTreeMap<String, Duration> =
        beats.keys().map(|n| (n.clone(), Duration::ZERO)).collect();
    s.compute(&w.objects, &w.nodes, &beats, &ages, &w.cfg);
    w = node_a_published(w, "198.51.100.10");
    let changed = s.compute(&w.objects, &w.nodes, &beats, &ages, &w.cfg);
    let web = ServiceKey::new("default", "web");
    assert!(changed.contains(&web), "{changed:?}");
    let got: Vec<String> = s.desired()[&web]
        .ingress
        .iter()
        .map(|a| a.to_string())
        .collect();
    assert_eq!(got, vec!["198.51.100.10", "203.0.113.9"]);
    // The outer load balancer's Service publishes what it did.
    assert!(!changed.contains(&ServiceKey::new("default", "outer")));
}
