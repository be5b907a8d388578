//! The sync loop's and the kernel actor's small pure decisions: which families to program,
//! which warnings are new, how long to wait after a failure, when a commit replaces the tables
//! whole, what a verify's read-back says and what follows it, what to count. Plain data in,
//! plain data out.

use crate::host::sysctl::Forwarding;
use crate::kube::node_events::NodeProblem;
use nodelb_core::plan::diagnosis::{ObjectRef, PortResult, ServiceOutcome, Warning};
use nodelb_core::plan::topology::{Ignored, Topology};
use nodelb_core::vocab::{Families, IpFamily, ServiceKey};
use std::collections::BTreeSet;
use std::time::{Duration, Instant};

/// Warnings already logged, so each is logged (and counted) once while it lasts.
#[derive(Debug, Default)]
pub struct WarningLog {
    current: BTreeSet<(ObjectRef, String)>,
}

impl WarningLog {
    /// Remember `warnings` as the current set; return those not in the previous one.
    pub fn update<'a>(&mut self, warnings: &'a [Warning]) -> Vec<&'a Warning> {
        let now: BTreeSet<(ObjectRef, String)> = warnings
            .iter()
            .map(|w| (w.object.clone(), w.message.clone()))
            .collect();
        let fresh = warnings
            .iter()
            .filter(|w| {
                !self
                    .current
                    .contains(&(w.object.clone(), w.message.clone()))
            })
            .collect();
        self.current = now;
        fresh
    }
}

/// Exponential backoff after failed syncs: 100 ms doubling to a 5 s cap.
#[derive(Debug, Default)]
pub struct Backoff {
    failures: u32,
}

impl Backoff {
    pub const CAP: Duration = Duration::from_secs(5);

    pub fn next_delay(&mut self) -> Duration {
        let d = Duration::from_millis(100)
            .saturating_mul(1u32.checked_shl(self.failures).unwrap_or(u32::MAX))
            .min(Self::CAP);
        self.failures = self.failures.saturating_add(1);
        d
    }

    pub fn reset(&mut self) {
        self.failures = 0;
    }
}

/// When to sync after a wake (`--sync-debounce`): at once when the loop was idle (the last
/// sync ended at least `debounce` ago), else once `debounce` has passed since it ended, taking
/// whatever else arrived meanwhile. A lone change never waits; in a burst, after its first
/// change's sync, a sync starts one `debounce` after the previous one ended: the cadence of a
/// fixed wait after each wake.
#[derive(Debug)]
pub struct Pacer {
    debounce: Duration,
    last_end: Option<Instant>,
}

impl Pacer {
    pub fn new(debounce: Duration) -> Pacer {
        Pacer {
            debounce,
            last_end: None,
        }
    }

    /// How long a wake at `now` waits before its sync.
    pub fn wait(&self, now: Instant) -> Duration {
        self.last_end
            .map(|end| (end + self.debounce).saturating_duration_since(now))
            .unwrap_or_default()
    }

    /// A sync ended at `at`.
    pub fn synced(&mut self, at: Instant) {
        self.last_end = Some(at);
    }
}

/// What a verify concludes from reading the tables back while commits went on (see
/// [`Verifier`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ResyncVerdict {
    /// The kernel holds what was committed.
    Unchanged,
    /// It does not, and no commit of the agent's ran meanwhile: drift, repaired by a full
    /// replace.
    Drifted(String),
    /// A difference, but the agent committed while the tables were read: the read may have
    /// seen part of a commit. Read again.
    ReadAgain,
    /// As often in a row: check once more with commits held until the read is done.
    Hold,
}

/// Judges read-backs made while commits go on, and remembers how many in a row said nothing
/// certain.
#[derive(Debug, Default)]
pub struct ReadbackJudge {
    inconclusive: u32,
}

impl ReadbackJudge {
    /// Read-backs in a row that may say nothing certain before one holds commits.
    pub const TRIES: u32 = 3;

    /// `difference`: how the tables read back differ from those committed now (`None`: they
    /// match); `committed_meanwhile`: whether the agent committed between the start of the
    /// read and now.
    pub fn judge(
        &mut self,
        difference: Option<String>,
        committed_meanwhile: bool,
    ) -> ResyncVerdict {
        let verdict = match difference {
            None => ResyncVerdict::Unchanged,
            Some(why) if !committed_meanwhile => ResyncVerdict::Drifted(why),
            Some(_) if self.inconclusive + 1 < Self::TRIES => ResyncVerdict::ReadAgain,
            Some(_) => ResyncVerdict::Hold,
        };
        self.inconclusive = match verdict {
            ResyncVerdict::ReadAgain => self.inconclusive + 1,
            _ => 0,
        };
        verdict
    }
}

