//! Watches: Services and EndpointSlices in all namespaces, read straight into the
//! [`wire`](crate::kube::wire) types (only what nodelb reads is kept), whose events go to the
//! sync loop's [`Inbox`](super::inbox::Inbox) (the one copy of them), and this node's Node,
//! kept in a kube-runtime reflector. Objects are read through `DeserializeGuard`, so one that
//! does not deserialize is logged and counted once and never stops the watch.

use super::inbox::ObjectEvent;
use super::metrics::Metrics;
use super::Trigger;
use crate::kube::wire::{EndpointSlice, Service};
use futures::StreamExt;
use k8s_openapi::api::core::v1::Node;
use kube::core::DeserializeGuard;
use kube::runtime::reflector::{self, Store};
use kube::runtime::watcher::{self, Event};
use kube::runtime::WatchStreamExt;
use kube::{Api, Client, Resource, ResourceExt};
use serde::de::DeserializeOwned;
use std::collections::HashMap;
use std::fmt::Debug;
use std::sync::Arc;
use tokio::sync::mpsc::UnboundedSender;
use tracing::{info_span, warn, Instrument};

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
    /// Start the three watches. Service and EndpointSlice events are sent as
    /// [`Trigger::Object`]; a Node change as [`Trigger::Changed`].
    pub fn start(
        client: &Client,
        node_name: &str,
        tx: UnboundedSender<Trigger>,
        metrics: Arc<Metrics>,
    ) -> (Caches, Vec<tokio::task::JoinHandle<()>>) {
        let t1 = forward::<Service>(
            Api::all(client.clone()),
            "services",
            tx.clone(),
            metrics.clone(),
            |ev| Trigger::Object(ObjectEvent::Service(Box::new(ev))),
        );
        let t2 = forward::<EndpointSlice>(
            Api::all(client.clone()),
            "endpointslices",
            tx.clone(),
            metrics.clone(),
            |ev| Trigger::Object(ObjectEvent::Slice(Box::new(ev))),
        );
        let (node, t3) = start_one::<Node>(
            Api::all(client.clone()),
            watcher::Config::default().fields(&format!("metadata.name={node_name}")),
            "nodes",
            tx,
            metrics,
        );
        (Caches { node }, vec![t1, t2, t3])
    }

    /// Wait until the Node watch has listed once.
    pub async fn ready(&self) -> Result<(), reflector::store::WriterDropped> {
        self.node.wait_until_ready().await
    }
}

/// Watch `api` and send every event on, noting objects that do not deserialize.
fn forward<K>(
    api: Api<DeserializeGuard<K>>,
    resource: &'static str,
    tx: UnboundedSender<Trigger>,
    metrics: Arc<Metrics>,
    wrap: fn(Event<DeserializeGuard<K>>) -> Trigger,
) -> tokio::task::JoinHandle<()>
where
    K: Resource<DynamicType = ()> + Clone + DeserializeOwned + Debug + Send + Sync + 'static,
{
    let stream = watcher::watcher(api, watcher::Config::default()).default_backoff();
    drain(stream, resource, tx, metrics, wrap)
}

/// Watch `api` into a reflector's store; every change sends [`Trigger::Changed`].
fn start_one<K>(
    api: Api<DeserializeGuard<K>>,
    config: watcher::Config,
    resource: &'static str,
    tx: UnboundedSender<Trigger>,
    metrics: Arc<Metrics>,
) -> (Store<DeserializeGuard<K>>, tokio::task::JoinHandle<()>)
where
    K: Resource<DynamicType = ()> + Clone + DeserializeOwned + Debug + Send + Sync + 'static,
{
    let (reader, writer) = reflector::store::<DeserializeGuard<K>>();
    let stream = reflector::reflector(writer, watcher::watcher(api, config).default_backoff());
    let task = drain(stream, resource, tx, metrics, |_| Trigger::Changed);
    (reader, task)
}

/// Run a watch stream to its end: note objects that do not deserialize (once per object and
/// error, so a re-list does not report them again), count watch errors, and send each event on
/// as `wrap` makes it a trigger.
fn drain<K, S>(
    stream: S,
    resource: &'static str,
    tx: UnboundedSender<Trigger>,
    metrics: Arc<Metrics>,
    wrap: fn(Event<DeserializeGuard<K>>) -> Trigger,
) -> tokio::task::JoinHandle<()>
where
    K: Resource<DynamicType = ()> + Clone + DeserializeOwned + Debug + Send + Sync + 'static,
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
