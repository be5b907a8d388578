//! The leader's status writer: while this agent holds `nodelb-status`, compute each Service's
//! desired ingress (`status::Status::compute`, on a blocking thread: at 10,000 Services it
//! takes a while) from the sync loop's objects, all Nodes and the heartbeat Leases, and write
//! it with server-side apply under the field manager `nodelb` — only where the stored value
//! differs. Service Events come from here only. Its requests (applies and Events) are paced
//! by one token bucket (see [`REQUESTS_PER_SECOND`]).

use super::events::{create_event, new_event};
use super::rate_limit::RateLimiter;
use crate::metrics::{Metrics, NodeLabel, WriteLabel};
use futures::StreamExt;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Node, ObjectReference};
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::events::EventType;
use kube::runtime::reflector::{self, Store};
use kube::runtime::{watcher, WatchStreamExt};
use kube::Client;
use nodelb_core::objects::index::Service;
use nodelb_core::objects::wire;
use nodelb_core::plan::Objects;
use nodelb_core::status::heartbeat;
use nodelb_core::status::ingress::{self, Write, FIELD_MANAGER};
use nodelb_core::status::{Desired, Problem, Status, StatusConfig};
use nodelb_core::vocab::ServiceKey;
use nodelb_core::vocab::Str;
use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::{watch, Notify};
use tracing::{debug, info, info_span, warn, Instrument};

/// The pace of the leader's requests, status applies and Events together (client-go's token
/// bucket, see `rate_limit`). Every status write is sent by the server to every node's Service
/// watchers (every nodelb agent, every kube-proxy), so the writer's rate is multiplied by the
/// number of nodes: unpaced, a new leader sent its writes as fast as the server took them
/// (how fast: docs/benchmarks.md, the leader's pace). 100 requests a second is 50 Services a
/// second, each one apply and one Event: the pace of a client-go component at
/// kube-scheduler's and kubelet's default of 50 requests a second with one request per
/// change; a new leader writes 10,000 new statuses in about 3.3 minutes.
pub const REQUESTS_PER_SECOND: f64 = 100.0;
/// Requests that go at once before the pace applies: a change to up to 100 Services (one
/// apply and one Event each) is written without waiting.
pub const BURST: u32 = 200;
/// Every this many Services of a round (about once a second at the pace), the status
/// planners are handed the objects as they are now, if only status writes changed them (see
/// `Status::follow`): each look costs a walk over every Service.
const FOLLOW_EVERY: usize = 50;

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
}

fn store<K>(api: Api<K>, wake: Arc<Notify>, what: &'static str) -> Store<K>
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
        watcher::watcher(api, watcher::Config::default()).default_backoff(),
    );
    tokio::spawn(
        async move {
            let mut stream = std::pin::pin!(stream);
            while let Some(ev) = stream.next().await {
                match ev {
                    Ok(_) => wake.notify_one(),
                    Err(e) => warn!(error = %e, "watch failed; retrying with backoff"),
                }
            }
        }
        .instrument(info_span!("watch", resource = what)),
    );
    reader
}

