//! Serving candidates in classes. Nodes whose planner input is the same but for their name and
//! addresses (see [`class_context`]) get the same outcome for every Service, but for `Local`
//! Services, whose endpoints [`super::local`] indexes by node. So the leader keeps one
//! outcomes-only planner per class, not per node, and its memory does not grow with the
//! number of nodes.

use super::heartbeat::Heartbeat;
use crate::plan::config::Config;
use crate::plan::node::{AddressKind, NodeInfo};
use crate::plan::selector::Selector;
use crate::plan::service::{EXCLUDE_LABEL, NODE_SELECTOR_ANNOTATION};
use crate::plan::{Context, Objects, Planner};
use crate::vocab::{Families, IpFamily, ServiceKey};
use k8s_openapi::api::core::v1::Node;
use std::collections::{BTreeMap, BTreeSet};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::time::Duration;

/// A node with a fresh heartbeat: it serves the Services its planner gives rules.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Candidate {
    pub info: NodeInfo,
    /// The families its heartbeat says are programmed.
    pub families: Families,
}

/// The serving candidates, in name order: the nodes whose heartbeat the leader saw renewed less
/// than a lease duration ago (`ages`).
pub fn candidates(
    nodes: &[Node],
    beats: &BTreeMap<String, Heartbeat>,
    ages: &BTreeMap<String, Duration>,
    lease_duration: Duration,
) -> Vec<Candidate> {
    let mut out: BTreeMap<String, Candidate> = BTreeMap::new();
    for n in nodes {
        let info = NodeInfo::from_node(n);
        let Some(beat) = beats.get(&info.name) else {
            continue;
        };
        let fresh = ages
            .get(&info.name)
            .is_some_and(|age| *age < lease_duration);
        if !fresh {
            continue;
        }
        let families = beat.families;
        out.insert(info.name.clone(), Candidate { info, families });
    }
    out.into_values().collect()
}

/// What the planner would be given on a candidate, as the leader knows it. Another host's
/// assigned addresses are not known here: its Node's addresses stand in (the agent there serves
/// only those that are assigned, and its heartbeat names only families it serves on).
pub fn node_context(c: &Candidate, config: &Config) -> Context {
    let local = c.info.addresses.iter().map(|(_, a)| *a).collect();
    Context::new(c.info.clone(), local, c.families, config.clone())
}

/// The class of a node: its planner input without what tells it from the other nodes of the
/// class. Its name and addresses go (an address per served family stands in: the served
/// families decide which of a Service's families are skipped), and of its labels only those
/// some Service's node selector or the exclusion label read (`read`) stay: a label every node
/// has its own value of, such as `kubernetes.io/hostname`, would make each node its own class.
///
/// Every field of the input is named here, so a new one must be placed: in the class (it joins
/// the key: one line below) or left out, with the reason.
pub fn class_context(ctx: &Context, read: &LabelsRead) -> Context {
    let Context {
        node:
            NodeInfo {
                name: _,
                labels,
                addresses: _,
            },
        // Only its served part counts, as `served` below.
        local_addresses: _,
        families,
        config,
        served,
    } = ctx;
    let labels = labels
        .iter()
        .filter(|(k, _)| read.reads(k))
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    let stand_in = |f: &IpFamily| -> IpAddr {
        match f {
            IpFamily::V4 => Ipv4Addr::UNSPECIFIED.into(),
            IpFamily::V6 => Ipv6Addr::UNSPECIFIED.into(),
        }
    };
    let addresses: Vec<(AddressKind, IpAddr)> = served
        .keys()
        .map(|f| (AddressKind::InternalIP, stand_in(f)))
        .collect();
    let local = addresses.iter().map(|(_, a)| *a).collect();
    let node = NodeInfo {
        name: String::new(),
        labels,
        addresses,
    };
    Context::new(node, local, *families, config.clone())
}

