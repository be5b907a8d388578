//! `manifests/monitoring/` keeps up with the agent: the alerts pass `promtool check rules`, so
//! do the dashboard's queries (checked as recording rules), every metric they name is one the
//! agent exports, every alert has its runbook line in the README, and the PodMonitor scrapes
//! the DaemonSet's metrics port.
//!
//! `promtool` comes from Debian's `prometheus` package: `scripts/deps.sh` unpacks it into the
//! cache and `scripts/test.sh` puts it on `PATH`. Without it the promtool test skips with a
//! message, and fails under `CI=true`.

use nodelb_integration::exported::metric_names;
use serde::Deserialize;
use serde_json::Value;
use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command;

fn monitoring() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../manifests/monitoring")
}

fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_else(|e| panic!("reading {}: {e}", path.display()))
}

fn yaml(path: &Path) -> Value {
    Value::deserialize(serde_yaml_ng::Deserializer::from_str(&read(path)))
        .unwrap_or_else(|e| panic!("parsing {}: {e}", path.display()))
}

/// The PrometheusRule's `spec` (its `groups`).
fn rule_spec() -> Value {
    let rule = yaml(&monitoring().join("prometheusrule.yaml"));
    assert_eq!(rule["apiVersion"], "monitoring.coreos.com/v1");
    assert_eq!(rule["kind"], "PrometheusRule");
    rule["spec"].clone()
}

/// Every rule of the PrometheusRule: `(alert name, expr)`.
fn alerts() -> Vec<(String, String)> {
    let spec = rule_spec();
    let groups = spec["groups"].as_array().expect("spec.groups");
    let alerts: Vec<(String, String)> = groups
        .iter()
        .flat_map(|g| g["rules"].as_array().expect("a group's rules").iter())
        .map(|r| {
            let name = r["alert"].as_str().expect("every rule is an alert");
            let expr = r["expr"].as_str().expect("an alert's expr");
            (name.to_string(), expr.to_string())
        })
        .collect();
    assert!(alerts.len() >= 6, "{alerts:?}");
    alerts
}

/// The queries of the Grafana dashboard's panels.
fn dashboard_queries() -> Vec<String> {
    let path = monitoring().join("grafana-dashboard.json");
    let dash: Value = serde_json::from_str(&read(&path))
        .unwrap_or_else(|e| panic!("parsing {}: {e}", path.display()));
    let queries: Vec<String> = dash["panels"]
        .as_array()
        .expect("panels")
        .iter()
        .flat_map(|p| p["targets"].as_array().expect("a panel's targets").iter())
        .map(|t| t["expr"].as_str().expect("a target's expr").to_string())
        .collect();
    assert!(queries.len() >= 10, "{queries:?}");
    queries
}

/// The `nodelb_*` metric names a query uses.
fn names_in(expr: &str) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    for (i, _) in expr.match_indices("nodelb_") {
        if expr[..i].ends_with(|c: char| c.is_ascii_alphanumeric() || c == '_') {
            continue;
        }
        let name: String = expr[i..]
            .chars()
            .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
            .collect();
        out.insert(name);
    }
    out
}

/// The names in `exprs` that are not a series of an exported metric (a histogram's series are
/// its `_bucket`, `_sum` and `_count`).
fn unknown_names(exprs: &[String], exported: &[String]) -> Vec<String> {
    let series: BTreeSet<String> = exported
        .iter()
        .flat_map(|m| {
            ["", "_bucket", "_sum", "_count"]
                .into_iter()
                .map(move |s| format!("{m}{s}"))
        })
        .collect();
    exprs
        .iter()
        .flat_map(|e| names_in(e))
        .filter(|n| !series.contains(n))
        .collect()
}

#[test]
fn the_metric_check_catches_a_metric_the_agent_does_not_export() {
    let exported = vec![
        "nodelb_syncs_total".to_string(),
        "nodelb_sync_duration_seconds".to_string(),
    ];
    let exprs = vec![
        "rate(nodelb_syncs_total[5m]) + rate(nodelb_sync_duration_seconds_bucket[5m])".to_string(),
        "xnodelb_other + nodelb_sync_duration_seconds_count".to_string(),
    ];
    assert!(unknown_names(&exprs, &exported).is_empty());
    let bad = vec!["rate(nodelb_syncs[5m]) > nodelb_sync_errors_total".to_string()];
    assert_eq!(
        unknown_names(&bad, &exported),
        vec!["nodelb_sync_errors_total", "nodelb_syncs"]
    );
}

