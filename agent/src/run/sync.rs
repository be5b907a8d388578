//! The one sync loop: woken by [`Trigger`]s (watch changes, address and listener changes,
//! drift, the periodic resync, a verify's verdict, leadership); debounced; hands the Services
//! that changed to the planner, which replans only those, and has the kernel actor
//! ([`Kernel`]) commit what changed — a full replace first (only once every watch has listed),
//! after failures, after drift and when node-wide input changed, and otherwise an edit of just
//! what changed. A Service change only a status write could have made (the leader's writes,
//! echoed by the watch) is no change for the planner: it wakes no sync, and only reaches the
//! status writer.
//!
//! As kube-rs controllers are built: the loop holds an immutable [`Context`] (where its inputs
//! come from, where its outcomes go, the kernel actor) and a small [`State`]. A sync reads its
//! inputs, plans, commits through the actor (which also deletes the conntrack entries the
//! commit made stale), and ends in one [`Outputs::record`] of its outcome (see `record`), which
//! also says when to try again after a failure. The periodic resync re-reads what sends no
//! event (the forwarding sysctls) and asks the actor to verify the tables; its verdict comes
//! back as a trigger, and drift is repaired by a full replace.

use super::decisions::{decide_families, programmed_counts, FamilyDecision, Pacer, WarningLog};
use super::kernel::{self, Kernel, PlannerBack};
use super::listeners::Listeners;
use super::record::{NodeReport, Outcome, Outputs, PlanSummary, Told};
use super::startup::{FirstSync, Startup};
use super::Trigger;
use crate::host::addresses::Snapshot;
use crate::host::sysctl::{Forwarding, Sysctls};
use crate::kube::inbox::Inbox;
use crate::kube::node_events::{NodeEvents, NodeProblem};
use crate::kube::watches::{valid, Caches};
use nodelb_core::plan::config::Config;
use nodelb_core::plan::conflicts::Slot;
use nodelb_core::plan::diagnosis::{ObjectKind, ObjectRef, Warning};
use nodelb_core::plan::health::health_checks;
use nodelb_core::plan::listeners::HostListeners;
use nodelb_core::plan::node::NodeInfo;
use nodelb_core::plan::{Planner, Update};
use nodelb_core::status::heartbeat::BlockedPorts;
use nodelb_core::status::published;
use nodelb_core::vocab::{Families, IpFamily};
use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};
use tokio::sync::{mpsc, watch};
use tracing::{error, info, info_span, warn, Instrument};

/// What the loop holds and never changes.
pub struct Context {
    pub node_name: String,
    pub config: Config,
    /// `--sync-debounce`.
    pub debounce: Duration,
    pub sources: Sources,
    pub outputs: Outputs,
    /// The one owner of nodelb's netfilter state.
    pub kernel: Kernel,
}

/// Where a sync reads what is not a Service or an EndpointSlice.
pub struct Sources {
    /// The watch caches: this Node, and whether every watch has listed.
    pub caches: Caches,
    pub addresses: watch::Receiver<Snapshot>,
    /// The host's listeners, read at the start of each sync.
    pub listeners: Listeners,
    pub sysctls: Sysctls,
}

/// What the loop carries from one sync to the next.
pub struct State {
    inbox: Inbox,
    planner: Planner,
    /// The Service ports host listeners held at the last sync, with their processes.
    held: BTreeMap<Slot, Option<String>>,
    warnings: WarningLog,
    pacer: Pacer,
    /// What telling the outcomes keeps (notes, backoff, Node Events).
    told: Told,
    /// The start-up timeline, until the first sync commits.
    startup: Option<Startup>,
    /// The watches whose lists ended in what was taken since the last committed sync:
    /// caught up once one commits (`Readiness::caught_up`).
    relisted: BTreeSet<&'static str>,
}

/// The sync loop: its context and its state.
pub struct SyncLoop {
    ctx: Context,
    state: State,
}

/// Why the loop woke.
#[derive(Debug, Default)]
struct Wake {
    drift: Option<String>,
    /// A sync is due: something the planner reads changed, the last sync failed, or the
    /// resync asks to read again what sends no event (the forwarding sysctls).
    sync: bool,
    /// The objects changed, perhaps only for the status writer.
    objects: bool,
    /// When the watch task received the first event this sync takes.
    first_event: Option<Instant>,
}

