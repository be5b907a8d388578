//! The real cluster the `cluster` tests run on: by default `scripts/cluster.sh`'s two nodes
//! (kubelet and containerd per node namespace, kube-controller-manager, kube-scheduler,
//! kube-proxy, all from the pinned `k8s.io/kubernetes` module), with nodelb installed from its
//! image by `kubectl apply -k`, the way users install it.
//!
//! When `NODELB_E2E_KUBECONFIG` names a kubeconfig, the tests run against that cluster instead:
//! - `NODELB_E2E_AGENT_IMAGE` names the nodelb image its nodes can pull (required there);
//! - `NODELB_E2E_BACKEND_IMAGE` the backend image (built by `scripts/images.sh`; it must be
//!   pullable too);
//! - `NODELB_E2E_CLIENT_NETNS` optionally names the network namespace clients run in (by
//!   default this process's own, which must reach the nodes' addresses).
//!
//! Tests that stop a kubelet or switch kube-proxy's mode need `scripts/cluster.sh` and say so
//! when skipped there.
//!
//! One cluster serves the whole test binary; tests take it one at a time ([`RealCluster::get`]
//! returns a guard), because installing, rolling and uninstalling nodelb affect every node.

use std::collections::{BTreeMap, BTreeSet};
use std::net::{IpAddr, SocketAddr};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::{Mutex, MutexGuard, OnceLock};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{Node, Service};
use kube::api::{Api, ListParams};
use kube::Client;
use serde_json::Value;

use crate::control_plane::client_from_kubeconfig;
use crate::e2e::{external_cluster, wait_for};
use crate::netns::{require_root, Netns};
use crate::traffic::{self, Outcome};

/// The namespace the manifests install nodelb into.
pub const NODELB_NAMESPACE: &str = "nodelb-system";
/// The DaemonSet of `manifests/`.
pub const DAEMONSET: &str = "nodelb-agent";
/// The image name the manifests use (a placeholder a kustomization's `images:` replaces).
const MANIFEST_IMAGE: &str = "nodelb/nodelb-agent";
/// The backend's ports (`src/bin/nodelb-test-backend.rs`).
pub const BACKEND_TCP_PORT: u16 = 8080;
pub const BACKEND_ECHO_PORT: u16 = 8081;
pub const BACKEND_UDP_PORT: u16 = 9000;

/// A running cluster and how to reach it.
pub struct RealCluster {
    kubeconfig: PathBuf,
    /// Node name and the address clients use, as the cluster lists them.
    nodes: Vec<(String, IpAddr)>,
    client: Netns,
    /// `scripts/cluster.sh`'s cluster (not `NODELB_E2E_KUBECONFIG`'s).
    managed: bool,
    agent_image: String,
    backend_image: String,
    kubectl: PathBuf,
    rt: tokio::runtime::Runtime,
    admin: Client,
    /// kube-apiserver's audit log: every request of nodelb's ServiceAccounts and every write
    /// of anyone (`scripts/cluster.sh`'s cluster only).
    audit_log: Option<PathBuf>,
}

/// Writes `body` (after the `apiVersion` and `kind` lines) as the `kustomization.yaml` of a new
/// directory of the test's own under the repository's `target/kustomizations/` (three levels
/// below the repository, so `../../../manifests` names the manifests, and `../<sibling>`
/// another such kustomization).
pub fn write_kustomization(body: &str) -> Result<PathBuf, String> {
    static N: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let n = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let dir = repo()
        .join("target")
        .join("kustomizations")
        .join(format!("{}-{n}", std::process::id()));
    std::fs::create_dir_all(&dir).map_err(|e| format!("creating {}: {e}", dir.display()))?;
    let text = format!("apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\n{body}");
    std::fs::write(dir.join("kustomization.yaml"), text)
        .map_err(|e| format!("writing the kustomization: {e}"))?;
    Ok(dir)
}

/// Lines `KEY=value` of a script's output.
pub fn keyed_lines(text: &str) -> BTreeMap<String, String> {
    text.lines()
        .filter_map(|l| l.split_once('='))
        .map(|(k, v)| (k.trim().to_string(), v.trim().to_string()))
        .collect()
}

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("..")
        .canonicalize()
        .expect("the repository root")
}

