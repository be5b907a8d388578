//! The one sync loop: woken by watch changes, address changes, drift and a periodic resync;
//! debounced; hands the Services that changed to the planner, which replans only those, and
//! commits — a full replace first (only once every watch has listed), after failures, after
//! drift and when node-wide input changed, and otherwise an edit of just what changed. A
//! Service change only a status write could have made (the leader's writes, echoed by the
//! watch) is no change for the planner: it wakes no sync, and only reaches the status writer.
//! The periodic resync reads the tables back off the loop (`resync`), so changes keep being
//! committed meanwhile. The commit is one call to the committer, which
//! holds the only committed model: a full replace has the planner build the tables inside it,
//! once for the batch (consumed while encoded) and once more afterwards for the model, so the
//! agent never holds two copies of its tables, nor a whole table and its whole batch.
//!
//! After a commit, in the same sync, the conntrack entries the committed change made stale
//! (UDP and SCTP flows to endpoints that left, flows made before a port had its endpoints) are
//! deleted; a cleanup that fails is logged, counted and tried again after the next commit,
//! and never fails the sync.

use super::decisions::{
    decide_families, programmed_counts, Backoff, FamilyDecision, Pacer, Programmed, ReadbackJudge,
    ResyncVerdict, WarningLog,
};
use super::http::SharedReadiness;
use super::resync::{self, Readback};
use super::Trigger;
use crate::host::addresses::Snapshot;
use crate::host::conntrack::{self as ct, Cleaned};
use crate::host::forward_policy;
use crate::host::sysctl::{Forwarding, Sysctls};
use crate::kube::inbox::Inbox;
use crate::kube::node_events::{NodeEvents, NodeProblem};
use crate::kube::watches::{valid, Caches};
use crate::metrics::Metrics;
use nodelb_core::plan::config::Config;
use nodelb_core::plan::conflicts::Slot;
use nodelb_core::plan::diagnosis::{ObjectKind, ObjectRef, Warning};
use nodelb_core::plan::flows::FlowChange;
use nodelb_core::plan::listeners::HostListeners;
use nodelb_core::plan::node::NodeInfo;
use nodelb_core::plan::{Context, Planner, TableChange};
use nodelb_core::status::heartbeat::{BlockedPorts, Report};
use nodelb_core::vocab::{Families, IpFamily};
use nodelb_netfilter::conntrack::Conntrack;
use nodelb_netfilter::{Commit, CommitStats, Committed, Committer, Edit, Nft, Table, TableRef};
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::{mpsc, watch};
use tracing::{debug, error, info, info_span, warn, Instrument};

pub struct SyncLoop {
    pub caches: Caches,
    pub addresses: watch::Receiver<Snapshot>,
    pub node_name: String,
    pub config: Config,
    pub sysctls: Sysctls,
    pub metrics: Arc<Metrics>,
    pub readiness: SharedReadiness,
    pub node_events: NodeEvents,
    pub debounce: Duration,
    pub resync: Duration,
    committer: Option<Committer>,
    replace_next: bool,
    inbox: Inbox,
    planner: Planner,
    /// How the UDP and SCTP ports' endpoints changed since the last conntrack cleanup: what
    /// the next commit's cleanup deletes.
    flows: FlowChange,
    /// The ctnetlink socket, once opened (dropped after a failure).
    conntrack: Option<Conntrack>,
    notes: Vec<String>,
    /// For the heartbeat: the families committed by the last successful sync, and the Service
    /// ports host listeners hold.
    report_tx: Option<watch::Sender<Option<Report>>>,
    /// The host's listeners, read at the start of each sync (none: not followed).
    listeners: Option<super::listeners::Listeners>,
    /// The ports host listeners hold, as the heartbeat reports them.
    blocked: BlockedPorts,
    /// The Service ports host listeners held at the last sync, with their processes.
    held: BTreeMap<Slot, Option<String>>,
    /// For the status writer, while leading: the objects after each sync.
    objects_tx: Option<watch::Sender<Option<Arc<nodelb_core::plan::Objects>>>>,
    leading: Option<watch::Receiver<bool>>,
    warnings: WarningLog,
    backoff: Backoff,
    /// Pauses the drift watch around a full replace: the agent need not hear its own
    /// (an event per object of the tables, built by the kernel during the commit).
    watch_pause: Option<Arc<nodelb_netfilter::WatchPause>>,
    /// Commits that sent something, counted: a resync's read-back knows whether the loop
    /// committed while it read.
    commits: u64,
    judge: ReadbackJudge,
}

