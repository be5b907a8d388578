//! How the leader spreads a change over the statuses: which Service to write first, and what
//! to say once for a node instead of once per Service.
//!
//! A node that joins or leaves changes the status of every Service it serves: thousands of
//! writes. They go through a work queue ([`WorkQueue`]) ordered by [`Urgency`]: a Service whose
//! own object or slices changed goes first (one Service's change never waits behind a node's
//! round), then every status that lists an address it should not (a removal: clients are sent
//! to a node that no longer serves), then the rest (additions, conditions). A node's
//! transition is told once, on the Node ([`transitions`]), not in an Event per Service.

use super::ingress;
use super::Desired;
use crate::objects::index::Service;
use crate::vocab::ServiceKey;
use k8s_openapi::api::core::v1::Node;
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::net::IpAddr;

/// The order Services are written in: lower first.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Urgency {
    /// The Service's own object or its EndpointSlices changed.
    Own,
    /// The stored status lists an address the desired one does not.
    Removal,
    /// Anything else: addresses added, the condition changed.
    Other,
}

/// How urgent writing `svc`'s status is, given what it should be (`want`, `None`: not nodelb's
/// any more) and whether its own object or slices changed (`own`).
pub fn urgency(svc: &Service, want: Option<&Desired>, own: bool) -> Urgency {
    if own {
        return Urgency::Own;
    }
    let kept =
        |ip: &Option<IpAddr>| ip.is_some_and(|a| want.is_some_and(|d| d.ingress.contains(&a)));
    if stored(svc).iter().all(kept) {
        Urgency::Other
    } else {
        Urgency::Removal
    }
}

/// The addresses of `svc`'s stored ingress (`None` for an entry that is not an address).
fn stored(svc: &Service) -> Vec<Option<IpAddr>> {
    ingress::stored(svc)
        .iter()
        .filter_map(|i| i.ip.as_deref())
        .map(|ip| ip.parse().ok())
        .collect()
}

/// Every address a node may put in a status: those its Node lists, and those its
/// `nodelb.io/published-addresses` names.
pub fn node_addresses(node: &Node) -> BTreeSet<IpAddr> {
    let listed = node
        .status
        .iter()
        .flat_map(|s| s.addresses.iter().flatten())
        .filter_map(|a| a.address.parse().ok());
    listed.chain(super::published::of_node(node)).collect()
}

/// Whether the change from `svc`'s stored ingress to `want`'s is all addresses of nodes that
/// started or stopped serving (`moved`): told on those Nodes, not in an Event on the Service.
/// A first ingress never is: a Service that gets its first address is told so on itself
/// (`EnsuredLoadBalancer`), whichever node or endpoint brought it.
pub fn node_caused(svc: &Service, want: &Desired, moved: &BTreeSet<IpAddr>) -> bool {
    let entries = stored(svc);
    if entries.is_empty() {
        return false;
    }
    let stored: BTreeSet<IpAddr> = entries.into_iter().flatten().collect();
    let wanted: BTreeSet<IpAddr> = want.ingress.iter().copied().collect();
    let mut diff = stored.symmetric_difference(&wanted).peekable();
    diff.peek().is_some() && diff.all(|a| moved.contains(a))
}

/// Services waiting to be settled, most urgent first, first come first within an urgency;
/// each at most once (a push of a queued Service only ever raises its urgency).
#[derive(Debug, Default)]
pub struct WorkQueue {
    order: BTreeSet<(Urgency, u64, ServiceKey)>,
    queued: HashMap<ServiceKey, (Urgency, u64)>,
    next: u64,
}

impl WorkQueue {
    pub fn push(&mut self, key: ServiceKey, urgency: Urgency) {
        if let Some(&(was, seq)) = self.queued.get(&key) {
            if urgency >= was {
                return;
            }
            self.order.remove(&(was, seq, key.clone()));
        }
        let seq = self.next;
        self.next += 1;
        self.order.insert((urgency, seq, key.clone()));
        self.queued.insert(key, (urgency, seq));
    }

