//! The host's listening sockets, read through sock_diag (`inet_diag`) netlink in the agent's
//! network namespace: TCP in state LISTEN, UDP bound and not connected (state CLOSE), SCTP
//! listening, IPv4 and IPv6. The kernel filters by state, so a dump costs the listening
//! sockets, not the connections. Where `/proc` tells, each socket that could hold a node
//! address's port is named by its process (`/proc/<pid>/fd` → `socket:[inode]`,
//! `/proc/<pid>/comm`), cached by inode; never required.
//!
//! What a socket takes, as the planner reads it: an IPv6 socket bound to `::` without
//! `IPV6_V6ONLY` (the kernel reports `INET_DIAG_SKV6ONLY` for every IPv6 socket) also takes
//! IPv4, so it becomes two listeners, `::` and `0.0.0.0`; one bound to a v4-mapped address
//! (`::ffff:192.0.2.1`) takes that IPv4 address only. The agent's own sockets (its health and
//! metrics ports, reserved anyway) are left out: the agent never holds a port against itself.

use netlink_packet_core::{
    NetlinkHeader, NetlinkMessage, NetlinkPayload, NLM_F_DUMP, NLM_F_REQUEST,
};
use netlink_packet_sock_diag::constants::{
    AF_INET, AF_INET6, IPPROTO_SCTP, IPPROTO_TCP, IPPROTO_UDP,
};
use netlink_packet_sock_diag::inet::{
    nlas::Nla, ExtensionFlags, InetRequest, InetResponse, SocketId, StateFlags,
};
use netlink_packet_sock_diag::SockDiagMessage;
use netlink_sys::{protocols::NETLINK_SOCK_DIAG, Socket, SocketAddr};
use nodelb_core::vocab::{Listener, Protocol};
use std::collections::{BTreeMap, BTreeSet};
use std::net::{IpAddr, Ipv4Addr};
use std::path::Path;
use std::sync::Mutex;
use std::time::{Duration, Instant};
use tracing::{debug, info};

/// How often `/proc/net/protocols` is read again to see whether the kernel has SCTP (its
/// module loads on first use, and may be unloaded): not at every read, which is every sync.
const SCTP_RECHECK: Duration = Duration::from_secs(1);

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("opening a sock_diag netlink socket")]
    Open(#[source] std::io::Error),
    #[error("asking for the {what} sockets")]
    Send {
        what: String,
        #[source]
        source: std::io::Error,
    },
    #[error("reading the dump of {what} sockets")]
    Receive {
        what: String,
        #[source]
        source: std::io::Error,
    },
    #[error("the kernel refused the dump of {what} sockets")]
    Refused {
        what: String,
        #[source]
        source: std::io::Error,
    },
    #[error("decoding the dump of {what} sockets")]
    Decode {
        what: String,
        #[source]
        source: netlink_packet_core::DecodeError,
    },
}

/// One socket as the kernel reports it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ListeningSocket {
    pub protocol: Protocol,
    pub address: IpAddr,
    pub port: u16,
    /// `IPV6_V6ONLY`, for IPv6 sockets (`None` when the kernel did not say).
    pub v6only: Option<bool>,
    pub inode: u32,
}

/// The addresses a socket takes traffic for (see the module docs).
pub fn addresses_of(s: &ListeningSocket) -> Vec<IpAddr> {
    match s.address {
        IpAddr::V6(a) => {
            if let Some(v4) = a.to_ipv4_mapped() {
                vec![IpAddr::V4(v4)]
            } else if a.is_unspecified() && s.v6only != Some(true) {
                vec![s.address, IpAddr::V4(Ipv4Addr::UNSPECIFIED)]
            } else {
                vec![s.address]
            }
        }
        IpAddr::V4(_) => vec![s.address],
    }
}

