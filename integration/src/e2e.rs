//! End-to-end harness: the real `nodelb-agent` binary, one process per node namespace, against
//! an API server, with real traffic from client namespaces to backend namespaces.
//!
//! # Network
//!
//! Every namespace is created by the harness and deleted on drop; every address is a
//! documentation address; no namespace has a default route.
//!
//! | link                         | IPv4                                  | IPv6                          |
//! |------------------------------|---------------------------------------|-------------------------------|
//! | `api` - node `i`             | 192.0.2.(4i)/30: api .4i+1, node .4i+2 | —                             |
//! | client - node `i`            | 203.0.113.(16i)/28: node .16i+1, client .16i+2 | 2001:db8:c:i::/64: node ::1, client ::2 |
//! | stranger - node `i`          | 192.0.2.(128+16i)/28: node +1, stranger +2 | 2001:db8:d:i::/64: node ::1, stranger ::2 |
//! | node - backend `j`           | 198.51.100.(16j)/28: node +1, backend +2 | 2001:db8:b:j::/64: node ::1, backend ::2 |
//!
//! The node's client-facing addresses (203.0.113.(16i+1), 2001:db8:c:i::1) are its Node's
//! `InternalIP`s, so they are what the agent serves. The stranger (a second client, for
//! `loadBalancerSourceRanges`) routes the client subnets via its own link, so it reaches the
//! same node address as the client from another source address. Backends route every client
//! subnet back via their node, so replies that were not masqueraded return. Clients have no
//! route to the backends: a backend can only answer through the node's DNAT.
//!
//! Backend `j` hangs off node `j / backends_per_node`; its endpoints carry that node's name.
//! Nodes are not linked to one another, so an endpoint on another node is reachable only from
//! its own node (what `externalTrafficPolicy: Local` tests need; cross-node `Cluster` traffic
//! is not wired yet).
//!
//! # API server
//!
//! By default a real kube-apiserver with etcd, started for each cluster in the `api` namespace
//! ([`crate::control_plane`]; built from the pinned `k8s.io/kubernetes` module by
//! `scripts/kubernetes.sh`). The harness installs `manifests/` with the pinned
//! `kubectl apply --server-side -k`, creates Nodes, one agent Pod per node from the
//! DaemonSet's template, and gives each agent a token of the `nodelb` ServiceAccount bound to
//! its Pod (TokenRequest): the server's own authenticator and RBAC authorizer judge every agent
//! request. Agents reach the server over their own veth, so the audit log's source address says
//! which node asked. The test's admin (a static token in `system:masters`) reaches it through a
//! relay on 127.0.0.1 in the test's own namespace. A test that needs an older server puts
//! [`crate::old_server_proxy`] between the agents and the real one.
//!
//! **External cluster mode:** when `NODELB_E2E_KUBECONFIG` names a kubeconfig, the admin client
//! comes from it; the `api` namespace holds a TCP relay to the real server instead of the
//! double (the relay's outgoing connections leave from the root namespace), and agents get a
//! kubeconfig whose server is the relay address with `tls-server-name` set to the real host and
//! a token of the `nodelb-system/nodelb` ServiceAccount (TokenRequest; apply `manifests/`
//! first, or set `NODELB_E2E_AGENT_TOKEN`). Every test creates its own namespace and Nodes with
//! unique names and deletes them on drop. Audit assertions are skipped there, with a message.
//!
//! # The binary
//!
//! The agent binary is `NODELB_AGENT_BIN` when set; otherwise `target/<profile>/nodelb-agent`
//! next to the test executable's `deps/` directory, built first with
//! `cargo build -p nodelb-agent --bin nodelb-agent` when the test runs under cargo (`$CARGO`
//! is set), so a test never runs a stale agent. Cargo cannot hand one crate's binary to
//! another crate's tests (`CARGO_BIN_EXE_*` is per package and artifact dependencies are
//! unstable), hence this.

use std::fs::OpenOptions;
use std::io::{Read, Write};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Node;
use kube::api::{
    Api, ApiResource, DeleteParams, DynamicObject, GroupVersionKind, Patch, PatchParams, PostParams,
};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::Client;
use nix::sys::signal::Signal;
use nix::unistd::Pid;
use serde_json::{json, Value};

use crate::control_plane::{self, AuditRecord, ControlPlane, ControlPlaneOptions};
use crate::netns::{link, route, Netns};
use crate::old_server_proxy::{OldServer, OldServerProxy};

/// The agent's user: the ServiceAccount of `manifests/base/rbac.yaml`.
pub const AGENT_USER: &str = "system:serviceaccount:nodelb-system:nodelb";
/// The agent's namespace (its Leases live there).
pub const AGENT_NAMESPACE: &str = "nodelb-system";
/// `/healthz` and `/readyz` on 127.0.0.1 inside each node namespace.
pub const HEALTH_PORT: u16 = 19254;
/// `/metrics` on 127.0.0.1 inside each node namespace.
pub const METRICS_PORT: u16 = 19255;
/// Environment variable that switches to external cluster mode.
pub const REAL_KUBECONFIG_ENV: &str = "NODELB_E2E_KUBECONFIG";

const API_PORT: u16 = 6443;
const ADMIN_TOKEN: &str = "e2e-admin-token";
/// Where the old-server proxy listens in the `api` namespace, when a test asks for one.
const OLD_SERVER_PROXY_PORT: u16 = 6480;
const MAX_NODES: usize = 8;
const MAX_BACKENDS: usize = 16;
/// Upper bound for waiting on the agent to become ready.
const READY_WAIT: Duration = Duration::from_secs(30);
/// Lines of each agent's log printed when a test fails.
const LOG_TAIL: usize = 300;

static COUNTER: AtomicUsize = AtomicUsize::new(0);

/// What to build.
#[derive(Debug, Clone)]
pub struct ClusterOptions {
    /// Node namespaces, each with an agent (1..=8). Node `i` is named `node-a`, `node-b`, …
    /// (in external cluster mode with a unique prefix).
    pub nodes: usize,
    /// Backend namespaces per node.
    pub backends_per_node: usize,
    /// Run agents with `--ipv6=true` and give Nodes an IPv6 InternalIP too.
    pub ipv6: bool,
    /// More `run` flags for every agent. A `--resync-interval` here replaces the harness's
    /// default of 30 s.
    pub agent_args: Vec<String>,
    /// Every agent's `--resync-interval` (30 s: tests see a resync; benchmarks use the agent's
    /// default of 300 s).
    pub resync_interval: Duration,
    /// Agents reach kube-apiserver through a fault-injecting proxy that imitates an older
    /// server ([`OldServerProxy`]); the test's admin client talks to the server directly.
    /// Ignored against an external cluster.
    pub old_server: Option<OldServer>,
    /// Node `i`'s agent runs as `<prefix...> nodelb-agent run ...` (e.g. `faketime -f -60s`
    /// for a node clock a minute behind; the monotonic clock stays real).
    pub agent_prefix: std::collections::BTreeMap<usize, Vec<String>>,
}

impl Default for ClusterOptions {
    fn default() -> ClusterOptions {
        ClusterOptions {
            nodes: 1,
            backends_per_node: 3,
            ipv6: false,
            agent_args: Vec::new(),
            resync_interval: Duration::from_secs(30),
            old_server: None,
            agent_prefix: std::collections::BTreeMap::new(),
        }
    }
}

/// Which API server the agents talk to.
enum ApiBackend {
    /// etcd and kube-apiserver started for this cluster in the `api` namespace.
    Local {
        cp: Box<ControlPlane>,
        admin_kubeconfig: PathBuf,
        proxy: Option<OldServerProxy>,
    },
    External,
}

/// One node: its namespace, Node name, agent process and files.
pub struct NodeHost {
    pub name: String,
    pub ns: Netns,
    index: usize,
    kubeconfig: PathBuf,
    log: PathBuf,
    agent: Option<Agent>,
}

/// A running agent process; SIGKILLed and reaped on drop.
#[derive(Debug)]
pub struct Agent {
    child: Child,
}

impl Agent {
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Whether the process is still running (reaps it if it exited).
    pub fn running(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }

    fn signal(&self, sig: Signal) {
        // By pid: the process we started (`ip netns exec` execs the agent in place).
        let _ = nix::sys::signal::kill(Pid::from_raw(self.child.id() as i32), sig);
    }

