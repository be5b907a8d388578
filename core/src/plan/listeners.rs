//! Host listeners as the planner sees them. A process on the node that listens on a
//! (protocol, port) on a served address, or on its family's wildcard, takes that (family,
//! protocol, port) from every Service on this node, whenever it started: a listener always
//! wins. One on another address (loopback, an address the node does not serve on) takes
//! nothing. A dual-stack IPv6 wildcard socket (no `IPV6_V6ONLY`) arrives here as two
//! listeners, `::` and `0.0.0.0`, as the host reads it.

use super::conflicts::Slot;
use crate::vocab::{IpFamily, Listener};
use std::collections::{BTreeMap, BTreeSet};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

/// The node's listening sockets, as the host reads them (or as a heartbeat reports them).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct HostListeners {
    pub sockets: BTreeSet<Listener>,
    /// Some ports in use were not reported (a heartbeat carries a bounded list): every port
    /// counts as taken on this node.
    pub incomplete: bool,
}

impl HostListeners {
    pub fn new(sockets: BTreeSet<Listener>) -> HostListeners {
        HostListeners {
            sockets,
            incomplete: false,
        }
    }
}

/// What the listeners take on a node, given its served addresses: per (family, protocol,
/// port), the listener that takes it (the first in order: the wildcard before any address).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Taken {
    slots: BTreeMap<Slot, Listener>,
    every_port: bool,
}

/// The wildcard address of a family.
pub fn wildcard(family: IpFamily) -> IpAddr {
    match family {
        IpFamily::V4 => IpAddr::V4(Ipv4Addr::UNSPECIFIED),
        IpFamily::V6 => IpAddr::V6(Ipv6Addr::UNSPECIFIED),
    }
}

impl Taken {
    pub fn new(listeners: &HostListeners, served: &BTreeMap<IpFamily, Vec<IpAddr>>) -> Taken {
        let mut slots = BTreeMap::new();
        for l in &listeners.sockets {
            let family = IpFamily::of(&l.address);
            let takes = l.address.is_unspecified()
                || served.get(&family).is_some_and(|a| a.contains(&l.address));
            if takes {
                slots
                    .entry((family, l.protocol, l.port))
                    .or_insert_with(|| l.clone());
            }
        }
        Taken {
            slots,
            every_port: listeners.incomplete,
        }
    }

    /// The listener that takes a slot, if any.
    pub fn get(&self, slot: &Slot) -> Option<Listener> {
        match self.slots.get(slot) {
            Some(l) => Some(l.clone()),
            None if self.every_port => Some(Listener {
                protocol: slot.1,
                address: wildcard(slot.0),
                port: slot.2,
                process: None,
            }),
            None => None,
        }
    }

    /// Whether every port counts as taken (see [`HostListeners::incomplete`]).
    pub fn every_port(&self) -> bool {
        self.every_port
    }

    /// The slots taken by a listener that was reported.
    pub fn slots(&self) -> impl Iterator<Item = (&Slot, &Listener)> {
        self.slots.iter()
    }

    /// The slots whose taker differs from `before` (taken, freed, or taken by another
    /// listener); `every_port` is compared by the caller.
    pub fn moved(&self, before: &Taken) -> BTreeSet<Slot> {
        let mut out = BTreeSet::new();
        for (slot, l) in &self.slots {
            if before.slots.get(slot) != Some(l) {
                out.insert(*slot);
            }
        }
        for slot in before.slots.keys() {
            if !self.slots.contains_key(slot) {
                out.insert(*slot);
            }
        }
        out
    }
}
