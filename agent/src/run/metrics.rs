//! The agent's Prometheus metrics (`/metrics`), all prefixed `nodelb_`.

use prometheus_client::encoding::text::encode;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::Registry;
use std::time::Duration;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ResultLabel {
    /// `ok` or `error`.
    pub result: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct InvalidLabels {
    /// `Service`, `EndpointSlice` or `Node`.
    pub kind: String,
    /// `decode`: the object does not deserialize; `plan`: the planner found a problem in it.
    pub reason: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct NodeLabel {
    pub node: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct WriteLabel {
    /// `ok`, `error`, `conflict` (another manager got there), `cleared`.
    pub result: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ResourceLabel {
    /// `services`, `endpointslices` or `nodes`.
    pub resource: &'static str,
}

pub struct Metrics {
    registry: Registry,
    pub sync_duration: Histogram,
    pub syncs: Family<ResultLabel, Counter>,
    pub sync_objects: Gauge,
    pub sync_bytes: Gauge,
    pub services_programmed: Gauge,
    pub endpoints_programmed: Gauge,
    pub drift_repairs: Counter,
    pub invalid_objects: Family<InvalidLabels, Counter>,
    pub watch_errors: Family<ResourceLabel, Counter>,
    pub leader: Gauge,
    pub lease_transitions: Gauge,
    pub heartbeat_age: Family<NodeLabel, Gauge<f64, std::sync::atomic::AtomicU64>>,
    pub status_writes: Family<WriteLabel, Counter>,
    pub heartbeats: Family<ResultLabel, Counter>,
}

impl Default for Metrics {
    fn default() -> Metrics {
        Metrics::new()
    }
}

impl Metrics {
    pub fn new() -> Metrics {
        let mut registry = Registry::with_prefix("nodelb");
        // 1 ms .. ~16 s.
        let sync_duration = Histogram::new(exponential_buckets(0.001, 2.0, 15));
        let syncs = Family::<ResultLabel, Counter>::default();
        let sync_objects = Gauge::default();
        let sync_bytes = Gauge::default();
        let services_programmed = Gauge::default();
        let endpoints_programmed = Gauge::default();
        let drift_repairs = Counter::default();
        let invalid_objects = Family::<InvalidLabels, Counter>::default();
        let watch_errors = Family::<ResourceLabel, Counter>::default();
        let leader = Gauge::default();
        let lease_transitions = Gauge::default();
        let heartbeat_age =
            Family::<NodeLabel, Gauge<f64, std::sync::atomic::AtomicU64>>::default();
        let status_writes = Family::<WriteLabel, Counter>::default();
        let heartbeats = Family::<ResultLabel, Counter>::default();
        registry.register(
            "leader",
            "1 while this agent holds the Lease nodelb-status and writes Service status",
            leader.clone(),
        );
        registry.register(
            "lease_transitions",
            "leaseTransitions of the Lease nodelb-status as last seen",
            lease_transitions.clone(),
        );
        registry.register(
            "heartbeat_age_seconds",
            "Age of each node's heartbeat Lease, as seen by the leader",
            heartbeat_age.clone(),
        );
        registry.register(
            "status_writes",
            "Service status writes by the leader, by result",
            status_writes.clone(),
        );
        registry.register(
            "heartbeats",
            "Renewals of this node's heartbeat Lease, by result",
            heartbeats.clone(),
        );
        registry.register(
            "sync_duration_seconds",
            "Time of one sync: plan, encode and commit",
            sync_duration.clone(),
        );
        registry.register("syncs", "Syncs by result", syncs.clone());
        registry.register(
            "sync_objects",
            "Objects (table, chains, rules, sets, elements) in the tables of the last committed sync",
            sync_objects.clone(),
        );
        registry.register(
            "sync_bytes",
            "Bytes of the netlink batch of the last committed sync",
            sync_bytes.clone(),
        );
        registry.register(
            "services_programmed",
            "Services with rules on this node",
            services_programmed.clone(),
        );
        registry.register(
            "endpoints_programmed",
            "Endpoints behind programmed Service ports, summed over families and ports",
            endpoints_programmed.clone(),
        );
        registry.register(
            "drift_repairs",
            "Full replaces because another process changed nodelb's tables",
            drift_repairs.clone(),
        );
        registry.register(
            "invalid_objects",
            "Problems found in input objects, one per new problem",
            invalid_objects.clone(),
        );
        registry.register(
            "watch_errors",
            "Errors of the Kubernetes watches",
            watch_errors.clone(),
        );
        Metrics {
            registry,
            sync_duration,
            syncs,
            sync_objects,
            sync_bytes,
            services_programmed,
            endpoints_programmed,
            drift_repairs,
            invalid_objects,
            watch_errors,
            leader,
            lease_transitions,
            heartbeat_age,
            status_writes,
            heartbeats,
        }
    }

    pub fn record_sync(&self, took: Duration, ok: bool) {
        self.sync_duration.observe(took.as_secs_f64());
        let result = if ok { "ok" } else { "error" };
        self.syncs.get_or_create(&ResultLabel { result }).inc();
    }

    pub fn invalid(&self, kind: impl ToString, reason: &'static str) {
        self.invalid_objects
            .get_or_create(&InvalidLabels {
                kind: kind.to_string(),
                reason,
            })
            .inc();
    }

    pub fn watch_error(&self, resource: &'static str) {
        self.watch_errors
            .get_or_create(&ResourceLabel { resource })
            .inc();
    }

    /// The text exposition (OpenMetrics text, which Prometheus scrapes).
    pub fn render(&self) -> String {
        let mut out = String::new();
        encode(&mut out, &self.registry).expect("writing to a String cannot fail");
        out
    }
}

/// The Content-Type of [`Metrics::render`].
pub const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_every_metric_with_its_name_and_labels() {
        let m = Metrics::new();
        m.record_sync(Duration::from_millis(3), true);
        m.record_sync(Duration::from_millis(3), false);
        m.sync_objects.set(42);
        m.sync_bytes.set(4096);
        m.services_programmed.set(2);
        m.endpoints_programmed.set(5);
        m.drift_repairs.inc();
        m.invalid("Service", "plan");
        m.watch_error("endpointslices");
        m.leader.set(1);
        m.lease_transitions.set(3);
        m.heartbeat_age
            .get_or_create(&NodeLabel {
                node: "node-a".into(),
            })
            .set(1.5);
        m.status_writes
            .get_or_create(&WriteLabel { result: "ok" })
            .inc();
        m.heartbeats
            .get_or_create(&ResultLabel { result: "ok" })
            .inc();
        let text = m.render();
        for line in [
            "# TYPE nodelb_sync_duration_seconds histogram",
            "nodelb_sync_duration_seconds_count 2",
            "nodelb_syncs_total{result=\"ok\"} 1",
            "nodelb_syncs_total{result=\"error\"} 1",
            "nodelb_sync_objects 42",
            "nodelb_sync_bytes 4096",
            "nodelb_services_programmed 2",
            "nodelb_endpoints_programmed 5",
            "nodelb_drift_repairs_total 1",
            "nodelb_invalid_objects_total{kind=\"Service\",reason=\"plan\"} 1",
            "nodelb_watch_errors_total{resource=\"endpointslices\"} 1",
            "nodelb_leader 1",
            "nodelb_lease_transitions 3",
            "nodelb_heartbeat_age_seconds{node=\"node-a\"} 1.5",
            "nodelb_status_writes_total{result=\"ok\"} 1",
            "nodelb_heartbeats_total{result=\"ok\"} 1",
            "# EOF",
        ] {
            assert!(
                text.lines().any(|l| l == line),
                "missing {line:?} in\n{text}"
            );
        }
        assert!(
            text.contains("nodelb_sync_duration_seconds_bucket{le=\"0.004\"} 2"),
            "{text}"
        );
    }
}
