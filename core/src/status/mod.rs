//! The pure status decision: from Services, EndpointSlices, Nodes, node heartbeat Leases and a
//! clock value to the `status.loadBalancer.ingress` each Service should have and the problems
//! worth an Event. No client, no clock of its own.
//!
//! A node serves a Service for a family when its heartbeat is fresh and says that family is
//! programmed, and the planner, run for that node, gives the Service rules there: not excluded,
//! inside the node selector, not beaten in a port conflict, no reserved port, no port its
//! heartbeat says a host listener holds, and for `Local` a ready endpoint on that node. The published addresses are the node's ExternalIPs of that
//! family, else its InternalIPs, of those the Service's address types and CIDRs admit (the
//! addresses that serve it), in `spec.ipFamilies` order, numerically sorted within a family;
//! a node's or the Service's `nodelb.io/published-addresses` stand in for them family by
//! family (`published.rs`).
//!
//! The planner runs once per class of nodes it cannot tell apart (`classes.rs`), not once per
//! node; what tells the nodes of a class apart, the endpoints of `Local` Services, comes from an
//! index of them by node (`local.rs`); `observed.rs` gathers a Service's status class by class.
//! The per-node computation this replaces is kept as the tests' oracle (`oracle.rs`).

pub mod classes;
pub mod condition;
pub mod election;
pub mod fanout;
pub mod heartbeat;
pub mod ingress;
pub mod local;
pub mod observed;
pub mod published;

#[cfg(test)]
mod oracle;
#[cfg(test)]
mod tests;
#[cfg(test)]
mod tests_classes;
#[cfg(test)]
mod tests_liveness;
#[cfg(test)]
mod tests_published;

use crate::objects::index::Service;
use crate::plan::addresses::AddressFilter;
use crate::plan::config::Config;
use crate::plan::diagnosis::Warning;
use crate::plan::node::{AddressKind, NodeInfo};
use crate::plan::service::{self, LbService, TrafficPolicy};
use crate::plan::servicelb;
use crate::plan::Objects;
use crate::vocab::{Families, IpFamily};
use crate::vocab::{Protocol, ServiceKey};
use classes::{Candidate, Classes, Read};
use heartbeat::Heartbeat;
use k8s_openapi::api::core::v1::Node;
use local::LocalIndex;
use observed::IngressKey;
use std::borrow::Cow;
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::net::IpAddr;
use std::sync::Arc;
use std::time::Duration;

/// What the leader decides with.
#[derive(Clone, Debug)]
pub struct StatusConfig {
    pub planner: Config,
    /// `--node-lease-duration`: a heartbeat whose renewal the leader saw change less than this
    /// long ago is fresh.
    pub node_lease_duration: Duration,
    /// What the leader cannot read of nodes' liveness, and what to grant (`None`: it reads
    /// everything). Every Service's condition ends with it, so that whoever looks at a
    /// Service sees why a dead node may stay published longer than it should.
    pub liveness: Option<String>,
}

impl StatusConfig {
    /// The planner's settings for the candidates: with `--servicelb-compat`, knowing whether any
    /// of `nodes` (every Node, serving or not, as k3s counts them) carries ServiceLB's
    /// `enablelb` label.
    pub fn planner_for(&self, nodes: &[Node]) -> Cow<'_, Config> {
        if !self.planner.servicelb.enabled() {
            return Cow::Borrowed(&self.planner);
        }
        let mut planner = self.planner.clone();
        planner.servicelb = planner.servicelb.seeing(servicelb::labelled(nodes));
        Cow::Owned(planner)
    }
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
        holder: ServiceKey,
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
    /// Its `nodelb.io/published-addresses` does not parse: the nodes' addresses are published.
    PublishedAddressesIgnored { invalid: published::Invalid },
}

