//! Leader election on the Lease `nodelb-status` (see `status::election` for the rules) and this
//! node's heartbeat Lease `nodelb-node-<node>`, both in the agent's namespace.

use super::kubelet;
use crate::metrics::{Metrics, ResultLabel};
use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, PostParams};
use kube::Client;
use nodelb_core::status::election::{Action, Election, Params, LEASE_NAME};
use nodelb_core::status::format_families;
use nodelb_core::status::heartbeat::{
    lease_name, Report, BLOCKED_ANNOTATION, FAMILIES_ANNOTATION, LIVENESS_ANNOTATION, LIVENESS_POD,
    NODE_LABEL, UNHEALTHY_ANNOTATION,
};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::watch;
use tracing::{debug, info, info_span, warn, Instrument};

fn now_micro() -> MicroTime {
    MicroTime(Timestamp::now())
}

fn secs(d: Duration) -> i32 {
    i32::try_from(d.as_secs().max(1)).unwrap_or(i32::MAX)
}

/// Run the election until `stop`; publish whether we lead on `leading`. On stop, a leader
/// releases the Lease.
pub async fn elect(
    client: Client,
    namespace: String,
    me: String,
    params: Params,
    leading: watch::Sender<bool>,
    metrics: Arc<Metrics>,
    mut stop: watch::Receiver<bool>,
) {
    let elector = Elector {
        api: Api::namespaced(client, &namespace),
        namespace,
        me: me.clone(),
        params,
        metrics,
    };
    let mut e = Election::new(me, params);
    async {
        loop {
            let was = e.leading();
            let result = elector.step(&mut e).await;
            elector.settle(&mut e, result);
            if was && !e.leading() {
                warn!("lost the Lease {LEASE_NAME}: no longer writing Service status");
            }
            elector.metrics.leader.set(i64::from(e.leading()));
            leading.send_if_modified(|l| std::mem::replace(l, e.leading()) != e.leading());
            tokio::select! {
                _ = stop.wait_for(|s| *s) => break,
                _ = tokio::time::sleep(params.retry_period) => {}
            }
        }
        if e.leading() {
            leading.send_replace(false);
            elector.metrics.leader.set(0);
            match release(&elector.api, &elector.me).await {
                Ok(()) => info!("released the Lease {LEASE_NAME}"),
                Err(err) => warn!(error = %err, "could not release the Lease {LEASE_NAME}"),
            }
            e.released();
        }
    }
    .instrument(info_span!("election"))
    .await
}

/// The I/O side of the election: reads and writes the Lease as the state machine decides.
struct Elector {
    api: Api<Lease>,
    namespace: String,
    me: String,
    params: Params,
    metrics: Arc<Metrics>,
}

impl Elector {
    /// Read the Lease and do what the state machine decides. `Ok(true)`: the Lease was
    /// written (created, acquired or renewed); `Ok(false)`: nothing to do.
    async fn step(&self, e: &mut Election) -> Result<bool, kube::Error> {
        let now = Instant::now();
        let current = self.api.get_opt(LEASE_NAME).await?;
        let action = e.observe(current.as_ref(), now);
        if let Some(l) = &current {
            let t = l
                .spec
                .as_ref()
                .and_then(|s| s.lease_transitions)
                .unwrap_or(0);
            self.metrics.lease_transitions.set(i64::from(t));
        }
        match action {
            Action::Wait => return Ok(false),
            Action::Create => {
                self.api
                    .create(&PostParams::default(), &self.new_lease())
                    .await?;
            }
            Action::Acquire | Action::Renew => {
                let mut lease = current.expect("acquire and renew follow a read");
                let spec = lease.spec.get_or_insert_with(Default::default);
                if action == Action::Acquire {
                    spec.holder_identity = Some(self.me.clone());
                    spec.acquire_time = Some(now_micro());
                    spec.lease_transitions = Some(spec.lease_transitions.unwrap_or(0) + 1);
                }
                spec.renew_time = Some(now_micro());
                spec.lease_duration_seconds = Some(secs(self.params.lease_duration));
                // The read resourceVersion makes this a compare-and-swap: 409 if someone else
                // wrote in between.
                self.api
                    .replace(LEASE_NAME, &PostParams::default(), &lease)
                    .await?;
                if action == Action::Acquire {
                    info!(holder = %self.me, "acquired the Lease {LEASE_NAME}: writing Service status");
                }
            }
        }
        Ok(true)
    }

    /// The Lease this agent creates when there is none.
    fn new_lease(&self) -> Lease {
        Lease {
            metadata: kube::api::ObjectMeta {
                name: Some(LEASE_NAME.into()),
                namespace: Some(self.namespace.clone()),
                ..Default::default()
            },
            spec: Some(LeaseSpec {
                holder_identity: Some(self.me.clone()),
                lease_duration_seconds: Some(secs(self.params.lease_duration)),
                acquire_time: Some(now_micro()),
                renew_time: Some(now_micro()),
                lease_transitions: Some(0),
                ..Default::default()
            }),
        }
    }

