//! Watch streams: newline-delimited JSON events (`{"type":…,"object":…}`)
//! from a resourceVersion, out of the store's bounded history.
//!
//! As kube-apiserver: a resourceVersion older than the history gets one
//! `ERROR` event carrying a 410 `Expired` Status and the stream ends (that is
//! what makes kube-runtime's watcher relist); no resourceVersion or `0`
//! starts with synthetic `ADDED` events for the current objects; with
//! selectors, an object that stops matching is sent as `DELETED` and one
//! that starts matching as `ADDED`; `allowWatchBookmarks` adds periodic
//! `BOOKMARK` events; `timeoutSeconds` ends the stream.

use std::convert::Infallible;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::Bytes;
use futures::Stream;
use serde_json::{json, Value};
use tokio::sync::mpsc;
use tokio::time::{sleep_until, Instant};
use tracing::{debug, Instrument};

use super::resources::ResourceDef;
use super::response::ApiStatus;
use super::selector::Selectors;
use super::store::{EventType, Store, StoredEvent};

/// One watch request, parsed.
#[derive(Debug, Clone)]
pub struct WatchRequest {
    pub resource: &'static ResourceDef,
    /// Empty: all namespaces.
    pub namespace: String,
    pub selectors: Selectors,
    /// `None` (unset or `0`): start with the current objects as `ADDED`.
    pub from: Option<u64>,
    pub bookmarks: bool,
    pub bookmark_interval: Duration,
    pub timeout: Duration,
    /// Send `PartialObjectMetadata` instead of whole objects (the client
    /// asked with `Accept: …;as=PartialObjectMetadata…`).
    pub metadata_only: bool,
}

/// What a stored event becomes for a watcher with selectors: `None` when
/// the watcher does not see it.
pub fn translate(event: &StoredEvent, selectors: &Selectors) -> Option<(EventType, Value)> {
    let now = selectors.matches(&event.object);
    match event.kind {
        EventType::Added | EventType::Deleted => now.then(|| (event.kind, event.object.clone())),
        EventType::Modified => {
            let before = event
                .previous
                .as_ref()
                .is_some_and(|p| selectors.matches(p));
            match (before, now) {
                (true, true) => Some((EventType::Modified, event.object.clone())),
                (false, true) => Some((EventType::Added, event.object.clone())),
                (true, false) => Some((EventType::Deleted, event.object.clone())),
                (false, false) => None,
            }
        }
    }
}

fn shape(object: &Value, metadata_only: bool) -> Value {
    if metadata_only {
        partial_object_metadata(object)
    } else {
        object.clone()
    }
}

/// The `PartialObjectMetadata` form of an object (`meta.k8s.io/v1`), what
/// kube-rs metadata-only requests and `metadata_watcher` ask for.
pub fn partial_object_metadata(object: &Value) -> Value {
    json!({
        "kind": "PartialObjectMetadata",
        "apiVersion": "meta.k8s.io/v1",
        "metadata": object.get("metadata").cloned().unwrap_or_else(|| json!({})),
    })
}

fn line(kind: &str, object: &Value) -> Bytes {
    let mut s = json!({ "type": kind, "object": object }).to_string();
    s.push('\n');
    Bytes::from(s)
}

fn bookmark(resource: &ResourceDef, rv: u64) -> Bytes {
    line(
        "BOOKMARK",
        &json!({
            "kind": resource.kind,
            "apiVersion": resource.api_version(),
            "metadata": { "resourceVersion": rv.to_string() },
        }),
    )
}

/// Starts the watch and returns its body stream. The stream ends on
/// timeout, after an `ERROR` event, or when the client goes away.
pub fn stream(
    store: Arc<Mutex<Store>>,
    req: WatchRequest,
) -> impl Stream<Item = Result<Bytes, Infallible>> + Send + 'static {
    let (tx, rx) = mpsc::channel::<Bytes>(64);
    let span = tracing::debug_span!(
        "watch",
        resource = %req.resource,
        namespace = %req.namespace,
        from = ?req.from,
    );
    tokio::spawn(run(store, req, tx).instrument(span));
    futures::stream::unfold(
        rx,
        |mut rx| async move { rx.recv().await.map(|b| (Ok(b), rx)) },
    )
}

async fn run(store: Arc<Mutex<Store>>, req: WatchRequest, tx: mpsc::Sender<Bytes>) {
    let deadline = Instant::now() + req.timeout;
    let mut changed = store.lock().expect("store lock").subscribe();
    let (lines, mut cursor) = match req.from {
        Some(from) => (Vec::new(), from),
        None => {
            let (items, rv) = store
                .lock()
                .expect("store lock")
                .snapshot(req.resource, &req.namespace);
            let lines: Vec<Bytes> = items
                .iter()
                .filter(|o| req.selectors.matches(o))
                .map(|o| line("ADDED", o))
                .collect();
            (lines, rv)
        }
    };
    for l in lines {
        if tx.send(l).await.is_err() {
            return;
        }
    }
    let mut next_bookmark = Instant::now() + req.bookmark_interval;
    loop {
        let batch =
            store
                .lock()
                .expect("store lock")
                .events_after(req.resource, &req.namespace, cursor);
        match batch {
            Ok((events, head)) => {
                for e in &events {
                    if let Some((kind, obj)) = translate(e, &req.selectors) {
                        let obj = shape(&obj, req.metadata_only);
                        if tx.send(line(kind.as_str(), &obj)).await.is_err() {
                            return;
                        }
                    }
                }
                cursor = head;
            }
            Err(e) => {
                debug!(error = %e, "watch position expired");
                let status = ApiStatus::from(e).to_json();
                let _ = tx.send(line("ERROR", &status)).await;
                return;
            }
        }
        tokio::select! {
            r = changed.changed() => {
                if r.is_err() {
                    return;
                }
            }
            _ = sleep_until(next_bookmark), if req.bookmarks => {
                if tx.send(bookmark(req.resource, cursor)).await.is_err() {
                    return;
                }
                next_bookmark = Instant::now() + req.bookmark_interval;
            }
            _ = sleep_until(deadline) => {
                debug!("watch timeout");
                return;
            }
            _ = tx.closed() => return,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::apiserver::resources::by_kind;
    use crate::apiserver::store::ObjectKey;

    fn ev(kind: EventType, before: Option<&str>, after: &str) -> StoredEvent {
        let obj = |v: &str| json!({"metadata": {"name": "a", "labels": {"app": v}}});
        StoredEvent {
            rv: 1,
            key: ObjectKey {
                resource: by_kind("v1", "Service").unwrap(),
                namespace: "ns".into(),
                name: "a".into(),
            },
            kind,
            object: obj(after),
            previous: before.map(obj),
        }
    }

    #[test]
    fn object_leaving_the_selector_is_deleted() {
        let sel = Selectors::parse(Some("app=web"), None).unwrap();
        let (k, _) = translate(&ev(EventType::Modified, Some("web"), "db"), &sel).unwrap();
        assert_eq!(k, EventType::Deleted);
        let (k, _) = translate(&ev(EventType::Modified, Some("db"), "web"), &sel).unwrap();
        assert_eq!(k, EventType::Added);
        assert!(translate(&ev(EventType::Modified, Some("db"), "x"), &sel).is_none());
        let (k, _) = translate(&ev(EventType::Modified, Some("web"), "web"), &sel).unwrap();
        assert_eq!(k, EventType::Modified);
        assert!(translate(&ev(EventType::Added, None, "db"), &sel).is_none());
    }
}
