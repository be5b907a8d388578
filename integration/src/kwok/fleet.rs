//! The nodes of the simulation: kwok's (`scripts/cluster.sh kwok up|down`), nodelb's agent Pods
//! on them, the heartbeat Leases a real agent in each of those Pods would have written, and the
//! real agents' processes.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::{Command, Stdio};

use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::api::core::v1::{Node, Pod};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use kube::api::{Api, ListParams, ObjectMeta, PostParams};
use kube::Client;
use nodelb_core::status::format_families;
use nodelb_core::status::heartbeat::{
    lease_name, FAMILIES_ANNOTATION, LIVENESS_ANNOTATION, LIVENESS_POD, NODE_LABEL,
};
use nodelb_core::vocab::Families;

use crate::real_cluster::NODELB_NAMESPACE;

/// The label every simulated node carries.
pub const SIMULATED: &str = "nodelb.io/kwok=true";
/// The label kwok manages nodes by: without it a node's Lease is no longer renewed.
pub const MANAGED_BY_KWOK: &str = "kwok.x-k8s.io/node";
/// The label of a node's pool (`real` for the real nodes).
pub const POOL_LABEL: &str = "nodelb.io/pool";
/// The agents' Pods.
pub const AGENT_PODS: &str = "app.kubernetes.io/name=nodelb,app.kubernetes.io/component=agent";

/// A simulated node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FakeNode {
    pub name: String,
    pub address: String,
    pub pool: String,
}

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// `scripts/cluster.sh kwok <args>`, with `NODELB_KWOK_POOL_SIZE`; its stdout.
pub fn cluster_sh_kwok(args: &[&str], pool_size: usize) -> Result<String, String> {
    let out = Command::new("bash")
        .arg(repo().join("scripts/cluster.sh"))
        .arg("kwok")
        .args(args)
        .env("NODELB_KWOK_POOL_SIZE", pool_size.to_string())
        .stderr(Stdio::inherit())
        .output()
        .map_err(|e| format!("running scripts/cluster.sh kwok {args:?}: {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "scripts/cluster.sh kwok {args:?} failed ({})",
            out.status
        ));
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// `scripts/cluster.sh env`: KEY → value.
pub fn cluster_env() -> Result<BTreeMap<String, String>, String> {
    let out = Command::new("bash")
        .arg(repo().join("scripts/cluster.sh"))
        .arg("env")
        .output()
        .map_err(|e| format!("running scripts/cluster.sh env: {e}"))?;
    Ok(String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| l.split_once('='))
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect())
}

/// The simulated nodes as the cluster has them, by name.
pub async fn fake_nodes(client: &Client) -> Result<Vec<FakeNode>, String> {
    let nodes = Api::<Node>::all(client.clone())
        .list(&ListParams::default().labels(SIMULATED))
        .await
        .map_err(|e| format!("listing the simulated nodes: {e}"))?;
    let mut out: Vec<FakeNode> = nodes
        .items
        .into_iter()
        .filter_map(|n| {
            let address = n
                .status?
                .addresses?
                .into_iter()
                .find(|a| a.type_ == "InternalIP")?
                .address;
            Some(FakeNode {
                name: n.metadata.name?,
                address,
                pool: n.metadata.labels?.get(POOL_LABEL)?.clone(),
            })
        })
        .collect();
    out.sort_by(|a, b| a.name.cmp(&b.name));
    Ok(out)
}

/// The agents' Pods not being deleted: node → (Pod name, Ready).
pub async fn agent_pods(client: &Client) -> Result<BTreeMap<String, (String, bool)>, String> {
    let pods = Api::<Pod>::namespaced(client.clone(), NODELB_NAMESPACE)
        .list(&ListParams::default().labels(AGENT_PODS))
        .await
        .map_err(|e| format!("listing the agents' Pods: {e}"))?;
    Ok(pods
        .items
        .into_iter()
        .filter(|p| p.metadata.deletion_timestamp.is_none())
        .filter_map(|p| {
            let node = p.spec?.node_name?;
            let ready = p
                .status
                .and_then(|s| s.conditions)
                .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"));
            Some((node, (p.metadata.name?, ready)))
        })
        .collect())
}

