//! This node's heartbeat Lease `nodelb-node-<node>` in the agent's namespace: which families
//! the agent has programmed, which Service ports host listeners hold here, and, when the agent
//! has not been ready for a lease duration, or is behind the cluster past one of readiness's
//! bounds (`nodelb_core::readiness::Verdict::behind`: its rules may send traffic where the
//! cluster no longer has it, so no grace), that it serves nothing and why.
//!
//! When it is written (`status::heartbeat` says how the leader reads it):
//! - at once whenever what it says changes (and once the first sync committed);
//! - outside a Pod (no Pod with a readiness probe: the end-to-end tests' agents), renewed
//!   every third of `--node-lease-duration`: its renewals are the agent's liveness;
//! - in a Pod (the manifests' DaemonSet), renewed only while its own readiness fails (the
//!   leader then reads the Pod unready, and a failure shorter than a lease duration keeps the
//!   node), or every [`heartbeat::SLOW_RENEWAL`] while the leader asks for it on the Lease
//!   `nodelb-status` (it cannot read the Pods); otherwise nothing at steady state: the leader
//!   reads the Pod's Ready condition and the kubelet's node Lease;
//! - read back every [`CHECK_EVERY`] and written again if someone changed or deleted it;
//! - renewed once on the way out, in a Pod, so a rolling update keeps the node for a lease
//!   duration while the next agent starts.
//!
//! A renewal is one request: the Lease is replaced over the version last written (a
//! conflict, or a Lease gone, reads it first and tries once more).

use crate::metrics::{Metrics, ResultLabel};
use crate::readiness::Readiness;
use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, PostParams};
use kube::Client;
use nodelb_core::status::format_families;
use nodelb_core::status::heartbeat::{
    lease_name, Report, BLOCKED_ANNOTATION, FAMILIES_ANNOTATION, LIVENESS_ANNOTATION, LIVENESS_POD,
    NODE_LABEL, UNHEALTHY_ANNOTATION,
};
use nodelb_core::vocab::Families;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::{watch, Mutex};
use tracing::{info, info_span, warn, Instrument};

/// How often the agent looks at its readiness and at what is due (local only).
const TICK: Duration = Duration::from_secs(1);

/// How often the Lease is read back, to write it again if someone changed or deleted it.
pub const CHECK_EVERY: Duration = Duration::from_secs(1800);

/// How often an agent renews its heartbeat when it renews it: three times per node lease
/// duration, at most once a second.
pub fn heartbeat_period(node_lease_duration: Duration) -> Duration {
    (node_lease_duration / 3).max(Duration::from_secs(1))
}

/// This node's heartbeat Lease, and how it is written.
pub struct Heartbeat {
    pub client: Client,
    /// Where the Lease lives.
    pub namespace: String,
    pub node: String,
    /// The agent's Pod.
    pub holder: String,
    /// `--pod-name` was given: the agent may run in that Pod.
    pub pod_given: bool,
    /// The agent's readiness (what `/readyz` answers: the kubelet's probe).
    pub readiness: Readiness,
    /// `--node-lease-duration`.
    pub lease_duration: Duration,
    /// What the leader asks of agents in Pods (read from the Lease `nodelb-status`).
    pub asked: watch::Receiver<Option<Duration>>,
    pub metrics: Arc<Metrics>,
}

/// What is due at one look.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Due {
    Nothing,
    /// Write what the heartbeat says; renew it even if unchanged.
    Write {
        renew: bool,
    },
    /// Read the Lease back (and write it if it says something else).
    Check,
}

/// What a heartbeat says: the report, and whether the agent runs in a Pod a kubelet probes.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Says {
    report: Report,
    by_pod: bool,
}

/// When the heartbeat was last written and checked, and what it said.
#[derive(Default)]
struct Written {
    says: Option<Says>,
    at: Option<Instant>,
    checked: Option<Instant>,
    /// The last write failed: tried again after a period.
    failed_at: Option<Instant>,
}

