//! Readiness: whether this node's agent is applying the cluster now, not only whether its
//! process runs. One pure judgement over what the agent knows and how old each part of it is;
//! `/readyz` answers with it (so the kubelet's probe, the Pod's Ready condition and the node's
//! place in every Service's status follow it), and the heartbeat reads it.
//!
//! An agent is ready when its watches have listed, its last sync committed, every enabled
//! family forwards, and none of these has gone on for longer than its bound:
//! - a change a watch delivered has waited for its commit (the sync loop or the kernel is
//!   stuck, or every sync fails): `--max-change-wait`, as kube-proxy's `/healthz` fails once a
//!   queued change has waited too long;
//! - a watch of the agent's inputs has had no stream open (the API server cannot be reached,
//!   or a connection died and no new one answers): `--max-view-age`;
//! - the kernel actor has not answered a request: `--max-kernel-wait`.
//!
//! A watch that had no stream for longer than its bound is listed again when it can be,
//! and the agent is not ready until what that list says is committed: a watch that resumes
//! after a partition hands over what it missed with no sign of when it is done, a list ends
//! with one. Past any of these bounds the agent is *behind* the cluster: its rules may send
//! traffic where the cluster no longer has it, so its heartbeat gives it no grace (see
//! [`Verdict::behind`]).
//!
//! The ages are the caller's, taken on its own monotonic clock; nothing here reads a clock.

use crate::vocab::IpFamily;
use std::fmt::Write as _;
use std::time::Duration;

/// How long each part may lag before the agent is not ready.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Bounds {
    /// `--max-change-wait`: a delivered change waiting for its commit.
    pub change: Duration,
    /// `--max-view-age`: a watch of the agent's inputs without a stream open.
    pub view: Duration,
    /// `--max-kernel-wait`: the kernel actor's oldest unanswered request.
    pub kernel: Duration,
}

impl Default for Bounds {
    fn default() -> Bounds {
        Bounds {
            change: Duration::from_secs(10),
            view: Duration::from_secs(20),
            kernel: Duration::from_secs(10),
        }
    }
}

/// How the last sync ended.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum LastSync {
    /// None yet.
    #[default]
    None,
    Committed,
    /// It failed, with the error.
    Failed(String),
}

/// What readiness depends on, as the agent knows it at one instant.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Signals {
    /// Every watch has listed once.
    pub caches_synced: bool,
    pub last_sync: LastSync,
    /// Each enabled family and why it is not programmed (`None`: forwarding and programmed).
    pub families: Vec<(IpFamily, Option<String>)>,
    /// What does not make the node unready but an operator should know (foreign forward
    /// policies that drop).
    pub notes: Vec<String>,
    /// How long the oldest change a watch delivered has waited for a commit (`None`: none
    /// waits).
    pub change_waiting: Option<Duration>,
    /// Each watch of the agent's inputs without a stream open, and for how long.
    pub views: Vec<(String, Duration)>,
    /// How long the kernel actor's oldest unanswered request has waited (`None`: none).
    pub kernel_waiting: Option<Duration>,
    /// Each watch listing again after its stream was gone too long, whose list is not
    /// committed yet, and for how long it has been.
    pub catching_up: Vec<(String, Duration)>,
}

/// The judgement: ready or not, and what is missing.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Verdict {
    pub ready: bool,
    /// Unready because the rules may lag the cluster past a bound (a change waiting, a watch
    /// without a stream, a list after one not committed, the kernel not answering), not for a
    /// passing failure: a node that is behind gets no grace.
    pub behind: bool,
    /// What keeps the agent from being ready, one line each.
    pub missing: Vec<String>,
    pub notes: Vec<String>,
}

impl Verdict {
    /// `/readyz`'s body: `ready`, or `not ready:` and what is missing, then the notes.
    pub fn body(&self) -> String {
        let mut body = if self.missing.is_empty() {
            "ready\n".to_string()
        } else {
            let mut b = "not ready:\n".to_string();
            for m in &self.missing {
                let _ = writeln!(b, "- {m}");
            }
            b
        };
        for n in &self.notes {
            let _ = writeln!(body, "note: {n}");
        }
        body
    }

    /// What is missing, on one line.
    pub fn summary(&self) -> String {
        self.missing.join("; ")
    }
}