    /// Sends `sig` and waits up to 10 s for the process to exit.
    fn stop(&mut self, sig: Signal) -> Option<std::process::ExitStatus> {
        self.signal(sig);
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline {
            if let Ok(Some(status)) = self.child.try_wait() {
                return Some(status);
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        self.signal(Signal::SIGKILL);
        self.child.wait().ok()
    }
}

impl Drop for Agent {
    fn drop(&mut self) {
        if self.running() {
            self.signal(Signal::SIGKILL);
            let _ = self.child.wait();
        }
    }
}

/// A test cluster: namespaces, API server, admin client, agents. Everything is torn down on
/// drop (agents killed by pid, namespaces deleted by name, real-mode objects deleted), and the
/// agents' logs are printed when the test is panicking.
pub struct Cluster {
    // Drop order: see `Drop for Cluster`; fields then drop in this order.
    nodes: Vec<NodeHost>,
    client: Netns,
    stranger: Netns,
    backends: Vec<Netns>,
    backend: ApiBackend,
    api_ns: Netns,
    admin: Client,
    namespace: String,
    node_prefix: String,
    options: ClusterOptions,
    dir: PathBuf,
    rt: Option<tokio::runtime::Runtime>,
}

/// True when `NODELB_E2E_KUBECONFIG` is set: tests run against that cluster.
pub fn external_cluster() -> Option<PathBuf> {
    std::env::var_os(REAL_KUBECONFIG_ENV)
        .filter(|v| !v.is_empty())
        .map(PathBuf::from)
}

/// The agent binary (see the module docs), built once per test process when running under
/// cargo.
pub fn agent_binary() -> PathBuf {
    static BIN: OnceLock<PathBuf> = OnceLock::new();
    BIN.get_or_init(|| {
        if let Some(bin) = std::env::var_os("NODELB_AGENT_BIN") {
            return PathBuf::from(bin);
        }
        let exe = std::env::current_exe().expect("the test executable's path");
        // target/<profile>/deps/e2e-<hash> → target/<profile>/nodelb-agent
        let profile_dir = exe
            .parent()
            .and_then(Path::parent)
            .expect("the test executable lives in target/<profile>/deps");
        let bin = profile_dir.join("nodelb-agent");
        if let Some(cargo) = std::env::var_os("CARGO") {
            let manifest = Path::new(env!("CARGO_MANIFEST_DIR")).join("../Cargo.toml");
            let mut cmd = Command::new(cargo);
            cmd.args([
                "build",
                "--quiet",
                "-p",
                "nodelb-agent",
                "--bin",
                "nodelb-agent",
            ])
            .arg("--manifest-path")
            .arg(&manifest);
            if profile_dir.file_name().is_some_and(|p| p == "release") {
                cmd.arg("--release");
            }
            let status = cmd
                .status()
                .unwrap_or_else(|e| panic!("cannot run cargo to build nodelb-agent: {e}"));
            assert!(
                status.success(),
                "`cargo build -p nodelb-agent --bin nodelb-agent` failed ({status})"
            );
        }
        assert!(
            bin.is_file(),
            "{} does not exist: run `cargo build -p nodelb-agent --bin nodelb-agent` or set \
             NODELB_AGENT_BIN",
            bin.display()
        );
        bin
    })
    .clone()
}

fn manifests_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../manifests")
}

/// Polls `f` every 50 ms until it returns `Ok`, for at most `timeout`; panics with `what` and
/// the last error otherwise.
pub fn wait_for<T>(what: &str, timeout: Duration, mut f: impl FnMut() -> Result<T, String>) -> T {
    let deadline = Instant::now() + timeout;
    loop {
        match f() {
            Ok(v) => return v,
            Err(e) if Instant::now() >= deadline => {
                panic!("{what}: not within {timeout:?}; last: {e}")
            }
            Err(_) => std::thread::sleep(Duration::from_millis(50)),
        }
    }
}

/// A plain HTTP/1.0 GET of `http://<addr><path>` from inside `ns`: status code and body.
pub fn http_get(ns: &Netns, addr: SocketAddr, path: &str) -> Result<(u16, String), String> {
    let path = path.to_string();
    ns.run(move || {
        let mut s = TcpStream::connect_timeout(&addr, Duration::from_secs(2))
            .map_err(|e| format!("connect {addr}: {e}"))?;
        s.set_read_timeout(Some(Duration::from_secs(5)))
            .map_err(|e| e.to_string())?;
        write!(s, "GET {path} HTTP/1.0\r\nHost: {addr}\r\n\r\n").map_err(|e| e.to_string())?;
        let mut text = String::new();
        s.read_to_string(&mut text)
            .map_err(|e| format!("read {addr}{path}: {e}"))?;
        let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
        let code = head
            .split_whitespace()
            .nth(1)
            .and_then(|c| c.parse().ok())
            .ok_or_else(|| format!("bad HTTP response from {addr}{path}: {head:?}"))?;
        Ok((code, body.to_string()))
    })
}

/// The addresses a Service's `status.loadBalancer.ingress` publishes, in order.
pub fn ingress_ips(svc: &k8s_openapi::api::core::v1::Service) -> Vec<String> {
    svc.status
        .as_ref()
        .and_then(|s| s.load_balancer.as_ref())
        .and_then(|lb| lb.ingress.as_ref())
        .into_iter()
        .flatten()
        .filter_map(|i| i.ip.clone())
        .collect()
}

/// The value of one series (`name{labels}` exactly as exposed, or a bare name) in
/// Prometheus/OpenMetrics text; `None` when it is not exposed.
pub fn metric_value(text: &str, series: &str) -> Option<f64> {
    text.lines().filter(|l| !l.starts_with('#')).find_map(|l| {
        l.strip_prefix(series)?
            .strip_prefix(' ')?
            .trim()
            .parse()
            .ok()
    })
}

/// Sum of every sample of metric `name` (any labels) in Prometheus/OpenMetrics text.
pub fn metric_sum(text: &str, name: &str) -> f64 {
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| {
            let (series, value) = l.rsplit_once(' ')?;
            let metric = series.split('{').next()?;
            (metric == name).then(|| value.parse::<f64>().ok())?
        })
        .sum()
}

fn api_resource(kind: &str) -> ApiResource {
    let gvk = match kind {
        "Service" => GroupVersionKind::gvk("", "v1", "Service"),
        "Node" => GroupVersionKind::gvk("", "v1", "Node"),
        "Namespace" => GroupVersionKind::gvk("", "v1", "Namespace"),
        "EndpointSlice" => GroupVersionKind::gvk("discovery.k8s.io", "v1", "EndpointSlice"),
        "Event" => GroupVersionKind::gvk("events.k8s.io", "v1", "Event"),
        other => panic!("the e2e harness does not handle kind {other}"),
    };
    let plural = match kind {
        "EndpointSlice" => "endpointslices".to_string(),
        k => format!("{}s", k.to_lowercase()),
    };
    ApiResource::from_gvk_with_plural(&gvk, &plural)
}

fn is_cluster_scoped(kind: &str) -> bool {
    matches!(kind, "Node" | "Namespace")
}

/// Parses YAML or JSON text of one or more documents (`---` separated) into JSON values,
/// skipping empty documents.
pub fn parse_documents(text: &str) -> Vec<Value> {
    use serde::Deserialize;
    serde_yaml_ng::Deserializer::from_str(text)
        .map(|d| Value::deserialize(d).unwrap_or_else(|e| panic!("bad YAML/JSON: {e}\n{text}")))
        .filter(|v| !v.is_null())
        .collect()
}

impl Cluster {
    /// Builds namespaces, starts (or relays to) the API server, creates `nodelb-system`, the
    /// test namespace and the Nodes, and starts one agent per node, waiting for `/readyz`.
    pub fn start(options: ClusterOptions) -> Cluster {
        let mut c = Cluster::build(options);
        for i in 0..c.nodes.len() {
            c.start_agent(i);
        }
        for i in 0..c.nodes.len() {
            c.wait_ready(i);
        }
        c
    }