impl Problem {
    pub fn reason(&self) -> &'static str {
        match self {
            Problem::PortConflict { .. } => "PortConflict",
            Problem::PortInUseOnNode { .. } => "PortInUseOnNode",
            Problem::ReservedPort { .. } => "ReservedPort",
            Problem::NoServingNodes { .. } => "NoServingNodes",
            Problem::InvalidInput { .. } | Problem::PublishedAddressesIgnored { .. } => {
                "InvalidInput"
            }
        }
    }

    pub fn note(&self) -> String {
        match self {
            Problem::PortConflict {
                protocol,
                port,
                holder,
                nodes,
            } => format!(
                "port {port}/{protocol} is held by the older Service {holder} on {}: no rules for this Service there",
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
            Problem::PublishedAddressesIgnored { invalid } => {
                format!("{invalid}; ignored: the serving nodes' addresses are published")
            }
        }
    }
}

/// The desired status of one Service nodelb handles.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Desired {
    /// Addresses to publish, in order (shared by the Services that publish the same).
    pub ingress: Arc<[IpAddr]>,
    pub problems: Vec<Problem>,
    /// The condition `nodelb.io/Serving`.
    pub serving: condition::Serving,
}

/// A serving candidate's addresses to publish for a family: those its Node's
/// `nodelb.io/published-addresses` names of the family, if any, in place of its own
/// ([`own`]); none where it has none of its own.
pub fn published(c: &Candidate, family: IpFamily, filter: &AddressFilter) -> Vec<IpAddr> {
    let mut own = own(&c.info, family, filter);
    own.sort();
    published::in_place_of(own, &c.published, family)
}

