//! Kubernetes I/O: the client, the watches and the inbox they fill, the status Lease election
//! and the node heartbeats, the status writer, Events, `clear-status`. The wire types the API
//! is read into, and every decision, are `nodelb-core`'s; this room only reads and writes the
//! API.

pub mod clear_status;
pub mod connection;
pub mod election;
pub mod events;
pub mod heartbeat;
pub mod inbox;
pub mod node_events;
pub mod rate_limit;
pub mod status_writer;
pub mod watches;
pub mod watching;

use anyhow::Context;
use tracing::info;

/// The kubeconfig: `--kubeconfig`, else `$KUBECONFIG` / `~/.kube/config`, else in-cluster.
pub async fn config(kubeconfig: Option<&std::path::Path>) -> anyhow::Result<kube::Config> {
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
    Ok(config)
}

/// The kube client, over connections that find a dead peer by themselves (see
/// [`connection`]).
pub async fn client(kubeconfig: Option<&std::path::Path>) -> anyhow::Result<kube::Client> {
    let config = config(kubeconfig).await?;
    connection::client(config, None).context("building the Kubernetes client")
}

/// The agent's two clients over the same kubeconfig: one for its inputs (Services,
/// EndpointSlices, its Node), whose watch streams `readiness` judges, and one for the rest
/// (Leases, status, Events).
pub async fn clients(
    kubeconfig: Option<&std::path::Path>,
    readiness: &crate::readiness::Readiness,
) -> anyhow::Result<(kube::Client, kube::Client)> {
    let config = config(kubeconfig).await?;
    let inputs = connection::client(config.clone(), Some(readiness.view()))
        .context("building the Kubernetes client")?;
    let rest = connection::client(config, None).context("building the Kubernetes client")?;
    Ok((inputs, rest))
}