impl Wake {
    fn needs_sync(&self) -> bool {
        self.sync || self.drift.is_some()
    }
}

impl SyncLoop {
    pub fn new(ctx: Context, node_events: NodeEvents, startup: Startup) -> SyncLoop {
        let state = State {
            inbox: Inbox::default(),
            planner: Planner::new(),
            held: BTreeMap::new(),
            warnings: WarningLog::default(),
            pacer: Pacer::new(ctx.debounce),
            told: Told::new(node_events),
            startup: Some(startup),
            relisted: BTreeSet::new(),
        };
        SyncLoop { ctx, state }
    }

    /// Run until `stop` turns true. The first sync waits for every cache.
    pub async fn run(
        mut self,
        mut triggers: mpsc::UnboundedReceiver<Trigger>,
        mut stop: watch::Receiver<bool>,
    ) {
        let Some(mut wake) = self.listed(&mut triggers, &mut stop).await else {
            return;
        };
        loop {
            let delay = self
                .act(std::mem::take(&mut wake), || !triggers.is_empty())
                .await;
            // Wait for a reason to sync again (after a failure: for the backoff delay, then
            // try again).
            wake.sync = delay.is_some();
            tokio::select! {
                _ = stop.wait_for(|s| *s) => break,
                _ = tokio::time::sleep(delay.unwrap_or_default()), if delay.is_some() => {}
                t = triggers.recv(), if delay.is_none() => match t {
                    Some(t) => self.take(t, &mut wake),
                    None => break,
                },
            }
            // Sync at once after an idle spell; right after a sync, let the burst arrive.
            let wait = self.state.pacer.wait(Instant::now());
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

    /// Wait until every watch has listed (`None`: stopped first). The first sync replaces the
    /// tables whole, so a restart never programs a partial view (rules from before stay
    /// meanwhile).
    async fn listed(
        &mut self,
        triggers: &mut mpsc::UnboundedReceiver<Trigger>,
        stop: &mut watch::Receiver<bool>,
    ) -> Option<Wake> {
        tokio::select! {
            listed = self.ctx.sources.caches.ready() => if !listed {
                error!("a watch stopped before it synced");
                return None;
            },
            _ = stop.wait_for(|s| *s) => return None,
        }
        if let Some(s) = &mut self.state.startup {
            s.node_listed();
        }
        let mut wake = Wake::default();
        while !self.state.inbox.synced() {
            tokio::select! {
                _ = stop.wait_for(|s| *s) => return None,
                t = triggers.recv() => self.take(t?, &mut wake),
            }
        }
        self.ctx.outputs.readiness.set(|r| r.caches_synced = true);
        let objects = self.state.inbox.objects();
        info!(
            services = objects.service_count(),
            endpointslices = objects.slice_count(),
            "watches listed"
        );
        // The first sync takes the whole listing: not a change's way to the kernel.
        wake.first_event = None;
        wake.sync = true;
        Some(wake)
    }

    fn take(&mut self, t: Trigger, wake: &mut Wake) {
        match t {
            Trigger::Object(ev, received) => {
                if let Some(s) = &mut self.state.startup {
                    s.saw(&ev, received);
                }
                self.state.relisted.extend(ev.list_end());
                wake.objects = true;
                let config = &self.ctx.config;
                let handled = |s: &_| nodelb_core::plan::service::is_handled(s, config);
                if self.state.inbox.apply(ev, &handled) {
                    wake.sync = true;
                    wake.first_event.get_or_insert(received);
                }
            }
            Trigger::Changed => wake.sync = true,
            Trigger::Relisted(what) => {
                wake.sync = true;
                self.state.relisted.insert(what);
            }
            Trigger::Drift(why) => wake.drift = Some(why),
            Trigger::Resync => {
                wake.sync = true;
                self.ctx.kernel.verify();
            }
            Trigger::Verified(v) => {
                if let Some(why) = self.ctx.outputs.verified(&mut self.state.told, v) {
                    wake.drift = Some(why);
                }
            }
            Trigger::Leading => wake.objects = true,
        }
    }

    /// Sync when one is due (see `Wake::sync`) or drift asks for it; otherwise only hand the
    /// status writer the objects. Returns the backoff delay after a failed sync. Once every
    /// change taken is committed (or needed no commit), readiness hears that no change waits.
    async fn act(&mut self, wake: Wake, queued: impl Fn() -> bool) -> Option<Duration> {
        if !wake.needs_sync() {
            if wake.objects {
                // Status writes only: the planner keeps the new objects instead of holding
                // every Service those writes replaced until the next sync.
                self.state.planner.follow(self.state.inbox.objects());
                self.ctx.outputs.publish_objects(&self.state.inbox);
            }
            // Only after a sync that committed does the loop wait for triggers: nothing
            // taken waits for the kernel.
            self.ctx.outputs.readiness.changes_applied(queued());
            return None;
        }
        let span = info_span!("sync");
        let delay = async {
            let (outcome, back) = self.sync(wake).await;
            let first = first_sync(&outcome);
            let state = &mut self.state;
            let delay = self
                .ctx
                .outputs
                .record(&mut state.told, &state.inbox, outcome);
            if let Some(sync) = first.filter(|_| delay.is_none()) {
                if let Some(s) = state.startup.take() {
                    s.ready(sync);
                }
            }
            if delay.is_none() {
                self.ctx.outputs.readiness.changes_applied(queued());
                let readiness = &self.ctx.outputs.readiness;
                readiness.caught_up(&std::mem::take(&mut self.state.relisted));
            }
            // After a whole replace the kernel actor keeps the planner for the models a moment
            // longer: the outcome is told first.
            let state = &mut self.state;
            state.planner = back.get().await;
            delay
        }
        .instrument(span)
        .await;
        self.state.pacer.synced(Instant::now());
        delay
    }

    /// One sync: read the inputs, plan, commit through the kernel actor. The planner comes
    /// back apart, once the actor is done with it.
    async fn sync(&mut self, wake: Wake) -> (Outcome, PlannerBack) {
        let started = Instant::now();
        let mut inputs = self.ctx.read_inputs();
        let (update, plan) = self.state.plan(&self.ctx, &mut inputs, started);
        let commit = kernel::Commit {
            change: update.change,
            families: inputs.families,
            drift: wake.drift.is_some(),
            planner: std::mem::take(&mut self.state.planner),
            flows: update.flows,
        };
        let (kernel, back) = self.ctx.kernel.commit_early(commit).await;
        let outcome = Outcome {
            first_event: wake.first_event,
            drift: wake.drift,
            started,
            plan,
            node: inputs.node,
            kernel,
        };
        (outcome, back)
    }
}

/// What a sync that committed took, for the start-up timeline.
fn first_sync(o: &Outcome) -> Option<FirstSync> {
    let sent = o.kernel.result.as_ref().ok()?;
    Some(FirstSync {
        plan: o.plan.took,
        tables: sent.prepared,
        encode: sent.stats.encode,
        commit: sent.stats.commit,
        absent: sent.adopted,
        tidy: o.kernel.tidied,
        took: o.kernel.at.saturating_duration_since(o.started),
    })
}

/// What a sync plans from.
struct Inputs {
    families: Families,
    plan: nodelb_core::plan::Context,
    node_warnings: Vec<Warning>,
    /// For readiness, the heartbeat and Node Events.
    node: NodeReport,
}

impl Context {
    /// What this sync plans from: the families that can be programmed, this node, its
    /// addresses, the host's listeners.
    fn read_inputs(&self) -> Inputs {
        let enabled = self.config.families();
        let sysctls = &self.sources.sysctls;
        let forwarding: Vec<(IpFamily, Result<Forwarding, String>)> = [IpFamily::V4, IpFamily::V6]
            .into_iter()
            .map(|f| (f, sysctls.forwarding(f).map_err(|e| e.to_string())))
            .collect();
        let FamilyDecision {
            programmed: families,
            states,
            mut problems,
        } = decide_families(enabled, &forwarding);
        let node_obj = valid(&self.sources.caches.node).into_iter().next();
        let node_obj = node_obj.as_ref().and_then(|n| n.0.as_ref().ok());
        let uid = node_obj.and_then(|n| n.metadata.uid.clone());
        let (node, mut node_warnings) = match node_obj {
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
        // The leader ignores it; this node's agent says so: logged and counted as invalid
        // input, and an Event on the Node.
        if let Some(w) = node_obj.and_then(published::node_warning) {
            problems.push(NodeProblem {
                reason: "InvalidPublishedAddresses",
                note: w.message.clone(),
            });
            node_warnings.push(w);
        }
        let local = self.sources.addresses.borrow().clone();
        // Read now: a sync that adds ports must not take one a process listens on.
        let host = self.sources.listeners.look(false).0;
        let mut config = self.config.clone();
        config.servicelb = config
            .servicelb
            .seeing(self.sources.caches.servicelb_labelled());
        let plan = nodelb_core::plan::Context::new(node, local, families, config)
            .with_listeners(HostListeners::new(host));
        // What the heartbeat tells the leader: families with a table and a node address on
        // the host to serve on.
        let serving = Families {
            v4: families.v4 && plan.served.contains_key(&IpFamily::V4),
            v6: families.v6 && plan.served.contains_key(&IpFamily::V6),
        };
        Inputs {
            families,
            plan,
            node_warnings,
            node: NodeReport {
                states,
                problems,
                uid,
                serving,
            },
        }
    }
}

impl State {
    /// Bring the plan up to date with the objects changed since the last sync; log new
    /// problems and changed outcomes. Returns the change to commit and how the UDP and SCTP
    /// ports' endpoints changed with it.
    fn plan(
        &mut self,
        ctx: &Context,
        inputs: &mut Inputs,
        started: Instant,
    ) -> (Update, PlanSummary) {
        let dirty = self.inbox.take_dirty();
        let update = self
            .planner
            .update(self.inbox.objects(), &inputs.plan, dirty.as_ref());
        let took = started.elapsed();
        let mut warnings = std::mem::take(&mut inputs.node_warnings);
        warnings.extend(self.planner.warnings().cloned());
        let mut invalid = Vec::new();
        for w in self.warnings.update(&warnings) {
            warn!(kind = %w.object.kind, namespace = w.object.namespace.as_deref().unwrap_or(""),
                  name = %w.object.name, problem = %w.message, "invalid input");
            invalid.push(w.object.kind);
        }
        for key in &update.changed {
            match self.planner.outcome(key) {
                Some(o) => info!(service = %key, outcome = %o, "service"),
                None => info!(service = %key, "service no longer handled"),
            }
        }
        let blocked = self.note_blocked(ctx);
        let health = ctx.outputs.health_checks.as_ref().map(|_| {
            health_checks(
                self.inbox.objects().services(),
                |k| self.planner.outcome(k),
                &ctx.config,
            )
        });
        let summary = PlanSummary {
            took,
            replanned: update.replanned,
            programmed: programmed_counts(self.planner.outcomes()),
            invalid,
            held: self.held.len(),
            blocked,
            health,
        };
        (update, summary)
    }

    /// The ports host listeners hold, for the heartbeat; log the Service ports they took or
    /// gave back since the last sync.
    fn note_blocked(&mut self, ctx: &Context) -> BlockedPorts {
        let taken = self.planner.taken_ports();
        let held: BTreeMap<Slot, Option<String>> = taken
            .iter()
            .filter(|(_, _, claimed)| *claimed)
            .map(|(slot, l, _)| {
                // A listener the sync's read did not name yet: name it now, for the heartbeat.
                let named = || ctx.sources.listeners.process_of(l);
                (*slot, l.process.clone().or_else(named))
            })
            .collect();
        let ephemeral = ctx.sources.sysctls.ephemeral_ports().ok().flatten();
        let reserved = &ctx.config.reserved_ports;
        let blocked = BlockedPorts::report(&taken, &held, reserved, ephemeral.as_ref());
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
        self.held = held;
        blocked
    }
}
