//! Kubernetes I/O: the client, the watches and the inbox they fill, the status Lease election
//! and the node heartbeats, the status writer, Events, `clear-status`. The wire types the API
//! is read into, and every decision, are `nodelb-core`'s; this room only reads and writes the
//! API.

pub mod clear_status;
pub mod events;
pub mod inbox;
pub mod kubelet;
pub mod lease;
pub mod node_events;
pub mod rate_limit;
pub mod status_writer;
pub mod watches;

use anyhow::Context;
use tracing::info;

/// The kube client: `--kubeconfig`, else `$KUBECONFIG` / `~/.kube/config`, else in-cluster.
pub async fn client(kubeconfig: Option<&std::path::Path>) -> anyhow::Result<kube::Client> {
    let config = match kubeconfig {
        Some(path) => {
            let kc = kube::config::Kubeconfig::read_from(path)
                .with_context(|| format!("reading kubeconfig {}", path.display()))?;
            kube::Config::from_custom_kubeconfig(kc, &kube::config::KubeConfigOptions::default())
                .await
                .with_context(|| format!("loading kubeconfig {}", path.display()))?
        }
        None => kube::Config::infer()
            .await
            .context("finding a kubeconfig ($KUBECONFIG, ~/.kube/config, in-cluster)")?,
    };
    info!(cluster = %config.cluster_url, "API server");
    kube::Client::try_from(config).context("building the Kubernetes client")
}