/// The listeners of `sockets` but those in `exclude`, each named as `names` says.
pub fn listeners(
    sockets: &[ListeningSocket],
    exclude: &BTreeSet<u32>,
    names: &BTreeMap<u32, Option<String>>,
) -> BTreeSet<Listener> {
    let mut out = BTreeSet::new();
    for s in sockets.iter().filter(|s| !exclude.contains(&s.inode)) {
        let process = names.get(&s.inode).cloned().flatten();
        for address in addresses_of(s) {
            out.insert(Listener {
                protocol: s.protocol,
                address,
                port: s.port,
                process: process.clone(),
            });
        }
    }
    out
}

/// A netlink socket asking for socket dumps.
struct Dumper {
    socket: Socket,
    seq: u32,
    buf: Vec<u8>,
}

/// What one dump asks for.
#[derive(Clone, Copy, Debug)]
struct Ask {
    family: u8,
    protocol: Protocol,
}

impl Ask {
    fn what(&self) -> String {
        let fam = if self.family == AF_INET6 {
            "IPv6"
        } else {
            "IPv4"
        };
        format!("{fam} {} listening", self.protocol)
    }
}

/// The dumps of one read: TCP and UDP in both families, SCTP when the kernel has it.
fn asks(sctp: bool) -> Vec<Ask> {
    let mut protocols = vec![Protocol::Tcp, Protocol::Udp];
    if sctp {
        protocols.push(Protocol::Sctp);
    }
    protocols
        .into_iter()
        .flat_map(|protocol| {
            [AF_INET, AF_INET6]
                .into_iter()
                .map(move |family| Ask { family, protocol })
        })
        .collect()
}

impl Dumper {
    fn open() -> Result<Dumper, Error> {
        let mut socket = Socket::new(NETLINK_SOCK_DIAG).map_err(Error::Open)?;
        socket.bind_auto().map_err(Error::Open)?;
        socket
            .connect(&SocketAddr::new(0, 0))
            .map_err(Error::Open)?;
        Ok(Dumper {
            socket,
            seq: 0,
            // A dump's skb is at most 32 KiB.
            buf: vec![0; 64 * 1024],
        })
    }

    /// Every socket of one (family, protocol) in the listening state.
    fn dump(&mut self, ask: Ask) -> Result<Vec<ListeningSocket>, Error> {
        let what = || ask.what();
        let (proto, states) = match ask.protocol {
            Protocol::Tcp => (IPPROTO_TCP, StateFlags::LISTEN),
            // Bound and not connected.
            Protocol::Udp => (IPPROTO_UDP, StateFlags::CLOSE),
            Protocol::Sctp => (IPPROTO_SCTP, StateFlags::LISTEN),
        };
        let socket_id = if ask.family == AF_INET6 {
            SocketId::new_v6()
        } else {
            SocketId::new_v4()
        };
        let mut header = NetlinkHeader::default();
        header.flags = NLM_F_REQUEST | NLM_F_DUMP;
        self.seq = self.seq.wrapping_add(1);
        header.sequence_number = self.seq;
        let mut msg = NetlinkMessage::new(
            header,
            SockDiagMessage::InetRequest(InetRequest {
                family: ask.family,
                protocol: proto,
                extensions: ExtensionFlags::empty(),
                states,
                socket_id,
            })
            .into(),
        );
        msg.finalize();
        let mut out = vec![0; msg.buffer_len()];
        msg.serialize(&mut out);
        self.socket.send(&out, 0).map_err(|source| Error::Send {
            what: what(),
            source,
        })?;
        let mut found = Vec::new();
        loop {
            let n = self
                .socket
                .recv(&mut &mut self.buf[..], 0)
                .map_err(|source| Error::Receive {
                    what: what(),
                    source,
                })?;
            let mut at = 0;
            while at < n {
                let m = NetlinkMessage::<SockDiagMessage>::deserialize(&self.buf[at..n]).map_err(
                    |source| Error::Decode {
                        what: what(),
                        source,
                    },
                )?;
                let len = m.header.length as usize;
                if m.header.sequence_number == self.seq {
                    match m.payload {
                        NetlinkPayload::InnerMessage(SockDiagMessage::InetResponse(r)) => {
                            found.push(read_response(ask.protocol, &r));
                        }
                        NetlinkPayload::Done(_) => return Ok(found),
                        NetlinkPayload::Error(e) => {
                            return Err(Error::Refused {
                                what: what(),
                                source: e.to_io(),
                            })
                        }
                        _ => {}
                    }
                }
                if len == 0 {
                    break;
                }
                at += len;
            }
        }
    }
}

