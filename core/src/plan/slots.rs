//! Stable endpoint slots: the index of `map endpoints` each endpoint of a Service port holds,
//! the value `numgen random mod N` picks it by.
//!
//! Planned from nothing, a port's endpoints take the indexes in sorted order. After that an
//! endpoint keeps its index as long as it stays: one that comes takes the index of one that
//! went, or the next one; one that goes leaves its index to the endpoint in the last. So one
//! endpoint more or less rewrites at most two elements, where numbering them sorted again would
//! renumber every endpoint after it (5,000 elements behind one Service at Kubernetes' limit).
//!
//! The order is history, not a function of the objects: the planner keeps it ([`Orders`],
//! only where it differs from sorted), and a planner started from nothing (an agent that
//! restarts, a rebuild) numbers sorted again, in the commit that replaces the table, unless it
//! was given the kernel's order first ([`seed`]). For a plain port, which index an endpoint
//! has changes nothing a packet sees: each is picked as likely. A port with ClientIP affinity
//! keeps its clients by index (its set `aff-<hash>` holds `client . slot`), so there
//! an index that moves moves its clients.

use super::endpoints::{EndpointAddr, Selection};
use super::prepare::{Prepared, Stage};
use crate::vocab::{IpFamily, ServicePortId};
use nodelb_netfilter::edit::changed_entries;
use nodelb_netfilter::RawElement;
use std::collections::BTreeMap;
use std::net::IpAddr;

/// One Service's ports whose endpoints are not in sorted order, with their order (by family
/// and port, sorted).
pub type Orders = Vec<((IpFamily, ServicePortId), Vec<EndpointAddr>)>;

/// The order recorded for one port, if it is not sorted.
pub fn recorded<'a>(
    orders: &'a Orders,
    family: IpFamily,
    port: &ServicePortId,
) -> Option<&'a [EndpointAddr]> {
    orders
        .iter()
        .find(|((f, p), _)| *f == family && p == port)
        .map(|(_, o)| o.as_slice())
}

/// The endpoints of `now` (sorted) in slots that follow `before` (the order last planned):
/// each that stays keeps its index, those that come fill the freed indexes in sorted order,
/// then the end; indexes left over past the new count are filled from the last.
pub fn stable(before: &[EndpointAddr], now: &[EndpointAddr]) -> Vec<EndpointAddr> {
    let mut known = before.to_vec();
    // A stable sort: a recorded order is mostly sorted runs, which it merges.
    known.sort();
    let (gone, coming) = differences(&known, now);
    let mut coming = coming.into_iter();
    let mut slots: Vec<Option<EndpointAddr>> = before
        .iter()
        .map(|e| gone.binary_search(e).is_err().then_some(*e))
        .collect();
    for slot in slots.iter_mut().filter(|s| s.is_none()) {
        match coming.next() {
            Some(e) => *slot = Some(e),
            None => break,
        }
    }
    slots.extend(coming.map(Some));
    let mut i = 0;
    while i < slots.len() {
        if slots[i].is_none() {
            // The last slot's endpoint takes it (if the last is free too, look again).
            slots.swap_remove(i);
        } else {
            i += 1;
        }
    }
    slots.into_iter().flatten().collect()
}

/// What is only in `before` and what is only in `now`, both sorted, in one walk of the two.
fn differences(
    before: &[EndpointAddr],
    now: &[EndpointAddr],
) -> (Vec<EndpointAddr>, Vec<EndpointAddr>) {
    let (mut gone, mut coming) = (Vec::new(), Vec::new());
    let before = before.iter().map(|e| (*e, ()));
    let now = now.iter().map(|e| (*e, ()));
    for (e, was, _) in changed_entries(before, now) {
        match was {
            Some(()) => gone.push(e),
            None => coming.push(e),
        }
    }
    (gone, coming)
}

/// The endpoints a port's selection sends to through the map.
fn mapped(selection: &Selection) -> Option<&[EndpointAddr]> {
    match selection {
        Selection::Forward { endpoints, .. } => Some(endpoints),
        Selection::DropNotLocal { elsewhere } => Some(elsewhere),
        Selection::Reject => None,
    }
}

