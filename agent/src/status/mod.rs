//! The pure status decision: from Services, EndpointSlices, Nodes, node heartbeat Leases and a
//! clock value to the `status.loadBalancer.ingress` each Service should have and the problems
//! worth an Event. No client, no clock of its own.
//!
//! A node serves a Service for a family when its heartbeat is fresh and says that family is
//! programmed, and the planner, run for that node, gives the Service rules there: not excluded,
//! inside the node selector, not beaten in a port conflict, no reserved port, and for `Local`
//! a ready endpoint on that node. The published addresses are the node's ExternalIPs of that
//! family, else its InternalIPs, in `spec.ipFamilies` order, numerically sorted within a family.

pub mod condition;
pub mod election;
pub mod heartbeat;
pub mod ingress;

#[cfg(test)]
mod tests;

use crate::plan::config::Config;
use crate::plan::diagnosis::{FamilyState, PortResult, ServiceOutcome};
use crate::plan::index::Service;
use crate::plan::node::{AddressKind, NodeInfo};
use crate::plan::service::{self, TrafficPolicy};
use crate::plan::{Context, Objects, Planner};
use crate::vocab::{Families, IpFamily};
use crate::vocab::{Protocol, ServiceKey};
use heartbeat::{BlockedPorts, Heartbeat};
use k8s_openapi::api::core::v1::Node;
use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;
use std::time::Duration;

/// What the leader decides with.
#[derive(Clone, Debug)]
pub struct StatusConfig {
    pub planner: Config,
    /// `--node-lease-duration`: a heartbeat whose renewal the leader saw change less than this
    /// long ago is fresh.
    pub node_lease_duration: Duration,
}

/// A node, with the process listening on a port there where its agent could tell.
pub type NodeProcess = (String, Option<String>);

/// A problem with a Service that deserves a Warning Event (reason and note).
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Problem {
    /// Another Service holds one of its ports on some nodes.
    PortConflict {
        protocol: Protocol,
        port: u16,
        winner: ServiceKey,
        nodes: Vec<String>,
    },
    /// A process on some nodes listens on one of its ports: the nodes, each with the
    /// process where its agent could tell.
    PortInUseOnNode {
        protocol: Protocol,
        port: u16,
        nodes: Vec<NodeProcess>,
    },
    /// It asks for ports in `--reserved-ports`.
    ReservedPort { ports: Vec<(Protocol, u16)> },
    /// No node serves it.
    NoServingNodes { why: String },
    /// Something in the Service or its EndpointSlices is invalid and was left out.
    InvalidInput { problem: String },
}

impl Problem {
    pub fn reason(&self) -> &'static str {
        match self {
            Problem::PortConflict { .. } => "PortConflict",
            Problem::PortInUseOnNode { .. } => "PortInUseOnNode",
            Problem::ReservedPort { .. } => "ReservedPort",
            Problem::NoServingNodes { .. } => "NoServingNodes",
            Problem::InvalidInput { .. } => "InvalidInput",
        }
    }

    pub fn note(&self) -> String {
        match self {
            Problem::PortConflict {
                protocol,
                port,
                winner,
                nodes,
            } => format!(
                "port {port}/{protocol} is held by the older Service {winner} on {}: no rules for this Service there",
                nodes.join(", ")
            ),
            Problem::PortInUseOnNode {
                protocol,
                port,
                nodes,
            } => {
                let on: Vec<String> = nodes
                    .iter()
                    .map(|(node, process)| match process {
                        Some(p) => format!("{node} (process {p})"),
                        None => node.clone(),
                    })
                    .collect();
                format!(
                    "port {port}/{protocol} is in use by a process listening on {}: no rules for this Service there (a host listener always wins)",
                    on.join(", ")
                )
            }
            Problem::ReservedPort { ports } => {
                let list: Vec<String> = ports.iter().map(|(p, n)| format!("{n}/{p}")).collect();
                format!(
                    "port {} is reserved for the node (--reserved-ports): no rules on any node",
                    list.join(", ")
                )
            }
            Problem::NoServingNodes { why } => format!("no node serves this Service: {why}"),
            Problem::InvalidInput { problem } => format!("left out: {problem}"),
        }
    }
}