/// Runs a script of `scripts/` and returns its stdout; its stderr goes to the test's.
fn script(args: &[&str]) -> Result<String, String> {
    let path = repo().join("scripts").join(args[0]);
    let out = Command::new("bash")
        .arg(&path)
        .args(&args[1..])
        .stderr(Stdio::inherit())
        .output()
        .map_err(|e| format!("running {}: {e}", path.display()))?;
    if !out.status.success() {
        return Err(format!(
            "{} {:?} failed ({})",
            path.display(),
            &args[1..],
            out.status
        ));
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

impl RealCluster {
    /// The cluster, brought up on first use, and the right to use it alone. `None` when the
    /// test must skip (no root outside CI: [`require_root`] says so).
    pub fn get(test: &str) -> Option<(MutexGuard<'static, ()>, &'static RealCluster)> {
        static CLUSTER: OnceLock<Result<RealCluster, String>> = OnceLock::new();
        static TURN: Mutex<()> = Mutex::new(());
        if external_cluster().is_none() && !require_root(test) {
            return None;
        }
        let guard = TURN.lock().unwrap_or_else(|p| p.into_inner());
        match CLUSTER.get_or_init(RealCluster::start) {
            Ok(c) => Some((guard, c)),
            Err(e) => panic!("{test}: the real cluster is not available: {e}"),
        }
    }

    /// [`RealCluster::get`] for a test that needs `scripts/cluster.sh`'s own cluster (its
    /// nodes, their kubelets, its audit log): `None` after printing `skip` when the cluster
    /// is another (`NODELB_E2E_KUBECONFIG`).
    pub fn managed(
        test: &str,
        skip: &str,
    ) -> Option<(MutexGuard<'static, ()>, &'static RealCluster)> {
        let (turn, c) = RealCluster::get(test)?;
        if !c.is_managed() {
            println!("{skip}");
            return None;
        }
        Some((turn, c))
    }

    fn start() -> Result<RealCluster, String> {
        let kubectl = crate::control_plane::kubectl()?;
        let (kubeconfig, client, managed, agent_image, backend_image, audit_log) =
            match external_cluster() {
                Some(kc) => {
                    let env = |k: &str| std::env::var(k).ok().filter(|v| !v.is_empty());
                    let agent = env("NODELB_E2E_AGENT_IMAGE").ok_or(
                    "NODELB_E2E_KUBECONFIG is set: NODELB_E2E_AGENT_IMAGE must name the nodelb \
                     image its nodes pull",
                )?;
                    let backend = env("NODELB_E2E_BACKEND_IMAGE").ok_or(
                    "NODELB_E2E_KUBECONFIG is set: NODELB_E2E_BACKEND_IMAGE must name the backend \
                     image (scripts/images.sh builds it) its nodes pull",
                )?;
                    let client = match env("NODELB_E2E_CLIENT_NETNS") {
                        Some(ns) => Netns::existing(&ns)?,
                        None => Netns::existing_current(),
                    };
                    (kc, client, false, agent, backend, None)
                }
                None => {
                    let began = Instant::now();
                    let up = keyed_lines(&script(&["cluster.sh", "up"])?);
                    println!("measured: scripts/cluster.sh up took {:?}", began.elapsed());
                    let images = keyed_lines(&script(&["images.sh"])?);
                    let get = |m: &BTreeMap<String, String>, k: &str| {
                        m.get(k)
                            .cloned()
                            .ok_or_else(|| format!("no {k}= line in the script's output: {m:?}"))
                    };
                    (
                        PathBuf::from(get(&up, "KUBECONFIG")?),
                        Netns::existing(&get(&up, "CLIENT_NETNS")?)?,
                        true,
                        get(&images, "AGENT_IMAGE")?,
                        get(&images, "BACKEND_IMAGE")?,
                        Some(PathBuf::from(get(&up, "AUDIT_LOG")?)),
                    )
                }
            };
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .map_err(|e| format!("a tokio runtime: {e}"))?;
        let text = std::fs::read_to_string(&kubeconfig)
            .map_err(|e| format!("reading {}: {e}", kubeconfig.display()))?;
        let admin = rt.block_on(client_from_kubeconfig(&text))?;
        let mut c = RealCluster {
            kubeconfig,
            nodes: Vec::new(),
            client,
            managed,
            agent_image,
            backend_image,
            kubectl,
            rt,
            admin,
            audit_log,
        };
        c.nodes = c.node_addresses()?;
        println!(
            "real cluster: {} ({}), nodes {:?}, client netns {}, agent image {}",
            c.kubeconfig.display(),
            if c.managed {
                "scripts/cluster.sh"
            } else {
                "NODELB_E2E_KUBECONFIG"
            },
            c.nodes,
            c.client.name(),
            c.agent_image
        );
        Ok(c)
    }

    /// Every Node and the address a client reaches it on: its first ExternalIP, else its
    /// first InternalIP.
    fn node_addresses(&self) -> Result<Vec<(String, IpAddr)>, String> {
        let nodes: Vec<Node> = self.block_on(async {
            Api::<Node>::all(self.admin.clone())
                .list(&ListParams::default())
                .await
                .map(|l| l.items)
                .map_err(|e| format!("listing Nodes: {e}"))
        })?;
        let mut out = Vec::new();
        for n in nodes {
            let name = n.metadata.name.clone().unwrap_or_default();
            let addrs = n.status.and_then(|s| s.addresses).unwrap_or_default();
            let pick = |t: &str| {
                addrs
                    .iter()
                    .filter(|a| a.type_ == t)
                    .find_map(|a| a.address.parse::<IpAddr>().ok())
            };
            let addr = pick("ExternalIP")
                .or_else(|| pick("InternalIP"))
                .ok_or_else(|| format!("Node {name} has no InternalIP or ExternalIP"))?;
            out.push((name, addr));
        }
        out.sort();
        Ok(out)
    }

    /// The records kube-apiserver's audit log holds so far: every request of nodelb's
    /// ServiceAccounts (those of namespace `nodelb-system`), whatever its verb, and every write
    /// of anyone (`None` against an external cluster, whose audit log the tests cannot read).
    pub fn audit_records(&self) -> Option<Vec<crate::control_plane::AuditRecord>> {
        let path = self.audit_log.as_ref()?;
        let text = std::fs::read_to_string(path).unwrap_or_default();
        Some(crate::control_plane::parse_audit(&text))
    }

    /// Node names and addresses.
    pub fn nodes(&self) -> &[(String, IpAddr)] {
        &self.nodes
    }

    /// The address of node `name`.
    pub fn node_address(&self, name: &str) -> IpAddr {
        self.nodes
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, a)| *a)
            .unwrap_or_else(|| panic!("no node {name} in {:?}", self.nodes))
    }

    /// Whether this is `scripts/cluster.sh`'s cluster, whose nodes the tests may stop.
    pub fn is_managed(&self) -> bool {
        self.managed
    }

    pub fn backend_image(&self) -> &str {
        &self.backend_image
    }

    pub fn agent_image(&self) -> &str {
        &self.agent_image
    }

    pub fn admin(&self) -> &Client {
        &self.admin
    }

    pub fn client(&self) -> &Netns {
        &self.client
    }

    pub fn block_on<F: std::future::Future>(&self, f: F) -> F::Output {
        self.rt.block_on(f)
    }

    /// Runs the pinned kubectl against the cluster; stdout, or an error with stderr.
    pub fn kubectl(&self, args: &[&str]) -> Result<String, String> {
        self.kubectl_input(args, None)
    }

    /// Like [`RealCluster::kubectl`], with `input` on stdin (`-f -`).
    pub fn kubectl_input(&self, args: &[&str], input: Option<&str>) -> Result<String, String> {
        self.run_against(&self.kubectl, args, input)
    }

    /// Runs the pinned `helm` (`scripts/helm.sh` builds it) against the cluster.
    pub fn helm(&self, args: &[&str]) -> Result<String, String> {
        self.run_against(&crate::control_plane::helm()?, args, None)
    }

    /// Runs a client tool with `--kubeconfig` of the cluster; stdout, or an error with stderr.
    fn run_against(
        &self,
        tool: &Path,
        args: &[&str],
        input: Option<&str>,
    ) -> Result<String, String> {
        use std::io::Write;
        let name = tool.file_name().unwrap_or_default().to_string_lossy();
        let mut child = Command::new(tool)
            .arg(format!("--kubeconfig={}", self.kubeconfig.display()))
            .args(args)
            .stdin(if input.is_some() {
                Stdio::piped()
            } else {
                Stdio::null()
            })
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|e| format!("running {name}: {e}"))?;
        if let Some(text) = input {
            let mut stdin = child.stdin.take().expect("piped stdin");
            stdin
                .write_all(text.as_bytes())
                .map_err(|e| format!("{name} stdin: {e}"))?;
        }
        let out = child
            .wait_with_output()
            .map_err(|e| format!("{name}: {e}"))?;
        if out.status.success() {
            Ok(String::from_utf8_lossy(&out.stdout).into_owned())
        } else {
            Err(format!(
                "{name} {} failed ({}): {}",
                args.join(" "),
                out.status,
                String::from_utf8_lossy(&out.stderr).trim()
            ))
        }
    }

    /// `kubectl apply -f -` of YAML text.
    pub fn apply(&self, yaml: &str) -> Result<String, String> {
        self.kubectl_input(&["apply", "-f", "-"], Some(yaml))
    }

    /// Installs nodelb the way users do: `kubectl apply -k` of a kustomization of the test's
    /// own whose resources are `manifests/<overlay>` (`""` for `manifests/` itself), with an
    /// `images:` override naming the image under test; then waits for
    /// `kubectl rollout status ds/nodelb-agent`. Returns how long the rollout took.
    pub fn install(&self, overlay: &str) -> Result<Duration, String> {
        let began = Instant::now();
        let dir = self.kustomization(overlay, &[])?;
        let result = self
            .kubectl(&["apply", "-k", &dir.display().to_string()])
            .and_then(|_| self.rollout_status(Duration::from_secs(180)));
        let _ = std::fs::remove_dir_all(&dir);
        result.map(|_| began.elapsed())
    }

    /// Removes what [`RealCluster::install`] installed (`kubectl delete -k`, waiting until it
    /// is gone), so that Helm can install the same objects: it adopts none it did not create.
    pub fn remove_kustomized(&self) -> Result<(), String> {
        let dir = self.kustomization("", &[])?;
        let result = self.kubectl(&[
            "delete",
            "-k",
            &dir.display().to_string(),
            "--ignore-not-found",
            "--wait=true",
            "--timeout=180s",
        ]);
        let _ = std::fs::remove_dir_all(&dir);
        result.map(|_| ())
    }

    /// `helm install nodelb charts/nodelb` with the image under test and `--set` values,
    /// waiting for the agents (`--wait`), or only the server's answer (`--dry-run=server`).
    pub fn helm_install(&self, set: &[&str], dry_run: bool) -> Result<String, String> {
        let (name, tag) = self
            .agent_image
            .rsplit_once(':')
            .ok_or_else(|| format!("image {} has no tag", self.agent_image))?;
        let chart = repo().join("charts/nodelb").display().to_string();
        let image = format!("image.repository={name},image.tag={tag}");
        let mut args = vec!["install", "nodelb", &chart, "--set", &image];
        for s in set {
            args.extend(["--set", s]);
        }
        args.extend(if dry_run {
            ["--dry-run=server"].as_slice()
        } else {
            ["--wait", "--timeout=180s"].as_slice()
        });
        self.helm(&args)
    }

    /// A kustomization directory of the test's own (under the repository's `target/`, so the
    /// resources are a relative path, as kustomize requires) naming `manifests/<overlay>` and
    /// the image under test, with extra `patches:` entries (YAML list items).
    pub fn kustomization(&self, overlay: &str, patches: &[&str]) -> Result<PathBuf, String> {
        let mut extra = String::new();
        if !patches.is_empty() {
            extra.push_str("patches:\n");
            for p in patches {
                extra.push_str(p);
            }
        }
        self.kustomization_with(overlay, &extra)
    }

    /// Like [`RealCluster::kustomization`], with `extra` (top-level YAML fields, such as
    /// `namespace:` or `patches:`) appended.
    pub fn kustomization_with(&self, overlay: &str, extra: &str) -> Result<PathBuf, String> {
        let resource = if overlay.is_empty() {
            "../../../manifests".to_string()
        } else {
            format!("../../../manifests/{overlay}")
        };
        let (name, tag) = self
            .agent_image
            .rsplit_once(':')
            .ok_or_else(|| format!("image {} has no tag", self.agent_image))?;
        write_kustomization(&format!(
            "resources: [{resource}]\n\
             images:\n  - {{name: {MANIFEST_IMAGE}, newName: {name}, newTag: {tag}}}\n{extra}"
        ))
    }

    /// `kubectl -n nodelb-system rollout status ds/nodelb-agent`.
    pub fn rollout_status(&self, timeout: Duration) -> Result<String, String> {
        self.rollout_status_in(NODELB_NAMESPACE, timeout)
    }

    /// `kubectl -n <namespace> rollout status ds/nodelb-agent`.
    pub fn rollout_status_in(&self, namespace: &str, timeout: Duration) -> Result<String, String> {
        self.rollout_of(namespace, &format!("ds/{DAEMONSET}"), timeout)
    }

    /// `kubectl -n <namespace> rollout status <object>`: waits until its rollout is done.
    pub fn rollout_of(
        &self,
        namespace: &str,
        object: &str,
        timeout: Duration,
    ) -> Result<String, String> {
        self.kubectl(&[
            "-n",
            namespace,
            "rollout",
            "status",
            object,
            &format!("--timeout={}s", timeout.as_secs()),
        ])
    }

    /// The nodelb agent pods: (pod name, node name).
    pub fn agent_pods(&self) -> Result<Vec<(String, String)>, String> {
        self.agent_pods_in(NODELB_NAMESPACE)
    }

    /// The agent pods of an install in `namespace`: (pod name, node name).
    pub fn agent_pods_in(&self, namespace: &str) -> Result<Vec<(String, String)>, String> {
        let out = self.kubectl(&[
            "-n",
            namespace,
            "get",
            "pods",
            "-l",
            "app.kubernetes.io/name=nodelb,app.kubernetes.io/component=agent",
            "-o",
            "jsonpath={range .items[*]}{.metadata.name} {.spec.nodeName}{\"\\n\"}{end}",
        ])?;
        Ok(out
            .lines()
            .filter_map(|l| l.split_once(' '))
            .map(|(p, n)| (p.to_string(), n.to_string()))
            .collect())
    }

    /// The holder of the Lease `nodelb-status` in `namespace`: the status leader's Pod (`""`
    /// when none holds it).
    pub fn status_leader_in(&self, namespace: &str) -> Result<String, String> {
        self.kubectl(&[
            "-n",
            namespace,
            "get",
            "lease",
            "nodelb-status",
            "-o",
            "jsonpath={.spec.holderIdentity}",
        ])
    }

    /// What the cluster says about Service `ns`/`svc` and its nodes, for a test's failure
    /// message: the Service's `nodelb.io/Serving` condition; per node its Ready condition and
    /// taints, its kubelet's Lease renewal, the agent's heartbeat Lease and the agent Pod's
    /// readiness and restarts; where the Service's backends run; the status leader's last log
    /// lines. Whatever cannot be read says so in its line.
    pub fn explain(&self, ns: &str, svc: &str) -> String {
        let mut out = format!("--- the cluster at {:?} (this machine's clock)\n", {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap_or_default()
        });
        out += &format!(
            "Serving of {ns}/{svc}: {}\n",
            match self.service(ns, svc) {
                Ok(s) => format!("{:?}", serving_condition(&s)),
                Err(e) => e,
            }
        );
        for (node, _) in &self.nodes {
            out += &self.explain_node(node);
        }
        out += &format!(
            "agent Pods (name node ready restarts):\n{}\n",
            shown(self.kubectl(&[
                "-n",
                NODELB_NAMESPACE,
                "get",
                "pods",
                "-o",
                "jsonpath={range .items[*]}  {.metadata.name} {.spec.nodeName} \
                 {.status.conditions[?(@.type==\"Ready\")].status} \
                 {.status.containerStatuses[0].restartCount}{\"\\n\"}{end}",
            ]))
        );
        out += &format!(
            "Pods of {ns} (name node phase ready):\n{}\n",
            shown(self.kubectl(&[
                "-n",
                ns,
                "get",
                "pods",
                "-o",
                "jsonpath={range .items[*]}  {.metadata.name} {.spec.nodeName} {.status.phase} \
                 {.status.conditions[?(@.type==\"Ready\")].status}{\"\\n\"}{end}",
            ]))
        );
        let leader = shown(self.status_leader_in(NODELB_NAMESPACE));
        out += &format!(
            "the status leader {leader}'s last lines:\n{}\n",
            shown(self.kubectl(&["-n", NODELB_NAMESPACE, "logs", &leader, "--tail=20"]))
        );
        out
    }

    /// [`RealCluster::explain`]'s lines of one node.
    fn explain_node(&self, node: &str) -> String {
        format!(
            "node {node}: {}\n  kubelet Lease: {}\n  heartbeat Lease: {}\n",
            shown(self.kubectl(&[
                "get",
                "node",
                node,
                "-o",
                "jsonpath=Ready={.status.conditions[?(@.type==\"Ready\")].status} \
                     taints={.spec.taints[*].key}",
            ])),
            shown(self.kubectl(&[
                "-n",
                "kube-node-lease",
                "get",
                "lease",
                node,
                "-o",
                "jsonpath={.spec.renewTime}",
            ])),
            shown(self.kubectl(&[
                "-n",
                NODELB_NAMESPACE,
                "get",
                "lease",
                &format!("nodelb-node-{node}"),
                "-o",
                "jsonpath={.spec.holderIdentity} renewed {.spec.renewTime} \
                     {.metadata.annotations}",
            ])),
        )
    }

    /// The agent pod's `/metrics`, as a Prometheus inside the cluster reads it: over HTTPS to
    /// its node's address, with a ServiceAccount token allowed to `get` `/metrics` (from the
    /// node's own network namespace on `scripts/cluster.sh`'s cluster, from this process's
    /// elsewhere).
    pub fn agent_metrics(&self, pod: &str) -> Result<String, String> {
        let pods = self.agent_pods()?;
        let node = pods
            .iter()
            .find(|(p, _)| p == pod)
            .map(|(_, n)| n.clone())
            .ok_or_else(|| format!("no agent pod {pod} among {pods:?}"))?;
        let url = format!(
            "https://{}/metrics",
            SocketAddr::new(self.node_address(&node), 9255)
        );
        let token = self.scrape_token()?;
        match self.curl(self.in_cluster(&node), &url, Some(&token))? {
            (200, body) => Ok(body),
            (code, body) => Err(format!("GET {url} from node {node}: HTTP {code}: {body}")),
        }
    }

    /// A fresh token of the ServiceAccount `default/e2e-metrics-scraper`, created with its
    /// binding to the ClusterRole `nodelb-metrics-reader` (which the manifests install) when
    /// missing. Outside nodelb's namespace and names, so that an uninstall neither takes it
    /// nor counts it as left behind.
    pub fn scrape_token(&self) -> Result<String, String> {
        self.apply(
            "apiVersion: v1
kind: ServiceAccount
metadata:
  name: e2e-metrics-scraper
  namespace: default
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata:
  name: e2e-metrics-scraper
roleRef:
  apiGroup: rbac.authorization.k8s.io
  kind: ClusterRole
  name: nodelb-metrics-reader
subjects:
  - kind: ServiceAccount
    name: e2e-metrics-scraper
    namespace: default
",
        )?;
        self.token_of("default", "e2e-metrics-scraper")
    }

    /// A fresh token of ServiceAccount `ns`/`name` (an hour long).
    pub fn token_of(&self, ns: &str, name: &str) -> Result<String, String> {
        self.kubectl(&["-n", ns, "create", "token", name, "--duration=1h"])
            .map(|t| t.trim().to_string())
    }

    /// Where a client inside the cluster runs: node `node`'s network namespace on
    /// `scripts/cluster.sh`'s cluster (a host-network pod there), else this process's own.
    pub fn in_cluster(&self, node: &str) -> Option<String> {
        self.managed.then(|| format!("nodelb-{node}"))
    }

    /// `curl` of `url` from network namespace `netns` (`None`: this process's), trusting any
    /// certificate, with `token` as the bearer token: the HTTP status and the body, or why
    /// there was none (curl's exit status and message: 7 is a refused connection).
    pub fn curl(
        &self,
        netns: Option<String>,
        url: &str,
        token: Option<&str>,
    ) -> Result<(u16, String), String> {
        let mut cmd = match &netns {
            Some(ns) => {
                let mut c = Command::new("ip");
                c.args(["netns", "exec", ns, "curl"]);
                c
            }
            None => Command::new("curl"),
        };
        cmd.args(["-sS", "-k", "--max-time", "5", "-w", "\n%{http_code}", url]);
        if token.is_some() {
            // From standard input, so the token is not on a command line.
            cmd.args(["-H", "@-"]);
            cmd.stdin(Stdio::piped());
        }
        cmd.stdout(Stdio::piped()).stderr(Stdio::piped());
        let mut child = cmd.spawn().map_err(|e| format!("running curl: {e}"))?;
        if let Some(t) = token {
            use std::io::Write;
            let mut stdin = child.stdin.take().expect("a piped stdin");
            writeln!(stdin, "Authorization: Bearer {t}").map_err(|e| e.to_string())?;
        }
        let out = child.wait_with_output().map_err(|e| e.to_string())?;
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        if !out.status.success() {
            return Err(format!(
                "curl {url} from {}: {} ({})",
                netns.as_deref().unwrap_or("this namespace"),
                String::from_utf8_lossy(&out.stderr).trim(),
                out.status
            ));
        }
        let (body, code) = text.rsplit_once('\n').unwrap_or(("", &text));
        let code = code
            .trim()
            .parse()
            .map_err(|_| format!("curl {url}: no status in {text:?}"))?;
        Ok((code, body.to_string()))
    }

    /// `curl` of `url` from the client namespace (a client of a Service, outside the cluster),
    /// as [`RealCluster::curl`].
    pub fn curl_from_client(
        &self,
        url: &str,
        token: Option<&str>,
    ) -> Result<(u16, String), String> {
        let ns = (!self.client.name().is_empty()).then(|| self.client.name().to_string());
        self.curl(ns, url, token)
    }

    /// A Service.
    pub fn service(&self, ns: &str, name: &str) -> Result<Service, String> {
        self.block_on(async {
            Api::<Service>::namespaced(self.admin.clone(), ns)
                .get(name)
                .await
                .map_err(|e| format!("getting Service {ns}/{name}: {e}"))
        })
    }

    /// Deletes namespace `name` if it exists and waits up to `limit` for it to be gone (a
    /// namespace of thousands of objects takes minutes).
    pub fn delete_namespace(&self, name: &str, limit: Duration) -> Result<String, String> {
        self.kubectl(&[
            "delete",
            "namespace",
            name,
            "--ignore-not-found",
            "--wait=true",
            &format!("--timeout={}s", limit.as_secs()),
        ])
    }

    /// A namespace of the test's own, created now (deleted by the guard's drop, without
    /// waiting for it to be gone).
    pub fn namespace(&'static self, name: &str) -> TestNamespace {
        let _ = self.delete_namespace(name, Duration::from_secs(120));
        self.kubectl(&["create", "namespace", name])
            .unwrap_or_else(|e| panic!("{e}"));
        TestNamespace {
            cluster: self,
            name: name.to_string(),
        }
    }

    /// One TCP request from the client namespace; answered after more than [`SLOW`], it is
    /// [`Outcome::Slow`].
    pub fn tcp_request(&self, dst: SocketAddr) -> Outcome {
        bounded(|| traffic::tcp_request(&self.client, dst, Duration::from_secs(3)))
    }

    /// `nft <args>` run in node `name`'s network namespace (`scripts/cluster.sh`'s nodes only).
    pub fn nft(&self, node: &str, args: &[&str]) -> Result<String, String> {
        let Some(netns) = self.in_cluster(node) else {
            return Err("reading a node's nftables needs scripts/cluster.sh's nodes".into());
        };
        let out = Command::new("ip")
            .args(["netns", "exec", &netns, "nft"])
            .args(args)
            .output()
            .map_err(|e| format!("running nft in node {node}: {e}"))?;
        if out.status.success() {
            Ok(String::from_utf8_lossy(&out.stdout).into_owned())
        } else {
            Err(String::from_utf8_lossy(&out.stderr).trim().to_string())
        }
    }

    /// `scripts/cluster.sh <args>` (its own cluster only).
    pub fn cluster_sh(&self, args: &[&str]) -> Result<String, String> {
        if !self.managed {
            return Err("this needs scripts/cluster.sh's cluster".into());
        }
        let mut full = vec!["cluster.sh"];
        full.extend_from_slice(args);
        script(&full)
    }

    /// Waits until `f` holds, polling every 100 ms; returns how long it took.
    pub fn until<T>(
        &self,
        what: &str,
        timeout: Duration,
        mut f: impl FnMut() -> Result<T, String>,
    ) -> (T, Duration) {
        let began = Instant::now();
        let v = wait_for(what, timeout, || {
            let r = f();
            if r.is_err() {
                std::thread::sleep(Duration::from_millis(50));
            }
            r
        });
        (v, began.elapsed())
    }
}

