//! End-to-end published addresses (issue 31, point 3): the real agent against the real
//! kube-apiserver (see `nodelb_integration::e2e`), with a client that reaches the node only
//! through a namespace doing 1:1 NAT in front of it, as a node behind a cloud's or a router's
//! static NAT is reached.
//!
//! # Network (besides the harness's, see `nodelb_integration::e2e`)
//!
//! | link           | IPv4                                        |
//! |----------------|---------------------------------------------|
//! | outside - nat  | 198.51.100.192/28: nat .193, outside .194   |
//! | nat - node     | 192.0.2.64/28: node .65, nat .66            |
//!
//! The outside client routes only [`PUBLISHED`] and [`OUTER`] (each a /32) via the nat
//! namespace, and has no route to the node's own address. The nat namespace forwards, with
//! its own nft table (in its own namespace: nothing of the machine's is touched): `dnat` of
//! [`PUBLISHED`] and [`OUTER`] to the node's InternalIP (203.0.113.1), `snat` of what it
//! forwards to the node to its address on that link, so the node answers over it with no
//! route of its own. No namespace has a default route; every namespace is deleted on drop.
//!
//! Run as root: `cargo test -p nodelb-integration --test e2e_published -- --nocapture`.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Node;
use kube::api::{Api, Patch, PatchParams};
use nodelb_integration::e2e::{metric_value, wait_for, Cluster};
use nodelb_integration::netns::{link, require_root, route, Netns};
use nodelb_integration::traffic::{tcp_request, tcp_server, Outcome, Server};
use serde_json::json;

mod common;
use common::{
    apply, fast_options, ingress, ips, serial, service, serving_condition, slice, wait_event,
    wait_ips,
};

/// The node's address behind the NAT: what its Node's annotation names.
const PUBLISHED: &str = "203.0.113.200";
/// An outer load balancer's address (the same NAT stands in for it): what a Service's
/// annotation names.
const OUTER: &str = "203.0.113.201";
const ANNOTATION: &str = "nodelb.io/published-addresses";
const PORT: u16 = 8001;
/// Upper bound for a status change to show.
const CHANGE: Duration = Duration::from_secs(20);
const ANSWER: Duration = Duration::from_secs(2);

/// The client outside, and the NAT between it and node 0.
struct Nat {
    outside: Netns,
    _nat: Netns,
}

/// One node with backend 0 answering `b0`, the NAT in front of it, and the node's own
/// address.
fn cluster_behind_nat() -> (Cluster, Server, Nat, String) {
    let c = Cluster::start(fast_options(1));
    let b0 = tcp_server(
        c.backend(0),
        SocketAddr::new(c.backend_v4(0).into(), 8080),
        "b0",
    );
    let nat = nat_in_front_of_node(&c);
    let node = c.node_v4(0).to_string();
    (c, b0, nat, node)
}