    /// Like [`Cluster::start`] without starting agents.
    pub fn build(options: ClusterOptions) -> Cluster {
        check_options(&options);
        let real = external_cluster();
        let (id, dir) = cluster_dir();
        let rt = harness_runtime();
        // Namespaces first: they are deleted on drop even if a later step panics.
        let (api_ns, client, stranger, node_nss, backends) = create_namespaces(&options);
        wire(&api_ns, &client, &stranger, &node_nss, &backends, &options);
        let (backend, admin, node_prefix, namespace) = match &real {
            None => start_local_backend(&rt, &api_ns, &dir, &options),
            Some(path) => start_external_backend(&rt, &api_ns, &dir, path, &id, node_nss.len()),
        };
        let nodes = node_hosts(node_nss, &node_prefix, &dir);
        let c = Cluster {
            nodes,
            client,
            stranger,
            backends,
            api_ns,
            backend,
            admin,
            namespace,
            node_prefix,
            options,
            dir,
            rt: Some(rt),
        };
        c.create_base_objects();
        c.give_agents_identities();
        c
    }

    /// Against the local control plane: one Pod per node from the installed DaemonSet's
    /// template (bound to the node, as the DaemonSet controller would make it; no kubelet runs
    /// it), and for each a token of the `nodelb` ServiceAccount bound to that Pod, minted
    /// through the TokenRequest API, in the agent's kubeconfig. So the server authenticates
    /// each agent as the ServiceAccount and authorizes it with the RBAC of `manifests/`.
    fn give_agents_identities(&self) {
        let ApiBackend::Local { cp, proxy, .. } = &self.backend else {
            return;
        };
        use k8s_openapi::api::apps::v1::DaemonSet;
        use k8s_openapi::api::core::v1::Pod;
        let admin = self.admin.clone();
        let ds: DaemonSet = self
            .block_on(
                Api::<DaemonSet>::namespaced(admin.clone(), AGENT_NAMESPACE).get("nodelb-agent"),
            )
            .unwrap_or_else(|e| panic!("the DaemonSet from manifests/ is installed: {e}"));
        let template = ds
            .spec
            .map(|s| s.template)
            .expect("the DaemonSet has a pod template");
        let pods: Api<Pod> = Api::namespaced(admin.clone(), AGENT_NAMESPACE);
        for node in &self.nodes {
            let name = agent_pod_name(&node.name);
            let mut meta = template.metadata.clone().unwrap_or_default();
            meta.name = Some(name.clone());
            meta.namespace = Some(AGENT_NAMESPACE.into());
            let mut spec = template.spec.clone().expect("the template has a pod spec");
            spec.node_name = Some(node.name.clone());
            let pod = Pod {
                metadata: meta,
                spec: Some(spec),
                ..Default::default()
            };
            let pod = self
                .block_on(pods.create(&PostParams::default(), &pod))
                .unwrap_or_else(|e| panic!("creating the agent Pod {name}: {e}"));
            let token = self.block_on(service_account_token(
                &admin,
                "nodelb",
                Some((
                    name.as_str(),
                    pod.metadata.uid.as_deref().unwrap_or_default(),
                )),
            ));
            let server = node_server(node.index, proxy.is_some());
            std::fs::write(&node.kubeconfig, cp.kubeconfig(&server, &token))
                .unwrap_or_else(|e| panic!("writing {}: {e}", node.kubeconfig.display()));
        }
    }

    fn create_base_objects(&self) {
        for ns in [AGENT_NAMESPACE, self.namespace.as_str()] {
            let r = self.apply_value(json!({"apiVersion": "v1", "kind": "Namespace",
                "metadata": {"name": ns}}));
            if let Err(e) = r {
                panic!("creating namespace {ns}: {e}");
            }
        }
        for node in &self.nodes {
            let mut addresses = vec![json!({"type": "InternalIP",
                "address": self.node_v4(node.index).to_string()})];
            if self.options.ipv6 {
                addresses.push(json!({"type": "InternalIP",
                    "address": self.node_v6(node.index).to_string()}));
            }
            addresses.push(json!({"type": "Hostname", "address": node.name}));
            let obj = json!({"apiVersion": "v1", "kind": "Node",
                "metadata": {"name": node.name, "labels": {
                    "kubernetes.io/hostname": node.name,
                    "kubernetes.io/os": "linux",
                    "nodelb.io/e2e": "true"}},
                "spec": {}});
            self.apply_value(obj)
                .unwrap_or_else(|e| panic!("creating Node {}: {e}", node.name));
            let nodes: Api<Node> = Api::all(self.admin.clone());
            let patch = json!({"status": {"addresses": addresses}});
            self.block_on(nodes.patch_status(
                &node.name,
                &PatchParams::default(),
                &Patch::Merge(&patch),
            ))
            .unwrap_or_else(|e| panic!("setting Node {} addresses: {e}", node.name));
        }
    }

    // ---- agents -------------------------------------------------------------------------