/// The nodelb agent processes running on `node` (found by their command line, `nodelb-agent
/// run`, and the `NODE_NAME` the DaemonSet gives them): one while the node is served.
pub fn agent_pids(node: &str) -> Vec<i32> {
    pids_of("nodelb-agent", Some("run"), &format!("NODE_NAME={node}"))
}

/// The processes of this machine whose program's path ends with `program`, whose first
/// argument is `arg` (when given) and whose environment holds `env` (`NAME=value`): how a test
/// finds a container's process (a pod's `POD_NAME`, a DaemonSet's `NODE_NAME`) on
/// `scripts/cluster.sh`'s nodes, which share the machine's process table.
pub fn pids_of(program: &str, arg: Option<&str>, env: &str) -> Vec<i32> {
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    dir.filter_map(|e| e.ok()?.file_name().to_str()?.parse::<i32>().ok())
        .filter(|pid| {
            let read = |f: &str| std::fs::read(format!("/proc/{pid}/{f}")).unwrap_or_default();
            let fields = |b: Vec<u8>| -> Vec<String> {
                b.split(|c| *c == 0)
                    .map(|f| String::from_utf8_lossy(f).into_owned())
                    .collect()
            };
            let cmdline = fields(read("cmdline"));
            cmdline.first().is_some_and(|c| c.ends_with(program))
                && arg.is_none_or(|arg| cmdline.get(1).is_some_and(|a| a == arg))
                && fields(read("environ")).iter().any(|e| e == env)
        })
        .collect()
}

