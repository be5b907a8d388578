//! Node heartbeats: the Lease `nodelb-node-<node>` each agent writes in its namespace, with
//! annotations naming the families it has programmed and the Service ports host listeners
//! hold there. Read here into plain values.
//!
//! How the leader tells an agent is alive depends on where it runs. An agent outside a Pod
//! renews its Lease every third of `--node-lease-duration`. An agent in a Pod with a readiness
//! probe (the manifests' DaemonSet) writes its Lease only when what the Lease carries changes,
//! or while the kubelet's word on it is not current (its kubelet down, or its `/readyz`
//! failing): the leader takes its liveness from its Pod's Ready condition
//! (the kubelet probes `/readyz`) and from the kubelet's own node Lease in `kube-node-lease`,
//! renewals the cluster writes anyway ([`Liveness::ages`]).

use crate::plan::conflicts::Slot;
use crate::plan::listeners::{wildcard, HostListeners};
use crate::plan::reserved::ReservedPorts;
use crate::vocab::{Families, IpFamily, Listener, Protocol};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Pod, PodCondition, PodSpec, PodStatus};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use k8s_openapi::jiff::Timestamp;
use std::borrow::Borrow;
use std::collections::{BTreeMap, BTreeSet};
use std::ops::RangeInclusive;
use std::time::{Duration, Instant};

/// Prefix of the heartbeat Lease names; the node name follows.
pub const LEASE_PREFIX: &str = "nodelb-node-";
/// Annotation on a heartbeat: the families the agent has programmed, `IPv4,IPv6`.
pub const FAMILIES_ANNOTATION: &str = "nodelb.io/families";
/// Label on a heartbeat: the node's name (Lease names may be shortened, labels are exact).
pub const NODE_LABEL: &str = "nodelb.io/node";
/// Annotation on a heartbeat: the ports host listeners hold on the node that a Service may ask
/// for (see [`BlockedPorts::report`]), with the process where known,
/// `IPv4/TCP/7000=socat,IPv6/UDP/53` (absent when there are none).
pub const BLOCKED_ANNOTATION: &str = "nodelb.io/blocked-ports";
/// Annotation on a heartbeat whose agent's syncs have been failing for longer than its node
/// lease duration: why (its last error). Such a heartbeat also names no family: the node no
/// longer claims to serve what its kernel may not hold.
pub const UNHEALTHY_ANNOTATION: &str = "nodelb.io/unhealthy";
/// Annotation on a heartbeat whose agent runs in the Pod its holder names: [`LIVENESS_POD`].
/// Absent: the agent renews the Lease itself.
pub const LIVENESS_ANNOTATION: &str = "nodelb.io/liveness";
/// [`LIVENESS_ANNOTATION`]'s value: alive while its Pod is Ready and its kubelet renews.
pub const LIVENESS_POD: &str = "Pod";
/// The namespace of the kubelets' node Leases.
pub const KUBELET_LEASE_NAMESPACE: &str = "kube-node-lease";
/// At most this many ports are listed (about 37 KiB at the longest): past it only the ports
/// Services ask for, and past it again the list ends with [`MORE`] and the leader counts every
/// port as held on that node.
pub const MAX_BLOCKED: usize = 1000;
/// The last entry of a list cut at [`MAX_BLOCKED`].
pub const MORE: &str = "more";

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Heartbeat {
    pub node: String,
    pub holder: Option<String>,
    pub renewed: Timestamp,
    pub families: Families,
    /// The Service ports host listeners hold on the node.
    pub blocked: BlockedPorts,
    /// The agent says its syncs have been failing for too long (why): the node serves nothing.
    pub unhealthy: Option<String>,
    /// The agent runs in the Pod `holder` names ([`LIVENESS_POD`]).
    pub by_pod: bool,
}

/// What an agent reports in its heartbeat, from its last committed sync.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Report {
    pub families: Families,
    pub blocked: BlockedPorts,
    /// Syncs have been failing for longer than the node lease duration: why.
    pub unhealthy: Option<String>,
}