    /// Starts node `i`'s agent (appending to its log). Panics if one is running.
    ///
    /// The agent gets `PR_SET_PDEATHSIG(SIGKILL)`, tied to the *thread* that starts it: call
    /// this from the test's own thread (not a short-lived helper thread), or the agent dies
    /// when that thread ends.
    pub fn start_agent(&mut self, i: usize) {
        let bin = agent_binary();
        let ipv6 = self.options.ipv6;
        let extra = self.options.agent_args.clone();
        let resync = if extra.iter().any(|a| a.starts_with("--resync-interval")) {
            None
        } else {
            Some(format!("{}ms", self.options.resync_interval.as_millis()))
        };
        let prefix = self
            .options
            .agent_prefix
            .get(&i)
            .cloned()
            .unwrap_or_default();
        let node = &mut self.nodes[i];
        assert!(
            node.agent.as_mut().is_none_or(|a| !a.running()),
            "node {i}'s agent is already running"
        );
        let mut log = OpenOptions::new()
            .create(true)
            .append(true)
            .open(&node.log)
            .unwrap_or_else(|e| panic!("opening {}: {e}", node.log.display()));
        let _ = writeln!(log, "===== e2e: starting {} =====", bin.display());
        let mut cmd = Command::new("ip");
        cmd.args(["netns", "exec", node.ns.name()])
            .args(&prefix)
            .env("FAKETIME_DONT_FAKE_MONOTONIC", "1")
            .arg(&bin)
            .arg("run")
            .arg("--kubeconfig")
            .arg(&node.kubeconfig)
            .args(["--node-name", &node.name])
            .args(["--pod-name", &agent_pod_name(&node.name)])
            .args(["--pod-namespace", AGENT_NAMESPACE])
            .args(["--health-addr", &format!("127.0.0.1:{HEALTH_PORT}")])
            .args(["--metrics-addr", &format!("127.0.0.1:{METRICS_PORT}")])
            .args(
                resync
                    .iter()
                    .flat_map(|r| ["--resync-interval", r.as_str()]),
            )
            .arg(format!("--ipv6={ipv6}"))
            .args(&extra)
            .env(
                "RUST_LOG",
                std::env::var("NODELB_E2E_LOG").unwrap_or("info".into()),
            )
            .env("NO_COLOR", "1")
            .env_remove("KUBECONFIG")
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("log file"))
            .stderr(log);
        let child = crate::netns::dies_with_thread(&mut cmd)
            .spawn()
            .unwrap_or_else(|e| panic!("starting {}: {e}", bin.display()));
        node.agent = Some(Agent { child });
    }

    /// Stops node `i`'s agent with `sig` (SIGKILL or SIGTERM) and waits for it to exit.
    pub fn stop_agent(&mut self, i: usize, sig: Signal) -> Option<std::process::ExitStatus> {
        let agent = self.nodes[i].agent.as_mut().expect("an agent was started");
        let status = agent.stop(sig);
        self.nodes[i].agent = None;
        status
    }

    /// Node `i`'s agent process id, while one was started (for `/proc/<pid>/status`, `perf`).
    pub fn agent_pid(&self, i: usize) -> Option<u32> {
        self.nodes[i].agent.as_ref().map(Agent::pid)
    }

    /// Whether node `i`'s agent process is alive.
    pub fn agent_running(&mut self, i: usize) -> bool {
        self.nodes[i].agent.as_mut().is_some_and(Agent::running)
    }

    /// Waits until node `i`'s `/readyz` answers 200; panics (with the log) if the agent exits.
    pub fn wait_ready(&mut self, i: usize) {
        let deadline = Instant::now() + READY_WAIT;
        loop {
            if !self.agent_running(i) {
                panic!(
                    "node {i}'s agent exited before it was ready; log:\n{}",
                    self.agent_log(i)
                );
            }
            match self.readyz(i) {
                Ok((200, _)) => return,
                r if Instant::now() >= deadline => panic!(
                    "node {i}'s agent is not ready after {READY_WAIT:?}: {r:?}; log:\n{}",
                    self.agent_log(i)
                ),
                _ => std::thread::sleep(Duration::from_millis(100)),
            }
        }
    }

    /// `GET /readyz` on node `i`.
    pub fn readyz(&self, i: usize) -> Result<(u16, String), String> {
        http_get(
            &self.nodes[i].ns,
            ([127, 0, 0, 1], HEALTH_PORT).into(),
            "/readyz",
        )
    }

    /// `GET /metrics` on node `i` (panics unless 200).
    pub fn metrics(&self, i: usize) -> String {
        self.try_metrics(i).unwrap_or_else(|e| panic!("{e}"))
    }

    /// `GET /metrics` on node `i`: the body when it answers 200.
    pub fn try_metrics(&self, i: usize) -> Result<String, String> {
        match http_get(
            &self.nodes[i].ns,
            ([127, 0, 0, 1], METRICS_PORT).into(),
            "/metrics",
        ) {
            Ok((200, body)) => Ok(body),
            other => Err(format!("GET /metrics on node {i}: {other:?}")),
        }
    }

    /// Node `i`'s agent log so far (every run).
    /// `kubectl apply --server-side -k manifests/cleanup/` (the local control plane only: an
    /// external cluster's admin installs it).
    pub fn install_cleanup(&self) {
        let ApiBackend::Local {
            admin_kubeconfig, ..
        } = &self.backend
        else {
            panic!("install_cleanup needs the local control plane");
        };
        apply_kustomization(admin_kubeconfig, &manifests_dir().join("cleanup"));
    }

    /// A kubeconfig for ServiceAccount `sa` of the agent's namespace, as node `i` reaches the
    /// API server (the local control plane only).
    pub fn service_account_kubeconfig(&self, sa: &str, i: usize) -> PathBuf {
        let ApiBackend::Local { cp, proxy, .. } = &self.backend else {
            panic!("service_account_kubeconfig needs the local control plane");
        };
        let token = self.block_on(service_account_token(&self.admin, sa, None));
        let path = self.dir.join(format!("kubeconfig-{sa}-{i}"));
        let server = node_server(self.nodes[i].index, proxy.is_some());
        std::fs::write(&path, cp.kubeconfig(&server, &token))
            .unwrap_or_else(|e| panic!("writing {}: {e}", path.display()));
        path
    }

    /// Runs the agent binary with `args` in node `i`'s namespace to its end, as a Pod of a
    /// Job or an init container would.
    pub fn run_agent_command(&self, i: usize, args: &[String]) -> std::process::Output {
        self.spawn_agent_command(i, args)
            .wait_with_output()
            .expect("waiting for the agent command")
    }

    /// Starts the agent binary with `args` in node `i`'s namespace (stdout and stderr piped).
    /// It gets `PR_SET_PDEATHSIG(SIGKILL)` like the agents: it dies with the calling thread.
    pub fn spawn_agent_command(&self, i: usize, args: &[String]) -> std::process::Child {
        let bin = agent_binary();
        let mut cmd = self.nodes[i].ns.command(&bin);
        cmd.args(args)
            .env("NO_COLOR", "1")
            .env_remove("KUBECONFIG")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        crate::netns::dies_with_thread(&mut cmd)
            .spawn()
            .unwrap_or_else(|e| panic!("starting {}: {e}", bin.display()))
    }

    pub fn agent_log(&self, i: usize) -> String {
        std::fs::read_to_string(&self.nodes[i].log).unwrap_or_default()
    }

    /// `nft list table <family> nodelb` in node `i` (`family`: `ip` or `ip6`); `None` when the
    /// table does not exist.
    pub fn nft_table(&self, i: usize, family: &str) -> Option<String> {
        self.nodes[i]
            .ns
            .sh_ok(&format!("nft list table {family} nodelb"))
            .ok()
    }

    // ---- namespaces and addresses ---------------------------------------------------------

    pub fn node(&self, i: usize) -> &NodeHost {
        &self.nodes[i]
    }

    /// Node `i`'s name (`node-a`, … ; prefixed in external cluster mode).
    pub fn node_name(&self, i: usize) -> &str {
        &self.nodes[i].name
    }

    pub fn node_ns(&self, i: usize) -> &Netns {
        &self.nodes[i].ns
    }

    pub fn client(&self) -> &Netns {
        &self.client
    }

    /// A second client, with other source addresses (for source ranges).
    pub fn stranger(&self) -> &Netns {
        &self.stranger
    }

    pub fn backend(&self, j: usize) -> &Netns {
        &self.backends[j]
    }

    pub fn backend_count(&self) -> usize {
        self.backends.len()
    }

    /// The node backend `j` hangs off.
    pub fn backend_node(&self, j: usize) -> usize {
        j / self.options.backends_per_node
    }

    /// The `api` namespace (holds the API server's or relay's listener).
    pub fn api_ns(&self) -> &Netns {
        &self.api_ns
    }

    /// Node `i`'s served IPv4 address (its InternalIP): 203.0.113.(16i+1).
    pub fn node_v4(&self, i: usize) -> Ipv4Addr {
        client_net_v4(i, 1)
    }

    /// Node `i`'s served IPv6 address: 2001:db8:c:i::1.
    pub fn node_v6(&self, i: usize) -> Ipv6Addr {
        client_net_v6(i, 1)
    }

    /// The client's IPv4 address on its link to node `i`.
    pub fn client_v4(&self, i: usize) -> Ipv4Addr {
        client_net_v4(i, 2)
    }

    pub fn client_v6(&self, i: usize) -> Ipv6Addr {
        client_net_v6(i, 2)
    }

    /// Node `i`'s IPv4 address on its link to the stranger: 192.0.2.(128+16i+1). Not in its
    /// Node object unless a test lists it there (as an ExternalIP, say).
    pub fn node_stranger_v4(&self, i: usize) -> Ipv4Addr {
        stranger_net_v4(i, 1)
    }

    /// The stranger's IPv4 address on its link to node `i`: 192.0.2.(128+16i+2).
    pub fn stranger_v4(&self, i: usize) -> Ipv4Addr {
        stranger_net_v4(i, 2)
    }

    pub fn stranger_v6(&self, i: usize) -> Ipv6Addr {
        stranger_net_v6(i, 2)
    }

    /// Node `i`'s address on its link to the `api` namespace: the source of its agent's
    /// requests in the audit log.
    pub fn node_api_addr(&self, i: usize) -> Ipv4Addr {
        api_net(i, 2)
    }

    /// Cut node `i` off the API server without a word (`on`), or heal it: a routing rule in
    /// the `api` namespace discards whatever the server sends node `i` over its link (its
    /// SYN-ACKs, data and ACKs), so the agent's connections hear nothing back, no RST, no ICMP.
    /// Routing policy, not netfilter. Local control plane only.
    pub fn partition(&self, i: usize, on: bool) {
        let from = api_addr(i).to_string();
        let to = self.node_api_addr(i).to_string();
        let rule = ["from", from.as_str(), "to", to.as_str(), "blackhole"];
        if on {
            let mut args = vec!["rule", "add"];
            args.extend(rule);
            self.api_ns.ip(&args);
        } else {
            let mut args = vec!["ip", "rule", "del"];
            args.extend(rule);
            while self.api_ns.exec(&args).status.success() {}
        }
    }

    /// An IPv4 EndpointSlice's endpoint for backend `j`, on its node, ready or not.
    pub fn endpoint_v4(&self, j: usize, ready: bool) -> Value {
        json!({"addresses": [self.backend_v4(j).to_string()],
               "nodeName": self.node_name(self.backend_node(j)),
               "conditions": {"ready": ready}})
    }

    pub fn backend_v4(&self, j: usize) -> Ipv4Addr {
        Ipv4Addr::new(198, 51, 100, (j * 16 + 2) as u8)
    }

    pub fn backend_v6(&self, j: usize) -> Ipv6Addr {
        Ipv6Addr::new(0x2001, 0xdb8, 0xb, j as u16, 0, 0, 0, 2)
    }

    // ---- API objects ----------------------------------------------------------------------

    /// The namespace the test's Services and EndpointSlices go to (`e2e`, or a unique one in
    /// external cluster mode).
    pub fn namespace(&self) -> &str {
        &self.namespace
    }

    /// The admin client (double: `system:masters`; real: the kubeconfig's user).
    pub fn admin(&self) -> &Client {
        &self.admin
    }

    /// The control plane the harness started, `None` in external cluster mode.
    pub fn control_plane(&self) -> Option<&ControlPlane> {
        match &self.backend {
            ApiBackend::Local { cp, .. } => Some(cp),
            ApiBackend::External => None,
        }
    }

    /// A kubeconfig file for the test's admin (`system:masters`), `None` in external cluster mode
    /// (use `NODELB_E2E_KUBECONFIG`'s).
    pub fn admin_kubeconfig(&self) -> Option<&Path> {
        match &self.backend {
            ApiBackend::Local {
                admin_kubeconfig, ..
            } => Some(admin_kubeconfig),
            ApiBackend::External => None,
        }
    }

    pub fn is_external(&self) -> bool {
        matches!(self.backend, ApiBackend::External)
    }

    /// Runs a future on the harness's runtime.
    pub fn block_on<F: std::future::Future>(&self, f: F) -> F::Output {
        self.rt.as_ref().expect("runtime").block_on(f)
    }

    /// Creates or replaces every object in `text` (YAML or JSON, multi-document), panicking
    /// on any error. Namespaced objects without a namespace go to [`Cluster::namespace`].
    pub fn apply(&self, text: &str) {
        for doc in parse_documents(text) {
            let what = describe(&doc);
            self.apply_value(doc)
                .unwrap_or_else(|e| panic!("applying {what}: {e}"));
        }
    }

    /// Creates or replaces one object; the API error as text when refused.
    pub fn apply_value(&self, mut obj: Value) -> Result<(), String> {
        let kind = obj["kind"].as_str().unwrap_or_default().to_string();
        let ar = api_resource(&kind);
        let name = obj["metadata"]["name"]
            .as_str()
            .unwrap_or_else(|| panic!("{kind} without metadata.name"))
            .to_string();
        let api: Api<DynamicObject> = if is_cluster_scoped(&kind) {
            Api::all_with(self.admin.clone(), &ar)
        } else {
            let ns = obj["metadata"]["namespace"]
                .as_str()
                .unwrap_or(&self.namespace)
                .to_string();
            obj["metadata"]["namespace"] = json!(ns);
            Api::namespaced_with(self.admin.clone(), &ns, &ar)
        };
        let dynamic: DynamicObject =
            serde_json::from_value(obj).map_err(|e| format!("not an object: {e}"))?;
        self.block_on(async {
            match api.create(&PostParams::default(), &dynamic).await {
                Ok(_) => Ok(()),
                Err(kube::Error::Api(s)) if s.code == 409 => {
                    if kind == "Namespace" {
                        return Ok(());
                    }
                    // Replace at the version just read; kube-apiserver answers 409 when
                    // another writer (the agent's status apply) came in between: read again,
                    // as client-go's RetryOnConflict does.
                    let mut attempts = 0;
                    loop {
                        let current = api.get(&name).await.map_err(|e| e.to_string())?;
                        let mut next = dynamic.clone();
                        next.metadata.resource_version = current.metadata.resource_version;
                        match api.replace(&name, &PostParams::default(), &next).await {
                            Ok(_) => return Ok(()),
                            Err(kube::Error::Api(s)) if s.code == 409 && attempts < 10 => {
                                attempts += 1;
                                tokio::time::sleep(Duration::from_millis(20)).await;
                            }
                            Err(e) => return Err(e.to_string()),
                        }
                    }
                }
                Err(e) => Err(e.to_string()),
            }
        })
    }

    /// Deletes `kind` `name` in the test namespace (cluster-scoped kinds: by name); a missing
    /// object is fine.
    pub fn delete(&self, kind: &str, name: &str) {
        let ar = api_resource(kind);
        let api: Api<DynamicObject> = if is_cluster_scoped(kind) {
            Api::all_with(self.admin.clone(), &ar)
        } else {
            Api::namespaced_with(self.admin.clone(), &self.namespace, &ar)
        };
        match self.block_on(api.delete(name, &DeleteParams::default())) {
            Ok(_) => {}
            Err(kube::Error::Api(s)) if s.code == 404 => {}
            Err(e) => panic!("deleting {kind} {name}: {e}"),
        }
    }

    /// `events.k8s.io/v1` Events in the test namespace, as JSON.
    pub fn events(&self) -> Vec<Value> {
        self.events_in(&self.namespace)
    }

    /// `events.k8s.io/v1` Events about Node `node` (the server keeps a cluster-scoped object's
    /// Events in `default`).
    pub fn node_events(&self, node: &str) -> Vec<Value> {
        self.events_in("default")
            .into_iter()
            .filter(|e| e["regarding"]["kind"] == "Node" && e["regarding"]["name"] == node)
            .collect()
    }

    fn events_in(&self, namespace: &str) -> Vec<Value> {
        let api: Api<DynamicObject> =
            Api::namespaced_with(self.admin.clone(), namespace, &api_resource("Event"));
        let list = self
            .block_on(api.list(&Default::default()))
            .unwrap_or_else(|e| panic!("listing Events in {namespace}: {e}"));
        list.items
            .into_iter()
            .map(|e| serde_json::to_value(e).expect("an Event as JSON"))
            .collect()
    }

    /// The holder of the `nodelb-status` Lease (empty when released), `None` before it exists.
    pub fn status_holder(&self) -> Result<Option<String>, String> {
        use k8s_openapi::api::coordination::v1::Lease;
        let leases: Api<Lease> = Api::namespaced(self.admin.clone(), AGENT_NAMESPACE);
        self.block_on(leases.get_opt("nodelb-status"))
            .map(|l| l.map(|l| l.spec.and_then(|s| s.holder_identity).unwrap_or_default()))
            .map_err(|e| format!("reading the nodelb-status Lease: {e}"))
    }

    /// The Services of namespace `ns`, listed through the admin client.
    pub fn services(&self, ns: &str) -> Result<Vec<k8s_openapi::api::core::v1::Service>, String> {
        let api: Api<k8s_openapi::api::core::v1::Service> = Api::namespaced(self.admin.clone(), ns);
        self.block_on(api.list(&Default::default()))
            .map(|l| l.items)
            .map_err(|e| format!("listing Services: {e}"))
    }

    /// How many Services of namespace `ns` publish exactly `want` (ingress IPs, in order).
    pub fn services_publishing(&self, ns: &str, want: &[String]) -> Result<usize, String> {
        Ok(self
            .services(ns)?
            .iter()
            .filter(|s| ingress_ips(s) == want)
            .count())
    }

    // ---- audit ------------------------------------------------------------------------------

    /// kube-apiserver's audit log; `None` (with a message on stderr) in external cluster mode.
    pub fn audit(&self) -> Option<Vec<AuditRecord>> {
        match &self.backend {
            ApiBackend::Local { cp, .. } => Some(cp.audit()),
            ApiBackend::External => {
                eprintln!("e2e: audit log assertions skipped against an external cluster");
                None
            }
        }
    }

    /// A point in the audit log: when the server received a request made now (a GET of a
    /// ConfigMap that does not exist), read back from that request's own record. A request made
    /// after this returns, or caused by something that happens after it, is received later
    /// (`control_plane::received_after`). Counting the records past the log's length instead
    /// would also count a write the test has already seen take effect, when its record reaches
    /// the log after the read that saw it. `None` against an external cluster (no audit log).
    pub fn audit_mark(&self) -> Option<String> {
        static MARKS: AtomicUsize = AtomicUsize::new(0);
        if self.is_external() {
            return None;
        }
        let name = format!(
            "nodelb-e2e-audit-mark-{}",
            MARKS.fetch_add(1, Ordering::Relaxed)
        );
        let api: Api<k8s_openapi::api::core::v1::ConfigMap> =
            Api::namespaced(self.admin.clone(), &self.namespace);
        let got = self.block_on(api.get_opt(&name));
        assert!(
            matches!(got, Ok(None)),
            "{name} exists or is refused: {got:?}"
        );
        let path = format!("/configmaps/{name}");
        Some(wait_for(
            &format!("the audit record of the GET of {name}"),
            Duration::from_secs(10),
            || {
                self.audit()
                    .unwrap_or_default()
                    .into_iter()
                    .find(|r| r.verb == "get" && r.uri.ends_with(&path))
                    .map(|r| r.received)
                    .ok_or_else(|| "not logged yet".to_string())
            },
        ))
    }

    /// Asserts that every node's agent made requests, from its own link address, as the
    /// ServiceAccount, and that none of them was refused with 401 or 403 (a verb the agent
    /// uses but `manifests/` does not grant). Skipped in external cluster mode.
    pub fn assert_agents_authorized(&self) {
        let Some(records) = self.audit() else { return };
        let agent: Vec<&AuditRecord> = records
            .iter()
            .filter(|r| {
                self.nodes
                    .iter()
                    .any(|n| r.source == IpAddr::V4(api_net(n.index, 2)))
            })
            .collect();
        for node in &self.nodes {
            let src = IpAddr::V4(self.node_api_addr(node.index));
            assert!(
                agent.iter().any(|r| r.source == src),
                "no request from node {} ({src}) in the audit log",
                node.name
            );
        }
        let refused: Vec<String> = agent
            .iter()
            .filter(|r| r.user != AGENT_USER || r.code == 401 || r.code == 403)
            .map(|r| {
                format!(
                    "{} {} {} by {:?} -> {}",
                    r.source, r.verb, r.uri, r.user, r.code
                )
            })
            .collect();
        assert!(
            refused.is_empty(),
            "agent requests refused or not made as {AGENT_USER}:\n{}",
            refused.join("\n")
        );
        // Every resource request the agent made is in the reviewed list of its requests
        // (`agent_access.rs`, which the manifests test holds equal to the RBAC).
        let unexpected: Vec<String> = agent
            .iter()
            .filter_map(|r| {
                let o = r.object.as_ref()?;
                (!crate::agent_access::is_expected(
                    &r.verb,
                    &o.group,
                    &o.rbac_resource(),
                    &o.namespace,
                    AGENT_NAMESPACE,
                ))
                .then(|| format!("{} {} {}", r.source, r.verb, r.uri))
            })
            .collect();
        assert!(
            unexpected.is_empty(),
            "agent requests outside the reviewed list (integration/src/agent_access.rs):\n{}",
            unexpected.join("\n")
        );
    }

    /// The harness's scratch directory (kubeconfigs, logs).
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The node-name prefix (empty with the double).
    pub fn node_prefix(&self) -> &str {
        &self.node_prefix
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        if std::thread::panicking() {
            for node in &self.nodes {
                let log = std::fs::read_to_string(&node.log).unwrap_or_default();
                let lines: Vec<&str> = log.lines().collect();
                let tail = &lines[lines.len().saturating_sub(LOG_TAIL)..];
                eprintln!(
                    "----- agent log of {} ({}, last {} lines) -----\n{}\n----- end -----",
                    node.name,
                    node.log.display(),
                    tail.len(),
                    tail.join("\n")
                );
                if let Ok(t) = node.ns.sh_ok("nft list ruleset") {
                    eprintln!(
                        "----- nft ruleset of {} -----\n{t}----- end -----",
                        node.name
                    );
                }
            }
        }
        for node in &mut self.nodes {
            node.agent = None; // SIGKILL by pid, reaped
        }
        if self.is_external() {
            let nodes: Vec<String> = self.nodes.iter().map(|n| n.name.clone()).collect();
            let admin = self.admin.clone();
            let ns = self.namespace.clone();
            if let Some(rt) = &self.rt {
                rt.block_on(async move {
                    let dp = DeleteParams::default();
                    for name in nodes {
                        let _ = Api::<Node>::all(admin.clone()).delete(&name, &dp).await;
                    }
                    let _ = Api::<k8s_openapi::api::core::v1::Namespace>::all(admin)
                        .delete(&ns, &dp)
                        .await;
                });
            }
        }
        if let Some(rt) = self.rt.take() {
            rt.shutdown_background();
        }
        if !std::thread::panicking() {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
        // Namespaces are deleted as the fields drop.
    }
}

