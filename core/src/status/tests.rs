//! One test per rule of docs/design.md's "Who serves, and the status", with the clock as an
//! input.

use super::condition::Serving;
use super::heartbeat::{self, AgentPod, Heartbeat, KubeletLease};
use super::ingress::{self, Write};
use super::*;
use crate::fixtures::{heartbeat, node, Slice, Svc, NOW};
use crate::objects::index::Service;
use crate::plan::servicelb::{ServiceLb, ENABLELB_LABEL, LBPOOL_LABEL};
use crate::vocab::ServiceKey;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::jiff::SignedDuration;
use k8s_openapi::jiff::Timestamp;
use serde_json::json;
use std::sync::Arc;

fn now() -> Timestamp {
    NOW.parse().unwrap()
}

/// A LoadBalancer Service `default/<name>` created 2024-01-01 with one TCP port `http`.
pub(super) fn lb(name: &str, port: u16) -> Svc {
    Svc::lb("default", name)
        .created("2024-01-01T00:00:00Z")
        .port("http", port, "TCP")
}

/// The IPv4 slice `<service>-1` of `default/<service>`, port `http` → 8080, with `endpoints`
/// in [`crate::fixtures::Ep::parse`]'s short form (`address node`).
pub(super) fn slice_of(service: &str, endpoints: &[&str]) -> Slice {
    Slice::ipv4("default", &format!("{service}-1"), service)
        .port("http", 8080, "TCP")
        .endpoints(endpoints)
}

pub(super) struct World {
    pub(super) objects: Objects,
    pub(super) nodes: Vec<Node>,
    pub(super) leases: Vec<Lease>,
    pub(super) cfg: StatusConfig,
}

impl World {
    pub(super) fn two_nodes() -> World {
        World {
            objects: Objects::default(),
            nodes: vec![
                node("node-a")
                    .address("InternalIP", "203.0.113.10")
                    .address("InternalIP", "2001:db8::a")
                    .label("zone", "a")
                    .k8s(),
                node("node-b")
                    .address("InternalIP", "203.0.113.9")
                    .address("InternalIP", "2001:db8::b")
                    .label("zone", "b")
                    .k8s(),
            ],
            leases: vec![
                heartbeat("node-a")
                    .renewed_ago(1)
                    .families("IPv4,IPv6")
                    .k8s(),
                heartbeat("node-b")
                    .renewed_ago(1)
                    .families("IPv4,IPv6")
                    .k8s(),
            ],
            cfg: StatusConfig {
                planner: Config::default(),
                node_lease_duration: Duration::from_secs(15),
                liveness: None,
            },
        }
    }

    pub(super) fn service(mut self, s: Svc) -> World {
        self.objects.put_service(Arc::new(s.index()));
        self
    }

    pub(super) fn slice(mut self, s: Slice) -> World {
        self.objects.put_slice(Arc::new(s.index()));
        self
    }

    pub(super) fn compute(&self) -> BTreeMap<ServiceKey, Desired> {
        self.compute_at(&heartbeat::read(&self.leases), now())
    }

    /// A fresh computation with these heartbeats at `at`.
    fn compute_at(
        &self,
        beats: &BTreeMap<String, heartbeat::Heartbeat>,
        at: Timestamp,
    ) -> BTreeMap<ServiceKey, Desired> {
        let mut s = Status::default();
        s.compute(
            &self.objects,
            &self.nodes,
            beats,
            &ages_at(beats, at),
            &self.cfg,
        );
        s.desired().clone()
    }

    pub(super) fn ingress(&self, name: &str) -> Vec<String> {
        self.compute()[&ServiceKey::new("default", name)]
            .ingress
            .iter()
            .map(|a| a.to_string())
            .collect()
    }

    pub(super) fn problems(&self, name: &str) -> Vec<Problem> {
        self.compute()[&ServiceKey::new("default", name)]
            .problems
            .clone()
    }
}

#[test]
fn every_node_with_a_fresh_heartbeat_serves_sorted_numerically() {
    let w = World::two_nodes().service(lb("web", 80));
    // 203.0.113.9 sorts before 203.0.113.10 as a number, not as text.
    assert_eq!(w.ingress("web"), vec!["203.0.113.9", "203.0.113.10"]);
}

#[test]
fn a_stale_heartbeat_takes_its_node_out() {
    let mut w = World::two_nodes().service(lb("web", 80));
    w.leases = vec![
        heartbeat("node-a").renewed_ago(1).families("IPv4").k8s(),
        heartbeat("node-b").renewed_ago(16).families("IPv4").k8s(),
    ];
    assert_eq!(w.ingress("web"), vec!["203.0.113.10"]);
    // Younger than the duration is fresh; at 14 s it still counts.
    w.leases[1] = heartbeat("node-b").renewed_ago(14).families("IPv4").k8s();
    assert_eq!(w.ingress("web"), vec!["203.0.113.9", "203.0.113.10"]);
    // No heartbeat at all: not serving.
    w.leases.truncate(1);
    assert_eq!(w.ingress("web"), vec!["203.0.113.10"]);
}

#[test]
fn a_node_serves_only_the_families_its_heartbeat_names() {
    let mut w =
        World::two_nodes().service(lb("web", 80).spec("ipFamilies", json!(["IPv4", "IPv6"])));
    w.leases = vec![
        heartbeat("node-a")
            .renewed_ago(1)
            .families("IPv4,IPv6")
            .k8s(),
        heartbeat("node-b").renewed_ago(1).families("IPv4").k8s(),
    ];
    assert_eq!(
        w.ingress("web"),
        vec!["203.0.113.9", "203.0.113.10", "2001:db8::a"]
    );
}

#[test]
fn ip_families_order_the_addresses() {
    let w = World::two_nodes().service(lb("web", 80).spec("ipFamilies", json!(["IPv6", "IPv4"])));
    assert_eq!(
        w.ingress("web"),
        vec!["2001:db8::a", "2001:db8::b", "203.0.113.9", "203.0.113.10"]
    );
}

#[test]
fn external_ips_are_published_before_internal_ones() {
    let mut w = World::two_nodes().service(lb("web", 80));
    w.nodes[0] = node("node-a")
        .address("InternalIP", "203.0.113.10")
        .address("ExternalIP", "198.51.100.1")
        .k8s();
    assert_eq!(w.ingress("web"), vec!["198.51.100.1", "203.0.113.9"]);
}

/// Node-a with an InternalIP and an ExternalIP, node-b with an InternalIP, and `svc`.
fn internal_and_external(svc: Svc) -> World {
    let mut w = World::two_nodes().service(svc);
    w.nodes[0] = node("node-a")
        .address("InternalIP", "203.0.113.10")
        .address("ExternalIP", "198.51.100.1")
        .k8s();
    w
}

