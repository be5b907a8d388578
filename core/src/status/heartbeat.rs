//! Node heartbeats: the Lease `nodelb-node-<node>` each agent renews in its namespace, with
//! annotations naming the families it has programmed and the Service ports host listeners
//! hold there. Read here into plain values.

use crate::plan::conflicts::Slot;
use crate::plan::listeners::{wildcard, HostListeners};
use crate::plan::reserved::ReservedPorts;
use crate::vocab::{Families, IpFamily, Listener, Protocol};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::jiff::Timestamp;
use std::collections::{BTreeMap, BTreeSet};
use std::ops::RangeInclusive;
use std::time::{Duration, Instant};

/// Prefix of the heartbeat Lease names; the node name follows.
pub const LEASE_PREFIX: &str = "nodelb-node-";
/// Annotation on a heartbeat: the families the agent has programmed, `IPv4,IPv6`.
pub const FAMILIES_ANNOTATION: &str = "nodelb.io/families";
/// Label on a heartbeat: the node's name (Lease names may be shortened, labels are exact).
pub const NODE_LABEL: &str = "nodelb.io/node";
/// Annotation on a heartbeat: the ports host listeners hold on the node that a Service may ask
/// for (see [`BlockedPorts::report`]), with the process where known,
/// `IPv4/TCP/7000=socat,IPv6/UDP/53` (absent when there are none).
pub const BLOCKED_ANNOTATION: &str = "nodelb.io/blocked-ports";
/// Annotation on a heartbeat whose agent's syncs have been failing for longer than its node
/// lease duration: why (its last error). Such a heartbeat also names no family: the node no
/// longer claims to serve what its kernel may not hold.
pub const UNHEALTHY_ANNOTATION: &str = "nodelb.io/unhealthy";
/// At most this many ports are listed (about 37 KiB at the longest): past it only the ports
/// Services ask for, and past it again the list ends with [`MORE`] and the leader counts every
/// port as held on that node.
pub const MAX_BLOCKED: usize = 1000;
/// The last entry of a list cut at [`MAX_BLOCKED`].
pub const MORE: &str = "more";

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Heartbeat {
    pub node: String,
    pub holder: Option<String>,
    pub renewed: Timestamp,
    pub families: Families,
    /// The Service ports host listeners hold on the node.
    pub blocked: BlockedPorts,
    /// The agent says its syncs have been failing for too long (why): the node serves nothing.
    pub unhealthy: Option<String>,
}

/// What an agent reports in its heartbeat, from its last committed sync.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Report {
    pub families: Families,
    pub blocked: BlockedPorts,
    /// Syncs have been failing for longer than the node lease duration: why.
    pub unhealthy: Option<String>,
}

/// The Service ports host listeners hold on a node: (family, protocol, port) with the
/// listening process where the node could tell.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct BlockedPorts {
    pub ports: BTreeMap<Slot, Option<String>>,
    /// More were held than a heartbeat lists ([`MAX_BLOCKED`]).
    pub incomplete: bool,
}

impl BlockedPorts {
    /// What a node reports: every (family, protocol, port) host listeners take there that a
    /// Service may ask for (not reserved), so that the leader knows before a Service asks; in
    /// the ephemeral port range, where the kernel's own sockets come and go, only those a
    /// Service asks for (`held`). Past [`MAX_BLOCKED`] entries only `held` is listed (and past
    /// that, [`MORE`] ends the list).
    /// `taken`: as the planner found them (`Planner::taken_ports`); `held`: the ports taken
    /// from a Service, with the process holding each where known.
    pub fn report(
        taken: &[(Slot, &Listener, bool)],
        held: &BTreeMap<Slot, Option<String>>,
        reserved: &ReservedPorts,
        ephemeral: Option<&RangeInclusive<u16>>,
    ) -> BlockedPorts {
        let mut ports = held.clone();
        for ((family, protocol, port), l, _) in taken {
            let churns = ephemeral.is_some_and(|e| e.contains(port));
            if !reserved.contains(*protocol, *port) && !churns {
                ports
                    .entry((*family, *protocol, *port))
                    .or_insert_with(|| l.process.clone());
            }
        }
        if ports.len() > MAX_BLOCKED {
            ports = held.clone();
        }
        BlockedPorts {
            ports,
            incomplete: false,
        }
    }

    /// The annotation's value: one entry per port, at most [`MAX_BLOCKED`], then [`MORE`].
    /// Process names keep only `[A-Za-z0-9._+@:-]` (others become `_`).
    pub fn format(&self) -> String {
        let mut entries: Vec<String> = self
            .ports
            .iter()
            .take(MAX_BLOCKED)
            .map(|((family, protocol, port), process)| {
                let mut e = format!("{family}/{protocol}/{port}");
                if let Some(p) = process {
                    e.push('=');
                    e.extend(p.chars().map(|c| {
                        if c.is_ascii_alphanumeric() || "._+@:-".contains(c) {
                            c
                        } else {
                            '_'
                        }
                    }));
                }
                e
            })
            .collect();
        if self.incomplete || self.ports.len() > MAX_BLOCKED {
            entries.push(MORE.to_string());
        }
        entries.join(",")
    }

