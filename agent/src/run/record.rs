//! Where each sync's outcome is told, in one place: [`Outputs::record`] updates the metrics,
//! logs the sync, and publishes readiness, the heartbeat's report, the status writer's objects
//! and Node Events; it also says when to try again after a failure (the loop's error policy).
//! A verify's verdict, which is no sync, is counted in [`Outputs::verified`].

use super::decisions::{Backoff, Programmed};
use super::kernel::{self, Done, Sent, Verified};
use crate::health_check::{Answers, HealthCheckNodePorts};
use crate::host::conntrack::Cleaned;
use crate::kube::inbox::Inbox;
use crate::kube::node_events::{NodeEvents, NodeProblem};
use crate::metrics::{FlowLabels, Metrics, ResultLabel};
use crate::readiness::Readiness;
use nodelb_core::plan::diagnosis::ObjectKind;
use nodelb_core::plan::health::HealthCheck;
use nodelb_core::plan::Objects;
use nodelb_core::readiness::LastSync;
use nodelb_core::status::heartbeat::{BlockedPorts, Report};
use nodelb_core::vocab::{Families, IpFamily, Protocol};
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::watch;
use tracing::{debug, error, info, warn};

/// Where a sync's outcome goes.
pub struct Outputs {
    pub metrics: Arc<Metrics>,
    pub readiness: Readiness,
    /// For the heartbeat: the families committed by the last successful sync, and the
    /// Service ports host listeners hold.
    pub report: watch::Sender<Option<Report>>,
    /// For the status writer, while leading: the objects after each sync.
    pub objects: watch::Sender<Option<Arc<Objects>>>,
    pub leading: watch::Receiver<bool>,
    /// `--health-check-node-ports`: where the health checks' answers go.
    pub health_checks: Option<HealthCheckNodePorts>,
    /// Syncs failing for longer than this (`--node-lease-duration`) make the heartbeat say
    /// the node is unhealthy and serves nothing.
    pub unhealthy_after: Duration,
}

/// What telling the outcomes keeps from one sync to the next.
pub(super) struct Told {
    /// The foreign forward policies that drop, as last read (`/readyz` notes).
    notes: Vec<String>,
    backoff: Backoff,
    node_events: NodeEvents,
    /// When the syncs started failing (this node's own clock, compared with itself only).
    failing_since: Option<Instant>,
}

impl Told {
    pub(super) fn new(node_events: NodeEvents) -> Told {
        Told {
            notes: Vec::new(),
            backoff: Backoff::default(),
            node_events,
            failing_since: None,
        }
    }
}

/// What one sync did.
pub(super) struct Outcome {
    /// When the watch task received the first event this sync took.
    pub(super) first_event: Option<Instant>,
    /// The drift this sync was asked to repair.
    pub(super) drift: Option<String>,
    pub(super) started: Instant,
    pub(super) plan: PlanSummary,
    pub(super) node: NodeReport,
    pub(super) kernel: Done,
}

/// What the planner decided, for logs and metrics.
pub(super) struct PlanSummary {
    /// From the start of the sync to the plan.
    pub(super) took: Duration,
    pub(super) replanned: usize,
    pub(super) programmed: Programmed,
    /// The kinds of the objects with a new problem.
    pub(super) invalid: Vec<ObjectKind>,
    /// Service ports host listeners hold.
    pub(super) held: usize,
    pub(super) blocked: BlockedPorts,
    /// With `--health-check-node-ports`: each Local Service's health check, by port.
    pub(super) health: Option<BTreeMap<u16, HealthCheck>>,
}

/// The node's side of a sync: for readiness, the heartbeat and Node Events.
pub(super) struct NodeReport {
    /// Each enabled family and why it is not programmed (`None`: it is).
    pub(super) states: Vec<(IpFamily, Option<String>)>,
    pub(super) problems: Vec<NodeProblem>,
    /// The Node's uid, for its Events.
    pub(super) uid: Option<String>,
    /// Families with a table and a node address on the host to serve on.
    pub(super) serving: Families,
}