impl Heartbeat {
    /// Write the heartbeat as the module's doc says, from `report` (published by the sync loop
    /// after each sync), until `stop`.
    pub async fn run(
        self,
        mut report: watch::Receiver<Option<Report>>,
        mut stop: watch::Receiver<bool>,
    ) {
        let pod_rx = self.find_pod();
        let period = heartbeat_period(self.lease_duration);
        let lease = LeaseWriter {
            api: Api::namespaced(self.client.clone(), &self.namespace),
            name: lease_name(&self.node),
            node: self.node.clone(),
            holder: self.holder.clone(),
            period,
            last: Mutex::new(None),
            metrics: self.metrics.clone(),
        };
        let mut written = Written::default();
        let mut unready_since: Option<Instant> = None;
        let mut asked = self.asked.clone();
        async {
            loop {
                let now = Instant::now();
                let verdict = self.readiness.report(now);
                let (current, renew_every) = self.what_now(
                    &verdict,
                    &mut unready_since,
                    &mut report,
                    &pod_rx,
                    &mut asked,
                    now,
                );
                if let Some(says) = current {
                    match due(&written, &says, renew_every, period, now) {
                        Due::Nothing => {}
                        Due::Write { renew } => lease.write(&says, renew, &mut written).await,
                        Due::Check => lease.check(&says, &mut written).await,
                    }
                }
                tokio::select! {
                    _ = stop.wait_for(|s| *s) => break,
                    _ = tokio::time::sleep(TICK) => {}
                    // Families or held ports changed: say so at once.
                    r = report.changed() => if r.is_err() { break },
                    Ok(()) = asked.changed() => {}
                }
            }
            // Stopping (a rolling update, a deleted Pod): the rules stay in the kernel until
            // the next agent takes them over, so one last renewal keeps the node serving for
            // a lease duration, as a renewing agent's last renewal does, instead of from the
            // moment its Pod stops being Ready.
            if let Some(says) = written.says.clone().filter(|s| s.by_pod) {
                let last = lease.write(&says, true, &mut written);
                if tokio::time::timeout(Duration::from_secs(2), last)
                    .await
                    .is_ok()
                    && written.failed_at.is_none()
                {
                    info!(lease = %lease.name, "renewed the heartbeat Lease on the way out");
                }
            }
        }
        .instrument(info_span!("heartbeat"))
        .await
    }

    /// Whether the agent runs in a Pod a kubelet probes, once it knows (`false` until then:
    /// it renews as outside one).
    fn find_pod(&self) -> watch::Receiver<bool> {
        let (pod_tx, pod_rx) = watch::channel(false);
        if self.pod_given {
            let (client, namespace) = (self.client.clone(), self.namespace.clone());
            let (pod, node) = (self.holder.clone(), self.node.clone());
            tokio::spawn(
                async move {
                    pod_tx.send_replace(runs_in_pod(&client, &namespace, &pod, &node).await);
                }
                .instrument(info_span!("heartbeat")),
            );
        }
        pod_rx
    }

    /// What the heartbeat says at `now` (the sync loop's report; a node that serves nothing
    /// once the agent has not been ready for a lease duration), and how often it is renewed
    /// then (`None`: only when it changes).
    fn what_now(
        &self,
        verdict: &nodelb_core::readiness::Verdict,
        unready_since: &mut Option<Instant>,
        report: &mut watch::Receiver<Option<Report>>,
        pod: &watch::Receiver<bool>,
        asked: &mut watch::Receiver<Option<Duration>>,
        now: Instant,
    ) -> (Option<Says>, Option<Duration>) {
        if verdict.ready {
            *unready_since = None;
        } else if unready_since.is_none() {
            *unready_since = Some(now);
        }
        let long_unready = unready_since
            .and_then(|since| {
                if verdict.behind {
                    Some("behind the cluster")
                } else if now.saturating_duration_since(since) >= self.lease_duration {
                    Some("not ready for a lease duration")
                } else {
                    None
                }
            })
            .map(|how| format!("{how}: {}", verdict.summary()));
        let by_pod = *pod.borrow();
        let says = report.borrow_and_update().clone().map(|r| Says {
            report: unhealthy_if(r, long_unready),
            by_pod,
        });
        let renew_every = if !by_pod || !verdict.ready {
            Some(heartbeat_period(self.lease_duration))
        } else {
            *asked.borrow_and_update()
        };
        (says, renew_every)
    }
}

/// What to do about the heartbeat at `now`: write it when what it says changed, when a
/// renewal is due (`renew_every`), or a period after a failed write; read it back every
/// [`CHECK_EVERY`].
fn due(
    w: &Written,
    says: &Says,
    renew_every: Option<Duration>,
    period: Duration,
    now: Instant,
) -> Due {
    let since = |t: Option<Instant>| t.map(|t| now.saturating_duration_since(t));
    if let Some(failed) = since(w.failed_at) {
        return if failed >= period {
            Due::Write { renew: true }
        } else {
            Due::Nothing
        };
    }
    if w.says.as_ref() != Some(says) {
        return Due::Write { renew: false };
    }
    if let (Some(every), Some(ago)) = (renew_every, since(w.at)) {
        if ago >= every {
            return Due::Write { renew: true };
        }
    }
    match since(w.checked.or(w.at)) {
        Some(ago) if ago >= CHECK_EVERY => Due::Check,
        _ => Due::Nothing,
    }
}

