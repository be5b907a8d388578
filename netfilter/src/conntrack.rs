//! Conntrack entries over ctnetlink: dump one family's entries of one protocol, and delete
//! chosen entries one by one, each by its exact original tuple (and zone and id). Nothing
//! else: no flush, no update, nothing outside the entries a [`Selector`] picks. Knows nothing
//! of Kubernetes.
//!
//! A delete request without a tuple would flush the whole table, so the only delete this
//! module builds ([`delete_request`]) always carries the entry's full original tuple.

use crate::netlink::{self, Attrs, Msg, Request, NFNL_SUBSYS_CTNETLINK};
use crate::scalar::{Family, L4Proto};
use crate::transact;
use std::collections::{BTreeMap, HashMap};
use std::io;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::time::{Duration, Instant};

/// Dump answers are `IPCTNL_MSG_CT_NEW` messages, one per entry.
const IPCTNL_MSG_CT_NEW: u16 = 0;
const IPCTNL_MSG_CT_GET: u16 = 1;
const IPCTNL_MSG_CT_DELETE: u16 = 2;
// enum ctattr_type
const CTA_TUPLE_ORIG: u16 = 1;
const CTA_TUPLE_REPLY: u16 = 2;
const CTA_ID: u16 = 12;
const CTA_ZONE: u16 = 18;
const CTA_FILTER: u16 = 25;
// enum ctattr_tuple
const CTA_TUPLE_IP: u16 = 1;
const CTA_TUPLE_PROTO: u16 = 2;
// enum ctattr_ip
const CTA_IP_V4_SRC: u16 = 1;
const CTA_IP_V4_DST: u16 = 2;
const CTA_IP_V6_SRC: u16 = 3;
const CTA_IP_V6_DST: u16 = 4;
// enum ctattr_l4proto
const CTA_PROTO_NUM: u16 = 1;
const CTA_PROTO_SRC_PORT: u16 = 2;
const CTA_PROTO_DST_PORT: u16 = 3;
// enum ctattr_filter, and the kernel's CTA_FILTER_FLAG(CTA_PROTO_NUM) (nf_internals.h)
const CTA_FILTER_ORIG_FLAGS: u16 = 1;
const CTA_FILTER_REPLY_FLAGS: u16 = 2;
const FILTER_PROTO_NUM: u32 = 1 << 3;

/// Delete requests sent before their answers are read: bounded so that the answers (an ACK
/// each) always fit in the socket's receive buffer.
const DELETES_IN_FLIGHT: usize = 4096;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("opening a conntrack netlink socket")]
    Open(#[source] transact::Error),
    #[error("dumping the {family} {protocol} conntrack entries")]
    Dump {
        family: Family,
        protocol: &'static str,
        #[source]
        source: io::Error,
    },
    #[error("deleting conntrack entry {entry}")]
    Delete {
        entry: String,
        #[source]
        source: io::Error,
    },
}

/// One direction of a connection.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Tuple {
    pub src: SocketAddr,
    pub dst: SocketAddr,
}

/// One conntrack entry of a protocol with ports (UDP, SCTP, TCP).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Entry {
    pub protocol: L4Proto,
    /// As the first packet came: client → the address it asked for.
    pub original: Tuple,
    /// As replies come: the one that answers (after DNAT, the endpoint) → the client (or the
    /// masquerading address).
    pub reply: Tuple,
    pub zone: u16,
    pub id: Option<u32>,
}

impl Entry {
    pub fn family(&self) -> Family {
        match self.original.src {
            SocketAddr::V4(_) => Family::Ip,
            SocketAddr::V6(_) => Family::Ip6,
        }
    }
}

impl std::fmt::Display for Entry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} {} -> {} (reply from {})",
            self.protocol.keyword(),
            self.original.src,
            self.original.dst,
            self.reply.src
        )
    }
}

/// Which entries of one original destination go.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Selector {
    pub protocol: L4Proto,
    /// The address and port the client asked for.
    pub destination: SocketAddr,
    pub replies: Replies,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Replies {
    /// Entries answered from this address and port (DNATed to it).
    From(SocketAddr),
    /// Entries answered from none of these (not DNATed to any of them).
    NoneOf(Vec<SocketAddr>),
}

impl Selector {
    pub fn family(&self) -> Family {
        match self.destination {
            SocketAddr::V4(_) => Family::Ip,
            SocketAddr::V6(_) => Family::Ip6,
        }
    }

    pub fn matches(&self, e: &Entry) -> bool {
        e.protocol == self.protocol
            && e.original.dst == self.destination
            && match &self.replies {
                Replies::From(a) => e.reply.src == *a,
                Replies::NoneOf(v) => !v.contains(&e.reply.src),
            }
    }
}