/// Judge `s` against `b`.
pub fn judge(s: &Signals, b: &Bounds) -> Verdict {
    let mut missing = Vec::new();
    if !s.caches_synced {
        missing.push("watch caches not synced yet".to_string());
    }
    match &s.last_sync {
        LastSync::Committed => {}
        LastSync::None => missing.push("no sync committed yet".to_string()),
        LastSync::Failed(e) => missing.push(format!("last sync not committed: {e}")),
    }
    for (f, why) in &s.families {
        if let Some(why) = why {
            missing.push(format!("{f}: {why}"));
        }
    }
    // What follows is lag past a bound.
    let before = missing.len();
    if let Some(waited) = s.change_waiting.filter(|w| *w > b.change) {
        missing.push(format!(
            "a change from the API has waited {} for its commit (--max-change-wait {})",
            secs(waited),
            secs(b.change)
        ));
    }
    // Before the first list the caches say it; a view is judged once they have listed.
    if s.caches_synced {
        for (what, age) in s.views.iter().filter(|(_, age)| *age > b.view) {
            missing.push(format!(
                "no watch of {what} has been open for {} (--max-view-age {}): this agent does not hear the API server",
                secs(*age),
                secs(b.view)
            ));
        }
    }
    if s.caches_synced {
        for (what, age) in &s.catching_up {
            missing.push(format!(
                "listing {what} again after its watch was gone (for {}): not caught up with the API server yet",
                secs(*age)
            ));
        }
    }
    if let Some(waited) = s.kernel_waiting.filter(|w| *w > b.kernel) {
        missing.push(format!(
            "the kernel actor has not answered for {} (--max-kernel-wait {})",
            secs(waited),
            secs(b.kernel)
        ));
    }
    let behind = missing.len() > before;
    Verdict {
        ready: missing.is_empty(),
        behind,
        missing,
        notes: s.notes.clone(),
    }
}

/// A duration as a log line says it: seconds with one decimal.
fn secs(d: Duration) -> String {
    format!("{:.1}s", d.as_secs_f64())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ready() -> Signals {
        Signals {
            caches_synced: true,
            last_sync: LastSync::Committed,
            families: vec![(IpFamily::V4, None)],
            ..Signals::default()
        }
    }

    fn s(n: u64) -> Duration {
        Duration::from_secs(n)
    }

    #[test]
    fn a_new_agent_says_what_it_waits_for() {
        let v = judge(&Signals::default(), &Bounds::default());
        assert!(!v.ready);
        assert!(!v.behind, "nothing lags yet");
        assert_eq!(
            v.body(),
            "not ready:\n- watch caches not synced yet\n- no sync committed yet\n"
        );
    }

    #[test]
    fn a_synced_agent_is_ready_and_keeps_its_notes() {
        let mut sig = ready();
        sig.notes
            .push("table inet fw chain FORWARD has policy drop".into());
        let v = judge(&sig, &Bounds::default());
        assert!(v.ready, "{v:?}");
        assert_eq!(
            v.body(),
            "ready\nnote: table inet fw chain FORWARD has policy drop\n"
        );
    }

    #[test]
    fn a_failed_sync_or_a_family_that_cannot_forward_is_not_ready() {
        let mut sig = ready();
        sig.last_sync = LastSync::Failed("EPERM".into());
        sig.families
            .push((IpFamily::V6, Some("forwarding is off".into())));
        let v = judge(&sig, &Bounds::default());
        assert_eq!(
            v.missing,
            ["last sync not committed: EPERM", "IPv6: forwarding is off"]
        );
        assert!(!v.behind, "a passing failure: the heartbeat's grace holds");
    }

    #[test]
    fn a_change_waiting_longer_than_its_bound_makes_the_agent_unready() {
        let b = Bounds::default();
        let mut sig = ready();
        sig.change_waiting = Some(b.change);
        assert!(judge(&sig, &b).ready, "at the bound: still ready");
        sig.change_waiting = Some(b.change + Duration::from_millis(100));
        let v = judge(&sig, &b);
        assert!(!v.ready);
        assert!(v.behind);
        assert!(v.missing[0].contains("--max-change-wait 10.0s"), "{v:?}");
    }

    #[test]
    fn a_watch_without_a_stream_for_longer_than_its_bound_makes_the_agent_unready() {
        let b = Bounds::default();
        let mut sig = ready();
        sig.views = vec![("services".into(), s(3)), ("endpointslices".into(), s(21))];
        let v = judge(&sig, &b);
        assert!(!v.ready);
        assert!(v.behind);
        assert_eq!(v.missing.len(), 1, "{v:?}");
        assert!(
            v.missing[0].starts_with("no watch of endpointslices has been open for 21.0s"),
            "{v:?}"
        );
        // Before the first list, the caches say it, not the views.
        sig.caches_synced = false;
        assert_eq!(
            judge(&sig, &b).missing,
            ["watch caches not synced yet"],
            "one line for one cause"
        );
    }

    #[test]
    fn a_kernel_actor_that_does_not_answer_makes_the_agent_unready() {
        let b = Bounds::default();
        let mut sig = ready();
        sig.kernel_waiting = Some(s(9));
        assert!(judge(&sig, &b).ready);
        sig.kernel_waiting = Some(s(11));
        let v = judge(&sig, &b);
        assert!(v.behind);
        assert_eq!(
            v.summary(),
            "the kernel actor has not answered for 11.0s (--max-kernel-wait 10.0s)"
        );
    }

    #[test]
    fn a_list_after_a_lost_watch_keeps_the_agent_unready_until_it_is_committed() {
        let b = Bounds::default();
        let mut sig = ready();
        sig.catching_up = vec![("endpointslices".into(), Duration::from_millis(1500))];
        let v = judge(&sig, &b);
        assert!(!v.ready && v.behind, "{v:?}");
        assert_eq!(
            v.summary(),
            "listing endpointslices again after its watch was gone (for 1.5s): not caught up with the API server yet"
        );
        sig.catching_up.clear();
        assert!(judge(&sig, &b).ready);
    }
}
