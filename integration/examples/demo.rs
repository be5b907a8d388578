//! The demo: the real `nodelb-agent` binary runs in a node namespace against the in-repo API
//! double (RBAC from `manifests/`, the agent's ServiceAccount token). A Service and its
//! EndpointSlice are written through the API; a client namespace sends real requests to the
//! node's address and two backend namespaces answer; the Service's status, its Events and
//! `nft list table ip nodelb` are shown as an operator would see them; then an endpoint goes
//! away and the traffic follows.
//!
//! Run as root: `scripts/demo.sh` (or `cargo run --release -p nodelb-integration --example demo`).

use nodelb_integration::e2e::{wait_for, Cluster, ClusterOptions};
use nodelb_integration::traffic::{tcp_request, tcp_server, Outcome};
use serde_json::json;
use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::time::Duration;

const PORT: u16 = 80;
const BACKEND_PORT: u16 = 8080;

fn slice(c: &Cluster, backends: &[usize]) -> String {
    let eps: Vec<_> = backends
        .iter()
        .map(|j| {
            json!({"addresses": [c.backend_v4(*j).to_string()],
                   "nodeName": c.node_name(c.backend_node(*j)),
                   "conditions": {"ready": true}})
        })
        .collect();
    json!({
        "apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
        "metadata": {"name": "web-1", "labels": {"kubernetes.io/service-name": "web"}},
        "addressType": "IPv4",
        "ports": [{"name": "http", "port": BACKEND_PORT, "protocol": "TCP"}],
        "endpoints": eps,
    })
    .to_string()
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
        "== Starting: an API double, a node namespace running nodelb-agent, a client, two backends"
    );
    let c = Cluster::start(ClusterOptions {
        nodes: 1,
        backends_per_node: 2,
        ..ClusterOptions::default()
    });
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
        "\n== kubectl apply: Service web (type LoadBalancer, port {PORT}) and its EndpointSlice"
    );
    c.apply(
        "apiVersion: v1\nkind: Service\nmetadata: {name: web}\nspec:\n  type: LoadBalancer\n  ports: [{name: http, port: 80, protocol: TCP}]\n",
    );
    c.apply(&slice(&c, &[0, 1]));
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

    let svc = wait_for(
        "the status to be published",
        Duration::from_secs(20),
        || {
            let svc = c
                .double()
                .expect("the demo runs against the double")
                .get("v1", "Service", c.namespace(), "web")
                .map_err(|e| e.to_string())?
                .ok_or("no Service")?;
            if svc["status"]["loadBalancer"]["ingress"].is_array() {
                Ok(svc)
            } else {
                Err("pending".into())
            }
        },
    );
    let ingress: Vec<String> = svc["status"]["loadBalancer"]["ingress"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|i| {
            format!(
                "{} ({})",
                i["ip"].as_str().unwrap_or(""),
                i["ipMode"].as_str().unwrap_or("-")
            )
        })
        .collect();
    println!("\n== kubectl get svc web");
    println!("   NAME  TYPE          EXTERNAL-IP                PORT(S)");
    println!(
        "   web   LoadBalancer  {:<26} {PORT}/TCP",
        ingress.join(", ")
    );
    println!("   status written by the elected agent (field manager `nodelb`):");
    println!(
        "   {}",
        serde_json::to_string(&svc["status"]).unwrap_or_default()
    );
    println!("\n== Events");
    for e in c.events() {
        println!(
            "   {:<8} {:<20} {:<10} {}",
            e["type"].as_str().unwrap_or(""),
            e["reason"].as_str().unwrap_or(""),
            e["regarding"]["name"].as_str().unwrap_or(""),
            e["note"].as_str().unwrap_or("")
        );
    }

    println!("\n== nft list table ip nodelb   (on the node)");
    println!("{}", c.nft_table(0, "ip").unwrap_or_default());

    println!("== kubectl apply: backend-0 leaves the EndpointSlice");
    c.apply(&slice(&c, &[1]));
    wait_for("only backend-1 answers", Duration::from_secs(20), || {
        let seen = requests(&c, node, 5);
        if seen.keys().all(|k| k.starts_with("backend-1")) {
            Ok(())
        } else {
            Err(format!("{seen:?}"))
        }
    });
    show("   20 requests:", &requests(&c, node, 20));

    println!("\n== kubectl delete svc web: clients are refused, the rules are gone");
    c.delete("Service", "web");
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
    println!("\nDone: namespaces and processes are cleaned up.");
}
