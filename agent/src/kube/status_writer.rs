//! The leader's status writer: while this agent holds `nodelb-status`, compute each Service's
//! desired ingress (`status::Status::compute`, on a blocking thread) from the sync loop's
//! objects, all Nodes and the heartbeat Leases, and write it with server-side apply under the
//! field manager `nodelb` — only where the stored value differs. The Services to write wait in
//! a work queue, most urgent first (`status::fanout`): a Service's own change, then statuses
//! that list an address they should not, then the rest; up to [`IN_FLIGHT`] writes are
//! answered at a time. A node that starts or stops serving gets one Event on its Node, not one
//! per Service; Service Events (for a Service's own causes) come from here only. The applies
//! and Events are paced by one token bucket (see [`REQUESTS_PER_SECOND`]).

use super::events::{create_event, new_event};
use super::rate_limit::RateLimiter;
use super::watching::{self, Retry};
use crate::metrics::{Metrics, NodeLabel, SignalLabel, WriteLabel};
use futures::future::BoxFuture;
use futures::stream::FuturesUnordered;
use futures::StreamExt;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Node, ObjectReference, Pod};
use k8s_openapi::api::events::v1::Event;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::events::EventType;
use kube::runtime::reflector::{self, Store};
use kube::runtime::{watcher, WatchStreamExt};
use kube::Client;
use nodelb_core::objects::index::Service;
use nodelb_core::objects::wire;
use nodelb_core::plan::Objects;
use nodelb_core::status::election::Takeover;
use nodelb_core::status::fanout::{self, Urgency, WorkQueue};
use nodelb_core::status::ingress::{self, Write, FIELD_MANAGER};
use nodelb_core::status::{classes, heartbeat};
use nodelb_core::status::{Desired, Problem, Status, StatusConfig};
use nodelb_core::vocab::ServiceKey;
use nodelb_core::vocab::Str;
use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::net::IpAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::{watch, Notify};
use tracing::{debug, info, info_span, warn, Instrument};

/// The pace of the leader's requests, status applies and Events together (client-go's token
/// bucket, see `rate_limit`). A node that joins or leaves changes the status of every Service
/// it serves: at 400 a second (Events for a node's transition are one per node, not one per
/// Service) 10,000 statuses are written in 25 s. Every status write is sent by the server to
/// every node's Service watchers (every nodelb agent, every kube-proxy), so this is also the
/// rate of those watch events per node; the FlowSchema of `manifests/apf/` keeps the writes in
/// a priority level of their own (README, "API cost").
pub const REQUESTS_PER_SECOND: f64 = 400.0;
/// Requests that go at once before the pace applies: a change to up to 200 Services (one
/// apply and one Event each) is written without waiting.
pub const BURST: u32 = 400;
/// Writes answered at a time: one apply takes a few milliseconds, so one at a time would not
/// keep the pace.
const IN_FLIGHT: usize = 8;
/// How often a round looks again at the objects, Nodes and heartbeats: a Service's own change
/// or a node lost meanwhile is queued ahead of what is left, at most this late.
const REFRESH: Duration = Duration::from_millis(250);

pub struct StatusWriter {
    pub client: Client,
    /// The agents' namespace (heartbeat Leases).
    pub namespace: String,
    pub pod_name: String,
    pub cfg: StatusConfig,
    /// `--ip-mode`: `Proxy` or `VIP`.
    pub ip_mode: String,
    /// How often desired status is recomputed even without a change (heartbeats age).
    pub period: Duration,
    pub objects: watch::Receiver<Option<Arc<Objects>>>,
    pub leading: watch::Receiver<bool>,
    /// What this agent saw last of the holder it took the Lease over from, if that holder fell
    /// silent (read when it starts leading).
    pub takeover: watch::Receiver<Option<Takeover>>,
    /// What the leader asks of agents in Pods, written on the Lease by the election: renew
    /// heartbeats every this long, while it cannot read their Pods.
    pub ask: watch::Sender<Option<Duration>>,
    pub metrics: Arc<Metrics>,
}

/// What the leader wrote of one Service, and the Service's resourceVersion then.
struct Written {
    /// A digest of the desired status written (see [`wrote`]), not the status itself: a
    /// round at 10,000 Services remembers every write until the watch shows it, and the
    /// ingress and condition kept whole took megabytes (docs/benchmarks.md).
    status: u64,
    resource_version: Option<Str>,
}

/// What [`Written::status`] keeps of a desired status: a 64-bit hash of its ingress and
/// condition. Two statuses hashing alike (about one chance in 2^64) would cost only a delay:
/// the second is written once the watch shows a newer version of the Service.
fn wrote(want: &Desired) -> u64 {
    nodelb_core::vocab::digest(&(&want.ingress, &want.serving))
}