/// `report`, or, when the agent has not been ready for a lease duration or is behind (`why`)
/// and the sync loop has not said so already, the report of a node that serves nothing.
fn unhealthy_if(report: Report, why: Option<String>) -> Report {
    match why {
        Some(why) if report.unhealthy.is_none() => Report {
            families: Families {
                v4: false,
                v6: false,
            },
            unhealthy: Some(why),
            ..report
        },
        _ => report,
    }
}

fn now_micro() -> MicroTime {
    MicroTime(Timestamp::now())
}

/// Writes one node's heartbeat Lease.
struct LeaseWriter {
    api: Api<Lease>,
    name: String,
    node: String,
    holder: String,
    period: Duration,
    /// The Lease as last written or read: the next write replaces that version.
    last: Mutex<Option<Lease>>,
    metrics: Arc<Metrics>,
}

impl LeaseWriter {
    /// Write `report` (renewing the Lease if `renew`, else only if it said something else),
    /// counted and, when it fails, logged; `written` says how it went.
    async fn write(&self, says: &Says, renew: bool, written: &mut Written) {
        let r = self.try_write(says, renew).await;
        self.count(&r);
        self.settle(r, says, written);
    }

    /// Read the Lease back and write `report` if it says something else (someone changed or
    /// deleted it).
    async fn check(&self, says: &Says, written: &mut Written) {
        let read = self.api.get_opt(&self.name).await;
        let r = match read {
            Ok(lease) => {
                *self.last.lock().await = lease;
                self.try_write(says, false).await
            }
            Err(e) => Err(e),
        };
        self.count(&r);
        written.checked = Some(Instant::now());
        self.settle(r, says, written);
    }

    fn count(&self, r: &Result<bool, kube::Error>) {
        let result = match r {
            Ok(true) => "ok",
            Ok(false) => "unchanged",
            Err(_) => "error",
        };
        self.metrics
            .heartbeats
            .get_or_create(&ResultLabel { result })
            .inc();
    }

    fn settle(&self, r: Result<bool, kube::Error>, says: &Says, written: &mut Written) {
        let now = Instant::now();
        match r {
            Ok(changed) => {
                written.says = Some(says.clone());
                written.failed_at = None;
                if changed {
                    written.at = Some(now);
                }
                written.at.get_or_insert(now);
            }
            Err(e) => {
                warn!(error = %e, lease = %self.name, "heartbeat not written; trying again in a period");
                written.failed_at = Some(now);
            }
        }
    }

    /// Write the Lease (over the version last seen; on a conflict or when it is gone, read it
    /// and try once more), or create it. `Ok(false)`: it already said all this and was not to
    /// be renewed, so nothing was sent.
    async fn try_write(&self, says: &Says, renew: bool) -> Result<bool, kube::Error> {
        let mut last = self.last.lock().await;
        if last.is_none() {
            *last = self.api.get_opt(&self.name).await?;
        }
        for attempt in 0..2 {
            let result = match last.as_ref() {
                None => self.create(says).await.map(Some),
                Some(lease) => self.replace(lease, says, renew).await,
            };
            match result {
                Ok(Some(lease)) => {
                    *last = Some(lease);
                    return Ok(true);
                }
                Ok(None) => return Ok(false),
                Err(kube::Error::Api(s)) if attempt == 0 && (s.code == 409 || s.code == 404) => {
                    *last = self.api.get_opt(&self.name).await?;
                }
                Err(e) => return Err(e),
            }
        }
        unreachable!("the second attempt returns")
    }

    async fn create(&self, says: &Says) -> Result<Lease, kube::Error> {
        let mut annotations = Default::default();
        annotate(&mut annotations, &says.report, says.by_pod);
        let lease = Lease {
            metadata: kube::api::ObjectMeta {
                name: Some(self.name.clone()),
                labels: Some([(NODE_LABEL.to_string(), self.node.clone())].into()),
                annotations: Some(annotations),
                ..Default::default()
            },
            spec: Some(LeaseSpec {
                holder_identity: Some(self.holder.clone()),
                lease_duration_seconds: Some(super::election::secs(self.period * 3)),
                acquire_time: Some(now_micro()),
                renew_time: Some(now_micro()),
                ..Default::default()
            }),
        };
        self.api.create(&PostParams::default(), &lease).await
    }

