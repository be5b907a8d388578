//! `nodelb-api-double`: the in-repo Kubernetes API double as a process.
//!
//! ```text
//! nodelb-api-double --listen 127.0.0.1:6443 --rbac-dir manifests \
//!     --token admin-token=admin:system:masters \
//!     --token agent-token=system:serviceaccount:nodelb-system:nodelb \
//!     [--audit-file audit.jsonl] [--drop-field status.loadBalancer.ingress[].ipMode] \
//!     [--version-minor 29] [--validate] [--history 1000] [--bookmark-interval-secs 60] \
//!     [--kubeconfig-out kubeconfig --kubeconfig-token agent-token \
//!      --kubeconfig-server http://127.0.0.1:6443]
//! ```

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::{bail, Context};
use clap::Parser;
use nodelb_integration::apiserver::{kubeconfig, ApiServer, ApiServerConfig};
use tracing::{error, info};

#[derive(Debug, Parser)]
#[command(
    name = "nodelb-api-double",
    about = "In-repo Kubernetes API double for nodelb e2e tests"
)]
struct Args {
    /// Address to listen on (repeatable).
    #[arg(long = "listen", required = true)]
    listen: Vec<SocketAddr>,
    /// Directory of manifests whose RBAC objects are enforced.
    #[arg(long)]
    rbac_dir: Option<PathBuf>,
    /// TOKEN=USER[:GROUP,GROUP...] (repeatable). `t=admin:system:masters`
    /// is user `admin` in group `system:masters`; a user
    /// `system:serviceaccount:NS:NAME` is taken whole.
    #[arg(long = "token")]
    tokens: Vec<String>,
    /// Append audit records here as JSON lines.
    #[arg(long)]
    audit_file: Option<PathBuf>,
    /// Strip this field on write (repeatable), e.g.
    /// `status.loadBalancer.ingress[].ipMode`.
    #[arg(long = "drop-field")]
    drop_fields: Vec<String>,
    /// Serve as Kubernetes 1.N.
    #[arg(long, default_value_t = 33)]
    version_minor: u32,
    /// Reject objects kube-apiserver would reject.
    #[arg(long)]
    validate: bool,
    /// Watch history length.
    #[arg(long, default_value_t = 1000)]
    history: usize,
    /// Seconds between BOOKMARK events.
    #[arg(long, default_value_t = 60)]
    bookmark_interval_secs: u64,
    /// Write a kubeconfig for kube-rs clients here.
    #[arg(long, requires_all = ["kubeconfig_token", "kubeconfig_server"])]
    kubeconfig_out: Option<PathBuf>,
    /// Token written into the kubeconfig.
    #[arg(long)]
    kubeconfig_token: Option<String>,
    /// Server URL written into the kubeconfig (`http://ADDR:PORT`).
    #[arg(long)]
    kubeconfig_server: Option<String>,
}

/// Parses `TOKEN=USER[:GROUP,GROUP...]`. A ServiceAccount user name has
/// colons itself, so `system:serviceaccount:NS:NAME` is taken whole, with
/// groups only after a fifth colon-separated part.
fn parse_token(spec: &str) -> anyhow::Result<(String, String, Vec<String>)> {
    let Some((token, rest)) = spec.split_once('=') else {
        bail!("--token {spec:?}: expected TOKEN=USER[:GROUP,...]");
    };
    if token.is_empty() || rest.is_empty() {
        bail!("--token {spec:?}: empty token or user");
    }
    let (user, groups) = if let Some(sa) = rest.strip_prefix("system:serviceaccount:") {
        let parts: Vec<&str> = sa.splitn(3, ':').collect();
        match parts.as_slice() {
            [ns, name] => (format!("system:serviceaccount:{ns}:{name}"), ""),
            [ns, name, groups] => (format!("system:serviceaccount:{ns}:{name}"), *groups),
            _ => bail!("--token {spec:?}: expected system:serviceaccount:NS:NAME"),
        }
    } else {
        match rest.split_once(':') {
            Some((user, groups)) => (user.to_string(), groups),
            None => (rest.to_string(), ""),
        }
    };
    let groups = groups
        .split(',')
        .filter(|g| !g.is_empty())
        .map(String::from)
        .collect();
    Ok((token.to_string(), user, groups))
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()),
        )
        .init();
    let args = Args::parse();
    let tokens = args
        .tokens
        .iter()
        .map(|t| parse_token(t))
        .collect::<anyhow::Result<Vec<_>>>()?;
    let api = ApiServer::new(ApiServerConfig {
        rbac_dir: args.rbac_dir.clone(),
        tokens,
        history: args.history,
        bookmark_interval: Duration::from_secs(args.bookmark_interval_secs),
        drop_fields: args.drop_fields.clone(),
        validate: args.validate,
        version_minor: args.version_minor,
        audit_file: args.audit_file.clone(),
    })
    .context("starting the API double")?;

    let mut tasks = Vec::new();
    for addr in &args.listen {
        let listener = tokio::net::TcpListener::bind(addr)
            .await
            .with_context(|| format!("binding {addr}"))?;
        tasks.push(api.spawn(listener));
    }
    if let (Some(path), Some(token), Some(server)) = (
        &args.kubeconfig_out,
        &args.kubeconfig_token,
        &args.kubeconfig_server,
    ) {
        kubeconfig::write(path, server, token).context("writing the kubeconfig")?;
        info!(path = %path.display(), %server, "wrote kubeconfig");
    }
    info!(listeners = args.listen.len(), "API double ready");

    tokio::select! {
        _ = tokio::signal::ctrl_c() => {
            info!("interrupted; exiting");
            Ok(())
        }
        (res, _, _) = futures::future::select_all(tasks) => {
            match res {
                Ok(Ok(())) => Ok(()),
                Ok(Err(e)) => {
                    error!(error = %e, "listener failed");
                    Err(e.into())
                }
                Err(e) => Err(e.into()),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::parse_token;

    #[test]
    fn token_specs() {
        assert_eq!(
            parse_token("t=admin:system:masters").unwrap(),
            (
                "t".into(),
                "admin".into(),
                vec!["system:masters".to_string()]
            )
        );
        assert_eq!(
            parse_token("t=system:serviceaccount:nodelb-system:nodelb").unwrap(),
            (
                "t".into(),
                "system:serviceaccount:nodelb-system:nodelb".into(),
                vec![]
            )
        );
        assert_eq!(
            parse_token("t=alice:a,b").unwrap().2,
            vec!["a".to_string(), "b".to_string()]
        );
        assert!(parse_token("nouser").is_err());
    }
}