#[test]
fn the_status_lists_only_the_addresses_of_the_services_address_types_and_cidrs() {
    let types = |t: &str| lb("web", 80).annotation("nodelb.io/address-types", t);
    // ExternalIP only: node-b, which has none, serves nothing and is not published.
    let w = internal_and_external(types("ExternalIP"));
    assert_eq!(w.ingress("web"), vec!["198.51.100.1"]);
    // InternalIP only: node-a's InternalIP, though it has an ExternalIP.
    let w = internal_and_external(types("InternalIP"));
    assert_eq!(w.ingress("web"), vec!["203.0.113.9", "203.0.113.10"]);
    // Both: the ExternalIP stands for node-a, as without the annotation.
    let w = internal_and_external(types("ExternalIP,InternalIP"));
    assert_eq!(w.ingress("web"), vec!["198.51.100.1", "203.0.113.9"]);
    // A CIDR that holds node-a's InternalIP only.
    let w = internal_and_external(
        lb("web", 80).annotation("nodelb.io/address-cidrs", "203.0.113.10/32"),
    );
    assert_eq!(w.ingress("web"), vec!["203.0.113.10"]);
    // The flags' default, for a Service without the annotations.
    let mut w = internal_and_external(lb("web", 80));
    w.cfg.planner.addresses.cidrs = vec![crate::plan::cidr::Cidr::parse("203.0.113.8/30").unwrap()];
    assert_eq!(w.ingress("web"), vec!["203.0.113.9", "203.0.113.10"]);
}

#[test]
fn services_alike_but_for_their_address_types_publish_their_own_addresses() {
    let w =
        internal_and_external(lb("web", 80).annotation("nodelb.io/address-types", "InternalIP"))
            .service(lb("api", 81).annotation("nodelb.io/address-types", "ExternalIP"))
            .service(lb("all", 82));
    assert_eq!(w.ingress("web"), vec!["203.0.113.9", "203.0.113.10"]);
    assert_eq!(w.ingress("api"), vec!["198.51.100.1"]);
    assert_eq!(w.ingress("all"), vec!["198.51.100.1", "203.0.113.9"]);
}

#[test]
fn no_node_address_of_the_services_types_says_why_in_the_condition() {
    let w = World::two_nodes()
        .service(lb("web", 80).annotation("nodelb.io/address-types", "ExternalIP"))
        .slice(slice_of("web", &["198.51.100.20 node-a"]));
    assert!(w.ingress("web").is_empty());
    let c = w.serving("web");
    assert!(!c.status);
    assert_eq!(c.reason, "NoServingNodes");
    assert!(
        c.message.starts_with(
            "no served address: IPv4 no node address of the Service's address types and CIDRs"
        ),
        "{}",
        c.message
    );
}

#[test]
fn an_invalid_address_annotation_serves_nowhere_is_invalid_input_and_says_why() {
    let w = internal_and_external(
        lb("web", 80).annotation("nodelb.io/address-cidrs", "198.51.100.0/24,nonsense"),
    )
    .slice(slice_of("web", &["198.51.100.20 node-a"]));
    assert!(w.ingress("web").is_empty());
    let notes: Vec<(&str, String)> = w
        .problems("web")
        .iter()
        .map(|p| (p.reason(), p.note()))
        .collect();
    assert!(
        notes.contains(&(
            "InvalidInput",
            "left out: Service default/web: annotation nodelb.io/address-cidrs \"198.51.100.0/24,nonsense\": \"nonsense\" is not a CIDR; served nowhere".to_string()
        )),
        "{notes:?}"
    );
    let c = w.serving("web");
    assert!(!c.status);
    assert!(
        c.message.starts_with(
            "not served: invalid annotation nodelb.io/address-cidrs \"198.51.100.0/24,nonsense\": \"nonsense\" is not a CIDR"
        ),
        "{}",
        c.message
    );
}

#[test]
fn node_selector_and_exclusion_label_limit_serving_nodes() {
    let mut w =
        World::two_nodes().service(lb("web", 80).annotation("nodelb.io/node-selector", "zone=b"));
    assert_eq!(w.ingress("web"), vec!["203.0.113.9"]);
    w.nodes[1] = node("node-b")
        .address("InternalIP", "203.0.113.9")
        .label("zone", "b")
        .label(
            "node.kubernetes.io/exclude-from-external-load-balancers",
            "",
        )
        .k8s();
    assert!(w.ingress("web").is_empty());
    assert!(matches!(
        w.problems("web")[0],
        Problem::NoServingNodes { .. }
    ));
}

#[test]
fn a_node_joining_excluded_changes_no_status() {
    let mut w = World::two_nodes()
        .service(lb("web", 80))
        .slice(slice_of("web", &["198.51.100.20 node-a"]));
    let before = w.compute()[&ServiceKey::new("default", "web")].clone();
    assert_eq!(before.serving.message, "served on 2 of 2 nodes");
    w.nodes.push(
        node("node-c")
            .address("InternalIP", "203.0.113.11")
            .label(
                "node.kubernetes.io/exclude-from-external-load-balancers",
                "",
            )
            .k8s(),
    );
    w.leases.push(
        heartbeat("node-c")
            .renewed_ago(1)
            .families("IPv4,IPv6")
            .k8s(),
    );
    // Neither counted nor named: the condition, like the ingress, is what it was.
    assert_eq!(w.compute()[&ServiceKey::new("default", "web")], before);
    // Every node excluded: none serves, and the condition says why.
    for n in &mut w.nodes {
        n.metadata
            .labels
            .get_or_insert_with(Default::default)
            .insert(
                "node.kubernetes.io/exclude-from-external-load-balancers".into(),
                String::new(),
            );
    }
    let d = &w.compute()[&ServiceKey::new("default", "web")];
    assert!(d.ingress.is_empty());
    assert!(
        d.serving
            .message
            .contains("excluded from external load balancers"),
        "{}",
        d.serving.message
    );
}

