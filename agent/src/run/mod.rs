//! `run`: the agent. Watches feed caches, rtnetlink feeds local addresses, nftables events
//! report foreign changes; all of them wake one sync loop (see `sync`). HTTP serves health,
//! readiness and metrics. SIGTERM/SIGINT stop the agent and leave its rules in place.

pub mod caches;
pub mod events;
pub mod http;
pub mod inbox;
pub mod leader;
pub mod logging;
pub mod malloc;
pub mod metrics;
pub mod node_events;
pub mod status_writer;
pub mod sync;

use crate::cli::RunArgs;
use crate::host::addresses;
use crate::host::sysctl::{Forwarding, Sysctls};
use crate::plan::config::Config;
use crate::vocab::IpFamily;
use anyhow::Context;
use nodelb_netfilter::{WatchEvent, Watcher};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::{mpsc, watch};
use tracing::{error, info, warn};

/// Why the sync loop should run.
#[derive(Debug)]
pub enum Trigger {
    /// A Service or EndpointSlice event.
    Object(inbox::ObjectEvent),
    /// The Node or a local address changed.
    Changed,
    /// Another process changed nodelb's tables (or change events were lost).
    Drift(String),
}

/// The kube client: `--kubeconfig`, else `$KUBECONFIG` / `~/.kube/config`, else in-cluster.
pub async fn kube_client(kubeconfig: Option<&std::path::Path>) -> anyhow::Result<kube::Client> {
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

/// Watch nftables events for foreign changes to nodelb's tables on a thread of its own (the
/// watcher blocks); each becomes a [`Trigger::Drift`]. Ends when the receiver is gone. Returns
/// the handle that pauses the watch around the agent's own full replaces.
fn spawn_drift_watch(
    config: &Config,
    tx: mpsc::UnboundedSender<Trigger>,
) -> Option<nodelb_netfilter::WatchPause> {
    let (pause_tx, pause_rx) = std::sync::mpsc::sync_channel(1);
    let tables = vec![
        config.table_ref(IpFamily::V4),
        config.table_ref(IpFamily::V6),
    ];
    let spawned = std::thread::Builder::new()
        .name("nodelb-nft-watch".into())
        .spawn(move || {
            let mut watcher = match Watcher::open(tables) {
                Ok(w) => w,
                Err(e) => {
                    warn!(error = %e, "cannot watch nftables events; drift is found by the periodic resync only");
                    let _ = pause_tx.send(None);
                    return;
                }
            };
            let pause = watcher
                .pause_handle()
                .map_err(|e| warn!(error = %e, "the nftables event watch cannot be paused; it hears the agent's full replaces too"))
                .ok();
            let _ = pause_tx.send(pause);
            while !tx.is_closed() {
                let why = match watcher.next(Duration::from_secs(1)) {
                    Ok(None) => continue,
                    Ok(Some(WatchEvent::Foreign(c))) => {
                        warn!(tables = ?c.tables.iter().map(|t| t.to_string()).collect::<Vec<_>>(),
                              pid = ?c.pid, process = ?c.process, events = ?c.events,
                              "another process changed nodelb's tables");
                        format!(
                            "{} by {}",
                            c.events.first().cloned().unwrap_or_default(),
                            c.process.unwrap_or_else(|| "another process".into())
                        )
                    }
                    Ok(Some(WatchEvent::Overrun)) => "nftables events were lost".to_string(),
                    Err(e) => {
                        error!(error = %e, "nftables event watch failed; drift is found by the periodic resync only");
                        return;
                    }
                };
                if tx.send(Trigger::Drift(why)).is_err() {
                    return;
                }
            }
        });
    if let Err(e) = spawned {
        warn!(error = %e, "cannot start the nftables event thread");
        return None;
    }
    pause_rx.recv().ok().flatten()
}

/// Resolves on SIGTERM or SIGINT.
async fn shutdown_signal() {
    let mut term = match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
        Ok(s) => s,
        Err(e) => {
            warn!(error = %e, "cannot handle SIGTERM");
            let _ = tokio::signal::ctrl_c().await;
            return;
        }
    };
    tokio::select! {
        _ = term.recv() => info!("SIGTERM"),
        _ = tokio::signal::ctrl_c() => info!("SIGINT"),
    }
}