#[derive(Debug, thiserror::Error)]
enum SyncError {
    #[error(transparent)]
    Netfilter(#[from] nodelb_netfilter::Error),
    #[error("the commit task panicked")]
    Panicked,
}

/// Why the loop woke.
#[derive(Debug, Default, Clone)]
struct Wake {
    drift: Option<String>,
    /// Check the tables against the models with commits held (see `ReadbackJudge`).
    resync: bool,
    /// A sync is due: something the planner reads changed, the last sync failed, or the
    /// resync tick asks to read again what sends no event (the forwarding sysctls).
    sync: bool,
    /// The objects changed, perhaps only for the status writer.
    objects: bool,
    /// When the watch task received the first event this sync takes.
    first_event: Option<Instant>,
}

impl Wake {
    fn needs_sync(&self) -> bool {
        self.sync || self.resync || self.drift.is_some()
    }
}

impl SyncLoop {
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        caches: Caches,
        addresses: watch::Receiver<Snapshot>,
        node_name: String,
        config: Config,
        sysctls: Sysctls,
        metrics: Arc<Metrics>,
        readiness: SharedReadiness,
        node_events: NodeEvents,
        debounce: Duration,
        resync: Duration,
    ) -> SyncLoop {
        SyncLoop {
            caches,
            addresses,
            node_name,
            config,
            sysctls,
            metrics,
            readiness,
            node_events,
            debounce,
            resync,
            committer: None,
            replace_next: true,
            inbox: Inbox::default(),
            planner: Planner::new(),
            flows: FlowChange::default(),
            conntrack: None,
            notes: Vec::new(),
            report_tx: None,
            listeners: None,
            blocked: BlockedPorts::default(),
            held: BTreeMap::new(),
            objects_tx: None,
            leading: None,
            warnings: WarningLog::default(),
            backoff: Backoff::default(),
            watch_pause: None,
            commits: 0,
            judge: ReadbackJudge::default(),
        }
    }