/// The kernel actor's verify path (see `run::kernel`), as plain bookkeeping: whether a verify
/// reads at all, and what follows a read. A read runs beside the commits on a socket of its
/// own, so a change keeps reaching the kernel meanwhile; what it found is judged against the
/// models as committed when it is done (see [`ReadbackJudge`]). After reads that say nothing
/// certain it is held: read again with commits waiting, which is always conclusive.
#[derive(Debug, Default)]
pub struct Verifier {
    judge: ReadbackJudge,
    /// Commits that sent something, counted.
    commits: u64,
    /// The commit count when the read in flight beside the commits started.
    reading: Option<u64>,
}

/// What follows a read beside the commits.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum AfterRead {
    /// Conclusive: the tables are as committed (`None`) or drifted (why).
    Report(Option<String>),
    /// Start another read beside the commits.
    ReadBeside,
    /// Read now with commits held.
    ReadHeld,
}

impl Verifier {
    /// A commit is done; `sent`: it sent something.
    pub fn committed(&mut self, sent: bool) {
        if sent {
            self.commits += 1;
        }
    }

    /// A verify is asked for: start a read beside the commits, unless one is in flight or no
    /// model is committed (the next commit replaces the tables whole anyway).
    pub fn begin(&mut self, has_models: bool) -> bool {
        if self.reading.is_some() || !has_models {
            return false;
        }
        self.reading = Some(self.commits);
        true
    }

    /// The read in flight did not start or is of no use (the models it was read for are gone).
    pub fn abandon(&mut self) {
        self.reading = None;
    }

    /// The read in flight is done; `difference`: how it differs from the models committed now.
    pub fn read_beside(&mut self, difference: Option<String>) -> AfterRead {
        let at = self.reading.take();
        let meanwhile = at != Some(self.commits);
        match self.judge.judge(difference, meanwhile) {
            ResyncVerdict::Unchanged => AfterRead::Report(None),
            ResyncVerdict::Drifted(why) => AfterRead::Report(Some(why)),
            ResyncVerdict::ReadAgain => {
                self.reading = Some(self.commits);
                AfterRead::ReadBeside
            }
            ResyncVerdict::Hold => AfterRead::ReadHeld,
        }
    }

    /// A read with commits held is done: what drifted, if anything.
    pub fn read_held(&mut self, difference: Option<String>) -> Option<String> {
        match self.judge.judge(difference, false) {
            ResyncVerdict::Drifted(why) => Some(why),
            _ => None,
        }
    }
}

/// Whether a commit replaces the tables whole: when no model is committed (the first commit,
/// or any after a failure), when drift was reported, or when the planner rebuilt its tables.
pub fn replaces_whole(has_models: bool, drift: bool, rebuilt: bool) -> bool {
    !has_models || drift || rebuilt
}

/// Which enabled families can be programmed, and why the others cannot.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FamilyDecision {
    pub programmed: Families,
    /// Each enabled family and why it is not programmed (`None`: it is).
    pub states: Vec<(IpFamily, Option<String>)>,
    pub problems: Vec<NodeProblem>,
}

/// Families are programmed when enabled by flag and forwarding.
pub fn decide_families(
    enabled: Families,
    forwarding: &[(IpFamily, Result<Forwarding, String>)],
) -> FamilyDecision {
    let mut programmed = Families {
        v4: false,
        v6: false,
    };
    let mut states = Vec::new();
    let mut problems = Vec::new();
    for (f, state) in forwarding {
        if !enabled.contains(*f) {
            continue;
        }
        let why = match state {
            Ok(Forwarding::Forwarding) => None,
            Ok(Forwarding::Off { fix }) => {
                problems.push(NodeProblem {
                    reason: "ForwardingOff",
                    note: format!("{f} forwarding is off, so nodelb does not program {f}: run `{fix}` or start the agent with --set-sysctls"),
                });
                Some(format!("forwarding is off (run `{fix}`)"))
            }
            Ok(Forwarding::Absent) => {
                problems.push(NodeProblem {
                    reason: "FamilyAbsent",
                    note: format!(
                        "{f} is enabled but absent on this host; run the agent with --{}=false",
                        if *f == IpFamily::V4 { "ipv4" } else { "ipv6" }
                    ),
                });
                Some("absent on this host".to_string())
            }
            Err(e) => {
                problems.push(NodeProblem {
                    reason: "SysctlUnreadable",
                    note: format!("{f}: {e}"),
                });
                Some(e.clone())
            }
        };
        if why.is_none() {
            match f {
                IpFamily::V4 => programmed.v4 = true,
                IpFamily::V6 => programmed.v6 = true,
            }
        }
        states.push((*f, why));
    }
    FamilyDecision {
        programmed,
        states,
        problems,
    }
}

