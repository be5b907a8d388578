//! The demo: the real `nodelb-agent` binary runs in a node namespace against a real
//! kube-apiserver (etcd and kube-apiserver of the pinned release, in a control-plane namespace,
//! with `manifests/` installed, so RBAC is the server's own and the agent authenticates with a
//! token of its ServiceAccount). A Service and its EndpointSlice are applied with the pinned
//! `kubectl`; a client namespace sends real requests to the node's address and two backend
//! namespaces answer; the Service, its Events and `nft list table ip nodelb` are shown as an
//! operator would see them; then an endpoint goes away and the traffic follows. No
//! kube-controller-manager runs, so the EndpointSlice is written by hand, as the EndpointSlice
//! controller would write it.
//!
//! Run as root: `scripts/demo.sh` (or `cargo run --release -p nodelb-integration --example demo`).

use k8s_openapi::api::core::v1::Service;
use kube::Api;
use nodelb_integration::control_plane;
use nodelb_integration::e2e::{external_cluster, wait_for, Cluster, ClusterOptions};
use nodelb_integration::traffic::{tcp_request, tcp_server, Outcome};
use serde_json::json;
use std::collections::BTreeMap;
use std::io::Write;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::Duration;

const PORT: u16 = 80;
const BACKEND_PORT: u16 = 8080;

const SERVICE: &str = "apiVersion: v1
kind: Service
metadata:
  name: web
spec:
  type: LoadBalancer
  ports:
    - {name: http, port: 80, protocol: TCP, targetPort: 8080}
";

fn slice(c: &Cluster, backends: &[usize]) -> String {
    let eps: Vec<_> = backends.iter().map(|j| c.endpoint_v4(*j, true)).collect();
    json!({
        "apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
        "metadata": {"name": "web-1", "labels": {"kubernetes.io/service-name": "web"}},
        "addressType": "IPv4",
        "ports": [{"name": "http", "port": BACKEND_PORT, "protocol": "TCP"}],
        "endpoints": eps,
    })
    .to_string()
}

/// The pinned `kubectl` with the admin kubeconfig, in the demo's namespace.
struct Kubectl {
    bin: PathBuf,
    kubeconfig: PathBuf,
    namespace: String,
}

impl Kubectl {
    fn new(c: &Cluster) -> Kubectl {
        let kubeconfig = c
            .admin_kubeconfig()
            .map(PathBuf::from)
            .or_else(external_cluster)
            .expect("an admin kubeconfig");
        Kubectl {
            bin: control_plane::kubectl().unwrap_or_else(|e| panic!("{e}")),
            kubeconfig,
            namespace: c.namespace().to_string(),
        }
    }