/// A round that looked at this many Services rebuilds `Memory::written` packed.
const PACK_AFTER: usize = 1000;

/// What the leader remembers between rounds (lost on failover; the stored status and the
/// field ownership are what a new leader starts from).
#[derive(Default)]
struct Memory {
    status: Status,
    /// When each heartbeat's renewal was last seen to change (a new leader starts empty: every
    /// node gets one lease duration of grace).
    liveness: heartbeat::Liveness,
    /// What we wrote, and the Service's resourceVersion then: until the watch shows a newer
    /// version, the stored value we see is the old one, and writing again would be a repeat.
    written: BTreeMap<ServiceKey, Written>,
    /// Problems already reported per Service (none kept for a Service without any).
    reported: BTreeMap<ServiceKey, BTreeSet<Problem>>,
    /// Services whose ingress another manager owns, already reported.
    foreign: BTreeSet<ServiceKey>,
    /// The objects' version the writer last looked at (`None`: look at everything).
    version: Option<u64>,
    /// The Services to settle, most urgent first.
    queue: WorkQueue,
    /// Services whose write is not answered yet, and those of them queued again meanwhile.
    flying: HashSet<ServiceKey>,
    again: HashSet<ServiceKey>,
    /// The addresses of the nodes that started or stopped serving since the queue was last
    /// empty: a status change made only of them is told on those Nodes, not on the Service.
    moved: BTreeSet<IpAddr>,
    /// The Nodes at the last look (a deleted Node's addresses are still known from them).
    last_nodes: Vec<Arc<Node>>,
    /// Services whose write failed, queued again at the next look.
    retry: BTreeSet<ServiceKey>,
    /// The serving candidates at the last look (`None` before the first: a new leader tells
    /// no transition).
    candidates: Option<BTreeSet<String>>,
    /// Why each node with a heartbeat that is not alive is not, at the last look.
    dead: BTreeMap<String, &'static str>,
    /// The liveness signals this leader cannot read, as last told (`None`: nothing told yet).
    unreadable: Option<Vec<Unreadable>>,
}

/// Whether a watch of the leader's can read what it watches.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
enum Readable {
    /// Not listed yet.
    #[default]
    Unknown,
    Yes,
    /// The server refused it (RBAC): its answer.
    Forbidden(String),
}

/// A reflector's store, whether its watch can read, and the task that runs it.
struct Watch<K: kube::Resource<DynamicType = ()> + 'static> {
    store: Store<K>,
    readable: Arc<std::sync::Mutex<Readable>>,
    task: tokio::task::JoinHandle<()>,
}

impl<K: kube::Resource<DynamicType = ()> + Clone + 'static> Watch<K> {
    fn readable(&self) -> Readable {
        self.readable.lock().expect("readable").clone()
    }
}

/// What a watch's error says of whether it may read: the server's answer when it is 403.
fn forbidden(e: &watcher::Error) -> Option<String> {
    let kube_error = match e {
        watcher::Error::InitialListFailed(e)
        | watcher::Error::WatchStartFailed(e)
        | watcher::Error::WatchFailed(e) => e,
        _ => return None,
    };
    match kube_error {
        kube::Error::Api(s) if s.code == 403 => Some(s.message.clone()),
        _ => None,
    }
}