impl StatusWriter {
    pub async fn run(mut self, mut stop: watch::Receiver<bool>) {
        let wake = Arc::new(Notify::new());
        let nodes: Store<Node> = store(Api::all(self.client.clone()), wake.clone(), "nodes");
        let leases: Store<Lease> = store(
            Api::namespaced(self.client.clone(), &self.namespace),
            wake.clone(),
            "leases",
        );
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
            tokio::select! {
                _ = stop.wait_for(|s| *s) => return,
                r = async { nodes.wait_until_ready().await?; leases.wait_until_ready().await } => {
                    if r.is_err() { return }
                }
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
            let mut memory = Memory::default();
            info!("leading: writing Service status");
            while *self.leading.borrow() {
                self.round(&mut memory, &nodes, &leases, ip_mode.as_deref(), &recorder)
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
            info!("no longer leading: status writes stop");
        }
    }

    async fn round(
        &mut self,
        memory: &mut Memory,
        nodes: &Store<Node>,
        leases: &Store<Lease>,
        ip_mode: Option<&str>,
        recorder: &Requests,
    ) {
        let Some(objects) = self.objects.borrow_and_update().clone() else {
            return;
        };
        let nodes: Vec<Node> = nodes.state().iter().map(|n| (**n).clone()).collect();
        let leases: Vec<Lease> = leases.state().iter().map(|l| (**l).clone()).collect();
        let beats = heartbeat::read(&leases);
        let ages = memory.liveness.ages(&beats, std::time::Instant::now());
        self.record_heartbeat_ages(&ages);
        let Some(changed) = self.compute(memory, &objects, nodes, beats, ages).await else {
            return;
        };
        // Look at the Services whose desired status or whose object changed (a status write,
        // ours or someone else's, shows up as a change of the object).
        let mut keys: BTreeSet<ServiceKey> =
            match memory.version.and_then(|v| objects.changed_since(v)) {
                Some(k) => k,
                None => objects.services().map(|(k, _)| k.clone()).collect(),
            };
        memory.version = Some(objects.version());
        keys.extend(changed);
        // Each Service is settled against the objects as they are when its turn comes, not
        // the round's: a round is long (paced, one write per Service: minutes at 10,000), and
        // holding its objects would keep every Service the round's own writes replace (their
        // echoes) twice in memory until it ends. What changed meanwhile is looked at again
        // next round (`memory.version` is the round's).
        drop(objects);
        for (done, key) in keys.iter().enumerate() {
            // Once the Lease is lost or released, another agent writes, so stop at once. What
            // is left is redone from scratch the next time this agent leads (its memory starts
            // empty then).
            let now = self.objects.borrow().clone();
            let (true, Some(now)) = (*self.leading.borrow(), now) else {
                info!(
                    left = keys.len() - done,
                    "no longer leading: the status round stops"
                );
                return;
            };
            if done % FOLLOW_EVERY == 0 {
                memory.status.follow(&now);
            }
            self.settle(memory, &now, key, ip_mode, recorder).await;
        }
        if keys.len() >= PACK_AFTER {
            // A long round wrote in key order: half-full nodes (see `packed`).
            nodelb_core::packed::repack(&mut memory.written);
        }
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

    fn record_heartbeat_ages(&self, ages: &BTreeMap<String, Duration>) {
        for (node, age) in ages {
            self.metrics
                .heartbeat_age
                .get_or_create(&NodeLabel { node: node.clone() })
                .set(age.as_secs_f64());
        }
    }

    /// Bring one Service's status and its problem Events to what the leader decided.
    async fn settle(
        &mut self,
        memory: &mut Memory,
        objects: &Objects,
        key: &ServiceKey,
        ip_mode: Option<&str>,
        recorder: &Requests,
    ) {
        let Some(svc) = objects.service(key) else {
            memory.written.remove(key);
            memory.reported.remove(key);
            return;
        };
        let want = memory.status.desired().get(key).cloned();
        let want = want.as_ref();
        let reported = memory.reported.entry(key.clone()).or_default();
        self.report_problems(reported, key, svc, want, recorder)
            .await;
        if reported.is_empty() {
            memory.reported.remove(key);
        }
        // This very version of the Service is our write of this very status: the server may
        // store it in a form of its own, which is not a reason to write it again.
        let ours = memory.written.get(key).is_some_and(|w| {
            want.is_some_and(|d| wrote(d) == w.status)
                && svc.metadata.resource_version.as_deref() == w.resource_version.as_deref()
        });
        match ingress::decide(svc, want, ip_mode, Timestamp::now()) {
            Write::Nothing => {
                memory.foreign.remove(key);
                // The stored status is the one wanted: nothing left to remember of the write
                // (at 10,000 Services the records would hold about a MiB for nothing).
                memory.written.remove(key);
            }
            // Anything else `decide` makes of our own write (another manager listed beside
            // us, say) waits for a version that is not ours.
            _ if ours => {}
            Write::OwnedElsewhere { managers } => {
                if memory.foreign.insert(key.clone()) {
                    warn!(service = %key, managers = ?managers, "another field manager owns the ingress; not writing");
                    let note = format!(
                        "status.loadBalancer.ingress is owned by {}: nodelb does not write it",
                        managers.join(", ")
                    );
                    publish(
                        recorder,
                        svc,
                        EventType::Warning,
                        "IngressOwnedElsewhere",
                        &note,
                    )
                    .await;
                }
            }
            Write::Apply {
                body,
                first,
                ingress_changed,
            } => {
                let want = want.expect("apply only for handled Services");
                let event = ingress_changed.then_some(first);
                if let Some(w) = self.write(key, svc, want, body, event, recorder).await {
                    memory.written.insert(key.clone(), w);
                }
            }
            Write::Clear { body } => match recorder.apply(key, body).await {
                Ok(_) => {
                    self.count("cleared");
                    memory.written.remove(key);
                    info!(service = %key, "not nodelb's any more: cleared what nodelb wrote");
                }
                Err(e) => self.failed(key, e),
            },
        }
    }

    /// Apply the ingress and condition nodelb decided, and say so in an Event when the ingress
    /// changed (`event`: `Some(first)`). Returns what was written, to remember.
    async fn write(
        &mut self,
        key: &ServiceKey,
        svc: &Service,
        want: &Desired,
        body: serde_json::Value,
        event: Option<bool>,
        recorder: &Requests,
    ) -> Option<Written> {
        match recorder.apply(key, body).await {
            Ok(rv) => {
                self.count("ok");
                let written = Written {
                    status: wrote(want),
                    resource_version: rv.map(Str::from),
                };
                let list: Vec<String> = want.ingress.iter().map(|a| a.to_string()).collect();
                info!(service = %key, ingress = ?list, serving = want.serving.reason, "status written");
                let Some(first) = event else {
                    return Some(written);
                };
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
                publish(recorder, svc, EventType::Normal, reason, &note).await;
                Some(written)
            }
            Err(e) => {
                self.failed(key, e);
                None
            }
        }
    }

    async fn report_problems(
        &self,
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
            publish(recorder, svc, EventType::Warning, p.reason(), &p.note()).await;
        }
        *before = now;
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
            warn!(service = %key, error = %e, "status write failed; retried next round");
        }
    }
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

async fn publish(sink: &Requests, svc: &Service, type_: EventType, reason: &str, note: &str) {
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
    let ev = new_event(regarding, type_, reason, note, &sink.instance);
    sink.pace.wait().await;
    if let Err(e) = create_event(sink.client.clone(), &ev).await {
        warn!(
            namespace = ev.metadata.namespace.as_deref().unwrap_or_default(),
            service = svc.metadata.name.as_deref().unwrap_or_default(),
            reason,
            error = %e,
            "could not publish a Service Event"
        );
    }
}