    /// `Ok(None)`: `lease` says all this already and is not to be renewed.
    async fn replace(
        &self,
        lease: &Lease,
        says: &Says,
        renew: bool,
    ) -> Result<Option<Lease>, kube::Error> {
        let mut lease = lease.clone();
        lease.metadata.managed_fields = None;
        let before = (lease.metadata.clone(), lease.spec.clone());
        let annotations = lease
            .metadata
            .annotations
            .get_or_insert_with(Default::default);
        annotate(annotations, &says.report, says.by_pod);
        lease
            .metadata
            .labels
            .get_or_insert_with(Default::default)
            .insert(NODE_LABEL.to_string(), self.node.clone());
        let spec = lease.spec.get_or_insert_with(Default::default);
        spec.holder_identity = Some(self.holder.clone());
        spec.lease_duration_seconds = Some(super::election::secs(self.period * 3));
        if !renew && (lease.metadata.clone(), lease.spec.clone()) == before {
            return Ok(None);
        }
        lease.spec.get_or_insert_with(Default::default).renew_time = Some(now_micro());
        self.api
            .replace(&self.name, &PostParams::default(), &lease)
            .await
            .map(Some)
    }
}

/// How long an agent waits for the kubelet to say its Pod runs (the Pod's phase `Running`)
/// before it takes the Pod for one no kubelet runs, and how often it looks meanwhile.
const POD_RUNNING_WAIT: Duration = Duration::from_secs(30);
const POD_LOOK_EVERY: Duration = Duration::from_secs(2);

/// Whether this agent runs in Pod `pod` of `namespace` on `node`, with a readiness probe, run
/// by a kubelet (its phase `Running`): the kubelet then probes it and says whether it is
/// ready, and the agent need not renew its Lease. A Pod object no kubelet runs (the end-to-end
/// tests' agents are processes with a Pod object for their identity) stays `Pending`: after
/// [`POD_RUNNING_WAIT`] the agent renews as outside a Pod. A Pod it may not read (RBAC) counts
/// as its Pod: `--pod-name` names the Pod it runs in, and the leader, which then cannot read
/// the Pods either, asks for slow renewals on the Lease `nodelb-status`. Says which, and why,
/// in one line.
async fn runs_in_pod(client: &Client, namespace: &str, pod: &str, node: &str) -> bool {
    let api: Api<Pod> = Api::namespaced(client.clone(), namespace);
    let began = Instant::now();
    let why_not = loop {
        let got = match api.get_opt(pod).await {
            // An error may pass, but Forbidden is for good.
            Err(kube::Error::Api(s)) if s.code == 403 => {
                warn!(error = %s.message, "cannot read this agent's Pod {namespace}/{pod} (RBAC: get pods, as manifests/base/rbac.yaml grants): taken to be this agent's Pod; the heartbeat Lease is written when it changes, and renewed when the leader asks");
                return true;
            }
            got => got,
        };
        let why_not = match got {
            Err(e) => format!("cannot read Pod {namespace}/{pod}: {e}"),
            Ok(None) => format!("no Pod {namespace}/{pod}"),
            Ok(Some(p)) => {
                let spec = p.spec.unwrap_or_default();
                let phase = p.status.and_then(|s| s.phase).unwrap_or_default();
                if spec.node_name.as_deref() != Some(node) {
                    break format!("Pod {namespace}/{pod} is not on node {node}");
                } else if !spec.containers.iter().any(|c| c.readiness_probe.is_some()) {
                    break format!("Pod {namespace}/{pod} has no readiness probe");
                } else if phase == "Running" {
                    info!(pod, "in a Pod with a readiness probe: the heartbeat Lease is written when it changes, and renewed only while this agent is not ready or the leader asks");
                    return true;
                }
                format!("no kubelet runs Pod {namespace}/{pod} (phase {phase:?})")
            }
        };
        if began.elapsed() >= POD_RUNNING_WAIT {
            break why_not;
        }
        tokio::time::sleep(POD_LOOK_EVERY).await;
    };
    info!(reason = %why_not, "renewing the heartbeat Lease every period");
    false
}