    /// Read an annotation's value; entries that do not parse are skipped.
    pub fn parse(s: &str) -> BlockedPorts {
        let mut out = BlockedPorts::default();
        for entry in s.split(',').map(str::trim).filter(|e| !e.is_empty()) {
            if entry == MORE {
                out.incomplete = true;
                continue;
            }
            let (slot, process) = match entry.split_once('=') {
                Some((slot, p)) => (slot, Some(p.to_string()).filter(|p| !p.is_empty())),
                None => (entry, None),
            };
            let mut parts = slot.split('/');
            let (Some(f), Some(p), Some(n), None) =
                (parts.next(), parts.next(), parts.next(), parts.next())
            else {
                continue;
            };
            let (Some(family), Some(protocol), Ok(port)) = (
                IpFamily::parse(f),
                Protocol::parse(Some(p)),
                n.parse::<u16>(),
            ) else {
                continue;
            };
            out.ports.insert((family, protocol, port), process);
        }
        out
    }

    /// The process its node named as holding `slot`, if it named one.
    pub fn process(&self, slot: &Slot) -> Option<&str> {
        self.ports.get(slot)?.as_deref()
    }

    /// As the planner's input for that node: a listener on the family's wildcard per port.
    pub fn listeners(&self) -> HostListeners {
        let sockets: BTreeSet<Listener> = self
            .ports
            .iter()
            .map(|((family, protocol, port), process)| Listener {
                protocol: *protocol,
                address: wildcard(*family),
                port: *port,
                process: process.clone(),
            })
            .collect();
        HostListeners {
            sockets,
            incomplete: self.incomplete,
        }
    }
}

/// Liveness as the leader sees it: when it last saw each node's heartbeat renewal change, on
/// its own monotonic clock. A node's `renewTime` is compared only with its own earlier value,
/// never with the leader's clock, so a node clock minutes behind or ahead changes nothing. A
/// node seen for the first time (by a new leader, or a new node) counts as just renewed: one
/// lease duration of grace before it can be dropped.
#[derive(Clone, Debug, Default)]
pub struct Liveness {
    /// Node → its last renewal value and when it was first seen.
    seen: BTreeMap<String, (Timestamp, Instant)>,
}

impl Liveness {
    /// Take the heartbeats read at `now`; returns each node's age: the time since its renewal
    /// was last seen to change.
    pub fn ages(
        &mut self,
        beats: &BTreeMap<String, Heartbeat>,
        now: Instant,
    ) -> BTreeMap<String, Duration> {
        self.seen.retain(|node, _| beats.contains_key(node));
        let mut ages = BTreeMap::new();
        for (node, b) in beats {
            let seen = self.seen.entry(node.clone()).or_insert((b.renewed, now));
            if seen.0 != b.renewed {
                *seen = (b.renewed, now);
            }
            ages.insert(node.clone(), now.saturating_duration_since(seen.1));
        }
        ages
    }
}

/// The name of a node's heartbeat Lease.
pub fn lease_name(node: &str) -> String {
    format!("{LEASE_PREFIX}{node}")
}

/// Heartbeats by node, from the Leases in the agents' namespace (others are ignored).
pub fn read(leases: &[Lease]) -> BTreeMap<String, Heartbeat> {
    let mut out = BTreeMap::new();
    for l in leases {
        let name = l.metadata.name.as_deref().unwrap_or("");
        let Some(from_name) = name.strip_prefix(LEASE_PREFIX) else {
            continue;
        };
        let node = l
            .metadata
            .labels
            .as_ref()
            .and_then(|m| m.get(NODE_LABEL))
            .map(String::as_str)
            .unwrap_or(from_name)
            .to_string();
        let Some(spec) = &l.spec else { continue };
        let Some(renewed) = spec.renew_time.as_ref().or(spec.acquire_time.as_ref()) else {
            continue;
        };
        let families = l
            .metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(FAMILIES_ANNOTATION))
            .map(|s| super::parse_families(s))
            .unwrap_or(Families {
                v4: false,
                v6: false,
            });
        let annotation = |key: &str| l.metadata.annotations.as_ref()?.get(key);
        let blocked = annotation(BLOCKED_ANNOTATION)
            .map(|s| BlockedPorts::parse(s))
            .unwrap_or_default();
        let unhealthy = annotation(UNHEALTHY_ANNOTATION).cloned();
        out.insert(
            node.clone(),
            Heartbeat {
                node,
                holder: spec.holder_identity.clone(),
                renewed: renewed.0,
                families,
                blocked,
                unhealthy,
            },
        );
    }
    out
}
