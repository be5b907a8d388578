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

use std::collections::BTreeMap;
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
}

/// Lines `KEY=value` of a script's output.
fn keyed_lines(text: &str) -> BTreeMap<String, String> {
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

    fn start() -> Result<RealCluster, String> {
        let kubectl = crate::control_plane::kubectl()?;
        let (kubeconfig, client, managed, agent_image, backend_image) = match external_cluster() {
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
                (kc, client, false, agent, backend)
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
        use std::io::Write;
        let mut child = Command::new(&self.kubectl)
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
            .map_err(|e| format!("running kubectl: {e}"))?;
        if let Some(text) = input {
            let mut stdin = child.stdin.take().expect("piped stdin");
            stdin
                .write_all(text.as_bytes())
                .map_err(|e| format!("kubectl stdin: {e}"))?;
        }
        let out = child
            .wait_with_output()
            .map_err(|e| format!("kubectl: {e}"))?;
        if out.status.success() {
            Ok(String::from_utf8_lossy(&out.stdout).into_owned())
        } else {
            Err(format!(
                "kubectl {} failed ({}): {}",
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

    /// A kustomization directory of the test's own (under the repository's `target/`, so the
    /// resources are a relative path, as kustomize requires) naming `manifests/<overlay>` and
    /// the image under test, with extra `patches:` entries (YAML list items).
    pub fn kustomization(&self, overlay: &str, patches: &[&str]) -> Result<PathBuf, String> {
        static N: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
        let n = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let dir = repo()
            .join("target")
            .join("kustomizations")
            .join(format!("{}-{n}", std::process::id()));
        std::fs::create_dir_all(&dir).map_err(|e| format!("creating {}: {e}", dir.display()))?;
        let resource = if overlay.is_empty() {
            "../../../manifests".to_string()
        } else {
            format!("../../../manifests/{overlay}")
        };
        let (name, tag) = self
            .agent_image
            .rsplit_once(':')
            .ok_or_else(|| format!("image {} has no tag", self.agent_image))?;
        let mut text = format!(
            "apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\n\
             resources: [{resource}]\n\
             images:\n  - {{name: {MANIFEST_IMAGE}, newName: {name}, newTag: {tag}}}\n"
        );
        if !patches.is_empty() {
            text.push_str("patches:\n");
            for p in patches {
                text.push_str(p);
            }
        }
        std::fs::write(dir.join("kustomization.yaml"), text)
            .map_err(|e| format!("writing the kustomization: {e}"))?;
        Ok(dir)
    }

    /// `kubectl -n nodelb-system rollout status ds/nodelb-agent`.
    pub fn rollout_status(&self, timeout: Duration) -> Result<String, String> {
        self.kubectl(&[
            "-n",
            NODELB_NAMESPACE,
            "rollout",
            "status",
            &format!("ds/{DAEMONSET}"),
            &format!("--timeout={}s", timeout.as_secs()),
        ])
    }

    /// The nodelb agent pods: (pod name, node name).
    pub fn agent_pods(&self) -> Result<Vec<(String, String)>, String> {
        let out = self.kubectl(&[
            "-n",
            NODELB_NAMESPACE,
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

    /// The agent pod's `/metrics`, through the API server's pod proxy (as a Prometheus
    /// scraping the pod would read it).
    pub fn agent_metrics(&self, pod: &str) -> Result<String, String> {
        self.kubectl(&[
            "get",
            "--raw",
            &format!("/api/v1/namespaces/{NODELB_NAMESPACE}/pods/{pod}:9255/proxy/metrics"),
        ])
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

    /// A namespace of the test's own, created now (deleted by the guard's drop, without
    /// waiting for it to be gone).
    pub fn namespace(&'static self, name: &str) -> TestNamespace {
        let _ = self.kubectl(&["delete", "namespace", name, "--wait=true", "--timeout=120s"]);
        self.kubectl(&["create", "namespace", name])
            .unwrap_or_else(|e| panic!("{e}"));
        TestNamespace {
            cluster: self,
            name: name.to_string(),
        }
    }

    /// One TCP request from the client namespace.
    pub fn tcp_request(&self, dst: SocketAddr) -> Outcome {
        traffic::tcp_request(&self.client, dst, Duration::from_secs(3))
    }

    /// `nft <args>` run in node `name`'s network namespace (`scripts/cluster.sh`'s nodes only).
    pub fn nft(&self, node: &str, args: &[&str]) -> Result<String, String> {
        if !self.managed {
            return Err("reading a node's nftables needs scripts/cluster.sh's nodes".into());
        }
        let out = Command::new("ip")
            .args(["netns", "exec", &format!("nodelb-{node}"), "nft"])
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

/// A test's namespace; deleted (without waiting) on drop.
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
        let _ = self
            .cluster
            .kubectl(&["delete", "namespace", &self.name, "--wait=false"]);
    }
}

/// The backend Deployment: `replicas` pods of the backend image spread over the nodes, ready
/// when their TCP port accepts, draining through a `preStop` sleep of `drain_seconds`.
pub fn backend_deployment(
    ns: &str,
    name: &str,
    image: &str,
    replicas: u32,
    drain_seconds: u32,
) -> String {
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
      topologySpreadConstraints:
        - {{maxSkew: 1, topologyKey: kubernetes.io/hostname, whenUnsatisfiable: ScheduleAnyway,
            labelSelector: {{matchLabels: {{app: {name}}}}}}}
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

/// A LoadBalancer Service for the backend: TCP 80 -> 8080, TCP 8081 -> 8081 (echo), UDP 5000
/// -> 9000. `spec_extra` is appended to the spec (indented two spaces).
pub fn backend_service(ns: &str, name: &str, spec_extra: &str) -> String {
    format!(
        r#"apiVersion: v1
kind: Service
metadata: {{name: {name}, namespace: {ns}}}
spec:
  type: LoadBalancer
  selector: {{app: {name}}}
  ports:
    - {{name: http, port: 80, targetPort: {tcp}, protocol: TCP}}
    - {{name: echo, port: 8081, targetPort: {echo}, protocol: TCP}}
    - {{name: udp, port: 5000, targetPort: {udp}, protocol: UDP}}
{spec_extra}"#,
        tcp = BACKEND_TCP_PORT,
        echo = BACKEND_ECHO_PORT,
        udp = BACKEND_UDP_PORT,
    )
}

/// The pod name in a backend's reply ("<pod> <peer-ip>").
pub fn pod_of(reply: &str) -> &str {
    reply.split_whitespace().next().unwrap_or_default()
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