/// A heartbeat's annotations: the families programmed, and the Service ports host listeners
/// hold (no annotation when there are none).
fn annotate(
    annotations: &mut std::collections::BTreeMap<String, String>,
    report: &Report,
    by_pod: bool,
) {
    if by_pod {
        annotations.insert(LIVENESS_ANNOTATION.to_string(), LIVENESS_POD.to_string());
    } else {
        annotations.remove(LIVENESS_ANNOTATION);
    }
    annotations.insert(
        FAMILIES_ANNOTATION.to_string(),
        format_families(report.families),
    );
    if report.blocked.ports.is_empty() && !report.blocked.incomplete {
        annotations.remove(BLOCKED_ANNOTATION);
    } else {
        annotations.insert(BLOCKED_ANNOTATION.to_string(), report.blocked.format());
    }
    match &report.unhealthy {
        None => annotations.remove(UNHEALTHY_ANNOTATION),
        Some(why) => annotations.insert(UNHEALTHY_ANNOTATION.to_string(), shortened(why)),
    };
}

/// An error as an annotation says it: at most its first `MAX_REASON` bytes, marked when cut.
fn shortened(why: &str) -> String {
    const MAX_REASON: usize = 500;
    let cut = super::events::cut_to(why, MAX_REASON);
    if cut.len() < why.len() {
        format!("{cut}…")
    } else {
        cut
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn report(unhealthy: Option<&str>) -> Report {
        Report {
            families: Families {
                v4: true,
                v6: false,
            },
            blocked: Default::default(),
            unhealthy: unhealthy.map(str::to_string),
        }
    }

    #[test]
    fn an_unhealthy_report_is_annotated_and_a_healthy_one_clears_it() {
        let mut a = Default::default();
        annotate(&mut a, &report(Some(&"x".repeat(2000))), true);
        let why = &a[UNHEALTHY_ANNOTATION];
        assert!(why.starts_with("xxx") && why.ends_with('…') && why.chars().count() == 501);
        annotate(&mut a, &report(None), true);
        assert!(!a.contains_key(UNHEALTHY_ANNOTATION), "{a:?}");
        assert_eq!(a[FAMILIES_ANNOTATION], "IPv4");
    }

    #[test]
    fn an_agent_unready_for_a_lease_duration_says_it_serves_nothing() {
        let r = unhealthy_if(
            report(None),
            Some("not ready for a lease duration: no watch of services".into()),
        );
        assert_eq!(
            r.families,
            Families {
                v4: false,
                v6: false
            }
        );
        assert_eq!(
            r.unhealthy.as_deref(),
            Some("not ready for a lease duration: no watch of services")
        );
        // The sync loop's own word (syncs failing) stands.
        let r = unhealthy_if(report(Some("EPERM")), Some("x".into()));
        assert_eq!(r.unhealthy.as_deref(), Some("EPERM"));
        assert_eq!(unhealthy_if(report(None), None), report(None));
    }

    #[test]
    fn writes_are_due_on_change_on_renewal_after_a_failure_and_at_the_check() {
        let t0 = Instant::now();
        let p = Duration::from_secs(5);
        let says = Says {
            report: report(None),
            by_pod: true,
        };
        let s = Duration::from_secs;
        assert_eq!(
            due(&Written::default(), &says, None, p, t0),
            Due::Write { renew: false },
            "the first report"
        );
        let w = Written {
            says: Some(says.clone()),
            at: Some(t0),
            ..Written::default()
        };
        assert_eq!(
            due(&w, &says, None, p, t0 + s(600)),
            Due::Nothing,
            "in a Pod"
        );
        let failing = Says {
            report: report(Some("e")),
            ..says.clone()
        };
        assert_eq!(
            due(&w, &failing, None, p, t0 + s(1)),
            Due::Write { renew: false },
            "what it says changed"
        );
        let found_its_pod = Says {
            by_pod: false,
            ..says.clone()
        };
        assert_eq!(
            due(&w, &found_its_pod, None, p, t0 + s(1)),
            Due::Write { renew: false },
            "where it runs changed"
        );
        assert_eq!(due(&w, &says, Some(p), p, t0 + s(4)), Due::Nothing);
        assert_eq!(
            due(&w, &says, Some(p), p, t0 + s(5)),
            Due::Write { renew: true }
        );
        assert_eq!(due(&w, &says, None, p, t0 + CHECK_EVERY), Due::Check);
        let failed = Written {
            failed_at: Some(t0),
            ..Written::default()
        };
        assert_eq!(due(&failed, &says, None, p, t0 + s(4)), Due::Nothing);
        assert_eq!(
            due(&failed, &says, None, p, t0 + s(5)),
            Due::Write { renew: true }
        );
    }
}
