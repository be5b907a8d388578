//! `run`: the agent. Watches feed caches, rtnetlink feeds local addresses, sock_diag the
//! host's listeners, nftables events report foreign changes, a timer asks for the periodic
//! resync; all of them wake one sync loop (see `sync`), which plans and has the kernel actor
//! (see `kernel`), the one owner of nodelb's netfilter state, commit and verify. HTTP serves
//! health, readiness and metrics. SIGTERM/SIGINT stop the agent and leave its rules in place.

pub mod decisions;
pub mod http;
pub mod kernel;
pub mod listeners;
pub mod logging;
pub mod malloc;
mod record;
pub mod scrape_auth;
pub mod startup;
pub mod sync;
pub mod verify;

use crate::health_check::HealthCheckNodePorts;
use crate::host::addresses;
use crate::host::sysctl::{Forwarding, Sysctls};
use crate::kube::{election, heartbeat, inbox, node_events, status_writer, watches};
use crate::metrics;
use anyhow::Context;
use nodelb_core::plan::config::Config;
use nodelb_core::vocab::IpFamily;
use nodelb_netfilter::{WatchEvent, Watcher};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::{mpsc, watch};
use tracing::{error, info, warn};

/// Why the sync loop should run.
#[derive(Debug)]
pub enum Trigger {
    /// A Service or EndpointSlice event, and when its watch task received it.
    Object(inbox::ObjectEvent, std::time::Instant),
    /// The Node or a local address changed.
    Changed,
    /// The Node watch (or ServiceLB's) ended a list: the one named, once committed, is caught
    /// up (see `watching::relisting`).
    Relisted(&'static str),
    /// Another process changed nodelb's tables (or change events were lost), or the kernel
    /// actor lost track of them.
    Drift(String),
    /// The periodic resync is due.
    Resync,
    /// The kernel actor verified the tables.
    Verified(kernel::Verified),
    /// This agent started or stopped leading (the status writer wants the objects, or not).
    Leading,
}

/// Made by the watch task as it receives the event: the time is the agent's receipt.
impl From<inbox::ObjectEvent> for Trigger {
    fn from(e: inbox::ObjectEvent) -> Trigger {
        Trigger::Object(e, std::time::Instant::now())
    }
}

impl From<watches::NodeChanged> for Trigger {
    fn from(c: watches::NodeChanged) -> Trigger {
        c.relisted.map_or(Trigger::Changed, Trigger::Relisted)
    }
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

/// What the agent runs with: the `run` flags, resolved (the CLI builds it).
#[derive(Clone, Debug)]
pub struct Settings {
    /// `None`: `$KUBECONFIG`, `~/.kube/config`, else in-cluster.
    pub kubeconfig: Option<std::path::PathBuf>,
    pub node_name: String,
    /// The agent's Pod: the holder of its Leases and the `reportingInstance` of its Events.
    pub pod_name: String,
    /// Set when the Pod's name was given (Node Events name the instance only then).
    pub pod_name_given: bool,
    /// Where the Leases live.
    pub namespace: String,
    pub config: nodelb_core::plan::config::Config,
    pub set_sysctls: bool,
    /// `--masquerade-bit` was given (accepted, not used).
    pub masquerade_bit: bool,
    /// `ipMode` for `status.loadBalancer.ingress`: `Proxy` or `VIP`.
    pub ip_mode: String,
    pub sync_debounce: Duration,
    pub resync_interval: Duration,
    pub node_lease_duration: Duration,
    /// `--health-check-node-ports`.
    pub health_check_node_ports: bool,
    pub election: nodelb_core::status::election::Params,
    /// `--max-change-wait`, `--max-view-age`, `--max-kernel-wait`.
    pub readiness: nodelb_core::readiness::Bounds,
    pub health_addr: std::net::SocketAddr,
    pub metrics_addr: std::net::SocketAddr,
}

/// The agent, until SIGTERM/SIGINT.
pub async fn run(settings: Settings) -> anyhow::Result<()> {
    let mut startup = startup::Startup::new(std::time::Instant::now());
    let config = settings.config.clone();
    let (metrics, readiness, sysctls, http) = start(&settings).await?;
    let (inputs, client) = crate::kube::clients(settings.kubeconfig.as_deref(), &readiness).await?;
    http.scrape_client.send_replace(Some(client.clone()));
    startup.client_ready();
    let (tx, rx) = mpsc::unbounded_channel();
    let (caches, _watches) = watches::Caches::start(
        &inputs,
        &settings.node_name,
        config.servicelb.enabled(),
        tx.clone(),
        metrics.clone(),
        readiness.clone(),
    );
    let addrs = addresses::watch(settings.resync_interval)
        .await
        .context("following the host's addresses over rtnetlink")?;
    let (report_tx, report_rx) = watch::channel(None);
    let (objects_tx, objects_rx) = watch::channel(None);
    let (leading_tx, leading_rx) = watch::channel(false);
    let (listeners, watch_pause) =
        wake_sources(&settings, &addrs.rx, &leading_rx, &metrics, tx.clone());
    let kernel = kernel::Kernel::spawn(config.clone(), watch_pause, tx, readiness.kernel())
        .context("starting the kernel actor's thread")?;
    let ctx = sync::Context {
        node_name: settings.node_name.clone(),
        config,
        debounce: settings.sync_debounce,
        sources: sync::Sources {
            caches,
            addresses: addrs.rx.clone(),
            listeners,
            sysctls,
        },
        outputs: record::Outputs {
            metrics: metrics.clone(),
            readiness: readiness.clone(),
            report: report_tx,
            objects: objects_tx,
            leading: leading_rx.clone(),
            health_checks: settings
                .health_check_node_ports
                .then(|| HealthCheckNodePorts::start(settings.config.families())),
            unhealthy_after: settings.node_lease_duration,
        },
        kernel,
    };
    let node_events = node_events::NodeEvents::new(
        Some(client.clone()),
        &settings.node_name,
        settings.pod_name_given.then(|| settings.pod_name.clone()),
    );
    let sync = sync::SyncLoop::new(ctx, node_events, startup);
    let (stop_tx, stop_rx) = watch::channel(false);
    let status = StatusTasks::spawn(
        &settings,
        client,
        (report_rx, readiness),
        objects_rx,
        (leading_tx, leading_rx),
        metrics,
        stop_rx.clone(),
    );
    let mut sync_task = tokio::spawn(sync.run(rx, stop_rx));
    tokio::select! {
        _ = shutdown_signal() => {
            let _ = stop_tx.send(true);
            let _ = (&mut sync_task).await;
            status.stopped().await;
        }
        r = &mut sync_task => {
            r.context("the sync loop panicked")?;
            anyhow::bail!("the sync loop stopped");
        }
    }
    info!("stopped; nodelb's rules stay in the kernel");
    Ok(())
}

/// Say what the agent runs with, turn forwarding on when asked, and serve health, readiness
/// and metrics.
async fn start(
    settings: &Settings,
) -> anyhow::Result<(
    Arc<metrics::Metrics>,
    crate::readiness::Readiness,
    Sysctls,
    http::Served,
)> {
    let config = &settings.config;
    info!(node = %settings.node_name, ipv4 = config.ipv4, ipv6 = config.ipv6,
          lb_class = %config.lb_class, default_class = config.default_class,
          reserved_ports = %config.reserved_ports, addresses = %config.addresses,
          servicelb_compat = config.servicelb.enabled(), "nodelb-agent starting");
    if settings.masquerade_bit {
        info!("--masquerade-bit is accepted for compatibility and not used: masquerading follows conntrack state");
    }
    let metrics = new_metrics(config);
    let readiness = crate::readiness::Readiness::new(settings.readiness);
    let sysctls = Sysctls::default();
    if settings.set_sysctls {
        set_forwarding(&sysctls, config);
    }
    let http = http::serve(
        settings.health_addr,
        settings.metrics_addr,
        readiness.clone(),
        metrics.clone(),
    )
    .await?;
    Ok((metrics, readiness, sysctls, http))
}

/// The agent's metrics, with the per-Service counters read from its tables.
fn new_metrics(config: &Config) -> Arc<metrics::Metrics> {
    Arc::new(metrics::Metrics::with_counters(Box::new(
        metrics::KernelCounters {
            config: config.clone(),
            families: config.families(),
        },
    )))
}

/// `--set-sysctls`: turn forwarding on for the enabled families.
fn set_forwarding(sysctls: &Sysctls, config: &Config) {
    for f in config.families().iter() {
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

/// Start what wakes the sync loop besides the watches: the host's addresses, its listeners
/// (returned, for the sync loop to read them too), leadership, the periodic resync and foreign
/// changes to nodelb's tables (the drift watch's pause handle, returned for the kernel actor).
fn wake_sources(
    settings: &Settings,
    addresses: &watch::Receiver<addresses::Snapshot>,
    leading: &watch::Receiver<bool>,
    metrics: &Arc<metrics::Metrics>,
    tx: mpsc::UnboundedSender<Trigger>,
) -> (listeners::Listeners, Option<nodelb_netfilter::WatchPause>) {
    forward_changes(addresses.clone(), tx.clone(), || Trigger::Changed);
    forward_changes(leading.clone(), tx.clone(), || Trigger::Leading);
    resync_ticks(settings.resync_interval, tx.clone());
    let host_listeners = listeners::Listeners::new(metrics.clone());
    host_listeners.clone().follow(tx.clone());
    (host_listeners, spawn_drift_watch(&settings.config, tx))
}

/// Each change of `rx` wakes the sync loop with `trigger()`.
fn forward_changes<T: Send + Sync + 'static>(
    mut rx: watch::Receiver<T>,
    tx: mpsc::UnboundedSender<Trigger>,
    trigger: fn() -> Trigger,
) {
    tokio::spawn(async move {
        while rx.changed().await.is_ok() {
            if tx.send(trigger()).is_err() {
                return;
            }
        }
    });
}

/// The periodic resync: every `interval` (the first one `interval` from now), until the sync
/// loop is gone.
fn resync_ticks(interval: Duration, tx: mpsc::UnboundedSender<Trigger>) {
    tokio::spawn(async move {
        let mut tick = tokio::time::interval_at(tokio::time::Instant::now() + interval, interval);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            if tx.send(Trigger::Resync).is_err() {
                return;
            }
        }
    });
}

/// The status side of the agent: the election of the status leader, this node's heartbeat,
/// and the status writer (which acts only while leading).
struct StatusTasks {
    election: tokio::task::JoinHandle<()>,
    heartbeat: tokio::task::JoinHandle<()>,
    writer: tokio::task::JoinHandle<()>,
}

impl StatusTasks {
    fn spawn(
        settings: &Settings,
        client: ::kube::Client,
        (report, readiness): (
            watch::Receiver<Option<nodelb_core::status::heartbeat::Report>>,
            crate::readiness::Readiness,
        ),
        objects: watch::Receiver<Option<Arc<nodelb_core::plan::Objects>>>,
        (leading_tx, leading_rx): (watch::Sender<bool>, watch::Receiver<bool>),
        metrics: Arc<metrics::Metrics>,
        stop: watch::Receiver<bool>,
    ) -> StatusTasks {
        let (takeover_tx, takeover_rx) = watch::channel(None);
        let (asked_tx, asked_rx) = watch::channel(None);
        let (ask_tx, ask_rx) = watch::channel(None);
        let links = election::Links {
            leading: leading_tx,
            takeover: takeover_tx,
            asked: asked_tx,
            ask: ask_rx,
        };
        let election = tokio::spawn(election::elect(
            client.clone(),
            settings.namespace.clone(),
            settings.pod_name.clone(),
            settings.election,
            links,
            metrics.clone(),
            stop.clone(),
        ));
        let heartbeat = heartbeat::Heartbeat {
            client: client.clone(),
            namespace: settings.namespace.clone(),
            node: settings.node_name.clone(),
            holder: settings.pod_name.clone(),
            pod_given: settings.pod_name_given,
            readiness,
            lease_duration: settings.node_lease_duration,
            asked: asked_rx,
            metrics: metrics.clone(),
        };
        let heartbeat = tokio::spawn(heartbeat.run(report, stop.clone()));
        let writer = status_writer::StatusWriter {
            client,
            namespace: settings.namespace.clone(),
            pod_name: settings.pod_name.clone(),
            cfg: nodelb_core::status::StatusConfig {
                planner: settings.config.clone(),
                node_lease_duration: settings.node_lease_duration,
                liveness: None,
            },
            ip_mode: settings.ip_mode.clone(),
            period: settings.election.retry_period,
            objects,
            leading: leading_rx,
            takeover: takeover_rx,
            ask: ask_tx,
            metrics,
        };
        let writer = tokio::spawn(writer.run(stop));
        StatusTasks {
            election,
            heartbeat,
            writer,
        }
    }

    /// Wait for the tasks to stop (after the stop signal).
    async fn stopped(self) {
        // The election releases the Lease on its way out, so another agent takes over now.
        let _ = tokio::time::timeout(Duration::from_secs(5), self.election).await;
        let _ = self.heartbeat.await;
        let _ = self.writer.await;
    }
}
