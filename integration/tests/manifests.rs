//! The manifests under `manifests/` against the agent they install: every document decodes into
//! its k8s-openapi type without losing a field; the DaemonSet's ports, probes and environment
//! follow the agent's CLI; the hardened overlay narrows the security context and changes nothing
//! else; the cleanup DaemonSet runs `nodelb-agent cleanup` on every node; the RBAC grants exactly
//! the reviewed list of the agent's requests (`nodelb_integration::rbac_expectations`). No root,
//! no cluster.

use clap::{CommandFactory, Parser};
use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::{Container, Namespace, PodSpec, Probe, Secret, ServiceAccount};
use k8s_openapi::api::flowcontrol::v1::{FlowSchema, PriorityLevelConfiguration};
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding, Role, RoleBinding};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use nodelb_agent::cli::{Cli, Command, RunArgs};
use nodelb_integration::{rbac_expectations, Scope, KUBELET_LEASE_NAMESPACE};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

fn manifests() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../manifests")
}

const KUSTOMIZATION: &str = "kustomization.yaml";

/// Every `.yaml`/`.yml` file under `dir`, sorted.
fn yaml_files(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut dirs = vec![dir.to_path_buf()];
    while let Some(d) = dirs.pop() {
        for entry in
            std::fs::read_dir(&d).unwrap_or_else(|e| panic!("reading {}: {e}", d.display()))
        {
            let path = entry.unwrap().path();
            if path.is_dir() {
                dirs.push(path);
            } else if matches!(
                path.extension().and_then(|e| e.to_str()),
                Some("yaml" | "yml")
            ) {
                out.push(path);
            }
        }
    }
    out.sort();
    out
}

/// The documents of a (multi-document) YAML file, empty ones left out.
fn documents(path: &Path) -> Vec<Value> {
    let text =
        std::fs::read_to_string(path).unwrap_or_else(|e| panic!("reading {}: {e}", path.display()));
    serde_yaml_ng::Deserializer::from_str(&text)
        .map(|doc| {
            Value::deserialize(doc).unwrap_or_else(|e| panic!("parsing {}: {e}", path.display()))
        })
        .filter(|v| !v.is_null())
        .collect()
}

fn str_at<'a>(v: &'a Value, pointer: &str) -> &'a str {
    v.pointer(pointer).and_then(Value::as_str).unwrap_or("")
}

/// `kind namespace/name` of an object, for messages.
fn describe(v: &Value) -> String {
    format!(
        "{} {}/{}",
        str_at(v, "/kind"),
        str_at(v, "/metadata/namespace"),
        str_at(v, "/metadata/name")
    )
}

/// Decodes `v` into `K` and encodes it back: equal only when k8s-openapi knew every field, so a
/// misspelt or misplaced field (which the API server would drop or reject) fails here.
fn decode<K: DeserializeOwned + Serialize>(v: &Value, path: &Path) -> K {
    let k: K = serde_json::from_value(v.clone())
        .unwrap_or_else(|e| panic!("{} in {}: {e}", describe(v), path.display()));
    let back = serde_json::to_value(&k).unwrap();
    assert_eq!(
        &back,
        v,
        "{} in {} does not survive decoding: a field is unknown or mistyped",
        describe(v),
        path.display()
    );
    k
}

/// The kinds nodelb's manifests may hold, decoded.
#[derive(Debug, Clone)]
enum Object {
    Namespace(Box<Namespace>),
    ServiceAccount(Box<ServiceAccount>),
    /// A ServiceAccount token Secret (the monitoring scraper's): the only Secret the manifests
    /// hold, with no data of their own.
    Secret,
    ClusterRole(Box<ClusterRole>),
    ClusterRoleBinding(Box<ClusterRoleBinding>),
    Role(Box<Role>),
    RoleBinding(Box<RoleBinding>),
    DaemonSet(Box<DaemonSet>),
    Job(Box<Job>),
    FlowSchema(Box<FlowSchema>),
    PriorityLevelConfiguration(Box<PriorityLevelConfiguration>),
    /// The Prometheus Operator's kinds (`manifests/monitoring/`), which k8s-openapi does not
    /// know; `tests/monitoring.rs` checks what they say.
    Monitoring,
}

