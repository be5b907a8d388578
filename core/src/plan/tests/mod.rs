//! One test per rule of docs/design.md's "What a Service gets", each built from small YAML
//! fixtures and named for the rule it proves; then bad input.
//!
//! Assertions read the planned table through its `nft` text (what an operator would read with
//! `nft list table ip nodelb`) or through the outcome the agent logs and reports.

use super::config::Config;
use super::diagnosis::*;
use super::listeners::HostListeners;
use super::node::{AddressKind, NodeInfo};
use super::topology::{Ignored, Topology};
use super::*;
use crate::fixtures::{node, Ep, Slice, Svc};
use crate::objects::index::{EndpointSlice, Service};
use crate::vocab::{IpFamily, Protocol, ServiceKey};
use serde_json::json;
use std::collections::BTreeSet;

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

/// The text of `set NAME { ... }` or `map NAME { ... }` in a rendered table.
fn set_block(table: &str, name: &str) -> String {
    block(table, &format!("set {name} {{"))
        .or_else(|| block(table, &format!("map {name} {{")))
        .unwrap_or_else(|| panic!("no set {name} in\n{table}"))
}

fn chain_block(table: &str, name: &str) -> String {
    block(table, &format!("chain {name} {{"))
        .unwrap_or_else(|| panic!("no chain {name} in\n{table}"))
}

fn block(table: &str, header: &str) -> Option<String> {
    let start = table.find(header)?;
    let mut depth = 0usize;
    for (i, c) in table[start..].char_indices() {
        match c {
            '{' => depth += 1,
            '}' => {
                depth -= 1;
                if depth == 0 {
                    return Some(table[start..start + i + 1].to_string());
                }
            }
            _ => {}
        }
    }
    None
}