/// A test's namespace. On drop its Services are deleted (waiting, so the next test's Services
/// find their ports free: a Service in a namespace being deleted still holds its ports until it
/// is gone, which takes the namespace controller tens of seconds), then the namespace (not
/// waiting).
pub struct TestNamespace {
    cluster: &'static RealCluster,
    name: String,
}

impl TestNamespace {
    pub fn name(&self) -> &str {
        &self.name
    }
}

impl Drop for TestNamespace {
    fn drop(&mut self) {
        let c = self.cluster;
        let _ = c.kubectl(&[
            "-n",
            &self.name,
            "delete",
            "services",
            "--all",
            "--wait=true",
        ]);
        let _ = c.kubectl(&["delete", "namespace", &self.name, "--wait=false"]);
    }
}

/// The backend Deployment: `replicas` pods of the backend image spread evenly over the
/// schedulable nodes (a cordoned node counts, so a pod evicted by a drain waits for the
/// uncordon rather than doubling up: `Local` tests rely on one pod per node; only the pods of
/// one rollout's ReplicaSet count, so a rollout spreads its own pods whatever the old ones left
/// behind, as after a node that came back empty), ready
/// when their TCP port accepts, draining through a `preStop` sleep of `drain_seconds`.
pub fn backend_deployment(
    ns: &str,
    name: &str,
    image: &str,
    replicas: u32,
    drain_seconds: u32,
) -> String {
    backend_deployment_on(ns, name, image, replicas, drain_seconds, None)
}

