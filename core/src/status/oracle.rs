//! The tests' oracle: the status as it was computed before classes, with an outcomes-only
//! planner per serving candidate, fed that node's own input, and what each node's planner said
//! gathered node by node. Exact and simple, but its memory grows with the number of nodes
//! (the leader bench of `nodelb-agent`: docs/benchmarks.md). [`super::Status`] must decide
//! exactly as this does (`tests_classes.rs`).

use super::classes::{self, Candidate};
use super::observed::{self, Gathered};
use super::{heartbeat::Heartbeat, published, Desired, Found, StatusConfig};
use crate::plan::addresses::AddressFilter;
use crate::plan::diagnosis::{FamilyState, NotServed, PortOutcome, PortResult, ServiceOutcome};
use crate::plan::service::{self, TrafficPolicy};
use crate::plan::{Objects, Planner};
use crate::vocab::{IpFamily, ServiceKey};
use k8s_openapi::api::core::v1::Node;
use std::collections::BTreeMap;
use std::net::IpAddr;
use std::time::Duration;

/// The desired status of every Service nodelb handles, computed node by node from nothing.
pub fn desired(
    objects: &Objects,
    nodes: &[Node],
    beats: &BTreeMap<String, Heartbeat>,
    ages: &BTreeMap<String, Duration>,
    cfg: &StatusConfig,
) -> BTreeMap<ServiceKey, Desired> {
    let candidates = classes::candidates(nodes, beats, ages, cfg.node_lease_duration);
    let ineligible = classes::ineligible_nodes(nodes, beats, ages, cfg.node_lease_duration);
    let mut planners: BTreeMap<String, Planner> = BTreeMap::new();
    let planner_cfg = cfg.planner_for(nodes);
    for c in &candidates {
        let ctx = classes::node_context(c, &planner_cfg);
        let mut planner = Planner::outcomes_only();
        planner.update(objects, &ctx, None);
        planners.insert(c.info.name.clone(), planner);
    }
    let mut out = BTreeMap::new();
    for (key, svc) in objects.services() {
        if !service::is_handled(svc, &cfg.planner) || !crate::vocab::valid_key(key) {
            continue;
        }
        let mut warnings = Vec::new();
        let lb = service::read(svc, key.clone(), &mut warnings);
        let filter = lb
            .address_filter(&cfg.planner.addresses, &mut Vec::new())
            .unwrap_or_default();
        let mut seen = PerNode::new(candidates.len(), lb.policy);
        for (node, planner) in &planners {
            if let Some(outcome) = planner.outcome(key) {
                seen.node(node, outcome);
            }
        }
        let found = Found {
            candidates: candidates.len(),
            ineligible: &ineligible,
            ingress: ingress(&candidates, &lb.families, &seen.serving, &filter).into(),
            gathered: seen.gathered,
            planned: planners
                .values()
                .next()
                .map(|p| p.warnings_of(key))
                .unwrap_or_default(),
            warnings,
        };
        out.insert(key.clone(), found.desired(key, &lb, cfg));
    }
    out
}

/// Each family's serving nodes' addresses that `filter` admits, in `families` order, sorted
/// and without repeats within a family.
fn ingress(
    candidates: &[Candidate],
    families: &[IpFamily],
    serving: &BTreeMap<IpFamily, Vec<String>>,
    filter: &AddressFilter,
) -> Vec<IpAddr> {
    let candidate = |name: &str| candidates.iter().find(|c| c.info.name == name).unwrap();
    let mut out = Vec::new();
    for family in families {
        let mut addrs: Vec<IpAddr> = serving
            .get(family)
            .into_iter()
            .flatten()
            .flat_map(|n| published(candidate(n), *family, filter))
            .collect();
        addrs.sort();
        addrs.dedup();
        out.extend(addrs);
    }
    out
}

/// What the candidates' planners say of one Service, gathered node by node.
struct PerNode {
    policy: TrafficPolicy,
    /// Nodes serving it, per family.
    serving: BTreeMap<IpFamily, Vec<String>>,
    gathered: Gathered,
}

impl PerNode {
    fn new(candidates: usize, policy: TrafficPolicy) -> PerNode {
        let mut gathered = Gathered::default();
        gathered.condition.candidates = candidates;
        PerNode {
            policy,
            serving: BTreeMap::new(),
            gathered,
        }
    }

    /// Node `node`'s outcome for the Service.
    fn node(&mut self, node: &str, outcome: &ServiceOutcome) {
        let mut why_not = None;
        match outcome {
            ServiceOutcome::ReservedPorts { .. } => {}
            ServiceOutcome::Served { families } => {
                let mut served_here = false;
                for f in families {
                    let FamilyState::Served { ports, .. } = &f.state else {
                        continue;
                    };
                    let mut serves = false;
                    for p in ports {
                        serves |= self.port(node, p, &mut why_not);
                    }
                    if serves {
                        self.serving
                            .entry(f.family)
                            .or_default()
                            .push(node.to_string());
                        served_here = true;
                    }
                }
                if served_here {
                    self.gathered.condition.serving += 1;
                    why_not = None;
                }
            }
            ServiceOutcome::NamespaceNotAllowed => self.gathered.condition.namespace_denied = true,
            ServiceOutcome::InvalidName | ServiceOutcome::NoValidPorts => {
                self.gathered.condition.invalid = true
            }
            // Excluded nodes are no Service's candidates: neither counted nor named.
            o @ ServiceOutcome::NotServed(NotServed::ExcludedByLabel) => {
                self.gathered.other.insert(o.to_string());
                self.gathered.condition.candidates -= 1;
            }
            o => {
                self.gathered.other.insert(o.to_string());
                why_not = Some(o.to_string());
            }
        }
        if let Some(w) = why_not {
            self.gathered.condition.why_not.add([node], 1, &w);
        }
    }

    /// One port's result on `node`: whether it makes the node serve the Service; the first
    /// reason it does not goes to `why_not`.
    fn port(&mut self, node: &str, p: &PortOutcome, why_not: &mut Option<String>) -> bool {
        let cluster = self.policy == TrafficPolicy::Cluster;
        match &p.result {
            PortResult::Conflict { holder } => {
                why_not.get_or_insert_with(|| {
                    format!("port {}/{} held by {holder}", p.port.port, p.port.protocol)
                });
                self.gathered
                    .conflicts
                    .entry((p.port.protocol, p.port.port, holder.clone()))
                    .or_default()
                    .push(node.to_string());
                false
            }
            PortResult::HostListener { listener } => {
                why_not.get_or_insert_with(|| observed::in_use(&p.port, listener));
                self.gathered
                    .listeners
                    .entry((p.port.protocol, p.port.port))
                    .or_default()
                    .insert((node.to_string(), listener.process.clone()));
                false
            }
            PortResult::Forwards { terminating, .. } => {
                let serves = cluster || !*terminating;
                self.gathered.condition.any_endpoint |= serves;
                serves
            }
            PortResult::RejectsNoEndpoints => cluster,
            PortResult::Withheld { .. } => false,
            PortResult::DropsNoLocalEndpoint { .. } => {
                why_not.get_or_insert_with(|| {
                    "no ready endpoint on the node (externalTrafficPolicy Local)".into()
                });
                false
            }
        }
    }
}
