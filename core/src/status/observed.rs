//! What the serving candidates' planners say of one Service, gathered class by class: a class
//! is judged once for all its members, and only the members running endpoints of a `Local`
//! Service one by one. What is gathered is what a per-node look would gather (the property
//! test in `tests_classes.rs` holds it to that), kept in a size that does not grow with the
//! number of nodes but where the status names nodes (the nodes where a port was lost). The
//! classes' planners do not know which process holds a port a host listener took: each node's
//! own heartbeat names it.

use super::classes::Classes;
use super::condition;
use super::local::LocalEndpoints;
use super::NodeProcess;
use crate::plan::conflicts::Slot;
use crate::plan::diagnosis::{FamilyState, NotServed, PortResult, ServiceOutcome};
use crate::plan::service::TrafficPolicy;
use crate::vocab::{IpFamily, Listener, Protocol, ServiceKey, ServicePortId};
use std::collections::{BTreeMap, BTreeSet};

/// What the status of a Service is made of, besides who serves it.
#[derive(Debug, Default)]
pub struct Gathered {
    /// Ports lost to an older Service: the nodes where each was lost.
    pub conflicts: BTreeMap<(Protocol, u16, ServiceKey), Vec<String>>,
    /// Ports held by host listeners: the nodes (with the process) where each is held.
    pub listeners: BTreeMap<(Protocol, u16), BTreeSet<NodeProcess>>,
    /// Why the nodes that are not serving nodes of it are not.
    pub other: BTreeSet<String>,
    pub condition: condition::Seen,
}

/// The candidates serving a Service in one family: whole classes, and single candidates.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct Servers {
    /// Ascending.
    pub classes: Vec<usize>,
    /// Ascending.
    pub nodes: Vec<usize>,
}

/// Who serves a Service, family by family in `spec.ipFamilies` order: what its published
/// addresses are made of. Services with the same share one list of addresses.
pub type IngressKey = Vec<(IpFamily, Servers)>;

/// A Service as the candidates see it.
pub struct Observed<'c> {
    classes: &'c Classes,
    serving: BTreeMap<IpFamily, Servers>,
    pub gathered: Gathered,
}

/// Candidates that get the same outcome for a Service: the members of a class but `except`,
/// or one candidate (`class: None`).
struct Group<'a> {
    class: Option<usize>,
    members: &'a [usize],
    except: &'a [usize],
}

impl Group<'_> {
    fn count(&self) -> usize {
        self.members.len() - self.except.len()
    }

    /// In name order.
    fn nodes(&self) -> impl Iterator<Item = usize> + '_ {
        self.members
            .iter()
            .copied()
            .filter(|i| self.except.binary_search(i).is_err())
    }
}

/// What one outcome makes of the candidates that have it.
#[derive(Debug, Default)]
struct Verdict {
    /// The families in which they serve the Service.
    serving: Vec<IpFamily>,
    /// Why they do not serve it (none when they do).
    why_not: Option<Why>,
    /// The ports they lost, and to whom.
    conflicts: Vec<(Protocol, u16, ServiceKey)>,
    /// The (family, protocol, port)s host listeners took there.
    in_use: Vec<Slot>,
    /// They forward to an endpoint.
    any_endpoint: bool,
    /// Why they are not serving nodes of it, when that is not a port's doing.
    other: Option<String>,
    namespace_denied: bool,
    invalid: bool,
    /// They carry the exclusion label: no Service's candidates, so the condition neither
    /// counts nor names them (a node joining excluded rewrites no status).
    excluded: bool,
}

/// Why candidates with the same outcome do not serve a Service.
#[derive(Debug)]
enum Why {
    /// The same for each of them.
    Said(String),
    /// A host listener holds one of its ports there, as the class's planner saw it: each
    /// node's own process holds it.
    InUse {
        family: IpFamily,
        port: ServicePortId,
        listener: Listener,
    },
}

/// Why a node does not serve a Service whose `port` a host listener took there.
pub fn in_use(port: &ServicePortId, listener: &Listener) -> String {
    format!(
        "port {}/{} in use on the node by {listener}",
        port.port, port.protocol
    )
}

/// Gather what the classes' planners (and for a `Local` Service, `local`) say of `key`.
pub fn observe<'c>(
    classes: &'c Classes,
    key: &ServiceKey,
    policy: TrafficPolicy,
    local: Option<&LocalEndpoints>,
) -> Observed<'c> {
    let mut seen = Observed {
        classes,
        serving: BTreeMap::new(),
        gathered: Gathered {
            condition: condition::Seen {
                candidates: classes.candidates.len(),
                ..Default::default()
            },
            ..Default::default()
        },
    };
    // The candidates running endpoints of a Local Service, by class.
    let mut apart: BTreeMap<usize, Vec<usize>> = BTreeMap::new();
    for node in local.into_iter().flat_map(LocalEndpoints::nodes) {
        if let Some(i) = classes.index_of(node) {
            apart.entry(classes.class_of[i]).or_default().push(i);
        }
    }
    for (id, class) in classes.classes.iter().enumerate() {
        let Some(outcome) = class.planner.outcome(key) else {
            continue;
        };
        let except = apart.get_mut(&id).map(|v| {
            v.sort_unstable();
            &v[..]
        });
        let except = except.unwrap_or_default();
        for i in except {
            let name = classes.name(*i);
            let v = verdict(outcome, policy, local.map(|l| (l, Some(name))));
            seen.add(
                Group {
                    class: None,
                    members: std::slice::from_ref(i),
                    except: &[],
                },
                &v,
            );
        }
        let v = verdict(outcome, policy, local.map(|l| (l, None)));
        seen.add(
            Group {
                class: Some(id),
                members: &class.members,
                except,
            },
            &v,
        );
    }
    seen
}