/// The status of `web` with node-b as `change` leaves it: node-a alone is published, and the
/// condition names node-b with `why`; with node-a changed too, no node serves and the
/// `NoServingNodes` problem says why for each.
fn node_b_leaves_the_status(change: impl Fn(&mut World, usize), why: &str) {
    let mut w = World::two_nodes()
        .service(lb("web", 80))
        .slice(slice_of("web", &["198.51.100.20 node-a"]));
    assert_eq!(w.ingress("web"), vec!["203.0.113.9", "203.0.113.10"]);
    change(&mut w, 1);
    let d = w.compute()[&ServiceKey::new("default", "web")].clone();
    assert_eq!(
        d.ingress.iter().map(|a| a.to_string()).collect::<Vec<_>>(),
        vec!["203.0.113.10"]
    );
    assert_eq!(
        d.serving.message,
        format!("served on 1 of 2 nodes; node-b: {why}")
    );
    change(&mut w, 0);
    let d = w.compute()[&ServiceKey::new("default", "web")].clone();
    assert!(d.ingress.is_empty());
    let note = d
        .problems
        .iter()
        .map(Problem::note)
        .collect::<Vec<_>>()
        .join("\n");
    assert!(
        note.contains(&format!("node-a: {why}")) && note.contains(&format!("node-b: {why}")),
        "{note}"
    );
    assert_eq!(d.serving.reason, "NoServingNodes", "{}", d.serving.message);
}

#[test]
fn a_node_the_cluster_autoscaler_is_removing_leaves_every_status() {
    node_b_leaves_the_status(
        |w, i| {
            w.nodes[i].spec = Some(k8s_openapi::api::core::v1::NodeSpec {
                taints: Some(vec![k8s_openapi::api::core::v1::Taint {
                    key: "ToBeDeletedByClusterAutoscaler".into(),
                    value: Some("1700000000".into()),
                    effect: "NoSchedule".into(),
                    ..Default::default()
                }]),
                ..Default::default()
            })
        },
        "tainted ToBeDeletedByClusterAutoscaler: the cluster autoscaler is removing it",
    );
}

#[test]
fn a_node_being_deleted_leaves_every_status() {
    node_b_leaves_the_status(
        |w, i| {
            w.nodes[i].metadata.deletion_timestamp =
                Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(now()))
        },
        "its Node is being deleted",
    );
}

#[test]
fn a_node_whose_agent_keeps_failing_to_sync_leaves_every_status() {
    node_b_leaves_the_status(
        |w, i| {
            let node = if i == 0 { "node-a" } else { "node-b" };
            w.leases[i] = heartbeat(node)
                .renewed_ago(1)
                .families("")
                .unhealthy("committing: Operation not permitted (EPERM)")
                .k8s();
        },
        "its agent's syncs keep failing: committing: Operation not permitted (EPERM)",
    );
}

#[test]
fn local_policy_publishes_only_nodes_with_a_ready_endpoint_and_follows_it() {
    let w = World::two_nodes()
        .service(lb("web", 80).spec("externalTrafficPolicy", "Local"))
        .slice(slice_of("web", &["198.51.100.20 node-b"]));
    assert_eq!(w.ingress("web"), vec!["203.0.113.9"]);
    let w = w.slice(slice_of("web", &["198.51.100.20 node-a"]));
    assert_eq!(w.ingress("web"), vec!["203.0.113.10"]);
    let w = w.slice(slice_of("web", &[]));
    assert!(w.ingress("web").is_empty());
    // Cluster: every node serves, endpoints or not (it answers, with a reset if need be).
    let w = World::two_nodes().service(lb("web", 80));
    assert_eq!(w.ingress("web").len(), 2);
}

#[test]
fn a_service_that_loses_its_port_everywhere_has_no_address_and_a_conflict_naming_the_winner() {
    let w = World::two_nodes()
        .service(lb("old", 80).created("2023-01-01T00:00:00Z"))
        .service(lb("young", 80));
    assert_eq!(w.ingress("old").len(), 2);
    assert!(w.ingress("young").is_empty());
    assert_eq!(
        w.problems("young"),
        vec![Problem::PortConflict {
            protocol: Protocol::Tcp,
            port: 80,
            holder: ServiceKey::new("default", "old"),
            nodes: vec!["node-a".into(), "node-b".into()],
        }]
    );
    assert!(w.problems("young")[0].note().contains("default/old"));
    assert!(w.problems("old").is_empty());
}

#[test]
fn disjoint_node_selectors_share_a_port() {
    let w = World::two_nodes()
        .service(
            lb("a", 80)
                .created("2023-01-01T00:00:00Z")
                .annotation("nodelb.io/node-selector", "zone=a"),
        )
        .service(lb("b", 80).annotation("nodelb.io/node-selector", "zone=b"));
    assert_eq!(w.ingress("a"), vec!["203.0.113.10"]);
    assert_eq!(w.ingress("b"), vec!["203.0.113.9"]);
    assert!(w.problems("b").is_empty());
}

#[test]
fn a_reserved_port_is_a_problem_and_gets_no_address() {
    let w = World::two_nodes().service(lb("ssh", 22));
    assert!(w.ingress("ssh").is_empty());
    assert_eq!(
        w.problems("ssh"),
        vec![Problem::ReservedPort {
            ports: vec![(Protocol::Tcp, 22)]
        }]
    );
}

#[test]
fn no_fresh_heartbeat_means_no_serving_nodes() {
    let mut w = World::two_nodes().service(lb("web", 80));
    w.leases.clear();
    assert!(w.ingress("web").is_empty());
    let p = w.problems("web");
    assert!(matches!(&p[0], Problem::NoServingNodes { why } if why.contains("heartbeat")));
}

#[test]
fn other_classes_are_not_ours() {
    let w =
        World::two_nodes().service(lb("web", 80).spec("loadBalancerClass", "example.com/other"));
    assert!(!w.compute().contains_key(&ServiceKey::new("default", "web")));
}

#[test]
fn heartbeats_are_read_with_their_families() {
    let beats = heartbeat::read(&[
        heartbeat("node-a").renewed_ago(3).families("IPv6").k8s(),
        heartbeat("node-b").renewed_ago(3).families("").k8s(),
    ]);
    assert_eq!(
        beats["node-a"].families,
        Families {
            v4: false,
            v6: true
        }
    );
    assert_eq!(
        beats["node-b"].families,
        Families {
            v4: false,
            v6: false
        }
    );
    assert_eq!(heartbeat::lease_name("node-a"), "nodelb-node-node-a");
}

/// Ages of `beats` as a leader that watched every renewal when it happened sees them at `at`.
fn ages_at(beats: &BTreeMap<String, Heartbeat>, at: Timestamp) -> BTreeMap<String, Duration> {
    beats
        .iter()
        .map(|(n, b)| {
            let age = at.duration_since(b.renewed);
            (n.clone(), Duration::try_from(age).unwrap_or_default())
        })
        .collect()
}

// ---- what the writer does -----------------------------------------------------------------