fn decode_object(v: &Value, path: &Path) -> Object {
    match str_at(v, "/kind") {
        "Namespace" => Object::Namespace(decode(v, path)),
        "ServiceAccount" => Object::ServiceAccount(decode(v, path)),
        "ClusterRole" => Object::ClusterRole(decode(v, path)),
        "ClusterRoleBinding" => Object::ClusterRoleBinding(decode(v, path)),
        "Role" => Object::Role(decode(v, path)),
        "RoleBinding" => Object::RoleBinding(decode(v, path)),
        "DaemonSet" => Object::DaemonSet(decode(v, path)),
        "Job" => Object::Job(decode(v, path)),
        "FlowSchema" => Object::FlowSchema(decode(v, path)),
        "PriorityLevelConfiguration" => Object::PriorityLevelConfiguration(decode(v, path)),
        "Secret" => {
            let secret: Secret = decode(v, path);
            assert_eq!(
                secret.type_.as_deref(),
                Some("kubernetes.io/service-account-token"),
                "{}: the manifests carry no secret of their own",
                describe(v)
            );
            assert!(secret.data.is_none() && secret.string_data.is_none());
            Object::Secret
        }
        "PodMonitor" | "PrometheusRule" => {
            assert_eq!(
                str_at(v, "/apiVersion"),
                "monitoring.coreos.com/v1",
                "{}",
                describe(v)
            );
            Object::Monitoring
        }
        other => panic!(
            "{}: kind {other:?} is not one this test decodes; add it",
            path.display()
        ),
    }
}

/// The fields of a kustomization this test understands. Anything else fails, so the emulation
/// below never silently skips something kustomize would do.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct Kustomization {
    api_version: String,
    kind: String,
    #[serde(default)]
    resources: Vec<String>,
    #[serde(default)]
    patches: Vec<PatchRef>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct PatchRef {
    path: String,
    target: PatchTarget,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct PatchTarget {
    group: String,
    version: String,
    kind: String,
    name: String,
}

fn kustomization(dir: &Path) -> Kustomization {
    let path = dir.join(KUSTOMIZATION);
    let docs = documents(&path);
    assert_eq!(docs.len(), 1, "{}: one document", path.display());
    let k: Kustomization = serde_json::from_value(docs[0].clone())
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    assert_eq!(k.api_version, "kustomize.config.k8s.io/v1beta1");
    assert_eq!(k.kind, "Kustomization");
    k
}

/// What `kubectl kustomize dir` builds, for the subset of kustomize these manifests use:
/// `resources` (files, or directories with a kustomization) and `patches` of JSON 6902
/// operations aimed at one object. Also returns every file the build read.
fn kustomize(dir: &Path, read: &mut BTreeSet<PathBuf>) -> Vec<Value> {
    let dir = dir.canonicalize().unwrap();
    read.insert(dir.join(KUSTOMIZATION));
    let k = kustomization(&dir);
    let mut objects = Vec::new();
    for r in &k.resources {
        let p = dir
            .join(r)
            .canonicalize()
            .unwrap_or_else(|e| panic!("{}: resource {r}: {e}", dir.join(KUSTOMIZATION).display()));
        if p.is_dir() {
            objects.extend(kustomize(&p, read));
        } else {
            read.insert(p.clone());
            objects.extend(documents(&p));
        }
    }
    for patch in &k.patches {
        let p = dir.join(&patch.path).canonicalize().unwrap();
        read.insert(p.clone());
        let ops = documents(&p);
        assert_eq!(ops.len(), 1, "{}: one document", p.display());
        let ops: json_patch::Patch = serde_json::from_value(ops[0].clone()).unwrap_or_else(|e| {
            panic!(
                "{}: only JSON 6902 patches are understood here: {e}",
                p.display()
            )
        });
        let t = &patch.target;
        let api_version = if t.group.is_empty() {
            t.version.clone()
        } else {
            format!("{}/{}", t.group, t.version)
        };
        let mut hits = 0;
        for o in objects.iter_mut().filter(|o| {
            str_at(o, "/apiVersion") == api_version
                && str_at(o, "/kind") == t.kind
                && str_at(o, "/metadata/name") == t.name
        }) {
            json_patch::patch(o, &ops)
                .unwrap_or_else(|e| panic!("{} on {}: {e}", p.display(), describe(o)));
            hits += 1;
        }
        assert_eq!(hits, 1, "{}: the target must match one object", p.display());
    }
    objects
}

fn by_identity(objects: Vec<Value>) -> BTreeMap<String, Value> {
    let mut out = BTreeMap::new();
    for o in objects {
        assert!(
            out.insert(describe(&o), o.clone()).is_none(),
            "{} twice",
            describe(&o)
        );
    }
    out
}

/// A kustomization's objects, decoded.
fn build(dir: &str) -> Vec<Object> {
    let dir = manifests().join(dir);
    kustomize(&dir, &mut BTreeSet::new())
        .iter()
        .map(|v| decode_object(v, &dir))
        .collect()
}

fn daemonsets(objects: &[Object]) -> Vec<DaemonSet> {
    objects
        .iter()
        .filter_map(|o| match o {
            Object::DaemonSet(d) => Some((**d).clone()),
            _ => None,
        })
        .collect()
}

fn the_daemonset(dir: &str) -> DaemonSet {
    let mut ds = daemonsets(&build(dir));
    assert_eq!(ds.len(), 1, "{dir}: one DaemonSet");
    ds.remove(0)
}

fn pod_spec(ds: &DaemonSet) -> &PodSpec {
    ds.spec
        .as_ref()
        .unwrap()
        .template
        .spec
        .as_ref()
        .expect("a pod spec")
}

fn the_container<'a>(spec: &'a PodSpec, name: &str) -> &'a Container {
    let found: Vec<_> = spec.containers.iter().filter(|c| c.name == name).collect();
    assert_eq!(found.len(), 1, "one container {name:?}");
    found[0]
}

