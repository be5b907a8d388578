//! Watches: Services and EndpointSlices in all namespaces, read straight into the
//! [`wire`](nodelb_core::objects::wire) types (only what nodelb reads is kept), whose events go to the
//! sync loop's [`Inbox`](super::inbox::Inbox) (the one copy of them), and this node's Node,
//! kept in a kube-runtime reflector; with `--servicelb-compat`, whether any Node carries k3s
//! ServiceLB's `enablelb` label, from a metadata-only watch of just those Nodes. Objects are read through `DeserializeGuard`, so one that
//! does not deserialize is logged and counted once and never stops the watch. Every event is
//! noted in readiness as a change received (`Readiness::change_received`) before it is sent
//! on, so a change the sync loop does not take and commit in time makes the agent unready;
//! each watch is asked for as `watching` says (long-lived, retried soon).

use super::inbox::{ObjectEvent, SERVICE_WATCH, SLICE_WATCH};
use super::watching::{self, Retry};
use crate::metrics::Metrics;
use crate::readiness::Readiness;
use futures::StreamExt;
use k8s_openapi::api::core::v1::Node;
use kube::core::{DeserializeGuard, PartialObjectMeta};
use kube::runtime::reflector::{self, Store};
use kube::runtime::watcher::{self, Event};
use kube::runtime::WatchStreamExt;
use kube::{Api, Client, Resource, ResourceExt};
use nodelb_core::objects::wire::{EndpointSlice, Service};
use nodelb_core::plan::servicelb::ENABLELB_LABEL;
use serde::de::DeserializeOwned;
use std::collections::{BTreeSet, HashMap};
use std::fmt::Debug;
use std::sync::Arc;
use tokio::sync::mpsc::UnboundedSender;
use tokio::sync::watch;
use tracing::{info, info_span, warn, Instrument};

/// Objects per page of the Service and EndpointSlice watches' initial lists.
pub const PAGE_SIZE: u32 = 500;

/// This node's Node changed (sent by its watch), or whether any Node carries ServiceLB's
/// label; `relisted` names the watch whose list this ends, if it does (readiness waits for
/// its commit after a watch started over: `watching::relisting`).
#[derive(Debug)]
pub struct NodeChanged {
    pub relisted: Option<&'static str>,
}

/// The readiness names of the watches whose lists end in a [`NodeChanged`].
pub const NODE_WATCH: &str = "nodes";
pub const SERVICELB_WATCH: &str = "nodes-servicelb";

/// The Node's reflector, and what the ServiceLB watch says.
#[derive(Clone)]
pub struct Caches {
    pub node: Store<DeserializeGuard<Node>>,
    /// With `--servicelb-compat`: whether some Node carries ServiceLB's `enablelb` label
    /// (`None` until its watch has listed).
    pub servicelb: Option<watch::Receiver<Option<bool>>>,
}

/// The valid objects of a store.
pub fn valid<K>(store: &Store<DeserializeGuard<K>>) -> Vec<Arc<DeserializeGuard<K>>>
where
    K: Clone + Resource<DynamicType = ()>,
{
    store.state().into_iter().filter(|g| g.0.is_ok()).collect()
}

impl Caches {
    /// Start the three watches, and with `servicelb_compat` the fourth. Service and
    /// EndpointSlice events are sent as an [`ObjectEvent`]; a change of this node's Node, or of
    /// whether any Node carries ServiceLB's `enablelb` label, as [`NodeChanged`].
    pub fn start<T>(
        client: &Client,
        node_name: &str,
        servicelb_compat: bool,
        tx: UnboundedSender<T>,
        metrics: Arc<Metrics>,
        readiness: Readiness,
    ) -> (Caches, Vec<tokio::task::JoinHandle<()>>)
    where
        T: From<ObjectEvent> + From<NodeChanged> + Send + 'static,
    {
        let to = |resource| Sink {
            resource,
            tx: tx.clone(),
            metrics: metrics.clone(),
            readiness: readiness.clone(),
        };
        let t1 = forward::<Service, T>(Api::all(client.clone()), to(SERVICE_WATCH), |ev| {
            T::from(ObjectEvent::Service(Box::new(ev)))
        });
        let t2 = forward::<EndpointSlice, T>(Api::all(client.clone()), to(SLICE_WATCH), |ev| {
            T::from(ObjectEvent::Slice(Box::new(ev)))
        });
        let (node, t3) = start_one::<Node, T>(
            Api::all(client.clone()),
            watching::config().fields(&format!("metadata.name={node_name}")),
            to("nodes"),
        );
        let mut tasks = vec![t1, t2, t3];
        let servicelb = servicelb_compat.then(|| {
            let (rx, t4) = watch_enablelb::<T>(Api::all(client.clone()), to("nodes"));
            tasks.push(t4);
            rx
        });
        (Caches { node, servicelb }, tasks)
    }

