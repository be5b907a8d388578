//! The pure planner: from Services, EndpointSlices, this node and its addresses to netfilter
//! tables, plus what happened to each Service and what was wrong with the input.
//!
//! `plan()` walks DESIGN.md's "What a Service gets" in order: class and namespace, ports,
//! reserved ports, serving node, served addresses per family, endpoints and traffic policy,
//! then port conflicts on this node (oldest wins), then the tables.

pub mod config;
pub mod conflicts;
pub mod diagnosis;
pub mod endpoints;
pub mod node;
pub mod selector;
pub mod service;
pub mod table;

#[cfg(test)]
mod tests;

use std::net::IpAddr;

/// An IP family as Kubernetes names it (`spec.ipFamilies`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum IpFamily {
    V4,
    V6,
}

impl IpFamily {
    pub fn of(ip: &IpAddr) -> IpFamily {
        if ip.is_ipv4() {
            IpFamily::V4
        } else {
            IpFamily::V6
        }
    }

    /// `"IPv4"` / `"IPv6"`, as in `spec.ipFamilies`.
    pub fn parse(s: &str) -> Option<IpFamily> {
        match s {
            "IPv4" => Some(IpFamily::V4),
            "IPv6" => Some(IpFamily::V6),
            _ => None,
        }
    }

    pub fn netfilter(self) -> nodelb_netfilter::Family {
        match self {
            IpFamily::V4 => nodelb_netfilter::Family::Ip,
            IpFamily::V6 => nodelb_netfilter::Family::Ip6,
        }
    }
}

impl std::fmt::Display for IpFamily {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            IpFamily::V4 => "IPv4",
            IpFamily::V6 => "IPv6",
        })
    }
}

/// Which families this node programs: enabled by flag (`--ipv4`/`--ipv6`) and able to forward.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Families {
    pub v4: bool,
    pub v6: bool,
}

impl Families {
    pub fn contains(&self, f: IpFamily) -> bool {
        match f {
            IpFamily::V4 => self.v4,
            IpFamily::V6 => self.v6,
        }
    }

    pub fn iter(&self) -> impl Iterator<Item = IpFamily> + '_ {
        [IpFamily::V4, IpFamily::V6]
            .into_iter()
            .filter(|f| self.contains(*f))
    }
}

/// Everything the planner looks at, as plain data. Built by the caller from watch caches (or
/// from files, for `render`/`apply`); the planner does no I/O.
#[derive(Clone, Debug)]
pub struct Input<'a> {
    /// Every Service the agent sees (any type or class: the planner picks its own).
    pub services: Vec<&'a k8s_openapi::api::core::v1::Service>,
    /// Every EndpointSlice the agent sees.
    pub slices: Vec<&'a k8s_openapi::api::discovery::v1::EndpointSlice>,
    /// This node.
    pub node: &'a node::NodeInfo,
    /// Addresses assigned on the host right now (rtnetlink), every family.
    pub local_addresses: &'a std::collections::BTreeSet<IpAddr>,
    /// Families to program: enabled and forwarding.
    pub families: Families,
    pub config: &'a config::Config,
}

/// What the planner decided: the tables to hold (one per programmed family) and, per Service
/// nodelb handles, what this node does for it; plus every problem found in the input.
#[derive(Clone, Debug)]
pub struct Plan {
    /// `ip nodelb` and/or `ip6 nodelb`, for the programmed families only.
    pub tables: Vec<nodelb_netfilter::Table>,
    pub services: std::collections::BTreeMap<service::ServiceKey, diagnosis::ServiceOutcome>,
    pub warnings: Vec<diagnosis::Warning>,
}

