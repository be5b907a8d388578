//! Leader election on the Lease `nodelb-status`, as client-go does it, as a pure state machine:
//! the caller reads the Lease, asks what to do, does it, and reports the result. Time is an
//! input (a monotonic instant), so every rule is tested without sleeping.
//!
//! - A Lease held by someone else is taken over only once its record has not changed for a
//!   whole lease duration, as observed on this process's own clock (clock skew between nodes
//!   does not matter), and a free one at once; each candidate waits its own jitter beyond
//!   that, so that the candidates watching the Lease do not all write it in the same instant.
//! - A candidate that takes over from a holder that stopped renewing remembers what it saw
//!   last of that holder ([`Takeover`]): the new leader uses it not to give that holder's
//!   node a fresh grace (`heartbeat::Liveness`).
//! - The holder renews every retry period; if it cannot renew for the renew deadline, it stops
//!   leading before its lease can expire, so two leaders never overlap.
//! - On shutdown the holder releases the Lease so the next agent takes over at once.

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::jiff::Timestamp;
use std::time::{Duration, Instant};

/// The Lease the status writers elect on.
pub const LEASE_NAME: &str = "nodelb-status";

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Params {
    /// `--lease-duration`: how long a record must stand still before others take over.
    pub lease_duration: Duration,
    /// `--renew-deadline`: how long the leader tries to renew before it steps down.
    pub renew_deadline: Duration,
    /// `--retry-period`: how often everyone tries.
    pub retry_period: Duration,
}

/// The parts of the Lease that say who holds it and when it last moved.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Record {
    pub holder: String,
    pub renew_time: Option<Timestamp>,
    pub transitions: i32,
}

impl Record {
    pub fn of(lease: &Lease) -> Record {
        let spec = lease.spec.as_ref();
        Record {
            holder: spec
                .and_then(|s| s.holder_identity.clone())
                .unwrap_or_default(),
            renew_time: spec.and_then(|s| s.renew_time.as_ref()).map(|t| t.0),
            transitions: spec.and_then(|s| s.lease_transitions).unwrap_or(0),
        }
    }
}

/// What to do after reading the Lease.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Action {
    /// No Lease: create it, held by us.
    Create,
    /// Free or expired: take it (a new transition).
    Acquire,
    /// Ours, and a retry period since we last wrote it: renew it.
    Renew,
    /// Someone else holds it and it is fresh, or we renewed it less than a retry period ago.
    Wait,
}

/// What a candidate saw last of the holder it took the Lease over from, once that holder had
/// stopped renewing (none when the Lease was free or released).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Takeover {
    /// The holder's identity (its Pod's name).
    pub holder: String,
    /// Its last `renewTime`, on its own node's clock.
    pub renewed: Option<Timestamp>,
    /// When this candidate first saw that last record (its own clock): the holder has been
    /// silent since then at least.
    pub silent_since: Instant,
    /// The holder's retry period: alive, it would have renewed within this of anything else it
    /// wrote, so what its node wrote up to this after its last renewal is as old as its silence.
    pub margin: Duration,
}

#[derive(Clone, Debug)]
pub struct Election {
    pub me: String,
    pub params: Params,
    /// How long beyond the rules this candidate waits before it takes the Lease.
    jitter: Duration,
    observed: Option<(Record, Instant)>,
    last_renew: Option<Instant>,
    leading: bool,
    /// Set when the last [`Action::Acquire`] takes over from a silent holder.
    takeover: Option<Takeover>,
}

impl Election {
    pub fn new(me: impl Into<String>, params: Params) -> Election {
        Election {
            me: me.into(),
            params,
            jitter: Duration::ZERO,
            observed: None,
            last_renew: None,
            leading: false,
            takeover: None,
        }
    }

    /// This candidate waits `jitter` longer than the rules say before it takes the Lease.
    pub fn with_jitter(mut self, jitter: Duration) -> Election {
        self.jitter = jitter;
        self
    }

    /// What this candidate saw last of the silent holder it is taking the Lease from.
    pub fn takeover(&self) -> Option<&Takeover> {
        self.takeover.as_ref()
    }

    pub fn leading(&self) -> bool {
        self.leading
    }

    /// Decide from the Lease as read at `now` (`None`: it does not exist).
    pub fn observe(&mut self, lease: Option<&Lease>, now: Instant) -> Action {
        let Some(lease) = lease else {
            self.observed = None;
            return Action::Create;
        };
        let record = Record::of(lease);
        match &self.observed {
            Some((r, _)) if *r == record => {}
            _ => self.observed = Some((record.clone(), now)),
        }
        if record.holder == self.me {
            // Ours: renewed once a retry period, however often the record is heard.
            let due = self
                .last_renew
                .is_none_or(|t| now.duration_since(t) >= self.params.retry_period);
            return if due { Action::Renew } else { Action::Wait };
        }
        let since = self.observed.as_ref().map(|(_, t)| *t).unwrap_or(now);
        let still = now.duration_since(since);
        let free = record.holder.is_empty();
        if (free && still >= self.jitter) || still >= self.params.lease_duration + self.jitter {
            self.takeover = (!free).then(|| Takeover {
                holder: record.holder.clone(),
                renewed: record.renew_time,
                silent_since: since,
                margin: self.params.retry_period,
            });
            Action::Acquire
        } else {
            if self.leading {
                // Someone else holds it now: we lost it.
                self.leading = false;
            }
            Action::Wait
        }
    }

