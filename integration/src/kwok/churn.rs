//! Heavy status churn: the leader's node publishes another address, and then its own again,
//! every `toggle_every` (each change rewrites every status that lists it: a round), while the
//! follower's agent Pod is deleted (gracefully, as `kubectl delete pod` does) every
//! `restart_every` and its DaemonSet starts another.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams};
use kube::Client;
use serde_json::json;

use super::fleet::AGENT_PODS;
use super::statuses::StatusWatch;
use crate::real_cluster::NODELB_NAMESPACE;

/// The Node annotation that replaces a node's addresses in the statuses.
pub const PUBLISHED_ANNOTATION: &str = "nodelb.io/published-addresses";
/// What the leader's node publishes every other round (a documentation address).
pub const PUBLISHED_ADDRESS: &str = "203.0.113.200";

/// One churn window.
pub struct Churn<'a> {
    pub client: Client,
    pub watch: &'a StatusWatch,
    /// The node whose published address changes, and its own address.
    pub toggled: (String, String),
    /// The node whose agent Pod is deleted.
    pub restarted: String,
    pub window: Duration,
    pub toggle_every: Duration,
    pub restart_every: Duration,
}

/// One change of the toggled node's address and how long every status took to carry it.
#[derive(Debug, Clone)]
pub struct Round {
    pub to: String,
    /// From the change to the last status that carried it.
    pub took: Duration,
    /// Statuses that did not carry it when the next change came.
    pub pending: usize,
}

#[derive(Debug, Clone, Default)]
pub struct Outcome {
    pub rounds: Vec<Round>,
    /// When (from the window's start) each agent Pod was deleted, and its name.
    pub restarts: Vec<(Duration, String)>,
}

/// Sets (`Some`) or removes the published address of `node`.
pub async fn publish(client: &Client, node: &str, address: Option<&str>) -> Result<(), String> {
    let patch = json!({"metadata": {"annotations": {PUBLISHED_ANNOTATION: address}}});
    Api::<Node>::all(client.clone())
        .patch(node, &PatchParams::default(), &Patch::Merge(patch))
        .await
        .map(|_| ())
        .map_err(|e| format!("annotating Node {node}: {e}"))
}

impl Churn<'_> {
    /// Runs the window; ends with the toggled node publishing its own address again and every
    /// status carrying it (or the last round's bound passed).
    pub async fn run(&self) -> Result<Outcome, String> {
        let stop = Arc::new(AtomicBool::new(false));
        let restarter = tokio::spawn(restarts(
            self.client.clone(),
            self.restarted.clone(),
            self.restart_every,
            stop.clone(),
        ));
        let rounds = self.toggles().await;
        stop.store(true, Ordering::Relaxed);
        let restarts = restarter
            .await
            .map_err(|e| format!("the restarts: {e}"))??;
        Ok(Outcome {
            rounds: rounds?,
            restarts,
        })
    }

    async fn toggles(&self) -> Result<Vec<Round>, String> {
        let began = Instant::now();
        let bound = (self.toggle_every * 3).max(Duration::from_secs(120));
        let (node, own) = (&self.toggled.0, &self.toggled.1);
        let mut published = false;
        let mut rounds = Vec::new();
        loop {
            let finishing = began.elapsed() >= self.window;
            if finishing && !published {
                return Ok(rounds);
            }
            published = !published;
            let to = if published {
                PUBLISHED_ADDRESS
            } else {
                own.as_str()
            };
            self.watch.begin_round(to);
            publish(&self.client, node, published.then_some(PUBLISHED_ADDRESS)).await?;
            let changed = Instant::now();
            loop {
                tokio::time::sleep(Duration::from_secs(1)).await;
                let (pending, took) = self.watch.round();
                let waited = changed.elapsed();
                if (pending == 0 && (waited >= self.toggle_every || finishing)) || waited >= bound {
                    println!(
                        "kwok:   round {}: {node} -> {to} reached every status in {:.1} s \
                         ({pending} pending), at {:.0} s of the window",
                        rounds.len() + 1,
                        took.as_secs_f64(),
                        began.elapsed().as_secs_f64()
                    );
                    rounds.push(Round {
                        to: to.to_string(),
                        took,
                        pending,
                    });
                    break;
                }
            }
        }
    }
}

/// Deletes the agent Pod on `node` every `every` (the first after a third of it) until
/// `stop`: when each was deleted, and which.
async fn restarts(
    client: Client,
    node: String,
    every: Duration,
    stop: Arc<AtomicBool>,
) -> Result<Vec<(Duration, String)>, String> {
    let api: Api<Pod> = Api::namespaced(client, NODELB_NAMESPACE);
    let list = ListParams::default()
        .labels(AGENT_PODS)
        .fields(&format!("spec.nodeName={node}"));
    let began = Instant::now();
    let mut next = began + every / 3;
    let mut out = Vec::new();
    while !stop.load(Ordering::Relaxed) {
        if Instant::now() < next {
            tokio::time::sleep(Duration::from_millis(500)).await;
            continue;
        }
        let pods = api
            .list(&list)
            .await
            .map_err(|e| format!("listing the agent Pod on {node}: {e}"))?;
        let Some(pod) = pods
            .items
            .into_iter()
            .find(|p| p.metadata.deletion_timestamp.is_none())
            .and_then(|p| p.metadata.name)
        else {
            next = Instant::now() + Duration::from_secs(5);
            continue;
        };
        api.delete(&pod, &DeleteParams::default())
            .await
            .map_err(|e| format!("deleting the agent Pod {pod}: {e}"))?;
        out.push((began.elapsed(), pod));
        next += every;
    }
    Ok(out)
}