    /// Wait until the Node watch (and the ServiceLB one) has listed once; `false`: a watch
    /// stopped first.
    pub async fn ready(&self) -> bool {
        if self.node.wait_until_ready().await.is_err() {
            return false;
        }
        match &self.servicelb {
            Some(rx) => rx.clone().wait_for(Option::is_some).await.is_ok(),
            None => true,
        }
    }

    /// Whether some Node carries ServiceLB's `enablelb` label (`false` without
    /// `--servicelb-compat`).
    pub fn servicelb_labelled(&self) -> bool {
        self.servicelb
            .as_ref()
            .is_some_and(|rx| rx.borrow().unwrap_or(false))
    }
}

/// Whether any Node carries ServiceLB's `enablelb` label, whatever its value (k3s counts a
/// Node labelled `false` too, see `nodelb_core::plan::servicelb`). The watch asks only for the
/// Nodes carrying the label (a label selector on its key) and only their metadata, so in a
/// cluster that does not use the label it lists nothing, and it never carries a Node's
/// status; the server sends a Node that loses the label as deleted. It needs no RBAC rule
/// beyond the `nodes` list and watch every agent has. Only a change of the answer wakes a
/// sync.
fn watch_enablelb<T: From<NodeChanged> + Send + 'static>(
    api: Api<PartialObjectMeta<Node>>,
    Sink {
        resource,
        tx,
        metrics,
        readiness,
    }: Sink<T>,
) -> (watch::Receiver<Option<bool>>, tokio::task::JoinHandle<()>) {
    let (said, rx) = watch::channel(None);
    let config = watching::config().labels(ENABLELB_LABEL);
    let stream = watched(api, config, &readiness, SERVICELB_WATCH);
    let task = tokio::spawn(
        async move {
            let mut stream = std::pin::pin!(stream);
            let mut labelled: BTreeSet<String> = BTreeSet::new();
            let mut listing: BTreeSet<String> = BTreeSet::new();
            let mut listed = false;
            while let Some(ev) = stream.next().await {
                let mut list_end = false;
                match ev {
                    Ok(Event::Init) => listing.clear(),
                    Ok(Event::InitApply(m)) => {
                        listing.insert(m.name_any());
                    }
                    Ok(Event::InitDone) => {
                        labelled = std::mem::take(&mut listing);
                        listed = true;
                        list_end = true;
                    }
                    Ok(Event::Apply(m)) => {
                        labelled.insert(m.name_any());
                    }
                    Ok(Event::Delete(m)) => {
                        labelled.remove(&m.name_any());
                    }
                    Err(e) => {
                        metrics.watch_error(resource);
                        warn!(error = %e, "watch failed; retrying with backoff");
                    }
                }
                if !listed {
                    continue;
                }
                let now = Some(!labelled.is_empty());
                let changed = *said.borrow() != now;
                if changed || list_end {
                    readiness.change_received(std::time::Instant::now());
                    if changed {
                        info!(
                            nodes = labelled.len(),
                            "nodes labelled {ENABLELB_LABEL} (only those labelled true serve, if any)"
                        );
                        said.send_replace(now);
                    }
                    let relisted = list_end.then_some(SERVICELB_WATCH);
                    if tx.send(T::from(NodeChanged { relisted })).is_err() {
                        return;
                    }
                }
            }
        }
        .instrument(info_span!("watch", resource = "nodes-servicelb")),
    );
    (rx, task)
}

/// Where a watch's events go, what they are counted as, and where they are noted as changes
/// received.
struct Sink<T> {
    resource: &'static str,
    tx: UnboundedSender<T>,
    metrics: Arc<Metrics>,
    readiness: Readiness,
}

/// What a watch here can read.
trait Watched:
    Resource<DynamicType = ()> + Clone + DeserializeOwned + Debug + Send + Sync + 'static
{
}
impl<K> Watched for K where
    K: Resource<DynamicType = ()> + Clone + DeserializeOwned + Debug + Send + Sync + 'static
{
}