/// The entries any of `selectors` picks, in the order of `entries`.
pub fn select<'e>(entries: &'e [Entry], selectors: &[Selector]) -> Vec<&'e Entry> {
    let mut by_dst: HashMap<(L4Proto, SocketAddr), Vec<&Selector>> = HashMap::new();
    for s in selectors {
        by_dst
            .entry((s.protocol, s.destination))
            .or_default()
            .push(s);
    }
    entries
        .iter()
        .filter(|e| {
            by_dst
                .get(&(e.protocol, e.original.dst))
                .is_some_and(|v| v.iter().any(|s| s.matches(e)))
        })
        .collect()
}

/// What [`Conntrack::delete_selected`] did for one family and protocol.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Deleted {
    /// Entries of the family and protocol the kernel listed.
    pub dumped: usize,
    /// Entries deleted (an entry that expired meanwhile is not counted).
    pub deleted: usize,
    pub dump_time: Duration,
    pub delete_time: Duration,
}

/// A ctnetlink socket, in the network namespace of the thread that opened it.
pub struct Conntrack {
    sock: mnl::Socket,
    seq: u32,
}

// SAFETY: as for `Nft`: an mnl_socket is an fd plus its bound address, used through `&mut self`.
unsafe impl Send for Conntrack {}

impl Conntrack {
    /// Open a socket in the current thread's network namespace (nodelb's socket options:
    /// close-on-exec, large buffers, a receive timeout).
    pub fn open() -> Result<Conntrack, Error> {
        let sock = transact::configured_socket().map_err(Error::Open)?;
        Ok(Conntrack {
            sock,
            seq: transact::clock_seq(),
        })
    }

    fn next_seq(&mut self) -> u32 {
        self.seq = self.seq.wrapping_add(1);
        self.seq
    }

    /// Every entry of `family` and `protocol`, the protocol filtered by the kernel (a kernel
    /// that refuses the filter is asked for the family's every entry).
    pub fn dump(&mut self, family: Family, protocol: L4Proto) -> Result<Vec<Entry>, Error> {
        match self.dump_with(family, protocol, true) {
            Err(Error::Dump { source, .. })
                if matches!(source.raw_os_error(), Some(libc::EINVAL | libc::EOPNOTSUPP)) =>
            {
                self.dump_with(family, protocol, false)
            }
            r => r,
        }
    }

    fn dump_with(
        &mut self,
        family: Family,
        protocol: L4Proto,
        filtered: bool,
    ) -> Result<Vec<Entry>, Error> {
        let req = dump_request(family, protocol, filtered, self.next_seq());
        let mut out = Vec::new();
        transact::exchange(&self.sock, &req, true, |m| {
            // Entries of other protocols (unfiltered) are skipped here.
            if let Some(e) = parse_entry(&m).filter(|e| e.protocol == protocol) {
                out.push(e);
            }
        })
        .map_err(|source| Error::Dump {
            family,
            protocol: protocol.keyword(),
            source,
        })?;
        Ok(out)
    }

    /// Delete these entries, each by its exact tuple, zone and id; returns how many the
    /// kernel deleted (an entry gone meanwhile is no error and not counted).
    pub fn delete(&mut self, entries: &[&Entry]) -> Result<usize, Error> {
        let mut deleted = 0;
        for chunk in entries.chunks(DELETES_IN_FLIGHT) {
            let first = self.seq.wrapping_add(1);
            let mut buf = Vec::with_capacity(chunk.len() * 96);
            for e in chunk {
                let seq = self.next_seq();
                buf.extend_from_slice(&delete_request(e, seq));
            }
            deleted += self.send_deletes(&buf, chunk, first)?;
        }
        Ok(deleted)
    }

    /// Send one buffer of delete requests (sequence numbers `first..`) and read an answer to
    /// each.
    fn send_deletes(&mut self, buf: &[u8], chunk: &[&Entry], first: u32) -> Result<usize, Error> {
        let fail = |i: usize, source: io::Error| Error::Delete {
            entry: chunk.get(i).map(|e| e.to_string()).unwrap_or_default(),
            source,
        };
        self.sock.send(buf).map_err(|e| fail(0, e))?;
        let mut pending = chunk.len();
        let mut deleted = 0;
        let mut rbuf = vec![0u8; 1 << 20];
        while pending > 0 {
            let n = self.sock.recv_raw(&mut rbuf).map_err(|e| fail(0, e))?;
            for m in netlink::messages(&rbuf[..n]) {
                let Some((code, seq, _)) = m.error() else {
                    continue;
                };
                let i = seq.wrapping_sub(first) as usize;
                if i >= chunk.len() {
                    continue;
                }
                pending -= 1;
                match -code {
                    0 => deleted += 1,
                    libc::ENOENT => {}
                    errno => return Err(fail(i, io::Error::from_raw_os_error(errno))),
                }
            }
        }
        Ok(deleted)
    }

