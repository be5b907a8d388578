//! The simulation's LoadBalancer Services: one TCP port each (every one is served by the two
//! real nodes, so no two may share a port there), no selector and so no endpoints (nodelb
//! publishes a Service without endpoints too), no NodePort, and a `nodelb.io/node-selector`
//! that picks the real nodes and one pool of simulated ones. Created and deleted through the
//! admin client, many requests in flight: server-side applies, not one kubectl per Service.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::core::v1::Service;
use kube::api::{Api, DeleteParams, Patch, PatchParams};
use kube::Client;
use nodelb_core::plan::reserved::{ReservedPorts, DEFAULT_OWN_PORTS};
use nodelb_core::vocab::Protocol;
use serde_json::{json, Value};

/// The field manager of the simulation's applies.
pub const MANAGER: &str = "nodelb-kwok-bench";

/// `n` TCP ports from 1024 up that an agent with the default flags may serve: not reserved,
/// not its own health and metrics ports.
pub fn ports(n: usize) -> Vec<u16> {
    let reserved = ReservedPorts::defaults().with(Protocol::Tcp, DEFAULT_OWN_PORTS);
    (1024..=u16::MAX)
        .filter(|p| !reserved.contains(Protocol::Tcp, *p))
        .take(n)
        .collect()
}

pub fn name(i: usize) -> String {
    format!("svc-{i:05}")
}

/// Service `i` on `port`, served by the real nodes and pool `pool`.
pub fn service(i: usize, port: u16, pool: &str) -> Value {
    json!({
        "apiVersion": "v1", "kind": "Service",
        "metadata": {"name": name(i), "annotations": {
            "nodelb.io/node-selector": format!("{} in (real,{pool})", super::fleet::POOL_LABEL)}},
        "spec": {"type": "LoadBalancer",
                 "allocateLoadBalancerNodePorts": false,
                 "ports": [{"name": "tcp", "port": port, "protocol": "TCP", "targetPort": 8080}]},
    })
}

/// Applies `services` (index, object) in `ns`, `concurrency` at a time, printing progress;
/// returns how long it took.
pub async fn apply(
    client: &Client,
    ns: &str,
    services: Vec<(usize, Value)>,
    concurrency: usize,
) -> Result<Duration, String> {
    let api: Api<Service> = Api::namespaced(client.clone(), ns);
    let (api, total) = (&api, services.len());
    let began = Instant::now();
    let done = &AtomicUsize::new(0);
    let pp = &PatchParams::apply(MANAGER).force();
    futures::stream::iter(services)
        .map(|(i, svc)| async move {
            api.patch(&name(i), pp, &Patch::Apply(svc))
                .await
                .map_err(|e| format!("applying Service {}: {e}", name(i)))?;
            let k = done.fetch_add(1, Ordering::Relaxed) + 1;
            if k.is_multiple_of(2000) && k < total {
                println!(
                    "kwok:   {k} Services applied after {:.1} s",
                    began.elapsed().as_secs_f64()
                );
            }
            Ok::<_, String>(())
        })
        .buffer_unordered(concurrency)
        .try_collect::<Vec<()>>()
        .await?;
    Ok(began.elapsed())
}

/// Deletes every Service of `ns`, `concurrency` at a time; returns how many.
pub async fn delete_all(client: &Client, ns: &str, concurrency: usize) -> Result<usize, String> {
    let api: Api<Service> = Api::namespaced(client.clone(), ns);
    let names: Vec<String> = api
        .list_metadata(&Default::default())
        .await
        .map_err(|e| format!("listing the Services of {ns}: {e}"))?
        .items
        .into_iter()
        .filter_map(|s| s.metadata.name)
        .collect();
    let api = &api;
    let n = names.len();
    futures::stream::iter(names)
        .map(|name| async move {
            match api.delete(&name, &DeleteParams::default()).await {
                Err(kube::Error::Api(s)) if s.code == 404 => Ok(()),
                r => r
                    .map(|_| ())
                    .map_err(|e| format!("deleting Service {ns}/{name}: {e}")),
            }
        })
        .buffer_unordered(concurrency)
        .try_collect::<Vec<()>>()
        .await?;
    Ok(n)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ports_are_distinct_and_none_reserved_nor_the_agents_own() {
        let p = ports(10_000);
        assert_eq!(p.len(), 10_000);
        assert!(p.windows(2).all(|w| w[0] < w[1]));
        for own in DEFAULT_OWN_PORTS.iter().chain(&[6443, 10250, 2379]) {
            assert!(!p.contains(own), "{own}");
        }
    }
}