    /// Run until `stop` turns true. The first sync waits for every cache.
    pub async fn run(
        mut self,
        mut triggers: mpsc::UnboundedReceiver<Trigger>,
        mut stop: watch::Receiver<bool>,
    ) {
        tokio::select! {
            r = self.caches.ready() => if r.is_err() { error!("a watch stopped before it synced"); return; },
            _ = stop.wait_for(|s| *s) => return,
        }
        // The first sync replaces the tables whole: it waits until every watch has listed, so
        // a restart never programs a partial view (rules from before stay meanwhile).
        let mut wake = Wake::default();
        while !self.inbox.synced() {
            tokio::select! {
                _ = stop.wait_for(|s| *s) => return,
                t = triggers.recv() => match t {
                    Some(t) => self.take(t, &mut wake),
                    None => return,
                },
            }
        }
        self.readiness.lock().expect("readiness").caches_synced = true;
        // The first sync takes the whole listing: not a change's way to the kernel.
        wake.first_event = None;
        info!(
            services = self.inbox.objects().service_count(),
            endpointslices = self.inbox.objects().slice_count(),
            "watches listed"
        );
        let mut tick = tokio::time::interval(self.resync);
        tick.reset();
        // Becoming leader hands the status writer its first objects.
        let mut leading = self.leading.clone();
        let mut pacer = Pacer::new(self.debounce);
        let mut readback: Option<tokio::task::JoinHandle<Readback>> = None;
        wake.sync = true;
        loop {
            let delay = self.act(std::mem::take(&mut wake), &mut pacer).await;
            // Wait for a reason to sync again (after a failure: for the backoff delay, then
            // try again).
            wake.sync = delay.is_some();
            let mut read = None;
            tokio::select! {
                _ = stop.wait_for(|s| *s) => break,
                _ = async { tokio::time::sleep(delay.unwrap_or_default()).await }, if delay.is_some() => {}
                t = triggers.recv(), if delay.is_none() => match t {
                    Some(t) => self.take(t, &mut wake),
                    None => break,
                },
                _ = tick.tick(), if delay.is_none() => {
                    // A sync re-reads the inputs that send no event (a sysctl); the tables
                    // are read back beside the loop.
                    wake.sync = true;
                    self.start_resync(&mut readback);
                }
                r = async { readback.as_mut().expect("a read-back in flight").await }, if readback.is_some() => read = Some(r),
                _ = async {
                    let closed = match leading.as_mut() {
                        Some(l) => l.changed().await.is_err(),
                        None => true,
                    };
                    if closed {
                        std::future::pending::<()>().await
                    }
                }, if delay.is_none() => wake.objects = true,
            }
            if let Some(r) = read {
                readback = None;
                self.judge_readback(r, &mut wake, &mut readback).await;
            }
            // Sync at once after an idle spell; right after a sync, let the burst arrive.
            let wait = pacer.wait(Instant::now());
            if !wait.is_zero() {
                tokio::select! {
                    _ = stop.wait_for(|s| *s) => break,
                    _ = tokio::time::sleep(wait) => {}
                }
            }
            while let Ok(t) = triggers.try_recv() {
                self.take(t, &mut wake);
            }
        }
        info!("sync loop stopped; nodelb's rules stay in place");
    }

    /// The drift watch's pause handle, if it runs.
    pub fn with_watch_pause(mut self, pause: Option<nodelb_netfilter::WatchPause>) -> SyncLoop {
        self.watch_pause = pause.map(Arc::new);
        self
    }

    /// Follow the host's listeners: a Service never takes a port one of them holds.
    pub fn with_listeners(mut self, listeners: super::listeners::Listeners) -> SyncLoop {
        self.listeners = Some(listeners);
        self
    }

    /// Channels to the heartbeat and the status writer.
    pub fn with_status(
        mut self,
        report_tx: watch::Sender<Option<Report>>,
        objects_tx: watch::Sender<Option<Arc<nodelb_core::plan::Objects>>>,
        leading: watch::Receiver<bool>,
    ) -> SyncLoop {
        self.report_tx = Some(report_tx);
        self.objects_tx = Some(objects_tx);
        self.leading = Some(leading);
        self
    }

    fn take(&mut self, t: Trigger, wake: &mut Wake) {
        match t {
            Trigger::Object(ev, received) => {
                wake.objects = true;
                if self.inbox.apply(ev) {
                    wake.sync = true;
                    wake.first_event.get_or_insert(received);
                }
            }
            Trigger::Changed => wake.sync = true,
            Trigger::Drift(why) => wake.drift = Some(why),
        }
    }

    /// Sync when one is due (see `Wake::sync`), or drift or a held resync asks for it;
    /// otherwise only hand the status writer the objects. Returns the backoff delay after a
    /// failed sync.
    async fn act(&mut self, wake: Wake, pacer: &mut Pacer) -> Option<Duration> {
        if !wake.needs_sync() {
            if wake.objects {
                // Status writes only: the planner keeps the new objects instead of holding
                // every Service those writes replaced until the next sync.
                self.planner.follow(self.inbox.objects());
                self.publish_objects();
            }
            return None;
        }
        let ok = self.sync_once(wake).instrument(info_span!("sync")).await;
        pacer.synced(Instant::now());
        if ok {
            self.backoff.reset();
            None
        } else {
            Some(self.backoff.next_delay())
        }
    }