/// Watch `api` and send every event on, noting objects that do not deserialize.
fn forward<K: Watched, T: Send + 'static>(
    api: Api<DeserializeGuard<K>>,
    to: Sink<T>,
    wrap: fn(Event<DeserializeGuard<K>>) -> T,
) -> tokio::task::JoinHandle<()> {
    let config = watching::config().page_size(PAGE_SIZE);
    let stream = watched(api, config, &to.readiness, to.resource);
    drain(stream, to, wrap)
}

/// The watch of `api`, retried as [`Retry`] says and started over as
/// [`watching::relisting`] says after `--max-view-age` without a stream; each start
/// over is logged and noted in readiness under `key`.
fn watched<K>(
    api: Api<K>,
    config: watcher::Config,
    readiness: &Readiness,
    key: &'static str,
) -> impl futures::Stream<Item = Result<Event<K>, watcher::Error>> + Send
where
    K: Resource<DynamicType = ()> + Clone + DeserializeOwned + Debug + Send + Sync + 'static,
{
    let readiness = readiness.clone();
    let stale_after = readiness.bounds().view;
    watching::relisting(
        move || watcher::watcher(api.clone(), config.clone()).backoff(Retry::default()),
        stale_after,
        move || {
            warn!(
                watch = key,
                after = ?stale_after,
                "watch lost for too long: listing again; not ready until the list is committed"
            );
            readiness.relisting(key);
        },
    )
}

/// Watch `api` into a reflector's store; every change sends [`NodeChanged`].
fn start_one<K: Watched, T: From<NodeChanged> + Send + 'static>(
    api: Api<DeserializeGuard<K>>,
    config: watcher::Config,
    to: Sink<T>,
) -> (Store<DeserializeGuard<K>>, tokio::task::JoinHandle<()>) {
    let (reader, writer) = reflector::store::<DeserializeGuard<K>>();
    let stream = reflector::reflector(writer, watched(api, config, &to.readiness, NODE_WATCH));
    let task = drain(stream, to, |ev| {
        T::from(NodeChanged {
            relisted: matches!(ev, Event::InitDone).then_some(NODE_WATCH),
        })
    });
    (reader, task)
}

/// Run a watch stream to its end: note objects that do not deserialize (once per object and
/// error, so a re-list does not report them again), count watch errors, and send each event on
/// as `wrap` makes it a message.
fn drain<K: Watched, S, T: Send + 'static>(
    stream: S,
    Sink {
        resource,
        tx,
        metrics,
        readiness,
    }: Sink<T>,
    wrap: fn(Event<DeserializeGuard<K>>) -> T,
) -> tokio::task::JoinHandle<()>
where
    S: futures::Stream<Item = Result<Event<DeserializeGuard<K>>, watcher::Error>> + Send + 'static,
{
    let kind = K::kind(&()).to_string();
    tokio::spawn(
        async move {
            let mut reported: HashMap<(String, String), String> = HashMap::new();
            let mut stream = std::pin::pin!(stream);
            while let Some(ev) = stream.next().await {
                match ev {
                    Ok(ev) => {
                        match &ev {
                            Event::Apply(g) | Event::InitApply(g) => {
                                note_invalid(g, &kind, &mut reported, &metrics)
                            }
                            Event::Delete(g) => {
                                reported.remove(&(g.namespace().unwrap_or_default(), g.name_any()));
                            }
                            Event::Init | Event::InitDone => {}
                        }
                        readiness.change_received(std::time::Instant::now());
                        if tx.send(wrap(ev)).is_err() {
                            return;
                        }
                    }
                    Err(e) => {
                        metrics.watch_error(resource);
                        warn!(error = %e, "watch failed; retrying with backoff");
                    }
                }
            }
        }
        .instrument(info_span!("watch", resource)),
    )
}

fn note_invalid<K: Resource<DynamicType = ()>>(
    g: &DeserializeGuard<K>,
    kind: &str,
    reported: &mut HashMap<(String, String), String>,
    metrics: &Metrics,
) {
    let key = (g.namespace().unwrap_or_default(), g.name_any());
    match &g.0 {
        Ok(_) => {
            reported.remove(&key);
        }
        Err(invalid) => {
            if reported.get(&key) != Some(&invalid.error) {
                warn!(kind, namespace = %key.0, name = %key.1, error = %invalid.error,
                      "object does not deserialize; skipped");
                metrics.invalid(kind, "decode");
                reported.insert(key, invalid.error.clone());
            }
        }
    }
}