/// The agent's `run` arguments as the container passes them. `--node-name` comes from
/// `$NODE_NAME` in the pod; it is given here so the test does not depend on this process's
/// environment (that the pod sets `NODE_NAME` is checked on its own).
fn run_args(c: &Container) -> RunArgs {
    assert!(
        c.command.is_none(),
        "the image's entrypoint is nodelb-agent"
    );
    let cli = Cli::try_parse_from(
        std::iter::once("nodelb-agent".to_string())
            .chain(c.args.clone().unwrap_or_default())
            .chain(["--node-name".to_string(), "node-under-test".to_string()]),
    )
    .unwrap_or_else(|e| panic!("the container's arguments do not parse: {e}"));
    match cli.command {
        Command::Run(r) => *r,
        other => panic!("the agent container must run `run`, not {other:?}"),
    }
}

/// The container port a probe aims at: by name or by number (its host is checked by the
/// caller).
fn probe_port(c: &Container, probe: &Probe, what: &str) -> (String, u16) {
    let get = probe
        .http_get
        .as_ref()
        .unwrap_or_else(|| panic!("{what}: an HTTP GET probe"));
    assert!(matches!(get.scheme.as_deref(), None | Some("HTTP")));
    let ports = c.ports.clone().unwrap_or_default();
    let port = match &get.port {
        IntOrString::Int(n) => *n,
        IntOrString::String(name) => {
            ports
                .iter()
                .find(|p| p.name.as_deref() == Some(name.as_str()))
                .unwrap_or_else(|| panic!("{what}: no container port named {name:?}"))
                .container_port
        }
    };
    (
        get.path.clone().unwrap_or_default(),
        u16::try_from(port).unwrap(),
    )
}

fn named_port(c: &Container, name: &str) -> u16 {
    let p = c
        .ports
        .iter()
        .flatten()
        .find(|p| p.name.as_deref() == Some(name))
        .unwrap_or_else(|| panic!("no container port named {name:?}"));
    assert_eq!(p.protocol.as_deref().unwrap_or("TCP"), "TCP");
    u16::try_from(p.container_port).unwrap()
}

/// Where each environment variable the agent reads comes from in the pod (downward API).
const DOWNWARD_API: [(&str, &str); 3] = [
    ("NODE_NAME", "spec.nodeName"),
    ("POD_NAME", "metadata.name"),
    ("POD_NAMESPACE", "metadata.namespace"),
];

/// The environment variables `nodelb-agent run` reads, from clap's own description of it.
fn run_env_names() -> BTreeSet<String> {
    let cmd = Cli::command();
    let run = cmd.find_subcommand("run").expect("a run subcommand");
    run.get_arguments()
        .filter_map(|a| a.get_env())
        .map(|e| e.to_string_lossy().into_owned())
        .collect()
}

fn agent_image() -> String {
    format!("nodelb/nodelb-agent:{}", nodelb_agent::PACKAGE_VERSION)
}

#[test]
fn every_manifest_file_decodes_and_is_part_of_a_build() {
    let root = manifests().canonicalize().unwrap();
    let mut read = BTreeSet::new();
    let mut objects = 0;
    for dir in [".", "hardened", "cleanup", "monitoring"] {
        objects += kustomize(&root.join(dir), &mut read).len();
    }
    assert!(objects > 0);
    for path in yaml_files(&root) {
        assert!(
            read.contains(&path),
            "{} is in no kustomization: `kubectl apply -k` would never install it",
            path.display()
        );
        if path.file_name().unwrap() == KUSTOMIZATION {
            continue; // checked by kustomization()
        }
        for doc in documents(&path) {
            if doc.is_array() {
                continue; // a JSON patch, applied (and so checked) by kustomize()
            }
            decode_object(&doc, &path);
        }
    }
}

#[test]
fn builds_agree_with_kubectl_kustomize() {
    // The kubectl of the pinned Kubernetes release (scripts/kubernetes.sh builds it beside
    // the kube-apiserver the e2e tests run against), so this never depends on what the machine
    // happens to have.
    let kubectl = nodelb_integration::control_plane::kubectl().unwrap_or_else(|e| panic!("{e}"));
    for dir in [".", "hardened", "cleanup", "monitoring"] {
        let dir = manifests().join(dir);
        let out = std::process::Command::new(&kubectl)
            .arg("kustomize")
            .arg(&dir)
            .output()
            .unwrap_or_else(|e| panic!("running {}: {e}", kubectl.display()));
        assert!(
            out.status.success(),
            "kubectl kustomize {}: {}",
            dir.display(),
            String::from_utf8_lossy(&out.stderr)
        );
        let theirs: Vec<Value> =
            serde_yaml_ng::Deserializer::from_str(&String::from_utf8(out.stdout).unwrap())
                .map(|d| Value::deserialize(d).unwrap())
                .filter(|v| !v.is_null())
                .collect();
        let ours = kustomize(&dir, &mut BTreeSet::new());
        assert_eq!(
            by_identity(ours),
            by_identity(theirs),
            "{}: this test's build differs from kustomize's",
            dir.display()
        );
    }
}