    /// The resync tick: read the tables back off the loop, unless a read is still going or
    /// the next sync replaces the tables whole anyway.
    fn start_resync(&self, readback: &mut Option<tokio::task::JoinHandle<Readback>>) {
        if readback.is_some() || self.replace_next {
            return;
        }
        if let Some(c) = &self.committer {
            *readback = Some(resync::start(
                c.committed_tables(),
                self.config.table_name.clone(),
                self.commits,
            ));
        }
    }

    /// Compare a finished read-back with the models as committed now, and act on the verdict:
    /// count it, repair drift, read again, or hold commits for one more check.
    async fn judge_readback(
        &mut self,
        r: Result<Readback, tokio::task::JoinError>,
        wake: &mut Wake,
        readback: &mut Option<tokio::task::JoinHandle<Readback>>,
    ) {
        let Ok(read) = r else {
            warn!("the resync's read-back panicked; the next resync reads again");
            return;
        };
        // A failure since: the next sync replaces the tables whole anyway.
        let Some(committer) = self.committer.take() else {
            return;
        };
        let tables = read.tables;
        let t0 = Instant::now();
        let compared = tokio::task::spawn_blocking(move || {
            let d = resync::difference(&committer, &tables);
            (committer, d)
        })
        .await;
        let Ok((committer, difference)) = compared else {
            wake.drift = Some("comparing the tables read back panicked".into());
            return;
        };
        self.committer = Some(committer);
        let verdict = self
            .judge
            .judge(difference, self.commits != read.commits_at_start);
        debug!(verdict = ?verdict, read = ?read.took, compare = ?t0.elapsed(),
               "resync read back the tables");
        let result = match verdict {
            ResyncVerdict::Unchanged => "unchanged",
            ResyncVerdict::Drifted(why) => {
                wake.drift = Some(why);
                "repaired"
            }
            ResyncVerdict::ReadAgain => {
                self.start_resync(readback);
                return;
            }
            ResyncVerdict::Hold => {
                wake.resync = true;
                return;
            }
        };
        self.notes = policy_notes(read.forward);
        self.metrics
            .resyncs
            .get_or_create(&crate::metrics::ResultLabel { result })
            .inc();
    }

    /// One sync. Returns whether it committed.
    /// One sync: read the inputs, plan, commit, publish. Returns whether it committed.
    async fn sync_once(&mut self, wake: Wake) -> bool {
        let t0 = Instant::now();
        let mut inputs = self.read_inputs();
        let planned = self.plan(&mut inputs, t0);
        let result = self
            .commit_planned(&wake, planned.change, inputs.families)
            .await;
        let ok = self.record(result, &wake, &planned.summary, t0, &mut inputs.problems);
        if ok {
            self.clean_conntrack().await;
        }
        self.publish(ok, inputs);
        ok
    }

    /// Delete the conntrack entries the changes committed since the last cleanup made stale.
    /// A failure is logged and counted, and the same changes are tried again after the next
    /// commit (composed with what it changes).
    async fn clean_conntrack(&mut self) {
        let stale = self.flows.stale();
        if stale.is_empty() {
            self.flows = FlowChange::default();
            return;
        }
        let socket = self.conntrack.take();
        let r = tokio::task::spawn_blocking(move || {
            let mut socket = match socket {
                Some(s) => s,
                None => Conntrack::open()?,
            };
            let r = ct::delete_stale(&mut socket, &stale);
            r.map(|done| (socket, done))
        })
        .await;
        let result = match r {
            Ok(Ok((socket, done))) => {
                self.conntrack = Some(socket);
                self.flows = FlowChange::default();
                self.record_cleanup(&done);
                "ok"
            }
            Ok(Err(e)) => {
                warn!(error = %crate::error_chain(&e), "deleting stale conntrack entries failed; trying again after the next commit");
                "error"
            }
            Err(_) => {
                warn!("the conntrack cleanup panicked; trying again after the next commit");
                "error"
            }
        };
        self.metrics
            .conntrack_cleanups
            .get_or_create(&crate::metrics::ResultLabel { result })
            .inc();
    }