/// The ports of a prepared Service whose endpoints go through the map, each with them sorted.
fn mapped_ports(
    p: Option<&Prepared>,
) -> impl Iterator<Item = (IpFamily, &ServicePortId, &[EndpointAddr])> {
    let ports = match p.map(|p| &p.stage) {
        Some(Stage::Ports { ports, .. }) => ports.as_slice(),
        _ => &[],
    };
    ports
        .iter()
        .filter_map(|pp| Some((pp.family, &pp.port, mapped(&pp.selection)?)))
}

/// The orders of a Service prepared as `new`, following those it had as `old` (`old_orders`
/// recorded for it; a port not recorded was sorted). Only orders that are not sorted are
/// returned.
pub fn follow(old: Option<&Prepared>, old_orders: &Orders, new: Option<&Prepared>) -> Orders {
    following(new, |family, port| {
        recorded(old_orders, family, port).or_else(|| {
            mapped_ports(old)
                .find(|(f, p, _)| *f == family && *p == port)
                .map(|(_, _, eps)| eps)
        })
    })
}

/// The orders of the mapped ports of a Service prepared as `new` that follow the order
/// `before` gives each (none: sorted). Only orders that are not sorted are returned.
fn following<'b>(
    new: Option<&Prepared>,
    before: impl Fn(IpFamily, &ServicePortId) -> Option<&'b [EndpointAddr]>,
) -> Orders {
    let mut out = Orders::new();
    for (family, port, now) in mapped_ports(new) {
        let Some(before) = before(family, port).filter(|b| *b != now) else {
            continue;
        };
        let order = stable(before, now);
        if order != now {
            out.push(((family, port.clone()), order));
        }
    }
    out.sort_by(|a, b| a.0.cmp(&b.0));
    out
}

/// The endpoint order of each port (protocol number, port) in a table's `map endpoints` as
/// the kernel holds it (`l4proto . th dport . index : address . port`, as the skeleton declares
/// it), from index 0 up to the first index missing. Elements of another shape are skipped.
pub type KernelOrders = BTreeMap<(u8, u16), Vec<EndpointAddr>>;

pub fn kernel_orders(family: IpFamily, elements: &[RawElement]) -> KernelOrders {
    let addr_len = match family {
        IpFamily::V4 => 4,
        IpFamily::V6 => 16,
    };
    let mut slots: BTreeMap<(u8, u16), BTreeMap<u32, EndpointAddr>> = BTreeMap::new();
    for e in elements {
        // Each field takes a multiple of 4 bytes: the protocol 1, a port 2 (network order),
        // the index 4 (host order).
        let (k, d) = (&e.key, &e.data);
        if k.len() != 12 || d.len() != addr_len + 4 {
            continue;
        }
        let port = u16::from_be_bytes([k[4], k[5]]);
        let index = u32::from_ne_bytes([k[8], k[9], k[10], k[11]]);
        let addr = match family {
            IpFamily::V4 => IpAddr::from(<[u8; 4]>::try_from(&d[..4]).expect("4 bytes")),
            IpFamily::V6 => IpAddr::from(<[u8; 16]>::try_from(&d[..16]).expect("16 bytes")),
        };
        let target = u16::from_be_bytes([d[addr_len], d[addr_len + 1]]);
        let endpoint = EndpointAddr { addr, port: target };
        slots
            .entry((k[0], port))
            .or_default()
            .insert(index, endpoint);
    }
    slots
        .into_iter()
        .map(|(port, by_index)| {
            let order = by_index
                .into_iter()
                .enumerate()
                .take_while(|(i, (index, _))| *i as u32 == *index)
                .map(|(_, (_, e))| e)
                .collect();
            (port, order)
        })
        .collect()
}

