//! The host's local addresses, from rtnetlink: one dump at start, then `RTM_NEWADDR` /
//! `RTM_DELADDR` events (groups `RTNLGRP_IPV4_IFADDR`, `RTNLGRP_IPV6_IFADDR`), published as a
//! snapshot on a `watch` channel. IPv6 link-local addresses and addresses not usable yet
//! (tentative, or failed duplicate address detection) are left out.

use futures::{StreamExt, TryStreamExt};
use netlink_packet_route::address::{AddressAttribute, AddressFlags, AddressMessage};
use netlink_packet_route::RouteNetlinkMessage;
use rtnetlink::packet_core::NetlinkPayload;
use rtnetlink::{Handle, MulticastGroup};
use std::collections::BTreeSet;
use std::net::IpAddr;
use std::time::Duration;
use tokio::sync::watch;
use tracing::{debug, info, warn};

pub type Snapshot = BTreeSet<IpAddr>;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("opening an rtnetlink socket subscribed to address events")]
    Open(#[source] std::io::Error),
    #[error("dumping the host's addresses")]
    Dump(#[source] rtnetlink::Error),
    #[error("the rtnetlink event socket closed")]
    Closed,
}

/// Addresses per interface (an address may be on two interfaces; it stays local until it is
/// gone from both).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct AddressTable {
    by_link: BTreeSet<(IpAddr, u32)>,
}

/// The address of a message, its interface, and whether it can be served on now.
fn read_message(m: &AddressMessage) -> Option<(IpAddr, u32, bool)> {
    let mut address = None;
    let mut local = None;
    let mut flags = AddressFlags::from_bits_retain(u32::from(m.header.flags.bits()));
    for a in &m.attributes {
        match a {
            AddressAttribute::Address(ip) => address = Some(*ip),
            AddressAttribute::Local(ip) => local = Some(*ip),
            // The 32-bit attribute, when present, is the whole story.
            AddressAttribute::Flags(f) => flags = *f,
            _ => {}
        }
    }
    // For IPv4, IFA_LOCAL is the host's address (IFA_ADDRESS is the peer on point-to-point).
    let ip = local.or(address)?;
    let not_ready = flags.intersects(AddressFlags::Tentative | AddressFlags::Dadfailed);
    let link_local = matches!(ip, IpAddr::V6(v6) if (v6.segments()[0] & 0xffc0) == 0xfe80);
    Some((ip, m.header.index, !not_ready && !link_local))
}

impl AddressTable {
    /// Apply one `RTM_NEWADDR` (`present`) or `RTM_DELADDR`. Returns whether the snapshot may
    /// have changed.
    pub fn apply(&mut self, m: &AddressMessage, present: bool) -> bool {
        let Some((ip, index, usable)) = read_message(m) else {
            return false;
        };
        if present && usable {
            self.by_link.insert((ip, index))
        } else {
            self.by_link.remove(&(ip, index))
        }
    }

    pub fn snapshot(&self) -> Snapshot {
        self.by_link.iter().map(|(ip, _)| *ip).collect()
    }
}

async fn dump(handle: &Handle) -> Result<AddressTable, Error> {
    let mut table = AddressTable::default();
    let mut stream = handle.address().get().execute();
    while let Some(m) = stream.try_next().await.map_err(Error::Dump)? {
        table.apply(&m, true);
    }
    Ok(table)
}

/// Follows the host's addresses until the receiver is dropped.
pub struct AddressWatch {
    pub rx: watch::Receiver<Snapshot>,
    pub task: tokio::task::JoinHandle<Result<(), Error>>,
}

/// Subscribe, dump, and keep the snapshot current. Returns once the first snapshot is complete.
/// The table is dumped again every `redump` (events can be lost when the socket overruns).
/// Runs in the network namespace of the calling thread.
pub async fn watch(redump: Duration) -> Result<AddressWatch, Error> {
    let (conn, handle, mut messages) = rtnetlink::new_multicast_connection(&[
        MulticastGroup::Ipv4Ifaddr,
        MulticastGroup::Ipv6Ifaddr,
    ])
    .map_err(Error::Open)?;
    let conn_task = tokio::spawn(conn);
    // Subscribed before the dump: an event racing the dump is applied after it, in order, so
    // the table converges on what the kernel holds.
    let mut table = dump(&handle).await?;
    let (tx, rx) = watch::channel(table.snapshot());
    info!(addresses = ?table.snapshot(), "host addresses");
    let task = tokio::spawn(async move {
        let _conn = AbortOnDrop(conn_task);
        let mut tick = tokio::time::interval(redump);
        tick.reset();
        loop {
            let changed = tokio::select! {
                _ = tx.closed() => return Ok(()),
                m = messages.next() => {
                    let Some((m, _)) = m else { return Err(Error::Closed) };
                    match m.payload {
                        NetlinkPayload::InnerMessage(RouteNetlinkMessage::NewAddress(a)) => table.apply(&a, true),
                        NetlinkPayload::InnerMessage(RouteNetlinkMessage::DelAddress(a)) => table.apply(&a, false),
                        NetlinkPayload::Overrun(_) => {
                            warn!("address events overran; dumping again");
                            table = dump(&handle).await?;
                            true
                        }
                        _ => false,
                    }
                }
                _ = tick.tick() => {
                    let fresh = dump(&handle).await?;
                    let changed = fresh != table;
                    if changed {
                        warn!("address dump differs from the events followed; using the dump");
                    }
                    table = fresh;
                    changed
                }
            };
            if changed {
                let snap = table.snapshot();
                tx.send_if_modified(|cur| {
                    if *cur == snap {
                        return false;
                    }
                    debug!(addresses = ?snap, "host addresses changed");
                    *cur = snap;
                    true
                });
            }
        }
    });
    Ok(AddressWatch { rx, task })
}

struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::host::test_netns::{ip, root_or_skip};

    async fn wait_for(
        rx: &mut watch::Receiver<Snapshot>,
        what: &str,
        pred: impl Fn(&Snapshot) -> bool,
    ) -> Snapshot {
        let found =
            match tokio::time::timeout(Duration::from_secs(5), rx.wait_for(|s| pred(s))).await {
                Ok(Ok(s)) => Some(s.clone()),
                _ => None,
            };
        found.unwrap_or_else(|| panic!("timed out waiting for {what}; have {:?}", *rx.borrow()))
    }

    /// In a fresh network namespace (this thread only): the dump sees what is there, events add
    /// and remove addresses, link-local and tentative IPv6 addresses stay out.
    #[test]
    fn follows_addresses_in_a_fresh_network_namespace() {
        if !root_or_skip("follows_addresses_in_a_fresh_network_namespace") {
            return;
        }
        std::thread::spawn(|| {
            nix::sched::unshare(nix::sched::CloneFlags::CLONE_NEWNET)
                .expect("unshare(CLONE_NEWNET)");
            // Child processes forked from this thread inherit its namespace.
            ip("link set lo up");
            ip("link add nlbt0 type veth peer name nlbt0p");
            ip("link set nlbt0p up");
            ip("addr add 192.0.2.1/24 dev nlbt0");
            ip("link set nlbt0 up");
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            rt.block_on(async {
                let mut w = watch(Duration::from_secs(3600)).await.expect("watch");
                let first = w.rx.borrow().clone();
                let v4 = |s: &str| s.parse::<IpAddr>().unwrap();
                assert!(first.contains(&v4("192.0.2.1")), "{first:?}");
                assert!(first.contains(&v4("127.0.0.1")), "{first:?}");
                assert!(
                    first.iter().all(|a| !a.to_string().starts_with("fe80")),
                    "{first:?}"
                );

                ip("addr add 198.51.100.9/24 dev nlbt0");
                wait_for(&mut w.rx, "a new IPv4 address", |s| {
                    s.contains(&v4("198.51.100.9"))
                })
                .await;
                ip("addr del 192.0.2.1/24 dev nlbt0");
                wait_for(&mut w.rx, "a removed address", |s| {
                    !s.contains(&v4("192.0.2.1"))
                })
                .await;

                // Without carrier (peer down) IPv6 addresses stay tentative: not served
                // until duplicate address detection is done.
                ip("link add nlbt1 type veth peer name nlbt1p");
                ip("link set nlbt1 up");
                ip("addr add 2001:db8::7/64 dev nlbt1");
                ip("addr add 2001:db8::8/64 dev nlbt0 nodad");
                wait_for(&mut w.rx, "a nodad IPv6 address", |s| {
                    s.contains(&v4("2001:db8::8"))
                })
                .await;
                assert!(
                    !w.rx.borrow().contains(&v4("2001:db8::7")),
                    "tentative address served"
                );
                ip("link set nlbt1p up");
                let s = wait_for(&mut w.rx, "the IPv6 address after DAD", |s| {
                    s.contains(&v4("2001:db8::7"))
                })
                .await;
                assert!(
                    s.iter().all(|a| !a.to_string().starts_with("fe80")),
                    "{s:?}"
                );

                // The same address on two links stays until it is gone from both.
                ip("addr add 198.51.100.9/24 dev nlbt1");
                ip("addr del 198.51.100.9/24 dev nlbt0");
                ip("addr add 203.0.113.1/24 dev nlbt0");
                let s = wait_for(&mut w.rx, "a later address", |s| {
                    s.contains(&v4("203.0.113.1"))
                })
                .await;
                assert!(s.contains(&v4("198.51.100.9")), "{s:?}");
                ip("link del nlbt1");
                wait_for(&mut w.rx, "addresses of a deleted link gone", |s| {
                    !s.contains(&v4("198.51.100.9")) && !s.contains(&v4("2001:db8::7"))
                })
                .await;
            });
        })
        .join()
        .expect("the namespace thread panicked");
    }
}
