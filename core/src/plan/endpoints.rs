//! From EndpointSlices to the endpoints one Service port forwards to, per family: which slices
//! belong to the Service, which slice port serves the Service port, which endpoints count
//! (one copy of each, the one not terminating), and which are used on this node (traffic
//! policy, readiness, topology).

use super::diagnosis::{ObjectKind, ObjectRef, Warning};
use super::service::TrafficPolicy;
use super::topology::{self, Place, Topology};
use crate::objects::index::{EndpointSlice, Hints, TrafficDistribution};
use crate::vocab::IpFamily;
use crate::vocab::{Protocol, ServiceKey, ServicePortId};
use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;

/// Most endpoints one Service port forwards to on one family. Kubernetes caps a slice at 1,000
/// endpoints but not a Service; beyond this the rest are left out, with a warning.
pub const MAX_ENDPOINTS: usize = 10_000;

/// One backend: address and target port.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct EndpointAddr {
    pub addr: IpAddr,
    pub port: u16,
}

/// What an endpoint says of itself in its slice.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Candidate<'s> {
    /// `ready` (unset: ready).
    pub ready: bool,
    /// `serving` (unset: as `ready`).
    pub serving: bool,
    /// `terminating` (unset: not).
    pub terminating: bool,
    /// The node it runs on (`Local` policy).
    pub node: Option<&'s str>,
    /// Its topology hints, if it carries any.
    pub hints: Option<&'s Hints>,
}

impl Candidate<'_> {
    /// Still serving: ready, or serving while it terminates (what stands in when none is
    /// ready, and what keeps its UDP and SCTP flows while it drains).
    pub fn serves(&self) -> bool {
        self.ready || (self.serving && self.terminating)
    }

    /// Serving while it terminates: the stand-in when none is ready.
    pub fn stands_in(&self) -> bool {
        !self.ready && self.serving && self.terminating
    }
}

/// Every endpoint of one Service port on one family, whatever its conditions, each address
/// and target port once, before the traffic policy is applied.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Candidates<'s> {
    pub endpoints: BTreeMap<EndpointAddr, Candidate<'s>>,
}

impl Candidates<'_> {
    /// The endpoints still serving ([`Candidate::serves`]), sorted.
    pub fn serving(&self) -> impl Iterator<Item = EndpointAddr> + '_ {
        self.endpoints
            .iter()
            .filter(|(_, c)| c.serves())
            .map(|(e, _)| *e)
    }

    /// The nodes running an endpoint that serves.
    pub fn serving_nodes(&self) -> impl Iterator<Item = &str> + '_ {
        self.endpoints
            .values()
            .filter(|c| c.serves())
            .filter_map(|c| c.node)
    }
}

/// The endpoints picked for one Service port on one family on this node.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Selection {
    /// Forward to these, sorted; `terminating` when no ready endpoint exists and
    /// serving-and-terminating ones stand in; `topology` says how `Cluster` endpoints were
    /// narrowed here.
    Forward {
        endpoints: Vec<EndpointAddr>,
        terminating: bool,
        topology: Topology,
    },
    /// `Local` policy and every usable endpoint is on another node: outside clients are
    /// dropped; clients on the node itself go to `elsewhere`, as kube-proxy sends them.
    DropNotLocal { elsewhere: Vec<EndpointAddr> },
    /// No usable endpoint anywhere.
    Reject,
}

fn slice_ref(s: &EndpointSlice) -> ObjectRef {
    ObjectRef::new(
        ObjectKind::EndpointSlice,
        Some(s.metadata.namespace.as_deref().unwrap_or("default")),
        s.metadata.name.as_deref().unwrap_or(""),
    )
}

/// Slices nodelb cannot use at all: an address type it does not know (FQDN slices are skipped
/// silently: nodelb forwards to addresses only).
pub fn check_slices(slices: &[&EndpointSlice], warnings: &mut Vec<Warning>) {
    for s in slices {
        if !matches!(s.address_type.as_str(), "IPv4" | "IPv6" | "FQDN") {
            warnings.push(Warning::new(
                slice_ref(s),
                format!(
                    "addressType {:?} is not IPv4, IPv6 or FQDN; slice skipped",
                    s.address_type
                ),
            ));
        }
    }
}

fn slice_family(s: &EndpointSlice) -> Option<IpFamily> {
    match s.address_type.as_str() {
        "IPv4" => Some(IpFamily::V4),
        "IPv6" => Some(IpFamily::V6),
        _ => None,
    }
}

