//! What the status, Event, host-listener and published-address end-to-end tests share: fast
//! leases, a one-port Service, applying an object, reading a Service's status and Events back,
//! one test at a time (a module of those test crates, not a test target of its own; each uses
//! some of it).
#![allow(dead_code)]

use k8s_openapi::api::core::v1::Service;
use k8s_openapi::api::events::v1::Event;
use kube::api::{Api, ListParams};
use nodelb_integration::e2e::{wait_for, Cluster, ClusterOptions};
use serde_json::{json, Value};
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

static SERIAL: Mutex<()> = Mutex::new(());

/// One test at a time, within one test crate: these tests are about timing on a shared
/// machine. A failed test does not block the others.
pub fn serial() -> MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|e| e.into_inner())
}

/// Service `name` of the test namespace, as stored.
pub fn stored(c: &Cluster, name: &str) -> Service {
    let api: Api<Service> = Api::namespaced(c.admin().clone(), c.namespace());
    c.block_on(api.get(name))
        .unwrap_or_else(|e| panic!("reading Service {name}: {e}"))
}

/// A Service's stored `status.loadBalancer.ingress` addresses.
pub fn ips(c: &Cluster, name: &str) -> Vec<String> {
    nodelb_integration::e2e::ingress_ips(&stored(c, name))
}

/// Waits until Service `name` publishes exactly `want` (in order); returns how long it took.
pub fn wait_ips(c: &Cluster, name: &str, want: &[String], timeout: Duration) -> Duration {
    let t0 = Instant::now();
    wait_for(&format!("{name}'s status lists {want:?}"), timeout, || {
        let got = ips(c, name);
        if got == want {
            Ok(())
        } else {
            Err(format!("{got:?}"))
        }
    });
    t0.elapsed()
}

/// A Service's stored `status.loadBalancer.ingress` as `(ip, ipMode)`.
pub fn ingress(c: &Cluster, name: &str) -> Vec<(String, Option<String>)> {
    stored(c, name)
        .status
        .and_then(|s| s.load_balancer)
        .and_then(|lb| lb.ingress)
        .unwrap_or_default()
        .into_iter()
        .map(|i| (i.ip.unwrap_or_default(), i.ip_mode))
        .collect()
}

/// `status.conditions` entry `nodelb.io/Serving` of Service `name`: `(status, reason, message)`.
pub fn serving_condition(c: &Cluster, name: &str) -> Option<(String, String, String)> {
    stored(c, name)
        .status
        .and_then(|s| s.conditions)
        .unwrap_or_default()
        .into_iter()
        .find(|c| c.type_ == "nodelb.io/Serving")
        .map(|c| (c.status, c.reason, c.message))
}

/// `nodes` nodes with one backend each; short leases so heartbeats, the status Lease and a
/// failover come quickly, and a 2 s resync so a change that makes no event of its own (a
/// sysctl) is seen soon.
pub fn fast_options(nodes: usize) -> ClusterOptions {
    let args = [
        ("--node-lease-duration", "3s"),
        ("--lease-duration", "3s"),
        ("--renew-deadline", "2s"),
        ("--retry-period", "500ms"),
        ("--resync-interval", "2s"),
    ];
    ClusterOptions {
        nodes,
        backends_per_node: 1,
        agent_args: args
            .iter()
            .flat_map(|(k, v)| [k.to_string(), v.to_string()])
            .collect(),
        ..ClusterOptions::default()
    }
}

/// A LoadBalancer Service with one TCP port named `tcp`.
pub fn service(name: &str, port: u16) -> Value {
    json!({
        "apiVersion": "v1", "kind": "Service",
        "metadata": {"name": name},
        "spec": {"type": "LoadBalancer",
                 "ports": [{"name": "tcp", "port": port, "protocol": "TCP"}]},
    })
}

/// An IPv4 EndpointSlice `<svc>-1` with `(backend, ready)` endpoints on the backends' nodes.
pub fn slice(c: &Cluster, svc: &str, endpoints: &[(usize, bool)]) -> Value {
    let eps: Vec<Value> = endpoints
        .iter()
        .map(|(j, ready)| c.endpoint_v4(*j, *ready))
        .collect();
    json!({
        "apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
        "metadata": {"name": format!("{svc}-1"),
                     "labels": {"kubernetes.io/service-name": svc}},
        "addressType": "IPv4",
        "ports": [{"name": "tcp", "port": 8080, "protocol": "TCP"}],
        "endpoints": eps,
    })
}

/// Creates or replaces `obj`, panicking with its kind and name when refused.
pub fn apply(c: &Cluster, obj: Value) {
    let what = format!("{} {}", obj["kind"], obj["metadata"]["name"]);
    c.apply_value(obj)
        .unwrap_or_else(|e| panic!("applying {what}: {e}"));
}

/// Upper bound for an Event to show after the change that causes it.
pub const EVENT_WITHIN: Duration = Duration::from_secs(20);

/// `events.k8s.io/v1` Events in namespace `ns`, as the server stores them.
pub fn events_in(c: &Cluster, ns: &str) -> Vec<Value> {
    if ns == c.namespace() {
        return c.events();
    }
    let api: Api<Event> = Api::namespaced(c.admin().clone(), ns);
    c.block_on(api.list(&ListParams::default()))
        .unwrap_or_else(|e| panic!("listing Events in {ns}: {e}"))
        .items
        .into_iter()
        .map(|e| serde_json::to_value(e).expect("an Event as JSON"))
        .collect()
}

pub fn summary(events: &[Value]) -> String {
    events
        .iter()
        .map(|e| {
            format!(
                "{} {} {}/{}: {}",
                e["metadata"]["name"],
                e["reason"],
                e["regarding"]["kind"],
                e["regarding"]["name"],
                e["note"]
            )
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// Events in `ns` about `kind` `name` with `reason`.
pub fn events_about(c: &Cluster, ns: &str, kind: &str, name: &str, reason: &str) -> Vec<Value> {
    events_in(c, ns)
        .into_iter()
        .filter(|e| {
            e["regarding"]["kind"] == kind
                && e["regarding"]["name"] == name
                && e["reason"] == reason
        })
        .collect()
}

/// Waits for an Event about `kind` `name` with `reason` in `ns` whose note satisfies `note`.
pub fn wait_event(
    c: &Cluster,
    ns: &str,
    kind: &str,
    name: &str,
    reason: &str,
    note: impl Fn(&str) -> bool,
) -> Value {
    let t0 = Instant::now();
    let ev = wait_for(
        &format!("a {reason} Event on {kind} {name} (namespace {ns})"),
        EVENT_WITHIN,
        || {
            events_about(c, ns, kind, name, reason)
                .into_iter()
                .find(|e| note(e["note"].as_str().unwrap_or_default()))
                .ok_or_else(|| format!("none yet; the server has:\n{}", summary(&events_in(c, ns))))
        },
    );
    eprintln!(
        "measured: {reason} on {kind} {name} readable after {:.1} s: {}",
        t0.elapsed().as_secs_f64(),
        ev["note"]
    );
    ev
}
