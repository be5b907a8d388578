//! The Helm chart `charts/nodelb/` against the manifests and the agent: `helm lint` passes; with
//! default values `helm template` renders the objects `kubectl kustomize manifests/` builds
//! (modulo Helm's labels), `hardened` those of `manifests/hardened/`, the monitoring toggles
//! those of `manifests/monitoring/`; values become the agent's flags; the uninstall hook is
//! `manifests/cleanup/`'s cleanup, run by a Job the agent's CLI accepts. The pinned `helm` and
//! `kubectl` (scripts/helm.sh, scripts/kubernetes.sh). No root, no cluster: the chart is
//! installed on the real cluster by `tests/cluster.rs`.

use clap::Parser;
use nodelb_agent::cli::{Cli, Command, RunArgs};
use serde_json::{json, Value};
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::Command as Process;

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn chart() -> String {
    repo().join("charts/nodelb").display().to_string()
}

/// The labels Helm's objects carry beside nodelb's own (the chart's `nodelb.labels`).
const HELM_LABELS: [&str; 4] = [
    "helm.sh/chart",
    "app.kubernetes.io/managed-by",
    "app.kubernetes.io/instance",
    "app.kubernetes.io/version",
];

/// Runs a tool; its stdout, or a panic with its stderr.
fn run(tool: PathBuf, args: &[&str]) -> String {
    let out = Process::new(&tool)
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("running {}: {e}", tool.display()));
    assert!(
        out.status.success(),
        "{} {}: {}{}",
        tool.display(),
        args.join(" "),
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

fn helm(args: &[&str]) -> String {
    run(
        nodelb_integration::control_plane::helm().unwrap_or_else(|e| panic!("{e}")),
        args,
    )
}

/// `kind namespace/name` → object, of a multi-document YAML text.
fn objects(text: &str) -> BTreeMap<String, Value> {
    let mut out = BTreeMap::new();
    for v in nodelb_integration::e2e::parse_documents(text) {
        let at = |p: &str| {
            v.pointer(p)
                .and_then(Value::as_str)
                .unwrap_or("")
                .to_string()
        };
        let id = format!(
            "{} {}/{}",
            at("/kind"),
            at("/metadata/namespace"),
            at("/metadata/name")
        );
        assert!(out.insert(id.clone(), v).is_none(), "{id} twice");
    }
    out
}

/// What `kubectl kustomize manifests/<dir>` builds.
fn kustomize(dir: &str) -> BTreeMap<String, Value> {
    let kubectl = nodelb_integration::control_plane::kubectl().unwrap_or_else(|e| panic!("{e}"));
    let dir = repo().join("manifests").join(dir).display().to_string();
    objects(&run(kubectl, &["kustomize", &dir]))
}

/// `helm template` of the chart with `--set` values (and its hooks unless `no_hooks`), Helm's
/// labels removed; every object must carry them before.
fn template(set: &[&str], no_hooks: bool) -> BTreeMap<String, Value> {
    let chart = chart();
    let mut args = vec!["template", "nodelb", &chart];
    if no_hooks {
        args.push("--no-hooks");
    }
    for s in set {
        args.extend(["--set", s]);
    }
    let mut out = objects(&helm(&args));
    for (id, o) in out.iter_mut() {
        let labels = o
            .pointer_mut("/metadata/labels")
            .and_then(Value::as_object_mut)
            .unwrap_or_else(|| panic!("{id} has no labels"));
        for l in HELM_LABELS {
            assert!(labels.remove(l).is_some(), "{id} lacks Helm's label {l}");
        }
    }
    out
}

/// The chart's objects that are not hooks, and its hooks with their annotations removed.
fn split_hooks(all: BTreeMap<String, Value>) -> (BTreeMap<String, Value>, BTreeMap<String, Value>) {
    let (mut hooks, plain): (BTreeMap<_, _>, BTreeMap<_, _>) = all
        .into_iter()
        .partition(|(_, o)| o.pointer("/metadata/annotations/helm.sh~1hook").is_some());
    for (id, o) in hooks.iter_mut() {
        let meta = o["metadata"].as_object_mut().unwrap();
        let annotations = meta.remove("annotations").unwrap();
        assert_eq!(
            annotations["helm.sh/hook"], "pre-delete",
            "{id}: the uninstall runs before Helm deletes the release"
        );
        // A failed uninstall keeps its Job and cleanup DaemonSet to read, never its rights.
        let policy = match id.split(' ').next() {
            Some("Job" | "DaemonSet") => "before-hook-creation,hook-succeeded",
            _ => "before-hook-creation,hook-succeeded,hook-failed",
        };
        assert_eq!(annotations["helm.sh/hook-delete-policy"], policy, "{id}");
    }
    (plain, hooks)
}

fn the_args(o: &Value, container: &str) -> Vec<String> {
    let containers = o
        .pointer("/spec/template/spec/containers")
        .and_then(Value::as_array)
        .unwrap();
    let c = containers
        .iter()
        .find(|c| c["name"] == container)
        .unwrap_or_else(|| panic!("no container {container}"));
    serde_json::from_value(c["args"].clone()).unwrap()
}

fn parse(args: Vec<String>) -> Command {
    Cli::try_parse_from(std::iter::once("nodelb-agent".to_string()).chain(args))
        .unwrap_or_else(|e| panic!("the container's arguments do not parse: {e}"))
        .command
}

fn run_args(set: &[&str]) -> RunArgs {
    let out = template(set, true);
    let mut args = the_args(&out["DaemonSet nodelb-system/nodelb-agent"], "agent");
    args.extend(["--node-name".into(), "node-under-test".into()]);
    match parse(args) {
        Command::Run(r) => *r,
        other => panic!("the agent runs `run`, not {other:?}"),
    }
}

#[test]
fn chart_passes_helm_lint() {
    let chart = chart();
    for set in ["hardened=false", "hardened=true,ipv6=true,monitoring.podMonitor.enabled=true,monitoring.prometheusRule.enabled=true,monitoring.dashboard.enabled=true"] {
        let out = helm(&["lint", "--strict", &chart, "--set", set]);
        println!("helm lint --strict --set {set}: {}", out.lines().last().unwrap_or(""));
        assert!(out.contains("0 chart(s) failed"), "{out}");
    }
}

#[test]
fn default_values_render_what_kubectl_kustomize_builds() {
    let ours = template(&[], true);
    let theirs = kustomize(".");
    assert_eq!(
        ours.keys().collect::<Vec<_>>(),
        theirs.keys().collect::<Vec<_>>(),
        "the same objects"
    );
    for (id, o) in &theirs {
        assert_eq!(&ours[id], o, "{id}: the chart and manifests/ differ");
    }
    println!("measured: {} objects, the same in both", ours.len());
}

#[test]
fn hardened_value_renders_the_hardened_overlay() {
    assert_eq!(template(&["hardened=true"], true), kustomize("hardened"));
}

#[test]
fn monitoring_values_render_manifests_monitoring_and_the_dashboard() {
    let set = [
        "monitoring.podMonitor.enabled=true",
        "monitoring.prometheusRule.enabled=true",
        "monitoring.dashboard.enabled=true",
    ];
    let mut ours = template(&set, true);
    let mut dashboard = ours
        .remove("ConfigMap nodelb-system/nodelb-dashboard")
        .expect("the dashboard's ConfigMap");
    for (id, o) in kustomize("monitoring") {
        assert_eq!(ours.remove(&id).as_ref(), Some(&o), "{id}");
    }
    assert_eq!(
        ours,
        template(&[], true),
        "nothing else changes with the monitoring values"
    );
    let file = repo().join("manifests/monitoring/grafana-dashboard.json");
    let file: Value = serde_json::from_str(&std::fs::read_to_string(file).unwrap()).unwrap();
    let data: Value =
        serde_json::from_str(dashboard["data"]["nodelb.json"].as_str().unwrap()).unwrap();
    assert_eq!(
        data, file,
        "the ConfigMap carries manifests/monitoring's dashboard"
    );
    assert_eq!(
        dashboard["metadata"]["labels"]
            .as_object_mut()
            .unwrap()
            .remove("grafana_dashboard"),
        Some(json!("1")),
        "the label Grafana's sidecar finds dashboards by"
    );
}

/// The agent's `run` with these flags, as clap parses them.
fn agent_run(flags: &[&str]) -> RunArgs {
    let args = ["run", "--node-name", "node-under-test"]
        .iter()
        .chain(flags);
    match parse(args.map(|a| a.to_string()).collect()) {
        Command::Run(r) => *r,
        _ => unreachable!(),
    }
}

#[test]
fn values_become_the_agents_flags() {
    let cases: [(&[&str], &[&str]); 4] = [
        (&[], &[]),
        (
            &[
                "ipv4=false",
                "ipv6=true",
                "defaultClass=false",
                "lbClass=example.com/lb",
                "reservedPorts=22",
                "extraArgs={--address-types=ExternalIP}",
            ],
            &[
                "--ipv4=false",
                "--ipv6",
                "--default-class=false",
                "--lb-class=example.com/lb",
                "--reserved-ports=22",
                "--address-types=ExternalIP",
            ],
        ),
        (&["reservedPorts="], &["--reserved-ports="]),
        (&["hardened=true", "resources.limits.memory=1Gi"], &[]),
    ];
    for (values, flags) in cases {
        let ours = format!("{:?}", run_args(values));
        assert_eq!(ours, format!("{:?}", agent_run(flags)), "values {values:?}");
        if !flags.is_empty() {
            assert_ne!(
                ours,
                format!("{:?}", agent_run(&[])),
                "values {values:?} change the agent"
            );
        }
    }
}

#[test]
fn uninstall_hook_is_the_cleanup_of_manifests_cleanup_run_by_clear_status() {
    let (plain, mut hooks) = split_hooks(template(&[], false));
    assert_eq!(
        plain,
        template(&[], true),
        "the hooks are the only addition"
    );
    let cleanup = kustomize("cleanup");
    assert_eq!(
        hooks.remove("DaemonSet nodelb-system/nodelb-cleanup"),
        cleanup
            .get("DaemonSet nodelb-system/nodelb-cleanup")
            .cloned(),
        "the cleanup DaemonSet is manifests/cleanup/'s"
    );
    // The hook stops the agents by deleting their DaemonSet: it may change no DaemonSet.
    let role = &hooks["Role nodelb-system/nodelb-uninstall"];
    for rule in role["rules"].as_array().unwrap() {
        if rule["resources"] == json!(["daemonsets"]) {
            let verbs = rule["verbs"].as_array().unwrap();
            assert!(
                verbs.iter().all(|v| v == "get" || v == "delete"),
                "the hook reads and deletes DaemonSets, nothing else: {rule}"
            );
            if verbs.contains(&json!("delete")) {
                assert_eq!(rule["resourceNames"], json!(["nodelb-agent"]), "{rule}");
            }
        }
    }
    let job = hooks
        .remove("Job nodelb-system/nodelb-uninstall")
        .expect("the uninstall Job");
    match parse(the_args(&job, "clear-status")) {
        Command::ClearStatus(a) => {
            assert_eq!(a.lease_namespace, "nodelb-system");
            assert_eq!(a.stop_agents.as_deref(), Some("nodelb-agent"));
            assert_eq!(a.wait_for_cleanup.as_deref(), Some("nodelb-cleanup"));
        }
        other => panic!("the Job runs clear-status, not {other:?}"),
    }
    assert_eq!(
        job.pointer("/spec/template/spec/serviceAccountName"),
        Some(&json!("nodelb-uninstall"))
    );
    let kinds: Vec<&str> = hooks.keys().map(|k| k.split(' ').next().unwrap()).collect();
    assert_eq!(
        kinds,
        [
            "ClusterRole",
            "ClusterRoleBinding",
            "Role",
            "RoleBinding",
            "ServiceAccount"
        ],
        "besides, only the Job's ServiceAccount and rights: {hooks:#?}"
    );
    let none = template(&["uninstall.enabled=false"], false);
    assert_eq!(none, plain, "uninstall.enabled=false renders no hook");
}

/// Every right the manifests and the chart grant, one line each: `<Kind> [<namespace>/]<name>:
/// <resource>.<apiGroup>[<names>] <verb>` for a rule (kubectl's spelling: no group for the
/// core one), `<url> <verb>` for a non-resource URL, `<Kind> [<namespace>/]<name>: <role> ->
/// <subject>` for a binding.
fn rights(objects: &BTreeMap<String, Value>) -> std::collections::BTreeSet<String> {
    let strings = |v: &Value| -> Vec<String> {
        v.as_array()
            .map(|a| {
                a.iter()
                    .filter_map(Value::as_str)
                    .map(str::to_string)
                    .collect()
            })
            .unwrap_or_default()
    };
    let mut out = std::collections::BTreeSet::new();
    for o in objects.values() {
        let kind = o["kind"].as_str().unwrap_or("");
        let at = |p: &str| {
            o.pointer(p)
                .and_then(Value::as_str)
                .unwrap_or("")
                .to_string()
        };
        let who = match at("/metadata/namespace") {
            ns if ns.is_empty() => format!("{kind} {}", at("/metadata/name")),
            ns => format!("{kind} {ns}/{}", at("/metadata/name")),
        };
        match kind {
            "Role" | "ClusterRole" => {
                for rule in o["rules"].as_array().into_iter().flatten() {
                    let names = strings(&rule["resourceNames"]);
                    let names = match names.is_empty() {
                        true => String::new(),
                        false => format!("[{}]", names.join(",")),
                    };
                    let mut targets: Vec<String> = strings(&rule["nonResourceURLs"]);
                    for g in strings(&rule["apiGroups"]) {
                        for r in strings(&rule["resources"]) {
                            // kubectl's spelling: `leases.coordination.k8s.io`, `services`.
                            let group = if g.is_empty() {
                                String::new()
                            } else {
                                format!(".{g}")
                            };
                            targets.push(format!("{r}{group}{names}"));
                        }
                    }
                    for t in &targets {
                        for v in strings(&rule["verbs"]) {
                            out.insert(format!("{who}: {t} {v}"));
                        }
                    }
                }
            }
            "RoleBinding" | "ClusterRoleBinding" => {
                for s in o["subjects"].as_array().into_iter().flatten() {
                    let sub = |k: &str| s[k].as_str().unwrap_or("").to_string();
                    out.insert(format!(
                        "{who}: {} {} -> {} {}/{}",
                        at("/roleRef/kind"),
                        at("/roleRef/name"),
                        sub("kind"),
                        sub("namespace"),
                        sub("name")
                    ));
                }
            }
            _ => {}
        }
    }
    out
}

/// Issue 39: a new right is a conscious change. Every right of `manifests/` (each overlay) and
/// of the chart (every toggle on, its uninstall hook included) is in `manifests/rights.txt`,
/// and every line there is still granted somewhere.
#[test]
fn every_right_granted_is_in_the_reviewed_list() {
    let mut granted = std::collections::BTreeSet::new();
    for dir in ["", "base", "hardened", "apf", "cleanup", "monitoring"] {
        granted.extend(rights(&kustomize(dir)));
    }
    let all = [
        "hardened=true",
        "monitoring.podMonitor.enabled=true",
        "monitoring.prometheusRule.enabled=true",
        "monitoring.dashboard.enabled=true",
        "uninstall.enabled=true",
    ];
    granted.extend(rights(&template(&all, false)));
    let path = repo().join("manifests/rights.txt");
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let reviewed: std::collections::BTreeSet<String> = text
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .map(str::to_string)
        .collect();
    let new: Vec<&String> = granted.difference(&reviewed).collect();
    let gone: Vec<&String> = reviewed.difference(&granted).collect();
    assert!(
        new.is_empty() && gone.is_empty(),
        "the rights granted differ from manifests/rights.txt (review them, then change the list)\n\
         granted, not listed:\n{}\nlisted, not granted:\n{}",
        new.iter()
            .map(|l| format!("  {l}"))
            .collect::<Vec<_>>()
            .join("\n"),
        gone.iter()
            .map(|l| format!("  {l}"))
            .collect::<Vec<_>>()
            .join("\n"),
    );
}