/// The heartbeat Lease an agent in Pod `pod` on `node` writes (`agent/src/kube/heartbeat.rs`):
/// holder the Pod, IPv4 programmed, alive by its Pod, renewed now.
pub fn heartbeat(node: &str, pod: &str) -> Lease {
    let (simulated_key, simulated_value) = SIMULATED.split_once('=').unwrap_or((SIMULATED, ""));
    let now = MicroTime(k8s_openapi::jiff::Timestamp::now());
    let families = format_families(Families {
        v4: true,
        v6: false,
    });
    Lease {
        metadata: ObjectMeta {
            name: Some(lease_name(node)),
            namespace: Some(NODELB_NAMESPACE.to_string()),
            // The simulated Nodes' label too: `scripts/cluster.sh kwok down` deletes these
            // Leases by it, in one request.
            labels: Some(
                [
                    (NODE_LABEL.to_string(), node.to_string()),
                    (simulated_key.to_string(), simulated_value.to_string()),
                ]
                .into(),
            ),
            annotations: Some(
                [
                    (FAMILIES_ANNOTATION.to_string(), families),
                    (LIVENESS_ANNOTATION.to_string(), LIVENESS_POD.to_string()),
                ]
                .into(),
            ),
            ..Default::default()
        },
        spec: Some(LeaseSpec {
            holder_identity: Some(pod.to_string()),
            // As the agent's default: three periods of a 15 s --node-lease-duration / 3.
            lease_duration_seconds: Some(15),
            acquire_time: Some(now.clone()),
            renew_time: Some(now),
            ..Default::default()
        }),
    }
}

/// Writes, once, the heartbeat of each (node, Pod), `concurrency` at a time.
pub async fn write_heartbeats(
    client: &Client,
    pods: &[(String, String)],
    concurrency: usize,
) -> Result<(), String> {
    let api: Api<Lease> = Api::namespaced(client.clone(), NODELB_NAMESPACE);
    let api = &api;
    futures::stream::iter(pods)
        .map(|(node, pod)| async move {
            let lease = heartbeat(node, pod);
            match api.create(&PostParams::default(), &lease).await {
                Err(kube::Error::Api(s)) if s.code == 409 => {
                    let mut current = api
                        .get(&lease_name(node))
                        .await
                        .map_err(|e| format!("reading {}: {e}", lease_name(node)))?;
                    current.metadata.labels = lease.metadata.labels;
                    current.metadata.annotations = lease.metadata.annotations;
                    current.spec = lease.spec;
                    api.replace(&lease_name(node), &PostParams::default(), &current)
                        .await
                        .map(|_| ())
                }
                r => r.map(|_| ()),
            }
            .map_err(|e| format!("writing {}: {e}", lease_name(node)))
        })
        .buffer_unordered(concurrency)
        .try_collect::<Vec<()>>()
        .await
        .map(|_| ())
}

/// The Pod holding the status Lease `nodelb-status`, if any.
pub async fn leader(client: &Client) -> Result<Option<String>, String> {
    let lease = Api::<Lease>::namespaced(client.clone(), NODELB_NAMESPACE)
        .get_opt(nodelb_core::status::election::LEASE_NAME)
        .await
        .map_err(|e| format!("reading the status Lease: {e}"))?;
    Ok(lease
        .and_then(|l| l.spec?.holder_identity)
        .filter(|h| !h.is_empty()))
}

/// The process of the agent on `node` (`nodelb-agent run` with `NODE_NAME=<node>`), found in
/// `/proc`: the cluster's nodes share the machine's process namespace. `None` when there is
/// not exactly one (between an agent's exit and its successor's start).
pub fn agent_pid(node: &str) -> Option<u32> {
    let env = format!("NODE_NAME={node}");
    let fields = |b: Vec<u8>| -> Vec<String> {
        b.split(|c| *c == 0)
            .map(|f| String::from_utf8_lossy(f).into_owned())
            .collect()
    };
    let found: Vec<u32> = std::fs::read_dir("/proc")
        .ok()?
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| {
            let read = |f: &str| std::fs::read(format!("/proc/{pid}/{f}")).unwrap_or_default();
            let cmdline = fields(read("cmdline"));
            cmdline.first().is_some_and(|c| c.ends_with("nodelb-agent"))
                && cmdline.get(1).is_some_and(|a| a == "run")
                && fields(read("environ")).contains(&env)
        })
        .collect();
    (found.len() == 1).then(|| found[0])
}

/// The resident memory (VmRSS, KiB) of the process whose pid `scripts/cluster.sh` recorded for
/// `name` (kube-apiserver, etcd, kwok, ...).
pub fn cluster_process_rss(name: &str) -> Option<u64> {
    let dir = std::env::var("NODELB_CLUSTER_DIR").unwrap_or("/var/lib/nodelb-cluster".into());
    let pid = std::fs::read_to_string(format!("{dir}/pids/{name}")).ok()?;
    crate::bench::memory(pid.trim().parse().ok()?)
        .ok()
        .map(|m| m.rss)
}