/// Counts for metrics of what the planner programmed here.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Programmed {
    /// Services with rules here.
    pub services: usize,
    /// Endpoints behind their programmed ports.
    pub endpoints: usize,
    /// Service ports (per family) whose topology hints are ignored here, by reason, in
    /// [`Ignored::ALL`] order.
    pub hints_ignored: [usize; Ignored::ALL.len()],
}

pub fn programmed_counts<'a>(
    outcomes: impl Iterator<Item = (&'a ServiceKey, &'a ServiceOutcome)>,
) -> Programmed {
    let mut out = Programmed::default();
    for (_, outcome) in outcomes {
        let families = outcome.programmed_families();
        if !families.is_empty() {
            out.services += 1;
        }
        for f in families {
            for p in outcome.ports(f).unwrap_or_default() {
                if let PortResult::Forwards {
                    endpoints: n,
                    topology,
                    ..
                } = p.result
                {
                    out.endpoints += n;
                    if let Topology::Ignored(why) = topology {
                        let i = Ignored::ALL.iter().position(|w| *w == why);
                        out.hints_ignored[i.expect("every reason is listed")] += 1;
                    }
                }
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ports_whose_topology_hints_are_ignored_are_counted_by_reason() {
        use nodelb_core::plan::diagnosis::{FamilyOutcome, FamilyState, PortOutcome};
        use nodelb_core::vocab::{Protocol, ServicePortId};
        let port = |n: u16, topology| PortOutcome {
            port: ServicePortId {
                name: None,
                protocol: Protocol::Udp,
                port: n,
            },
            result: PortResult::Forwards {
                endpoints: 2,
                terminating: false,
                topology,
            },
        };
        let served = ServiceOutcome::Served {
            families: vec![FamilyOutcome {
                family: IpFamily::V4,
                state: FamilyState::Served {
                    addresses: vec!["203.0.113.1".parse().unwrap()],
                    ports: vec![
                        port(53, Topology::SameZone),
                        port(54, Topology::Ignored(Ignored::MissingHint)),
                        port(55, Topology::Ignored(Ignored::MissingHint)),
                        port(56, Topology::Ignored(Ignored::NotForThisZone)),
                        port(57, Topology::None),
                    ],
                },
            }],
        };
        let key = ServiceKey::new("default", "dns");
        let p = programmed_counts([(&key, &served)].into_iter());
        assert_eq!((p.services, p.endpoints), (1, 10));
        let at = |why| Ignored::ALL.iter().position(|w| *w == why).unwrap();
        let mut want = [0; Ignored::ALL.len()];
        want[at(Ignored::MissingHint)] = 2;
        want[at(Ignored::NotForThisZone)] = 1;
        assert_eq!(p.hints_ignored, want);
    }

    #[test]
    fn a_read_back_without_commits_meanwhile_is_conclusive() {
        let mut j = ReadbackJudge::default();
        assert_eq!(j.judge(None, false), ResyncVerdict::Unchanged);
        assert_eq!(
            j.judge(Some("chain x is not nodelb's".into()), false),
            ResyncVerdict::Drifted("chain x is not nodelb's".into())
        );
    }

    #[test]
    fn a_match_read_while_committing_is_unchanged() {
        assert_eq!(
            ReadbackJudge::default().judge(None, true),
            ResyncVerdict::Unchanged
        );
    }

    #[test]
    fn a_difference_read_while_committing_is_read_again_then_held() {
        let mut j = ReadbackJudge::default();
        let diff = || Some("set endpoints has 4 elements, expected 5".to_string());
        assert_eq!(j.judge(diff(), true), ResyncVerdict::ReadAgain);
        assert_eq!(j.judge(diff(), true), ResyncVerdict::ReadAgain);
        assert_eq!(j.judge(diff(), true), ResyncVerdict::Hold);
        // The count starts again after any conclusive answer.
        assert_eq!(j.judge(diff(), true), ResyncVerdict::ReadAgain);
        assert_eq!(j.judge(None, true), ResyncVerdict::Unchanged);
        assert_eq!(j.judge(diff(), true), ResyncVerdict::ReadAgain);
        assert_eq!(
            j.judge(diff(), false),
            ResyncVerdict::Drifted("set endpoints has 4 elements, expected 5".into())
        );
        assert_eq!(j.judge(diff(), true), ResyncVerdict::ReadAgain);
    }

    #[test]
    fn a_verify_reads_only_with_models_and_one_read_at_a_time() {
        let mut v = Verifier::default();
        assert!(!v.begin(false), "no model: the next commit replaces whole");
        assert!(v.begin(true));
        assert!(!v.begin(true), "a read is in flight");
        assert_eq!(v.read_beside(None), AfterRead::Report(None));
        assert!(v.begin(true), "the read is done: a new one may start");
        v.abandon();
        assert!(v.begin(true), "an abandoned read is no longer in flight");
    }

    #[test]
    fn a_difference_without_commits_meanwhile_is_drift() {
        let mut v = Verifier::default();
        v.committed(true);
        assert!(v.begin(true));
        // A commit that sent nothing does not make the read uncertain.
        v.committed(false);
        assert_eq!(
            v.read_beside(Some("chain forward has 3 rules, expected 2".into())),
            AfterRead::Report(Some("chain forward has 3 rules, expected 2".into()))
        );
    }

    #[test]
    fn a_difference_read_while_committing_reads_again_then_holds() {
        let mut v = Verifier::default();
        let diff = || Some("set endpoints has 4 elements, expected 5".to_string());
        assert!(v.begin(true));
        v.committed(true);
        assert_eq!(v.read_beside(diff()), AfterRead::ReadBeside);
        assert!(!v.begin(true), "the read again is in flight");
        v.committed(true);
        assert_eq!(v.read_beside(diff()), AfterRead::ReadBeside);
        v.committed(true);
        assert_eq!(v.read_beside(diff()), AfterRead::ReadHeld);
        // Held, commits wait: the read is conclusive either way.
        assert_eq!(v.read_held(diff()), diff());
        assert_eq!(v.read_held(None), None);
        // The uncertain reads are counted again from the start.
        assert!(v.begin(true));
        v.committed(true);
        assert_eq!(v.read_beside(diff()), AfterRead::ReadBeside);
    }

    #[test]
    fn a_read_again_after_commits_stop_is_conclusive() {
        let mut v = Verifier::default();
        assert!(v.begin(true));
        v.committed(true);
        let diff = Some("set ports has 2 elements, expected 3".to_string());
        assert_eq!(v.read_beside(diff.clone()), AfterRead::ReadBeside);
        // No commit while the second read ran: what it found is drift.
        assert_eq!(v.read_beside(diff.clone()), AfterRead::Report(diff));
    }

    #[test]
    fn a_commit_replaces_whole_without_models_after_drift_or_a_rebuild() {
        assert!(!replaces_whole(true, false, false), "edits of the models");
        assert!(replaces_whole(false, false, false), "nothing committed yet");
        assert!(replaces_whole(true, true, false), "drift reported");
        assert!(replaces_whole(true, false, true), "the planner rebuilt");
    }

    /// The loop's timing with sync time `took`: a change arriving at each of `arrivals` wakes
    /// the loop (when it waits for one); the sync starts after the pacer's wait (`adaptive`)
    /// or after a fixed `debounce` (the loop before the pacer), takes every change arrived by
    /// then, and ends `took` later. Returns the number of syncs and each change's time from
    /// arrival to the end of the sync that took it.
    fn simulate(
        arrivals: &[Duration],
        took: Duration,
        debounce: Duration,
        adaptive: bool,
    ) -> (usize, Vec<Duration>) {
        let t0 = Instant::now();
        let mut pacer = Pacer::new(debounce);
        let (mut now, mut next, mut syncs, mut latencies) = (t0, 0, 0, Vec::new());
        while next < arrivals.len() {
            let wake = now.max(t0 + arrivals[next]);
            let start = wake + if adaptive { pacer.wait(wake) } else { debounce };
            let end = start + took;
            while next < arrivals.len() && t0 + arrivals[next] <= start {
                latencies.push(end - (t0 + arrivals[next]));
                next += 1;
            }
            pacer.synced(end);
            syncs += 1;
            now = end;
        }
        (syncs, latencies)
    }

    const MS: Duration = Duration::from_millis(1);

    #[test]
    fn a_lone_change_syncs_at_once() {
        let (debounce, took) = (10 * MS, 2 * MS);
        // The first change, and one long after the last sync.
        let lone = [Duration::ZERO, 1000 * MS];
        let (syncs, latencies) = simulate(&lone, took, debounce, true);
        assert_eq!(syncs, 2);
        assert_eq!(latencies, vec![took, took], "no wait before either sync");
        let (_, before) = simulate(&lone, took, debounce, false);
        assert_eq!(before, vec![debounce + took, debounce + took]);
    }

    #[test]
    fn a_burst_is_coalesced_at_the_cadence_of_a_fixed_wait() {
        let (debounce, took) = (10 * MS, 2 * MS);
        // 1,000 changes, one every millisecond.
        let burst: Vec<Duration> = (0..1000).map(|i| i * MS).collect();
        let (syncs, latencies) = simulate(&burst, took, debounce, true);
        let (before, _) = simulate(&burst, took, debounce, false);
        // The burst's first change is synced at once; after it, one sync per `took + debounce`,
        // the cadence of a fixed wait after each wake.
        assert!(
            syncs <= before + 1,
            "{syncs} syncs against {before} with a fixed wait"
        );
        assert!(
            syncs < burst.len() / 5,
            "coalesced: {syncs} syncs of 1000 changes"
        );
        // No change waits longer than one debounce past the sync in progress, plus its own.
        let worst = latencies.iter().max().unwrap();
        assert!(*worst <= debounce + 2 * took, "worst {worst:?}");
        assert_eq!(latencies.len(), burst.len(), "every change is taken");
    }

    #[test]
    fn a_change_right_after_a_sync_waits_out_the_debounce() {
        let mut p = Pacer::new(10 * MS);
        let t = Instant::now();
        assert_eq!(p.wait(t), Duration::ZERO, "before the first sync");
        p.synced(t);
        assert_eq!(p.wait(t + 4 * MS), 6 * MS);
        assert_eq!(p.wait(t + 10 * MS), Duration::ZERO);
        assert_eq!(p.wait(t + 50 * MS), Duration::ZERO);
    }
    use nodelb_core::plan::diagnosis::ObjectKind;

    #[test]
    fn warnings_are_new_once() {
        let w = |name: &str, msg: &str| {
            Warning::new(ObjectRef::new(ObjectKind::Service, Some("ns"), name), msg)
        };
        let mut log = WarningLog::default();
        let a = [w("a", "bad port"), w("b", "bad selector")];
        assert_eq!(log.update(&a).len(), 2);
        assert_eq!(log.update(&a).len(), 0);
        let b = [w("a", "bad port"), w("b", "other problem")];
        assert_eq!(log.update(&b), vec![&b[1]]);
        assert_eq!(log.update(&[]).len(), 0);
        assert_eq!(
            log.update(&b).len(),
            2,
            "a warning that went away and came back is new"
        );
    }

    #[test]
    fn backoff_doubles_to_the_cap_and_resets() {
        let mut b = Backoff::default();
        let d: Vec<u128> = (0..9).map(|_| b.next_delay().as_millis()).collect();
        assert_eq!(d, vec![100, 200, 400, 800, 1600, 3200, 5000, 5000, 5000]);
        for _ in 0..100 {
            b.next_delay();
        }
        assert_eq!(b.next_delay(), Backoff::CAP);
        b.reset();
        assert_eq!(b.next_delay(), Duration::from_millis(100));
    }

    #[test]
    fn families_need_flag_and_forwarding() {
        let fwd = vec![
            (IpFamily::V4, Ok(Forwarding::Forwarding)),
            (
                IpFamily::V6,
                Ok(Forwarding::Off {
                    fix: "sysctl -w net.ipv6.conf.all.forwarding=1".into(),
                }),
            ),
        ];
        let FamilyDecision {
            programmed: f,
            states,
            problems,
        } = decide_families(Families { v4: true, v6: true }, &fwd);
        assert_eq!(
            f,
            Families {
                v4: true,
                v6: false
            }
        );
        assert_eq!(states[0], (IpFamily::V4, None));
        assert!(states[1]
            .1
            .as_ref()
            .unwrap()
            .contains("sysctl -w net.ipv6.conf.all.forwarding=1"));
        assert_eq!(problems.len(), 1);
        assert_eq!(problems[0].reason, "ForwardingOff");

        let FamilyDecision {
            programmed: f,
            states,
            problems,
        } = decide_families(
            Families {
                v4: true,
                v6: false,
            },
            &fwd,
        );
        assert_eq!(
            f,
            Families {
                v4: true,
                v6: false
            }
        );
        assert_eq!(
            states.len(),
            1,
            "a disabled family is not a readiness condition"
        );
        assert!(problems.is_empty());

        let absent = vec![
            (IpFamily::V4, Ok(Forwarding::Forwarding)),
            (IpFamily::V6, Ok(Forwarding::Absent)),
        ];
        let FamilyDecision {
            programmed: f,
            problems,
            ..
        } = decide_families(Families { v4: true, v6: true }, &absent);
        assert!(!f.v6);
        assert_eq!(problems[0].reason, "FamilyAbsent");
        assert!(problems[0].note.contains("--ipv6=false"));
    }
}
