//! What happened to each Service on this node, and what was wrong with the input.
//!
//! Outcomes are facts for the agent's logs and metrics and for the status writer's Events;
//! warnings are bad input (an object and what is wrong with it), one per problem.

use super::topology::Topology;
use crate::vocab::IpFamily;
use crate::vocab::{Listener, Protocol, ServiceKey, ServicePortId};
use std::fmt;
use std::net::IpAddr;

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum ObjectKind {
    Service,
    EndpointSlice,
    Node,
}

impl fmt::Display for ObjectKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            ObjectKind::Service => "Service",
            ObjectKind::EndpointSlice => "EndpointSlice",
            ObjectKind::Node => "Node",
        })
    }
}

/// The object a warning is about.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ObjectRef {
    pub kind: ObjectKind,
    /// `None` for cluster-scoped objects (Nodes).
    pub namespace: Option<String>,
    pub name: String,
}

impl ObjectRef {
    pub fn new(kind: ObjectKind, namespace: Option<&str>, name: &str) -> ObjectRef {
        ObjectRef {
            kind,
            namespace: namespace.map(str::to_string),
            name: name.to_string(),
        }
    }

    pub fn service(key: &ServiceKey) -> ObjectRef {
        ObjectRef::new(ObjectKind::Service, Some(&key.namespace), &key.name)
    }
}

impl fmt::Display for ObjectRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.namespace {
            Some(ns) => write!(f, "{} {ns}/{}", self.kind, self.name),
            None => write!(f, "{} {}", self.kind, self.name),
        }
    }
}

/// Bad input: which object, and what is wrong with it. Planning went on without the bad part.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Warning {
    pub object: ObjectRef,
    pub message: String,
}

impl Warning {
    pub fn new(object: ObjectRef, message: impl Into<String>) -> Warning {
        Warning {
            object,
            message: message.into(),
        }
    }
}

impl fmt::Display for Warning {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.object, self.message)
    }
}

/// What this node does for one Service nodelb handles (its class matches).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ServiceOutcome {
    /// `--allowed-namespaces` does not list the Service's namespace: no rules.
    NamespaceNotAllowed,
    /// Namespace or name is not a DNS label (only possible outside a real API server): no
    /// rules, since nodelb's chain and set names are made from them.
    InvalidName,
    /// No port nodelb can program (the warnings say what is wrong with each): no rules.
    NoValidPorts,
    /// The Service asks for ports in `--reserved-ports`: no rules at all, on any node.
    ReservedPorts { ports: Vec<(Protocol, u16)> },
    /// This node is not one of the Service's serving nodes.
    NotServed(NotServed),
    /// None of the Service's families can be served here; says why for each of them.
    NoServedAddress {
        families: Vec<(IpFamily, FamilySkip)>,
    },
    /// Served on at least one family; what each family and port got.
    Served { families: Vec<FamilyOutcome> },
}

/// Why a node is not a serving node of a Service.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum NotServed {
    /// The node has the label `node.kubernetes.io/exclude-from-external-load-balancers`.
    ExcludedByLabel,
    /// The node's labels do not match the Service's `nodelb.io/node-selector`.
    NodeSelectorMismatch { selector: String },
    /// The Service's `nodelb.io/node-selector` does not parse (a warning says why).
    InvalidNodeSelector { selector: String, error: String },
    /// The Service's `nodelb.io/address-types` or `nodelb.io/address-cidrs` does not parse (a
    /// warning says why): served nowhere.
    InvalidAddresses {
        annotation: String,
        value: String,
        error: String,
    },
    /// `--servicelb-compat`: some node is labelled `svccontroller.k3s.cattle.io/enablelb`, and
    /// this one is not labelled `svccontroller.k3s.cattle.io/enablelb=true`.
    ServiceLbNotEnabled,
    /// `--servicelb-compat`: the node's `svccontroller.k3s.cattle.io/lbpool` label is not the
    /// Service's pool.
    ServiceLbPoolMismatch { pool: String },
}

