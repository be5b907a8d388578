//! One test per rule of docs/design.md's "What a Service gets", each built from the fixture
//! builders and named for the rule it proves; then bad input.
//!
//! Assertions say where a packet goes through the planned tables (the tracer,
//! `nodelb_netfilter::trace`: which endpoints, masqueraded, dropped, rejected, counted), or
//! read the outcome the agent logs and reports; the table itself only where its names,
//! comments or declarations are the subject.

use super::config::Config;
use super::diagnosis::*;
use super::listeners::HostListeners;
use super::node::{AddressKind, NodeInfo};
use super::topology::{Ignored, Topology};
use super::*;
use crate::fixtures::{node, Ep, Slice, Svc};
use crate::objects::index::{EndpointSlice, Service};
use crate::vocab::{IpFamily, Protocol, ServiceKey};
use nodelb_netfilter::trace::{Chance, Outcome, Outcomes, Packet, Tracer};
use nodelb_netfilter::{Reject, Table};
use serde_json::json;
use std::collections::BTreeSet;
use std::net::SocketAddr;

mod addresses;
mod affinity;
mod bad_input;
mod conflicts;
mod counters;
mod endpoints;
mod families;
mod listeners;
mod nodes;
mod policy;
mod protocols;
mod services;
mod source_ranges;
mod table;
mod topology;

const NODE: &str = "node-a";
const NODE_V4: &str = "203.0.113.1";
const NODE_V6: &str = "2001:db8::1";
/// A client outside the cluster, in each family.
const CLIENT: &str = "203.0.113.9";
const CLIENT_V6: &str = "2001:db8:9::9";

struct World {
    services: Vec<Service>,
    slices: Vec<EndpointSlice>,
    node: NodeInfo,
    local: BTreeSet<IpAddr>,
    families: Families,
    config: Config,
    listeners: HostListeners,
}

impl World {
    fn new() -> World {
        let node = node(NODE)
            .label("kubernetes.io/hostname", NODE)
            .address("InternalIP", NODE_V4)
            .address("InternalIP", NODE_V6)
            .info();
        let local = [NODE_V4, NODE_V6, "192.0.2.254"]
            .iter()
            .map(|a| a.parse().unwrap())
            .collect();
        World {
            services: Vec::new(),
            slices: Vec::new(),
            node,
            local,
            families: Families { v4: true, v6: true },
            config: Config::default(),
            listeners: Default::default(),
        }
    }

    /// A listening socket on the node: `TCP 0.0.0.0 7000 socat` (the process is optional).
    fn listener(mut self, spec: &str) -> World {
        self.listeners.sockets.insert(listener(spec));
        self
    }

    fn service(mut self, s: Svc) -> World {
        self.services.push(s.index());
        self
    }

    fn slice(mut self, s: Slice) -> World {
        self.slices.push(s.index());
        self
    }

    fn plan(&self) -> Plan {
        plan(&Input {
            services: self.services.iter().collect(),
            slices: self.slices.iter().collect(),
            node: &self.node,
            local_addresses: &self.local,
            families: self.families,
            config: &self.config,
            listeners: &self.listeners,
        })
    }

    /// Every way `packet` goes through this World's planned tables, on a host with the
    /// World's addresses.
    fn trace(&self, packet: Packet) -> Outcomes {
        traced(&self.plan().tables, &self.local, packet)
    }
}

/// Every way `packet` goes through `tables` on a host with addresses `host` (a packet for one
/// of them is the host's; others it forwards).
fn traced(tables: &[Table], host: &BTreeSet<IpAddr>, packet: Packet) -> Outcomes {
    let tracer = Tracer::new(tables).host(host.iter().copied());
    tracer
        .trace(&packet)
        .unwrap_or_else(|e| panic!("{packet}: {e}"))
}

/// A new TCP connection from an outside client to port 80 of the node's IPv4 address.
fn to_web() -> Packet {
    Packet::tcp(CLIENT, NODE_V4, 80)
}