// ---- building a cluster -----------------------------------------------------------------------

/// Panics unless the node and backend counts fit the addressing plan.
fn check_options(options: &ClusterOptions) {
    assert!(
        (1..=MAX_NODES).contains(&options.nodes),
        "1..={MAX_NODES} nodes"
    );
    assert!(
        options.nodes * options.backends_per_node <= MAX_BACKENDS,
        "at most {MAX_BACKENDS} backends"
    );
}

/// A unique id for this cluster (pid and counter) and its new temporary directory.
fn cluster_dir() -> (String, PathBuf) {
    let n = COUNTER.fetch_add(1, Ordering::Relaxed);
    let id = format!("{}-{n}", std::process::id());
    let dir = std::env::temp_dir().join(format!("nodelb-e2e-{id}"));
    std::fs::create_dir_all(&dir).unwrap_or_else(|e| panic!("creating {}: {e}", dir.display()));
    (id, dir)
}

/// The cluster's own runtime, for the admin client and the relays.
fn harness_runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .thread_name("e2e-rt")
        .build()
        .expect("a tokio runtime")
}

/// The `api`, client and stranger namespaces, one per node and one per backend.
fn create_namespaces(options: &ClusterOptions) -> (Netns, Netns, Netns, Vec<Netns>, Vec<Netns>) {
    let api_ns = Netns::new("api");
    let client = Netns::new("client");
    let stranger = Netns::new("stranger");
    let node_nss: Vec<Netns> = (0..options.nodes)
        .map(|i| Netns::new(&format!("node{i}")))
        .collect();
    let backends: Vec<Netns> = (0..options.nodes * options.backends_per_node)
        .map(|j| Netns::new(&format!("b{j}")))
        .collect();
    (api_ns, client, stranger, node_nss, backends)
}