fn stored(ingress: &[&str], managers: &[&str]) -> Service {
    let ing: Vec<_> = ingress
        .iter()
        .map(|ip| serde_json::json!({"ip": ip}))
        .collect();
    let mf: Vec<_> = managers
        .iter()
        .map(|m| serde_json::json!({"manager": m, "operation": "Apply", "subresource": "status",
            "fieldsType": "FieldsV1", "fieldsV1": {"f:status": {"f:loadBalancer": {"f:ingress": {}}}}}))
        .collect();
    // nodelb's condition, as `desired` wants it, where nodelb wrote the status.
    let conditions: Vec<_> = managers
        .iter()
        .filter(|m| **m == "nodelb")
        .map(|_| {
            serde_json::json!({"type": "nodelb.io/Serving", "status": "True",
            "reason": "Serving", "message": "served on 2 of 2 nodes",
            "lastTransitionTime": "2026-01-01T00:00:00Z"})
        })
        .collect();
    Svc::lb("default", "web")
        .meta("managedFields", mf)
        .status(json!({"loadBalancer": {"ingress": ing}, "conditions": conditions}))
        .index()
}

fn desired(ips: &[&str]) -> Desired {
    Desired {
        ingress: ips.iter().map(|a| a.parse().unwrap()).collect(),
        serving: Serving {
            status: true,
            reason: "Serving",
            message: "served on 2 of 2 nodes".into(),
        },
        ..Desired::default()
    }
}

#[test]
fn the_writer_writes_only_when_the_stored_value_differs() {
    let s = stored(&["203.0.113.9"], &["nodelb"]);
    assert_eq!(
        ingress::decide(&s, Some(&desired(&["203.0.113.9"])), None, now()),
        Write::Nothing
    );
    let Write::Apply { body, first, .. } = ingress::decide(
        &s,
        Some(&desired(&["203.0.113.9", "203.0.113.10"])),
        None,
        now(),
    ) else {
        panic!()
    };
    assert!(!first);
    assert_eq!(
        body["status"]["loadBalancer"]["ingress"],
        serde_json::json!([{"ip": "203.0.113.9"}, {"ip": "203.0.113.10"}])
    );
    let Write::Apply { first, .. } = ingress::decide(
        &stored(&[], &[]),
        Some(&desired(&["203.0.113.9"])),
        None,
        now(),
    ) else {
        panic!()
    };
    assert!(first, "nothing published before: EnsuredLoadBalancer");
}

#[test]
fn ip_mode_is_written_only_when_the_server_keeps_it() {
    let s = stored(&["203.0.113.9"], &["nodelb"]);
    // A server that keeps ipMode: stored without it differs from desired with it.
    let Write::Apply { body, .. } =
        ingress::decide(&s, Some(&desired(&["203.0.113.9"])), Some("Proxy"), now())
    else {
        panic!()
    };
    assert_eq!(
        body["status"]["loadBalancer"]["ingress"][0]["ipMode"],
        "Proxy"
    );
    // A server that drops it: never sent, so stored always equals computed.
    assert_eq!(
        ingress::decide(&s, Some(&desired(&["203.0.113.9"])), None, now()),
        Write::Nothing
    );
}

#[test]
fn ip_mode_the_server_filled_in_is_no_reason_to_write_when_nodelb_sends_none() {
    // An older server (below 1.30, so nodelb sends no ipMode) that stores `VIP` itself.
    let mut s = stored(&["203.0.113.9"], &["nodelb"]);
    s.status
        .as_mut()
        .unwrap()
        .load_balancer
        .as_mut()
        .unwrap()
        .ingress
        .as_mut()
        .unwrap()[0]
        .ip_mode = Some("VIP".into());
    assert_eq!(
        ingress::decide(&s, Some(&desired(&["203.0.113.9"])), None, now()),
        Write::Nothing
    );
    // Where nodelb does send it, `VIP` stored against `Proxy` wanted is a difference.
    assert!(matches!(
        ingress::decide(&s, Some(&desired(&["203.0.113.9"])), Some("Proxy"), now()),
        Write::Apply { .. }
    ));
    // And an address change is still written.
    assert!(matches!(
        ingress::decide(&s, Some(&desired(&["203.0.113.10"])), None, now()),
        Write::Apply { .. }
    ));
}

#[test]
fn another_managers_ingress_is_left_alone() {
    let s = stored(&["192.0.2.1"], &["metallb"]);
    assert_eq!(
        ingress::decide(&s, Some(&desired(&["203.0.113.9"])), None, now()),
        Write::OwnedElsewhere {
            managers: vec!["metallb".into()]
        }
    );
}

#[test]
fn a_service_no_longer_ours_loses_only_what_nodelb_wrote() {
    let ours = stored(&["203.0.113.9"], &["nodelb"]);
    let Write::Clear { body } = ingress::decide(&ours, None, None, now()) else {
        panic!()
    };
    assert_eq!(body["status"], serde_json::json!({}));
    let theirs = stored(&["192.0.2.1"], &["metallb"]);
    assert_eq!(ingress::decide(&theirs, None, None, now()), Write::Nothing);
}

#[test]
fn recomputing_after_a_change_touches_only_what_changed_and_equals_a_fresh_computation() {
    let mut w = World::two_nodes()
        .service(
            lb("a", 80)
                .created("2023-01-01T00:00:00Z")
                .spec("externalTrafficPolicy", "Local"),
        )
        .service(lb("b", 81))
        .service(lb("c", 82))
        .slice(slice_of("a", &["198.51.100.20 node-b"]));
    let mut s = Status::default();
    let beats = heartbeat::read(&w.leases);
    let first = s.compute(
        &w.objects,
        &w.nodes,
        &beats,
        &ages_at(&beats, now()),
        &w.cfg,
    );
    assert_eq!(first.len(), 3);
    assert!(
        s.compute(
            &w.objects,
            &w.nodes,
            &beats,
            &ages_at(&beats, now()),
            &w.cfg
        )
        .is_empty(),
        "nothing changed"
    );
    // The endpoint moves to node-a: only `a` changes.
    w = w.slice(slice_of("a", &["198.51.100.20 node-a"]));
    let changed = s.compute(
        &w.objects,
        &w.nodes,
        &beats,
        &ages_at(&beats, now()),
        &w.cfg,
    );
    assert_eq!(changed, [ServiceKey::new("default", "a")].into());
    assert_eq!(s.desired(), &w.compute());
    // A heartbeat going stale changes every Service served there.
    let later = now() + SignedDuration::from_secs(20);
    let mut beats2 = beats.clone();
    beats2.get_mut("node-a").unwrap().renewed = later;
    let a_before = s.desired()[&ServiceKey::new("default", "a")].clone();
    let changed = s.compute(
        &w.objects,
        &w.nodes,
        &beats2,
        &ages_at(&beats2, later),
        &w.cfg,
    );
    // `a` is Local with its endpoint on node-a: its ingress does not change, only its
    // condition's count of nodes (one candidate fewer).
    assert_eq!(
        changed,
        [
            ServiceKey::new("default", "a"),
            ServiceKey::new("default", "b"),
            ServiceKey::new("default", "c")
        ]
        .into()
    );
    let a_after = &s.desired()[&ServiceKey::new("default", "a")];
    assert_eq!(a_after.ingress, a_before.ingress);
    assert_eq!(a_after.serving.message, "served on 1 of 1 nodes");
    assert_eq!(
        a_before.serving.message,
        "served on 1 of 2 nodes; node-b: no ready endpoint on the node (externalTrafficPolicy Local)"
    );
    assert_eq!(s.desired(), &w.compute_at(&beats2, later));
}