fn read_response(protocol: Protocol, r: &InetResponse) -> ListeningSocket {
    let v6only = r.nlas.iter().find_map(|n| match n {
        Nla::SkV6Only(v) => Some(*v),
        _ => None,
    });
    ListeningSocket {
        protocol,
        address: r.header.socket_id.source_address,
        port: r.header.socket_id.source_port,
        v6only,
        inode: r.header.inode,
    }
}

/// Whether the kernel has SCTP at all (it is often a module, loaded on first use): without
/// it no SCTP socket exists, and asking sock_diag for SCTP would load `sctp_diag`, and with
/// it `sctp`, on the node.
fn kernel_has_sctp() -> bool {
    std::fs::read_to_string("/proc/net/protocols")
        .map(|t| {
            t.lines()
                .any(|l| l.split_whitespace().next() == Some("SCTP"))
        })
        .unwrap_or(false)
}

/// The socket inodes of a process's open files (`/proc/<pid>/fd`).
fn socket_inodes(fd_dir: &Path) -> impl Iterator<Item = u32> {
    std::fs::read_dir(fd_dir)
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| {
            let target = std::fs::read_link(e.path()).ok()?;
            let t = target.to_str()?;
            t.strip_prefix("socket:[")?.strip_suffix(']')?.parse().ok()
        })
}

/// The process owning each of `wanted` (by its `comm`), as far as `/proc` tells: one pass
/// over every process's open files, stopped once all are found. `skip`: this process.
fn owners(wanted: &BTreeSet<u32>, skip: u32) -> BTreeMap<u32, String> {
    let mut found = BTreeMap::new();
    let Ok(procs) = std::fs::read_dir("/proc") else {
        return found;
    };
    for p in procs.flatten() {
        if found.len() == wanted.len() {
            break;
        }
        let Some(pid) = p.file_name().to_str().and_then(|s| s.parse::<u32>().ok()) else {
            continue;
        };
        if pid == skip {
            continue;
        }
        let mut comm = None;
        for inode in socket_inodes(&p.path().join("fd")) {
            if wanted.contains(&inode) && !found.contains_key(&inode) {
                let name = comm.get_or_insert_with(|| {
                    std::fs::read_to_string(p.path().join("comm"))
                        .map(|c| c.trim_end().to_string())
                        .unwrap_or_default()
                });
                if !name.is_empty() {
                    found.insert(inode, name.clone());
                }
            }
        }
    }
    found
}

/// Reads the host's listeners; holds its netlink socket and the process names found so far.
/// Shared by the periodic look and the sync loop.
#[derive(Default)]
pub struct Reader {
    inner: Mutex<Inner>,
}

#[derive(Default)]
struct Inner {
    dumper: Option<Dumper>,
    /// Process by socket inode, for the sockets of the last read worth a name that were looked
    /// for (`None`: `/proc` did not tell).
    names: BTreeMap<u32, Option<String>>,
    /// SCTP was asked for and the kernel had no sock_diag handler for it (said once).
    sctp_unreadable: bool,
    /// The sockets of the last read worth a name: not the agent's, not on loopback.
    worth: Vec<ListeningSocket>,
    /// The inodes of the last read's sockets, this process's and the others'. `/proc/self/fd`
    /// is read again only for a read that holds a socket in neither: a socket's inode is not
    /// given to another while it lives, and a read holds both sets to its own sockets.
    own: BTreeSet<u32>,
    others: BTreeSet<u32>,
    /// The kernel had SCTP at the last look at `/proc/net/protocols`; when that was.
    sctp: bool,
    sctp_looked: Option<Instant>,
}

impl Reader {
    pub fn new() -> Reader {
        Reader::default()
    }