/// The node label keys that can decide whether a node serves a Service: the exclusion label and
/// every key a Service's `nodelb.io/node-selector` reads (of any Service that has one: which of
/// them nodelb handles does not matter here).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct LabelsRead {
    /// The keys each Service's selector reads (Services whose selector parses).
    by_service: BTreeMap<ServiceKey, Vec<String>>,
    /// Every key read, with how many Services read it.
    keys: BTreeMap<String, usize>,
}

impl LabelsRead {
    /// Bring it up to date with `objects`: the `dirty` Services, or (`None`) all.
    pub fn update(&mut self, objects: &Objects, dirty: Option<&BTreeSet<ServiceKey>>) {
        let keys: Vec<ServiceKey> = match dirty {
            Some(d) => d.iter().cloned().collect(),
            None => {
                *self = LabelsRead::default();
                objects.services().map(|(k, _)| k.clone()).collect()
            }
        };
        for key in keys {
            for k in self.by_service.remove(&key).unwrap_or_default() {
                if let Some(n) = self.keys.get_mut(&k) {
                    *n -= 1;
                    if *n == 0 {
                        self.keys.remove(&k);
                    }
                }
            }
            let selector = objects
                .service(&key)
                .and_then(|s| s.metadata.annotations.as_ref())
                .and_then(|a| a.get(NODE_SELECTOR_ANNOTATION))
                .and_then(|s| Selector::parse(s).ok());
            let Some(selector) = selector else { continue };
            let mut read: Vec<String> = selector
                .requirements()
                .iter()
                .map(|r| r.key.clone())
                .collect();
            read.sort();
            read.dedup();
            for k in &read {
                *self.keys.entry(k.clone()).or_default() += 1;
            }
            self.by_service.insert(key, read);
        }
    }

    pub fn reads(&self, key: &str) -> bool {
        key == EXCLUDE_LABEL || self.keys.contains_key(key)
    }
}

/// Candidates the planner cannot tell apart, and the planner that decides for all of them.
#[derive(Debug)]
pub struct Class {
    /// The planner's input for each of them (see [`class_context`]).
    pub context: Context,
    /// Its candidates (indexes into the candidates, ascending: in name order).
    pub members: Vec<usize>,
    pub planner: Planner,
}

/// The candidates and their classes.
#[derive(Debug, Default)]
pub struct Classes {
    pub candidates: Vec<Candidate>,
    /// In the order of their first member: the first candidate's class comes first.
    pub classes: Vec<Class>,
    /// Each candidate's class.
    pub class_of: Vec<usize>,
}

impl Classes {
    /// Group `candidates` into classes, keeping the planners of classes that were there
    /// before; returns whether the candidates or their classes changed (every Service's
    /// status is then decided again).
    pub fn regroup(&mut self, candidates: Vec<Candidate>, read: &LabelsRead, cfg: &Config) -> bool {
        let mut classes: Vec<Class> = Vec::new();
        let mut class_of = Vec::with_capacity(candidates.len());
        for (i, c) in candidates.iter().enumerate() {
            let context = class_context(&node_context(c, cfg), read);
            match classes.iter().position(|k| k.context == context) {
                Some(k) => {
                    classes[k].members.push(i);
                    class_of.push(k);
                }
                None => {
                    class_of.push(classes.len());
                    classes.push(Class {
                        context,
                        members: vec![i],
                        planner: Planner::outcomes_only(),
                    });
                }
            }
        }
        let same = candidates == self.candidates
            && classes.len() == self.classes.len()
            && classes
                .iter()
                .zip(&self.classes)
                .all(|(a, b)| a.context == b.context && a.members == b.members);
        for class in &mut classes {
            if let Some(old) = self.classes.iter_mut().find(|o| o.context == class.context) {
                class.planner = std::mem::take(&mut old.planner);
            }
        }
        *self = Classes {
            candidates,
            classes,
            class_of,
        };
        !same
    }

    /// The candidate named `name`.
    pub fn index_of(&self, name: &str) -> Option<usize> {
        self.candidates
            .binary_search_by(|c| c.info.name.as_str().cmp(name))
            .ok()
    }

    pub fn name(&self, i: usize) -> &str {
        &self.candidates[i].info.name
    }
}