    pub fn pop(&mut self) -> Option<ServiceKey> {
        let (_, _, key) = self.order.pop_first()?;
        self.queued.remove(&key);
        Some(key)
    }

    pub fn len(&self) -> usize {
        self.order.len()
    }

    pub fn is_empty(&self) -> bool {
        self.order.is_empty()
    }

    /// Forget everything (a leader that lost the Lease starts again from nothing).
    pub fn clear(&mut self) {
        *self = WorkQueue::default();
    }
}

/// A node that started or stopped being a serving candidate.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Transition {
    pub node: String,
    pub joined: bool,
    /// Why it left, when the leader knows more than "its heartbeat is stale or gone".
    pub why: Option<String>,
}

impl Transition {
    /// The Event's reason.
    pub fn reason(&self) -> &'static str {
        if self.joined {
            "NodeServing"
        } else {
            "NodeNotServing"
        }
    }

    /// The Event's note, one for all the Services the node serves.
    pub fn note(&self) -> String {
        if self.joined {
            format!(
                "node {} serves LoadBalancer Services again: its addresses are added to their status",
                self.node
            )
        } else {
            let why = self.why.as_deref().unwrap_or(
                "its nodelb heartbeat is not renewed (agent or node down, or the node is gone)",
            );
            format!(
                "node {} no longer serves LoadBalancer Services: {why}; its addresses are removed from their status",
                self.node
            )
        }
    }
}