#[test]
fn daemonset_ports_and_probes_are_the_agents_defaults() {
    for dir in [".", "hardened"] {
        let ds = the_daemonset(dir);
        let spec = pod_spec(&ds);
        let c = the_container(spec, "agent");
        let run = run_args(c);
        // Health on loopback, where the probes ask (`host`) and no Service client reaches;
        // metrics on every address, behind a token (README, "Security").
        assert!(run.health_addr.ip().is_loopback(), "{}", run.health_addr);
        assert!(
            run.metrics_addr.ip().is_unspecified(),
            "{}",
            run.metrics_addr
        );
        for probe in [&c.readiness_probe, &c.liveness_probe] {
            let host = probe
                .as_ref()
                .and_then(|p| p.http_get.as_ref()?.host.clone());
            assert_eq!(
                host,
                Some(run.health_addr.ip().to_string()),
                "{dir}: the probes ask the health address"
            );
        }
        assert_eq!(named_port(c, "health"), run.health_addr.port(), "{dir}");
        assert_eq!(named_port(c, "metrics"), run.metrics_addr.port(), "{dir}");
        let readiness = c.readiness_probe.as_ref().expect("a readiness probe");
        assert_eq!(
            probe_port(c, readiness, "readiness"),
            ("/readyz".to_string(), run.health_addr.port())
        );
        let liveness = c.liveness_probe.as_ref().expect("a liveness probe");
        assert_eq!(
            probe_port(c, liveness, "liveness"),
            ("/healthz".to_string(), run.health_addr.port())
        );
    }
}

#[test]
fn daemonset_env_is_what_the_agent_reads() {
    let reads = run_env_names();
    let table: BTreeSet<String> = DOWNWARD_API.iter().map(|(n, _)| n.to_string()).collect();
    assert_eq!(
        reads, table,
        "the agent's environment changed: say in DOWNWARD_API where the pod gets each variable"
    );
    for dir in [".", "hardened"] {
        let ds = the_daemonset(dir);
        let c = the_container(pod_spec(&ds), "agent");
        let env: BTreeMap<String, String> = c
            .env
            .iter()
            .flatten()
            .map(|e| {
                let path = e
                    .value_from
                    .as_ref()
                    .and_then(|f| f.field_ref.as_ref())
                    .map(|f| f.field_path.clone())
                    .unwrap_or_else(|| panic!("{}: not from the downward API", e.name));
                (e.name.clone(), path)
            })
            .collect();
        let want: BTreeMap<String, String> = DOWNWARD_API
            .iter()
            .map(|(n, p)| (n.to_string(), p.to_string()))
            .collect();
        assert_eq!(env, want, "{dir}");
        assert!(c.env_from.is_none());
    }
}