/// Starts the local control plane and, when asked, the old-server proxy in front of it.
fn start_local_backend(
    rt: &tokio::runtime::Runtime,
    api_ns: &Netns,
    dir: &Path,
    options: &ClusterOptions,
) -> (ApiBackend, Client, String, String) {
    let (cp, admin, admin_kubeconfig) = start_control_plane(rt, api_ns, dir);
    let proxy = options
        .old_server
        .map(|old| start_old_server_proxy(api_ns, &cp, old));
    (
        ApiBackend::Local {
            cp: Box::new(cp),
            admin_kubeconfig,
            proxy,
        },
        admin,
        String::new(),
        "e2e".to_string(),
    )
}

/// The proxy in the `api` namespace that imitates the `old` server in front of `cp`.
fn start_old_server_proxy(api_ns: &Netns, cp: &ControlPlane, old: OldServer) -> OldServerProxy {
    let proxy = OldServerProxy::start(
        api_ns,
        OLD_SERVER_PROXY_PORT,
        (Ipv4Addr::LOCALHOST, control_plane::API_PORT).into(),
        cp.ca_pem(),
        old,
    )
    .unwrap_or_else(|e| panic!("starting the old-server proxy: {e}"));
    eprintln!("e2e: agents reach kube-apiserver through {proxy:?}");
    proxy
}

/// Relays the `api` namespace to the external cluster and writes each node's kubeconfig.
fn start_external_backend(
    rt: &tokio::runtime::Runtime,
    api_ns: &Netns,
    dir: &Path,
    path: &Path,
    id: &str,
    nodes: usize,
) -> (ApiBackend, Client, String, String) {
    let std_listener = bind_api_listener(api_ns);
    eprintln!(
        "e2e: external cluster mode ({REAL_KUBECONFIG_ENV}={})",
        path.display()
    );
    let kc =
        Kubeconfig::read_from(path).unwrap_or_else(|e| panic!("reading {}: {e}", path.display()));
    let admin = rt.block_on(client_from(kc.clone()));
    let (scheme, host, port) = cluster_endpoint(rt, &kc);
    let upstream = (host.clone(), port);
    rt.block_on(async {
        let l = tokio::net::TcpListener::from_std(std_listener).expect("a tokio listener");
        tokio::spawn(relay(l, upstream));
    });
    let token = agent_token(rt, &admin);
    for i in 0..nodes {
        let text = relayed_kubeconfig(
            &kc,
            &format!("{scheme}://{}:{API_PORT}", api_addr(i)),
            &host,
            &token,
        );
        std::fs::write(dir.join(format!("kubeconfig-{i}")), text)
            .expect("writing an agent kubeconfig");
    }
    let prefix = format!("nodelb-e2e-{id}-");
    (
        ApiBackend::External,
        admin,
        prefix.clone(),
        format!("{prefix}test"),
    )
}