/// A reflector's store of `api`'s objects, each trimmed by `trim` before it is kept; `wake` is
/// told of every change. Its watch is asked for as `watching` says.
fn store<K>(api: Api<K>, wake: Arc<Notify>, what: &'static str, trim: fn(&mut K)) -> Watch<K>
where
    K: kube::Resource<DynamicType = ()>
        + Clone
        + serde::de::DeserializeOwned
        + std::fmt::Debug
        + Send
        + Sync
        + 'static,
{
    let (reader, writer) = reflector::store();
    let stream = reflector::reflector(
        writer,
        watcher::watcher(api, watching::config())
            .modify(trim)
            .backoff(Retry::default()),
    );
    let readable = Arc::new(std::sync::Mutex::new(Readable::Unknown));
    let said = readable.clone();
    let task = tokio::spawn(
        async move {
            let mut stream = std::pin::pin!(stream);
            while let Some(ev) = stream.next().await {
                match ev {
                    Ok(ev) => {
                        if !matches!(ev, watcher::Event::Init | watcher::Event::InitApply(_)) {
                            *said.lock().expect("readable") = Readable::Yes;
                        }
                        wake.notify_one();
                    }
                    Err(e) => {
                        if let Some(why) = forbidden(&e) {
                            let mut r = said.lock().expect("readable");
                            if !matches!(*r, Readable::Forbidden(_)) {
                                warn!(error = %e, "the status leader may not read {what}");
                            }
                            *r = Readable::Forbidden(why);
                            wake.notify_one();
                        } else {
                            warn!(error = %e, "watch failed; retrying");
                        }
                    }
                }
            }
        }
        .instrument(info_span!("watch", resource = what)),
    );
    Watch {
        store: reader,
        readable,
        task,
    }
}

/// How long a new leader waits for the watches its liveness reads besides the heartbeats.
const LIVENESS_WAIT: Duration = Duration::from_secs(10);

/// What the leader watches besides the objects the sync loop shares.
struct Watched {
    nodes: Store<Node>,
    /// The heartbeats.
    leases: Store<Lease>,
    /// The agents' Pods and the kubelets' node Leases ([`heartbeat::Liveness`]).
    pods: Watch<Pod>,
    kubelet_leases: Watch<Lease>,
    /// The watches' tasks, ended when this is dropped (leadership lost).
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl Drop for Watched {
    fn drop(&mut self) {
        for t in &self.tasks {
            t.abort();
        }
        self.pods.task.abort();
        self.kubelet_leases.task.abort();
    }
}

/// A liveness signal the leader cannot read, and the server's answer.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Unreadable {
    signal: &'static str,
    why: String,
}

impl Watched {
    /// Start the watches; `wake` is told of every change but the kubelets' renewals.
    fn start(client: &Client, namespace: &str, wake: &Arc<Notify>) -> Watched {
        let nodes = store(
            Api::all(client.clone()),
            wake.clone(),
            "nodes",
            classes::trim_node,
        );
        let leases = store(
            Api::namespaced(client.clone(), namespace),
            wake.clone(),
            "leases",
            |l: &mut Lease| l.metadata.managed_fields = None,
        );
        let pods = store(
            Api::namespaced(client.clone(), namespace),
            wake.clone(),
            "pods",
            heartbeat::trim_pod,
        );
        // The kubelets renew every 10 s, 500 renewals a second at 5,000 nodes: they wake no
        // look (a node is lost when renewals stop, which only the periodic look sees).
        let kubelet_leases = store(
            Api::namespaced(client.clone(), heartbeat::KUBELET_LEASE_NAMESPACE),
            Arc::new(Notify::new()),
            "kubelet leases",
            heartbeat::trim_kubelet_lease,
        );
        Watched {
            nodes: nodes.store,
            leases: leases.store,
            pods,
            kubelet_leases,
            tasks: vec![nodes.task, leases.task],
        }
    }

    /// Wait until the Nodes and the heartbeats have listed, and the Pods and the kubelets'
    /// Leases have listed or been refused, for at most [`LIVENESS_WAIT`]: a signal not listed
    /// by then is judged unreadable until it lists ([`Watched::unreadable`]).
    async fn ready(&self) -> Result<(), reflector::store::WriterDropped> {
        self.nodes.wait_until_ready().await?;
        self.leases.wait_until_ready().await?;
        let settled = async {
            while [self.pods.readable(), self.kubelet_leases.readable()]
                .contains(&Readable::Unknown)
            {
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        };
        let _ = tokio::time::timeout(LIVENESS_WAIT, settled).await;
        Ok(())
    }

    /// The liveness signals the leader cannot read now, each with why, in a fixed order.
    fn unreadable(&self, namespace: &str) -> Vec<Unreadable> {
        let signals = [
            ("pods", self.pods.readable(), format!("pods in {namespace}")),
            (
                "kubelet-leases",
                self.kubelet_leases.readable(),
                format!("leases in {}", heartbeat::KUBELET_LEASE_NAMESPACE),
            ),
        ];
        signals
            .into_iter()
            .filter_map(|(signal, readable, what)| {
                let why = match readable {
                    Readable::Yes => return None,
                    Readable::Forbidden(answer) => {
                        format!("forbidden to list and watch {what}: {answer}")
                    }
                    Readable::Unknown => format!("could not list {what} within {LIVENESS_WAIT:?}"),
                };
                Some(Unreadable { signal, why })
            })
            .collect()
    }
}

/// What a leader that cannot read `missing` says in every Service's condition, and in its
/// Event on the Lease `nodelb-status`: what is missing, what to grant, what it costs meanwhile.
fn degraded_note(missing: &[Unreadable], namespace: &str) -> Option<String> {
    let parts: Vec<String> = missing
        .iter()
        .map(|u| match u.signal {
            "kubelet-leases" => format!(
                "nodelb cannot list and watch leases in {} (grant it the Role and RoleBinding nodelb-kubelet-leases of manifests/base/rbac.yaml in that namespace): a dead node leaves the status only once the node lifecycle controller marks it Unknown",
                heartbeat::KUBELET_LEASE_NAMESPACE
            ),
            _ => format!(
                "nodelb cannot list and watch pods in {namespace} (grant it the Role nodelb of manifests/base/rbac.yaml): agents renew their heartbeats every {}s and a hung agent leaves the status after up to {}s",
                heartbeat::SLOW_RENEWAL.as_secs(),
                heartbeat::SLOW_BOUND.as_secs()
            ),
        })
        .collect();
    (!parts.is_empty()).then(|| format!("liveness degraded: {}", parts.join("; ")))
}

impl StatusWriter {
    pub async fn run(mut self, mut stop: watch::Receiver<bool>) {
        let wake = Arc::new(Notify::new());
        let recorder = Requests {
            client: self.client.clone(),
            instance: self.pod_name.clone(),
            pace: RateLimiter::new(REQUESTS_PER_SECOND, BURST),
        };
        loop {
            // Wait to lead.
            tokio::select! {
                _ = stop.wait_for(|s| *s) => return,
                r = self.leading.wait_for(|l| *l) => if r.is_err() { return },
            }
            // Only the leader watches the Nodes, the heartbeats, the Pods and the kubelets'
            // Leases (a follower's watches of every kubelet's renewals would cost the server
            // as much again per node); a new leader lists them, and stops when it no longer
            // leads.
            let watched = Watched::start(&self.client, &self.namespace, &wake);
            tokio::select! {
                _ = stop.wait_for(|s| *s) => return,
                r = watched.ready() => if r.is_err() { return },
            }
            let ip_mode = match self.client.apiserver_version().await {
                Ok(v) if minor(&v.minor) >= 30 => Some(self.ip_mode.clone()),
                Ok(v) => {
                    info!(version = %v.git_version, "API server older than 1.30: ipMode is not written");
                    None
                }
                Err(e) => {
                    warn!(error = %e, "cannot read the API server version; ipMode is not written");
                    None
                }
            };
            let mut memory = Memory {
                liveness: heartbeat::Liveness::after(self.takeover.borrow().clone()),
                ..Memory::default()
            };
            info!("leading: writing Service status");
            let inputs = Inputs {
                watched: &watched,
                ip_mode: ip_mode.as_deref(),
                recorder: &recorder,
            };
            while *self.leading.borrow() {
                self.round(&mut memory, &inputs)
                    .instrument(info_span!("status"))
                    .await;
                tokio::select! {
                    _ = stop.wait_for(|s| *s) => return,
                    _ = self.leading.changed() => {}
                    _ = self.objects.changed() => {}
                    _ = wake.notified() => {}
                    _ = tokio::time::sleep(self.period) => {}
                }
                // Let a burst settle.
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            self.ask.send_replace(None);
            for signal in ["pods", "kubelet-leases"] {
                self.metrics
                    .liveness_readable
                    .remove(&SignalLabel { signal });
            }
            info!("no longer leading: status writes stop");
        }
    }

    /// Bring the desired status up to date, then settle the queued Services, up to
    /// [`IN_FLIGHT`] writes at a time, most urgent first (`fanout::WorkQueue`). Every
    /// [`REFRESH`] it looks again at the objects, the Nodes and the heartbeats, so a Service's
    /// own change, or a node lost meanwhile, is queued ahead of what is left. Returns once
    /// nothing is queued or in flight, or leadership is lost.
    async fn round(&mut self, memory: &mut Memory, inputs: &Inputs<'_>) {
        if !self.refresh(memory, inputs).await {
            return;
        }
        let mut flights = FuturesUnordered::new();
        let mut refreshed = Instant::now();
        let mut looked = 0usize;
        loop {
            // Once the Lease is lost or released, another agent writes, so stop at once. What
            // is left is redone from scratch the next time this agent leads (its memory starts
            // empty then).
            let now = self.objects.borrow().clone();
            let (true, Some(now)) = (*self.leading.borrow(), now) else {
                info!(
                    left = memory.queue.len() + flights.len(),
                    "no longer leading: the status round stops"
                );
                return;
            };
            if refreshed.elapsed() >= REFRESH {
                self.refresh(memory, inputs).await;
                refreshed = Instant::now();
                continue;
            }
            while flights.len() < IN_FLIGHT {
                let Some(key) = memory.queue.pop() else {
                    break;
                };
                looked += 1;
                if memory.flying.contains(&key) {
                    // Settled again once its write is answered, against what it wrote.
                    memory.again.insert(key);
                    continue;
                }
                if let Some(job) = self.prepare(memory, &now, &key, inputs).await {
                    memory.flying.insert(key);
                    flights.push(job);
                }
            }
            drop(now);
            let Some(done) = flights.next().await else {
                // Every write a node's transition caused is made.
                memory.moved.clear();
                break;
            };
            memory.flying.remove(&done.key);
            if memory.again.remove(&done.key) {
                memory.queue.push(done.key.clone(), Urgency::Own);
            }
            self.finish(memory, done);
        }
        if looked >= PACK_AFTER {
            // A long round wrote in key order: half-full nodes (see `packed`).
            nodelb_core::packed::repack(&mut memory.written);
        }
    }

    /// Recompute the desired status and queue every Service whose object, slices or desired
    /// status changed, or whose write failed, each with its urgency; tell each node that
    /// started or stopped serving in one Event on its Node. `false`: nothing to work from
    /// (no objects yet, or the computation failed).
    async fn refresh(&mut self, memory: &mut Memory, inputs: &Inputs<'_>) -> bool {
        let Some(objects) = self.objects.borrow_and_update().clone() else {
            return false;
        };
        let seen = inputs.watched.nodes.state();
        let nodes: Vec<Node> = seen.iter().map(|n| (**n).clone()).collect();
        let beats = heartbeat::read(&inputs.watched.leases.state());
        let ages = self.liveness(memory, &beats, &seen, inputs).await;
        let Some(changed) = self.compute(memory, &objects, nodes, beats, ages).await else {
            return false;
        };
        // The Services whose own object or slices changed (a status write, ours or someone
        // else's, shows up as a change of the object); `None`: everything was replaced (a
        // first look), and the Services are ordered by what their status lacks.
        let own = memory.version.and_then(|v| objects.changed_since(v));
        memory.version = Some(objects.version());
        let candidates = memory.status.candidates();
        let moved = match &memory.candidates {
            Some(before) => {
                // Why a node left: its liveness, or why it is ineligible.
                let mut why: BTreeMap<String, String> = memory
                    .dead
                    .iter()
                    .map(|(n, w)| (n.clone(), w.to_string()))
                    .collect();
                why.extend(memory.status.ineligible().clone());
                fanout::transitions(before, &candidates, &why)
            }
            None => Vec::new(),
        };
        memory.candidates = Some(candidates);
        for t in &moved {
            let now = named(&seen, &t.node);
            // A deleted Node's addresses are known from the last look.
            let node = now.or_else(|| named(&memory.last_nodes, &t.node));
            memory
                .moved
                .extend(node.iter().flat_map(|n| fanout::node_addresses(n)));
            info!(node = %t.node, joined = t.joined, "{}", t.note());
            let uid = now.and_then(|n| n.metadata.uid.clone());
            let ev = node_event(t, uid, &inputs.recorder.instance);
            inputs.recorder.send(&ev).await;
        }
        memory.last_nodes = seen;
        let (own, others): (BTreeSet<ServiceKey>, BTreeSet<ServiceKey>) = match own {
            Some(own) => (own, changed),
            // A first look: every Service, those nodelb no longer handles too (a status of
            // nodelb's left on them is cleared).
            None => (
                BTreeSet::new(),
                objects.services().map(|(k, _)| k.clone()).collect(),
            ),
        };
        for key in &own {
            memory.queue.push(key.clone(), Urgency::Own);
        }
        let retry = std::mem::take(&mut memory.retry);
        for key in others.difference(&own).chain(&retry) {
            let want = memory.status.desired().get(key);
            let urgency = objects
                .service(key)
                .map_or(Urgency::Other, |svc| fanout::urgency(svc, want, false));
            memory.queue.push(key.clone(), urgency);
        }
        true
    }

    /// Judge every node's liveness from what the leader can read (saying what it cannot):
    /// the ages `Status::compute` reads, and why each dead node is dead (kept in `memory`).
    async fn liveness(
        &mut self,
        memory: &mut Memory,
        beats: &BTreeMap<String, heartbeat::Heartbeat>,
        nodes: &[Arc<Node>],
        inputs: &Inputs<'_>,
    ) -> BTreeMap<String, Duration> {
        let watched = inputs.watched;
        let unreadable = watched.unreadable(&self.namespace);
        let readable = |signal| !unreadable.iter().any(|u| u.signal == signal);
        let kubelets = heartbeat::Kubelets {
            pods: readable("pods").then(|| heartbeat::agent_pods(&watched.pods.store.state())),
            leases: readable("kubelet-leases")
                .then(|| heartbeat::kubelet_leases(&watched.kubelet_leases.store.state())),
            unknown: heartbeat::unknown_nodes(nodes),
        };
        self.degraded(memory, unreadable, inputs).await;
        let now = std::time::Instant::now();
        let judged = memory
            .liveness
            .judge(beats, &kubelets, self.cfg.node_lease_duration, now);
        self.record_heartbeat_ages(&judged);
        memory.dead = judged
            .iter()
            .filter_map(|(n, j)| Some((n.clone(), j.why?.note())))
            .collect();
        heartbeat::ages(&judged, self.cfg.node_lease_duration)
    }

    /// `Status::compute` on a blocking thread, so the runtime's threads (the sync loop's
    /// among them) are not held while it replans every Service for every serving node.
    /// `None` if it panicked: the memory then starts again from nothing.
    async fn compute(
        &self,
        memory: &mut Memory,
        objects: &Arc<Objects>,
        nodes: Vec<Node>,
        beats: BTreeMap<String, heartbeat::Heartbeat>,
        ages: BTreeMap<String, Duration>,
    ) -> Option<BTreeSet<ServiceKey>> {
        let mut status = std::mem::take(&mut memory.status);
        let (objects, cfg) = (objects.clone(), self.cfg.clone());
        let r = tokio::task::spawn_blocking(move || {
            let changed = status.compute(&objects, &nodes, &beats, &ages, &cfg);
            (status, changed)
        })
        .await;
        match r {
            Ok((status, changed)) => {
                memory.status = status;
                Some(changed)
            }
            Err(e) => {
                warn!(error = %e, "computing the desired status failed; starting again");
                *memory = Memory::default();
                None
            }
        }
    }

    fn record_heartbeat_ages(&self, judged: &BTreeMap<String, heartbeat::Judged>) {
        for (node, j) in judged {
            self.metrics
                .heartbeat_age
                .get_or_create(&NodeLabel { node: node.clone() })
                .set(j.age.as_secs_f64());
        }
    }

    /// Say what liveness cannot read, when that changes: the metric, a warning in the log,
    /// one Event on the Lease `nodelb-status` (not one per Service), the note every Service's
    /// condition ends with, and, when the Pods cannot be read, the ask on the Lease that agents
    /// in Pods renew their heartbeats themselves.
    async fn degraded(&mut self, memory: &mut Memory, now: Vec<Unreadable>, inputs: &Inputs<'_>) {
        for signal in ["pods", "kubelet-leases"] {
            let readable = !now.iter().any(|u| u.signal == signal);
            self.metrics
                .liveness_readable
                .get_or_create(&SignalLabel { signal })
                .set(i64::from(readable));
        }
        if memory.unreadable.as_ref() == Some(&now) {
            return;
        }
        let before = memory.unreadable.replace(now.clone()).unwrap_or_default();
        let note = degraded_note(&now, &self.namespace);
        self.cfg.liveness = note.clone();
        let pods_unreadable = now.iter().any(|u| u.signal == "pods");
        self.ask
            .send_replace(pods_unreadable.then_some(heartbeat::SLOW_RENEWAL));
        let (type_, reason, text) = match &note {
            Some(note) => {
                for u in &now {
                    warn!(signal = u.signal, why = %u.why, "{note}");
                }
                (EventType::Warning, "LivenessDegraded", note.clone())
            }
            // Readable again after it was not: said once; a leader that reads everything from
            // its start says nothing.
            None if before.is_empty() => return,
            None => {
                info!("liveness reads every signal again");
                (
                    EventType::Normal,
                    "LivenessRestored",
                    "nodelb reads the agents' Pods and the kubelets' node Leases again: nodes are judged by them".to_string(),
                )
            }
        };
        let why: Vec<String> = now.iter().map(|u| u.why.clone()).collect();
        let text = if why.is_empty() {
            text
        } else {
            format!("{text} ({})", why.join("; "))
        };
        let regarding = ObjectReference {
            api_version: Some("coordination.k8s.io/v1".into()),
            kind: Some("Lease".into()),
            name: Some(nodelb_core::status::election::LEASE_NAME.into()),
            namespace: Some(self.namespace.clone()),
            ..Default::default()
        };
        let ev = new_event(regarding, type_, reason, &text, &inputs.recorder.instance);
        inputs.recorder.send(&ev).await;
    }

    /// Decide what one Service needs (its problem Events are sent here), and return the write
    /// to make, if any, as a job of its own: the apply and, when the ingress changed for a
    /// cause of the Service's own, its `EnsuredLoadBalancer`/`UpdatedLoadBalancer` Event.
    async fn prepare<'r>(
        &mut self,
        memory: &mut Memory,
        objects: &Objects,
        key: &ServiceKey,
        inputs: &Inputs<'r>,
    ) -> Option<BoxFuture<'r, Done>> {
        let recorder = inputs.recorder;
        let Some(svc) = objects.service(key) else {
            memory.written.remove(key);
            memory.reported.remove(key);
            return None;
        };
        let want = memory.status.desired().get(key).cloned();
        let want = want.as_ref();
        let reported = memory.reported.entry(key.clone()).or_default();
        report_problems(reported, key, svc, want, recorder).await;
        if reported.is_empty() {
            memory.reported.remove(key);
        }
        // This very version of the Service is our write of this very status: the server may
        // store it in a form of its own, which is not a reason to write it again.
        let ours = memory.written.get(key).is_some_and(|w| {
            want.is_some_and(|d| wrote(d) == w.status)
                && svc.metadata.resource_version.as_deref() == w.resource_version.as_deref()
        });
        let key = key.clone();
        match ingress::decide(svc, want, inputs.ip_mode, Timestamp::now()) {
            Write::Nothing => {
                memory.foreign.remove(&key);
                // The stored status is the one wanted: nothing left to remember of the write
                // (at 10,000 Services the records would hold about a MiB for nothing).
                memory.written.remove(&key);
                None
            }
            // Anything else `decide` makes of our own write (another manager listed beside
            // us, say) waits for a version that is not ours.
            _ if ours => None,
            Write::OwnedElsewhere { managers } => {
                if memory.foreign.insert(key.clone()) {
                    warn!(service = %key, managers = ?managers, "another field manager owns the ingress; not writing");
                    let note = format!(
                        "status.loadBalancer.ingress is owned by {}: nodelb does not write it",
                        managers.join(", ")
                    );
                    let ev = service_event(
                        svc,
                        EventType::Warning,
                        "IngressOwnedElsewhere",
                        &note,
                        recorder,
                    );
                    recorder.send(&ev).await;
                }
                None
            }
            Write::Apply {
                body,
                first,
                ingress_changed,
            } => {
                let want = want.expect("apply only for handled Services");
                // Told once on the Node(s) it came from, not on every Service.
                let node_caused = fanout::node_caused(svc, want, &memory.moved);
                let event = (ingress_changed && !node_caused).then_some(first);
                Some(apply_job(svc, key, want, body, event, recorder))
            }
            Write::Clear { body } => Some(Box::pin(async move {
                let result = recorder.apply(&key, body).await;
                let outcome = Outcome::Cleared(result);
                Done { key, outcome }
            })),
        }
    }

    /// Remember what an answered write did.
    fn finish(&mut self, memory: &mut Memory, done: Done) {
        let key = done.key;
        match done.outcome {
            Outcome::Applied {
                digest,
                list,
                serving,
                result: Ok(rv),
            } => {
                self.count("ok");
                info!(service = %key, ingress = ?list, serving, "status written");
                let written = Written {
                    status: digest,
                    resource_version: rv.map(Str::from),
                };
                memory.written.insert(key, written);
            }
            Outcome::Cleared(Ok(_)) => {
                self.count("cleared");
                info!(service = %key, "not nodelb's any more: cleared what nodelb wrote");
                memory.written.remove(&key);
            }
            Outcome::Applied { result: Err(e), .. } | Outcome::Cleared(Err(e)) => {
                self.failed(&key, e);
                memory.retry.insert(key);
            }
        }
    }

    fn count(&self, result: &'static str) {
        self.metrics
            .status_writes
            .get_or_create(&WriteLabel { result })
            .inc();
    }

    fn failed(&self, key: &ServiceKey, e: kube::Error) {
        let conflict = matches!(&e, kube::Error::Api(s) if s.code == 409);
        self.count(if conflict { "conflict" } else { "error" });
        if conflict {
            debug!(service = %key, error = %e, "status write conflicted; another manager owns a field");
        } else {
            warn!(service = %key, error = %e, "status write failed; retried at the next look");
        }
    }
}

/// What the writer works with while it leads.
struct Inputs<'a> {
    watched: &'a Watched,
    ip_mode: Option<&'a str>,
    recorder: &'a Requests,
}

