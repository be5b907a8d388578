//! Node heartbeats: the Lease `nodelb-node-<node>` each agent writes in its namespace, with
//! annotations naming the families it has programmed and the Service ports host listeners
//! hold there. Read here into plain values, with the other signals of a node's liveness, and
//! judged ([`Liveness`]).
//!
//! How the leader tells an agent is alive depends on where it runs. An agent outside a Pod
//! renews its Lease every third of `--node-lease-duration`. An agent in a Pod with a readiness
//! probe (the manifests' DaemonSet) writes its Lease only when what the Lease carries changes,
//! or while its own readiness fails: the leader takes its liveness from its Pod's Ready
//! condition (the kubelet probes `/readyz`, which fails when the agent stops applying the
//! cluster) and its node's from the kubelet's own node Lease in `kube-node-lease`, renewals the
//! cluster writes anyway. A signal the leader cannot read has a fallback, never a drop: the
//! node lifecycle controller's Ready condition for the kubelets' Leases, and slow self-renewed
//! heartbeats ([`SLOW_RENEWAL`], asked for on the Lease `nodelb-status`) for the Pods.

use super::election::Takeover;
use crate::plan::conflicts::Slot;
use crate::plan::listeners::{wildcard, HostListeners};
use crate::plan::reserved::ReservedPorts;
use crate::vocab::{Families, IpFamily, Listener, Protocol};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Pod, PodCondition, PodSpec, PodStatus};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use k8s_openapi::jiff::{SignedDuration, Timestamp};
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

/// What the leader reads besides the heartbeats, each `None` when it cannot read it (its RBAC
/// does not let it list and watch them: see [`Liveness`] for what it does then).
#[derive(Clone, Debug)]
pub struct Kubelets {
    /// The agents' Pods, by name.
    pub pods: Option<BTreeMap<String, AgentPod>>,
    /// The kubelets' node Leases, by node.
    pub leases: Option<BTreeMap<String, KubeletLease>>,
    /// The nodes whose Ready condition is `Unknown`: the node lifecycle controller stopped
    /// hearing from their kubelet (read from the Nodes, which the leader always reads).
    pub unknown: BTreeSet<String>,
}

impl Default for Kubelets {
    /// Everything readable, nothing there.
    fn default() -> Kubelets {
        Kubelets {
            pods: Some(BTreeMap::new()),
            leases: Some(BTreeMap::new()),
            unknown: BTreeSet::new(),
        }
    }
}

/// How often agents in Pods renew their heartbeats when the leader asks them to
/// ([`HEARTBEAT_RENEWAL_ANNOTATION`]): when it cannot read their Pods. Once in 90 s keeps an
/// agent's requests within one a minute with its watches (docs/design.md, "Liveness").
pub const SLOW_RENEWAL: Duration = Duration::from_secs(90);

/// How stale such a heartbeat may grow: three renewals.
pub const SLOW_BOUND: Duration = Duration::from_secs(3 * 90);

/// Annotation on the Lease `nodelb-status`, written by the leader with its renewals: agents in
/// Pods renew their heartbeat Leases every this long (a duration, `1m 30s`), because the leader
/// cannot read their Pods. Absent: they write their heartbeats only when what they say changes.
pub const HEARTBEAT_RENEWAL_ANNOTATION: &str = "nodelb.io/heartbeat-renewal";

/// The kubelet's default node Lease duration (`nodeLeaseDurationSeconds`); it renews every
/// quarter of it.
pub const KUBELET_LEASE_DURATION: Duration = Duration::from_secs(40);

/// How long a kubelet's node Lease may go unrenewed before its node is dead: two of its renewal
/// periods (the kubelet renews every quarter of the Lease's duration: 20 s at the default
/// 40 s). One renewal may come a whole period late; the margin was chosen from renewals
/// measured on the real cluster under 10,000 status writes (docs/design.md, "Liveness").
pub fn kubelet_bound(duration: Option<Duration>) -> Duration {
    duration.unwrap_or(KUBELET_LEASE_DURATION) / 2
}

/// Why the leader holds a node dead.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Why {
    /// Its agent's own heartbeat Lease is not renewed (and nothing else vouches for it).
    Heartbeat,
    /// Its agent's Pod is not Ready (or gone), and its heartbeat is not renewed either.
    PodNotReady,
    /// Its kubelet stopped renewing its node Lease.
    Kubelet,
    /// The node lifecycle controller marked it `Unknown` (the kubelet's Leases cannot be read).
    NodeUnknown,
}