#[test]
fn daemonset_runs_on_every_node_one_node_at_a_time() {
    let objects = build(".");
    let ds = the_daemonset(".");
    let namespace = ds.metadata.namespace.clone().unwrap();
    assert_eq!(namespace, "nodelb-system");
    let ns = objects
        .iter()
        .find_map(|o| match o {
            Object::Namespace(n) if n.metadata.name.as_deref() == Some(&namespace) => Some(n),
            _ => None,
        })
        .expect("the DaemonSet's Namespace is installed");
    // Host networking and NET_ADMIN need the privileged Pod Security level.
    assert_eq!(
        ns.metadata
            .labels
            .as_ref()
            .and_then(|l| l.get("pod-security.kubernetes.io/enforce"))
            .map(String::as_str),
        Some("privileged")
    );
    let d = ds.spec.as_ref().unwrap();
    let strategy = d.update_strategy.as_ref().unwrap();
    assert_eq!(strategy.type_.as_deref(), Some("RollingUpdate"));
    let rolling = strategy.rolling_update.as_ref().unwrap();
    assert_eq!(rolling.max_unavailable, Some(IntOrString::Int(1)));
    // The new pod binds the same host ports as the old one: a surge could never start.
    assert!(matches!(
        rolling.max_surge,
        None | Some(IntOrString::Int(0))
    ));

    let spec = pod_spec(&ds);
    assert_eq!(spec.host_network, Some(true));
    assert_eq!(spec.dns_policy.as_deref(), Some("ClusterFirstWithHostNet"));
    assert_eq!(
        spec.priority_class_name.as_deref(),
        Some("system-node-critical")
    );
    let tolerations = spec.tolerations.clone().unwrap_or_default();
    assert!(
        tolerations
            .iter()
            .any(|t| t.operator.as_deref() == Some("Exists")
                && t.key.is_none()
                && t.effect.is_none()
                && t.toleration_seconds.is_none()),
        "tolerate every taint: {tolerations:?}"
    );

    let c = the_container(spec, "agent");
    let run = run_args(c);
    // On SIGTERM the status leader releases its Lease; a Lease call may take up to the
    // renew deadline, so the grace period must outlast it.
    let grace = spec
        .termination_grace_period_seconds
        .expect("a grace period");
    assert!(
        u64::try_from(grace).unwrap() > run.renew_deadline.as_secs(),
        "grace {grace}s, renew deadline {:?}",
        run.renew_deadline
    );
    assert!(
        !run.set_sysctls,
        "forwarding is the node's business by default"
    );

    assert_eq!(c.image.as_deref(), Some(agent_image().as_str()));
    let resources = c.resources.as_ref().expect("resources");
    let requests = resources.requests.as_ref().expect("requests");
    let limits = resources.limits.as_ref().expect("limits");
    assert_eq!(requests["cpu"].0, "50m");
    assert_eq!(requests["memory"].0, "64Mi");
    assert_eq!(limits["memory"].0, "512Mi");
    assert!(
        !limits.contains_key("cpu"),
        "no CPU limit: throttling only delays syncs"
    );

    let sc = c.security_context.as_ref().unwrap();
    assert_eq!(sc.privileged, Some(true), "the base agent is privileged");

    // The ServiceAccount is the one the RBAC binds.
    let sa = spec.service_account_name.clone().unwrap();
    assert!(objects.iter().any(|o| matches!(o, Object::ServiceAccount(s)
        if s.metadata.name.as_deref() == Some(&sa)
            && s.metadata.namespace.as_deref() == Some(&namespace))));
}

#[test]
fn hardened_overlay_keeps_net_admin_and_a_read_only_root_only() {
    let base = the_daemonset(".");
    let hardened = the_daemonset("hardened");
    let c = the_container(pod_spec(&hardened), "agent");
    let sc = c.security_context.clone().expect("a security context");
    assert_eq!(sc.privileged, Some(false));
    assert_eq!(sc.allow_privilege_escalation, Some(false));
    assert_eq!(sc.read_only_root_filesystem, Some(true));
    let caps = sc.capabilities.clone().expect("capabilities");
    assert_eq!(caps.add, Some(vec!["NET_ADMIN".to_string()]));
    assert_eq!(caps.drop, Some(vec!["ALL".to_string()]));
    // Added capabilities reach only root's effective set (no ambient capabilities).
    assert!(matches!(sc.run_as_user, None | Some(0)));
    assert_ne!(sc.run_as_non_root, Some(true));
    assert!(sc.se_linux_options.is_none() && sc.proc_mount.is_none());
    assert!(
        pod_spec(&hardened).security_context.is_none(),
        "no pod-level security context to widen the container's"
    );
    // Without privileged, /proc/sys is read-only: --set-sysctls would only fail.
    assert!(!run_args(c).set_sysctls);

    // Nothing else differs from the base: the overlay cannot drift from what the tests check.
    let strip = |ds: &DaemonSet| {
        let mut ds = ds.clone();
        let spec = ds.spec.as_mut().unwrap().template.spec.as_mut().unwrap();
        for c in &mut spec.containers {
            c.security_context = None;
        }
        ds
    };
    assert_eq!(strip(&hardened), strip(&base));
}

/// The cleanup's build: the install's objects with the agent DaemonSet scheduled on no node,
/// and the cleanup's own.
fn cleanup_objects() -> (Vec<Object>, DaemonSet, DaemonSet) {
    let objects = build("cleanup");
    let ds = daemonsets(&objects);
    assert_eq!(ds.len(), 2, "the agent's, stopped, and the cleanup's");
    let named = |n: &str| {
        ds.iter()
            .find(|d| d.metadata.name.as_deref() == Some(n))
            .cloned()
            .unwrap_or_else(|| panic!("DaemonSet {n} in manifests/cleanup/"))
    };
    (
        objects.clone(),
        named("nodelb-agent"),
        named("nodelb-cleanup"),
    )
}

