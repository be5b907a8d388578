//! Datagram flows through this node: which UDP and SCTP Service ports DNAT on which node
//! address, the endpoints whose flows they keep, and, between two plans, which conntrack
//! entries went stale.
//!
//! Conntrack keeps a flow on the endpoint its first packet was DNATed to for as long as packets
//! keep coming with the same 5-tuple. A UDP or SCTP client that keeps its source port (a DNS
//! resolver, syslog, SIP, WireGuard, QUIC, a game server) would stay on an endpoint that left.
//! As in kube-proxy (`pkg/proxy/conntrack/cleanup.go`), a flow stays on its endpoint while that
//! endpoint still *serves* (ready, or serving while it terminates), whether or not new flows
//! are sent to it (a rolling update's terminating pod, an endpoint of another zone or node):
//! a session is not moved at SIGTERM, only once its endpoint stops serving. So:
//! - when an endpoint stops serving a port here (removed, neither ready nor serving, the port
//!   or the Service gone, the node, family or address no longer serving it, a conflict lost),
//!   the entries of that port's address and port answered by that endpoint are stale;
//! - when a port starts DNATing here (it rejected, dropped or was not nodelb's before; and
//!   every port at the agent's start, when nothing is known of before), the entries of its
//!   address and port that none of its serving endpoints answers were made before and are
//!   stale.
//!
//! TCP needs none of this: a connection to an endpoint that left ends on its own (the endpoint
//! is gone or resets it), and a new connection has a new source port and a fresh pick.

use super::diagnosis::{FamilyState, PortResult, ServiceOutcome};
use super::endpoints::{EndpointAddr, Selection};
use super::prepare::{Prepared, Stage};
use crate::vocab::{IpFamily, Protocol, ServiceKey};
use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;

/// A Service port as this node serves it: protocol, node address, port.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ServedPort {
    pub protocol: Protocol,
    pub address: IpAddr,
    pub port: u16,
}

impl ServedPort {
    pub fn family(&self) -> IpFamily {
        IpFamily::of(&self.address)
    }
}

impl std::fmt::Display for ServedPort {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{}/{}",
            std::net::SocketAddr::new(self.address, self.port),
            self.protocol
        )
    }
}

/// What one Service's UDP and SCTP ports keep on this node: per served address and port that
/// DNATs (forwards, or drops but for the node's own clients), every endpoint of the port that
/// still serves, used here or not. Ports that reject, or that the Service does not hold here,
/// keep nothing.
pub fn of_service(prep: &Prepared, outcome: &ServiceOutcome) -> Vec<(ServedPort, Targets)> {
    let (Stage::Ports { ports, .. }, ServiceOutcome::Served { families }) = (&prep.stage, outcome)
    else {
        return Vec::new();
    };
    let mut out = Vec::new();
    for f in families {
        let FamilyState::Served {
            addresses,
            ports: results,
        } = &f.state
        else {
            continue;
        };
        for r in results {
            let forwards = matches!(
                r.result,
                PortResult::Forwards { .. } | PortResult::DropsNoLocalEndpoint { .. }
            );
            if !forwards || !r.port.protocol.kept_by_tuple() {
                continue;
            }
            let Some(p) = ports
                .iter()
                .find(|p| p.family == f.family && p.port == r.port)
            else {
                continue;
            };
            if p.selection == Selection::Reject {
                continue;
            }
            let targets: Targets = p.serving.iter().copied().collect();
            for a in addresses {
                let port = ServedPort {
                    protocol: r.port.protocol,
                    address: *a,
                    port: r.port.port,
                };
                out.push((port, targets.clone()));
            }
        }
    }
    out
}

/// The endpoints whose flows a port keeps: those that still serve (empty: none, it rejects or
/// is not served).
pub type Targets = BTreeSet<EndpointAddr>;

/// Every UDP and SCTP port that DNATs on this node, its Service and the endpoints whose flows
/// it keeps.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Flows {
    ports: BTreeMap<ServedPort, (ServiceKey, Targets)>,
    /// The ports each Service holds (only Services that hold any).
    by_service: BTreeMap<ServiceKey, Vec<ServedPort>>,
}

/// The ports an update touched, with their endpoints before it.
#[derive(Debug, Default)]
pub struct Touched(BTreeMap<ServedPort, Targets>);

impl Flows {
    /// Rebuild packed (see `packed`), after every Service was added in key order.
    pub fn pack(&mut self) {
        crate::packed::repack(&mut self.ports);
        crate::packed::repack(&mut self.by_service);
    }

    /// The endpoints whose flows `port` keeps now (empty: none).
    pub fn targets(&self, port: &ServedPort) -> Targets {
        self.ports
            .get(port)
            .map(|(_, t)| t.clone())
            .unwrap_or_default()
    }

