//! Serving candidates in classes. Nodes whose planner input is the same but for their name and
//! addresses (see [`class_context`]) get the same outcome for every Service, but for `Local`
//! Services, whose endpoints [`super::local`] indexes by node. So the leader keeps one
//! outcomes-only planner per class, not per node, and its memory does not grow with the
//! number of nodes.

use super::heartbeat::{BlockedPorts, Heartbeat};
use crate::objects::index::Service;
use crate::plan::addresses::parse_cidrs;
use crate::plan::addresses::ADDRESS_CIDRS_ANNOTATION;
use crate::plan::cidr::Cidr;
use crate::plan::config::Config;
use crate::plan::conflicts::Slot;
use crate::plan::listeners::{wildcard, HostListeners};
use crate::plan::node::{AddressKind, NodeInfo};
use crate::plan::selector::Selector;
use crate::plan::service::{self, EXCLUDE_LABEL, NODE_SELECTOR_ANNOTATION};
use crate::plan::{Context, Objects, Planner};
use crate::vocab::{Families, IpFamily, Listener, ServiceKey};
use k8s_openapi::api::core::v1::Node;
use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;
use std::time::Duration;

/// A node with a fresh heartbeat: it serves the Services its planner gives rules.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Candidate {
    pub info: NodeInfo,
    /// The families its heartbeat says are programmed.
    pub families: Families,
    /// The ports its heartbeat says host listeners hold there, with their processes.
    pub blocked: BlockedPorts,
    /// Its Node's `nodelb.io/published-addresses`, if valid (see [`super::published`]): not
    /// planner input, so not in its class.
    pub published: Vec<IpAddr>,
}

impl Candidate {
    /// Whether `other` is this candidate as far as the Services' status can tell: the same
    /// node and families, and the same ports held of those a Service claims (`read`), by the
    /// same processes.
    fn same_for(&self, other: &Candidate, read: &Read) -> bool {
        fn claimed<'a>(
            b: &'a BlockedPorts,
            read: &'a Read,
        ) -> impl Iterator<Item = (&'a Slot, &'a Option<String>)> {
            b.ports.iter().filter(|(slot, _)| read.claims(slot))
        }
        self.info == other.info
            && self.published == other.published
            && self.families == other.families
            && self.blocked.incomplete == other.blocked.incomplete
            && claimed(&self.blocked, read).eq(claimed(&other.blocked, read))
    }
}

/// The taint the cluster autoscaler puts on a node it is about to remove.
pub const TO_BE_DELETED_TAINT: &str = "ToBeDeletedByClusterAutoscaler";

/// Why a node with a fresh heartbeat serves nothing, if it does not: the cluster autoscaler is
/// removing it, its Node is being deleted, or its agent says its syncs keep failing (so its
/// kernel may not hold what it last programmed). Such a node leaves every status, as the cloud
/// service controller leaves it out of load balancers; its rules stay until it is gone.
pub fn ineligible(node: &Node, beat: &Heartbeat) -> Option<String> {
    let tainted = node
        .spec
        .as_ref()
        .and_then(|s| s.taints.as_ref())
        .is_some_and(|t| t.iter().any(|t| t.key == TO_BE_DELETED_TAINT));
    if tainted {
        Some(format!(
            "tainted {TO_BE_DELETED_TAINT}: the cluster autoscaler is removing it"
        ))
    } else if node.metadata.deletion_timestamp.is_some() {
        Some("its Node is being deleted".to_string())
    } else {
        beat.unhealthy
            .as_ref()
            .map(|why| format!("its agent's syncs keep failing: {why}"))
    }
}

/// Drop what the leader never reads of a Node, before it is stored: of its metadata all but
/// the name, uid, labels, `nodelb.io/` annotations, deletion timestamp and resource version;
/// of its spec all but the taints; of its status all but the addresses and the Ready
/// condition's status. A kubelet's Node also
/// carries its images, conditions, capacity and managed fields, kilobytes a node, which the
/// leader would otherwise hold for every node of the cluster and copy on every look.
pub fn trim_node(node: &mut Node) {
    use k8s_openapi::api::core::v1::{NodeCondition, NodeSpec, NodeStatus};
    let m = &mut node.metadata;
    m.managed_fields = None;
    m.owner_references = None;
    m.finalizers = None;
    if let Some(a) = &mut m.annotations {
        a.retain(|k, _| k.starts_with("nodelb.io/"));
    }
    if let Some(spec) = &mut node.spec {
        *spec = NodeSpec {
            taints: spec.taints.take(),
            ..NodeSpec::default()
        };
    }
    if let Some(status) = &mut node.status {
        // Of the conditions, Ready's status only: `Unknown` is the node lifecycle
        // controller's word that the kubelet went silent (`heartbeat::unknown_nodes`).
        let ready = status.conditions.take().map(|c| {
            c.into_iter()
                .filter(|c| c.type_ == "Ready")
                .map(|c| NodeCondition {
                    type_: c.type_,
                    status: c.status,
                    ..NodeCondition::default()
                })
                .collect()
        });
        *status = NodeStatus {
            addresses: status.addresses.take(),
            conditions: ready,
            ..NodeStatus::default()
        };
    }
}