#[test]
fn invalid_parts_of_a_service_are_problems_worth_an_event() {
    let w = World::two_nodes()
        .service(lb("web", 80).spec("externalTrafficPolicy", "Sometimes"))
        .slice(slice_of(
            "web",
            &["not-an-ip node-a", "198.51.100.20 node-a"],
        ));
    let p = w.problems("web");
    assert_eq!(w.ingress("web").len(), 2, "the valid parts still serve");
    let notes: Vec<String> = p.iter().map(|p| p.note()).collect();
    assert!(
        notes
            .iter()
            .any(|n| n.contains("externalTrafficPolicy \"Sometimes\"")),
        "{notes:?}"
    );
    assert!(
        notes
            .iter()
            .any(|n| n.contains("\"not-an-ip\" is not an IP address")),
        "{notes:?}"
    );
    assert!(p.iter().all(|p| p.reason() == "InvalidInput"), "{p:?}");
}

// ---- the condition nodelb.io/Serving -------------------------------------------------------

impl World {
    pub(super) fn serving(&self, name: &str) -> Serving {
        self.compute()[&ServiceKey::new("default", name)]
            .serving
            .clone()
    }
}

#[test]
fn a_served_service_is_serving_and_names_the_nodes_that_do_not_serve_it() {
    let w = World::two_nodes()
        .service(lb("web", 80).annotation("nodelb.io/node-selector", "zone=a"))
        .slice(slice_of("web", &["198.51.100.20 node-a"]));
    let c = w.serving("web");
    assert!(c.status);
    assert_eq!(c.reason, "Serving");
    assert_eq!(
        c.message,
        "served on 1 of 2 nodes; node-b: not served: node does not match selector \"zone=a\""
    );
}

#[test]
fn a_service_without_endpoints_says_no_endpoints() {
    let w = World::two_nodes().service(lb("web", 80));
    assert_eq!(
        w.ingress("web").len(),
        2,
        "published: its clients are refused"
    );
    let c = w.serving("web");
    assert!(!c.status);
    assert_eq!(c.reason, "NoEndpoints");
    assert!(c.message.starts_with("no ready endpoint"), "{}", c.message);
}

#[test]
fn a_reserved_port_says_reserved_port_and_what_to_do() {
    let w = World::two_nodes().service(lb("ssh", 22));
    let c = w.serving("ssh");
    assert_eq!((c.status, c.reason), (false, "ReservedPort"));
    assert!(c.message.contains("22/TCP"), "{}", c.message);
    assert!(c.message.ends_with("use another port"), "{}", c.message);
}

#[test]
fn a_conflict_loser_everywhere_says_port_conflict_and_names_the_winner() {
    let w = World::two_nodes()
        .service(lb("old", 80).created("2023-01-01T00:00:00Z"))
        .slice(slice_of("old", &["198.51.100.20 node-a"]))
        .service(lb("new", 80))
        .slice(slice_of("new", &["198.51.100.21 node-a"]));
    let c = w.serving("new");
    assert_eq!((c.status, c.reason), (false, "PortConflict"));
    assert!(c.message.contains("default/old"), "{}", c.message);
    assert!(w.serving("old").status);
}

#[test]
fn a_conflict_loser_on_some_nodes_is_serving_and_names_them() {
    let w = World::two_nodes()
        .service(
            lb("old", 80)
                .created("2023-01-01T00:00:00Z")
                .annotation("nodelb.io/node-selector", "zone=b"),
        )
        .slice(slice_of("old", &["198.51.100.20 node-b"]))
        .service(lb("new", 80))
        .slice(slice_of("new", &["198.51.100.21 node-a"]));
    let c = w.serving("new");
    assert!(c.status);
    assert_eq!(
        c.message,
        "served on 1 of 2 nodes; node-b: port 80/TCP held by default/old"
    );
}

#[test]
fn no_fresh_heartbeat_says_no_serving_nodes() {
    let mut w = World::two_nodes().service(lb("web", 80));
    w.leases.clear();
    let c = w.serving("web");
    assert_eq!((c.status, c.reason), (false, "NoServingNodes"));
    assert!(
        c.message.contains("no node has a fresh nodelb heartbeat"),
        "{}",
        c.message
    );
}

#[test]
fn a_namespace_left_out_says_namespace_not_allowed() {
    let mut w = World::two_nodes().service(lb("web", 80));
    w.cfg.planner.allowed_namespaces = Some(["shop".to_string()].into());
    let c = w.serving("web");
    assert_eq!((c.status, c.reason), (false, "NamespaceNotAllowed"));
    assert!(c.message.contains("--allowed-namespaces"), "{}", c.message);
}

#[test]
fn a_service_without_a_valid_port_says_invalid_service() {
    let w = World::two_nodes().service(lb("web", 80).spec(
        "ports",
        json!([{"name": "x", "port": 80, "protocol": "ICMP"}]),
    ));
    let c = w.serving("web");
    assert_eq!((c.status, c.reason), (false, "InvalidService"));
    assert!(c.message.contains("ICMP"), "{}", c.message);
}

#[test]
fn a_message_names_a_few_nodes_then_how_many_more() {
    let mut w = World::two_nodes()
        .service(lb("web", 80).annotation("nodelb.io/node-selector", "zone=a"))
        .slice(slice_of("web", &["198.51.100.20 node-a"]));
    for i in 0..6 {
        let name = format!("node-x{i}");
        w.nodes.push(
            node(&name)
                .address("InternalIP", format!("203.0.113.{}", 20 + i))
                .label("zone", "x")
                .k8s(),
        );
        w.leases
            .push(heartbeat(&name).renewed_ago(1).families("IPv4").k8s());
    }
    let c = w.serving("web");
    assert!(
        c.message.starts_with("served on 1 of 8 nodes; "),
        "{}",
        c.message
    );
    assert!(c.message.ends_with(" and 4 more"), "{}", c.message);
    assert_eq!(c.message.matches("does not match selector").count(), 3);
}