/// The relay's listener inside the api namespace.
fn bind_api_listener(api_ns: &Netns) -> std::net::TcpListener {
    api_ns.run(|| {
        let l = std::net::TcpListener::bind(("0.0.0.0", API_PORT))
            .unwrap_or_else(|e| panic!("binding the API listener in the api namespace: {e}"));
        l.set_nonblocking(true).expect("non-blocking listener");
        l
    })
}

/// The scheme, host (without brackets) and port of the kubeconfig's cluster URL.
fn cluster_endpoint(rt: &tokio::runtime::Runtime, kc: &Kubeconfig) -> (String, String, u16) {
    rt.block_on(async {
        let cfg = kube::Config::from_custom_kubeconfig(kc.clone(), &KubeConfigOptions::default())
            .await
            .expect("the external cluster's kubeconfig loads");
        let url = cfg.cluster_url;
        let scheme = url.scheme_str().unwrap_or("https").to_string();
        let host = url.host().expect("the cluster URL has a host");
        let host = host.trim_matches(|c| c == '[' || c == ']').to_string();
        let port = url
            .port_u16()
            .unwrap_or(if scheme == "http" { 80 } else { 443 });
        (scheme, host, port)
    })
}

/// `NODELB_E2E_AGENT_TOKEN` when set, else a token of the `nodelb` ServiceAccount.
fn agent_token(rt: &tokio::runtime::Runtime, admin: &Client) -> String {
    match std::env::var("NODELB_E2E_AGENT_TOKEN") {
        Ok(t) if !t.is_empty() => t,
        _ => rt.block_on(service_account_token(admin, "nodelb", None)),
    }
}

/// One host per node namespace, named `<prefix>node-a`, `<prefix>node-b`, …
fn node_hosts(node_nss: Vec<Netns>, node_prefix: &str, dir: &Path) -> Vec<NodeHost> {
    node_nss
        .into_iter()
        .enumerate()
        .map(|(i, ns)| NodeHost {
            name: format!("{node_prefix}node-{}", (b'a' + i as u8) as char),
            ns,
            index: i,
            kubeconfig: dir.join(format!("kubeconfig-{i}")),
            log: dir.join(format!("agent-{i}.log")),
            agent: None,
        })
        .collect()
}

fn describe(doc: &Value) -> String {
    format!(
        "{} {}",
        doc["kind"].as_str().unwrap_or("?"),
        doc["metadata"]["name"].as_str().unwrap_or("?")
    )
}

async fn client_from(kc: Kubeconfig) -> Client {
    let cfg = kube::Config::from_custom_kubeconfig(kc, &KubeConfigOptions::default())
        .await
        .expect("a client config from the kubeconfig");
    Client::try_from(cfg).expect("a kube client")
}

/// Accepts connections on `listener` (in the `api` namespace) and copies each to a new
/// connection to `upstream`, made from the runtime's threads in the root namespace.
async fn relay(listener: tokio::net::TcpListener, upstream: (String, u16)) {
    loop {
        let Ok((mut inbound, _)) = listener.accept().await else {
            tokio::time::sleep(Duration::from_millis(50)).await;
            continue;
        };
        let upstream = upstream.clone();
        tokio::spawn(async move {
            match tokio::net::TcpStream::connect((upstream.0.as_str(), upstream.1)).await {
                Ok(mut out) => {
                    let _ = tokio::io::copy_bidirectional(&mut inbound, &mut out).await;
                }
                Err(e) => eprintln!("e2e relay: connecting to {upstream:?}: {e}"),
            }
        });
    }
}

/// The API server's address as node `i` reaches it (through the old-server proxy when there
/// is one).
fn node_server(i: usize, proxied: bool) -> String {
    match proxied {
        true => format!("http://{}:{OLD_SERVER_PROXY_PORT}", api_addr(i)),
        false => format!("https://{}:{}", api_addr(i), control_plane::API_PORT),
    }
}

/// A token of a ServiceAccount of the agent's namespace (TokenRequest), bound to the agent's Pod (name, uid)
/// when there is one.
async fn service_account_token(admin: &Client, sa: &str, pod: Option<(&str, &str)>) -> String {
    use k8s_openapi::api::authentication::v1::{
        BoundObjectReference, TokenRequest, TokenRequestSpec,
    };
    use k8s_openapi::api::core::v1::ServiceAccount;
    let sas: Api<ServiceAccount> = Api::namespaced(admin.clone(), AGENT_NAMESPACE);
    let tr = TokenRequest {
        spec: TokenRequestSpec {
            audiences: vec![],
            expiration_seconds: Some(3600),
            bound_object_ref: pod.map(|(name, uid)| BoundObjectReference {
                api_version: Some("v1".into()),
                kind: Some("Pod".into()),
                name: Some(name.into()),
                uid: Some(uid.into()),
            }),
        },
        ..Default::default()
    };
    sas.create_token_request(sa, &PostParams::default(), &tr)
        .await
        .unwrap_or_else(|e| {
            panic!(
                "TokenRequest for {AGENT_NAMESPACE}/{sa} failed ({e}); apply manifests/ to the \
                 cluster or set NODELB_E2E_AGENT_TOKEN"
            )
        })
        .status
        .map(|s| s.token)
        .expect("a TokenRequest status")
}

/// The agent Pod's name on `node`, as `--pod-name` gives it (the status Lease's holder).
pub fn agent_pod_name(node: &str) -> String {
    format!("nodelb-agent-{node}")
}

/// Starts etcd and kube-apiserver in `api_ns` (see [`crate::control_plane`]), an admin client
/// that reaches it through a relay on 127.0.0.1 in the test's own namespace, waits for
/// `/readyz`, and installs `manifests/` with the pinned `kubectl apply -k`, as a user would.
/// Returns the control plane, the admin client and the admin kubeconfig's path.
pub fn start_control_plane(
    rt: &tokio::runtime::Runtime,
    api_ns: &Netns,
    dir: &Path,
) -> (ControlPlane, Client, PathBuf) {
    let serving_ips = (0..MAX_NODES).map(|i| IpAddr::V4(api_addr(i))).collect();
    let mut cp = ControlPlane::start(
        api_ns,
        dir,
        &ControlPlaneOptions {
            advertise: api_addr(0),
            serving_ips,
            tokens: vec![(
                ADMIN_TOKEN.into(),
                "e2e-admin".into(),
                vec!["system:masters".into()],
            )],
        },
    )
    .unwrap_or_else(|e| panic!("starting the control plane: {e}"));
    let port = rt.block_on(spawn_admin_relay(api_ns));
    let text = cp.kubeconfig(&format!("https://127.0.0.1:{port}"), ADMIN_TOKEN);
    let admin_kubeconfig = dir.join("admin.kubeconfig");
    std::fs::write(&admin_kubeconfig, &text)
        .unwrap_or_else(|e| panic!("writing {}: {e}", admin_kubeconfig.display()));
    let admin = rt
        .block_on(control_plane::client_from_kubeconfig(&text))
        .unwrap_or_else(|e| panic!("the admin client: {e}"));
    let took = rt
        .block_on(cp.wait_ready(&admin))
        .unwrap_or_else(|e| panic!("{e}"));
    let version = rt
        .block_on(admin.apiserver_version())
        .unwrap_or_else(|e| panic!("GET /version: {e}"));
    eprintln!(
        "e2e: real kube-apiserver {} (etcd from Debian) ready in {:.1} s, in netns {}",
        version.git_version,
        took.as_secs_f64(),
        api_ns.name()
    );
    assert_eq!(
        version.git_version,
        cp.version(),
        "the server reports the version it was built as"
    );
    install_manifests(&admin_kubeconfig);
    (cp, admin, admin_kubeconfig)
}

/// `kubectl apply --server-side -k manifests/` with the pinned kubectl.
fn install_manifests(kubeconfig: &Path) {
    apply_kustomization(kubeconfig, &manifests_dir());
}

