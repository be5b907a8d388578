//! One Service on this node, up to (not including) port conflicts: is it nodelb's, may it be
//! programmed at all, is this a serving node, which families and which of the node's addresses
//! (its address types and CIDRs), and which
//! endpoints each port would forward to. Depends only on the Service, its slices and the
//! node-wide context, so it is cached per Service between syncs.

use super::addresses::AddressFilter;
use super::cidr::Cidr;
use super::config::Config;
use super::diagnosis::{FamilySkip, ObjectRef, ServiceOutcome, Warning};
use super::endpoints::{self, EndpointAddr, Selection};
use super::listeners::{HostListeners, Taken};
use super::node::NodeInfo;
use super::service::{self, ClientIpAffinity, LbService, TrafficPolicy};
use super::topology::Place;
use crate::objects::index::{EndpointSlice, Service};
use crate::vocab::{Families, IpFamily};
use crate::vocab::{ServiceKey, ServicePortId};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;

/// What every Service on this node shares. When it changes, everything is replanned.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Context {
    pub node: NodeInfo,
    pub local_addresses: BTreeSet<IpAddr>,
    pub families: Families,
    pub config: Config,
    /// The node's InternalIP/ExternalIP addresses that are on the host, per family, sorted:
    /// those that may serve a Service (its address filter picks from them).
    pub served: BTreeMap<IpFamily, Vec<IpAddr>>,
    /// The node's listening sockets (none unless [`Context::with_listeners`]).
    pub listeners: HostListeners,
    /// The (family, protocol, port)s they take from every Service here.
    pub taken: Taken,
}

impl Context {
    pub fn new(
        node: NodeInfo,
        local_addresses: BTreeSet<IpAddr>,
        families: Families,
        config: Config,
    ) -> Context {
        let mut served: BTreeMap<IpFamily, Vec<IpAddr>> = BTreeMap::new();
        for (_, a) in &node.addresses {
            if local_addresses.contains(a) {
                let v = served.entry(IpFamily::of(a)).or_default();
                if !v.contains(a) {
                    v.push(*a);
                }
            }
        }
        for v in served.values_mut() {
            v.sort();
        }
        Context {
            node,
            local_addresses,
            families,
            config,
            served,
            listeners: HostListeners::default(),
            taken: Taken::default(),
        }
    }

    /// The same context with the node's listening sockets.
    pub fn with_listeners(mut self, listeners: HostListeners) -> Context {
        self.taken = Taken::new(&listeners, &self.served);
        self.listeners = listeners;
        self
    }

    /// Whether `other` differs from this context in its listeners at most, and in none of
    /// what every Service depends on (a change of which replans everything). A listener
    /// that stops or starts changes only the Services claiming its port.
    pub fn same_but_listeners(&self, other: &Context) -> bool {
        let Context {
            node,
            local_addresses,
            families,
            config,
            served,
            listeners: _,
            taken,
        } = self;
        *node == other.node
            && *local_addresses == other.local_addresses
            && *families == other.families
            && *config == other.config
            && *served == other.served
            && taken.every_port() == other.taken.every_port()
    }
}

/// One port of one family that this node would program, before conflicts.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PreparedPort {
    pub family: IpFamily,
    pub port: ServicePortId,
    pub selection: Selection,
    /// UDP and SCTP only (empty for TCP): every endpoint of the port that still serves, used
    /// here or not, sorted. Its conntrack entries are kept (see `flows`), so a change of it is
    /// a change of the Service.
    pub serving: Box<[EndpointAddr]>,
}

/// How far a Service got.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Stage {
    /// Decided already: no rules (namespace, ports, reserved ports, not a serving node).
    Done(ServiceOutcome),
    /// Wants ports on this node.
    Ports {
        created: Option<Time>,
        policy: TrafficPolicy,
        source_ranges: Option<Vec<Cidr>>,
        affinity: Option<ClientIpAffinity>,
        /// The Service's families in `ipFamilies` order, each with the node's addresses that
        /// serve it (sorted), or why the family is skipped here.
        families: Vec<(IpFamily, Result<Vec<IpAddr>, FamilySkip>)>,
        /// Ports of the families not skipped, family by family in the order above.
        ports: Vec<PreparedPort>,
    },
}

/// A Service nodelb handles, prepared for conflicts.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Prepared {
    pub key: ServiceKey,
    pub stage: Stage,
    /// Problems found in the Service and its slices.
    pub warnings: Vec<Warning>,
}

