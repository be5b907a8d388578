//! Many LoadBalancer Services and their EndpointSlices, for the benches that run agents against
//! the harness's kube-apiserver: one TCP port each, outside the agent's reserved ports, with
//! `allocateLoadBalancerNodePorts: false` (nodelb uses no NodePort, and the default NodePort
//! range holds only 2,768), and one slice of documentation-address endpoints each, created
//! through the admin client. No kube-controller-manager runs, so no EndpointSlice controller:
//! the bench writes the slices it would.

use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::core::v1::Service;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::api::{Api, PostParams};
use serde_json::{json, Value};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Instant;

use crate::e2e::{Cluster, HEALTH_PORT, METRICS_PORT};

/// Every endpoint's port.
pub const TARGET_PORT: u16 = 8080;

/// Whether a TCP Service may not take `p`: the agent's default reserved ports (read from the
/// agent, so a bench never drifts from it), with the harness's health and metrics ports as the
/// agent's own.
pub fn reserved(p: u16) -> bool {
    use nodelb_core::plan::reserved::ReservedPorts;
    use nodelb_core::vocab::Protocol;
    static RESERVED: std::sync::OnceLock<ReservedPorts> = std::sync::OnceLock::new();
    RESERVED
        .get_or_init(|| ReservedPorts::defaults().with(Protocol::Tcp, [HEALTH_PORT, METRICS_PORT]))
        .contains(Protocol::Tcp, p)
}

/// How many Services can have a port of their own.
pub fn max_services() -> usize {
    (1024..=u16::MAX).filter(|p| !reserved(*p)).count()
}

/// Service `i`'s port is the `i`-th free port from 1024 up.
pub fn ports(n: usize) -> Vec<u16> {
    (1024..=u16::MAX)
        .filter(|p| !reserved(*p))
        .take(n)
        .collect()
}

pub fn service_name(i: usize) -> String {
    format!("svc-{i:05}")
}

/// Service `i`'s EndpointSlice.
pub fn slice_name(i: usize) -> String {
    format!("{}-1", service_name(i))
}

pub fn service(ns: &str, i: usize, port: u16) -> Value {
    json!({
        "apiVersion": "v1", "kind": "Service",
        "metadata": {"name": service_name(i), "namespace": ns},
        "spec": {"type": "LoadBalancer",
                 "allocateLoadBalancerNodePorts": false,
                 "ports": [{"name": "tcp", "port": port, "protocol": "TCP",
                            "targetPort": TARGET_PORT}]},
    })
}

/// Endpoint `k` of every Service starts at 198.51.100.(10+k).
pub fn initial_address(k: usize) -> String {
    format!("198.51.100.{}", 10 + k)
}

/// Service `i`'s slice: `endpoints` ready endpoints at their initial addresses, endpoint `k` on
/// node `nodes[k % nodes.len()]`.
pub fn slice(ns: &str, i: usize, endpoints: usize, nodes: &[&str]) -> Value {
    let eps: Vec<Value> = (0..endpoints)
        .map(|k| {
            json!({"addresses": [initial_address(k)], "nodeName": nodes[k % nodes.len()],
                   "conditions": {"ready": true}})
        })
        .collect();
    json!({
        "apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
        "metadata": {"name": slice_name(i), "namespace": ns,
                     "labels": {"kubernetes.io/service-name": service_name(i)}},
        "addressType": "IPv4",
        "ports": [{"name": "tcp", "port": TARGET_PORT, "protocol": "TCP"}],
        "endpoints": eps,
    })
}

/// Creates a Service on each of `ports` and its EndpointSlice (see [`slice`]) in `ns` through
/// the admin client, `concurrency` requests in flight (each Service before its slice), printing
/// progress: a Service's create costs kube-apiserver more the more Services exist (each
/// ClusterIP allocation of v1.36 lists every `IPAddress` object twice to update its metrics),
/// so the load takes time quadratic in N. Returns the stored slices, by index.
pub fn load(
    c: &Cluster,
    ns: &str,
    ports: &[u16],
    endpoints: usize,
    nodes: &[&str],
    concurrency: usize,
) -> Result<Vec<EndpointSlice>, String> {
    let services: Api<Service> = Api::namespaced(c.admin().clone(), ns);
    let slices: Api<EndpointSlice> = Api::namespaced(c.admin().clone(), ns);
    let (services, slices) = (&services, &slices);
    let t0 = Instant::now();
    let done = &AtomicUsize::new(0);
    let step = (ports.len() / 5).max(1000);
    let mut stored: Vec<(usize, EndpointSlice)> = c.block_on(
        futures::stream::iter(ports.iter().copied().enumerate())
            .map(|(i, port)| async move {
                let pp = PostParams::default();
                let svc: Service = serde_json::from_value(service(ns, i, port))
                    .map_err(|e| format!("Service {i}: {e}"))?;
                services
                    .create(&pp, &svc)
                    .await
                    .map_err(|e| format!("creating Service {i}: {e}"))?;
                let sl: EndpointSlice = serde_json::from_value(slice(ns, i, endpoints, nodes))
                    .map_err(|e| format!("EndpointSlice {i}: {e}"))?;
                let sl = slices
                    .create(&pp, &sl)
                    .await
                    .map_err(|e| format!("creating EndpointSlice {i}: {e}"))?;
                let k = done.fetch_add(1, Ordering::Relaxed) + 1;
                if k.is_multiple_of(step) && k < ports.len() {
                    println!(
                        "    loading: {k} Services and their slices after {:.1} s",
                        t0.elapsed().as_secs_f64()
                    );
                }
                Ok::<_, String>((i, sl))
            })
            .buffer_unordered(concurrency)
            .try_collect(),
    )?;
    stored.sort_by_key(|(i, _)| *i);
    Ok(stored.into_iter().map(|(_, s)| s).collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ports_skip_the_reserved_ones() {
        let p = ports(2000);
        assert_eq!(p.len(), 2000);
        assert!(p.iter().all(|p| !reserved(*p)));
        assert!(p.windows(2).all(|w| w[0] < w[1]));
        assert!(reserved(HEALTH_PORT) && reserved(METRICS_PORT) && reserved(2379));
    }
}