#[test]
fn a_condition_change_alone_is_written_without_an_ingress_event() {
    let s = stored(&["203.0.113.9"], &["nodelb"]);
    let mut want = desired(&["203.0.113.9"]);
    want.serving.message = "served on 1 of 2 nodes; node-b: no ready endpoint".into();
    let Write::Apply {
        body,
        ingress_changed,
        ..
    } = ingress::decide(&s, Some(&want), None, now())
    else {
        panic!()
    };
    assert!(
        !ingress_changed,
        "no EnsuredLoadBalancer/UpdatedLoadBalancer Event"
    );
    let c = &body["status"]["conditions"][0];
    assert_eq!(c["type"], "nodelb.io/Serving");
    assert_eq!(c["message"], want.serving.message.as_str());
    assert_eq!(
        c["lastTransitionTime"], "2026-01-01T00:00:00Z",
        "the status stayed True: the transition time is kept"
    );
    // The status flips: a new transition time, the leader's now.
    want.serving = Serving {
        status: false,
        reason: "NoEndpoints",
        message: "no ready endpoint".into(),
    };
    let Write::Apply { body, .. } = ingress::decide(&s, Some(&want), None, now()) else {
        panic!()
    };
    let c = &body["status"]["conditions"][0];
    assert_eq!(c["status"], "False");
    assert_eq!(c["lastTransitionTime"], now().to_string());
}

#[test]
fn a_new_generation_is_written_as_observed_generation() {
    let mut s = stored(&["203.0.113.9"], &["nodelb"]);
    assert_eq!(
        ingress::decide(&s, Some(&desired(&["203.0.113.9"])), None, now()),
        Write::Nothing
    );
    s.metadata.generation = Some(4);
    let Write::Apply { body, .. } =
        ingress::decide(&s, Some(&desired(&["203.0.113.9"])), None, now())
    else {
        panic!()
    };
    assert_eq!(body["status"]["conditions"][0]["observedGeneration"], 4);
}

#[test]
fn a_service_labelled_for_another_proxy_is_neither_written_nor_cleared() {
    let labelled = |mut s: Service| {
        s.metadata.other_proxy = true;
        s
    };
    // Handled but for the label: no desired status at all.
    let w = World::two_nodes()
        .service(lb("web", 80).label("service.kubernetes.io/service-proxy-name", "other"))
        .service(lb("api", 81));
    let desired = w.compute();
    assert!(!desired.contains_key(&ServiceKey::new("default", "web")));
    assert!(desired.contains_key(&ServiceKey::new("default", "api")));
    // What nodelb wrote before the label came is left too, not cleared.
    let ours = labelled(stored(&["203.0.113.9"], &["nodelb"]));
    assert_eq!(ingress::decide(&ours, None, None, now()), Write::Nothing);
    assert!(matches!(
        ingress::decide(&stored(&["203.0.113.9"], &["nodelb"]), None, None, now()),
        Write::Clear { .. }
    ));
}

#[test]
fn a_service_that_carries_only_nodelbs_condition_is_cleared_when_no_longer_ours() {
    let mut s = stored(&[], &["nodelb"]);
    s.metadata.ingress_owners.clear();
    assert!(matches!(
        ingress::decide(&s, None, None, now()),
        Write::Clear { .. }
    ));
}

#[test]
fn a_port_lost_in_both_families_names_each_node_once() {
    let dual = |name: &str| lb(name, 80).spec("ipFamilies", json!(["IPv4", "IPv6"]));
    let w = World::two_nodes()
        .service(dual("old").created("2023-01-01T00:00:00Z"))
        .service(dual("new"));
    let conflicts: Vec<Problem> = w
        .problems("new")
        .into_iter()
        .filter(|p| p.reason() == "PortConflict")
        .collect();
    assert_eq!(
        conflicts,
        vec![Problem::PortConflict {
            protocol: Protocol::Tcp,
            port: 80,
            holder: ServiceKey::new("default", "old"),
            nodes: vec!["node-a".into(), "node-b".into()],
        }]
    );
}

// ---- --servicelb-compat: k3s ServiceLB's node labels and pools ------------------------------

impl World {
    /// `node` labelled `key=value`.
    fn node_label(mut self, node: &str, key: &str, value: &str) -> World {
        let n = self
            .nodes
            .iter_mut()
            .find(|n| n.metadata.name.as_deref() == Some(node))
            .expect("a node of the World");
        n.metadata
            .labels
            .get_or_insert_with(Default::default)
            .insert(key.into(), value.into());
        self
    }

    fn servicelb_compat(mut self) -> World {
        self.cfg.planner.servicelb = ServiceLb::from_flag(true);
        self
    }
}

#[test]
fn servicelb_compat_publishes_only_nodes_labelled_enablelb_true_and_names_the_others() {
    let w = World::two_nodes()
        .servicelb_compat()
        .node_label("node-a", ENABLELB_LABEL, "true")
        .service(lb("web", 80))
        .slice(slice_of("web", &["198.51.100.20 node-a"]));
    assert_eq!(w.ingress("web"), vec!["203.0.113.10"]);
    let c = w.serving("web");
    assert!(c.status);
    assert_eq!(
        c.message,
        "served on 1 of 2 nodes; node-b: not served: node not labelled \
         svccontroller.k3s.cattle.io/enablelb=true while other nodes carry that label \
         (--servicelb-compat)"
    );
}

#[test]
fn without_servicelb_compat_or_a_labelled_node_every_node_serves() {
    let labelled = World::two_nodes()
        .node_label("node-a", ENABLELB_LABEL, "true")
        .service(lb("web", 80));
    assert_eq!(labelled.ingress("web"), vec!["203.0.113.9", "203.0.113.10"]);
    let unlabelled = World::two_nodes()
        .servicelb_compat()
        .node_label("node-a", LBPOOL_LABEL, "a")
        .service(lb("web", 80).label(LBPOOL_LABEL, "b"));
    assert_eq!(
        unlabelled.ingress("web"),
        vec!["203.0.113.9", "203.0.113.10"]
    );
}

#[test]
fn one_node_labelled_enablelb_false_leaves_every_unlabelled_node_out() {
    // As k3s: any node carrying the label, whatever its value, turns the selection on.
    let w = World::two_nodes()
        .servicelb_compat()
        .node_label("node-a", ENABLELB_LABEL, "false")
        .service(lb("web", 80))
        .slice(slice_of("web", &["198.51.100.20 node-a"]));
    assert!(w.ingress("web").is_empty());
    let c = w.serving("web");
    assert_eq!((c.status, c.reason), (false, "NoServingNodes"));
    assert!(
        c.message.contains("node-a: not served: node not labelled")
            && c.message.contains("node-b: not served: node not labelled"),
        "{}",
        c.message
    );
}