    /// Tell the state machine how the step went.
    fn settle(&self, e: &mut Election, result: Result<bool, kube::Error>) {
        match result {
            Ok(true) => e.succeeded(Instant::now()),
            Ok(false) => {}
            Err(err) => {
                let still = e.failed(Instant::now());
                // 409: another agent created or wrote the Lease first, the race a
                // compare-and-swap exists for; the next step reads it again.
                if matches!(&err, kube::Error::Api(s) if s.code == 409) {
                    debug!(error = %err, leading = still, "election step lost a race");
                } else {
                    warn!(error = %err, leading = still, "election step failed");
                }
            }
        }
    }
}

/// Give the Lease up: empty holder, so the next agent takes it at once.
async fn release(api: &Api<Lease>, me: &str) -> Result<(), kube::Error> {
    let Some(mut lease) = api.get_opt(LEASE_NAME).await? else {
        return Ok(());
    };
    let spec = lease.spec.get_or_insert_with(Default::default);
    if spec.holder_identity.as_deref() != Some(me) {
        return Ok(());
    }
    spec.holder_identity = None;
    spec.lease_duration_seconds = Some(1);
    spec.renew_time = Some(now_micro());
    api.replace(LEASE_NAME, &PostParams::default(), &lease)
        .await
        .map(|_| ())
}

/// How often an agent renews its heartbeat: three times per node lease duration, at most
/// once a second (its only steady write to the API).
pub fn heartbeat_period(node_lease_duration: Duration) -> Duration {
    (node_lease_duration / 3).max(Duration::from_secs(1))
}

/// This node's heartbeat Lease, and how it is renewed.
pub struct Heartbeat {
    pub client: Client,
    /// Where the Lease lives.
    pub namespace: String,
    pub node: String,
    /// The agent's Pod.
    pub holder: String,
    /// `--pod-name` was given: the agent may run in that Pod.
    pub pod_given: bool,
    /// The kubelet's health check (`--kubelet-healthz`).
    pub kubelet_healthz: String,
    /// What this agent's `/readyz` answers (the kubelet's probe).
    pub readiness: crate::run::http::SharedReadiness,
    pub period: Duration,
    /// `--node-lease-duration`.
    pub lease_duration: Duration,
    pub metrics: Arc<Metrics>,
}

/// How often an agent in a Pod reads its Lease back, to write it again if someone changed or
/// deleted it.
const CHECK_EVERY: Duration = Duration::from_secs(300);

impl Heartbeat {
    /// Write the heartbeat once the first sync committed, with the families programmed and
    /// the Service ports host listeners hold (from `report`, published by the sync loop), and
    /// again whenever they change, until `stop`. An agent outside a Pod renews it every
    /// `period`; one in a Pod ([`runs_in_pod`]) only while the kubelet's word on it is not
    /// current (`kubelet::watch`: the kubelet does not answer, or `/readyz` fails), since the
    /// leader otherwise reads its Pod and its kubelet's node Lease (`heartbeat::Liveness::ages`).
    pub async fn run(
        self,
        mut report: watch::Receiver<Option<Report>>,
        mut stop: watch::Receiver<bool>,
    ) {
        let by_pod = self.pod_given
            && runs_in_pod(&self.client, &self.namespace, &self.holder, &self.node).await;
        let (renewing_tx, mut renewing) = watch::channel(!by_pod);
        if by_pod {
            let check = kubelet::watch(
                self.kubelet_healthz.clone(),
                self.readiness.clone(),
                self.lease_duration,
                renewing_tx,
            );
            tokio::spawn(check.instrument(info_span!("kubelet health")));
        }
        let lease = LeaseWriter {
            api: Api::namespaced(self.client.clone(), &self.namespace),
            name: lease_name(&self.node),
            node: self.node.clone(),
            holder: self.holder.clone(),
            by_pod,
            period: self.period,
            metrics: self.metrics.clone(),
        };
        let mut written: Option<Report> = None;
        let mut checked = Instant::now();
        async {
            loop {
                let current = report.borrow_and_update().clone();
                let renew = *renewing.borrow_and_update();
                let check = checked.elapsed() >= CHECK_EVERY;
                if let Some(f) = current
                    .as_ref()
                    .filter(|f| renew || check || written.as_ref() != Some(f))
                {
                    if lease.write(f, renew).await {
                        written = Some(f.clone());
                    }
                    checked = Instant::now();
                }
                // A write that failed is tried again after a period, as a renewal would be.
                let failed = current.is_some() && written != current;
                let wait = if renew || failed {
                    self.period
                } else {
                    CHECK_EVERY
                };
                tokio::select! {
                    _ = stop.wait_for(|s| *s) => break,
                    _ = tokio::time::sleep(wait) => {}
                    // Families or held ports changed: say so at once.
                    r = report.changed() => if r.is_err() { break },
                    // (Should the health check's task end, its last word stands: a closed
                    // channel must not wake this loop, or it would spin.)
                    Ok(()) = renewing.changed() => {}
                }
            }
            // Stopping (a rolling update, a deleted Pod): the rules stay in the kernel until
            // the next agent takes them over, so one last renewal keeps the node serving for
            // a lease duration, as a renewing agent's last renewal does, instead of from the
            // moment its Pod stops being Ready.
            if let (true, Some(f)) = (by_pod, &written) {
                let last = lease.write(f, true);
                if tokio::time::timeout(Duration::from_secs(2), last).await == Ok(true) {
                    info!(lease = %lease.name, "renewed the heartbeat Lease on the way out");
                }
            }
        }
        .instrument(info_span!("heartbeat"))
        .await
    }
}

