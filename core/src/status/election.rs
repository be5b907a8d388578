//! Leader election on the Lease `nodelb-status`, as client-go does it, as a pure state machine:
//! the caller reads the Lease, asks what to do, does it, and reports the result. Time is an
//! input (a monotonic instant), so every rule is tested without sleeping.
//!
//! - A Lease held by someone else is taken over only once its record has not changed for a
//!   whole lease duration, as observed on this process's own clock (clock skew between nodes
//!   does not matter).
//! - The holder renews every retry period; if it cannot renew for the renew deadline, it stops
//!   leading before its lease can expire, so two leaders never overlap.
//! - On shutdown the holder releases the Lease so the next agent takes over at once.

use k8s_openapi::api::coordination::v1::Lease;
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
    pub renew_time: Option<String>,
    pub transitions: i32,
}

impl Record {
    pub fn of(lease: &Lease) -> Record {
        let spec = lease.spec.as_ref();
        Record {
            holder: spec
                .and_then(|s| s.holder_identity.clone())
                .unwrap_or_default(),
            renew_time: spec
                .and_then(|s| s.renew_time.as_ref())
                .map(|t| t.0.to_string()),
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
    /// Ours: renew it.
    Renew,
    /// Someone else holds it and it is fresh.
    Wait,
}

#[derive(Clone, Debug)]
pub struct Election {
    pub me: String,
    pub params: Params,
    observed: Option<(Record, Instant)>,
    last_renew: Option<Instant>,
    leading: bool,
}

impl Election {
    pub fn new(me: impl Into<String>, params: Params) -> Election {
        Election {
            me: me.into(),
            params,
            observed: None,
            last_renew: None,
            leading: false,
        }
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
            return Action::Renew;
        }
        let since = self.observed.as_ref().map(|(_, t)| *t).unwrap_or(now);
        if record.holder.is_empty() || now.duration_since(since) >= self.params.lease_duration {
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
    fn a_missing_lease_is_created_and_a_free_one_taken() {
        let t0 = Instant::now();
        let mut e = Election::new("a", params());
        assert_eq!(e.observe(None, t0), Action::Create);
        assert_eq!(e.observe(Some(&lease("", T1)), t0), Action::Acquire);
        assert!(!e.leading());
        e.succeeded(t0);
        assert!(e.leading());
        assert_eq!(e.observe(Some(&lease("a", T1)), t0), Action::Renew);
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