/// The desired status of one Service nodelb handles.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Desired {
    /// Addresses to publish, in order.
    pub ingress: Vec<IpAddr>,
    pub problems: Vec<Problem>,
    /// The condition `nodelb.io/Serving`.
    pub serving: condition::Serving,
}

/// The node's addresses to publish for a family: ExternalIP if any, else InternalIP.
pub fn published(node: &NodeInfo, family: IpFamily) -> Vec<IpAddr> {
    let of = |kind| -> Vec<IpAddr> {
        node.addresses
            .iter()
            .filter(|(k, a)| *k == kind && IpFamily::of(a) == family)
            .map(|(_, a)| *a)
            .collect()
    };
    let external = of(AddressKind::ExternalIP);
    if external.is_empty() {
        of(AddressKind::InternalIP)
    } else {
        external
    }
}

/// The status computation with memory: planners per node and the desired status of every
/// Service, so a change recomputes only what it touches.
#[derive(Default)]
pub struct Status {
    planners: BTreeMap<String, Planner>,
    /// The serving candidates last time, with the ports host listeners hold there: a change
    /// there recomputes every Service.
    candidates: BTreeMap<String, (NodeInfo, Families, BlockedPorts)>,
    /// The objects' version last computed from.
    version: Option<u64>,
    desired: BTreeMap<ServiceKey, Desired>,
}

impl Status {
    /// The desired status of every Service nodelb handles, as last computed.
    pub fn desired(&self) -> &BTreeMap<ServiceKey, Desired> {
        &self.desired
    }

    /// Bring the desired status up to date; returns the Services whose desired status changed
    /// (or that stopped being nodelb's).
    /// `ages`: each heartbeat's age as the leader observed it (see [`heartbeat::Observed`]).
    pub fn compute(
        &mut self,
        objects: &Objects,
        nodes: &[Node],
        beats: &BTreeMap<String, Heartbeat>,
        ages: &BTreeMap<String, Duration>,
        cfg: &StatusConfig,
    ) -> BTreeSet<ServiceKey> {
        // Serving candidates: nodes with a fresh heartbeat; their families from it.
        let mut candidates: BTreeMap<String, (NodeInfo, Families, BlockedPorts)> = BTreeMap::new();
        for n in nodes {
            let info = NodeInfo::from_node(n);
            let Some(beat) = beats.get(&info.name) else {
                continue;
            };
            let fresh = ages
                .get(&info.name)
                .is_some_and(|age| *age < cfg.node_lease_duration);
            if !fresh {
                continue;
            }
            candidates.insert(
                info.name.clone(),
                (info, beat.families, beat.blocked.clone()),
            );
        }
        let dirty = self.version.and_then(|v| objects.changed_since(v));
        let everything = dirty.is_none() || candidates != self.candidates;
        self.version = Some(objects.version());
        self.planners
            .retain(|name, _| candidates.contains_key(name));
        let mut touched: BTreeSet<ServiceKey> = dirty.clone().unwrap_or_default();
        for (name, (info, families, blocked)) in &candidates {
            // Another host's assigned addresses are not known here: its Node's addresses stand
            // in (the agent there serves only those that are assigned, and its heartbeat names
            // only families it serves on). Its listeners: the ports its heartbeat says are held.
            let local = info.addresses.iter().map(|(_, a)| *a).collect();
            let ctx = Context::new(info.clone(), local, *families, cfg.planner.clone())
                .with_listeners(blocked.listeners());
            let planner = self
                .planners
                .entry(name.clone())
                .or_insert_with(Planner::outcomes_only);
            let u = planner.update(objects, &ctx, dirty.as_ref());
            touched.extend(u.changed);
        }
        self.candidates = candidates;

        let keys: Vec<ServiceKey> = if everything {
            objects
                .services()
                .map(|(k, _)| k.clone())
                .chain(self.desired.keys().cloned())
                .collect::<BTreeSet<_>>()
                .into_iter()
                .collect()
        } else {
            touched.into_iter().collect()
        };
        let mut changed = BTreeSet::new();
        for key in keys {
            let new = objects
                .service(&key)
                .and_then(|svc| self.desired_of(&key, svc, cfg));
            let old = self.desired.get(&key);
            if old != new.as_ref() {
                changed.insert(key.clone());
            }
            match new {
                Some(d) => self.desired.insert(key, d),
                None => self.desired.remove(&key),
            };
        }
        changed
    }