    /// The create, acquire or renew succeeded at `now`: we lead.
    pub fn succeeded(&mut self, now: Instant) {
        self.leading = true;
        self.last_renew = Some(now);
    }

    /// The write failed at `now` (conflict, network). A leader that has not renewed within the
    /// renew deadline steps down. Returns whether we still lead.
    pub fn failed(&mut self, now: Instant) -> bool {
        if self.leading
            && self
                .last_renew
                .is_none_or(|t| now.duration_since(t) >= self.params.renew_deadline)
        {
            self.leading = false;
        }
        self.leading
    }

    /// We released the Lease (shutdown).
    pub fn released(&mut self) {
        self.leading = false;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn params() -> Params {
        Params {
            lease_duration: Duration::from_secs(15),
            renew_deadline: Duration::from_secs(10),
            retry_period: Duration::from_secs(2),
        }
    }

    fn lease(holder: &str, renew: &str) -> Lease {
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": LEASE_NAME},
            "spec": {"holderIdentity": holder, "renewTime": renew, "leaseDurationSeconds": 15},
        }))
        .unwrap()
    }

    const T1: &str = "2026-01-01T00:00:01.000000Z";
    const T2: &str = "2026-01-01T00:00:03.000000Z";

    #[test]
    fn a_candidate_waits_its_jitter_beyond_the_rules() {
        let t0 = Instant::now();
        let j = Duration::from_millis(1500);
        let mut e = Election::new("b", params()).with_jitter(j);
        assert_eq!(e.observe(Some(&lease("", T1)), t0), Action::Wait);
        assert_eq!(
            e.observe(Some(&lease("", T1)), t0 + j),
            Action::Acquire,
            "a free Lease after the jitter"
        );
        assert_eq!(e.takeover(), None, "nobody was taken over from");
        let mut e = Election::new("b", params()).with_jitter(j);
        e.observe(Some(&lease("a", T1)), t0);
        let held = t0 + params().lease_duration;
        assert_eq!(e.observe(Some(&lease("a", T1)), held), Action::Wait);
        assert_eq!(e.observe(Some(&lease("a", T1)), held + j), Action::Acquire);
        let took = e.takeover().expect("taken from a silent holder");
        assert_eq!(took.holder, "a");
        assert_eq!(took.renewed, Some(T1.parse().unwrap()));
        assert_eq!(
            took.silent_since, t0,
            "silent since its record was first seen"
        );
    }

    #[test]
    fn a_missing_lease_is_created_and_a_free_one_taken() {
        let t0 = Instant::now();
        let mut e = Election::new("a", params());
        assert_eq!(e.observe(None, t0), Action::Create);
        assert_eq!(e.observe(Some(&lease("", T1)), t0), Action::Acquire);
        assert!(!e.leading());
        e.succeeded(t0);
        assert!(e.leading());
        assert_eq!(
            e.observe(Some(&lease("a", T1)), t0),
            Action::Wait,
            "just written: its echo is no reason to write again"
        );
        assert_eq!(
            e.observe(Some(&lease("a", T1)), t0 + params().retry_period),
            Action::Renew
        );
        assert!(e.leading());
    }

    #[test]
    fn a_held_lease_is_taken_only_after_its_record_stood_still_a_whole_duration() {
        let t0 = Instant::now();
        let mut e = Election::new("b", params());
        assert_eq!(e.observe(Some(&lease("a", T1)), t0), Action::Wait);
        assert_eq!(
            e.observe(Some(&lease("a", T1)), t0 + Duration::from_secs(14)),
            Action::Wait
        );
        // The holder renewed: the clock starts again from this observation.
        assert_eq!(
            e.observe(Some(&lease("a", T2)), t0 + Duration::from_secs(14)),
            Action::Wait
        );
        assert_eq!(
            e.observe(Some(&lease("a", T2)), t0 + Duration::from_secs(28)),
            Action::Wait
        );
        assert_eq!(
            e.observe(Some(&lease("a", T2)), t0 + Duration::from_secs(29)),
            Action::Acquire
        );
    }

    #[test]
    fn a_leader_that_cannot_renew_steps_down_before_its_lease_expires() {
        let t0 = Instant::now();
        let mut e = Election::new("a", params());
        e.observe(None, t0);
        e.succeeded(t0);
        assert!(e.failed(t0 + Duration::from_secs(9)));
        assert!(!e.failed(t0 + Duration::from_secs(10)));
        assert!(!e.leading());
        // renew_deadline < lease_duration: others cannot take over before we stopped.
        assert!(params().renew_deadline < params().lease_duration);
    }

    #[test]
    fn seeing_another_holder_ends_leadership() {
        let t0 = Instant::now();
        let mut e = Election::new("a", params());
        e.observe(None, t0);
        e.succeeded(t0);
        assert_eq!(e.observe(Some(&lease("b", T2)), t0), Action::Wait);
        assert!(!e.leading());
    }
}