/// An answered write.
struct Done {
    key: ServiceKey,
    outcome: Outcome,
}

enum Outcome {
    Applied {
        digest: u64,
        list: Vec<String>,
        serving: &'static str,
        result: Result<Option<String>, kube::Error>,
    },
    Cleared(Result<Option<String>, kube::Error>),
}

/// The Node named `name` among `nodes`.
fn named<'n>(nodes: &'n [Arc<Node>], name: &str) -> Option<&'n Node> {
    nodes
        .iter()
        .find(|n| n.metadata.name.as_deref() == Some(name))
        .map(|n| &**n)
}

/// The apply of `want` to `svc`'s status, then, once it is answered, its
/// `EnsuredLoadBalancer` (`event`: `Some(true)`, a first ingress) or `UpdatedLoadBalancer`
/// (`Some(false)`) Event.
fn apply_job<'r>(
    svc: &Service,
    key: ServiceKey,
    want: &Desired,
    body: serde_json::Value,
    event: Option<bool>,
    recorder: &'r Requests,
) -> BoxFuture<'r, Done> {
    let list: Vec<String> = want.ingress.iter().map(|a| a.to_string()).collect();
    let event = event.map(|first| {
        let (reason, verb) = if first {
            ("EnsuredLoadBalancer", "Ensured")
        } else {
            ("UpdatedLoadBalancer", "Updated")
        };
        let note = if list.is_empty() {
            format!("{verb} load balancer: no node serves it")
        } else {
            format!("{verb} load balancer: {}", list.join(", "))
        };
        service_event(svc, EventType::Normal, reason, &note, recorder)
    });
    let (digest, serving) = (wrote(want), want.serving.reason);
    Box::pin(async move {
        let result = recorder.apply(&key, body).await;
        if let (Ok(_), Some(ev)) = (&result, &event) {
            recorder.send(ev).await;
        }
        let outcome = Outcome::Applied {
            digest,
            list,
            serving,
            result,
        };
        Done { key, outcome }
    })
}

