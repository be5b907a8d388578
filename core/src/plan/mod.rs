//! The pure planner: from Services, EndpointSlices, this node and its addresses to netfilter
//! tables, plus what happened to each Service and what was wrong with the input.
//!
//! `plan()` walks docs/design.md's "What a Service gets" in order: class and namespace, ports,
//! reserved ports, serving node, the Service's address types and CIDRs, served addresses per family, endpoints and traffic policy,
//! then port conflicts on this node (oldest wins), then the tables.

pub mod addresses;
pub mod cidr;
pub mod config;
pub mod conflicts;
pub mod diagnosis;
pub mod endpoints;
pub mod flows;
pub mod health;
pub mod listeners;
pub mod node;
pub mod planner;
pub mod prepare;
pub mod reserved;
pub mod selector;
pub mod service;
pub mod servicelb;
pub mod settled;
pub mod slots;
pub mod table;
pub mod topology;

use crate::objects::index;
pub use crate::objects::index::Objects;
pub use planner::{Planner, TableChange, Update};
pub use prepare::Context;

#[cfg(test)]
mod tests;
#[cfg(test)]
mod tests_flows;
#[cfg(test)]
mod tests_incremental;

use crate::vocab::{Families, ServiceKey};
use std::net::IpAddr;

/// Everything the planner looks at, as plain data, with the objects as the index keeps them
/// (read from files, for `render`/`apply`, or tests); the planner does no I/O.
#[derive(Clone, Debug)]
pub struct Input<'a> {
    /// Every Service the agent sees (any type or class: the planner picks its own).
    pub services: Vec<&'a index::Service>,
    /// Every EndpointSlice the agent sees.
    pub slices: Vec<&'a index::EndpointSlice>,
    /// This node.
    pub node: &'a node::NodeInfo,
    /// Addresses assigned on the host right now (rtnetlink), every family.
    pub local_addresses: &'a std::collections::BTreeSet<IpAddr>,
    /// Families to program: enabled and forwarding.
    pub families: Families,
    pub config: &'a config::Config,
    /// The node's listening sockets: a Service never takes a port one of them holds.
    pub listeners: &'a listeners::HostListeners,
}

/// What the planner decided: the tables to hold (one per programmed family) and, per Service
/// nodelb handles, what this node does for it; plus every problem found in the input.
#[derive(Clone, Debug)]
pub struct Plan {
    /// `ip nodelb` and/or `ip6 nodelb`, for the programmed families only.
    pub tables: Vec<nodelb_netfilter::Table>,
    pub services: std::collections::BTreeMap<ServiceKey, diagnosis::ServiceOutcome>,
    pub warnings: Vec<diagnosis::Warning>,
}

/// Plan this node's tables. Pure: same input, same output. The agent keeps a [`Planner`]
/// between syncs instead; this is that planner run once from nothing.
pub fn plan(input: &Input<'_>) -> Plan {
    let services: Vec<index::Service> = input.services.iter().map(|s| (*s).clone()).collect();
    // Not kept (a Service has no key without a name), so warned about here.
    let nameless: Vec<diagnosis::Warning> = services
        .iter()
        .filter(|s| ServiceKey::of(s).is_none() && service::is_handled(s, input.config))
        .map(|svc| {
            diagnosis::Warning::new(
                diagnosis::ObjectRef::new(
                    diagnosis::ObjectKind::Service,
                    svc.metadata.namespace.as_deref(),
                    "",
                ),
                "Service without a name; skipped",
            )
        })
        .collect();
    let slices = input.slices.iter().map(|s| (*s).clone());
    let objects = Objects::from_lists(services, slices);
    let ctx = Context::new(
        input.node.clone(),
        input.local_addresses.clone(),
        input.families,
        input.config.clone(),
    )
    .with_listeners(input.listeners.clone());
    let mut planner = Planner::new();
    planner.update(&objects, &ctx, None);
    let mut warnings: Vec<diagnosis::Warning> = planner.warnings().cloned().collect();
    warnings.extend(nameless);
    Plan {
        tables: planner.tables(),
        services: planner
            .outcomes()
            .map(|(k, o)| (k.clone(), o.clone()))
            .collect(),
        warnings,
    }
}