#[test]
fn cleanup_stops_the_agents_and_changes_nothing_else_of_the_install() {
    let (_, stopped, _) = cleanup_objects();
    // Every object of the install is in the cleanup's build (so deleting it removes them all).
    let root = manifests().canonicalize().unwrap();
    let ours = by_identity(kustomize(&root.join("cleanup"), &mut BTreeSet::new()));
    for id in by_identity(kustomize(&root, &mut BTreeSet::new())).keys() {
        assert!(ours.contains_key(id), "{id} is not in manifests/cleanup/");
    }
    let selector = pod_spec(&stopped).node_selector.clone().unwrap();
    assert_eq!(selector.len(), 1);
    let (label, _) = selector.iter().next().unwrap();
    assert!(
        label.starts_with("nodelb.io/"),
        "a label no node carries: {label}"
    );
    let mut agent = the_daemonset(".");
    let mut stopped = stopped;
    stopped
        .spec
        .as_mut()
        .unwrap()
        .template
        .spec
        .as_mut()
        .unwrap()
        .node_selector = None;
    agent.metadata = stopped.metadata.clone();
    assert_eq!(stopped, agent, "only the node selector differs");
}

#[test]
fn cleanup_daemonset_runs_cleanup_on_every_node() {
    let (_, _, cleanup_ds) = cleanup_objects();
    let ds = [cleanup_ds];
    let agent = the_daemonset(".");
    assert_eq!(ds[0].metadata.namespace, agent.metadata.namespace);
    assert_ne!(
        ds[0].spec.as_ref().unwrap().selector,
        agent.spec.as_ref().unwrap().selector,
        "cleanup pods must not be taken for agent pods"
    );
    let spec = pod_spec(&ds[0]);
    assert_eq!(spec.host_network, Some(true), "the tables are the node's");
    assert_eq!(spec.automount_service_account_token, Some(false));
    assert!(spec
        .tolerations
        .iter()
        .flatten()
        .any(|t| t.operator.as_deref() == Some("Exists") && t.key.is_none()));

    let init = spec.init_containers.clone().unwrap_or_default();
    assert_eq!(init.len(), 1);
    let cleanup = &init[0];
    assert_eq!(cleanup.image.as_deref(), Some(agent_image().as_str()));
    assert!(cleanup.command.is_none(), "the image's entrypoint");
    let cli = Cli::try_parse_from(
        std::iter::once("nodelb-agent".to_string()).chain(cleanup.args.clone().unwrap_or_default()),
    )
    .unwrap();
    let Command::Cleanup(args) = cli.command else {
        panic!("the init container runs cleanup");
    };
    let health = run_args(the_container(pod_spec(&agent), "agent")).health_addr;
    assert_eq!(
        args.after_agent_stops.map(|a| a.port()),
        Some(health.port()),
        "cleanup waits for the agent on its health port"
    );
    let sc = cleanup.security_context.clone().unwrap();
    let caps = sc.capabilities.unwrap();
    assert_eq!(caps.add, Some(vec!["NET_ADMIN".to_string()]));
    assert_eq!(caps.drop, Some(vec!["ALL".to_string()]));
    assert_ne!(sc.privileged, Some(true));

    // The container that stays only marks the pod Ready: no capability at all.
    let done = the_container(spec, "done");
    let caps = done
        .security_context
        .as_ref()
        .unwrap()
        .capabilities
        .clone()
        .unwrap();
    assert_eq!(caps.add, None);
    assert_eq!(caps.drop, Some(vec!["ALL".to_string()]));
}

/// (verb, group, resource, scope) as the manifests grant it.
type Grant = (String, String, String, Scope);