/// [`backend_deployment`], its pods on node `node` only when given (`kubernetes.io/hostname`).
pub fn backend_deployment_on(
    ns: &str,
    name: &str,
    image: &str,
    replicas: u32,
    drain_seconds: u32,
    node: Option<&str>,
) -> String {
    let node_selector = node
        .map(|n| format!("      nodeSelector: {{kubernetes.io/hostname: {n}}}\n"))
        .unwrap_or_default();
    format!(
        r#"apiVersion: apps/v1
kind: Deployment
metadata: {{name: {name}, namespace: {ns}}}
spec:
  replicas: {replicas}
  selector: {{matchLabels: {{app: {name}}}}}
  strategy: {{type: RollingUpdate, rollingUpdate: {{maxSurge: 1, maxUnavailable: 0}}}}
  template:
    metadata: {{labels: {{app: {name}}}}}
    spec:
      terminationGracePeriodSeconds: {grace}
{node_selector}      topologySpreadConstraints:
        - {{maxSkew: 1, topologyKey: kubernetes.io/hostname, whenUnsatisfiable: DoNotSchedule,
            labelSelector: {{matchLabels: {{app: {name}}}}}, matchLabelKeys: [pod-template-hash]}}
      containers:
        - name: backend
          image: {image}
          imagePullPolicy: IfNotPresent
          command: ["/nodelb-test-backend"]
          env:
            - name: POD_NAME
              valueFrom: {{fieldRef: {{fieldPath: metadata.name}}}}
          ports:
            - {{containerPort: {tcp}, protocol: TCP}}
            - {{containerPort: {echo}, protocol: TCP}}
            - {{containerPort: {udp}, protocol: UDP}}
          readinessProbe:
            tcpSocket: {{port: {tcp}}}
            periodSeconds: 1
            failureThreshold: 1
          lifecycle:
            preStop:
              exec: {{command: ["/bin/sleep", "{drain_seconds}"]}}
"#,
        grace = drain_seconds + 10,
        tcp = BACKEND_TCP_PORT,
        echo = BACKEND_ECHO_PORT,
        udp = BACKEND_UDP_PORT,
    )
}