#[test]
fn servicelb_pool_label_publishes_only_the_enabled_nodes_of_the_services_pool() {
    let w = World::two_nodes()
        .servicelb_compat()
        .node_label("node-a", ENABLELB_LABEL, "true")
        .node_label("node-a", LBPOOL_LABEL, "a")
        .node_label("node-b", ENABLELB_LABEL, "true")
        .node_label("node-b", LBPOOL_LABEL, "b")
        .service(lb("in-b", 80).label(LBPOOL_LABEL, "b"))
        .service(lb("any", 81));
    assert_eq!(w.ingress("in-b"), vec!["203.0.113.9"]);
    assert!(
        w.serving("in-b")
            .message
            .contains("node-a: not served: node not in the Service's ServiceLB pool \"b\""),
        "{}",
        w.serving("in-b").message
    );
    assert_eq!(w.ingress("any"), vec!["203.0.113.9", "203.0.113.10"]);
}

// ---- host listeners --------------------------------------------------------------------------

/// `web` on TCP 7000 and `other` on TCP 8000, each with an endpoint.
fn listened() -> World {
    World::two_nodes()
        .service(lb("web", 7000))
        .slice(slice_of("web", &["198.51.100.20 node-b"]))
        .service(lb("other", 8000))
        .slice(slice_of("other", &["198.51.100.21 node-b"]))
}

#[test]
fn a_node_whose_heartbeat_says_a_port_is_blocked_is_left_out_for_that_service_only() {
    let mut w = listened();
    w.leases[0] = heartbeat("node-a")
        .renewed_ago(1)
        .families("IPv4,IPv6")
        .blocked("IPv4/TCP/7000=socat")
        .k8s();
    assert_eq!(w.ingress("web"), vec!["203.0.113.9"], "node-a left out");
    assert_eq!(
        w.ingress("other"),
        vec!["203.0.113.9", "203.0.113.10"],
        "another port is not held"
    );
    let c = w.serving("web");
    assert!(c.status, "served on node-b");
    assert_eq!(
        c.message,
        "served on 1 of 2 nodes; node-a: port 7000/TCP in use on the node by socat on 0.0.0.0"
    );
    assert_eq!(
        w.problems("web"),
        vec![Problem::PortInUseOnNode {
            protocol: Protocol::Tcp,
            port: 7000,
            nodes: vec![("node-a".into(), Some("socat".into()))],
        }]
    );
    assert!(w.problems("other").is_empty());
}

#[test]
fn a_listener_that_starts_or_stops_changes_only_the_services_on_its_port() {
    let mut w = listened();
    let mut s = Status::default();
    let mut step = |w: &World| {
        let beats = heartbeat::read(&w.leases);
        s.compute(
            &w.objects,
            &w.nodes,
            &beats,
            &ages_at(&beats, now()),
            &w.cfg,
        )
    };
    step(&w);
    w.leases[0] = heartbeat("node-a")
        .renewed_ago(1)
        .families("IPv4,IPv6")
        .blocked("IPv4/TCP/7000=socat")
        .k8s();
    assert_eq!(step(&w), [ServiceKey::new("default", "web")].into());
    w.leases[0] = heartbeat("node-a")
        .renewed_ago(1)
        .families("IPv4,IPv6")
        .k8s();
    assert_eq!(step(&w), [ServiceKey::new("default", "web")].into());
    assert_eq!(w.ingress("web").len(), 2, "node-a is back");
}

#[test]
fn a_port_blocked_in_one_family_leaves_the_other_published() {
    let mut w =
        World::two_nodes().service(lb("web", 7000).spec("ipFamilies", json!(["IPv4", "IPv6"])));
    // An IPv4-only listener on node-a: its IPv6 address still serves.
    w.leases[0] = heartbeat("node-a")
        .renewed_ago(1)
        .families("IPv4,IPv6")
        .blocked("IPv4/TCP/7000=socat")
        .k8s();
    assert_eq!(
        w.ingress("web"),
        vec!["203.0.113.9", "2001:db8::a", "2001:db8::b"]
    );
}

#[test]
fn a_port_blocked_everywhere_says_port_in_use_on_node_and_names_the_nodes() {
    let mut w = listened();
    w.leases = vec![
        heartbeat("node-a")
            .renewed_ago(1)
            .families("IPv4,IPv6")
            .blocked("IPv4/TCP/7000=socat")
            .k8s(),
        heartbeat("node-b")
            .renewed_ago(1)
            .families("IPv4,IPv6")
            .blocked("IPv4/TCP/7000,IPv6/TCP/7000")
            .k8s(),
    ];
    assert!(w.ingress("web").is_empty());
    let c = w.serving("web");
    assert_eq!((c.status, c.reason), (false, "PortInUseOnNode"));
    for needle in ["7000/TCP", "node-a (process socat)", "node-b"] {
        assert!(c.message.contains(needle), "{needle}: {}", c.message);
    }
    assert!(
        c.message.ends_with(
            "stop that process, use another port, or a node selector without those nodes"
        ),
        "{}",
        c.message
    );
    assert_eq!(w.ingress("other").len(), 2);
}

#[test]
fn the_port_in_use_event_names_node_port_and_process() {
    let mut w = listened();
    w.leases[0] = heartbeat("node-a")
        .renewed_ago(1)
        .families("IPv4,IPv6")
        .blocked("IPv4/TCP/7000=socat")
        .k8s();
    let p = &w.problems("web")[0];
    assert_eq!(p.reason(), "PortInUseOnNode");
    assert_eq!(
        p.note(),
        "port 7000/TCP is in use by a process listening on node-a (process socat): no rules for this Service there (a host listener always wins)"
    );
}