    /// Every socket listening in this network namespace, raw (the agent's own included).
    pub fn sockets(&self) -> Result<Vec<ListeningSocket>, Error> {
        let mut inner = self.inner.lock().expect("listener reader");
        let inner = &mut *inner;
        let sctp = inner.kernel_has_sctp();
        let dumper = match inner.dumper.as_mut() {
            Some(d) => d,
            None => inner.dumper.insert(Dumper::open()?),
        };
        let mut out = Vec::new();
        for ask in asks(sctp) {
            match dumper.dump(ask) {
                Ok(s) => out.extend(s),
                Err(Error::Refused { source, .. })
                    if ask.protocol == Protocol::Sctp
                        && matches!(
                            source.raw_os_error(),
                            Some(libc::ENOENT | libc::EINVAL | libc::EOPNOTSUPP)
                        ) =>
                {
                    if !std::mem::replace(&mut inner.sctp_unreadable, true) {
                        info!(error = %source, "the kernel has SCTP but no sock_diag for it (sctp_diag): SCTP listeners are not seen");
                    }
                }
                Err(e) => {
                    // A fresh socket next time.
                    inner.dumper = None;
                    return Err(e);
                }
            }
        }
        Ok(out)
    }

    /// The host's listeners, without the agent's own, named by process where `/proc` tells.
    /// With `name_new`, sockets not seen before are named by one walk over every process's
    /// open files (tens of milliseconds on a busy node); without, they stay unnamed until a
    /// read that names them, or [`Reader::process_of`].
    pub fn read(&self, name_new: bool) -> Result<BTreeSet<Listener>, Error> {
        let sockets = self.sockets()?;
        let mut inner = self.inner.lock().expect("listener reader");
        let inner = &mut *inner;
        let inodes: BTreeSet<u32> = sockets.iter().map(|s| s.inode).collect();
        if inodes
            .iter()
            .any(|i| !inner.own.contains(i) && !inner.others.contains(i))
        {
            let mine: BTreeSet<u32> = socket_inodes(Path::new("/proc/self/fd")).collect();
            (inner.own, inner.others) = inodes.into_iter().partition(|i| mine.contains(i));
        } else {
            inner.own.retain(|i| inodes.contains(i));
            inner.others.retain(|i| inodes.contains(i));
        }
        // Loopback sockets never hold a node address's port: not worth a name.
        inner.worth = sockets
            .iter()
            .filter(|s| !inner.own.contains(&s.inode) && !s.address.is_loopback())
            .cloned()
            .collect();
        let keep: BTreeSet<u32> = inner.worth.iter().map(|s| s.inode).collect();
        inner.names.retain(|i, _| keep.contains(i));
        if name_new {
            inner.name_unknown();
        }
        Ok(listeners(&sockets, &inner.own, &inner.names))
    }

    /// The process of a listener of the last read, naming the sockets not named yet first
    /// when it is one of them (for a port a listener has just taken from a Service, so the
    /// heartbeat names it at once).
    pub fn process_of(&self, l: &Listener) -> Option<String> {
        let mut inner = self.inner.lock().expect("listener reader");
        let matches = |s: &ListeningSocket| {
            s.protocol == l.protocol && s.port == l.port && addresses_of(s).contains(&l.address)
        };
        if inner
            .worth
            .iter()
            .any(|s| matches(s) && !inner.names.contains_key(&s.inode))
        {
            inner.name_unknown();
        }
        inner
            .worth
            .iter()
            .filter(|s| matches(s))
            .find_map(|s| inner.names.get(&s.inode).cloned().flatten())
    }
}

impl Inner {
    /// Whether the kernel has SCTP, as `/proc/net/protocols` said at most [`SCTP_RECHECK`] ago.
    fn kernel_has_sctp(&mut self) -> bool {
        if self.sctp_looked.is_none_or(|t| t.elapsed() >= SCTP_RECHECK) {
            self.sctp = kernel_has_sctp();
            self.sctp_looked = Some(Instant::now());
        }
        self.sctp
    }