/// The nodes with a fresh heartbeat that serve nothing, each with why (see [`ineligible`]).
pub fn ineligible_nodes(
    nodes: &[Node],
    beats: &BTreeMap<String, Heartbeat>,
    ages: &BTreeMap<String, Duration>,
    lease_duration: Duration,
) -> BTreeMap<String, String> {
    nodes
        .iter()
        .filter_map(|n| {
            let name = n.metadata.name.as_deref()?;
            let beat = fresh(name, beats, ages, lease_duration)?;
            Some((name.to_string(), ineligible(n, beat)?))
        })
        .collect()
}

/// The heartbeat of `node` if the leader saw it renewed less than a lease duration ago.
fn fresh<'a>(
    node: &str,
    beats: &'a BTreeMap<String, Heartbeat>,
    ages: &BTreeMap<String, Duration>,
    lease_duration: Duration,
) -> Option<&'a Heartbeat> {
    let beat = beats.get(node)?;
    ages.get(node)
        .is_some_and(|age| *age < lease_duration)
        .then_some(beat)
}

/// The serving candidates, in name order: the nodes whose heartbeat the leader saw renewed less
/// than a lease duration ago (`ages`), but for those [`ineligible`].
pub fn candidates(
    nodes: &[Node],
    beats: &BTreeMap<String, Heartbeat>,
    ages: &BTreeMap<String, Duration>,
    lease_duration: Duration,
) -> Vec<Candidate> {
    let mut out: BTreeMap<String, Candidate> = BTreeMap::new();
    for n in nodes {
        let info = NodeInfo::from_node(n);
        let Some(beat) = fresh(&info.name, beats, ages, lease_duration) else {
            continue;
        };
        if ineligible(n, beat).is_some() {
            continue;
        }
        let families = beat.families;
        let blocked = beat.blocked.clone();
        let candidate = Candidate {
            info,
            families,
            blocked,
            published: super::published::of_node(n),
        };
        out.insert(candidate.info.name.clone(), candidate);
    }
    out.into_values().collect()
}

/// What the planner would be given on a candidate, as the leader knows it. Another host's
/// assigned addresses are not known here: its Node's addresses stand in (the agent there serves
/// only those that are assigned, and its heartbeat names only families it serves on). Its
/// listeners: the ports its heartbeat says are held, each on its family's wildcard.
pub fn node_context(c: &Candidate, config: &Config) -> Context {
    let local = c.info.addresses.iter().map(|(_, a)| *a).collect();
    Context::new(c.info.clone(), local, c.families, config.clone())
        .with_listeners(c.blocked.listeners())
}

