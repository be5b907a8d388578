//! nodelb's status leader in a big cluster, simulated: kwok's nodes beside `scripts/cluster.sh`'s
//! real two, against its real kube-apiserver, nodelb installed from its image with its real
//! agent leading; 10,000 LoadBalancer Services, each served by the real nodes and one pool of 10
//! simulated ones; a steady window, then heavy status churn (node-a's published address changed
//! every 40 s, node-b's agent Pod deleted every 60 s), then node loss (a simulated node's Lease
//! no longer renewed, another's Node deleted). The scenario is `nodelb_integration::kwok`'s,
//! the one the real-cluster test runs at 1,000 nodes for 10 minutes.
//!
//! Prints every phase's time; the Lease renewals' lateness, real kubelets and kwok's apart (the
//! audit log); nodelb's requests per node and minute by verb at steady state, the leader's,
//! the follower's and extrapolated to every node; the leader's memory, the load, the memory of
//! kube-apiserver, etcd and kwok; each round; every false removal (a status version without a
//! node that was alive); then the row
//! `bench kwok nodes=N services=S leader_rss_mib=X round_ms=Y node_loss_s=Z
//! requests_per_node_min=R false_removals=F` and a PASS/MISS line per goal (false removals 0,
//! at most one request per node per minute, a dead node out of every status within 30 s, the
//! leader under 96 MiB). Never asserts a figure; an error (a cluster that does not converge)
//! fails the run. Cleans up whatever happens; takes the cluster down again if it brought it up.
//!
//! Env: `NODELB_KWOK_NODES` (1000), `NODELB_KWOK_SERVICES` (10000),
//! `NODELB_KWOK_CHURN_SECONDS` (300), and the others `Scenario::from_env` reads
//! (`_POOL_SIZE`, `_STEADY_SECONDS`, `_TOGGLE_SECONDS`, `_RESTART_SECONDS`,
//! `_CONCURRENCY`); `NODELB_IMAGE_AGENT_BIN` names the
//! release agent the image carries, as for `scripts/cluster.sh up`. Needs root; without it
//! prints SKIP and exits 0, or 1 when `CI=true`.
//! Run: `cargo bench -p nodelb-integration --bench kwok`.

use std::process::{Command, ExitCode};
use std::time::Duration;

use nodelb_integration::kwok::{self, Scenario};
use nodelb_integration::real_cluster::RealCluster;

fn main() -> ExitCode {
    nodelb_integration::netns::bench_main("kwok", run)
}

fn cluster_sh(arg: &str) -> bool {
    Command::new("bash")
        .arg(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../scripts/cluster.sh"
        ))
        .arg(arg)
        .status()
        .is_ok_and(|s| s.success())
}

fn run() -> Result<(), String> {
    let scenario = Scenario::from_env(1000, 10_000, Duration::from_secs(300))?;
    let was_up = cluster_sh("status");
    let Some((_turn, c)) = RealCluster::get("kwok bench") else {
        return Ok(());
    };
    let result = kwok::run(c, &scenario);
    if !was_up && !cluster_sh("down") {
        eprintln!("kwok bench: scripts/cluster.sh down failed");
    }
    result.map(|_| ())
}
