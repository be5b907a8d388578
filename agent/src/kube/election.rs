//! Leader election on the Lease `nodelb-status` in the agent's namespace (see
//! `status::election` for the rules).
//!
//! Every agent is a candidate, and every candidate WATCHES the Lease instead of reading it
//! every retry period: at 5,000 nodes a GET every 2 s per agent would be 2,500 quorum reads a
//! second; a watch is one request per agent per [`watching::LIFETIME`], and the server sends
//! each renewal to every candidate from its watch cache. A candidate decides on each renewal it
//! hears and every [`CANDIDATE_TICK`]; when the holder falls silent for a lease duration (or
//! releases the Lease), each candidate waits a jitter of its own (up to one retry period,
//! [`jitter`]) and writes the Lease with the resourceVersion it last saw, so one write wins and
//! the others' conflicts end as soon as the winner's record reaches them. Only the leader writes
//! at steady state: a renewal every retry period.
//!
//! The Lease also carries what the leader asks of agents in Pods
//! ([`HEARTBEAT_RENEWAL_ANNOTATION`]): when it cannot read their Pods, it asks them to renew
//! their heartbeats themselves, slowly. The leader writes it with its renewals; every
//! candidate reads it from its watch.

use super::watching::{self, Retry};
use crate::metrics::Metrics;
use futures::StreamExt;
use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, PostParams};
use kube::runtime::watcher::{self, Event};
use kube::runtime::WatchStreamExt;
use kube::Client;
use nodelb_core::status::election::{Action, Election, Params, Takeover, LEASE_NAME};
use nodelb_core::status::heartbeat::HEARTBEAT_RENEWAL_ANNOTATION;
use std::hash::{Hash, Hasher};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::watch;
use tracing::{debug, info, info_span, warn, Instrument};

/// How often a candidate looks at the Lease as last heard, between renewals.
const CANDIDATE_TICK: Duration = Duration::from_millis(500);

fn now_micro() -> MicroTime {
    MicroTime(Timestamp::now())
}

pub(super) fn secs(d: Duration) -> i32 {
    i32::try_from(d.as_secs().max(1)).unwrap_or(i32::MAX)
}

/// This candidate's jitter: a fixed share of one retry period, from its identity.
pub fn jitter(me: &str, retry_period: Duration) -> Duration {
    let mut h = std::collections::hash_map::DefaultHasher::new();
    me.hash(&mut h);
    retry_period.mul_f64((h.finish() % 1000) as f64 / 1000.0)
}

/// What the election tells the rest of the agent, and what it is told.
pub struct Links {
    /// Whether this agent leads.
    pub leading: watch::Sender<bool>,
    /// When this agent took the Lease over from a holder that fell silent: what it saw last of
    /// it (set before `leading` turns true).
    pub takeover: watch::Sender<Option<Takeover>>,
    /// What the leader asks of agents in Pods, as the Lease says: renew the heartbeat every
    /// this long (`None`: only when it changes).
    pub asked: watch::Sender<Option<Duration>>,
    /// What this agent asks while it leads (the status writer decides).
    pub ask: watch::Receiver<Option<Duration>>,
}

/// The Lease as last heard: `None` before the watch first listed.
type Heard = Option<Option<Lease>>;

/// Run the election until `stop`; on stop, a leader releases the Lease.
pub async fn elect(
    client: Client,
    namespace: String,
    me: String,
    params: Params,
    mut links: Links,
    metrics: Arc<Metrics>,
    mut stop: watch::Receiver<bool>,
) {
    let api: Api<Lease> = Api::namespaced(client, &namespace);
    let (heard_tx, mut heard) = watch::channel::<Heard>(None);
    let watching = tokio::spawn(
        listen(api.clone(), heard_tx.clone()).instrument(info_span!("watch", resource = "lease")),
    );
    let elector = Elector {
        api,
        namespace,
        me: me.clone(),
        params,
        metrics,
    };
    let mut e = Election::new(me.clone(), params).with_jitter(jitter(&me, params.retry_period));
    async {
        loop {
            let current = heard.borrow_and_update().clone();
            if let Some(current) = current {
                if let Some(written) = elector.turn(&mut e, current.as_ref(), &mut links).await {
                    // The next renewal starts from what was written, not from the echo.
                    heard_tx.send_replace(Some(Some(written)));
                    heard.borrow_and_update();
                }
            }
            let wait = if e.leading() {
                params.retry_period
            } else {
                CANDIDATE_TICK
            };
            tokio::select! {
                _ = stop.wait_for(|s| *s) => break,
                _ = tokio::time::sleep(wait) => {}
                r = heard.changed() => if r.is_err() { break },
                Ok(()) = links.ask.changed(), if e.leading() => {}
            }
        }
        if e.leading() {
            links.leading.send_replace(false);
            elector.metrics.leader.set(0);
            let current = heard.borrow().clone().flatten();
            match elector.release(current).await {
                Ok(()) => info!("released the Lease {LEASE_NAME}"),
                Err(err) => warn!(error = %err, "could not release the Lease {LEASE_NAME}"),
            }
            e.released();
        }
    }
    .instrument(info_span!("election"))
    .await;
    watching.abort();
}