#[test]
fn alerts_and_dashboard_name_only_metrics_the_agent_exports() {
    let exported = metric_names();
    let mut exprs: Vec<String> = alerts().into_iter().map(|(_, e)| e).collect();
    exprs.extend(dashboard_queries());
    let unknown = unknown_names(&exprs, &exported);
    assert!(
        unknown.is_empty(),
        "manifests/monitoring names metrics the agent does not export: {unknown:?}\nexported: {exported:?}"
    );
    // Each query names at least one of nodelb's metrics.
    for e in &exprs {
        assert!(!names_in(e).is_empty(), "{e}");
    }
}

#[test]
fn rules_and_dashboard_queries_pass_promtool() {
    let ci = std::env::var("CI").is_ok_and(|v| v == "true");
    if Command::new("promtool").arg("--version").output().is_err() {
        assert!(
            !ci,
            "promtool is not on PATH (scripts/deps.sh unpacks it; scripts/test.sh adds it to PATH)"
        );
        eprintln!("skipping rules_and_dashboard_queries_pass_promtool: no promtool on PATH (run scripts/deps.sh)");
        return;
    }
    let dir = std::env::temp_dir().join(format!("nodelb-monitoring-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let rules = dir.join("rules.yaml");
    std::fs::write(&rules, serde_yaml_ng::to_string(&rule_spec()).unwrap()).unwrap();
    // The dashboard's queries as recording rules: promtool parses each.
    let recorded: Vec<Value> = dashboard_queries()
        .into_iter()
        .enumerate()
        .map(
            |(i, q)| serde_json::json!({"record": format!("nodelb:dashboard:query{i}"), "expr": q}),
        )
        .collect();
    let queries = dir.join("dashboard.yaml");
    let doc = serde_json::json!({"groups": [{"name": "dashboard", "rules": recorded}]});
    std::fs::write(&queries, serde_yaml_ng::to_string(&doc).unwrap()).unwrap();
    for file in [&rules, &queries] {
        let out = Command::new("promtool")
            .args(["check", "rules"])
            .arg(file)
            .output()
            .unwrap();
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(
            out.status.success(),
            "promtool check rules {}: {text}",
            file.display()
        );
        assert!(text.contains("SUCCESS"), "{text}");
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn every_alert_has_a_runbook_line_in_the_readme() {
    let readme = read(&PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../README.md"));
    let section = readme
        .split("\n## Alerts")
        .nth(1)
        .and_then(|s| s.split("\n## ").next())
        .expect("README.md has an Alerts section");
    for (name, _) in alerts() {
        assert!(
            section.lines().any(|l| l.contains(&format!("`{name}`"))),
            "README.md, Alerts, has no runbook line for {name}"
        );
    }
}

#[test]
fn the_podmonitor_scrapes_the_daemonsets_metrics_port() {
    let pm = yaml(&monitoring().join("podmonitor.yaml"));
    assert_eq!(pm["kind"], "PodMonitor");
    let ds = yaml(&monitoring().join("../base/daemonset.yaml"));
    assert_eq!(pm["metadata"]["namespace"], ds["metadata"]["namespace"]);
    let pod_labels = ds["spec"]["template"]["metadata"]["labels"]
        .as_object()
        .expect("pod labels");
    for (k, v) in pm["spec"]["selector"]["matchLabels"]
        .as_object()
        .expect("matchLabels")
    {
        assert_eq!(pod_labels.get(k), Some(v), "the PodMonitor selects {k}={v}");
    }
    let port = pm["spec"]["podMetricsEndpoints"][0]["port"]
        .as_str()
        .expect("a named port");
    let containers = ds["spec"]["template"]["spec"]["containers"]
        .as_array()
        .unwrap();
    let agent = containers.iter().find(|c| c["name"] == "agent").unwrap();
    assert!(
        agent["ports"]
            .as_array()
            .unwrap()
            .iter()
            .any(|p| p["name"] == port && p["containerPort"] == 9255),
        "the agent container has no port {port} on 9255"
    );
}