    /// Delete every entry one of `selectors` picks: one dump per family and protocol they
    /// name, then the deletes. Per family and protocol, what was done.
    pub fn delete_selected(
        &mut self,
        selectors: &[Selector],
    ) -> Result<BTreeMap<(Family, L4Proto), Deleted>, Error> {
        let mut groups: BTreeMap<(Family, L4Proto), Vec<Selector>> = BTreeMap::new();
        for s in selectors {
            groups
                .entry((s.family(), s.protocol))
                .or_default()
                .push(s.clone());
        }
        let mut out = BTreeMap::new();
        for ((family, protocol), sel) in groups {
            let t0 = Instant::now();
            let entries = self.dump(family, protocol)?;
            let dump_time = t0.elapsed();
            let t1 = Instant::now();
            let deleted = self.delete(&select(&entries, &sel))?;
            out.insert(
                (family, protocol),
                Deleted {
                    dumped: entries.len(),
                    deleted,
                    dump_time,
                    delete_time: t1.elapsed(),
                },
            );
        }
        Ok(out)
    }
}

/// `IPCTNL_MSG_CT_GET` dump of one family, `filtered` on the protocol by the kernel
/// (`CTA_FILTER`, Linux 5.8+).
fn dump_request(family: Family, protocol: L4Proto, filtered: bool, seq: u32) -> Vec<u8> {
    let r = Request::of(
        NFNL_SUBSYS_CTNETLINK,
        IPCTNL_MSG_CT_GET,
        libc::NLM_F_DUMP as u16,
        family.nfproto(),
        seq,
    );
    if !filtered {
        return r.finish();
    }
    r.nested(CTA_TUPLE_ORIG, |r| {
        r.nested(CTA_TUPLE_PROTO, |r| {
            r.attr_u8(CTA_PROTO_NUM, protocol.number())
        })
    })
    .nested(CTA_FILTER, |r| {
        r.attr_u32(CTA_FILTER_ORIG_FLAGS, FILTER_PROTO_NUM)
            .attr_u32(CTA_FILTER_REPLY_FLAGS, 0)
    })
    .finish()
}

/// `IPCTNL_MSG_CT_DELETE` of exactly this entry: its whole original tuple, zone and id (the
/// kernel answers `ENOENT` if the entry with that tuple is another one by now).
pub fn delete_request(e: &Entry, seq: u32) -> Vec<u8> {
    let mut r = Request::of(
        NFNL_SUBSYS_CTNETLINK,
        IPCTNL_MSG_CT_DELETE,
        libc::NLM_F_ACK as u16,
        e.family().nfproto(),
        seq,
    )
    .nested(CTA_TUPLE_ORIG, |r| tuple_attrs(r, e.protocol, &e.original))
    .attr_be16(CTA_ZONE, e.zone);
    if let Some(id) = e.id {
        r = r.attr_bytes(CTA_ID, &id.to_be_bytes());
    }
    r.finish()
}

fn tuple_attrs(r: Request, protocol: L4Proto, t: &Tuple) -> Request {
    r.nested(CTA_TUPLE_IP, |r| match (t.src.ip(), t.dst.ip()) {
        (IpAddr::V4(s), IpAddr::V4(d)) => r
            .attr_bytes(CTA_IP_V4_SRC, &s.octets())
            .attr_bytes(CTA_IP_V4_DST, &d.octets()),
        (s, d) => r
            .attr_bytes(CTA_IP_V6_SRC, &v6(s).octets())
            .attr_bytes(CTA_IP_V6_DST, &v6(d).octets()),
    })
    .nested(CTA_TUPLE_PROTO, |r| {
        r.attr_u8(CTA_PROTO_NUM, protocol.number())
            .attr_be16(CTA_PROTO_SRC_PORT, t.src.port())
            .attr_be16(CTA_PROTO_DST_PORT, t.dst.port())
    })
}

fn v6(a: IpAddr) -> Ipv6Addr {
    match a {
        IpAddr::V6(a) => a,
        IpAddr::V4(a) => a.to_ipv6_mapped(),
    }
}

fn l4proto(n: u8) -> Option<L4Proto> {
    [L4Proto::Tcp, L4Proto::Udp, L4Proto::Sctp]
        .into_iter()
        .find(|p| p.number() == n)
}

/// One entry of a dump; `None` for what is not a TCP, UDP or SCTP entry.
pub fn parse_entry(m: &Msg<'_>) -> Option<Entry> {
    if m.ty != (NFNL_SUBSYS_CTNETLINK << 8) | IPCTNL_MSG_CT_NEW {
        return None;
    }
    let attrs = m.attrs();
    let (protocol, original) = parse_tuple(attrs.get(CTA_TUPLE_ORIG)?)?;
    let (_, reply) = parse_tuple(attrs.get(CTA_TUPLE_REPLY)?)?;
    let zone = attrs
        .get(CTA_ZONE)
        .and_then(|v| v.try_into().ok())
        .map(u16::from_be_bytes)
        .unwrap_or(0);
    Some(Entry {
        protocol,
        original,
        reply,
        zone,
        id: attrs.get_be32(CTA_ID),
    })
}