/// Warning Events for the Service's problems that are new since `before`.
async fn report_problems(
    before: &mut BTreeSet<Problem>,
    key: &ServiceKey,
    svc: &Service,
    want: Option<&Desired>,
    recorder: &Requests,
) {
    let now: BTreeSet<Problem> = want
        .map(|d| d.problems.iter().cloned().collect())
        .unwrap_or_default();
    for p in now.difference(before) {
        warn!(service = %key, reason = p.reason(), problem = %p.note(), "service problem");
        let ev = service_event(svc, EventType::Warning, p.reason(), &p.note(), recorder);
        recorder.send(&ev).await;
    }
    *before = now;
}

fn minor(s: &str) -> u32 {
    s.trim_end_matches('+').parse().unwrap_or(0)
}

/// The writer's requests, paced by one token bucket: status applies, and Service Events
/// (`events.k8s.io/v1`) created directly: the writer decides itself when an Event is due (a
/// problem that is new, a status written), so it keeps no cache of them — kube's `Recorder`
/// keeps every Event it sent, which grows with the number of Services.
struct Requests {
    client: Client,
    instance: String,
    pace: RateLimiter,
}

impl Requests {
    /// Creates an Event, paced with the applies; a failure is logged.
    async fn send(&self, ev: &Event) {
        self.pace.wait().await;
        if let Err(e) = create_event(self.client.clone(), ev).await {
            let regarding = ev.regarding.as_ref();
            warn!(
                namespace = ev.metadata.namespace.as_deref().unwrap_or_default(),
                regarding = regarding.and_then(|r| r.name.as_deref()).unwrap_or_default(),
                reason = ev.reason.as_deref().unwrap_or_default(),
                error = %e,
                "could not publish an Event"
            );
        }
    }

