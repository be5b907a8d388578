//! The pure planner: from Services, EndpointSlices and this node to netfilter tables.
//! Work in progress (issue 3): building blocks below; `plan()` itself is not written yet.

pub mod config;
pub mod diagnosis;
pub mod node;
pub mod selector;
pub mod service;

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
    // Body lands in the next commit (issue 3); the signature is what callers build against.
    let _ = input;
    Plan {
        tables: Vec::new(),
        services: Default::default(),
        warnings: Vec::new(),
    }
}