/// The class of a node: its planner input without what tells it from the other nodes of the
/// class. Its name and addresses go (for each served address, of each kind the Node lists it
/// as, a stand-in that lies in the same of the CIDRs the Services' address filters read: those
/// decide which of a Service's families are skipped, [`stand_in`]), and of its labels only those
/// some Service's node selector or the exclusion label read (`read`), or ServiceLB's labels
/// under `--servicelb-compat` while some node carries `enablelb` (`ServiceLb::reads`), stay: a
/// label every node
/// has its own value of, such as `kubernetes.io/hostname`, would make each node its own class.
/// Of the ports host listeners take there, only those some Service claims stay, and not the
/// processes: nodes running different daemons on ports no Service asks for are one class (the
/// status names each node's process from its own heartbeat, [`BlockedPorts::process`]).
///
/// Topology hints read the node's name and its `topology.kubernetes.io/zone` label, neither
/// of which stays in the class unless a node selector reads the label: they decide which of a
/// port's endpoints a node uses, never whether it forwards (a port narrowed by hints always
/// keeps some), and the status asks only the latter.
///
/// Every field of the input is named here, so a new one must be placed: in the class (it joins
/// the key: one line below) or left out, with the reason.
pub fn class_context(ctx: &Context, read: &Read) -> Context {
    let Context {
        node:
            NodeInfo {
                name: _,
                labels,
                // Only its served part counts, as `served` below.
                addresses: node_addresses,
            },
        // Only its served part counts, as `served` below.
        local_addresses: _,
        families,
        config,
        served,
        // Only what they take counts, as `taken` below.
        listeners: _,
        taken,
    } = ctx;
    let labels = labels
        .iter()
        .filter(|(k, _)| read.reads(k) || config.servicelb.reads(k))
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    // Each served address as the lowest address in exactly the same of the CIDRs any
    // Service's address filter reads (its kind kept): which addresses serve a Service, and
    // whether any does in a family, is then the same as on the node.
    let cidrs: Vec<Cidr> = read
        .cidrs
        .keys
        .keys()
        .chain(&config.addresses.cidrs)
        .copied()
        .collect();
    let mut addresses: Vec<(AddressKind, IpAddr)> = node_addresses
        .iter()
        .filter(|(_, a)| served.values().flatten().any(|s| s == a))
        .map(|(k, a)| (*k, stand_in(*a, &cidrs)))
        .collect();
    addresses.sort();
    addresses.dedup();
    let local = addresses.iter().map(|(_, a)| *a).collect();
    let node = NodeInfo {
        name: String::new(),
        labels,
        addresses,
    };
    // On the stand-in addresses, a listener on the wildcard takes what one on a served
    // address took.
    let sockets = taken
        .slots()
        .filter(|(slot, _)| read.claims(slot))
        .map(|((family, protocol, port), _)| Listener {
            protocol: *protocol,
            address: wildcard(*family),
            port: *port,
            process: None,
        })
        .collect();
    let listeners = HostListeners {
        sockets,
        incomplete: taken.every_port(),
    };
    Context::new(node, local, *families, config.clone()).with_listeners(listeners)
}

/// The lowest address in exactly those of `cidrs` that hold `address` (of its family): the
/// same for every address any address filter of `cidrs` admits or refuses alike.
pub fn stand_in(address: IpAddr, cidrs: &[Cidr]) -> IpAddr {
    let bits: u32 = match address {
        IpAddr::V4(_) => 32,
        IpAddr::V6(_) => 128,
    };
    let number = |a: IpAddr| -> u128 {
        match a {
            IpAddr::V4(a) => u128::from(u32::from(a)),
            IpAddr::V6(a) => u128::from(a),
        }
    };
    let range = |len: u8| -> u128 {
        match bits - u32::from(len) {
            128 => u128::MAX,
            host => (1u128 << host) - 1,
        }
    };
    // (first, last, prefix length) of each CIDR of the family.
    let spans: Vec<(u128, u128, u8)> = cidrs
        .iter()
        .filter(|c| c.family() == IpFamily::of(&address))
        .map(|c| (number(c.addr), number(c.addr) + range(c.len), c.len))
        .collect();
    let a = number(address);
    // The innermost CIDR holding it (CIDRs that hold one address are nested), else all.
    let (first, last, len) = spans
        .iter()
        .filter(|(f, l, _)| *f <= a && a <= *l)
        .max_by_key(|(_, _, len)| *len)
        .copied()
        .unwrap_or((0, range(0), 0));
    // Inside it, skip the CIDRs nested in it (none holds the address).
    let inner: Vec<(u128, u128)> = spans
        .iter()
        .filter(|(f, l, n)| *n > len && first <= *f && *l <= last)
        .map(|(f, l, _)| (*f, *l))
        .collect();
    let mut x = first;
    while let Some((_, l)) = inner.iter().find(|(f, l)| *f <= x && x <= *l) {
        match l.checked_add(1) {
            Some(next) if next <= a => x = next,
            _ => return address, // cannot happen: the address itself is in none of them
        }
    }
    match address {
        IpAddr::V4(_) => IpAddr::V4(u32::try_from(x).expect("an IPv4 number").into()),
        IpAddr::V6(_) => IpAddr::V6(x.into()),
    }
}

/// What of a node the Services read, which alone can tell its class from another's: the label
/// keys the exclusion label and every Service's `nodelb.io/node-selector` read (of any Service
/// that has one: which of them nodelb handles does not matter here), the CIDRs of every
/// Service's `nodelb.io/address-cidrs`, and the (family, protocol, port)s the Services nodelb
/// handles claim (a host listener on any other port changes nothing).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Read {
    labels: Tally<String>,
    cidrs: Tally<Cidr>,
    ports: Tally<Slot>,
}

