//! What the status and Event end-to-end tests share: fast leases, a one-port Service, and
//! applying an object (a module of those test crates, not a test target of its own).

use nodelb_integration::e2e::{Cluster, ClusterOptions};
use serde_json::{json, Value};

/// `nodes` nodes with one backend each; short leases so heartbeats, the status Lease and a
/// failover come quickly, and a 2 s resync so a change that makes no event of its own (a
/// sysctl) is seen soon.
pub fn fast_options(nodes: usize) -> ClusterOptions {
    let args = [
        ("--node-lease-duration", "3s"),
        ("--lease-duration", "3s"),
        ("--renew-deadline", "2s"),
        ("--retry-period", "500ms"),
        ("--resync-interval", "2s"),
    ];
    ClusterOptions {
        nodes,
        backends_per_node: 1,
        agent_args: args
            .iter()
            .flat_map(|(k, v)| [k.to_string(), v.to_string()])
            .collect(),
        ..ClusterOptions::default()
    }
}

/// A LoadBalancer Service with one TCP port named `tcp`.
pub fn service(name: &str, port: u16) -> Value {
    json!({
        "apiVersion": "v1", "kind": "Service",
        "metadata": {"name": name},
        "spec": {"type": "LoadBalancer",
                 "ports": [{"name": "tcp", "port": port, "protocol": "TCP"}]},
    })
}

/// Creates or replaces `obj`, panicking with its kind and name when refused.
pub fn apply(c: &Cluster, obj: Value) {
    let what = format!("{} {}", obj["kind"], obj["metadata"]["name"]);
    c.apply_value(obj)
        .unwrap_or_else(|e| panic!("applying {what}: {e}"));
}