impl Outputs {
    /// Tell a sync's outcome. Returns when to try again: `None` after a commit, the backoff
    /// delay after a failure.
    pub(super) fn record(&self, told: &mut Told, inbox: &Inbox, o: Outcome) -> Option<Duration> {
        let Outcome {
            first_event,
            drift,
            started,
            plan,
            mut node,
            kernel,
        } = o;
        let metrics = &self.metrics;
        let took = kernel.at.saturating_duration_since(started);
        metrics.record_sync(took, kernel.result.is_ok());
        for kind in &plan.invalid {
            metrics.invalid(*kind, "plan");
        }
        metrics.blocked_ports.set(plan.held as i64);
        if let Some(notes) = kernel.notes {
            told.notes = notes;
        }
        let error = match &kernel.result {
            Ok(sent) => {
                let waited = first_event.map(|first| kernel.at.saturating_duration_since(first));
                committed(metrics, sent, &plan, drift.as_deref(), waited, took);
                cleaned(metrics, kernel.cleanup);
                None
            }
            Err(e) => {
                let text = crate::error_chain(e);
                error!(error = %text, "sync failed; retrying with a full replace");
                node.problems.extend(nf_tables_problem(e, &text));
                Some(text)
            }
        };
        let ok = error.is_none();
        if let (Some(h), Some(checks)) = (&self.health_checks, plan.health) {
            h.publish(Answers {
                checks,
                agent_healthy: ok,
            });
        }
        self.publish(told, inbox, error, node, plan.blocked);
        if ok {
            told.backoff.reset();
            None
        } else {
            Some(told.backoff.next_delay())
        }
    }

    /// A verify's verdict: counted, its notes kept for readiness. Returns the drift found.
    pub(super) fn verified(&self, told: &mut Told, v: Verified) -> Option<String> {
        let result = if v.drift.is_some() {
            "repaired"
        } else {
            "unchanged"
        };
        self.metrics
            .resyncs
            .get_or_create(&ResultLabel { result })
            .inc();
        told.notes = v.notes;
        v.drift
    }

    /// Tell the rest of the agent: the heartbeat (families served, after a commit), the
    /// status writer (the objects, while leading), readiness, and Node Events for node
    /// problems.
    fn publish(
        &self,
        told: &mut Told,
        inbox: &Inbox,
        error: Option<String>,
        node: NodeReport,
        blocked: BlockedPorts,
    ) {
        let report = match &error {
            None => {
                told.failing_since = None;
                Some(Report {
                    families: node.serving,
                    blocked,
                    unhealthy: None,
                })
            }
            Some(e) => unhealthy_report(told, self.unhealthy_after, e, blocked),
        };
        if let Some(report) = report {
            let changed = self
                .report
                .send_if_modified(|r| r.replace(report.clone()).as_ref() != Some(&report));
            if let (true, Some(why)) = (changed, &report.unhealthy) {
                warn!(error = %why, after = ?self.unhealthy_after,
                      "syncs have been failing for longer than --node-lease-duration: the heartbeat says this node serves nothing until a sync commits");
            }
        }
        self.publish_objects(inbox);
        self.readiness.set(|r| {
            r.last_sync = match error {
                None => LastSync::Committed,
                Some(e) => LastSync::Failed(e),
            };
            r.families = node.states;
            r.notes = told.notes.clone();
        });
        for p in told.node_events.update(node.problems, node.uid) {
            warn!(reason = p.reason, problem = %p.note, "node problem");
        }
    }

    /// The status writer gets the objects as they are now, while leading (and none
    /// otherwise, so changes are not copied).
    pub(super) fn publish_objects(&self, inbox: &Inbox) {
        if *self.leading.borrow() {
            self.objects.send_replace(Some(inbox.snapshot()));
        } else if self.objects.borrow().is_some() {
            self.objects.send_replace(None);
        }
    }
}

/// After a failed sync: the report that says the node serves nothing, once syncs have been
/// failing for longer than `after` (the kernel may no longer hold what the last report
/// claims); before that, none (the last report stands).
fn unhealthy_report(
    told: &mut Told,
    after: Duration,
    error: &str,
    blocked: BlockedPorts,
) -> Option<Report> {
    let since = *told.failing_since.get_or_insert_with(Instant::now);
    if since.elapsed() < after {
        return None;
    }
    Some(Report {
        families: Families {
            v4: false,
            v6: false,
        },
        blocked,
        unhealthy: Some(error.to_string()),
    })
}