/// The Service ports host listeners hold on a node: (family, protocol, port) with the
/// listening process where the node could tell.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct BlockedPorts {
    pub ports: BTreeMap<Slot, Option<String>>,
    /// More were held than a heartbeat lists ([`MAX_BLOCKED`]).
    pub incomplete: bool,
}

impl BlockedPorts {
    /// What a node reports: every (family, protocol, port) host listeners take there that a
    /// Service may ask for (not reserved), so that the leader knows before a Service asks; in
    /// the ephemeral port range, where the kernel's own sockets come and go, only those a
    /// Service asks for (`held`). Past [`MAX_BLOCKED`] entries only `held` is listed (and past
    /// that, [`MORE`] ends the list).
    /// `taken`: as the planner found them (`Planner::taken_ports`); `held`: the ports taken
    /// from a Service, with the process holding each where known.
    pub fn report(
        taken: &[(Slot, &Listener, bool)],
        held: &BTreeMap<Slot, Option<String>>,
        reserved: &ReservedPorts,
        ephemeral: Option<&RangeInclusive<u16>>,
    ) -> BlockedPorts {
        let mut ports = held.clone();
        for ((family, protocol, port), l, _) in taken {
            let churns = ephemeral.is_some_and(|e| e.contains(port));
            if !reserved.contains(*protocol, *port) && !churns {
                ports
                    .entry((*family, *protocol, *port))
                    .or_insert_with(|| l.process.clone());
            }
        }
        if ports.len() > MAX_BLOCKED {
            ports = held.clone();
        }
        BlockedPorts {
            ports,
            incomplete: false,
        }
    }

    /// The annotation's value: one entry per port, at most [`MAX_BLOCKED`], then [`MORE`].
    /// Process names keep only `[A-Za-z0-9._+@:-]` (others become `_`).
    pub fn format(&self) -> String {
        let mut entries: Vec<String> = self
            .ports
            .iter()
            .take(MAX_BLOCKED)
            .map(|((family, protocol, port), process)| {
                let mut e = format!("{family}/{protocol}/{port}");
                if let Some(p) = process {
                    e.push('=');
                    e.extend(p.chars().map(|c| {
                        if c.is_ascii_alphanumeric() || "._+@:-".contains(c) {
                            c
                        } else {
                            '_'
                        }
                    }));
                }
                e
            })
            .collect();
        if self.incomplete || self.ports.len() > MAX_BLOCKED {
            entries.push(MORE.to_string());
        }
        entries.join(",")
    }

    /// Read an annotation's value; entries that do not parse are skipped.
    pub fn parse(s: &str) -> BlockedPorts {
        let mut out = BlockedPorts::default();
        for entry in s.split(',').map(str::trim).filter(|e| !e.is_empty()) {
            if entry == MORE {
                out.incomplete = true;
                continue;
            }
            let (slot, process) = match entry.split_once('=') {
                Some((slot, p)) => (slot, Some(p.to_string()).filter(|p| !p.is_empty())),
                None => (entry, None),
            };
            let mut parts = slot.split('/');
            let (Some(f), Some(p), Some(n), None) =
                (parts.next(), parts.next(), parts.next(), parts.next())
            else {
                continue;
            };
            let (Some(family), Some(protocol), Ok(port)) = (
                IpFamily::parse(f),
                Protocol::parse(Some(p)),
                n.parse::<u16>(),
            ) else {
                continue;
            };
            out.ports.insert((family, protocol, port), process);
        }
        out
    }

    /// The process its node named as holding `slot`, if it named one.
    pub fn process(&self, slot: &Slot) -> Option<&str> {
        self.ports.get(slot)?.as_deref()
    }

    /// As the planner's input for that node: a listener on the family's wildcard per port.
    pub fn listeners(&self) -> HostListeners {
        let sockets: BTreeSet<Listener> = self
            .ports
            .iter()
            .map(|((family, protocol, port), process)| Listener {
                protocol: *protocol,
                address: wildcard(*family),
                port: *port,
                process: process.clone(),
            })
            .collect();
        HostListeners {
            sockets,
            incomplete: self.incomplete,
        }
    }
}

/// An agent's Pod as the leader sees it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AgentPod {
    pub node: String,
    /// Its Ready condition is `True`.
    pub ready: bool,
}