/// Watch the Lease (by name) and say what it is after each event: `Some(None)` once listed
/// without it.
async fn listen(api: Api<Lease>, heard: watch::Sender<Heard>) {
    let config = watching::config().fields(&format!("metadata.name={LEASE_NAME}"));
    let stream = watcher::watcher(api, config).backoff(Retry::default());
    let mut stream = std::pin::pin!(stream);
    let mut listing: Option<Lease> = None;
    while let Some(ev) = stream.next().await {
        match ev {
            Ok(Event::Init) => listing = None,
            Ok(Event::InitApply(l)) => listing = Some(l),
            Ok(Event::InitDone) => {
                heard.send_replace(Some(listing.take()));
            }
            Ok(Event::Apply(l)) => {
                heard.send_replace(Some(Some(l)));
            }
            Ok(Event::Delete(_)) => {
                heard.send_replace(Some(None));
            }
            Err(e) => warn!(error = %e, "watch failed; retrying"),
        }
    }
}

/// What the Lease asks of agents in Pods ([`HEARTBEAT_RENEWAL_ANNOTATION`]).
fn asked_of(lease: &Lease) -> Option<Duration> {
    let v = lease
        .metadata
        .annotations
        .as_ref()?
        .get(HEARTBEAT_RENEWAL_ANNOTATION)?;
    humantime::parse_duration(v).ok()
}

/// The I/O side of the election: writes the Lease as the state machine decides.
struct Elector {
    api: Api<Lease>,
    namespace: String,
    me: String,
    params: Params,
    metrics: Arc<Metrics>,
}

impl Elector {
    /// One turn over the Lease as last heard (`None`: there is none): pass on what it asks of
    /// agents in Pods, do what the state machine decides, and tell the rest of the agent
    /// whether it leads. Returns the Lease as written, when it was.
    async fn turn(
        &self,
        e: &mut Election,
        current: Option<&Lease>,
        links: &mut Links,
    ) -> Option<Lease> {
        let asked = current.and_then(asked_of);
        links
            .asked
            .send_if_modified(|a| std::mem::replace(a, asked) != asked);
        if let Some(t) = current.and_then(|l| l.spec.as_ref()?.lease_transitions) {
            self.metrics.lease_transitions.set(i64::from(t));
        }
        let ask = *links.ask.borrow_and_update();
        let was = e.leading();
        let written = match self.step(e, current, ask).await {
            Ok(Some((written, acquired))) => {
                e.succeeded(Instant::now());
                if acquired {
                    links.takeover.send_replace(e.takeover().cloned());
                    info!(holder = %self.me, "acquired the Lease {LEASE_NAME}: writing Service status");
                }
                Some(written)
            }
            Ok(None) => None,
            Err(err) => {
                let still = e.failed(Instant::now());
                // 409: another candidate wrote first, the race the resourceVersion is for;
                // the watch brings its record.
                if matches!(&err, kube::Error::Api(s) if s.code == 409) {
                    debug!(error = %err, leading = still, "election step lost a race");
                } else {
                    warn!(error = %err, leading = still, "election step failed");
                }
                None
            }
        };
        if was && !e.leading() {
            warn!("lost the Lease {LEASE_NAME}: no longer writing Service status");
        }
        self.metrics.leader.set(i64::from(e.leading()));
        links
            .leading
            .send_if_modified(|l| std::mem::replace(l, e.leading()) != e.leading());
        written
    }