/// A LoadBalancer Service for Deployment `app`'s backends on ports `first`, `first + 1` and
/// `first + 2`: TCP `http` -> 8080 (one line per connection), TCP `echo` -> 8081 (a line per
/// line), UDP `udp` -> 9000. `spec_extra` is appended to the spec (indented two spaces).
pub fn backend_service(ns: &str, name: &str, app: &str, first: u16, spec_extra: &str) -> String {
    format!(
        r#"apiVersion: v1
kind: Service
metadata: {{name: {name}, namespace: {ns}}}
spec:
  type: LoadBalancer
  selector: {{app: {app}}}
  ports:
    - {{name: http, port: {first}, targetPort: {tcp}, protocol: TCP}}
    - {{name: echo, port: {echo_port}, targetPort: {echo}, protocol: TCP}}
    - {{name: udp, port: {udp_port}, targetPort: {udp}, protocol: UDP}}
{spec_extra}"#,
        echo_port = first + 1,
        udp_port = first + 2,
        tcp = BACKEND_TCP_PORT,
        echo = BACKEND_ECHO_PORT,
        udp = BACKEND_UDP_PORT,
    )
}

/// The pod name in a backend's reply ("<pod> <peer-ip>").
pub fn pod_of(reply: &str) -> &str {
    reply.split_whitespace().next().unwrap_or_default()
}