    fn record_cleanup(&self, done: &[Cleaned]) {
        for c in done {
            let labels = crate::metrics::FlowLabels {
                family: c.family.label(),
                protocol: match c.protocol {
                    nodelb_core::vocab::Protocol::Udp => "UDP",
                    nodelb_core::vocab::Protocol::Sctp => "SCTP",
                    nodelb_core::vocab::Protocol::Tcp => "TCP",
                },
            };
            self.metrics
                .conntrack_deleted
                .get_or_create(&labels)
                .inc_by(c.deleted as u64);
            if c.deleted > 0 {
                info!(family = %c.family, protocol = %c.protocol, deleted = c.deleted,
                      dumped = c.dumped, took = ?c.took, "deleted stale conntrack entries");
            } else {
                debug!(family = %c.family, protocol = %c.protocol, dumped = c.dumped,
                       took = ?c.took, "no stale conntrack entries");
            }
        }
    }

    /// What this sync plans from: the families that can be programmed, this node, its
    /// addresses.
    fn read_inputs(&self) -> Inputs {
        let enabled = Families {
            v4: self.config.ipv4,
            v6: self.config.ipv6,
        };
        let forwarding: Vec<(IpFamily, Result<Forwarding, String>)> = [IpFamily::V4, IpFamily::V6]
            .into_iter()
            .map(|f| (f, self.sysctls.forwarding(f).map_err(|e| e.to_string())))
            .collect();
        let FamilyDecision {
            programmed: families,
            states: family_states,
            problems,
        } = decide_families(enabled, &forwarding);
        let node_obj = valid(&self.caches.node).into_iter().next();
        let node_obj = node_obj.as_ref().and_then(|n| n.0.as_ref().ok());
        let node_uid = node_obj.and_then(|n| n.metadata.uid.clone());
        let (node, node_warnings) = match node_obj {
            Some(n) => NodeInfo::from_node_checked(n),
            None => (
                NodeInfo {
                    name: self.node_name.clone(),
                    ..NodeInfo::default()
                },
                vec![Warning::new(
                    ObjectRef::new(ObjectKind::Node, None, &self.node_name),
                    "Node not found: no addresses to serve on",
                )],
            ),
        };
        let local = self.addresses.borrow().clone();
        // Read now: a sync that adds ports must not take one a process listens on.
        let host = self
            .listeners
            .as_ref()
            .map(|l| l.look(false).0)
            .unwrap_or_default();
        let ctx = Context::new(node, local, families, self.config.clone())
            .with_listeners(HostListeners::new(host));
        // What the heartbeat tells the leader: families with a table and a node address on
        // the host to serve on.
        let serving = Families {
            v4: families.v4 && ctx.served.contains_key(&IpFamily::V4),
            v6: families.v6 && ctx.served.contains_key(&IpFamily::V6),
        };
        Inputs {
            families,
            family_states,
            problems,
            node_uid,
            node_warnings,
            ctx,
            serving,
        }
    }

    /// Bring the plan up to date with the objects changed since the last sync; log new
    /// problems and changed outcomes.
    fn plan(&mut self, inputs: &mut Inputs, t0: Instant) -> Planned {
        let dirty = self.inbox.take_dirty();
        let update = self
            .planner
            .update(self.inbox.objects(), &inputs.ctx, dirty.as_ref());
        let took = t0.elapsed();
        let mut warnings = std::mem::take(&mut inputs.node_warnings);
        warnings.extend(self.planner.warnings().cloned());
        for w in self.warnings.update(&warnings) {
            warn!(kind = %w.object.kind, namespace = w.object.namespace.as_deref().unwrap_or(""),
                  name = %w.object.name, problem = %w.message, "invalid input");
            self.metrics.invalid(w.object.kind, "plan");
        }
        for key in &update.changed {
            match self.planner.outcome(key) {
                Some(o) => info!(service = %key, outcome = %o, "service"),
                None => info!(service = %key, "service no longer handled"),
            }
        }
        let programmed = programmed_counts(self.planner.outcomes());
        self.note_blocked();
        self.flows = std::mem::take(&mut self.flows).then(update.flows);
        Planned {
            change: update.change,
            summary: PlanSummary {
                took,
                replanned: update.replanned,
                programmed,
            },
        }
    }