/// Why one of a Service's families is not served here.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FamilySkip {
    /// The family is switched off on this node, or the node cannot forward it.
    FamilyNotProgrammed,
    /// None of the node's InternalIP/ExternalIP addresses of this family is assigned on the host.
    NoServedAddress,
    /// The node has addresses of this family, but none of the Service's address types and
    /// CIDRs (`nodelb.io/address-types`, `nodelb.io/address-cidrs` or the flags' default).
    NoAddressAdmitted,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FamilyOutcome {
    pub family: IpFamily,
    pub state: FamilyState,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum FamilyState {
    Skipped(FamilySkip),
    /// Traffic to `addresses` on the Service's ports is handled as `ports` say.
    Served {
        addresses: Vec<IpAddr>,
        ports: Vec<PortOutcome>,
    },
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PortOutcome {
    pub port: ServicePortId,
    pub result: PortResult,
}

/// What one (family, protocol, port) of a served Service got on this node.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PortResult {
    /// DNAT to one of `endpoints`. `terminating` when none was ready and serving-but-terminating
    /// endpoints stand in; `topology`: how topology hints narrowed them here, or why not.
    Forwards {
        endpoints: usize,
        terminating: bool,
        topology: Topology,
    },
    /// `externalTrafficPolicy: Local` and every endpoint is on another node: this node drops.
    DropsNoLocalEndpoint { elsewhere: usize },
    /// No endpoint at all: clients are rejected (TCP reset, ICMP port unreachable).
    RejectsNoEndpoints,
    /// An older Service holds this (family, protocol, port) on this node: no rules for it.
    Conflict { holder: ServiceKey },
    /// A process on this node listens on this (protocol, port), on the family's wildcard
    /// address or a served one: the port is the host's, no rules for it (a listener always
    /// wins, also one that started after the Service).
    HostListener { listener: Listener },
    /// All or nothing: another port of the Service lost its (family, protocol, port) on this
    /// node, to an older Service or a host listener, so this one gets no rules either (it
    /// keeps its claim: who wins a port never depends on the Service's other ports).
    Withheld {
        lost: ServicePortId,
        holder: PortHolder,
    },
}

/// Who holds a port a Service lost on this node.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PortHolder {
    /// An older Service.
    Service(ServiceKey),
    /// A process on the node.
    Listener(Listener),
}

impl PortResult {
    /// Whether this port has rules in the table (forwards, drops or rejects).
    pub fn is_programmed(&self) -> bool {
        !matches!(
            self,
            PortResult::Conflict { .. }
                | PortResult::HostListener { .. }
                | PortResult::Withheld { .. }
        )
    }

    /// Who holds the port instead of the Service, if it lost it (not when withheld).
    pub fn holder(&self) -> Option<PortHolder> {
        match self {
            PortResult::Conflict { holder } => Some(PortHolder::Service(holder.clone())),
            PortResult::HostListener { listener } => Some(PortHolder::Listener(listener.clone())),
            _ => None,
        }
    }
}

impl ServiceOutcome {
    /// Families where at least one port of the Service has rules on this node.
    pub fn programmed_families(&self) -> Vec<IpFamily> {
        self.served_families()
            .filter(|(_, _, ports)| ports.iter().any(|p| p.result.is_programmed()))
            .map(|(f, _, _)| f)
            .collect()
    }

    /// The ports of one family, if it is served.
    pub fn ports(&self, family: IpFamily) -> Option<&[PortOutcome]> {
        self.served_families()
            .find(|(f, _, _)| *f == family)
            .map(|(_, _, p)| p)
    }

    /// Every port conflict this Service lost: family, port, holder.
    pub fn conflicts(&self) -> Vec<(IpFamily, &ServicePortId, &ServiceKey)> {
        let mut out = Vec::new();
        for (f, _, ports) in self.served_families() {
            for p in ports {
                if let PortResult::Conflict { holder } = &p.result {
                    out.push((f, &p.port, holder));
                }
            }
        }
        out
    }

    /// Every port a host listener took from this Service: family, port, listener.
    pub fn host_listeners(&self) -> Vec<(IpFamily, &ServicePortId, &Listener)> {
        let mut out = Vec::new();
        for (f, _, ports) in self.served_families() {
            for p in ports {
                if let PortResult::HostListener { listener } = &p.result {
                    out.push((f, &p.port, listener));
                }
            }
        }
        out
    }

    fn served_families(&self) -> impl Iterator<Item = (IpFamily, &[IpAddr], &[PortOutcome])> {
        let families: &[FamilyOutcome] = match self {
            ServiceOutcome::Served { families } => families,
            _ => &[],
        };
        families.iter().filter_map(|f| match &f.state {
            FamilyState::Served { addresses, ports } => {
                Some((f.family, &addresses[..], &ports[..]))
            }
            FamilyState::Skipped(_) => None,
        })
    }
}