    /// A Service's ports become `new`; the ports touched keep their endpoints of before in
    /// `touched`. Another Service may have taken a port already in this update: a Service
    /// removes only ports it still holds.
    pub fn replace(
        &mut self,
        key: &ServiceKey,
        new: Vec<(ServedPort, Targets)>,
        touched: &mut Touched,
    ) {
        for port in self.by_service.remove(key).unwrap_or_default() {
            touched.0.entry(port).or_insert_with(|| self.targets(&port));
            if self.ports.get(&port).is_some_and(|(k, _)| k == key) {
                self.ports.remove(&port);
            }
        }
        if new.is_empty() {
            return;
        }
        let mut held = Vec::with_capacity(new.len());
        for (port, targets) in new {
            touched.0.entry(port).or_insert_with(|| self.targets(&port));
            self.ports.insert(port, (key.clone(), targets));
            held.push(port);
        }
        self.by_service.insert(key.clone(), held);
    }

    /// What changed since the ports of `touched` had their endpoints of then.
    pub fn change_since(&self, touched: Touched) -> FlowChange {
        let mut ports = BTreeMap::new();
        for (port, before) in touched.0 {
            let after = self.targets(&port);
            if before != after {
                ports.insert(port, (before, after));
            }
        }
        FlowChange { ports }
    }
}

/// How the endpoints of ports changed: for each port that changed, its endpoints before and
/// after (empty: it DNATed to none).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct FlowChange {
    ports: BTreeMap<ServedPort, (Targets, Targets)>,
}

/// Conntrack entries that went stale: what to delete once the rules that made them so are
/// committed.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum StaleFlows {
    /// `endpoint` no longer serves `port` here (gone, or neither ready nor serving): the
    /// entries of `port` it answers.
    Left {
        port: ServedPort,
        endpoint: EndpointAddr,
    },
    /// `port` DNATs (with `endpoints` serving) and did not before: the entries of `port` none
    /// of them answers, made before (not DNATed, or DNATed to an endpoint of before the agent
    /// started).
    Opened {
        port: ServedPort,
        endpoints: Vec<EndpointAddr>,
    },
}

impl FlowChange {
    /// The change from `before` to `after`, whole (a rebuild).
    pub fn between(before: &Flows, after: &Flows) -> FlowChange {
        let mut touched = Touched::default();
        for (port, (_, targets)) in &before.ports {
            touched.0.insert(*port, targets.clone());
        }
        for port in after.ports.keys() {
            touched.0.entry(*port).or_default();
        }
        after.change_since(touched)
    }

    pub fn is_empty(&self) -> bool {
        self.ports.is_empty()
    }

    /// This change followed by `later` (what a sync whose commit failed leaves to the next).
    pub fn then(mut self, later: FlowChange) -> FlowChange {
        for (port, (before, after)) in later.ports {
            let entry = self.ports.entry(port).or_insert((before, Targets::new()));
            entry.1 = after;
        }
        self.ports.retain(|_, (before, after)| before != after);
        self
    }

    /// The entries this change made stale, port by port.
    pub fn stale(&self) -> Vec<StaleFlows> {
        let mut out = Vec::new();
        for (port, (before, after)) in &self.ports {
            if before.is_empty() {
                out.push(StaleFlows::Opened {
                    port: *port,
                    endpoints: after.iter().copied().collect(),
                });
                continue;
            }
            for ep in before.difference(after) {
                out.push(StaleFlows::Left {
                    port: *port,
                    endpoint: *ep,
                });
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn port(p: u16) -> ServedPort {
        ServedPort {
            protocol: Protocol::Udp,
            address: "203.0.113.1".parse().unwrap(),
            port: p,
        }
    }

    fn eps(hosts: &[u8]) -> Targets {
        hosts
            .iter()
            .map(|h| EndpointAddr {
                addr: IpAddr::from([198, 51, 100, *h]),
                port: 8053,
            })
            .collect()
    }

    fn flows(entries: &[(&str, u16, &[u8])]) -> Flows {
        let mut f = Flows::default();
        for (svc, p, hosts) in entries {
            let key = ServiceKey::new("ns", svc);
            let mut held = f.by_service.remove(&key).unwrap_or_default();
            f.ports.insert(port(*p), (key.clone(), eps(hosts)));
            held.push(port(*p));
            f.by_service.insert(key, held);
        }
        f
    }

    #[test]
    fn changes_compose_as_if_made_at_once() {
        let a = flows(&[("s", 53, &[2, 3])]);
        let b = flows(&[("s", 53, &[3]), ("t", 54, &[4])]);
        let c = flows(&[("s", 53, &[3, 5])]);
        let composed = FlowChange::between(&a, &b).then(FlowChange::between(&b, &c));
        assert_eq!(composed, FlowChange::between(&a, &c));
        // A change undone by the next leaves nothing.
        assert!(FlowChange::between(&a, &b)
            .then(FlowChange::between(&b, &a))
            .is_empty());
    }

    #[test]
    fn a_port_taken_over_by_another_service_is_one_change() {
        let mut f = flows(&[("old", 53, &[2])]);
        let mut touched = Touched::default();
        // The new holder is replanned first, the old one after.
        f.replace(
            &ServiceKey::new("ns", "new"),
            vec![(port(53), eps(&[3]))],
            &mut touched,
        );
        f.replace(&ServiceKey::new("ns", "old"), Vec::new(), &mut touched);
        assert_eq!(f, flows(&[("new", 53, &[3])]));
        assert_eq!(
            f.change_since(touched).stale(),
            vec![StaleFlows::Left {
                port: port(53),
                endpoint: *eps(&[2]).first().unwrap()
            }]
        );
    }
}