fn parse_tuple(v: &[u8]) -> Option<(L4Proto, Tuple)> {
    let t = Attrs(v);
    let ip = Attrs(t.get(CTA_TUPLE_IP)?);
    let proto = Attrs(t.get(CTA_TUPLE_PROTO)?);
    let (src, dst) = match (ip.get(CTA_IP_V4_SRC), ip.get(CTA_IP_V4_DST)) {
        (Some(s), Some(d)) => (
            IpAddr::V4(Ipv4Addr::from(<[u8; 4]>::try_from(s).ok()?)),
            IpAddr::V4(Ipv4Addr::from(<[u8; 4]>::try_from(d).ok()?)),
        ),
        _ => (
            IpAddr::V6(Ipv6Addr::from(
                <[u8; 16]>::try_from(ip.get(CTA_IP_V6_SRC)?).ok()?,
            )),
            IpAddr::V6(Ipv6Addr::from(
                <[u8; 16]>::try_from(ip.get(CTA_IP_V6_DST)?).ok()?,
            )),
        ),
    };
    let protocol = l4proto(*proto.get(CTA_PROTO_NUM)?.first()?)?;
    let port = |ty| {
        proto
            .get(ty)
            .and_then(|v| v.try_into().ok())
            .map(u16::from_be_bytes)
    };
    Some((
        protocol,
        Tuple {
            src: SocketAddr::new(src, port(CTA_PROTO_SRC_PORT)?),
            dst: SocketAddr::new(dst, port(CTA_PROTO_DST_PORT)?),
        },
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sa(s: &str) -> SocketAddr {
        s.parse().unwrap()
    }

    fn entry(client: &str, dst: &str, replier: &str) -> Entry {
        Entry {
            protocol: L4Proto::Udp,
            original: Tuple {
                src: sa(client),
                dst: sa(dst),
            },
            reply: Tuple {
                src: sa(replier),
                dst: sa(client),
            },
            zone: 0,
            id: Some(7),
        }
    }

    #[test]
    fn a_delete_request_always_names_the_whole_original_tuple() {
        for e in [
            entry("192.0.2.2:5353", "203.0.113.1:53", "198.51.100.2:8053"),
            entry(
                "[2001:db8:c::2]:5353",
                "[2001:db8::1]:53",
                "[2001:db8:b::2]:8053",
            ),
        ] {
            let req = delete_request(&e, 9);
            let m = netlink::messages(&req).next().expect("one message");
            assert_eq!(m.ty, (NFNL_SUBSYS_CTNETLINK << 8) | IPCTNL_MSG_CT_DELETE);
            // Without a tuple the kernel would flush the table: the tuple is all there.
            let (protocol, t) =
                parse_tuple(m.attrs().get(CTA_TUPLE_ORIG).expect("tuple")).expect("a whole tuple");
            assert_eq!((protocol, t), (L4Proto::Udp, e.original));
            assert_eq!(m.attrs().get_be32(CTA_ID), Some(7));
            assert_eq!(m.family(), e.family().nfproto());
        }
    }

    #[test]
    fn selectors_pick_by_destination_and_replier() {
        let stale = entry("192.0.2.2:5353", "203.0.113.1:53", "198.51.100.2:8053");
        let kept = entry("192.0.2.3:5353", "203.0.113.1:53", "198.51.100.18:8053");
        let other_port = entry("192.0.2.2:5353", "203.0.113.1:54", "198.51.100.2:8053");
        let not_natted = entry("192.0.2.4:5353", "203.0.113.1:53", "203.0.113.1:53");
        let mut tcp = stale;
        tcp.protocol = L4Proto::Tcp;
        let all = [stale, kept, other_port, not_natted, tcp];
        let left = Selector {
            protocol: L4Proto::Udp,
            destination: sa("203.0.113.1:53"),
            replies: Replies::From(sa("198.51.100.2:8053")),
        };
        assert_eq!(select(&all, std::slice::from_ref(&left)), vec![&stale]);
        let opened = Selector {
            protocol: L4Proto::Udp,
            destination: sa("203.0.113.1:53"),
            replies: Replies::NoneOf(vec![sa("198.51.100.18:8053")]),
        };
        assert_eq!(
            select(&all, std::slice::from_ref(&opened)),
            vec![&stale, &not_natted]
        );
        assert_eq!(select(&all, &[left, opened]), vec![&stale, &not_natted]);
    }
}
