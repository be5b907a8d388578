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