    /// Runs `kubectl <args>` (with `stdin` piped in when given), shows the command and its
    /// output indented, and panics if it fails.
    fn run(&self, args: &[&str], stdin: Option<&str>) {
        println!("   $ kubectl {}", args.join(" "));
        let mut child = Command::new(&self.bin)
            .arg("--kubeconfig")
            .arg(&self.kubeconfig)
            .args(["--namespace", &self.namespace])
            .args(args)
            .stdin(if stdin.is_some() {
                Stdio::piped()
            } else {
                Stdio::null()
            })
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap_or_else(|e| panic!("running {}: {e}", self.bin.display()));
        if let (Some(text), Some(mut pipe)) = (stdin, child.stdin.take()) {
            pipe.write_all(text.as_bytes())
                .unwrap_or_else(|e| panic!("writing to kubectl: {e}"));
        }
        let out = child
            .wait_with_output()
            .unwrap_or_else(|e| panic!("waiting for kubectl: {e}"));
        let text = String::from_utf8_lossy(&out.stdout);
        for l in text.lines() {
            println!("   {l}");
        }
        assert!(
            out.status.success(),
            "kubectl {} failed ({}): {}",
            args.join(" "),
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

/// Sends `n` requests from the client and counts who answered.
fn requests(c: &Cluster, dst: SocketAddr, n: usize) -> BTreeMap<String, usize> {
    let mut seen = BTreeMap::new();
    for _ in 0..n {
        let key = match tcp_request(c.client(), dst, Duration::from_secs(2)) {
            Outcome::Answered(line) => line,
            other => format!("{other:?}"),
        };
        *seen.entry(key).or_default() += 1;
    }
    seen
}

fn show(title: &str, seen: &BTreeMap<String, usize>) {
    println!("{title}");
    for (who, n) in seen {
        println!("  {n:>3} x  {who}");
    }
}

fn main() {
    if unsafe { libc::geteuid() } != 0 {
        eprintln!("demo: needs root (it creates network namespaces and programs nftables in them)");
        std::process::exit(1);
    }
    println!(
        "== Starting: etcd and a real kube-apiserver, a node namespace running nodelb-agent, a client, two backends"
    );
    let c = Cluster::start(ClusterOptions {
        nodes: 1,
        backends_per_node: 2,
        ..ClusterOptions::default()
    });
    let version = c
        .block_on(c.admin().apiserver_version())
        .unwrap_or_else(|e| panic!("GET /version: {e}"));
    match c.control_plane() {
        Some(cp) => println!(
            "   kube-apiserver {} (GET /version: {}, platform {}), built from the pinned k8s.io/kubernetes module; manifests/ installed with kubectl apply -k",
            cp.version(),
            version.git_version,
            version.platform
        ),
        None => println!(
            "   an external cluster (NODELB_E2E_KUBECONFIG): kube-apiserver {}",
            version.git_version
        ),
    }
    let kubectl = Kubectl::new(&c);
    let _servers: Vec<_> = (0..2)
        .map(|j| {
            tcp_server(
                c.backend(j),
                SocketAddr::new(c.backend_v4(j).into(), BACKEND_PORT),
                &format!("backend-{j}"),
            )
        })
        .collect();
    let node = SocketAddr::new(c.node_v4(0).into(), PORT);
    println!(
        "   node {} at {}, client at {}, backends at {} and {} (port {BACKEND_PORT})",
        c.node_name(0),
        c.node_v4(0),
        c.client_v4(0),
        c.backend_v4(0),
        c.backend_v4(1)
    );

    println!(
        "\n== A Service web (type LoadBalancer, port {PORT}) and its EndpointSlice (no controller-manager runs: written by hand)"
    );
    kubectl.run(&["apply", "-f", "-"], Some(SERVICE));
    kubectl.run(&["apply", "-f", "-"], Some(&slice(&c, &[0, 1])));
    wait_for(
        "the Service answers",
        Duration::from_secs(20),
        || match tcp_request(c.client(), node, Duration::from_secs(2)) {
            Outcome::Answered(_) => Ok(()),
            other => Err(format!("{other:?}")),
        },
    );
    println!(
        "\n== Client → http://{node}/ (each backend replies with its name and the source it saw)"
    );
    show("   20 requests:", &requests(&c, node, 20));

    let services: Api<Service> = Api::namespaced(c.admin().clone(), c.namespace());
    let svc = wait_for(
        "the status to be published",
        Duration::from_secs(20),
        || {
            let svc = c.block_on(services.get("web")).map_err(|e| e.to_string())?;
            let published = svc
                .status
                .as_ref()
                .and_then(|s| s.load_balancer.as_ref())
                .is_some_and(|lb| lb.ingress.as_ref().is_some_and(|i| !i.is_empty()));
            if published {
                Ok(svc)
            } else {
                Err("pending".into())
            }
        },
    );
    println!();
    kubectl.run(&["get", "service", "web", "-o", "wide"], None);
    println!("   status written by the elected agent (server-side apply, field manager `nodelb`):");
    println!(
        "   {}",
        serde_json::to_string(&svc.status).unwrap_or_default()
    );
    println!();
    kubectl.run(
        &[
            "get",
            "events.events.k8s.io",
            "-o",
            "custom-columns=TYPE:.type,REASON:.reason,OBJECT:.regarding.name,REPORTED BY:.reportingInstance,NOTE:.note",
        ],
        None,
    );

    println!("\n== nft list table ip nodelb   (on the node)");
    println!("{}", c.nft_table(0, "ip").unwrap_or_default());

    println!("== backend-0 leaves the EndpointSlice");
    kubectl.run(&["apply", "-f", "-"], Some(&slice(&c, &[1])));
    wait_for("only backend-1 answers", Duration::from_secs(20), || {
        let seen = requests(&c, node, 5);
        if seen.keys().all(|k| k.starts_with("backend-1")) {
            Ok(())
        } else {
            Err(format!("{seen:?}"))
        }
    });
    show("   20 requests:", &requests(&c, node, 20));

    println!("\n== The Service is deleted: clients are refused, the rules are gone");
    kubectl.run(&["delete", "service", "web"], None);
    wait_for("refused", Duration::from_secs(20), || {
        match tcp_request(c.client(), node, Duration::from_secs(2)) {
            Outcome::Refused { .. } => Ok(()),
            other => Err(format!("{other:?}")),
        }
    });
    show("   3 requests:", &requests(&c, node, 3));
    let metrics = c.metrics(0);
    println!("\n== /metrics (excerpt)");
    for l in metrics.lines().filter(|l| {
        l.starts_with("nodelb_syncs_total")
            || l.starts_with("nodelb_leader ")
            || l.starts_with("nodelb_status_writes_total")
            || l.starts_with("nodelb_service_packets_total")
    }) {
        println!("   {l}");
    }
    println!(
        "\nDone (against kube-apiserver {}): namespaces and processes are cleaned up.",
        version.git_version
    );
}