/// The nodes that joined or left the candidates between two computations (`ineligible`: the
/// nodes with a fresh heartbeat that serve nothing, and why), in node order.
pub fn transitions(
    before: &BTreeSet<String>,
    after: &BTreeSet<String>,
    ineligible: &BTreeMap<String, String>,
) -> Vec<Transition> {
    let left = before.difference(after).map(|n| Transition {
        node: n.clone(),
        joined: false,
        why: ineligible.get(n).cloned(),
    });
    let joined = after.difference(before).map(|n| Transition {
        node: n.clone(),
        joined: true,
        why: None,
    });
    let mut all: Vec<Transition> = left.chain(joined).collect();
    all.sort_by(|a, b| a.node.cmp(&b.node));
    all
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fixtures::Svc;
    use crate::status::condition::Serving;

    fn key(name: &str) -> ServiceKey {
        ServiceKey::new("default", name)
    }

    fn svc_with(ingress: &[&str]) -> Service {
        let ips: Vec<_> = ingress
            .iter()
            .map(|ip| serde_json::json!({"ip": ip}))
            .collect();
        Svc::lb("default", "web")
            .status(serde_json::json!({"loadBalancer": {"ingress": ips}}))
            .index()
    }

    fn desired(ingress: &[&str]) -> Desired {
        Desired {
            ingress: ingress
                .iter()
                .map(|a| a.parse::<IpAddr>().unwrap())
                .collect::<Vec<_>>()
                .into(),
            problems: Vec::new(),
            serving: Serving::default(),
        }
    }

    #[test]
    fn a_services_own_change_goes_before_a_removal_and_a_removal_before_the_rest() {
        let stored = svc_with(&["192.0.2.1", "192.0.2.2"]);
        let fewer = desired(&["192.0.2.1"]);
        let more = desired(&["192.0.2.1", "192.0.2.2", "192.0.2.3"]);
        assert_eq!(urgency(&stored, Some(&fewer), true), Urgency::Own);
        assert_eq!(urgency(&stored, Some(&fewer), false), Urgency::Removal);
        assert_eq!(urgency(&stored, None, false), Urgency::Removal);
        assert_eq!(urgency(&stored, Some(&more), false), Urgency::Other);
        assert_eq!(urgency(&svc_with(&[]), None, false), Urgency::Other);
        assert!(Urgency::Own < Urgency::Removal && Urgency::Removal < Urgency::Other);
    }

    #[test]
    fn a_change_made_only_of_moved_nodes_addresses_is_the_nodes_to_tell() {
        let moved: BTreeSet<IpAddr> = ["192.0.2.2".parse().unwrap()].into();
        let stored = svc_with(&["192.0.2.1", "192.0.2.2"]);
        assert!(node_caused(&stored, &desired(&["192.0.2.1"]), &moved));
        // Another address changed too: the Service's own Event.
        assert!(!node_caused(&stored, &desired(&["192.0.2.3"]), &moved));
        // Nothing changed: nothing to tell.
        assert!(!node_caused(
            &stored,
            &desired(&["192.0.2.1", "192.0.2.2"]),
            &moved
        ));
        let joined = svc_with(&["192.0.2.1"]);
        assert!(node_caused(
            &joined,
            &desired(&["192.0.2.1", "192.0.2.2"]),
            &moved
        ));
        // A first ingress is the Service's own news, even when a node's joining brought it.
        assert!(!node_caused(
            &svc_with(&[]),
            &desired(&["192.0.2.2"]),
            &moved
        ));
    }

    #[test]
    fn a_nodes_addresses_are_its_listed_and_its_published_ones() {
        let node: Node = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "a", "annotations": {"nodelb.io/published-addresses": "203.0.113.9"}},
            "status": {"addresses": [
                {"type": "InternalIP", "address": "192.0.2.1"},
                {"type": "Hostname", "address": "a"}]},
        }))
        .unwrap();
        let got: Vec<String> = node_addresses(&node)
            .iter()
            .map(|a| a.to_string())
            .collect();
        assert_eq!(got, ["192.0.2.1", "203.0.113.9"]);
    }

    #[test]
    fn the_queue_pops_by_urgency_then_arrival_and_holds_a_service_once() {
        let mut q = WorkQueue::default();
        for n in ["a", "b", "c"] {
            q.push(key(n), Urgency::Other);
        }
        q.push(key("d"), Urgency::Removal);
        q.push(key("c"), Urgency::Own);
        // Lowering the urgency of a queued Service does nothing.
        q.push(key("d"), Urgency::Other);
        q.push(key("a"), Urgency::Other);
        assert_eq!(q.len(), 4);
        let order: Vec<_> = std::iter::from_fn(|| q.pop()).collect();
        assert_eq!(order, [key("c"), key("d"), key("a"), key("b")]);
        assert!(q.is_empty());
    }

    #[test]
    fn a_change_arriving_mid_round_is_next() {
        let mut q = WorkQueue::default();
        for i in 0..1000 {
            q.push(key(&format!("svc-{i:04}")), Urgency::Removal);
        }
        for _ in 0..10 {
            q.pop();
        }
        q.push(key("edited"), Urgency::Own);
        assert_eq!(q.pop(), Some(key("edited")));
        assert_eq!(q.pop(), Some(key("svc-0010")));
    }

    #[test]
    fn transitions_name_each_node_once_with_why_it_left() {
        let set = |n: &[&str]| n.iter().map(|s| s.to_string()).collect::<BTreeSet<_>>();
        let ineligible = BTreeMap::from([("b".to_string(), "cordoned for removal".to_string())]);
        let t = transitions(&set(&["a", "b", "c"]), &set(&["a", "d"]), &ineligible);
        assert_eq!(
            t,
            [
                Transition {
                    node: "b".into(),
                    joined: false,
                    why: Some("cordoned for removal".into())
                },
                Transition {
                    node: "c".into(),
                    joined: false,
                    why: None
                },
                Transition {
                    node: "d".into(),
                    joined: true,
                    why: None
                },
            ]
        );
        assert_eq!(t[0].reason(), "NodeNotServing");
        assert!(
            t[0].note().contains(": cordoned for removal;"),
            "{}",
            t[0].note()
        );
        assert!(
            t[1].note().contains("heartbeat is not renewed"),
            "{}",
            t[1].note()
        );
        assert_eq!(t[2].reason(), "NodeServing");
        assert!(transitions(&set(&["a"]), &set(&["a"]), &ineligible).is_empty());
    }
}