#[test]
fn blocked_ports_travel_in_a_bounded_annotation() {
    let socat = |port| {
        (
            (IpFamily::V4, Protocol::Tcp, port),
            Some("so,cat=x".to_string()),
        )
    };
    let b = heartbeat::BlockedPorts {
        ports: [socat(7000), ((IpFamily::V6, Protocol::Udp, 53), None)].into(),
        incomplete: false,
    };
    let text = b.format();
    assert_eq!(text, "IPv4/TCP/7000=so_cat_x,IPv6/UDP/53");
    let back = heartbeat::BlockedPorts::parse(&text);
    assert_eq!(back.ports.len(), 2);
    assert_eq!(
        back.ports[&(IpFamily::V4, Protocol::Tcp, 7000)].as_deref(),
        Some("so_cat_x")
    );
    assert!(!back.incomplete);
    // Junk entries are skipped.
    assert_eq!(
        heartbeat::BlockedPorts::parse("IPv5/TCP/1,IPv4/TCP/x,IPv4/TCP/70000,,IPv4/UDP/9").ports,
        [((IpFamily::V4, Protocol::Udp, 9), None)].into()
    );
    // Thousands of ports: the list stops at MAX_BLOCKED and says there are more.
    let many = heartbeat::BlockedPorts {
        ports: (1..=5000u16).map(socat).collect(),
        incomplete: false,
    };
    let text = many.format();
    assert!(text.len() < 40 * 1024, "{} bytes", text.len());
    assert!(text.ends_with(",more"));
    let back = heartbeat::BlockedPorts::parse(&text);
    assert_eq!(
        (back.ports.len(), back.incomplete),
        (heartbeat::MAX_BLOCKED, true)
    );
}

#[test]
fn a_heartbeat_whose_list_was_cut_leaves_its_node_out_of_every_service() {
    let mut w = listened();
    w.leases[0] = heartbeat("node-a")
        .renewed_ago(1)
        .families("IPv4,IPv6")
        .blocked("IPv4/TCP/1=socat,more")
        .k8s();
    assert_eq!(w.ingress("web"), vec!["203.0.113.9"]);
    assert_eq!(w.ingress("other"), vec!["203.0.113.9"]);
    assert!(
        matches!(&w.problems("other")[0], Problem::PortInUseOnNode { port: 8000, nodes, .. } if nodes[0].0 == "node-a"),
        "{:?}",
        w.problems("other")
    );
}

#[test]
fn a_heartbeat_lists_the_ports_a_service_may_ask_for_before_one_does() {
    use crate::vocab::Listener;
    let l = |protocol, port, process: &str| Listener {
        protocol,
        address: "0.0.0.0".parse().unwrap(),
        port,
        process: Some(process.to_string()),
    };
    let v4 = IpFamily::V4;
    let (sshd, exporter, client, dns) = (
        l(Protocol::Tcp, 22, "sshd"),
        l(Protocol::Tcp, 9100, "node_exporter"),
        l(Protocol::Udp, 41000, "resolver"),
        l(Protocol::Udp, 45000, "dnsd"),
    );
    let taken = vec![
        ((v4, Protocol::Tcp, 22), &sshd, false),
        ((v4, Protocol::Tcp, 9100), &exporter, false),
        ((v4, Protocol::Udp, 41000), &client, false),
        ((v4, Protocol::Udp, 45000), &dns, true),
    ];
    let held: BTreeMap<_, _> = [((v4, Protocol::Udp, 45000), Some("dnsd".to_string()))].into();
    let reserved = crate::plan::config::Config::default().reserved_ports;
    let b = heartbeat::BlockedPorts::report(&taken, &held, &reserved, Some(&(32768..=60999)));
    // Reserved: no Service may ask. Ephemeral and unclaimed: sockets that come and go.
    assert_eq!(
        b.format(),
        "IPv4/TCP/9100=node_exporter,IPv4/UDP/45000=dnsd"
    );
    // Thousands of ports: only those Services ask for.
    let many: Vec<Listener> = (1000..3000).map(|p| l(Protocol::Tcp, p, "x")).collect();
    let mut taken: Vec<_> = many
        .iter()
        .map(|x| ((v4, Protocol::Tcp, x.port), x, false))
        .collect();
    taken.push(((v4, Protocol::Udp, 45000), &dns, true));
    let b = heartbeat::BlockedPorts::report(&taken, &held, &reserved, None);
    assert_eq!(b.format(), "IPv4/UDP/45000=dnsd");
}

#[test]
fn agent_pods_and_kubelet_leases_read_the_same_trimmed_or_whole() {
    let pod: k8s_openapi::api::core::v1::Pod = serde_json::from_value(json!({
        "metadata": {"name": "nodelb-agent-x1", "namespace": "nodelb-system", "uid": "u1",
                     "labels": {"app.kubernetes.io/name": "nodelb"}, "resourceVersion": "7"},
        "spec": {"nodeName": "node-a", "containers": [{"name": "agent", "image": "nodelb"}]},
        "status": {"phase": "Running", "conditions": [
            {"type": "Initialized", "status": "True"},
            {"type": "Ready", "status": "True"},
            {"type": "ContainersReady", "status": "True"}]},
    }))
    .unwrap();
    let mut unready = pod.clone();
    unready.metadata.name = Some("nodelb-agent-x2".into());
    unready
        .status
        .as_mut()
        .unwrap()
        .conditions
        .as_mut()
        .unwrap()[1]
        .status = "False".into();
    let pending: k8s_openapi::api::core::v1::Pod = serde_json::from_value(json!({
        "metadata": {"name": "nodelb-agent-x3"}, "spec": {"containers": []},
    }))
    .unwrap();
    let whole = [pod, unready, pending];
    let mut trimmed = whole.clone();
    trimmed.iter_mut().for_each(heartbeat::trim_pod);
    let read = heartbeat::agent_pods(&whole);
    assert_eq!(read, heartbeat::agent_pods(&trimmed));
    let want: BTreeMap<String, AgentPod> = [("nodelb-agent-x1", true), ("nodelb-agent-x2", false)]
        .map(|(n, ready)| {
            let pod = AgentPod {
                node: "node-a".into(),
                ready,
            };
            (n.to_string(), pod)
        })
        .into();
    assert_eq!(read, want, "a Pod not scheduled yet is no agent of a node");
    assert!(trimmed[0].spec.as_ref().unwrap().containers.is_empty());
    assert!(trimmed[0].metadata.labels.is_none());

    let lease: Lease = serde_json::from_value(json!({
        "metadata": {"name": "node-a", "namespace": "kube-node-lease",
                     "ownerReferences": [{"apiVersion": "v1", "kind": "Node", "name": "node-a",
                                          "uid": "n1"}]},
        "spec": {"holderIdentity": "node-a", "leaseDurationSeconds": 40,
                 "renewTime": "2026-01-01T12:00:00.000000Z"},
    }))
    .unwrap();
    let mut small = lease.clone();
    heartbeat::trim_kubelet_lease(&mut small);
    assert_eq!(
        heartbeat::kubelet_leases(&[lease]),
        heartbeat::kubelet_leases(&[small.clone()])
    );
    assert_eq!(
        heartbeat::kubelet_leases(&[small])["node-a"],
        KubeletLease {
            renewed: NOW.parse().unwrap(),
            duration: Some(Duration::from_secs(40)),
        }
    );
}
