//! One Service after port conflicts: its outcome on this node and what it owns in each
//! family's table.

use super::cidr::Cidr;
use super::conflicts::{Claims, Slot};
use super::diagnosis::{
    FamilyOutcome, FamilySkip, FamilyState, PortHolder, PortOutcome, PortResult, ServiceOutcome,
};
use super::endpoints::Selection;
use super::prepare::{Context, Prepared, PreparedPort, Stage};
use super::service::{ClientIpAffinity, TrafficPolicy};
use super::slots::{self, Orders};
use super::table::{self, Action, Part, PortProgram};
use crate::vocab::IpFamily;
use crate::vocab::{ServiceKey, ServicePortId};
use std::net::IpAddr;

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Settled {
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

/// The holder of each slot the Service claims, as an outcome recorded it: the holder of a
/// port in conflict or the host listener that took it, else the Service itself (`None`).
pub fn recorded_holder(outcome: &ServiceOutcome, slot: &Slot) -> Option<PortHolder> {
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
        .filter(|p| p.port.protocol == slot.1 && p.port.port == slot.2)
        .find_map(|p| p.result.holder())
}

/// Who holds a slot now: a host listener that takes it, else the oldest Service claiming it.
pub fn holder_now(ctx: &Context, claims: &Claims, slot: &Slot) -> Option<PortHolder> {
    ctx.taken
        .get(slot)
        .map(PortHolder::Listener)
        .or_else(|| claims.holder(slot).cloned().map(PortHolder::Service))
}

/// `holder` says who holds each slot ([`holder_now`], or [`recorded_holder`] of an earlier
/// outcome, which rebuilds that earlier settling: a settled Service is a function of the
/// prepared Service, which holds the addresses serving it, and the slots' holders, so only
/// outcomes are kept between syncs).
/// `tables`: the table content too, each port's endpoints in these slots (see `slots`; a port
/// not listed has them sorted); `None` decides outcomes only (for the status writer, which
/// plans for every node).
pub fn build(
    prep: &Prepared,
    holder: impl Fn(&Slot) -> Option<PortHolder>,
    tables: Option<&Orders>,
) -> Settled {
    let Stage::Ports {
        policy,
        source_ranges,
        affinity,
        families,
        ports,
        ..
    } = &prep.stage
    else {
        let Stage::Done(outcome) = &prep.stage else {
            unreachable!()
        };
        return Settled {
            outcome: outcome.clone(),
            parts: FamilyParts::default(),
        };
    };
    let mut parts = FamilyParts::default();
    let mut outcomes = Vec::new();
    for (family, addresses) in families {
        let addresses = match addresses {
            Ok(a) => a,
            Err(skip) => {
                outcomes.push(FamilyOutcome {
                    family: *family,
                    state: FamilyState::Skipped(*skip),
                });
                continue;
            }
        };
        let program = FamilyProgram {
            key: &prep.key,
            family: *family,
            addresses,
            policy: *policy,
            source_ranges: ranges_of(source_ranges.as_deref(), *family),
            affinity: *affinity,
        };
        let tables = tables.map(|orders| (orders, &mut parts));
        outcomes.push(program.outcome(ports, &holder, tables));
    }
    outcomes.shrink_to_fit();
    Settled {
        outcome: service_outcome(outcomes),
        parts,
    }
}

/// The source ranges that filter `family`'s clients, as kube-proxy splits them
/// (`MapCIDRsByIPFamily`): a family none of the ranges belongs to is not filtered, so a
/// dual-stack Service listing only IPv4 ranges still serves every IPv6 client. (The table
/// ignores the other family's ranges.)
fn ranges_of(ranges: Option<&[Cidr]>, family: IpFamily) -> Option<&[Cidr]> {
    ranges.filter(|r| r.iter().any(|c| IpFamily::of(&c.addr) == family))
}

/// What the Service's ports share in one family's table on this node: the Service, the
/// addresses serving it there, its traffic policy, source ranges and session affinity.
struct FamilyProgram<'a> {
    key: &'a ServiceKey,
    family: IpFamily,
    addresses: &'a [IpAddr],
    policy: TrafficPolicy,
    source_ranges: Option<&'a [Cidr]>,
    affinity: Option<ClientIpAffinity>,
}

impl FamilyProgram<'_> {
    /// The family's outcome, port by port, and (given the Service's `parts`) its ports in the
    /// family's table.
    fn outcome(
        &self,
        ports: &[PreparedPort],
        holder: impl Fn(&Slot) -> Option<PortHolder>,
        mut tables: Option<(&Orders, &mut FamilyParts)>,
    ) -> FamilyOutcome {
        let mine = || ports.iter().filter(|p| p.family == self.family);
        let lost_to = |p: &PreparedPort| {
            holder(&(self.family, p.port.protocol, p.port.port))
                .filter(|h| !matches!(h, PortHolder::Service(w) if w == self.key))
        };
        // All or nothing: the first port lost in this family withholds the others.
        let first_lost = mine().find_map(|p| lost_to(p).map(|h| (p.port.clone(), h)));
        let mut results = Vec::new();
        for p in mine() {
            let result = match (lost_to(p), &first_lost) {
                (Some(PortHolder::Service(holder)), _) => PortResult::Conflict { holder },
                (Some(PortHolder::Listener(listener)), _) => PortResult::HostListener { listener },
                (None, Some((lost, h))) => PortResult::Withheld {
                    lost: lost.clone(),
                    holder: h.clone(),
                },
                (None, None) => {
                    let (result, action) = port_action(&p.selection);
                    if let Some((orders, parts)) = tables.as_mut() {
                        let action = match slots::recorded(orders, self.family, &p.port) {
                            Some(order) => action.in_order(order),
                            None => action,
                        };
                        self.add_port(parts.entry(self.family), &p.port, action);
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
        FamilyOutcome {
            family: self.family,
            state: FamilyState::Served {
                addresses: self.addresses.to_vec(),
                ports: results,
            },
        }
    }

    fn add_port(&self, part: &mut Part, port: &ServicePortId, action: Action) {
        table::add_port(
            part,
            self.family,
            &PortProgram {
                service: self.key,
                port,
                policy: self.policy,
                addresses: self.addresses,
                source_ranges: self.source_ranges,
                affinity: self.affinity,
                action,
            },
        );
    }
}

/// What a port the Service holds does, from the endpoints picked for it.
pub fn port_action(selection: &Selection) -> (PortResult, Action) {
    match selection {
        Selection::Forward {
            endpoints,
            terminating,
            topology,
        } => (
            PortResult::Forwards {
                endpoints: endpoints.len(),
                terminating: *terminating,
                topology: *topology,
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
    }
}

/// The Service's outcome from its families': served in at least one, or in none.
fn service_outcome(outcomes: Vec<FamilyOutcome>) -> ServiceOutcome {
    if outcomes
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
    }
}