/// `kubectl apply --server-side -k dir` with the pinned kubectl, as a user installs it.
fn apply_kustomization(kubeconfig: &Path, dir: &Path) {
    let kubectl = control_plane::kubectl().unwrap_or_else(|e| panic!("{e}"));
    let out = Command::new(&kubectl)
        .arg("--kubeconfig")
        .arg(kubeconfig)
        .args([
            "apply",
            "--server-side",
            "--field-manager=e2e-install",
            "-k",
        ])
        .arg(dir)
        .output()
        .unwrap_or_else(|e| panic!("running {}: {e}", kubectl.display()));
    assert!(
        out.status.success(),
        "kubectl apply -k {} failed ({}):\n{}{}",
        dir.display(),
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A listener on 127.0.0.1 in the test's namespace whose connections are relayed to
/// kube-apiserver on 127.0.0.1:6443 inside `api_ns` (the outgoing socket is made there). Plain
/// TCP: TLS runs end to end between the client and the server. Returns the port.
async fn spawn_admin_relay(api_ns: &Netns) -> u16 {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("binding the admin relay on 127.0.0.1");
    let port = listener.local_addr().expect("the relay's address").port();
    let ns_path = api_ns.path();
    tokio::spawn(async move {
        loop {
            let Ok((mut inbound, _)) = listener.accept().await else {
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            };
            let ns_path = ns_path.clone();
            tokio::spawn(async move {
                let out = tokio::task::spawn_blocking(move || {
                    let ns = std::fs::File::open(&ns_path)?;
                    // A thread of its own joins the namespace, connects and ends: the socket
                    // stays in the namespace it was made in.
                    std::thread::spawn(move || {
                        nix::sched::setns(&ns, nix::sched::CloneFlags::CLONE_NEWNET)
                            .map_err(std::io::Error::from)?;
                        let s = std::net::TcpStream::connect((
                            Ipv4Addr::LOCALHOST,
                            control_plane::API_PORT,
                        ))?;
                        s.set_nonblocking(true)?;
                        Ok::<_, std::io::Error>(s)
                    })
                    .join()
                    .unwrap_or_else(|_| Err(std::io::Error::other("relay thread panicked")))
                })
                .await;
                // Refused while the server starts: the client sees the closed connection.
                if let Ok(Ok(s)) = out {
                    if let Ok(mut out) = tokio::net::TcpStream::from_std(s) {
                        let _ = tokio::io::copy_bidirectional(&mut inbound, &mut out).await;
                    }
                }
            });
        }
    });
    port
}

/// The real kubeconfig's current cluster, reached through the relay at `server` with the
/// original `host` as TLS server name, and a bearer token user.
fn relayed_kubeconfig(kc: &Kubeconfig, server: &str, host: &str, token: &str) -> String {
    let context_name = kc
        .current_context
        .clone()
        .or_else(|| kc.contexts.first().map(|c| c.name.clone()))
        .expect("the kubeconfig has a context");
    let cluster_name = kc
        .contexts
        .iter()
        .find(|c| c.name == context_name)
        .and_then(|c| c.context.as_ref())
        .map(|c| c.cluster.clone())
        .expect("the current context names a cluster");
    let mut cluster = kc
        .clusters
        .iter()
        .find(|c| c.name == cluster_name)
        .and_then(|c| c.cluster.clone())
        .expect("the current cluster exists");
    cluster.server = Some(server.to_string());
    if server.starts_with("https:") {
        // The certificate names the real host, not the relay's address.
        cluster.tls_server_name = Some(host.to_string());
    }
    let cluster = serde_json::to_value(&cluster).expect("a cluster as JSON");
    let doc = json!({
        "apiVersion": "v1", "kind": "Config",
        "clusters": [{"name": "relayed", "cluster": cluster}],
        "users": [{"name": "nodelb", "user": {"token": token}}],
        "contexts": [{"name": "relayed", "context": {"cluster": "relayed", "user": "nodelb"}}],
        "current-context": "relayed",
    });
    serde_yaml_ng::to_string(&doc).expect("kubeconfig YAML")
}

// ---- addressing -------------------------------------------------------------------------------

fn api_net(i: usize, host: u8) -> Ipv4Addr {
    Ipv4Addr::new(192, 0, 2, (i * 4) as u8 + host)
}

fn api_addr(i: usize) -> Ipv4Addr {
    api_net(i, 1)
}

fn client_net_v4(i: usize, host: u8) -> Ipv4Addr {
    Ipv4Addr::new(203, 0, 113, (i * 16) as u8 + host)
}

fn client_net_v6(i: usize, host: u16) -> Ipv6Addr {
    Ipv6Addr::new(0x2001, 0xdb8, 0xc, i as u16, 0, 0, 0, host)
}

fn stranger_net_v4(i: usize, host: u8) -> Ipv4Addr {
    Ipv4Addr::new(192, 0, 2, 128 + (i * 16) as u8 + host)
}

fn stranger_net_v6(i: usize, host: u16) -> Ipv6Addr {
    Ipv6Addr::new(0x2001, 0xdb8, 0xd, i as u16, 0, 0, 0, host)
}

/// Links and routes (see the module docs).
fn wire(
    api_ns: &Netns,
    client: &Netns,
    stranger: &Netns,
    nodes: &[Netns],
    backends: &[Netns],
    options: &ClusterOptions,
) {
    for ns in [client, stranger].into_iter().chain(nodes).chain(backends) {
        ns.disable_icmp_ratelimit();
    }
    for (i, node) in nodes.iter().enumerate() {
        node.enable_forwarding();
        wire_api(api_ns, i, node);
        wire_client(client, i, node);
        wire_stranger(stranger, i, node);
    }
    for (j, backend) in backends.iter().enumerate() {
        wire_backend(backend, j, &nodes[j / options.backends_per_node]);
    }
}

/// The `api` namespace's link to node `i`.
fn wire_api(api_ns: &Netns, i: usize, node: &Netns) {
    link(
        api_ns,
        &format!("eth-n{i}"),
        &[&format!("{}/30", api_net(i, 1))],
        node,
        "eth-api",
        &[&format!("{}/30", api_net(i, 2))],
    );
}

/// The client's dual-stack link to node `i`.
fn wire_client(client: &Netns, i: usize, node: &Netns) {
    link(
        client,
        &format!("eth-n{i}"),
        &[
            &format!("{}/28", client_net_v4(i, 2)),
            &format!("{}/64", client_net_v6(i, 2)),
        ],
        node,
        "eth-client",
        &[
            &format!("{}/28", client_net_v4(i, 1)),
            &format!("{}/64", client_net_v6(i, 1)),
        ],
    );
}

/// The stranger's dual-stack link to node `i` and its routes to the node's client subnets.
fn wire_stranger(stranger: &Netns, i: usize, node: &Netns) {
    link(
        stranger,
        &format!("eth-n{i}"),
        &[
            &format!("{}/28", stranger_net_v4(i, 2)),
            &format!("{}/64", stranger_net_v6(i, 2)),
        ],
        node,
        "eth-stranger",
        &[
            &format!("{}/28", stranger_net_v4(i, 1)),
            &format!("{}/64", stranger_net_v6(i, 1)),
        ],
    );
    // The stranger reaches the node's served addresses over its own link.
    route(
        stranger,
        &format!("{}/28", client_net_v4(i, 0)),
        &stranger_net_v4(i, 1).to_string(),
    );
    route(
        stranger,
        &format!("{}/64", client_net_v6(i, 0)),
        &stranger_net_v6(i, 1).to_string(),
    );
}

/// Backend `j`'s dual-stack link to its node and its routes back to every client subnet.
fn wire_backend(backend: &Netns, j: usize, node: &Netns) {
    let node_v4 = Ipv4Addr::new(198, 51, 100, (j * 16 + 1) as u8);
    let node_v6 = Ipv6Addr::new(0x2001, 0xdb8, 0xb, j as u16, 0, 0, 0, 1);
    link(
        backend,
        "eth-node",
        &[
            &format!("{}/28", Ipv4Addr::new(198, 51, 100, (j * 16 + 2) as u8)),
            &format!(
                "{}/64",
                Ipv6Addr::new(0x2001, 0xdb8, 0xb, j as u16, 0, 0, 0, 2)
            ),
        ],
        node,
        &format!("eth-b{j}"),
        &[&format!("{node_v4}/28"), &format!("{node_v6}/64")],
    );
    for (prefix, via) in [
        ("203.0.113.0/24", node_v4.to_string()),
        ("192.0.2.128/25", node_v4.to_string()),
        ("2001:db8:c::/48", node_v6.to_string()),
        ("2001:db8:d::/48", node_v6.to_string()),
    ] {
        route(backend, prefix, &via);
    }
}