/// The orders of a Service prepared as `p` that follow the kernel's (`kernel`, of each
/// family), for its ports with ClientIP affinity: they keep clients by slot, so a planner
/// started from nothing takes the slots the kernel holds rather than number them sorted.
/// Only orders that are not sorted are returned.
pub fn seed<'k>(p: &Prepared, kernel: impl Fn(IpFamily) -> Option<&'k KernelOrders>) -> Orders {
    if !matches!(
        &p.stage,
        Stage::Ports {
            affinity: Some(_),
            ..
        }
    ) {
        return Orders::new();
    }
    following(Some(p), |family, port| {
        let key = (port.protocol.l4().number(), port.port);
        kernel(family)?.get(&key).map(Vec::as_slice)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ep(i: u8) -> EndpointAddr {
        EndpointAddr {
            addr: [192, 0, 2, i].into(),
            port: 80,
        }
    }

    fn eps(ids: &[u8]) -> Vec<EndpointAddr> {
        ids.iter().map(|i| ep(*i)).collect()
    }

    #[test]
    fn an_endpoint_that_goes_leaves_its_slot_to_the_last() {
        assert_eq!(
            stable(&eps(&[1, 2, 3, 4, 5]), &eps(&[1, 3, 4, 5])),
            eps(&[1, 5, 3, 4])
        );
        // The last itself goes: nothing else moves.
        assert_eq!(stable(&eps(&[1, 2, 3]), &eps(&[1, 2])), eps(&[1, 2]));
        // Two go, one of them among the last: the other last fills the first hole.
        assert_eq!(
            stable(&eps(&[1, 2, 3, 4, 5]), &eps(&[1, 3, 4])),
            eps(&[1, 4, 3])
        );
    }

    #[test]
    fn an_endpoint_that_comes_takes_a_freed_slot_or_the_next() {
        assert_eq!(
            stable(&eps(&[3, 1, 2]), &eps(&[1, 2, 3, 4])),
            eps(&[3, 1, 2, 4])
        );
        // One goes and one comes in the same update: one slot changes.
        assert_eq!(stable(&eps(&[3, 1, 2]), &eps(&[1, 3, 9])), eps(&[3, 1, 9]));
        // More come than went: the rest at the end, sorted.
        assert_eq!(
            stable(&eps(&[5, 1]), &eps(&[1, 7, 8, 9])),
            eps(&[7, 1, 8, 9])
        );
    }

    /// A `map endpoints` element as the kernel holds it.
    fn raw(proto: u8, port: u16, index: u32, addr: IpAddr, target: u16) -> RawElement {
        let mut key = vec![proto, 0, 0, 0];
        key.extend(port.to_be_bytes());
        key.extend([0, 0]);
        key.extend(index.to_ne_bytes());
        let mut data = match addr {
            IpAddr::V4(a) => a.octets().to_vec(),
            IpAddr::V6(a) => a.octets().to_vec(),
        };
        data.extend(target.to_be_bytes());
        data.extend([0, 0]);
        RawElement { key, data }
    }

    #[test]
    fn the_kernels_slots_are_read_by_port_up_to_the_first_gap() {
        let a = |i: u8| IpAddr::from([192, 0, 2, i]);
        let elements = [
            raw(6, 80, 1, a(1), 80),
            raw(6, 80, 0, a(3), 80),
            raw(17, 53, 0, a(9), 5353),
            // Index 1 is missing: index 2 cannot be told apart from a stale element.
            raw(17, 53, 2, a(8), 5353),
            // Another family's element: not this table's shape.
            raw(6, 81, 0, "2001:db8::1".parse().unwrap(), 80),
        ];
        let orders = kernel_orders(IpFamily::V4, &elements);
        assert_eq!(orders[&(6, 80)], eps(&[3, 1]));
        let dns = EndpointAddr {
            addr: a(9),
            port: 5353,
        };
        assert_eq!(orders[&(17, 53)], [dns]);
        assert!(!orders.contains_key(&(6, 81)));
        let v6 = kernel_orders(IpFamily::V6, &elements);
        assert_eq!(v6.len(), 1, "{v6:?}");
        assert_eq!(
            v6[&(6, 81)][0].addr,
            "2001:db8::1".parse::<IpAddr>().unwrap()
        );
    }

    #[test]
    fn every_endpoint_once_whatever_the_history() {
        let mut order = eps(&[4, 2, 9]);
        for step in 0..200u32 {
            let now: Vec<EndpointAddr> = (1..30u8)
                .filter(|i| (u32::from(*i) * 7 + step * 13) % 5 < 3)
                .map(ep)
                .collect();
            let next = stable(&order, &now);
            let mut sorted = next.clone();
            sorted.sort();
            assert_eq!(sorted, now, "step {step}");
            // Every endpoint that stayed kept its index unless it was one of the last.
            let moved = order
                .iter()
                .enumerate()
                .filter(|(i, e)| *i < next.len() && now.contains(e) && next[*i] != **e)
                .count();
            assert_eq!(moved, 0, "step {step}: an endpoint that stayed moved");
            order = next;
        }
    }
}