impl Why {
    pub fn note(self) -> &'static str {
        match self {
            Why::Heartbeat => {
                "its nodelb heartbeat is not renewed (agent or node down, or the node is gone)"
            }
            Why::PodNotReady => {
                "its nodelb agent's Pod is not Ready (the agent is not applying the cluster)"
            }
            Why::Kubelet => "its kubelet stopped renewing its node Lease (node down or cut off)",
            Why::NodeUnknown => "the node lifecycle controller lost its kubelet (Ready is Unknown)",
        }
    }
}

/// One node's liveness as the leader judged it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Judged {
    pub alive: bool,
    /// The age of the signal the judgement rests on: the kubelet's node Lease for an agent in
    /// a Pod the leader can see, else the heartbeat's.
    pub age: Duration,
    /// Why it is dead (`None` while alive).
    pub why: Option<Why>,
}

/// Liveness as the leader sees it: when it last saw each node's heartbeat renewal change, and
/// each kubelet's node Lease renewal, on its own monotonic clock. A node's `renewTime` is
/// compared only with its own earlier value (or, after a takeover, with the silent holder's
/// last election renewal, which that same node's clock wrote), never with the leader's clock,
/// so a node clock minutes behind or ahead changes nothing. A value seen for the first time
/// (by a new leader, or of a new node) counts as just renewed: one bound of grace before it
/// can be dropped; but after a takeover ([`Liveness::after`]), the silent holder's own node
/// gets none for what it has not renewed since it fell silent.
///
/// The rules ([`Liveness::judge`]):
/// - an agent outside a Pod lives while its heartbeat was seen renewed less than
///   `--node-lease-duration` ago;
/// - an agent in a Pod lives while its node lives and its agent does. Its node lives while
///   the kubelet's node Lease was seen renewed less than [`kubelet_bound`] ago (if the leader
///   cannot read those Leases: while the Node's Ready condition is not `Unknown`). Its agent
///   lives while its Pod is Ready on that node, or its heartbeat was seen renewed less than
///   `--node-lease-duration` ago (an agent whose readiness fails renews it, so a short failure
///   keeps the node for a lease duration). If the leader cannot read Pods, it asks the agents
///   to renew their heartbeats every [`SLOW_RENEWAL`] and judges them against [`SLOW_BOUND`]
///   (each by-Pod heartbeat gets that much grace when the Pods stop being readable).
#[derive(Clone, Debug, Default)]
pub struct Liveness {
    /// Node → its heartbeat's last renewal value and when it was first seen.
    seen: BTreeMap<String, (Timestamp, Instant)>,
    /// Node → its kubelet's node Lease's last renewal value and when it was first seen.
    kubelets: BTreeMap<String, (Timestamp, Instant)>,
    /// The silent holder this leader took over from, until its node is first seen.
    takeover: Option<Takeover>,
    /// Whether the Pods were readable at the last look.
    pods_readable: Option<bool>,
}

/// The time since `renewed` was first seen as `node`'s value; a value first seen now dates
/// from `first` (now, unless a takeover says the node has been silent longer).
fn observe(
    seen: &mut BTreeMap<String, (Timestamp, Instant)>,
    node: &str,
    renewed: Timestamp,
    now: Instant,
    first: Instant,
) -> Duration {
    let last = seen.entry(node.to_string()).or_insert((renewed, first));
    if last.0 != renewed {
        *last = (renewed, now);
    }
    now.saturating_duration_since(last.1)
}

impl Liveness {
    /// A new leader's liveness; `takeover`: what it saw last of the holder it took the Lease
    /// over from, if that holder fell silent.
    pub fn after(takeover: Option<Takeover>) -> Liveness {
        Liveness {
            takeover,
            ..Liveness::default()
        }
    }

    /// When a value of `node` first seen now dates from: now, unless `node` is the silent
    /// holder's and `renewed` is not later than that holder's last election renewal by more
    /// than its retry period (one node's clock against itself: alive, the holder would have
    /// renewed the election within that): then from when the holder fell silent.
    fn first(&self, node_holder: Option<&str>, renewed: Timestamp, now: Instant) -> Instant {
        let before_silence = |t: &Takeover| {
            let margin = SignedDuration::try_from(t.margin).unwrap_or(SignedDuration::ZERO);
            t.renewed
                .and_then(|last| last.checked_add(margin).ok())
                .is_some_and(|last| renewed <= last)
        };
        match &self.takeover {
            Some(t) if node_holder == Some(t.holder.as_str()) && before_silence(t) => {
                t.silent_since.min(now)
            }
            _ => now,
        }
    }