    /// The ports host listeners hold, for the heartbeat; log the Service ports they took or
    /// gave back since the last sync.
    fn note_blocked(&mut self) {
        let taken = self.planner.taken_ports();
        let held: BTreeMap<Slot, Option<String>> = taken
            .iter()
            .filter(|(_, _, claimed)| *claimed)
            .map(|(slot, l, _)| {
                // A listener the sync's read did not name yet: name it now, for the heartbeat.
                let named = || self.listeners.as_ref()?.process_of(l);
                (*slot, l.process.clone().or_else(named))
            })
            .collect();
        let ephemeral = self.sysctls.ephemeral_ports().ok().flatten();
        let reserved = &self.config.reserved_ports;
        self.blocked = BlockedPorts::report(&taken, &held, reserved, ephemeral.as_ref());
        if held == self.held {
            return;
        }
        for ((family, protocol, port), process) in &held {
            if !self.held.contains_key(&(*family, *protocol, *port)) {
                warn!(%family, %protocol, port, process = process.as_deref().unwrap_or("unknown"),
                      "a process on the node listens on a Service port: no Service gets it here");
            }
        }
        for (family, protocol, port) in self.held.keys() {
            if !held.contains_key(&(*family, *protocol, *port)) {
                info!(%family, %protocol, port, "the host no longer listens on a Service port");
            }
        }
        self.metrics.blocked_ports.set(held.len() as i64);
        self.held = held;
    }

    /// Commit what the plan changed: edits, or a full replace when the tables must be
    /// replaced whole (first sync, drift, a rebuilt plan, a failure before). A periodic resync
    /// reads the tables back: when they are as committed it sends only the plan's edits
    /// (nothing, when nothing changed), so the counters keep counting; anything changed
    /// behind the agent's back that the nftables watch did not report (or a table that cannot
    /// be read back) is drift, repaired by a full replace.
    async fn commit_planned(
        &mut self,
        wake: &Wake,
        change: TableChange,
        families: Families,
    ) -> Result<(usize, CommitStats, Option<String>), SyncError> {
        if wake.drift.is_some() {
            self.replace_next = true;
        }
        let resync_drift = if wake.resync && !self.replace_next {
            let drift = self.check_drift().await;
            let result = if drift.is_some() {
                "repaired"
            } else {
                "unchanged"
            };
            self.metrics
                .resyncs
                .get_or_create(&crate::metrics::ResultLabel { result })
                .inc();
            drift
        } else {
            None
        };
        let whole =
            self.replace_next || resync_drift.is_some() || matches!(change, TableChange::Rebuild);
        let work = match change {
            TableChange::Edit(edits) if !whole => Work::Edit(edits),
            _ => Work::Replace,
        };
        let result = self
            .commit(work, families)
            .await
            .map(|(objects, stats)| (objects, stats, resync_drift));
        if whole || wake.resync {
            // Foreign forward policies: read on whole syncs and held resyncs (a dump of every
            // chain); other resyncs read them off the loop.
            self.notes = policy_notes(forward_policy::drop_chains(&self.config.table_name));
        }
        if whole {
            // The old tables and the batch are freed: return their pages.
            super::malloc::trim();
        }
        result
    }