#[test]
fn rbac_grants_exactly_the_reviewed_requests() {
    let objects = build(".");
    let ds = the_daemonset(".");
    let namespace = ds.metadata.namespace.clone().unwrap();
    let sa = pod_spec(&ds).service_account_name.clone().unwrap();
    let binds_agent = |subjects: &Option<Vec<k8s_openapi::api::rbac::v1::Subject>>| {
        subjects.iter().flatten().any(|s| {
            s.kind == "ServiceAccount" && s.name == sa && s.namespace.as_deref() == Some(&namespace)
        })
    };

    let mut granted: BTreeSet<Grant> = BTreeSet::new();
    let mut add =
        |rules: &Option<Vec<k8s_openapi::api::rbac::v1::PolicyRule>>, scope: Scope, role: &str| {
            for rule in rules.iter().flatten() {
                assert!(
                    rule.resource_names.is_none() && rule.non_resource_urls.is_none(),
                    "{role}: a rule by resource names or URLs is not in the reviewed list's terms"
                );
                let groups = rule.api_groups.clone().unwrap_or_default();
                let resources = rule.resources.clone().unwrap_or_default();
                for v in &rule.verbs {
                    for g in &groups {
                        for r in &resources {
                            assert!(
                                ![v, g, r].iter().any(|s| s.contains('*')),
                                "{role}: no wildcards"
                            );
                            assert!(
                                granted.insert((v.clone(), g.clone(), r.clone(), scope)),
                                "{role}: ({v}, {g:?}, {r}) granted twice"
                            );
                        }
                    }
                }
            }
        };
    let mut bound = BTreeSet::new();
    for o in &objects {
        match o {
            Object::ClusterRoleBinding(b) if binds_agent(&b.subjects) => {
                assert_eq!(b.role_ref.kind, "ClusterRole");
                bound.insert(("ClusterRole", b.role_ref.name.clone()));
            }
            Object::RoleBinding(b) if binds_agent(&b.subjects) => {
                let ns = b.metadata.namespace.as_deref();
                assert!(
                    ns == Some(namespace.as_str()) || ns == Some(KUBELET_LEASE_NAMESPACE),
                    "RoleBindings live in the agent's namespace or kube-node-lease: {ns:?}"
                );
                assert_eq!(
                    b.role_ref.kind, "Role",
                    "a ClusterRole bound in one namespace is not in the reviewed list's terms"
                );
                bound.insert(("Role", b.role_ref.name.clone()));
            }
            _ => {}
        }
    }
    let mut roles = BTreeSet::new();
    for o in &objects {
        match o {
            // Roles for others (nodelb-metrics-reader, for scrapers): manifests/rights.txt.
            Object::ClusterRole(r)
                if !bound.contains(&("ClusterRole", r.metadata.name.clone().unwrap())) => {}
            Object::ClusterRole(r) => {
                let name = r.metadata.name.clone().unwrap();
                assert!(r.aggregation_rule.is_none());
                add(&r.rules, Scope::Cluster, &name);
                roles.insert(("ClusterRole", name));
            }
            Object::Role(r) => {
                let scope = match r.metadata.namespace.as_deref() {
                    Some(ns) if ns == namespace => Scope::AgentNamespace,
                    Some(KUBELET_LEASE_NAMESPACE) => Scope::KubeletLeases,
                    ns => panic!("Roles live in the agent's namespace or kube-node-lease: {ns:?}"),
                };
                let name = r.metadata.name.clone().unwrap();
                add(&r.rules, scope, &name);
                roles.insert(("Role", name));
            }
            _ => {}
        }
    }
    assert_eq!(
        roles, bound,
        "every Role is bound to the agent's ServiceAccount, and every role bound to it exists"
    );

    let expected: BTreeSet<Grant> = rbac_expectations()
        .iter()
        .map(|r| {
            (
                r.verb.to_string(),
                r.group.to_string(),
                r.resource.to_string(),
                r.scope,
            )
        })
        .collect();
    assert_eq!(
        expected.len(),
        rbac_expectations().len(),
        "a request is listed twice"
    );
    let extra: Vec<_> = granted.difference(&expected).collect();
    let missing: Vec<_> = expected.difference(&granted).collect();
    assert!(
        extra.is_empty() && missing.is_empty(),
        "RBAC and the reviewed list differ.\ngranted, not on the list: {extra:?}\non the list, not granted: {missing:?}"
    );
}

#[test]
fn every_reviewed_request_names_the_code_that_makes_it() {
    for r in rbac_expectations() {
        assert!(
            r.made_by.contains("agent/src/") || r.made_by.contains("issue "),
            "{r:?}"
        );
    }
    // The helper the e2e tests use: the agent's namespace bounds Lease requests.
    assert!(nodelb_integration::is_expected(
        "update",
        "coordination.k8s.io",
        "leases",
        "nodelb-system",
        "nodelb-system"
    ));
    assert!(!nodelb_integration::is_expected(
        "update",
        "coordination.k8s.io",
        "leases",
        "default",
        "nodelb-system"
    ));
    // The kubelets' node Leases are read, never written.
    assert!(nodelb_integration::is_expected(
        "watch",
        "coordination.k8s.io",
        "leases",
        KUBELET_LEASE_NAMESPACE,
        "nodelb-system"
    ));
    assert!(!nodelb_integration::is_expected(
        "update",
        "coordination.k8s.io",
        "leases",
        KUBELET_LEASE_NAMESPACE,
        "nodelb-system"
    ));
    assert!(nodelb_integration::is_expected(
        "create",
        "events.k8s.io",
        "events",
        "default",
        "nodelb-system"
    ));
    assert!(!nodelb_integration::is_expected(
        "get",
        "",
        "nodes",
        "",
        "nodelb-system"
    ));
}