    fn desired_of(&self, key: &ServiceKey, svc: &Service, cfg: &StatusConfig) -> Option<Desired> {
        if !service::is_handled(svc, &cfg.planner) || !crate::vocab::valid_key(key) {
            return None;
        }
        let mut warnings = Vec::new();
        let lb = service::read(svc, key.clone(), &mut warnings);
        let mut seen = Observed::new(self.candidates.len(), lb.policy);
        for (node, planner) in &self.planners {
            if let Some(outcome) = planner.outcome(key) {
                seen.node(node, outcome);
            }
        }
        let mut desired = Desired {
            ingress: self.ingress(&lb.families, &seen.serving),
            ..Desired::default()
        };
        let reserved: Vec<(Protocol, u16)> = lb
            .ports
            .iter()
            .filter(|p| cfg.planner.reserved_ports.contains(p.protocol, p.port))
            .map(|p| (p.protocol, p.port))
            .collect();
        if !reserved.is_empty() {
            desired
                .problems
                .push(Problem::ReservedPort { ports: reserved });
        }
        for ((protocol, port, winner), nodes) in std::mem::take(&mut seen.conflicts) {
            desired.problems.push(Problem::PortConflict {
                protocol,
                port,
                winner,
                nodes,
            });
        }
        for ((protocol, port), nodes) in std::mem::take(&mut seen.listeners) {
            desired.problems.push(Problem::PortInUseOnNode {
                protocol,
                port,
                nodes: nodes.into_iter().collect(),
            });
        }
        if desired.ingress.is_empty() && desired.problems.is_empty() {
            // (Invalid input is added below: it does not explain an empty status.)
            let why = self.why_no_node(lb.policy, &seen.other);
            desired.problems.push(Problem::NoServingNodes { why });
        }
        self.invalid_parts(key, warnings, &mut desired.problems);
        desired.serving = condition::decide(&seen.condition, &desired.problems, &key.namespace);
        // Kept for every Service: no spare room.
        desired.ingress.shrink_to_fit();
        desired.problems.shrink_to_fit();
        Some(desired)
    }

    /// The addresses to publish: each family's serving nodes' addresses, in `families` order,
    /// sorted and without repeats within a family.
    fn ingress(
        &self,
        families: &[IpFamily],
        serving: &BTreeMap<IpFamily, Vec<String>>,
    ) -> Vec<IpAddr> {
        let mut out = Vec::new();
        for family in families {
            let mut addrs: Vec<IpAddr> = serving
                .get(family)
                .into_iter()
                .flatten()
                .flat_map(|n| published(&self.candidates[n].0, *family))
                .collect();
            addrs.sort();
            addrs.dedup();
            out.extend(addrs);
        }
        out
    }

    fn why_no_node(&self, policy: TrafficPolicy, other: &BTreeSet<String>) -> String {
        if self.candidates.is_empty() {
            "no node has a fresh nodelb heartbeat".to_string()
        } else if policy == TrafficPolicy::Local {
            "externalTrafficPolicy is Local and no serving node has a ready endpoint".to_string()
        } else if other.is_empty() {
            "no serving node has an address of the Service's families".to_string()
        } else {
            other.iter().cloned().collect::<Vec<_>>().join("; ")
        }
    }