/// The conntrack cleanup after a commit, counted (`None`: nothing was stale). After a failure
/// the kernel actor tries the same changes again after the next commit.
fn cleaned(
    metrics: &Metrics,
    cleanup: Option<Result<Vec<Cleaned>, nodelb_netfilter::conntrack::Error>>,
) {
    let result = match cleanup {
        None => return,
        Some(Ok(done)) => {
            count_cleanup(metrics, &done);
            "ok"
        }
        Some(Err(e)) => {
            warn!(error = %crate::error_chain(&e), "deleting stale conntrack entries failed; trying again after the next commit");
            "error"
        }
    };
    metrics
        .conntrack_cleanups
        .get_or_create(&ResultLabel { result })
        .inc();
}

/// Metrics and logs of a commit.
fn committed(
    metrics: &Metrics,
    sent: &Sent,
    plan: &PlanSummary,
    drift: Option<&str>,
    waited: Option<Duration>,
    took: Duration,
) {
    if let Some(w) = waited {
        metrics.event_to_kernel.observe(w.as_secs_f64());
    }
    metrics.sync_objects.set(sent.objects as i64);
    metrics.sync_bytes.set(sent.stats.bytes as i64);
    let programmed = &plan.programmed;
    metrics.services_programmed.set(programmed.services as i64);
    metrics
        .endpoints_programmed
        .set(programmed.endpoints as i64);
    metrics.set_hints_ignored(&programmed.hints_ignored);
    if let Some(why) = drift {
        metrics.drift_repairs.inc();
        info!(why = %why, took = ?took, "repaired drift with a full replace");
    }
    debug!(objects = sent.objects, bytes = sent.stats.bytes, encode = ?sent.stats.encode,
           commit = ?sent.stats.commit, whole = sent.whole, services = programmed.services,
           endpoints = programmed.endpoints, replanned = plan.replanned, plan = ?plan.took,
           event_to_kernel = ?waited, took = ?took, "synced");
}

/// A Node problem from a failed commit: nf_tables cannot be used at all.
fn nf_tables_problem(e: &kernel::Error, text: &str) -> Option<NodeProblem> {
    let open = matches!(
        e,
        kernel::Error::Netfilter(nodelb_netfilter::Error::Open(_))
    );
    open.then(|| NodeProblem {
        reason: "NfTablesUnavailable",
        note: format!("nodelb cannot use nf_tables: {text}"),
    })
}

/// Metrics and logs of the conntrack entries a cleanup deleted.
fn count_cleanup(metrics: &Metrics, done: &[Cleaned]) {
    for c in done {
        let labels = FlowLabels {
            family: c.family.label(),
            protocol: match c.protocol {
                Protocol::Udp => "UDP",
                Protocol::Sctp => "SCTP",
                Protocol::Tcp => "TCP",
            },
        };
        metrics
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

#[cfg(test)]
mod tests {
    use super::*;

    fn told() -> Told {
        Told::new(NodeEvents::new(None, "node-a", None))
    }

    #[test]
    fn a_failing_node_keeps_its_last_report_until_the_bound_has_passed() {
        let mut t = told();
        let r = unhealthy_report(
            &mut t,
            Duration::from_secs(3600),
            "EPERM",
            Default::default(),
        );
        assert_eq!(r, None, "the last committed report stands");
        assert!(t.failing_since.is_some(), "the failure is timed from now");
        let first = t.failing_since;
        let r = unhealthy_report(
            &mut t,
            Duration::from_secs(3600),
            "EPERM",
            Default::default(),
        );
        assert_eq!(
            (r, t.failing_since),
            (None, first),
            "timed from the first failure"
        );
    }

    #[test]
    fn past_the_bound_the_report_serves_nothing_and_says_why() {
        let mut t = told();
        t.failing_since = Some(Instant::now() - Duration::from_secs(20));
        let r = unhealthy_report(&mut t, Duration::from_secs(15), "EPERM", Default::default())
            .expect("a report");
        assert_eq!(
            (r.families.v4, r.families.v6, r.unhealthy.as_deref()),
            (false, false, Some("EPERM"))
        );
    }
}
