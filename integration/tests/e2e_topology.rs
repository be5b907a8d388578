//! End-to-end topology-aware routing: the real agent against the real kube-apiserver (see
//! `nodelb_integration::e2e`), its Node labelled with a zone through the API, EndpointSlices
//! carrying the hints the EndpointSlice controller writes, and real TCP connections from the
//! client namespace: which backends answer.
//!
//! Run as root: `cargo test -p nodelb-integration --test e2e_topology`.

use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::time::Duration;

use k8s_openapi::api::core::v1::Node;
use kube::api::{Api, Patch, PatchParams};
use nodelb_integration::e2e::{metric_value, wait_for, Cluster, ClusterOptions};
use nodelb_integration::netns::require_root;
use nodelb_integration::traffic::{tcp_request, tcp_server, Outcome, Server};
use serde_json::{json, Value};

/// The port every backend listens on (the slices' target port).
const BACKEND_PORT: u16 = 8080;
/// How long a change may take to show.
const CHANGE: Duration = Duration::from_secs(10);
const ANSWER: Duration = Duration::from_secs(2);
/// New connections per look at who answers: with two endpoints picked at random, the chance
/// that one of them answers none of 40 is 2^-39.
const TRIES: usize = 40;
const PORT: u16 = 1080;

fn set_zone(c: &Cluster, zone: &str) {
    let nodes: Api<Node> = Api::all(c.admin().clone());
    let patch = json!({"metadata": {"labels": {"topology.kubernetes.io/zone": zone}}});
    c.block_on(nodes.patch(
        c.node_name(0),
        &PatchParams::default(),
        &Patch::Merge(&patch),
    ))
    .unwrap_or_else(|e| panic!("labelling {}: {e}", c.node_name(0)));
}

/// The IPv4 EndpointSlice `web-1`: port `http` → `BACKEND_PORT` on backends `(j, zone hint)`.
fn slice(c: &Cluster, backends: &[(usize, Option<&str>)]) -> String {
    let eps: Vec<Value> = backends
        .iter()
        .map(|(j, zone)| {
            let mut e = c.endpoint_v4(*j, true);
            if let Some(z) = zone {
                e["zone"] = json!(z);
                e["hints"] = json!({"forZones": [{"name": z}]});
            }
            e
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

fn backends(c: &Cluster) -> Vec<Server> {
    (0..c.backend_count())
        .map(|j| {
            let addr = SocketAddr::new(c.backend_v4(j).into(), BACKEND_PORT);
            tcp_server(c.backend(j), addr, &format!("b{j}"))
        })
        .collect()
}

/// Who answers `TRIES` new connections from the client.
fn answering(c: &Cluster) -> BTreeSet<String> {
    let dst = SocketAddr::new(c.node_v4(0).into(), PORT);
    (0..TRIES)
        .map(|k| match tcp_request(c.client(), dst, ANSWER) {
            Outcome::Answered(line) => line.split(' ').next().unwrap_or_default().to_string(),
            out => panic!("connection {k} to {dst}: {out:?}"),
        })
        .collect()
}

/// Waits until node 0's endpoint map holds exactly `backends` of Service `web`.
fn wait_endpoints(c: &Cluster, backends: &[usize]) {
    wait_for(&format!("web's endpoints are {backends:?}"), CHANGE, || {
        let table = c.nft_table(0, "ip").unwrap_or_default();
        let programmed: Vec<usize> = (0..c.backend_count())
            .filter(|j| table.contains(&format!("{} . {BACKEND_PORT}", c.backend_v4(*j))))
            .collect();
        match programmed == backends {
            true => Ok(()),
            false => Err(format!("{programmed:?}\n{table}")),
        }
    });
}

fn names(backends: &[usize]) -> BTreeSet<String> {
    backends.iter().map(|j| format!("b{j}")).collect()
}

fn ignored(c: &Cluster, reason: &str) -> Option<f64> {
    metric_value(
        &c.metrics(0),
        &format!("nodelb_topology_hints_ignored{{reason=\"{reason}\"}}"),
    )
}

/// `trafficDistribution: PreferClose` with the hints the EndpointSlice controller writes:
/// traffic entering a node of zone-a reaches only zone-a's endpoints (b0, b2, never b1 of
/// zone-b). One endpoint without a hint: every endpoint, and the agent says why. The node's
/// zone label changes to zone-b: only zone-b's.
#[test]
fn traffic_entering_a_zone_a_node_reaches_only_zone_a_endpoints() {
    if !require_root("traffic_entering_a_zone_a_node_reaches_only_zone_a_endpoints") {
        return;
    }
    let c = Cluster::start(ClusterOptions::default());
    let _servers = backends(&c);
    set_zone(&c, "zone-a");
    c.apply(&format!(
        "apiVersion: v1\nkind: Service\nmetadata: {{name: web}}\nspec:\n  type: LoadBalancer\n  trafficDistribution: PreferClose\n  ports: [{{name: http, port: {PORT}, protocol: TCP}}]\n"
    ));
    let hinted = [
        (0, Some("zone-a")),
        (1, Some("zone-b")),
        (2, Some("zone-a")),
    ];
    c.apply(&slice(&c, &hinted));
    wait_endpoints(&c, &[0, 2]);
    assert_eq!(answering(&c), names(&[0, 2]), "zone-a's endpoints only");

    // b1's hint is missing (a new endpoint the controller has not hinted yet): every one.
    c.apply(&slice(
        &c,
        &[(0, Some("zone-a")), (1, None), (2, Some("zone-a"))],
    ));
    wait_endpoints(&c, &[0, 1, 2]);
    let all = answering(&c);
    assert!(
        all.contains("b1") && all.len() >= 2,
        "every endpoint: {all:?}"
    );
    wait_for(
        "the hints are counted as ignored",
        CHANGE,
        || match ignored(&c, "missing-hint") {
            Some(1.0) => Ok(()),
            n => Err(format!("{n:?}")),
        },
    );
    assert!(
        c.agent_log(0)
            .contains("topology hints ignored: an endpoint carries no hint"),
        "the agent's log says why"
    );

    // Hinted again, the node moves to zone-b: only zone-b's endpoint.
    c.apply(&slice(&c, &hinted));
    wait_endpoints(&c, &[0, 2]);
    set_zone(&c, "zone-b");
    wait_endpoints(&c, &[1]);
    assert_eq!(answering(&c), names(&[1]), "zone-b's endpoint only");
    assert_eq!(ignored(&c, "missing-hint"), Some(0.0));
    c.assert_agents_authorized();
}