    /// Judge every node with a heartbeat at `now` (see the rules above).
    pub fn judge(
        &mut self,
        beats: &BTreeMap<String, Heartbeat>,
        kubelets: &Kubelets,
        lease_duration: Duration,
        now: Instant,
    ) -> BTreeMap<String, Judged> {
        self.seen.retain(|node, _| beats.contains_key(node));
        match &kubelets.leases {
            Some(leases) => self.kubelets.retain(|node, _| leases.contains_key(node)),
            None => self.kubelets.clear(),
        }
        let pods_readable = kubelets.pods.is_some();
        if !pods_readable && self.pods_readable == Some(true) {
            // The Pods stopped being readable: every agent in a Pod now has to renew its
            // heartbeat itself, slowly; give each that long.
            for (node, b) in beats.iter().filter(|(_, b)| b.by_pod) {
                self.seen.insert(node.clone(), (b.renewed, now));
            }
        }
        self.pods_readable = Some(pods_readable);
        let mut out = BTreeMap::new();
        for (node, b) in beats {
            let first = self.first(b.holder.as_deref(), b.renewed, now);
            let own = observe(&mut self.seen, node, b.renewed, now, first);
            let judged = if !b.by_pod {
                Judged {
                    alive: own < lease_duration,
                    age: own,
                    why: Some(Why::Heartbeat),
                }
            } else {
                self.judge_by_pod(node, b, own, kubelets, lease_duration, now)
            };
            let judged = Judged {
                why: judged.why.filter(|_| !judged.alive),
                ..judged
            };
            out.insert(node.clone(), judged);
        }
        self.takeover = None;
        out
    }

    /// An agent in a Pod: its node and its agent both live.
    fn judge_by_pod(
        &mut self,
        node: &str,
        b: &Heartbeat,
        own: Duration,
        kubelets: &Kubelets,
        lease_duration: Duration,
        now: Instant,
    ) -> Judged {
        let kubelet = kubelets.leases.as_ref().map(|leases| {
            leases.get(node).map(|l| {
                let first = self.first(b.holder.as_deref(), l.renewed, now);
                let age = observe(&mut self.kubelets, node, l.renewed, now, first);
                (age, age < kubelet_bound(l.duration))
            })
        });
        let (node_age, node_alive, node_why) = match kubelet {
            Some(Some((age, alive))) => (Some(age), alive, Why::Kubelet),
            // No Lease of its kubelet, or none readable: the node lifecycle controller's word.
            Some(None) | None => (None, !kubelets.unknown.contains(node), Why::NodeUnknown),
        };
        let (agent_alive, agent_why) = match &kubelets.pods {
            Some(pods) => {
                let ready = b
                    .holder
                    .as_ref()
                    .and_then(|h| pods.get(h))
                    .is_some_and(|p| p.ready && p.node == node);
                (ready || own < lease_duration, Why::PodNotReady)
            }
            None => (own < SLOW_BOUND, Why::Heartbeat),
        };
        Judged {
            alive: node_alive && agent_alive,
            age: node_age.unwrap_or(own),
            why: Some(if node_alive { agent_why } else { node_why }),
        }
    }
}

/// The ages [`super::Status::compute`] judges against `lease_duration`: a living node's is
/// zero, a dead one's the lease duration.
pub fn ages(
    judged: &BTreeMap<String, Judged>,
    lease_duration: Duration,
) -> BTreeMap<String, Duration> {
    judged
        .iter()
        .map(|(node, j)| {
            let age = if j.alive {
                Duration::ZERO
            } else {
                lease_duration
            };
            (node.clone(), age)
        })
        .collect()
}

/// The nodes whose Ready condition is `Unknown`, of those given.
pub fn unknown_nodes<N: Borrow<k8s_openapi::api::core::v1::Node>>(nodes: &[N]) -> BTreeSet<String> {
    nodes
        .iter()
        .filter_map(|n| {
            let n: &k8s_openapi::api::core::v1::Node = n.borrow();
            let unknown = n
                .status
                .as_ref()?
                .conditions
                .as_ref()?
                .iter()
                .any(|c| c.type_ == "Ready" && c.status == "Unknown");
            unknown.then(|| n.metadata.name.clone()).flatten()
        })
        .collect()
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