impl Read {
    /// Bring it up to date with `objects`: the `dirty` Services, or (`None`) all.
    pub fn update(
        &mut self,
        objects: &Objects,
        dirty: Option<&BTreeSet<ServiceKey>>,
        handled: impl Fn(&Service) -> bool,
    ) {
        let whole = dirty.is_none();
        if whole {
            *self = Read::default();
        }
        let keys = objects.keys_to_update(dirty);
        for key in keys {
            let svc = objects.service(&key);
            let selector = svc
                .and_then(|s| s.metadata.annotations.as_ref())
                .and_then(|a| a.get(NODE_SELECTOR_ANNOTATION))
                .and_then(|s| Selector::parse(s).ok());
            let labels = selector
                .iter()
                .flat_map(|s| s.requirements())
                .map(|r| r.key.clone())
                .collect();
            self.labels.set(&key, labels);
            let cidrs = svc
                .and_then(|s| s.metadata.annotations.as_ref())
                .and_then(|a| a.get(ADDRESS_CIDRS_ANNOTATION))
                .and_then(|c| parse_cidrs(c).ok())
                .unwrap_or_default();
            self.cidrs.set(&key, cidrs);
            let ports = match svc.filter(|s| handled(s)) {
                Some(s) => claimed(&key, s),
                None => Vec::new(),
            };
            self.ports.set(&key, ports);
        }
        if whole {
            // Filled in key order: rebuilt packed (see `packed`).
            crate::packed::repack(&mut self.labels.by_service);
            crate::packed::repack(&mut self.cidrs.by_service);
            crate::packed::repack(&mut self.ports.by_service);
            crate::packed::repack(&mut self.ports.keys);
        }
    }

    pub fn reads(&self, key: &str) -> bool {
        key == EXCLUDE_LABEL || self.labels.contains(key)
    }

    /// Whether some Service nodelb handles claims this (family, protocol, port).
    pub fn claims(&self, slot: &Slot) -> bool {
        self.ports.contains(slot)
    }
}

/// Every (family, protocol, port) a Service may claim on a node: each of its ports in each of
/// its families (a planner claims no other).
fn claimed(key: &ServiceKey, svc: &Service) -> Vec<Slot> {
    let lb = service::read(svc, key.clone(), &mut Vec::new());
    lb.families
        .iter()
        .flat_map(|f| lb.ports.iter().map(|p| (*f, p.protocol, p.port)))
        .collect()
}

/// The keys each Service contributes, and every key with how many Services contribute it.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Tally<K> {
    /// Services that contribute any.
    by_service: BTreeMap<ServiceKey, Vec<K>>,
    keys: BTreeMap<K, usize>,
}

impl<K> Default for Tally<K> {
    fn default() -> Self {
        Tally {
            by_service: BTreeMap::new(),
            keys: BTreeMap::new(),
        }
    }
}

impl<K: Ord + Clone> Tally<K> {
    /// `service` now contributes `keys` (and no longer what it did before).
    fn set(&mut self, service: &ServiceKey, mut keys: Vec<K>) {
        for k in self.by_service.remove(service).unwrap_or_default() {
            if let Some(n) = self.keys.get_mut(&k) {
                *n -= 1;
                if *n == 0 {
                    self.keys.remove(&k);
                }
            }
        }
        keys.sort();
        keys.dedup();
        if keys.is_empty() {
            return;
        }
        for k in &keys {
            *self.keys.entry(k.clone()).or_default() += 1;
        }
        self.by_service.insert(service.clone(), keys);
    }