/// A kubectl answer as a line of [`RealCluster::explain`]: trimmed, or why it was unreadable.
fn shown(r: Result<String, String>) -> String {
    match r {
        Ok(s) => s.trim().to_string(),
        Err(e) => format!("(unreadable: {})", e.trim()),
    }
}

/// The ingress addresses and the `nodelb.io/Serving` condition (status, reason, message) of
/// a Service, as JSON values for printing.
pub fn serving_condition(svc: &Service) -> Option<(String, String, String)> {
    let conds = svc.status.as_ref()?.conditions.as_ref()?;
    conds
        .iter()
        .find(|c| c.type_ == "nodelb.io/Serving")
        .map(|c| (c.status.clone(), c.reason.clone(), c.message.clone()))
}

/// Parses `kubectl get ... -o json` output.
pub fn json(text: &str) -> Result<Value, String> {
    serde_json::from_str(text).map_err(|e| format!("bad JSON from kubectl: {e}"))
}

/// What a [`TcpLoad`] saw.
#[derive(Debug, Clone)]
pub struct LoadReport {
    /// When the load began: the failures' times count from here.
    pub began: Instant,
    /// Connections answered, per pod.
    pub answered: BTreeMap<String, usize>,
    /// Connections that failed: when, to where, what happened.
    pub failed: Vec<(Duration, SocketAddr, Outcome)>,
    /// How long the load ran.
    pub ran: Duration,
}

impl LoadReport {
    pub fn total(&self) -> usize {
        self.answered.values().sum::<usize>() + self.failed.len()
    }
}

/// How long a load test's connection may take, from its first SYN to the backend's answer,
/// before it counts as failed: a SYN the network dropped once is sent again after a second,
/// a stall users feel, so it must not pass as a success.
pub const SLOW: Duration = Duration::from_millis(900);

/// `exchange`'s outcome, made [`Outcome::Slow`] when its answer took more than [`SLOW`].
pub fn bounded(exchange: impl FnOnce() -> Outcome) -> Outcome {
    let sent = Instant::now();
    match exchange() {
        Outcome::Answered(r) if sent.elapsed() > SLOW => Outcome::Slow(sent.elapsed(), r),
        other => other,
    }
}

/// Steady client load: new TCP connections from the client namespace to each target in turn,
/// one every `interval`, each reading the backend's one-line answer; until [`TcpLoad::stop`].
/// A connection answered after more than [`SLOW`] is a failure ([`Outcome::Slow`]).
pub struct TcpLoad {
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    thread: Option<std::thread::JoinHandle<LoadReport>>,
}

impl TcpLoad {
    pub fn start(client: &Netns, targets: Vec<SocketAddr>, interval: Duration) -> TcpLoad {
        use std::sync::atomic::{AtomicBool, Ordering};
        let stop = std::sync::Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        let ns = std::fs::File::open(client.path())
            .unwrap_or_else(|e| panic!("opening {}: {e}", client.path().display()));
        let name = client.name().to_string();
        let thread = std::thread::Builder::new()
            .name("tcp-load".into())
            .spawn(move || {
                crate::netns::enter(&ns, &name);
                let began = Instant::now();
                let mut report = LoadReport {
                    began,
                    answered: BTreeMap::new(),
                    failed: Vec::new(),
                    ran: Duration::ZERO,
                };
                let mut next = Instant::now();
                let mut i = 0;
                while !flag.load(Ordering::Relaxed) {
                    let dst = targets[i % targets.len()];
                    i += 1;
                    match bounded(|| traffic::tcp_exchange_here(dst, Duration::from_secs(3))) {
                        Outcome::Answered(r) => {
                            *report.answered.entry(pod_of(&r).to_string()).or_default() += 1;
                        }
                        other => report.failed.push((began.elapsed(), dst, other)),
                    }
                    next += interval;
                    std::thread::sleep(next.saturating_duration_since(Instant::now()));
                }
                report.ran = began.elapsed();
                report
            })
            .expect("a load thread");
        TcpLoad {
            stop,
            thread: Some(thread),
        }
    }