/// The agent, until SIGTERM/SIGINT.
pub async fn run(args: RunArgs) -> anyhow::Result<()> {
    let config = args.config();
    info!(node = %args.node_name, ipv4 = config.ipv4, ipv6 = config.ipv6,
          lb_class = %config.lb_class, default_class = config.default_class,
          reserved_ports = %config.reserved_ports, "nodelb-agent starting");
    if args.masquerade_bit.is_some() {
        info!("--masquerade-bit is accepted for compatibility and not used: masquerading follows conntrack state");
    }
    let metrics = Arc::new(metrics::Metrics::with_counters(Box::new(
        metrics::KernelCounters {
            config: config.clone(),
            families: crate::vocab::Families {
                v4: config.ipv4,
                v6: config.ipv6,
            },
        },
    )));
    let readiness: http::SharedReadiness = Default::default();
    let sysctls = Sysctls::default();

    if args.set_sysctls {
        for f in [IpFamily::V4, IpFamily::V6] {
            let on = if f == IpFamily::V4 {
                config.ipv4
            } else {
                config.ipv6
            };
            if !on {
                continue;
            }
            match sysctls.enable_forwarding(f) {
                Ok((Forwarding::Forwarding, warnings)) => {
                    info!(family = %f, "forwarding on");
                    for w in warnings {
                        warn!("{w}");
                    }
                }
                Ok((state, _)) => warn!(family = %f, state = %state, "cannot turn forwarding on"),
                Err(e) => error!(family = %f, error = %e, "cannot set the forwarding sysctl"),
            }
        }
    }

    let _http = http::serve(
        args.health_addr,
        args.metrics_addr,
        readiness.clone(),
        metrics.clone(),
    )
    .await?;

    let client = kube_client(args.kubeconfig.as_deref()).await?;
    let (tx, rx) = mpsc::unbounded_channel();
    let (caches, _watches) =
        caches::Caches::start(&client, &args.node_name, tx.clone(), metrics.clone());

    let addrs = addresses::watch(args.resync_interval)
        .await
        .context("following the host's addresses over rtnetlink")?;
    {
        let mut rx_addr = addrs.rx.clone();
        let tx = tx.clone();
        tokio::spawn(async move {
            while rx_addr.changed().await.is_ok() {
                if tx.send(Trigger::Changed).is_err() {
                    return;
                }
            }
        });
    }
    let watch_pause = spawn_drift_watch(&config, tx.clone());
    drop(tx);

    let node_events =
        node_events::NodeEvents::new(Some(client.clone()), &args.node_name, args.pod_name.clone());
    let pod_name = args
        .pod_name
        .clone()
        .unwrap_or_else(|| format!("nodelb-agent-{}", args.node_name));
    let namespace = args
        .pod_namespace
        .clone()
        .unwrap_or_else(|| "nodelb-system".to_string());
    let (families_tx, families_rx) = watch::channel(None);
    let (objects_tx, objects_rx) = watch::channel(None);
    let (leading_tx, leading_rx) = watch::channel(false);
    let status_cfg = crate::status::StatusConfig {
        planner: config.clone(),
        node_lease_duration: args.node_lease_duration,
    };
    let sync = sync::SyncLoop::new(
        caches,
        addrs.rx.clone(),
        args.node_name.clone(),
        config,
        sysctls,
        metrics.clone(),
        readiness,
        node_events,
        args.sync_debounce,
        args.resync_interval,
    )
    .with_status(families_tx, objects_tx, leading_rx.clone())
    .with_watch_pause(watch_pause);
    let (stop_tx, stop_rx) = watch::channel(false);
    let election = tokio::spawn(leader::elect(
        client.clone(),
        namespace.clone(),
        pod_name.clone(),
        crate::status::election::Params {
            lease_duration: args.lease_duration,
            renew_deadline: args.renew_deadline,
            retry_period: args.retry_period,
        },
        leading_tx,
        metrics.clone(),
        stop_rx.clone(),
    ));
    let heartbeat = tokio::spawn(leader::heartbeat(
        client.clone(),
        namespace.clone(),
        args.node_name.clone(),
        pod_name.clone(),
        (args.node_lease_duration / 3).max(std::time::Duration::from_secs(1)),
        families_rx,
        metrics.clone(),
        stop_rx.clone(),
    ));
    let writer = status_writer::StatusWriter {
        client: client.clone(),
        namespace,
        pod_name,
        cfg: status_cfg,
        ip_mode: match args.ip_mode {
            crate::cli::IpMode::Proxy => "Proxy".into(),
            crate::cli::IpMode::Vip => "VIP".into(),
        },
        period: args.retry_period,
        objects: objects_rx,
        leading: leading_rx,
        metrics: metrics.clone(),
    };
    let writer = tokio::spawn(writer.run(stop_rx.clone()));
    let mut sync_task = tokio::spawn(sync.run(rx, stop_rx));
    tokio::select! {
        _ = shutdown_signal() => {
            let _ = stop_tx.send(true);
            let _ = (&mut sync_task).await;
            // The election releases the Lease on its way out, so another agent takes over now.
            let _ = tokio::time::timeout(std::time::Duration::from_secs(5), election).await;
            let _ = heartbeat.await;
            let _ = writer.await;
        }
        r = &mut sync_task => {
            r.context("the sync loop panicked")?;
            anyhow::bail!("the sync loop stopped");
        }
    }
    info!("stopped; nodelb's rules stay in the kernel");
    Ok(())
}