/// The clear-status Job runs `nodelb-agent clear-status` as its own ServiceAccount, which may
/// read Leases in the agent's namespace (to wait for the status Lease), list Services and
/// patch their status, nothing else, without privileges.
#[test]
fn clear_status_job_may_list_services_and_patch_their_status_only() {
    let (objects, _, _) = cleanup_objects();
    let jobs: Vec<&Job> = objects
        .iter()
        .filter_map(|o| match o {
            Object::Job(j) => Some(&**j),
            _ => None,
        })
        .collect();
    assert_eq!(jobs.len(), 1);
    let job = jobs[0];
    let namespace = job.metadata.namespace.clone().unwrap();
    assert_eq!(namespace, the_daemonset(".").metadata.namespace.unwrap());
    let spec = job.spec.as_ref().unwrap().template.spec.clone().unwrap();
    let sa = spec.service_account_name.clone().unwrap();
    assert_ne!(sa, "nodelb", "not the agent's ServiceAccount");
    assert_ne!(spec.host_network, Some(true));
    let c = &spec.containers[0];
    assert_eq!(c.image.as_deref(), Some(agent_image().as_str()));
    let cli = Cli::try_parse_from(
        std::iter::once("nodelb-agent".to_string()).chain(c.args.clone().unwrap_or_default()),
    )
    .unwrap();
    let Command::ClearStatus(args) = cli.command else {
        panic!("the Job runs clear-status");
    };
    assert_eq!(
        args.lease_namespace, namespace,
        "it waits for the agents' Lease"
    );
    let sc = c.security_context.clone().unwrap();
    assert_eq!(sc.run_as_non_root, Some(true));
    assert_eq!(sc.capabilities.unwrap().drop, Some(vec!["ALL".to_string()]));

    let binds = |subjects: &Option<Vec<k8s_openapi::api::rbac::v1::Subject>>| {
        subjects.iter().flatten().any(|s| {
            s.kind == "ServiceAccount" && s.name == sa && s.namespace.as_deref() == Some(&namespace)
        })
    };
    let mut bound = BTreeSet::new();
    for o in &objects {
        match o {
            Object::ClusterRoleBinding(b) if binds(&b.subjects) => {
                bound.insert(("ClusterRole", b.role_ref.name.clone()));
            }
            Object::RoleBinding(b) if binds(&b.subjects) => {
                bound.insert(("Role", b.role_ref.name.clone()));
            }
            _ => {}
        }
    }
    let mut granted = BTreeSet::new();
    for o in &objects {
        let (kind, r) = match o {
            Object::ClusterRole(r) => ("ClusterRole", (r.metadata.name.clone(), &r.rules)),
            Object::Role(r) => ("Role", (r.metadata.name.clone(), &r.rules)),
            _ => continue,
        };
        if !bound.contains(&(kind, r.0.clone().unwrap())) {
            continue;
        }
        for rule in r.1.iter().flatten() {
            assert!(rule.resource_names.is_none());
            for v in &rule.verbs {
                for g in rule.api_groups.iter().flatten() {
                    for res in rule.resources.iter().flatten() {
                        granted.insert((kind, v.clone(), g.clone(), res.clone()));
                    }
                }
            }
        }
    }
    let want: BTreeSet<(&str, String, String, String)> = [
        ("ClusterRole", "list", "", "services"),
        ("ClusterRole", "patch", "", "services/status"),
        ("Role", "get", "coordination.k8s.io", "leases"),
    ]
    .into_iter()
    .map(|(k, v, g, r)| (k, v.to_string(), g.to_string(), r.to_string()))
    .collect();
    assert_eq!(granted, want);
}

#[test]
fn apf_gives_the_status_writers_requests_a_priority_level_of_their_own() {
    let objects = build(".");
    let ds = the_daemonset(".");
    let namespace = ds.metadata.namespace.clone().unwrap();
    let sa = pod_spec(&ds).service_account_name.clone().unwrap();
    let schemas: Vec<&FlowSchema> = objects
        .iter()
        .filter_map(|o| match o {
            Object::FlowSchema(f) => Some(&**f),
            _ => None,
        })
        .collect();
    let levels: Vec<&PriorityLevelConfiguration> = objects
        .iter()
        .filter_map(|o| match o {
            Object::PriorityLevelConfiguration(p) => Some(&**p),
            _ => None,
        })
        .collect();
    assert_eq!((schemas.len(), levels.len()), (1, 1), "one of each");
    let spec = schemas[0].spec.as_ref().unwrap();
    assert_eq!(
        Some(&spec.priority_level_configuration.name),
        levels[0].metadata.name.as_ref()
    );
    assert!(
        spec.matching_precedence.unwrap() < 9000,
        "ahead of the built-in service-accounts FlowSchema (9000)"
    );
    let level = levels[0].spec.as_ref().unwrap();
    assert_eq!(level.type_, "Limited", "never exempt");
    let mut requests = BTreeSet::new();
    for rule in spec.rules.iter().flatten() {
        let subjects: Vec<_> = rule
            .subjects
            .iter()
            .map(|s| s.service_account.as_ref().map(|a| (&a.name, &a.namespace)))
            .collect();
        assert_eq!(
            subjects,
            [Some((&sa, &namespace))],
            "the agent's ServiceAccount only"
        );
        assert!(rule.non_resource_rules.is_none());
        for r in rule.resource_rules.iter().flatten() {
            for v in &r.verbs {
                for g in &r.api_groups {
                    for res in &r.resources {
                        requests.insert((v.as_str(), g.as_str(), res.as_str()));
                    }
                }
            }
        }
    }
    assert_eq!(
        requests,
        BTreeSet::from([
            ("patch", "", "services/status"),
            ("create", "events.k8s.io", "events")
        ]),
        "the status writer's requests, and no read or heartbeat"
    );
}