/// Builds the outside client and the 1:1 NAT in front of node 0 (see the table above).
fn nat_in_front_of_node(c: &Cluster) -> Nat {
    let outside = Netns::new("pub-out");
    let nat = Netns::new("pub-nat");
    link(
        &outside,
        "out0",
        &["198.51.100.194/28"],
        &nat,
        "nat-out",
        &["198.51.100.193/28"],
    );
    link(
        &nat,
        "nat-node",
        &["192.0.2.66/28"],
        c.node_ns(0),
        "node-nat",
        &["192.0.2.65/28"],
    );
    for to in [PUBLISHED, OUTER] {
        route(&outside, &format!("{to}/32"), "198.51.100.193");
    }
    let node = c.node_v4(0);
    route(&nat, &format!("{node}/32"), "192.0.2.65");
    nat.enable_forwarding();
    nat.sh(&format!(
        "nft -f - <<'EOF'
table ip published_nat {{
  chain pre {{ type nat hook prerouting priority dstnat; ip daddr {{ {PUBLISHED}, {OUTER} }} dnat to {node}; }}
  chain post {{ type nat hook postrouting priority srcnat; oifname \"nat-node\" snat to 192.0.2.66; }}
}}
EOF"
    ));
    Nat { outside, _nat: nat }
}

fn annotate_node(c: &Cluster, value: Option<&str>) {
    let nodes: Api<Node> = Api::all(c.admin().clone());
    let patch = json!({"metadata": {"annotations": {ANNOTATION: value}}});
    c.block_on(nodes.patch(
        c.node_name(0),
        &PatchParams::default(),
        &Patch::Merge(&patch),
    ))
    .unwrap_or_else(|e| panic!("annotating {}: {e}", c.node_name(0)));
}

/// Service `name` on [`PORT`], with `annotation` as its published addresses if set, and its
/// slice to backend 0.
fn web(c: &Cluster, name: &str, annotation: Option<&str>) {
    let mut svc = service(name, PORT);
    if let Some(a) = annotation {
        svc["metadata"]["annotations"] = json!({ ANNOTATION: a });
    }
    apply(c, svc);
    apply(c, slice(c, name, &[(0, true)]));
}

/// The outside client reads Service `name`'s one address from its status and connects to it
/// on [`PORT`]; returns the address and the answer.
fn connect_to_status_address(c: &Cluster, nat: &Nat, name: &str) -> (String, String) {
    let read = ingress(c, name);
    let [(ip, _)] = read.as_slice() else {
        panic!("{name} publishes {read:?}, not one address");
    };
    let dst = SocketAddr::new(ip.parse().expect("an IP address"), PORT);
    let answer = wait_for(
        &format!("an answer at {dst}"),
        CHANGE,
        || match tcp_request(&nat.outside, dst, ANSWER) {
            Outcome::Answered(a) => Ok(a),
            other => Err(format!("{other:?}")),
        },
    );
    (ip.clone(), answer)
}

#[test]
fn a_client_behind_a_one_to_one_nat_connects_to_the_nodes_published_address() {
    if !require_root("a_client_behind_a_one_to_one_nat_connects_to_the_nodes_published_address") {
        return;
    }
    let _serial = serial();
    let (c, _b0, nat, node) = cluster_behind_nat();
    web(&c, "web", None);
    wait_ips(&c, "web", std::slice::from_ref(&node), CHANGE);
    // The node's own address is not reachable from outside: only the NAT's is.
    let own = SocketAddr::new(c.node_v4(0).into(), PORT);
    let direct = tcp_request(&nat.outside, own, ANSWER);
    assert!(
        !matches!(direct, Outcome::Answered(_)),
        "the outside client reached {own} directly: {direct:?}"
    );

    let t0 = Instant::now();
    annotate_node(&c, Some(PUBLISHED));
    wait_ips(&c, "web", &[PUBLISHED.to_string()], CHANGE);
    eprintln!(
        "measured: the Node's annotation {ANNOTATION}={PUBLISHED} published after {:.1} s",
        t0.elapsed().as_secs_f64()
    );
    let read = ingress(&c, "web");
    assert_eq!(
        read,
        vec![(PUBLISHED.to_string(), Some("Proxy".to_string()))]
    );
    let (ip, answer) = connect_to_status_address(&c, &nat, "web");
    eprintln!("example: Node {} annotated {ANNOTATION}={PUBLISHED:?}; Service web's status reads {read:?}; the outside client connected to {ip}:{PORT} and read {answer:?}", c.node_name(0));
    assert!(answer.starts_with("b0"), "{answer}");
    // The kernel still serves the node's own address, and nothing of the published one.
    let table = c.nft_table(0, "ip").expect("the ip nodelb table");
    assert!(table.contains(&format!("{node} . tcp . {PORT}")), "{table}");
    assert!(!table.contains(PUBLISHED), "{table}");

    // Invalid: ignored whole, the node's own address published, a Warning Event on the Node.
    annotate_node(&c, Some(&format!("{PUBLISHED},nonsense")));
    wait_ips(&c, "web", std::slice::from_ref(&node), CHANGE);
    let ev = wait_event(
        &c,
        "default",
        "Node",
        c.node_name(0),
        "InvalidPublishedAddresses",
        |n| n.contains("\"nonsense\" is not an IP address"),
    );
    assert_eq!(ev["type"], "Warning", "{ev}");
    assert!(
        c.agent_log(0).contains("InvalidPublishedAddresses"),
        "the agent logs it"
    );
    let counted = metric_value(
        &c.metrics(0),
        "nodelb_invalid_objects_total{kind=\"Node\",reason=\"plan\"}",
    );
    assert_eq!(counted, Some(1.0), "counted once as invalid input");
    annotate_node(&c, None);
    wait_ips(&c, "web", std::slice::from_ref(&node), CHANGE);
}

#[test]
fn a_services_published_addresses_name_an_outer_load_balancer_only_while_a_node_serves_it() {
    if !require_root(
        "a_services_published_addresses_name_an_outer_load_balancer_only_while_a_node_serves_it",
    ) {
        return;
    }
    let _serial = serial();
    let (c, _b0, nat, node) = cluster_behind_nat();
    annotate_node(&c, Some(PUBLISHED));
    web(&c, "outer", Some(OUTER));
    wait_ips(&c, "outer", &[OUTER.to_string()], CHANGE);
    let read = ingress(&c, "outer");
    assert_eq!(read, vec![(OUTER.to_string(), Some("Proxy".to_string()))]);
    let (ip, answer) = connect_to_status_address(&c, &nat, "outer");
    eprintln!("example: Service outer annotated {ANNOTATION}={OUTER:?}; its status reads {read:?}; the outside client connected to {ip}:{PORT} and read {answer:?}");
    assert!(answer.starts_with("b0"), "{answer}");
    let table = c.nft_table(0, "ip").expect("the ip nodelb table");
    assert!(table.contains(&format!("{node} . tcp . {PORT}")), "{table}");
    assert!(!table.contains(OUTER), "{table}");

    // Nothing serves it (its port reserved for the node): nothing is published.
    let mut svc = service("outer", 22);
    svc["metadata"]["annotations"] = json!({ ANNOTATION: OUTER });
    apply(&c, svc);
    wait_ips(&c, "outer", &[], CHANGE);

    // Invalid: the node's published address instead, a Warning Event, and the condition says
    // why.
    let mut svc = service("outer", PORT);
    svc["metadata"]["annotations"] = json!({ ANNOTATION: format!("{OUTER},{OUTER}/32") });
    apply(&c, svc);
    wait_ips(&c, "outer", &[PUBLISHED.to_string()], CHANGE);
    let ev = wait_event(&c, c.namespace(), "Service", "outer", "InvalidInput", |n| {
        n.contains(ANNOTATION)
    });
    assert_eq!(ev["type"], "Warning", "{ev}");
    let (status, reason, message) = serving_condition(&c, "outer").expect("the condition");
    assert_eq!((status.as_str(), reason.as_str()), ("True", "Serving"));
    assert!(
        message.contains(&format!(
            "{ANNOTATION} \"{OUTER},{OUTER}/32\": \"{OUTER}/32\" is not an IP address; ignored"
        )),
        "{message}"
    );
    assert_eq!(ips(&c, "outer"), vec![PUBLISHED.to_string()]);
    let (_, answer) = connect_to_status_address(&c, &nat, "outer");
    assert!(answer.starts_with("b0"), "{answer}");
}