    /// Stops the load and reports what it saw.
    pub fn stop(mut self) -> LoadReport {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        self.thread
            .take()
            .expect("running")
            .join()
            .expect("the load thread")
    }
}

impl Drop for TcpLoad {
    fn drop(&mut self) {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// Published addresses, each time they changed: (time since the watch started, addresses).
type Versions = Vec<(Duration, BTreeSet<String>)>;

/// Every version of one Service's published addresses, as a watch on the server delivers them,
/// from when [`StatusWatch::start`] returned until [`StatusWatch::stop`].
pub struct StatusWatch {
    task: tokio::task::JoinHandle<()>,
    seen: std::sync::Arc<Mutex<Versions>>,
    began: Instant,
}

impl StatusWatch {
    /// Watches Service `ns`/`name` (which must exist): the first entry is its ingress now.
    pub fn start(c: &RealCluster, ns: &str, name: &str) -> StatusWatch {
        use futures::{StreamExt, TryStreamExt};
        use kube::runtime::{watcher, WatchStreamExt};
        let api: Api<Service> = Api::namespaced(c.admin.clone(), ns);
        let seen = std::sync::Arc::new(Mutex::new(Vec::new()));
        let log = seen.clone();
        let began = Instant::now();
        let cfg = watcher::Config::default().fields(&format!("metadata.name={name}"));
        let (ready_tx, ready_rx) = std::sync::mpsc::channel();
        let task = c.rt.spawn(async move {
            let mut stream = watcher(api, cfg).applied_objects().boxed();
            let mut ready = Some(ready_tx);
            while let Ok(Some(svc)) = stream.try_next().await {
                let ips: BTreeSet<String> = crate::e2e::ingress_ips(&svc).into_iter().collect();
                let mut log = log.lock().expect("status log");
                if log.last().map(|(_, l)| l) != Some(&ips) {
                    log.push((began.elapsed(), ips));
                }
                if let Some(tx) = ready.take() {
                    let _ = tx.send(());
                }
            }
        });
        ready_rx
            .recv_timeout(Duration::from_secs(30))
            .unwrap_or_else(|_| panic!("the watch on Service {ns}/{name} delivered nothing"));
        StatusWatch { task, seen, began }
    }

    /// When the watch started: the versions' times count from here.
    pub fn began(&self) -> Instant {
        self.began
    }

    /// The published addresses, each time they changed: (time since the start, addresses).
    pub fn stop(self) -> Versions {
        self.task.abort();
        self.seen.lock().expect("status log").clone()
    }
}

/// When each pod of a namespace began terminating and when it was gone, as a watch on the
/// server delivers them, from [`PodWatch::start`] to [`PodWatch::stop`].
pub struct PodWatch {
    task: tokio::task::JoinHandle<()>,
    seen: std::sync::Arc<Mutex<BTreeMap<String, PodTimes>>>,
}

/// One pod's ends, on this process's clock.
#[derive(Debug, Clone, Default)]
pub struct PodTimes {
    /// When its deletion was first seen (its `preStop` hook starts then).
    pub deleting: Option<Instant>,
    /// When it was gone from the server.
    pub gone: Option<Instant>,
}

impl PodWatch {
    pub fn start(c: &RealCluster, ns: &str) -> PodWatch {
        use futures::TryStreamExt;
        use k8s_openapi::api::core::v1::Pod;
        use kube::runtime::watcher::{self, Event};
        let api: Api<Pod> = Api::namespaced(c.admin.clone(), ns);
        let seen = std::sync::Arc::new(Mutex::new(BTreeMap::<String, PodTimes>::new()));
        let log = seen.clone();
        let (ready_tx, ready_rx) = std::sync::mpsc::channel();
        let task = c.rt.spawn(async move {
            let mut stream = std::pin::pin!(watcher::watcher(api, watcher::Config::default()));
            let mut ready = Some(ready_tx);
            while let Ok(Some(event)) = stream.try_next().await {
                let now = Instant::now();
                let mut log = log.lock().expect("pod log");
                match event {
                    Event::Apply(p) | Event::InitApply(p) => {
                        let t = log
                            .entry(p.metadata.name.clone().unwrap_or_default())
                            .or_default();
                        if p.metadata.deletion_timestamp.is_some() && t.deleting.is_none() {
                            t.deleting = Some(now);
                        }
                    }
                    Event::Delete(p) => {
                        let t = log
                            .entry(p.metadata.name.clone().unwrap_or_default())
                            .or_default();
                        t.deleting.get_or_insert(now);
                        t.gone = Some(now);
                    }
                    Event::InitDone => {
                        if let Some(tx) = ready.take() {
                            let _ = tx.send(());
                        }
                    }
                    Event::Init => {}
                }
            }
        });
        ready_rx
            .recv_timeout(Duration::from_secs(30))
            .unwrap_or_else(|_| panic!("the watch on pods in {ns} delivered nothing"));
        PodWatch { task, seen }
    }

    pub fn stop(self) -> BTreeMap<String, PodTimes> {
        self.task.abort();
        self.seen.lock().expect("pod log").clone()
    }
}