    /// Do what the state machine decides from `current`. `Ok(Some((lease, acquired)))`: the
    /// Lease was written (created, acquired or renewed), and says this now; `Ok(None)`: nothing
    /// to do. A leader whose `ask` the Lease does not say yet renews at once.
    async fn step(
        &self,
        e: &mut Election,
        current: Option<&Lease>,
        ask: Option<Duration>,
    ) -> Result<Option<(Lease, bool)>, kube::Error> {
        let now = Instant::now();
        let mut action = e.observe(current, now);
        let mine = current.is_some_and(|l| {
            l.spec.as_ref().and_then(|s| s.holder_identity.as_deref()) == Some(&self.me)
        });
        if action == Action::Wait && mine && e.leading() && current.and_then(asked_of) != ask {
            action = Action::Renew;
        }
        let written = match action {
            Action::Wait => return Ok(None),
            Action::Create => {
                let lease = self.new_lease(ask);
                self.api.create(&PostParams::default(), &lease).await?
            }
            Action::Acquire | Action::Renew => {
                let mut lease = current.cloned().expect("acquire and renew follow a read");
                lease.metadata.managed_fields = None;
                let spec = lease.spec.get_or_insert_with(Default::default);
                if action == Action::Acquire {
                    spec.holder_identity = Some(self.me.clone());
                    spec.acquire_time = Some(now_micro());
                    spec.lease_transitions = Some(spec.lease_transitions.unwrap_or(0) + 1);
                }
                spec.renew_time = Some(now_micro());
                spec.lease_duration_seconds = Some(secs(self.params.lease_duration));
                announce(&mut lease, ask);
                // The resourceVersion last heard makes this a compare-and-swap: 409 if
                // someone else wrote in between.
                self.api
                    .replace(LEASE_NAME, &PostParams::default(), &lease)
                    .await?
            }
        };
        Ok(Some((written, action != Action::Renew)))
    }

    /// The Lease this agent creates when there is none.
    fn new_lease(&self, ask: Option<Duration>) -> Lease {
        let mut lease = Lease {
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
        };
        announce(&mut lease, ask);
        lease
    }

    /// Give the Lease up: empty holder, so a candidate takes over at once. Written over the
    /// Lease as last heard; a conflict means another wrote it already.
    async fn release(&self, current: Option<Lease>) -> Result<(), kube::Error> {
        let Some(mut lease) = current else {
            return Ok(());
        };
        let spec = lease.spec.get_or_insert_with(Default::default);
        if spec.holder_identity.as_deref() != Some(&self.me) {
            return Ok(());
        }
        spec.holder_identity = None;
        spec.lease_duration_seconds = Some(1);
        spec.renew_time = Some(now_micro());
        lease.metadata.managed_fields = None;
        self.api
            .replace(LEASE_NAME, &PostParams::default(), &lease)
            .await
            .map(|_| ())
    }
}

/// Say `ask` on the Lease (or nothing, when there is nothing to ask).
fn announce(lease: &mut Lease, ask: Option<Duration>) {
    let annotations = lease
        .metadata
        .annotations
        .get_or_insert_with(Default::default);
    match ask {
        Some(every) => {
            annotations.insert(
                HEARTBEAT_RENEWAL_ANNOTATION.to_string(),
                humantime::format_duration(every).to_string(),
            );
        }
        None => {
            annotations.remove(HEARTBEAT_RENEWAL_ANNOTATION);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_candidate_has_its_own_jitter_within_one_retry_period() {
        let p = Duration::from_secs(2);
        let all: Vec<Duration> = (0..100)
            .map(|i| jitter(&format!("nodelb-agent-{i:05}"), p))
            .collect();
        assert!(all.iter().all(|j| *j < p));
        assert_eq!(jitter("nodelb-agent-x", p), jitter("nodelb-agent-x", p));
        let distinct: std::collections::BTreeSet<_> = all.iter().collect();
        assert!(distinct.len() > 50, "spread: {distinct:?}");
    }

    #[test]
    fn the_lease_says_what_the_leader_asks_and_nothing_once_it_stops_asking() {
        let mut lease = Lease::default();
        announce(&mut lease, Some(Duration::from_secs(90)));
        assert_eq!(asked_of(&lease), Some(Duration::from_secs(90)));
        assert_eq!(
            lease.metadata.annotations.as_ref().unwrap()[HEARTBEAT_RENEWAL_ANNOTATION],
            "1m 30s"
        );
        announce(&mut lease, None);
        assert_eq!(asked_of(&lease), None);
    }
}