    /// Invalid parts, as any node's planner found them (they do not depend on the node), and
    /// as reading the Service found them, each once.
    fn invalid_parts(
        &self,
        key: &ServiceKey,
        warnings: Vec<crate::plan::diagnosis::Warning>,
        problems: &mut Vec<Problem>,
    ) {
        let mut seen = BTreeSet::new();
        let planned = self
            .planners
            .values()
            .next()
            .into_iter()
            .flat_map(|p| p.warnings_of(key).iter().cloned());
        for w in planned.chain(warnings) {
            if seen.insert(w.to_string()) {
                problems.push(Problem::InvalidInput {
                    problem: w.to_string(),
                });
            }
        }
    }
}

/// What the serving candidates' planners say of one Service, gathered node by node.
struct Observed {
    policy: TrafficPolicy,
    /// Nodes serving it, per family.
    serving: BTreeMap<IpFamily, Vec<String>>,
    /// Ports lost to an older Service: the nodes where each was lost.
    conflicts: BTreeMap<(Protocol, u16, ServiceKey), Vec<String>>,
    /// Ports held by host listeners: the nodes (with the process) where each is held.
    listeners: BTreeMap<(Protocol, u16), BTreeSet<NodeProcess>>,
    /// Why the nodes that are not serving nodes of it are not.
    other: BTreeSet<String>,
    condition: condition::Seen,
}

impl Observed {
    fn new(candidates: usize, policy: TrafficPolicy) -> Observed {
        Observed {
            policy,
            serving: BTreeMap::new(),
            conflicts: BTreeMap::new(),
            listeners: BTreeMap::new(),
            other: BTreeSet::new(),
            condition: condition::Seen {
                candidates,
                ..Default::default()
            },
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
                    self.condition.serving += 1;
                    why_not = None;
                }
            }
            ServiceOutcome::NamespaceNotAllowed => self.condition.namespace_denied = true,
            ServiceOutcome::InvalidName | ServiceOutcome::NoValidPorts => {
                self.condition.invalid = true
            }
            o => {
                self.other.insert(o.to_string());
                why_not = Some(o.to_string());
            }
        }
        if let Some(w) = why_not {
            self.condition.why_not.insert(node.to_string(), w);
        }
    }

    /// One port's result on `node`: whether it makes the node serve the Service; the first
    /// reason it does not goes to `why_not`.
    fn port(
        &mut self,
        node: &str,
        p: &crate::plan::diagnosis::PortOutcome,
        why_not: &mut Option<String>,
    ) -> bool {
        let cluster = self.policy == TrafficPolicy::Cluster;
        match &p.result {
            PortResult::Conflict { winner } => {
                why_not.get_or_insert_with(|| {
                    format!("port {}/{} held by {winner}", p.port.port, p.port.protocol)
                });
                self.conflicts
                    .entry((p.port.protocol, p.port.port, winner.clone()))
                    .or_default()
                    .push(node.to_string());
                false
            }
            PortResult::HostListener { listener } => {
                why_not.get_or_insert_with(|| {
                    format!(
                        "port {}/{} in use on the node by {listener}",
                        p.port.port, p.port.protocol
                    )
                });
                self.listeners
                    .entry((p.port.protocol, p.port.port))
                    .or_default()
                    .insert((node.to_string(), listener.process.clone()));
                false
            }
            PortResult::Forwards { terminating, .. } => {
                let serves = cluster || !*terminating;
                self.condition.any_endpoint |= serves;
                serves
            }
            PortResult::RejectsNoEndpoints => cluster,
            // The family's lost port (a `Conflict` or `HostListener` beside it) says why.
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

/// Families a heartbeat says are programmed, as written in its annotation (`IPv4,IPv6`).
pub fn parse_families(s: &str) -> Families {
    let mut f = Families {
        v4: false,
        v6: false,
    };
    for part in s.split(',') {
        match IpFamily::parse(part.trim()) {
            Some(IpFamily::V4) => f.v4 = true,
            Some(IpFamily::V6) => f.v6 = true,
            None => {}
        }
    }
    f
}

pub fn format_families(f: Families) -> String {
    f.iter()
        .map(|f| f.to_string())
        .collect::<Vec<_>>()
        .join(",")
}