impl Observed<'_> {
    fn add(&mut self, group: Group<'_>, v: &Verdict) {
        let count = group.count();
        if count == 0 {
            return;
        }
        for family in &v.serving {
            let s = self.serving.entry(*family).or_default();
            match group.class.filter(|_| group.except.is_empty()) {
                Some(class) => s.classes.push(class),
                None => s.nodes.extend(group.nodes()),
            }
        }
        let seen = &mut self.gathered.condition;
        if v.excluded {
            seen.candidates -= count;
        }
        if !v.serving.is_empty() {
            seen.serving += count;
        }
        seen.any_endpoint |= v.any_endpoint;
        seen.namespace_denied |= v.namespace_denied;
        seen.invalid |= v.invalid;
        let classes = self.classes;
        let name = |i: usize| classes.name(i);
        let process = |i: usize, slot: Slot| classes.candidates[i].blocked.process(&slot);
        match &v.why_not {
            Some(Why::Said(why)) => seen.why_not.add(group.nodes().map(name), count, why),
            Some(Why::InUse {
                family,
                port,
                listener,
            }) => {
                let slot = (*family, port.protocol, port.port);
                let each = group.nodes().map(|i| {
                    let process = process(i, slot).map(String::from);
                    let theirs = Listener {
                        process,
                        ..listener.clone()
                    };
                    (name(i), in_use(port, &theirs))
                });
                seen.why_not.add_each(each, count);
            }
            None => {}
        }
        for c in &v.conflicts {
            let nodes = self.gathered.conflicts.entry(c.clone()).or_default();
            nodes.extend(group.nodes().map(|i| name(i).to_string()));
        }
        for slot in &v.in_use {
            let nodes = self.gathered.listeners.entry((slot.1, slot.2)).or_default();
            nodes.extend(
                group
                    .nodes()
                    .map(|i| (name(i).to_string(), process(i, *slot).map(String::from))),
            );
        }
        if let Some(o) = &v.other {
            self.gathered.other.insert(o.clone());
        }
    }

    /// Who serves the Service in each of `families`, in that order.
    pub fn ingress_key(&mut self, families: &[IpFamily]) -> IngressKey {
        families
            .iter()
            .map(|f| {
                let mut s = self.serving.remove(f).unwrap_or_default();
                s.nodes.sort_unstable();
                (*f, s)
            })
            .collect()
    }
}

/// What an outcome makes of the candidates that have it; for a `Local` Service, `local` says
/// what one of them (`Some(name)`) or those running none of its endpoints (`None`) get for each
/// port the planner gave rules (a port lost in a conflict is lost on every node of a class).
fn verdict(
    outcome: &ServiceOutcome,
    policy: TrafficPolicy,
    local: Option<(&LocalEndpoints, Option<&str>)>,
) -> Verdict {
    let mut v = Verdict::default();
    match outcome {
        ServiceOutcome::ReservedPorts { .. } => {}
        ServiceOutcome::Served { families } => {
            for f in families {
                let FamilyState::Served { ports, .. } = &f.state else {
                    continue;
                };
                let mut serves = false;
                for p in ports {
                    let result = match local {
                        Some((l, node)) if p.result.is_programmed() => l
                            .result(node, (f.family, p.port.protocol, p.port.port))
                            .unwrap_or(&p.result),
                        _ => &p.result,
                    };
                    serves |= v.port(policy, f.family, &p.port, result);
                }
                if serves {
                    v.serving.push(f.family);
                }
            }
            if !v.serving.is_empty() {
                v.why_not = None;
            }
        }
        ServiceOutcome::NamespaceNotAllowed => v.namespace_denied = true,
        ServiceOutcome::InvalidName | ServiceOutcome::NoValidPorts => v.invalid = true,
        o @ ServiceOutcome::NotServed(NotServed::ExcludedByLabel) => {
            v.excluded = true;
            v.other = Some(o.to_string());
        }
        o => {
            let why = o.to_string();
            v.why_not = Some(Why::Said(why.clone()));
            v.other = Some(why);
        }
    }
    v
}

impl Verdict {
    /// One port's result: whether it makes the candidates serve the Service; the first reason
    /// it does not goes to `why_not`.
    fn port(
        &mut self,
        policy: TrafficPolicy,
        family: IpFamily,
        port: &ServicePortId,
        result: &PortResult,
    ) -> bool {
        let cluster = policy == TrafficPolicy::Cluster;
        match result {
            PortResult::Conflict { holder } => {
                self.why_not.get_or_insert_with(|| {
                    Why::Said(format!(
                        "port {}/{} held by {holder}",
                        port.port, port.protocol
                    ))
                });
                self.conflicts
                    .push((port.protocol, port.port, holder.clone()));
                false
            }
            PortResult::HostListener { listener } => {
                self.why_not.get_or_insert_with(|| Why::InUse {
                    family,
                    port: port.clone(),
                    listener: listener.clone(),
                });
                self.in_use.push((family, port.protocol, port.port));
                false
            }
            PortResult::Forwards { terminating, .. } => {
                let serves = cluster || !*terminating;
                self.any_endpoint |= serves;
                serves
            }
            PortResult::RejectsNoEndpoints => cluster,
            // The family's lost port (a `Conflict` or `HostListener` beside it) says why.
            PortResult::Withheld { .. } => false,
            PortResult::DropsNoLocalEndpoint { .. } => {
                self.why_not.get_or_insert_with(|| {
                    Why::Said("no ready endpoint on the node (externalTrafficPolicy Local)".into())
                });
                false
            }
        }
    }
}