/// Writes one node's heartbeat Lease.
struct LeaseWriter {
    api: Api<Lease>,
    name: String,
    node: String,
    holder: String,
    /// The agent runs in the Pod it names ([`LIVENESS_POD`]).
    by_pod: bool,
    period: Duration,
    metrics: Arc<Metrics>,
}

impl LeaseWriter {
    /// Write `report`, renewing the Lease if `renew` (else only if it said something else);
    /// counted and, when it fails, logged. `true`: the Lease says `report` now.
    async fn write(&self, report: &Report, renew: bool) -> bool {
        let r = self.try_write(report, renew).await;
        let result = match &r {
            Ok(true) => "ok",
            Ok(false) => "unchanged",
            Err(_) => "error",
        };
        self.metrics
            .heartbeats
            .get_or_create(&ResultLabel { result })
            .inc();
        if let Err(e) = &r {
            warn!(error = %e, lease = %self.name, "heartbeat not written");
        }
        r.is_ok()
    }

    /// Write the Lease, or create it. `Ok(false)`: it already said all this and was not to be
    /// renewed, so nothing was written.
    async fn try_write(&self, report: &Report, renew: bool) -> Result<bool, kube::Error> {
        let Some(mut lease) = self.api.get_opt(&self.name).await? else {
            let mut annotations = Default::default();
            annotate(&mut annotations, report, self.by_pod);
            let lease = Lease {
                metadata: kube::api::ObjectMeta {
                    name: Some(self.name.clone()),
                    labels: Some([(NODE_LABEL.to_string(), self.node.clone())].into()),
                    annotations: Some(annotations),
                    ..Default::default()
                },
                spec: Some(LeaseSpec {
                    holder_identity: Some(self.holder.clone()),
                    lease_duration_seconds: Some(secs(self.period * 3)),
                    acquire_time: Some(now_micro()),
                    renew_time: Some(now_micro()),
                    ..Default::default()
                }),
            };
            self.api.create(&PostParams::default(), &lease).await?;
            return Ok(true);
        };
        let before = (lease.metadata.clone(), lease.spec.clone());
        let annotations = lease
            .metadata
            .annotations
            .get_or_insert_with(Default::default);
        annotate(annotations, report, self.by_pod);
        lease
            .metadata
            .labels
            .get_or_insert_with(Default::default)
            .insert(NODE_LABEL.to_string(), self.node.clone());
        let spec = lease.spec.get_or_insert_with(Default::default);
        spec.holder_identity = Some(self.holder.clone());
        spec.lease_duration_seconds = Some(secs(self.period * 3));
        if !renew && (lease.metadata.clone(), lease.spec.clone()) == before {
            return Ok(false);
        }
        lease.spec.get_or_insert_with(Default::default).renew_time = Some(now_micro());
        self.api
            .replace(&self.name, &PostParams::default(), &lease)
            .await?;
        Ok(true)
    }
}

/// Whether this agent runs in Pod `pod` of `namespace` on `node`, with a readiness probe: the
/// kubelet then says whether it is alive, and the agent need not renew its Lease. Says which,
/// and why, in one line.
async fn runs_in_pod(client: &Client, namespace: &str, pod: &str, node: &str) -> bool {
    let api: Api<Pod> = Api::namespaced(client.clone(), namespace);
    // An error may pass, but Forbidden is for good.
    let retry = |r: &Result<Option<Pod>, kube::Error>| match r {
        Err(kube::Error::Api(s)) => s.code != 403,
        r => r.is_err(),
    };
    let mut got = api.get_opt(pod).await;
    for _ in 0..2 {
        if !retry(&got) {
            break;
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
        got = api.get_opt(pod).await;
    }
    let why_not = match got {
        Err(e) => {
            warn!(error = %e, "cannot read this agent's Pod {namespace}/{pod} (RBAC: get pods, as manifests/base/rbac.yaml grants): renewing the heartbeat Lease every period");
            return false;
        }
        Ok(None) => format!("no Pod {namespace}/{pod}"),
        Ok(Some(p)) => {
            let spec = p.spec.unwrap_or_default();
            if spec.node_name.as_deref() != Some(node) {
                format!("Pod {namespace}/{pod} is not on node {node}")
            } else if !spec.containers.iter().any(|c| c.readiness_probe.is_some()) {
                format!("Pod {namespace}/{pod} has no readiness probe")
            } else {
                info!(pod, "in a Pod with a readiness probe: the heartbeat Lease is written when it changes, and renewed only while the kubelet does not answer");
                return true;
            }
        }
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
    use nodelb_core::vocab::Families;

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
}