/// The same to the node's IPv6 address.
fn to_web6() -> Packet {
    Packet::tcp(CLIENT_V6, NODE_V6, 80)
}

/// A new TCP connection from a socket on the node (`from`, one of its addresses) to port 80
/// of its IPv4 address.
fn from_node(from: &str) -> Packet {
    Packet::tcp(from, NODE_V4, 80).from_host()
}

/// Endpoints as `address:port` (`[address]:port` in IPv6).
fn eps(list: &[&str]) -> BTreeSet<SocketAddr> {
    list.iter()
        .map(|e| {
            e.parse()
                .unwrap_or_else(|_| panic!("{e} is not an endpoint"))
        })
        .collect()
}

/// Every way is accepted as it came: not DNATed, not translated, counted nowhere (no rule
/// of nodelb's is for it).
fn untouched(out: &Outcomes) -> bool {
    out.accepted()
        && out
            .iter()
            .all(|o| o.dnat.is_none() && o.snat.is_none() && o.counters.is_empty())
}

/// The chains way `o` went through, in order (a chain entered again after a jump returns is
/// listed again).
fn chains(o: &Outcome) -> Vec<&str> {
    let mut out: Vec<&str> = Vec::new();
    for r in &o.rules {
        if out.last() != Some(&r.chain.as_str()) {
            out.push(&r.chain);
        }
    }
    out
}

impl Plan {
    fn text(&self, family: IpFamily) -> String {
        self.tables
            .iter()
            .find(|t| t.family == family.netfilter())
            .map(nodelb_netfilter::render_table)
            .unwrap_or_default()
    }

    fn v4(&self) -> String {
        self.text(IpFamily::V4)
    }

    fn outcome(&self, ns_name: &str) -> &ServiceOutcome {
        let (ns, name) = ns_name.split_once('/').unwrap();
        self.services
            .get(&ServiceKey::new(ns, name))
            .unwrap_or_else(|| panic!("no outcome for {ns_name}: {:?}", self.services))
    }

    fn port(&self, ns_name: &str, family: IpFamily) -> &PortResult {
        &self.outcome(ns_name).ports(family).expect("family served")[0].result
    }

    fn warned(&self, needle: &str) -> bool {
        self.warnings.iter().any(|w| w.to_string().contains(needle))
    }
}

/// The LoadBalancer Service `default/web` on TCP port 80 (`http`).
fn web() -> Svc {
    Svc::lb("default", "web")
        .created("2024-01-01T00:00:00Z")
        .port("http", 80, "TCP")
}

/// An IPv4 slice of `default/web` with port `http` → 8080 and the given endpoints, in
/// [`Ep::parse`]'s short form.
fn web_slice(name: &str, endpoints: &[&str]) -> Slice {
    Slice::ipv4("default", name, "web")
        .port("http", 8080, "TCP")
        .endpoints(endpoints)
}

fn forwards(n: usize) -> PortResult {
    PortResult::Forwards {
        endpoints: n,
        terminating: false,
        topology: Topology::None,
    }
}

/// An IPv6 slice of `default/web` with port `http` → 8080 and the given endpoints.
fn v6_web_slice(name: &str, endpoints: &[String]) -> Slice {
    Slice::ipv6("default", name, "web")
        .port("http", 8080, "TCP")
        .endpoints(endpoints)
}

/// `TCP 0.0.0.0 7000 socat`: protocol, address, port, process (optional).
fn listener(spec: &str) -> crate::vocab::Listener {
    let f: Vec<&str> = spec.split_whitespace().collect();
    crate::vocab::Listener {
        protocol: Protocol::parse(Some(f[0])).unwrap(),
        address: f[1].parse().unwrap(),
        port: f[2].parse().unwrap(),
        process: f.get(3).map(|p| p.to_string()),
    }
}