    /// Metrics, logs and readiness of a sync's outcome.
    fn record(
        &mut self,
        result: Result<(usize, CommitStats, Option<String>), SyncError>,
        wake: &Wake,
        plan: &PlanSummary,
        t0: Instant,
        problems: &mut Vec<NodeProblem>,
    ) -> bool {
        let took = t0.elapsed();
        match result {
            Ok((objects, stats, repaired)) => {
                self.metrics.record_sync(took, true);
                let waited = wake.first_event.map(|first| first.elapsed());
                if let Some(w) = waited {
                    self.metrics.event_to_kernel.observe(w.as_secs_f64());
                }
                self.metrics.sync_objects.set(objects as i64);
                self.metrics.sync_bytes.set(stats.bytes as i64);
                let programmed = &plan.programmed;
                self.metrics
                    .services_programmed
                    .set(programmed.services as i64);
                self.metrics
                    .endpoints_programmed
                    .set(programmed.endpoints as i64);
                self.metrics.set_hints_ignored(&programmed.hints_ignored);
                if let Some(why) = wake.drift.as_ref().or(repaired.as_ref()) {
                    self.metrics.drift_repairs.inc();
                    info!(why = %why, took = ?took, "repaired drift with a full replace");
                }
                debug!(objects, bytes = stats.bytes, encode = ?stats.encode, commit = ?stats.commit,
                       services = programmed.services, endpoints = programmed.endpoints, replanned = plan.replanned,
                       plan = ?plan.took, resync = wake.resync, event_to_kernel = ?waited, took = ?took, "synced");
                true
            }
            Err(e) => {
                self.metrics.record_sync(took, false);
                let text = crate::error_chain(&e);
                error!(error = %text, "sync failed; retrying with a full replace");
                if matches!(e, SyncError::Netfilter(nodelb_netfilter::Error::Open(_))) {
                    problems.push(NodeProblem {
                        reason: "NfTablesUnavailable",
                        note: format!("nodelb cannot use nf_tables: {text}"),
                    });
                }
                let mut r = self.readiness.lock().expect("readiness");
                r.last_error = Some(text);
                false
            }
        }
    }

    /// Tell the rest of the agent: the heartbeat (families served), the status writer (the
    /// objects, while leading), readiness, and Node Events for node problems.
    fn publish(&mut self, ok: bool, inputs: Inputs) {
        if ok {
            if let Some(tx) = &self.report_tx {
                let report = Report {
                    families: inputs.serving,
                    blocked: self.blocked.clone(),
                    unhealthy: None,
                };
                tx.send_if_modified(|r| r.replace(report.clone()).as_ref() != Some(&report));
            }
        }
        self.publish_objects();
        {
            let mut r = self.readiness.lock().expect("readiness");
            r.last_sync_committed = ok;
            if ok {
                r.last_error = None;
            }
            r.families = inputs.family_states;
            r.notes = self.notes.clone();
        }
        for p in self.node_events.update(inputs.problems, inputs.node_uid) {
            warn!(reason = p.reason, problem = %p.note, "node problem");
        }
    }

    /// The status writer gets the objects as they are now, while leading (and none
    /// otherwise, so changes are not copied).
    fn publish_objects(&self) {
        if let (Some(tx), Some(leading)) = (&self.objects_tx, &self.leading) {
            if *leading.borrow() {
                tx.send_replace(Some(self.inbox.snapshot()));
            } else if tx.borrow().is_some() {
                tx.send_replace(None);
            }
        }
    }

    /// A held resync: compare the kernel's tables with the models last committed, with
    /// commits held until done; what differed, if anything. A table that cannot be read back
    /// counts as drifted: the replace that follows repairs it, or reports the trouble with
    /// nf_tables.
    async fn check_drift(&mut self) -> Option<String> {
        let mut committer = self.committer.take()?;
        let r = tokio::task::spawn_blocking(move || {
            let tables = committer.committed_tables();
            let read = resync::read(committer.nft(), tables);
            let found = resync::difference(&committer, &read);
            (committer, found)
        })
        .await;
        match r {
            Ok((committer, found)) => {
                self.committer = Some(committer);
                found
            }
            Err(_) => Some("reading the tables back panicked".into()),
        }
    }

