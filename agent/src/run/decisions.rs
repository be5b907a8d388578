//! The sync loop's small pure decisions: which families to program, which warnings are new,
//! how long to wait after a failure, what to count. Plain data in, plain data out.

use crate::host::sysctl::Forwarding;
use crate::kube::node_events::NodeProblem;
use crate::plan::diagnosis::{ObjectRef, PortResult, ServiceOutcome, Warning};
use crate::vocab::{Families, IpFamily, ServiceKey};
use std::collections::BTreeSet;
use std::time::Duration;

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

/// Counts for metrics: Services with rules here, and endpoints behind their programmed ports.
pub fn programmed_counts<'a>(
    outcomes: impl Iterator<Item = (&'a ServiceKey, &'a ServiceOutcome)>,
) -> (usize, usize) {
    let mut services = 0;
    let mut endpoints = 0;
    for (_, outcome) in outcomes {
        let families = outcome.programmed_families();
        if !families.is_empty() {
            services += 1;
        }
        for f in families {
            for p in outcome.ports(f).unwrap_or_default() {
                if let PortResult::Forwards { endpoints: n, .. } = p.result {
                    endpoints += n;
                }
            }
        }
    }
    (services, endpoints)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plan::diagnosis::ObjectKind;

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