    /// Server-side apply of a Service's status; the Service's resourceVersion after it.
    async fn apply(
        &self,
        key: &ServiceKey,
        body: serde_json::Value,
    ) -> Result<Option<String>, kube::Error> {
        self.pace.wait().await;
        let api: Api<wire::Service> = Api::namespaced(self.client.clone(), &key.namespace);
        let s = api
            .patch_status(
                &key.name,
                &PatchParams::apply(FIELD_MANAGER),
                &Patch::Apply(body),
            )
            .await?;
        Ok(s.metadata.resource_version)
    }
}

/// An Event about a Service.
fn service_event(
    svc: &Service,
    type_: EventType,
    reason: &str,
    note: &str,
    sink: &Requests,
) -> Event {
    let regarding = ObjectReference {
        api_version: Some("v1".into()),
        kind: Some("Service".into()),
        name: svc.metadata.name.as_deref().map(String::from),
        namespace: Some(
            svc.metadata
                .namespace
                .as_deref()
                .unwrap_or("default")
                .to_string(),
        ),
        uid: svc.metadata.uid.as_deref().map(String::from),
        ..Default::default()
    };
    new_event(regarding, type_, reason, note, &sink.instance)
}

/// The one Event for a node that started or stopped serving, on its Node.
fn node_event(t: &fanout::Transition, uid: Option<String>, instance: &str) -> Event {
    let regarding = ObjectReference {
        api_version: Some("v1".into()),
        kind: Some("Node".into()),
        name: Some(t.node.clone()),
        uid,
        ..Default::default()
    };
    let type_ = if t.joined {
        EventType::Normal
    } else {
        EventType::Warning
    };
    new_event(regarding, type_, t.reason(), &t.note(), instance)
}