    /// Commit the plan's tables (a full replace) or edits, and delete nodelb's tables of
    /// families not programmed. Returns objects and stats.
    async fn commit(
        &mut self,
        work: Work,
        families: Families,
    ) -> Result<(usize, CommitStats), SyncError> {
        let mut committer = match self.committer.take() {
            Some(c) => c,
            None => Committer::new(Nft::open()?),
        };
        self.replace_next = true;
        let absent: Vec<TableRef> = [IpFamily::V4, IpFamily::V6]
            .into_iter()
            .filter(|f| !families.contains(*f))
            .map(|f| self.config.table_ref(f))
            .collect();
        let watch_pause = self.watch_pause.clone();
        // The planner builds the tables inside the commit, on the blocking thread, and comes
        // back with the committer (a lost planner is a fresh one, which replans everything).
        let planner = std::mem::take(&mut self.planner);
        let r = tokio::task::spawn_blocking(move || {
            let r = commit_blocking(
                &mut committer,
                &planner,
                work,
                absent,
                watch_pause.as_deref(),
            );
            (committer, planner, r)
        })
        .await;
        match r {
            Ok((committer, planner, Ok((objects, done)))) => {
                self.planner = planner;
                if done.stats.messages > 0 {
                    self.commits += 1;
                }
                for tr in &done.deleted {
                    info!(table = %tr, "deleted: family not programmed");
                }
                self.committer = Some(committer);
                self.replace_next = false;
                Ok((objects, done.stats))
            }
            // After a failure the committer is dropped: the next try opens a fresh socket and
            // replaces every table whole.
            Ok((_, planner, Err(e))) => {
                self.planner = planner;
                Err(e.into())
            }
            Err(_) => Err(SyncError::Panicked),
        }
    }
}

/// What `/readyz` notes of the foreign forward policies read.
fn policy_notes(
    read: Result<Vec<forward_policy::DropChain>, forward_policy::Error>,
) -> Vec<String> {
    match read {
        Ok(chains) => chains.iter().map(|c| c.to_string()).collect(),
        Err(e) => vec![format!("foreign forward policies unknown: {e}")],
    }
}

/// What a sync plans from.
struct Inputs {
    families: Families,
    family_states: Vec<(IpFamily, Option<String>)>,
    problems: Vec<NodeProblem>,
    node_uid: Option<String>,
    node_warnings: Vec<Warning>,
    ctx: Context,
    serving: Families,
}

/// What the planner decided this sync.
struct Planned {
    change: TableChange,
    summary: PlanSummary,
}

/// For logs and metrics.
struct PlanSummary {
    /// From the start of the sync to the plan.
    took: Duration,
    replanned: usize,
    programmed: Programmed,
}

/// What a sync sends: the planner's whole tables, or edits of the tables committed before.
enum Work {
    Replace,
    Edit(Vec<(TableRef, Edit)>),
}

/// One commit, on a blocking thread: a replace holds the drift watch's pause, consumes the
/// tables while encoding them (the pages of what is dropped going back as the batch grows),
/// deletes the absent tables, and has the planner build the tables again for the committer
/// once the batch is freed. Returns the objects sent and what the commit did.
fn commit_blocking(
    committer: &mut Committer,
    planner: &Planner,
    work: Work,
    absent: Vec<TableRef>,
    pause: Option<&nodelb_netfilter::WatchPause>,
) -> Result<(usize, Committed), nodelb_netfilter::Error> {
    match work {
        Work::Edit(edits) => {
            let objects = edits.iter().map(|(_, e)| e.size()).sum();
            Ok((objects, committer.commit(Commit::edit(edits))?))
        }
        Work::Replace => {
            let mut objects = None;
            let mut build = || {
                let tables = planner.tables();
                objects.get_or_insert_with(|| tables.iter().map(Table::object_count).sum());
                tables
            };
            let mut trim = super::malloc::trim;
            let done = committer.commit(
                Commit::replace(&mut build)
                    .absent(absent)
                    .pause(pause)
                    .freed(&mut trim),
            )?;
            Ok((objects.unwrap_or_default(), done))
        }
    }
}