/// A kubelet's node Lease: its last `renewTime` and its `leaseDurationSeconds`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KubeletLease {
    pub renewed: Timestamp,
    pub duration: Option<Duration>,
}

/// What tells the leader that an agent in a Pod is alive besides its own Lease.
#[derive(Clone, Debug, Default)]
pub struct Kubelets {
    /// The agents' Pods, by name.
    pub pods: BTreeMap<String, AgentPod>,
    /// The kubelets' node Leases, by node.
    pub leases: BTreeMap<String, KubeletLease>,
}

/// Liveness as the leader sees it: when it last saw each node's heartbeat renewal change, and
/// each kubelet's node Lease renewal, on its own monotonic clock. A node's `renewTime` is
/// compared only with its own earlier value, never with the leader's clock, so a node clock
/// minutes behind or ahead changes nothing. A Lease seen for the first time (by a new leader,
/// or a new node) counts as just renewed: one lease duration of grace before it can be dropped.
#[derive(Clone, Debug, Default)]
pub struct Liveness {
    /// Node → its heartbeat's last renewal value and when it was first seen.
    seen: BTreeMap<String, (Timestamp, Instant)>,
    /// Node → its kubelet's node Lease's last renewal value and when it was first seen.
    kubelets: BTreeMap<String, (Timestamp, Instant)>,
}

/// The time since `renewed` was first seen as `node`'s value.
fn observe(
    seen: &mut BTreeMap<String, (Timestamp, Instant)>,
    node: &str,
    renewed: Timestamp,
    now: Instant,
) -> Duration {
    let last = seen.entry(node.to_string()).or_insert((renewed, now));
    if last.0 != renewed {
        *last = (renewed, now);
    }
    now.saturating_duration_since(last.1)
}

impl Liveness {
    /// Take the heartbeats and the kubelets read at `now`; returns each node's age, which is
    /// compared with `lease_duration`. The age of a heartbeat is the time since its renewal
    /// was last seen to change. For an agent in a Pod ([`Heartbeat::by_pod`]), while that Pod
    /// is Ready on that node, the kubelet's node Lease renewals count too: the age is the
    /// younger of the two. A kubelet that renews less often than `lease_duration` allows
    /// (its Lease's duration over 4, the kubelet's period) is judged against 1.5 periods.
    pub fn ages(
        &mut self,
        beats: &BTreeMap<String, Heartbeat>,
        kubelets: &Kubelets,
        lease_duration: Duration,
        now: Instant,
    ) -> BTreeMap<String, Duration> {
        self.seen.retain(|node, _| beats.contains_key(node));
        self.kubelets
            .retain(|node, _| kubelets.leases.contains_key(node));
        let kubelet_ages: BTreeMap<&String, Duration> = kubelets
            .leases
            .iter()
            .map(|(node, l)| {
                let age = observe(&mut self.kubelets, node, l.renewed, now);
                let bound = l.duration.map_or(lease_duration, |d| d * 3 / 8);
                (
                    node,
                    age.saturating_sub(bound.saturating_sub(lease_duration)),
                )
            })
            .collect();
        let mut ages = BTreeMap::new();
        for (node, b) in beats {
            let own = observe(&mut self.seen, node, b.renewed, now);
            let in_ready_pod = b.by_pod
                && b.holder
                    .as_ref()
                    .and_then(|h| kubelets.pods.get(h))
                    .is_some_and(|p| p.ready && &p.node == node);
            let kubelet = kubelet_ages.get(node).filter(|_| in_ready_pod);
            ages.insert(node.clone(), kubelet.map_or(own, |k| own.min(*k)));
        }
        ages
    }
}

/// The kubelets' node Leases (those in [`KUBELET_LEASE_NAMESPACE`]), by node.
pub fn kubelet_leases<L: Borrow<Lease>>(leases: &[L]) -> BTreeMap<String, KubeletLease> {
    leases
        .iter()
        .filter_map(|l| {
            let l: &Lease = l.borrow();
            let spec = l.spec.as_ref()?;
            let renewed = spec.renew_time.as_ref()?.0;
            let duration = spec
                .lease_duration_seconds
                .and_then(|s| u64::try_from(s).ok())
                .map(Duration::from_secs);
            Some((l.metadata.name.clone()?, KubeletLease { renewed, duration }))
        })
        .collect()
}