    fn contains<Q>(&self, key: &Q) -> bool
    where
        K: std::borrow::Borrow<Q>,
        Q: Ord + ?Sized,
    {
        self.keys.contains_key(key)
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
    pub fn regroup(&mut self, candidates: Vec<Candidate>, read: &Read, cfg: &Config) -> bool {
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
        let same = candidates.len() == self.candidates.len()
            && candidates
                .iter()
                .zip(&self.candidates)
                .all(|(a, b)| a.same_for(b, read))
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

#[cfg(test)]
mod tests {
    use super::*;

    /// A kubelet's Node, trimmed, reads the same to the leader: its planner input, whether it
    /// may serve, its addresses and its published ones.
    #[test]
    fn a_trimmed_node_reads_as_the_whole_one() {
        let whole: Node = serde_json::from_value(serde_json::json!({
            "metadata": {
                "name": "node-a", "uid": "u-1", "resourceVersion": "42",
                "labels": {"kubernetes.io/hostname": "node-a", "topology.kubernetes.io/zone": "a"},
                "annotations": {
                    "nodelb.io/published-addresses": "203.0.113.9",
                    "node.alpha.kubernetes.io/ttl": "0",
                    "volumes.kubernetes.io/controller-managed-attach-detach": "true"
                },
                "managedFields": [{"manager": "kubelet", "operation": "Update",
                                   "fieldsType": "FieldsV1", "fieldsV1": {"f:status": {}}}]
            },
            "spec": {"podCIDR": "10.244.0.0/24", "providerID": "metal://a",
                     "taints": [{"key": TO_BE_DELETED_TAINT, "effect": "NoSchedule"}]},
            "status": {
                "addresses": [{"type": "InternalIP", "address": "192.0.2.10"},
                              {"type": "Hostname", "address": "node-a"}],
                "images": [{"names": ["registry.example/app@sha256:0123", "registry.example/app:1"],
                            "sizeBytes": 123456789}],
                "conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady",
                                "message": "kubelet is posting ready status"}],
                "capacity": {"cpu": "2", "memory": "4Gi"},
                "nodeInfo": {"machineID": "m", "systemUUID": "s", "bootID": "b",
                             "kernelVersion": "6.1", "osImage": "Debian", "containerRuntimeVersion": "containerd://1.7",
                             "kubeletVersion": "v1.36.3", "kubeProxyVersion": "", "operatingSystem": "linux",
                             "architecture": "amd64"}
            }
        }))
        .unwrap();
        let mut trimmed = whole.clone();
        trim_node(&mut trimmed);
        let beat = Heartbeat {
            node: "node-a".into(),
            holder: None,
            renewed: "2026-01-01T00:00:00Z".parse().unwrap(),
            families: Families {
                v4: true,
                v6: false,
            },
            blocked: BlockedPorts::default(),
            unhealthy: None,
            by_pod: false,
        };
        assert_eq!(NodeInfo::from_node(&trimmed), NodeInfo::from_node(&whole));
        assert_eq!(ineligible(&trimmed, &beat), ineligible(&whole, &beat));
        assert!(ineligible(&trimmed, &beat).is_some(), "the taint is kept");
        assert_eq!(
            super::super::fanout::node_addresses(&trimmed),
            super::super::fanout::node_addresses(&whole)
        );
        assert_eq!(
            super::super::published::of_node(&trimmed),
            super::super::published::of_node(&whole)
        );
        assert_eq!(trimmed.metadata.uid, whole.metadata.uid);
        assert_eq!(
            trimmed.metadata.resource_version,
            whole.metadata.resource_version
        );
        let size = |n: &Node| serde_json::to_string(n).unwrap().len();
        assert!(
            size(&trimmed) * 2 < size(&whole),
            "trimmed {} bytes, whole {}",
            size(&trimmed),
            size(&whole)
        );
        assert!(trimmed.status.unwrap().images.is_none());
    }

    #[test]
    fn a_stand_in_lies_in_exactly_the_cidrs_its_address_lies_in() {
        let cidrs: Vec<Cidr> = [
            "203.0.113.0/24",
            "203.0.113.0/28",
            "203.0.113.16/28",
            "203.0.113.64/26",
            "203.0.113.66/32",
            "2001:db8::/64",
        ]
        .map(|c| Cidr::parse(c).unwrap())
        .into();
        let holding = |a: IpAddr| -> Vec<Cidr> {
            let host = Cidr::parse(&format!("{a}/{}", if a.is_ipv4() { 32 } else { 128 })).unwrap();
            cidrs
                .iter()
                .filter(|c| c.contains(&host))
                .copied()
                .collect()
        };
        for (address, want) in [
            ("203.0.113.5", "203.0.113.0"),
            ("203.0.113.20", "203.0.113.16"),
            // In the /24 only: the lowest such address is past the /28s nested in it.
            ("203.0.113.40", "203.0.113.32"),
            ("203.0.113.70", "203.0.113.64"),
            ("203.0.113.66", "203.0.113.66"),
            ("203.0.113.200", "203.0.113.32"),
            ("198.51.100.1", "0.0.0.0"),
            ("2001:db8::9", "2001:db8::"),
            ("2001:db8:1::9", "::"),
        ] {
            let a: IpAddr = address.parse().unwrap();
            let s = stand_in(a, &cidrs);
            assert_eq!(s.to_string(), want, "{address}");
            assert_eq!(holding(s), holding(a), "{address}");
        }
        // Outside every CIDR, when they cover the start of the family: the first address past them.
        let all = [Cidr::parse("0.0.0.0/1").unwrap()];
        assert_eq!(
            stand_in("198.51.100.1".parse().unwrap(), &all).to_string(),
            "128.0.0.0"
        );
    }
}