/// The node's addresses to publish for a family, of those that serve a Service (`filter`):
/// ExternalIP if any, else InternalIP.
fn own(node: &NodeInfo, family: IpFamily, filter: &AddressFilter) -> Vec<IpAddr> {
    let of = |kind| -> Vec<IpAddr> {
        node.addresses
            .iter()
            .filter(|(k, a)| *k == kind && IpFamily::of(a) == family && filter.admits(*k, a))
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

/// The status computation with memory: the serving candidates in classes with a planner each,
/// the endpoints of `Local` Services by node, and the desired status of every Service, so a
/// change recomputes only what it touches.
#[derive(Default)]
pub struct Status {
    classes: Classes,
    read: Read,
    local: LocalIndex,
    /// Published addresses, one list shared by every Service with the same serving nodes and
    /// address filter (kept while some Service's desired status holds it).
    ingresses: HashMap<(AddressFilter, IngressKey), Arc<[IpAddr]>>,
    /// The objects' version last computed from.
    version: Option<u64>,
    desired: BTreeMap<ServiceKey, Desired>,
    /// Nodes with a fresh heartbeat that serve nothing, each with why (every condition names
    /// them).
    ineligible: BTreeMap<String, String>,
    /// `StatusConfig::liveness` as last computed (every condition ends with it).
    liveness: Option<String>,
}

impl Status {
    /// The desired status of every Service nodelb handles, as last computed.
    pub fn desired(&self) -> &BTreeMap<ServiceKey, Desired> {
        &self.desired
    }

    /// The nodes that may serve (a fresh heartbeat, eligible), as last computed.
    pub fn candidates(&self) -> BTreeSet<String> {
        self.classes
            .candidates
            .iter()
            .map(|c| c.info.name.clone())
            .collect()
    }

    /// The nodes with a fresh heartbeat that serve nothing, with why, as last computed.
    pub fn ineligible(&self) -> &BTreeMap<String, String> {
        &self.ineligible
    }

    /// How many classes the serving candidates fall into (one planner each).
    pub fn classes(&self) -> usize {
        self.classes.classes.len()
    }

    /// Bring the desired status up to date; returns the Services whose desired status changed
    /// (or that stopped being nodelb's).
    /// `ages`: each heartbeat's age as the leader observed it (see [`heartbeat::Liveness`]).
    pub fn compute(
        &mut self,
        objects: &Objects,
        nodes: &[Node],
        beats: &BTreeMap<String, Heartbeat>,
        ages: &BTreeMap<String, Duration>,
        cfg: &StatusConfig,
    ) -> BTreeSet<ServiceKey> {
        let candidates = classes::candidates(nodes, beats, ages, cfg.node_lease_duration);
        let ineligible = classes::ineligible_nodes(nodes, beats, ages, cfg.node_lease_duration);
        // Every condition names them: a change of them (or of why) rewrites every Service's;
        // so does a change of what liveness cannot read.
        let named_anew = ineligible != self.ineligible || cfg.liveness != self.liveness;
        self.ineligible = ineligible;
        self.liveness = cfg.liveness.clone();
        let dirty = self.version.and_then(|v| objects.changed_since(v));
        self.version = Some(objects.version());
        let handled = |svc: &Service| service::is_handled(svc, &cfg.planner);
        self.read.update(objects, dirty.as_ref(), handled);
        self.local.update(objects, dirty.as_ref(), handled);
        // A change of the candidates or their classes recomputes every Service.
        let planner = cfg.planner_for(nodes);
        let regrouped = self.classes.regroup(candidates, &self.read, &planner);
        let everything = dirty.is_none() || regrouped || named_anew;
        let mut touched: BTreeSet<ServiceKey> = dirty.clone().unwrap_or_default();
        for class in &mut self.classes.classes {
            let u = class
                .planner
                .update(objects, &class.context, dirty.as_ref());
            touched.extend(u.changed);
        }
        if everything {
            self.ingresses.clear();
        }
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
        self.ingresses.retain(|_, a| Arc::strong_count(a) > 1);
        if everything {
            // Inserted in key order: half-full nodes (see `packed`).
            crate::packed::repack(&mut self.desired);
        }
        changed
    }

    fn desired_of(
        &mut self,
        key: &ServiceKey,
        svc: &Service,
        cfg: &StatusConfig,
    ) -> Option<Desired> {
        if !service::is_handled(svc, &cfg.planner) || !crate::vocab::valid_key(key) {
            return None;
        }
        let mut warnings = Vec::new();
        let lb = service::read(svc, key.clone(), &mut warnings);
        let classes = &self.classes;
        let mut seen = observed::observe(classes, key, lb.policy, self.local.get(key));
        // Invalid: served nowhere, whatever it publishes.
        let filter = lb
            .address_filter(&cfg.planner.addresses, &mut Vec::new())
            .unwrap_or_default();
        let ingress = self
            .ingresses
            .entry((filter, seen.ingress_key(&lb.families)))
            .or_insert_with_key(|(filter, k)| ingress(classes, k, filter))
            .clone();
        // Invalid parts as the first candidate's planner found them, as they were found when
        // each candidate had a planner of its own.
        let planned = classes
            .classes
            .first()
            .map(|c| c.planner.warnings_of(key))
            .unwrap_or_default();
        let found = Found {
            candidates: classes.candidates.len(),
            ineligible: &self.ineligible,
            ingress,
            gathered: seen.gathered,
            planned,
            warnings,
        };
        Some(found.desired(key, &lb, cfg))
    }
}

/// The addresses to publish: each family's serving nodes' addresses that `filter` admits, in
/// the Service's families order, sorted and without repeats within a family.
fn ingress(classes: &Classes, key: &IngressKey, filter: &AddressFilter) -> Arc<[IpAddr]> {
    let mut out = Vec::new();
    for (family, servers) in key {
        let members = servers
            .classes
            .iter()
            .flat_map(|c| &classes.classes[*c].members);
        let mut addrs: Vec<IpAddr> = members
            .chain(&servers.nodes)
            .flat_map(|i| published(&classes.candidates[*i], *family, filter))
            .collect();
        addrs.sort();
        addrs.dedup();
        out.extend(addrs);
    }
    out.into()
}

/// What a Service's desired status is decided from: what the candidates' planners said of
/// it, and what reading it found.
pub(crate) struct Found<'a> {
    /// How many serving candidates there are.
    pub candidates: usize,
    /// The nodes with a fresh heartbeat that serve nothing, with why (`classes::ineligible`).
    pub ineligible: &'a BTreeMap<String, String>,
    pub ingress: Arc<[IpAddr]>,
    pub gathered: observed::Gathered,
    /// Invalid parts of the Service and its slices, as a planner found them.
    pub planned: &'a [Warning],
    /// Invalid parts of the Service, as reading it found them.
    pub warnings: Vec<Warning>,
}

impl Found<'_> {
    pub fn desired(self, key: &ServiceKey, lb: &LbService<'_>, cfg: &StatusConfig) -> Desired {
        let Found {
            candidates,
            ineligible,
            ingress,
            mut gathered,
            planned,
            warnings,
        } = self;
        // Named in the condition as the candidates that do not serve it are.
        let seen = &mut gathered.condition;
        seen.candidates += ineligible.len();
        seen.why_not.add_each(
            ineligible.iter().map(|(n, why)| (n.as_str(), why.clone())),
            ineligible.len(),
        );
        let mut desired = Desired {
            ingress,
            ..Desired::default()
        };
        match lb.published.map(published::parse) {
            Some(Ok(named)) => {
                let ingress = published::for_service(&desired.ingress, &lb.families, &named);
                if *desired.ingress != *ingress {
                    desired.ingress = ingress.into();
                }
            }
            Some(Err(invalid)) => desired
                .problems
                .push(Problem::PublishedAddressesIgnored { invalid }),
            None => {}
        }
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
        for ((protocol, port, holder), mut nodes) in gathered.conflicts {
            // A node that lost the port in both families is named once.
            nodes.sort();
            nodes.dedup();
            desired.problems.push(Problem::PortConflict {
                protocol,
                port,
                holder,
                nodes,
            });
        }
        for ((protocol, port), nodes) in gathered.listeners {
            desired.problems.push(Problem::PortInUseOnNode {
                protocol,
                port,
                nodes: nodes.into_iter().collect(),
            });
        }
        if desired.ingress.is_empty() && desired.problems.is_empty() {
            // (Invalid input is added below: it does not explain an empty status.)
            let why = why_no_node(candidates == 0, ineligible, lb.policy, &gathered.other);
            desired.problems.push(Problem::NoServingNodes { why });
        }
        invalid_parts(planned, warnings, &mut desired.problems);
        let seen = &gathered.condition;
        desired.serving = condition::decide(seen, &desired.problems, &key.namespace);
        if let Some(note) = &cfg.liveness {
            desired.serving.message.push_str("; ");
            desired.serving.message.push_str(note);
        }
        // Kept for every Service: no spare room.
        desired.problems.shrink_to_fit();
        desired
    }
}