/// Prepare one Service, or `None` when it is not nodelb's (type, class) and slices alone.
pub fn prepare(
    key: &ServiceKey,
    svc: Option<&Service>,
    slices: &[&EndpointSlice],
    ctx: &Context,
) -> Option<Prepared> {
    let svc = svc?;
    if !service::is_handled(svc, &ctx.config) {
        return None;
    }
    let mut warnings = Vec::new();
    let stage = match decide(key, svc, ctx, &mut warnings) {
        Err(outcome) => Stage::Done(outcome),
        Ok((lb, filter)) => {
            let stage = ports_stage(lb, &filter, slices, ctx, &mut warnings);
            dedup(&mut warnings);
            stage
        }
    };
    Some(Prepared {
        key: key.clone(),
        stage,
        warnings,
    })
}

/// What decides a handled Service before its endpoints: its name, namespace, ports, reserved
/// ports, serving nodes and address filter. `Err`: its outcome, with no rules; `Ok`: its spec,
/// read, and which node addresses may serve it.
fn decide<'s>(
    key: &ServiceKey,
    svc: &'s Service,
    ctx: &Context,
    warnings: &mut Vec<Warning>,
) -> Result<(LbService<'s>, AddressFilter), ServiceOutcome> {
    let config: &Config = &ctx.config;
    if !crate::vocab::valid_key(key) {
        warnings.push(Warning::new(
            ObjectRef::service(key),
            "namespace or name is not a DNS label; skipped",
        ));
        return Err(ServiceOutcome::InvalidName);
    }
    if !config.namespace_allowed(&key.namespace) {
        return Err(ServiceOutcome::NamespaceNotAllowed);
    }
    let lb = service::read(svc, key.clone(), warnings);
    if lb.ports.is_empty() {
        return Err(ServiceOutcome::NoValidPorts);
    }
    let reserved: Vec<_> = lb
        .ports
        .iter()
        .filter(|p| config.reserved_ports.contains(p.protocol, p.port))
        .map(|p| (p.protocol, p.port))
        .collect();
    if !reserved.is_empty() {
        return Err(ServiceOutcome::ReservedPorts { ports: reserved });
    }
    // Read before the node is looked at: its warnings do not depend on the node.
    let filter = lb.address_filter(&config.addresses, warnings);
    if let Err(why) = service::serving(&lb, &ctx.node, config.servicelb, warnings) {
        return Err(ServiceOutcome::NotServed(why));
    }
    let filter = filter.map_err(ServiceOutcome::NotServed)?;
    Ok((lb, filter))
}

/// A Service served here: which of its families are programmed, on which of the node's
/// addresses (those `filter` admits), and the endpoints each port of those would forward to.
fn ports_stage(
    lb: LbService<'_>,
    filter: &AddressFilter,
    slices: &[&EndpointSlice],
    ctx: &Context,
    warnings: &mut Vec<Warning>,
) -> Stage {
    endpoints::check_slices(slices, warnings);
    let mut families = Vec::new();
    let mut ports = Vec::new();
    for family in &lb.families {
        let addresses = match ctx.served.get(family) {
            _ if !ctx.families.contains(*family) => Err(FamilySkip::FamilyNotProgrammed),
            None => Err(FamilySkip::NoServedAddress),
            Some(served) => match filter.select(&ctx.node, served) {
                a if a.is_empty() => Err(FamilySkip::NoAddressAdmitted),
                a => Ok(a),
            },
        };
        let skipped = addresses.is_err();
        families.push((*family, addresses));
        if skipped {
            continue;
        }
        for port in &lb.ports {
            let c = endpoints::candidates(slices, port, *family, warnings);
            let here = Place::of(&ctx.node.name, &ctx.node.labels);
            let selection = endpoints::select(
                &c,
                lb.policy,
                Some(here),
                lb.distribution,
                &lb.key,
                port,
                warnings,
            );
            let serving = match port.protocol.kept_by_tuple() {
                true => c.serving().collect(),
                false => Box::default(),
            };
            ports.push(PreparedPort {
                family: *family,
                port: port.clone(),
                selection,
                serving,
            });
        }
    }
    Stage::Ports {
        created: lb.created.cloned(),
        policy: lb.policy,
        source_ranges: lb.source_ranges,
        affinity: lb.affinity,
        families,
        ports,
    }
}

/// The same problem found twice (once per family or port) is one warning.
fn dedup(warnings: &mut Vec<Warning>) {
    let mut seen = std::collections::HashSet::new();
    warnings.retain(|w| seen.insert((w.object.clone(), w.message.clone())));
}
