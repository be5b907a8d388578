//! What the agent exports, read from the agent itself: the metric names a scrape shows. The
//! docs test checks the README against them, the monitoring test the alerts and the dashboard.

use nodelb_agent::metrics::Metrics;
use std::path::PathBuf;

/// The names `agent/src/metrics.rs` registers (without the `nodelb_` prefix the registry
/// adds), read from its source so a metric added there is never missed here: every
/// `register(r, "name", ..)` call.
fn registered_names() -> Vec<String> {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../agent/src/metrics.rs");
    let src = std::fs::read_to_string(&path).unwrap();
    src.split("register(")
        .skip(1)
        .filter_map(|rest| {
            let rest = rest.trim_start();
            let rest = rest
                .strip_prefix("&mut r,")
                .or_else(|| rest.strip_prefix("r,"))?
                .trim_start();
            let rest = rest.strip_prefix('"').expect("a name literal first");
            Some(rest[..rest.find('"').unwrap()].to_string())
        })
        .collect()
}

/// The metric names a scrape shows: counters with their `_total` suffix, others as declared.
/// Families are rendered only once they have a child, so each gets one.
pub fn metric_names() -> Vec<String> {
    let m = Metrics::new();
    m.record_sync(std::time::Duration::from_millis(1), true);
    m.set_hints_ignored(&Default::default());
    m.invalid("Service", "plan");
    m.watch_error("services");
    m.heartbeat_age
        .get_or_create(&nodelb_agent::metrics::NodeLabel {
            node: "node-a".into(),
        })
        .set(1.0);
    m.liveness_readable
        .get_or_create(&nodelb_agent::metrics::SignalLabel { signal: "pods" })
        .set(1);
    m.status_writes
        .get_or_create(&nodelb_agent::metrics::WriteLabel { result: "ok" })
        .inc();
    m.heartbeats
        .get_or_create(&nodelb_agent::metrics::ResultLabel { result: "ok" })
        .inc();
    m.resyncs
        .get_or_create(&nodelb_agent::metrics::ResultLabel {
            result: "unchanged",
        })
        .inc();
    m.listener_reads
        .get_or_create(&nodelb_agent::metrics::ResultLabel { result: "ok" })
        .inc();
    m.conntrack_deleted
        .get_or_create(&nodelb_agent::metrics::FlowLabels {
            family: "IPv4",
            protocol: "UDP",
        })
        .inc();
    m.conntrack_cleanups
        .get_or_create(&nodelb_agent::metrics::ResultLabel { result: "ok" })
        .inc();
    let text = m.render();
    let types: Vec<(String, String)> = text
        .lines()
        .filter_map(|l| l.strip_prefix("# TYPE "))
        .map(|l| {
            let mut parts = l.split_whitespace();
            (
                parts.next().unwrap().to_string(),
                parts.next().unwrap_or("").to_string(),
            )
        })
        .collect();
    let registered = registered_names();
    assert!(registered.len() >= 9, "{registered:?}");
    let kernel = nodelb_agent::metrics::KERNEL_COUNTERS
        .iter()
        .map(|(n, _)| format!("nodelb_{n}_total"));
    registered
        .iter()
        .map(|r| {
            let name = format!("nodelb_{r}");
            let (_, kind) = types.iter().find(|(n, _)| *n == name).unwrap_or_else(|| {
                panic!("{name} is registered but not rendered: give it a sample above\n{text}")
            });
            match kind.as_str() {
                "counter" => format!("{name}_total"),
                _ => name,
            }
        })
        .chain(kernel)
        .collect()
}