/// The Pods in the agents' namespace, by name, as [`Liveness::ages`] reads them.
pub fn agent_pods<P: Borrow<Pod>>(pods: &[P]) -> BTreeMap<String, AgentPod> {
    pods.iter()
        .filter_map(|p| {
            let p: &Pod = p.borrow();
            let node = p.spec.as_ref()?.node_name.clone()?;
            let ready = p
                .status
                .as_ref()
                .and_then(|s| s.conditions.as_ref())
                .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"));
            Some((p.metadata.name.clone()?, AgentPod { node, ready }))
        })
        .collect()
}

/// A Pod as the status leader keeps it: its name, node and Ready condition (what
/// [`agent_pods`] reads).
pub fn trim_pod(pod: &mut Pod) {
    pod.metadata = kube_meta(&pod.metadata);
    let node_name = pod.spec.as_ref().and_then(|s| s.node_name.clone());
    pod.spec = Some(PodSpec {
        node_name,
        ..PodSpec::default()
    });
    let ready: Option<Vec<PodCondition>> = pod
        .status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .map(|c| c.iter().filter(|c| c.type_ == "Ready").cloned().collect());
    pod.status = Some(PodStatus {
        conditions: ready,
        ..PodStatus::default()
    });
}

/// A kubelet's node Lease as the status leader keeps it: its name, renewal and duration.
pub fn trim_kubelet_lease(lease: &mut Lease) {
    lease.metadata = kube_meta(&lease.metadata);
    if let Some(spec) = &mut lease.spec {
        spec.holder_identity = None;
        spec.acquire_time = None;
    }
}

/// Of an object's metadata, what a reflector's store needs: name, namespace, uid and
/// resourceVersion.
fn kube_meta(m: &ObjectMeta) -> ObjectMeta {
    ObjectMeta {
        name: m.name.clone(),
        namespace: m.namespace.clone(),
        uid: m.uid.clone(),
        resource_version: m.resource_version.clone(),
        ..Default::default()
    }
}

/// The name of a node's heartbeat Lease.
pub fn lease_name(node: &str) -> String {
    format!("{LEASE_PREFIX}{node}")
}

/// Heartbeats by node, from the Leases in the agents' namespace (others are ignored).
pub fn read<L: Borrow<Lease>>(leases: &[L]) -> BTreeMap<String, Heartbeat> {
    let mut out = BTreeMap::new();
    for l in leases {
        let l: &Lease = l.borrow();
        let name = l.metadata.name.as_deref().unwrap_or("");
        let Some(from_name) = name.strip_prefix(LEASE_PREFIX) else {
            continue;
        };
        let node = l
            .metadata
            .labels
            .as_ref()
            .and_then(|m| m.get(NODE_LABEL))
            .map(String::as_str)
            .unwrap_or(from_name)
            .to_string();
        let Some(spec) = &l.spec else { continue };
        let Some(renewed) = spec.renew_time.as_ref().or(spec.acquire_time.as_ref()) else {
            continue;
        };
        let families = l
            .metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(FAMILIES_ANNOTATION))
            .map(|s| super::parse_families(s))
            .unwrap_or(Families {
                v4: false,
                v6: false,
            });
        let annotation = |key: &str| l.metadata.annotations.as_ref()?.get(key);
        let blocked = annotation(BLOCKED_ANNOTATION)
            .map(|s| BlockedPorts::parse(s))
            .unwrap_or_default();
        let unhealthy = annotation(UNHEALTHY_ANNOTATION).cloned();
        let by_pod = annotation(LIVENESS_ANNOTATION).is_some_and(|v| v == LIVENESS_POD);
        out.insert(
            node.clone(),
            Heartbeat {
                node,
                holder: spec.holder_identity.clone(),
                renewed: renewed.0,
                families,
                blocked,
                unhealthy,
                by_pod,
            },
        );
    }
    out
}