fn why_no_node(
    no_candidates: bool,
    ineligible: &BTreeMap<String, String>,
    policy: TrafficPolicy,
    other: &BTreeSet<String>,
) -> String {
    if no_candidates && !ineligible.is_empty() {
        let each: Vec<String> = ineligible
            .iter()
            .map(|(node, why)| format!("{node}: {why}"))
            .collect();
        format!(
            "every node with a fresh nodelb heartbeat is out ({})",
            each.join("; ")
        )
    } else if no_candidates {
        "no node has a fresh nodelb heartbeat".to_string()
    } else if policy == TrafficPolicy::Local {
        "externalTrafficPolicy is Local and no serving node has a ready endpoint".to_string()
    } else if other.is_empty() {
        "no serving node has an address of the Service's families".to_string()
    } else {
        other.iter().cloned().collect::<Vec<_>>().join("; ")
    }
}

/// Invalid parts, as a planner found them (they do not depend on the node), and as reading
/// the Service found them, each once.
fn invalid_parts(planned: &[Warning], warnings: Vec<Warning>, problems: &mut Vec<Problem>) {
    let mut seen = BTreeSet::new();
    for w in planned.iter().cloned().chain(warnings) {
        if seen.insert(w.to_string()) {
            problems.push(Problem::InvalidInput {
                problem: w.to_string(),
            });
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
