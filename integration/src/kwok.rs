//! A big cluster, simulated: kwok's nodes (`scripts/cluster.sh kwok up N`) beside the real two
//! of `scripts/cluster.sh`, against its real kube-apiserver, with nodelb installed from its
//! image and its real agent leading. One scenario, run by the real-cluster test
//! (`integration/tests/cluster.rs`, 1,000 nodes, 10 minutes of churn) and by the bench
//! (`integration/benches/kwok.rs`, sizes from the environment):
//!
//! 1. nodelb installed (`kubectl apply -k`, as the other real-cluster tests), the real nodes
//!    labelled `nodelb.io/pool=real`, and the status Lease moved to node-a's agent (node-b's Pod
//!    is deleted once if it held it). Then the Services (10,000 by default, server-side
//!    applies, many in flight), each selecting `nodelb.io/pool in (real,p<k>)`, one pool of 10
//!    simulated nodes: about 12 addresses a status; then N simulated nodes (kwok: Ready, their
//!    node Leases renewed, tainted so only nodelb's tolerate-everything DaemonSet lands there;
//!    the real controller manager and scheduler create and bind its Pods, kwok makes them
//!    Running and Ready). Once every simulated node has its agent Pod, the
//!    heartbeat Lease `nodelb-node-<node>` its agent would write is written, once, as an agent
//!    in a Pod writes it (holder the Pod, IPv4, alive by its Pod). Then it waits until every
//!    status lists exactly its nodes.
//! 2. A steady window, then heavy status churn: node-a publishes 203.0.113.200 instead of its
//!    own address, then its own again, every `toggle_every` (each change rewrites every status),
//!    while node-b's agent Pod is deleted every `restart_every`. A watch on every Service
//!    records every version of every status from the steady window on.
//! 3. Node loss: one simulated node stops renewing its Lease (kwok no longer manages it),
//!    another's Node is deleted; the time until the last status without each.
//! 4. Figures from kube-apiserver's audit log: how late Lease renewals came, real kubelets and
//!    kwok's apart; nodelb's requests per node and minute by verb in the steady window. A
//!    removal (a status version that dropped a node the one before listed) is false unless the
//!    node was taken down on purpose, or is simulated and its Lease went more than 15 s (the
//!    leader's `--node-lease-duration`) without a renewal before it. The leader's memory, the
//!    load, the memory of the server, etcd and kwok, sampled every 5 s. Every phase is timed.
//! 5. Cleanup, whatever happened: the Services and their namespace, `kwok down` (nodes, their
//!    Pods and Leases, kwok), the real nodes' label and annotation.
//!
//! The row: `bench kwok nodes=N services=S leader_rss_mib=X round_ms=Y node_loss_s=Z
//! requests_per_node_min=R false_removals=F`, then a PASS/MISS line for each goal.

pub mod audit;
pub mod churn;
pub mod fleet;
pub mod sampler;
pub mod services;
pub mod statuses;

mod run;

pub use run::run;

use std::time::Duration;

use crate::bench::env_usize;

/// The namespace of the simulation's Services.
pub const NAMESPACE: &str = "kwok-bench";

/// One run's sizes and windows.
#[derive(Debug, Clone)]
pub struct Scenario {
    /// Simulated nodes (besides the real ones).
    pub nodes: usize,
    pub services: usize,
    /// Simulated nodes per pool; a Service selects one pool.
    pub pool_size: usize,
    pub steady: Duration,
    pub churn: Duration,
    pub toggle_every: Duration,
    pub restart_every: Duration,
    /// Requests in flight when applying or deleting Services and writing heartbeats.
    pub concurrency: usize,
}

impl Scenario {
    /// `nodes`, `services` and `churn` unless the environment says otherwise:
    /// `NODELB_KWOK_NODES`, `NODELB_KWOK_SERVICES`, `NODELB_KWOK_POOL_SIZE` (10),
    /// `NODELB_KWOK_STEADY_SECONDS` (60), `NODELB_KWOK_CHURN_SECONDS`,
    /// `NODELB_KWOK_TOGGLE_SECONDS` (40), `NODELB_KWOK_RESTART_SECONDS` (60),
    /// `NODELB_KWOK_CONCURRENCY` (32).
    pub fn from_env(nodes: usize, services: usize, churn: Duration) -> Result<Scenario, String> {
        let secs = |name: &str, default: u64, min: usize| {
            env_usize(name, default as usize, min).map(|s| Duration::from_secs(s as u64))
        };
        let services = env_usize("NODELB_KWOK_SERVICES", services, 1)?;
        if services > 50_000 {
            return Err(format!(
                "NODELB_KWOK_SERVICES={services}: at most 50000 ports"
            ));
        }
        Ok(Scenario {
            nodes: env_usize("NODELB_KWOK_NODES", nodes, 2)?,
            services,
            pool_size: env_usize("NODELB_KWOK_POOL_SIZE", 10, 1)?,
            steady: secs("NODELB_KWOK_STEADY_SECONDS", 60, 10)?,
            churn: secs("NODELB_KWOK_CHURN_SECONDS", churn.as_secs(), 0)?,
            toggle_every: secs("NODELB_KWOK_TOGGLE_SECONDS", 40, 5)?,
            restart_every: secs("NODELB_KWOK_RESTART_SECONDS", 60, 10)?,
            concurrency: env_usize("NODELB_KWOK_CONCURRENCY", 32, 1)?,
        })
    }

    /// How many pools the Services spread over.
    pub fn pools(&self) -> usize {
        self.nodes.div_ceil(self.pool_size).max(1)
    }
}

/// What a run measured.
#[derive(Debug, Clone)]
pub struct Report {
    pub nodes: usize,
    pub services: usize,
    /// The leader agent's peak resident memory (VmHWM).
    pub leader_rss_mib: f64,
    /// The slowest round: from a change of node-a's published address to the last status
    /// carrying it.
    pub round_ms: f64,
    /// From the moment a simulated node's Lease stopped being renewed to the last status
    /// without it.
    pub node_loss_s: f64,
    /// nodelb's requests per node per minute at steady state, extrapolated to every node:
    /// (leader + (nodes - 1) x follower) / nodes.
    pub requests_per_node_min: f64,
    pub false_removals: usize,
}

impl Report {
    pub fn row(&self) -> String {
        format!(
            "bench kwok nodes={} services={} leader_rss_mib={:.1} round_ms={:.0} node_loss_s={:.1} \
             requests_per_node_min={:.2} false_removals={}",
            self.nodes,
            self.services,
            self.leader_rss_mib,
            self.round_ms,
            self.node_loss_s,
            self.requests_per_node_min,
            self.false_removals
        )
    }
}