/// Plan this node's tables. Pure: same input, same output.
pub fn plan(input: &Input<'_>) -> Plan {
    use diagnosis::*;
    use service::ServiceKey;
    use std::collections::BTreeMap;

    let config = input.config;
    let mut warnings = Vec::new();
    let slices = endpoints::index(&input.slices, &mut warnings);
    let node = input.node;

    // Served addresses per family: the Node's InternalIP/ExternalIP that are on the host.
    let mut served: BTreeMap<IpFamily, Vec<IpAddr>> = BTreeMap::new();
    for (_, a) in &node.addresses {
        if input.local_addresses.contains(a) {
            let v = served.entry(IpFamily::of(a)).or_default();
            if !v.contains(a) {
                v.push(*a);
            }
        }
    }
    for v in served.values_mut() {
        v.sort();
    }

    // Services by key; two objects with one key (files may hold both) keep the first.
    let mut handled: BTreeMap<ServiceKey, &k8s_openapi::api::core::v1::Service> = BTreeMap::new();
    for svc in &input.services {
        if !service::is_handled(svc, config) {
            continue;
        }
        let Some(key) = ServiceKey::of(svc) else {
            warnings.push(Warning::new(
                ObjectRef::new(ObjectKind::Service, svc.metadata.namespace.as_deref(), ""),
                "Service without a name; skipped",
            ));
            continue;
        };
        if !service::valid_key(&key) {
            warnings.push(Warning::new(
                ObjectRef::service(&key),
                "namespace or name is not a DNS label; skipped",
            ));
            continue;
        }
        handled.entry(key).or_insert(svc);
    }

    let mut outcomes: BTreeMap<ServiceKey, ServiceOutcome> = BTreeMap::new();
    // Per Service that reaches the port stage: what each family and port would get.
    let mut wanted: Vec<conflicts::Wanted<'_>> = Vec::new();
    let mut read: BTreeMap<ServiceKey, service::LbService<'_>> = BTreeMap::new();
    for (key, svc) in &handled {
        if !config.namespace_allowed(&key.namespace) {
            outcomes.insert(key.clone(), ServiceOutcome::NamespaceNotAllowed);
            continue;
        }
        let lb = service::read(svc, key.clone(), &mut warnings);
        if lb.ports.is_empty() {
            outcomes.insert(key.clone(), ServiceOutcome::NoValidPorts);
            continue;
        }
        let reserved: Vec<_> = lb
            .ports
            .iter()
            .filter(|p| config.reserved_ports.contains(p.port))
            .map(|p| (p.protocol, p.port))
            .collect();
        if !reserved.is_empty() {
            outcomes.insert(
                key.clone(),
                ServiceOutcome::ReservedPorts { ports: reserved },
            );
            continue;
        }
        if let Err(why) = service::serving(&lb, node, &mut warnings) {
            outcomes.insert(key.clone(), ServiceOutcome::NotServed(why));
            continue;
        }
        read.insert(key.clone(), lb);
    }

    for (key, lb) in &read {
        let no_slices = Vec::new();
        let svc_slices = slices.get(key).unwrap_or(&no_slices);
        for family in &lb.families {
            if !input.families.contains(*family) {
                continue;
            }
            let Some(addresses) = served.get(family) else {
                continue;
            };
            for port in &lb.ports {
                let c = endpoints::candidates(svc_slices, port, *family, &mut warnings);
                let selection =
                    endpoints::select(&c, lb.policy, &node.name, key, port, &mut warnings);
                wanted.push(conflicts::Wanted {
                    service: key,
                    created: lb.created,
                    family: *family,
                    port,
                    addresses,
                    selection,
                });
            }
        }
    }

    let decided = conflicts::decide(wanted);
    let mut by_service: BTreeMap<&ServiceKey, Vec<&conflicts::Decided<'_>>> = BTreeMap::new();
    for d in &decided {
        by_service.entry(d.wanted.service).or_default().push(d);
    }

    // Outcomes and table programs from the decisions.
    let mut programs: BTreeMap<IpFamily, Vec<table::PortProgram<'_>>> = BTreeMap::new();
    for (key, lb) in &read {
        let mut families = Vec::new();
        for family in &lb.families {
            let state = if !input.families.contains(*family) {
                FamilyState::Skipped(FamilySkip::FamilyNotProgrammed)
            } else if let Some(addresses) = served.get(family) {
                let mut ports = Vec::new();
                let mine = by_service.get(key).map(Vec::as_slice).unwrap_or_default();
                for d in mine.iter().filter(|d| d.wanted.family == *family) {
                    let w = &d.wanted;
                    let result = match (&d.winner, &w.selection) {
                        (Some(winner), _) => PortResult::Conflict {
                            winner: winner.clone(),
                        },
                        (
                            None,
                            endpoints::Selection::Forward {
                                endpoints,
                                terminating,
                            },
                        ) => PortResult::Forwards {
                            endpoints: endpoints.len(),
                            terminating: *terminating,
                        },
                        (None, endpoints::Selection::DropNotLocal { elsewhere }) => {
                            PortResult::DropsNoLocalEndpoint {
                                elsewhere: *elsewhere,
                            }
                        }
                        (None, endpoints::Selection::Reject) => PortResult::RejectsNoEndpoints,
                    };
                    if d.winner.is_none() {
                        programs
                            .entry(*family)
                            .or_default()
                            .push(table::PortProgram {
                                service: key,
                                port: w.port,
                                policy: lb.policy,
                                addresses,
                                source_ranges: lb.source_ranges.as_deref(),
                                action: match &w.selection {
                                    endpoints::Selection::Forward { endpoints, .. } => {
                                        table::Action::Forward(endpoints.clone())
                                    }
                                    endpoints::Selection::DropNotLocal { .. } => {
                                        table::Action::Drop
                                    }
                                    endpoints::Selection::Reject => table::Action::Reject,
                                },
                            });
                    }
                    ports.push(PortOutcome {
                        port: w.port.clone(),
                        result,
                    });
                }
                FamilyState::Served {
                    addresses: addresses.clone(),
                    ports,
                }
            } else {
                FamilyState::Skipped(FamilySkip::NoServedAddress)
            };
            families.push(FamilyOutcome {
                family: *family,
                state,
            });
        }
        let outcome = if families
            .iter()
            .all(|f| matches!(f.state, FamilyState::Skipped(_)))
        {
            ServiceOutcome::NoServedAddress {
                families: families
                    .into_iter()
                    .filter_map(|f| match f.state {
                        FamilyState::Skipped(s) => Some((f.family, s)),
                        FamilyState::Served { .. } => None,
                    })
                    .collect(),
            }
        } else {
            ServiceOutcome::Served { families }
        };
        outcomes.insert(key.clone(), outcome);
    }

    let tables = input
        .families
        .iter()
        .map(|family| {
            let ports = programs.remove(&family).unwrap_or_default();
            table::build(family, &config.table_name, input.local_addresses, &ports)
        })
        .collect();

    dedup_warnings(&mut warnings);
    Plan {
        tables,
        services: outcomes,
        warnings,
    }
}

/// The same problem found twice (once per family or port) is one warning.
fn dedup_warnings(warnings: &mut Vec<diagnosis::Warning>) {
    let mut seen = std::collections::HashSet::new();
    warnings.retain(|w| seen.insert((w.object.clone(), w.message.clone())));
}