impl fmt::Display for ServiceOutcome {
    /// One line for logs: `served: IPv4 [203.0.113.10] http/TCP/80 → 3 endpoints`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ServiceOutcome::NamespaceNotAllowed => f.write_str("namespace not allowed"),
            ServiceOutcome::InvalidName => f.write_str("namespace or name is not a DNS label"),
            ServiceOutcome::NoValidPorts => f.write_str("no valid port"),
            ServiceOutcome::ReservedPorts { ports } => {
                f.write_str("reserved ports:")?;
                for (proto, port) in ports {
                    write!(f, " {port}/{proto}")?;
                }
                Ok(())
            }
            ServiceOutcome::NotServed(NotServed::ExcludedByLabel) => {
                f.write_str("not served: node excluded from external load balancers")
            }
            ServiceOutcome::NotServed(NotServed::NodeSelectorMismatch { selector }) => {
                write!(f, "not served: node does not match selector {selector:?}")
            }
            ServiceOutcome::NotServed(NotServed::InvalidNodeSelector { selector, error }) => {
                write!(f, "not served: invalid node selector {selector:?}: {error}")
            }
            ServiceOutcome::NotServed(NotServed::InvalidAddresses {
                annotation,
                value,
                error,
            }) => {
                write!(
                    f,
                    "not served: invalid annotation {annotation} {value:?}: {error}"
                )
            }
            ServiceOutcome::NotServed(NotServed::ServiceLbNotEnabled) => write!(
                f,
                "not served: node not labelled {}=true while other nodes carry that label (--servicelb-compat)",
                crate::vocab::ENABLELB_LABEL
            ),
            ServiceOutcome::NotServed(NotServed::ServiceLbPoolMismatch { pool }) => write!(
                f,
                "not served: node not in the Service's ServiceLB pool {pool:?} (label {}, --servicelb-compat)",
                crate::vocab::LBPOOL_LABEL
            ),
            ServiceOutcome::NoServedAddress { families } => {
                f.write_str("no served address:")?;
                for (fam, skip) in families {
                    write!(f, " {fam} {skip}")?;
                }
                Ok(())
            }
            ServiceOutcome::Served { families } => {
                f.write_str("served:")?;
                for fam in families {
                    match &fam.state {
                        FamilyState::Skipped(skip) => write!(f, " {} {skip};", fam.family)?,
                        FamilyState::Served { addresses, ports } => {
                            write!(f, " {} {addresses:?}", fam.family)?;
                            for p in ports {
                                write!(f, " {} {};", p.port, p.result)?;
                            }
                        }
                    }
                }
                Ok(())
            }
        }
    }
}

impl fmt::Display for FamilySkip {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            FamilySkip::FamilyNotProgrammed => "family not programmed on this node",
            FamilySkip::NoServedAddress => "no node address assigned on the host",
            FamilySkip::NoAddressAdmitted => {
                "no node address of the Service's address types and CIDRs"
            }
        })
    }
}

impl fmt::Display for PortResult {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PortResult::Forwards {
                endpoints,
                terminating: false,
                topology,
            } => write!(f, "forwards to {endpoints} endpoints{topology}"),
            PortResult::Forwards {
                endpoints,
                terminating: true,
                topology,
            } => write!(f, "forwards to {endpoints} terminating endpoints{topology}"),
            PortResult::DropsNoLocalEndpoint { elsewhere } => {
                write!(
                    f,
                    "drops: Local policy, {elsewhere} endpoints on other nodes"
                )
            }
            PortResult::RejectsNoEndpoints => f.write_str("rejects: no endpoints"),
            PortResult::Conflict { holder } => write!(f, "port conflict, held by {holder}"),
            PortResult::HostListener { listener } => {
                write!(f, "no rules: in use on the node by {listener}")
            }
            PortResult::Withheld { lost, holder } => write!(
                f,
                "no rules: {}/{} held by {holder} (all or nothing)",
                lost.port, lost.protocol
            ),
        }
    }
}

impl fmt::Display for PortHolder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PortHolder::Service(key) => write!(f, "{key}"),
            PortHolder::Listener(l) => write!(f, "{l}, on the node"),
        }
    }
}