/// The endpoints of one Service port on one family, gathered from the Service's slices.
///
/// The slice port that serves a Service port has the same name (both unset or empty counts as
/// the same) and the same protocol. Each endpoint contributes its first address, as kube-proxy
/// does; an address of the wrong family or that does not parse is skipped with a warning, and
/// so are malformed hints (the endpoint then counts as carrying none).
///
/// The same address and target port in two slices (a pod IP reused while the pod that had it
/// terminates, or an endpoint moving between slices) counts once, as in kube-proxy's
/// `endpointslicecache.go`: a copy that is not terminating wins over one that is, else the
/// first in slice name order. Listed twice in one slice is warned about.
pub fn candidates<'s>(
    slices: &[&'s EndpointSlice],
    port: &ServicePortId,
    family: IpFamily,
    warnings: &mut Vec<Warning>,
) -> Candidates<'s> {
    // Gathered in slice order, then sorted (stably: the first copy stays first) and merged,
    // so a Service with thousands of endpoints costs one sort, not a map search per endpoint.
    let mut all: Vec<(EndpointAddr, Candidate<'s>)> = Vec::new();
    for s in slices {
        if slice_family(s) != Some(family) {
            continue;
        }
        let obj = slice_ref(s);
        let Some(target) = slice_port(s, port, &obj, warnings) else {
            continue;
        };
        let mut in_slice: BTreeSet<EndpointAddr> = BTreeSet::new();
        for (i, ep) in s.endpoints.iter().enumerate() {
            let Some(first) = &ep.address else {
                continue;
            };
            let addr = match first.trim().parse::<IpAddr>() {
                Ok(a) if IpFamily::of(&a) == family => a,
                Ok(a) => {
                    warnings.push(Warning::new(
                        obj.clone(),
                        format!("address {a} is not {family} but the slice is {family}; endpoint skipped"),
                    ));
                    continue;
                }
                Err(_) => {
                    warnings.push(Warning::new(
                        obj.clone(),
                        format!("address {first:?} is not an IP address; endpoint skipped"),
                    ));
                    continue;
                }
            };
            let endpoint = EndpointAddr { addr, port: target };
            if !in_slice.insert(endpoint) {
                warnings.push(Warning::new(
                    obj.clone(),
                    format!("endpoint {addr} port {target} is listed more than once; counted once"),
                ));
            }
            let hints = s.hints_of(i);
            if hints.is_some_and(|h| h.malformed) {
                warnings.push(Warning::new(
                    obj.clone(),
                    format!(
                        "endpoint {addr}: hints are not forZones/forNodes lists of names; ignored"
                    ),
                ));
            }
            let cond = ep.conditions.as_ref();
            let ready = cond.and_then(|c| c.ready).unwrap_or(true);
            let candidate = Candidate {
                ready,
                serving: cond.and_then(|c| c.serving).unwrap_or(ready),
                terminating: cond.and_then(|c| c.terminating).unwrap_or(false),
                node: ep.node_name.as_deref(),
                hints,
            };
            all.push((endpoint, candidate));
        }
    }
    all.sort_by_key(|(e, _)| *e);
    all.dedup_by(|(later_e, later), (first_e, first)| {
        let same = later_e == first_e;
        if same && first.terminating && !later.terminating {
            *first = *later;
        }
        same
    });
    Candidates {
        endpoints: all.into_iter().collect(),
    }
}

/// The target port a slice gives for a Service port, if it lists one; a matching slice port
/// whose number is missing or out of range is warned about.
fn slice_port(
    s: &EndpointSlice,
    port: &ServicePortId,
    obj: &ObjectRef,
    warnings: &mut Vec<Warning>,
) -> Option<u16> {
    let ports = s.ports.as_deref().unwrap_or_default();
    let matching = ports.iter().find(|p| {
        let name = p.name.as_deref().filter(|n| !n.is_empty());
        name == port.name.as_deref()
            && Protocol::parse(p.protocol.as_deref()) == Some(port.protocol)
    })?;
    match matching
        .port
        .and_then(|n| u16::try_from(n).ok())
        .filter(|n| *n > 0)
    {
        Some(n) => Some(n),
        None => {
            warnings.push(Warning::new(
                obj.clone(),
                format!(
                    "port {:?}: number {:?} is not 1-65535; slice skipped for {}",
                    matching.name.as_deref().unwrap_or(""),
                    matching.port,
                    port
                ),
            ));
            None
        }
    }
}

/// Apply the traffic policy: `Cluster` takes every endpoint, narrowed by topology hints (see
/// [`super::topology`]), `Local` only those on this node (`here`: `None` for a node that runs
/// none of them). Ready endpoints first; when none is ready, serving-and-terminating ones (for
/// `Cluster`, all of them: topology only ever narrows ready endpoints).
pub fn select(
    c: &Candidates<'_>,
    policy: TrafficPolicy,
    here: Option<Place<'_>>,
    distribution: Option<TrafficDistribution>,
    key: &ServiceKey,
    port: &ServicePortId,
    warnings: &mut Vec<Warning>,
) -> Selection {
    let pick = |keep: &dyn Fn(&Candidate) -> bool| -> Vec<EndpointAddr> {
        c.endpoints
            .iter()
            .filter(|(_, e)| keep(e))
            .map(|(e, _)| *e)
            .collect()
    };
    let node = here.map(|h| h.node);
    let local =
        |e: &Candidate| policy == TrafficPolicy::Cluster || (node.is_some() && e.node == node);
    let topology = match (policy, here) {
        (TrafficPolicy::Cluster, Some(here)) => topology::mode(
            c.endpoints.values().map(|e| (e.ready, e.hints)),
            distribution,
            here,
        ),
        _ => Topology::None,
    };
    let in_place = |e: &Candidate| match here {
        Some(here) => topology::available(e.hints, topology, here),
        None => true,
    };
    let (mut endpoints, terminating) = match pick(&|e| e.ready && local(e) && in_place(e)) {
        v if !v.is_empty() => (v, false),
        _ => (pick(&|e| e.stands_in() && local(e)), true),
    };
    if endpoints.is_empty() {
        let ready = pick(&|e| e.ready);
        let mut elsewhere = if ready.is_empty() {
            pick(&|e| e.stands_in())
        } else {
            ready
        };
        elsewhere.truncate(MAX_ENDPOINTS);
        return if elsewhere.is_empty() {
            Selection::Reject
        } else {
            Selection::DropNotLocal { elsewhere }
        };
    }
    if endpoints.len() > MAX_ENDPOINTS {
        warnings.push(Warning::new(
            ObjectRef::service(key),
            format!(
                "port {port}: {} endpoints, more than the {MAX_ENDPOINTS} nodelb forwards to; the rest left out",
                endpoints.len()
            ),
        ));
        endpoints.truncate(MAX_ENDPOINTS);
    }
    Selection::Forward {
        endpoints,
        terminating,
        topology,
    }
}
