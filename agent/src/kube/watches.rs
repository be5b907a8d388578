//! Watches: Services and EndpointSlices in all namespaces, read straight into the
//! [`wire`](nodelb_core::objects::wire) types (only what nodelb reads is kept), whose events go to the
//! sync loop's [`Inbox`](super::inbox::Inbox) (the one copy of them), and this node's Node,
//! kept in a kube-runtime reflector. Objects are read through `DeserializeGuard`, so one that
//! does not deserialize is logged and counted once and never stops the watch.

use super::inbox::ObjectEvent;
use crate::metrics::Metrics;
use futures::StreamExt;
use k8s_openapi::api::core::v1::Node;
use kube::core::DeserializeGuard;
use kube::runtime::reflector::{self, Store};
use kube::runtime::watcher::{self, Event};
use kube::runtime::WatchStreamExt;
use kube::{Api, Client, Resource, ResourceExt};
use nodelb_core::objects::wire::{EndpointSlice, Service};
use serde::de::DeserializeOwned;
use std::collections::HashMap;
use std::fmt::Debug;
use std::sync::Arc;
use tokio::sync::mpsc::UnboundedSender;
use tracing::{info_span, warn, Instrument};

/// This node's Node changed (sent by its watch).
#[derive(Debug)]
pub struct NodeChanged;

/// The Node's reflector.
#[derive(Clone)]
pub struct Caches {
    pub node: Store<DeserializeGuard<Node>>,
}

/// The valid objects of a store.
pub fn valid<K>(store: &Store<DeserializeGuard<K>>) -> Vec<Arc<DeserializeGuard<K>>>
where
    K: Clone + Resource<DynamicType = ()>,
{
    store.state().into_iter().filter(|g| g.0.is_ok()).collect()
}

impl Caches {
    /// Start the three watches. Service and EndpointSlice events are sent as an
    /// [`ObjectEvent`]; a change of this node's Node as [`NodeChanged`].
    pub fn start<T>(
        client: &Client,
        node_name: &str,
        tx: UnboundedSender<T>,
        metrics: Arc<Metrics>,
    ) -> (Caches, Vec<tokio::task::JoinHandle<()>>)
    where
        T: From<ObjectEvent> + From<NodeChanged> + Send + 'static,
    {
        let to = |resource| Sink {
            resource,
            tx: tx.clone(),
            metrics: metrics.clone(),
        };
        let t1 = forward::<Service, T>(Api::all(client.clone()), to("services"), |ev| {
            T::from(ObjectEvent::Service(Box::new(ev)))
        });
        let t2 =
            forward::<EndpointSlice, T>(Api::all(client.clone()), to("endpointslices"), |ev| {
                T::from(ObjectEvent::Slice(Box::new(ev)))
            });
        let (node, t3) = start_one::<Node, T>(
            Api::all(client.clone()),
            watcher::Config::default().fields(&format!("metadata.name={node_name}")),
            to("nodes"),
        );
        (Caches { node }, vec![t1, t2, t3])
    }

    /// Wait until the Node watch has listed once.
    pub async fn ready(&self) -> Result<(), reflector::store::WriterDropped> {
        self.node.wait_until_ready().await
    }
}

/// Where a watch's events go, and what they are counted as.
struct Sink<T> {
    resource: &'static str,
    tx: UnboundedSender<T>,
    metrics: Arc<Metrics>,
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
    let stream = watcher::watcher(api, watcher::Config::default()).default_backoff();
    drain(stream, to, wrap)
}

/// Watch `api` into a reflector's store; every change sends [`NodeChanged`].
fn start_one<K: Watched, T: From<NodeChanged> + Send + 'static>(
    api: Api<DeserializeGuard<K>>,
    config: watcher::Config,
    to: Sink<T>,
) -> (Store<DeserializeGuard<K>>, tokio::task::JoinHandle<()>) {
    let (reader, writer) = reflector::store::<DeserializeGuard<K>>();
    let stream = reflector::reflector(writer, watcher::watcher(api, config).default_backoff());
    let task = drain(stream, to, |_| T::from(NodeChanged));
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
