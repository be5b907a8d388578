//! One Service after port conflicts: its outcome on this node and what it owns in each
//! family's table.

use super::conflicts::Slot;
use super::diagnosis::{
    FamilyOutcome, FamilySkip, FamilyState, PortOutcome, PortResult, ServiceOutcome,
};
use super::endpoints::Selection;
use super::prepare::{Context, Prepared, Stage};
use super::table::{self, Action, Part, PortProgram};
use crate::vocab::IpFamily;
use crate::vocab::ServiceKey;

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Fragment {
    pub outcome: ServiceOutcome,
    pub parts: FamilyParts,
}

/// A Service's Part per family: at most two, kept in a small vector (a map would allocate room
/// for eleven Parts per Service).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct FamilyParts(Vec<(IpFamily, Part)>);

impl FamilyParts {
    pub fn get(&self, family: &IpFamily) -> Option<&Part> {
        self.0.iter().find(|(f, _)| f == family).map(|(_, p)| p)
    }

    pub fn into_parts(self) -> impl Iterator<Item = (IpFamily, Part)> {
        self.0.into_iter()
    }

    fn entry(&mut self, family: IpFamily) -> &mut Part {
        let i = match self.0.iter().position(|(f, _)| *f == family) {
            Some(i) => i,
            None => {
                self.0.push((family, Part::default()));
                self.0.len() - 1
            }
        };
        &mut self.0[i].1
    }
}

/// The holder of each slot the Service claims, as an outcome recorded it: the winner of a
/// port in conflict, else the Service itself (`None`).
pub fn recorded_winner<'a>(outcome: &'a ServiceOutcome, slot: &Slot) -> Option<&'a ServiceKey> {
    let ServiceOutcome::Served { families } = outcome else {
        return None;
    };
    families
        .iter()
        .filter(|f| f.family == slot.0)
        .flat_map(|f| match &f.state {
            FamilyState::Served { ports, .. } => ports.as_slice(),
            FamilyState::Skipped(_) => &[],
        })
        .find_map(|p| match &p.result {
            PortResult::Conflict { winner }
                if p.port.protocol == slot.1 && p.port.port == slot.2 =>
            {
                Some(winner)
            }
            _ => None,
        })
}

/// `winner` says who holds each slot (the claims now, or [`recorded_winner`] of an earlier
/// outcome, which rebuilds that earlier fragment: a fragment is a function of the prepared
/// Service, the slots' holders and the context, so only outcomes are kept between syncs).
/// `tables: false` decides outcomes only (for the status writer, which plans for every node).
pub fn build<'k>(
    prep: &Prepared,
    winner: impl Fn(&Slot) -> Option<&'k ServiceKey>,
    ctx: &Context,
    tables: bool,
) -> Fragment {
    let Stage::Ports {
        policy,
        source_ranges,
        families,
        ports,
        ..
    } = &prep.stage
    else {
        let Stage::Done(outcome) = &prep.stage else {
            unreachable!()
        };
        return Fragment {
            outcome: outcome.clone(),
            parts: FamilyParts::default(),
        };
    };
    let key = &prep.key;
    let mut parts = FamilyParts::default();
    let mut outcomes = Vec::new();
    for (family, skip) in families {
        if let Some(skip) = skip {
            outcomes.push(FamilyOutcome {
                family: *family,
                state: FamilyState::Skipped(*skip),
            });
            continue;
        }
        let addresses = &ctx.served[family];
        let mut results = Vec::new();
        for p in ports.iter().filter(|p| p.family == *family) {
            let slot = (*family, p.port.protocol, p.port.port);
            let result = match winner(&slot) {
                Some(w) if w != key => PortResult::Conflict { winner: w.clone() },
                _ => {
                    let (result, action) = match &p.selection {
                        Selection::Forward {
                            endpoints,
                            terminating,
                        } => (
                            PortResult::Forwards {
                                endpoints: endpoints.len(),
                                terminating: *terminating,
                            },
                            Action::Forward(endpoints.clone()),
                        ),
                        Selection::DropNotLocal { elsewhere } => (
                            PortResult::DropsNoLocalEndpoint {
                                elsewhere: elsewhere.len(),
                            },
                            Action::DropExceptNode(elsewhere.clone()),
                        ),
                        Selection::Reject => (PortResult::RejectsNoEndpoints, Action::Reject),
                    };
                    if tables {
                        table::add_port(
                            parts.entry(*family),
                            *family,
                            &PortProgram {
                                service: key,
                                port: &p.port,
                                policy: *policy,
                                addresses,
                                source_ranges: source_ranges.as_deref(),
                                action,
                            },
                        );
                    }
                    result
                }
            };
            results.push(PortOutcome {
                port: p.port.clone(),
                result,
            });
        }
        // Outcomes are kept for every Service: no spare room in their lists.
        results.shrink_to_fit();
        outcomes.push(FamilyOutcome {
            family: *family,
            state: FamilyState::Served {
                addresses: addresses.clone(),
                ports: results,
            },
        });
    }
    outcomes.shrink_to_fit();
    let outcome = if outcomes
        .iter()
        .all(|f| matches!(f.state, FamilyState::Skipped(_)))
    {
        ServiceOutcome::NoServedAddress {
            families: outcomes
                .into_iter()
                .filter_map(|f| match f.state {
                    FamilyState::Skipped(s) => Some((f.family, s)),
                    FamilyState::Served { .. } => None,
                })
                .collect::<Vec<(IpFamily, FamilySkip)>>(),
        }
    } else {
        ServiceOutcome::Served { families: outcomes }
    };
    Fragment { outcome, parts }
}