    /// Name the sockets of the last read that have not been looked for: one walk over
    /// `/proc`. A socket `/proc` does not name is not looked for again.
    fn name_unknown(&mut self) {
        let unknown: BTreeSet<u32> = self
            .worth
            .iter()
            .map(|s| s.inode)
            .filter(|i| !self.names.contains_key(i))
            .collect();
        if unknown.is_empty() {
            return;
        }
        let mut found = owners(&unknown, std::process::id());
        debug!(
            sockets = unknown.len(),
            named = found.len(),
            "named listening sockets by process"
        );
        for i in unknown {
            self.names.insert(i, found.remove(&i));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::host::test_netns::{ip, root_or_skip};
    use nix::sys::socket::{
        bind, listen, setsockopt, socket, sockopt, AddressFamily, Backlog, SockFlag, SockType,
        SockaddrIn6, SockaddrStorage,
    };
    use std::net::{SocketAddr, SocketAddrV6, TcpListener, TcpStream, UdpSocket};
    use std::os::fd::OwnedFd;
    use std::process::Command;
    use std::time::{Duration, Instant};

    fn sock(protocol: Protocol, address: &str, port: u16, v6only: Option<bool>) -> ListeningSocket {
        ListeningSocket {
            protocol,
            address: address.parse().unwrap(),
            port,
            v6only,
            inode: 1,
        }
    }

    fn addrs(s: &ListeningSocket) -> Vec<String> {
        addresses_of(s).iter().map(|a| a.to_string()).collect()
    }

    #[test]
    fn an_ipv6_wildcard_without_v6only_also_takes_ipv4() {
        let tcp = Protocol::Tcp;
        assert_eq!(addrs(&sock(tcp, "::", 80, Some(false))), ["::", "0.0.0.0"]);
        assert_eq!(
            addrs(&sock(tcp, "::", 80, None)),
            ["::", "0.0.0.0"],
            "not said: both"
        );
        assert_eq!(addrs(&sock(tcp, "::", 80, Some(true))), ["::"]);
        assert_eq!(
            addrs(&sock(tcp, "::ffff:192.0.2.1", 80, Some(false))),
            ["192.0.2.1"]
        );
        assert_eq!(
            addrs(&sock(tcp, "2001:db8::1", 80, Some(false))),
            ["2001:db8::1"]
        );
        assert_eq!(addrs(&sock(tcp, "0.0.0.0", 80, None)), ["0.0.0.0"]);
    }

    /// An IPv6 socket bound to `addr`, with `IPV6_V6ONLY` as given; listening for TCP.
    fn v6(ty: SockType, addr: &str, port: u16, v6only: bool) -> OwnedFd {
        let fd = socket(AddressFamily::Inet6, ty, SockFlag::empty(), None).unwrap();
        setsockopt(&fd, sockopt::Ipv6V6Only, &v6only).unwrap();
        let a = SockaddrIn6::from(SocketAddrV6::new(addr.parse().unwrap(), port, 0, 0));
        bind(std::os::fd::AsRawFd::as_raw_fd(&fd), &a).unwrap();
        if ty == SockType::Stream {
            listen(&fd, Backlog::new(8).unwrap()).unwrap();
        }
        fd
    }

    fn set(l: &BTreeSet<Listener>) -> BTreeSet<String> {
        l.iter()
            .map(|l| {
                let proc = l
                    .process
                    .as_deref()
                    .map(|p| format!(" {p}"))
                    .unwrap_or_default();
                format!("{} {}:{}{proc}", l.protocol, l.address, l.port)
            })
            .collect()
    }

    /// In a fresh network namespace (this thread only): listening TCP sockets, bound and not
    /// connected UDP ones, in both families, are read as listeners; connections, connected
    /// UDP sockets and bound-but-not-listening TCP sockets are not. Our own sockets are left
    /// out of `read`, those opened after a read too; another process's are named by it; the
    /// kernel's own socket of a VXLAN tunnel is a listener without a process.
    #[test]
    fn reads_the_listening_sockets_of_a_fresh_network_namespace() {
        if !root_or_skip("reads_the_listening_sockets_of_a_fresh_network_namespace") {
            return;
        }
        std::thread::spawn(|| {
            nix::sched::unshare(nix::sched::CloneFlags::CLONE_NEWNET).expect("unshare");
            ip("link set lo up");
            ip("link add nlbl0 type veth peer name nlbl0p");
            ip("addr add 192.0.2.1/24 dev nlbl0");
            ip("addr add 2001:db8::1/64 dev nlbl0 nodad");
            ip("link set nlbl0 up");
            ip("link set nlbl0p up");
            let _t1 = TcpListener::bind("0.0.0.0:7000").unwrap();
            let t2 = TcpListener::bind("127.0.0.1:7001").unwrap();
            let _t3 = v6(SockType::Stream, "::", 7002, false);
            let _t4 = v6(SockType::Stream, "::", 7003, true);
            let _t5 = v6(SockType::Stream, "::ffff:192.0.2.1", 7005, false);
            let _t6 = TcpListener::bind("[2001:db8::1]:7006").unwrap();
            // Bound, not listening: takes nothing.
            let idle = socket(
                AddressFamily::Inet,
                SockType::Stream,
                SockFlag::empty(),
                None,
            )
            .unwrap();
            let a: SockaddrStorage = SocketAddr::from(([0, 0, 0, 0], 7004)).into();
            bind(std::os::fd::AsRawFd::as_raw_fd(&idle), &a).unwrap();
            // A connection: neither end listens.
            let _c = TcpStream::connect("127.0.0.1:7001").unwrap();
            let _s = t2.accept().unwrap();
            let _u1 = UdpSocket::bind("0.0.0.0:5300").unwrap();
            let u2 = UdpSocket::bind("0.0.0.0:5301").unwrap();
            u2.connect("127.0.0.1:9").unwrap();
            let _u3 = v6(SockType::Datagram, "::", 5302, true);
            ip("link add nlbv0 type vxlan id 42 dstport 4790 local 192.0.2.1");
            ip("link set nlbv0 up");

            let r = Reader::new();
            let raw = r.sockets().expect("dump");
            let all = listeners(&raw, &BTreeSet::new(), &BTreeMap::new());
            let want: BTreeSet<String> = [
                "TCP 0.0.0.0:7000",
                "TCP 127.0.0.1:7001",
                "TCP :::7002",
                "TCP 0.0.0.0:7002",
                "TCP :::7003",
                "TCP 192.0.2.1:7005",
                "TCP 2001:db8::1:7006",
                "UDP 0.0.0.0:5300",
                "UDP :::5302",
                "UDP 0.0.0.0:4790",
            ]
            .iter()
            .map(|s| s.to_string())
            .collect();
            assert_eq!(set(&all), want);
            if !kernel_has_sctp() {
                eprintln!("note: this kernel has no SCTP; no SCTP dump was asked for");
            }

            // Ours are left out; the tunnel's is in; another process's are in, named.
            let tunnel: BTreeSet<String> = ["UDP 0.0.0.0:4790".to_string()].into();
            assert_eq!(
                set(&r.read(true).unwrap()),
                tunnel,
                "our own sockets block nothing"
            );
            let mut socat = Command::new("socat")
                .args(["TCP-LISTEN:7010,bind=0.0.0.0,reuseaddr,fork", "SYSTEM:true"])
                .spawn()
                .expect("socat (scripts/deps.sh installs it)");
            let deadline = Instant::now() + Duration::from_secs(5);
            let got = loop {
                let got = set(&r.read(true).unwrap());
                if got.len() > 1 || Instant::now() > deadline {
                    break got;
                }
                std::thread::sleep(Duration::from_millis(20));
            };
            let _ = socat.kill();
            let _ = socat.wait();
            assert_eq!(
                got,
                [
                    "TCP 0.0.0.0:7010 socat".to_string(),
                    "UDP 0.0.0.0:4790".into()
                ]
                .into()
            );
            // A socket of ours opened after those reads is ours too (a socket not seen before
            // has this process's files looked at again), and socat's is gone with it.
            let _t7 = TcpListener::bind("0.0.0.0:7011").unwrap();
            assert_eq!(
                set(&r.read(false).unwrap()),
                tunnel,
                "a socket of ours opened later blocks nothing"
            );
        })
        .join()
        .expect("the namespace thread panicked");
    }
}
