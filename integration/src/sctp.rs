//! SCTP over raw IPv4 sockets, for kernels that track and NAT SCTP (`nf_conntrack` with SCTP)
//! but have no SCTP sockets (`CONFIG_IP_SCTP` off, so `socket(AF_INET, SOCK_SEQPACKET,
//! IPPROTO_SCTP)` fails with `ESOCKTNOSUPPORT`). Real SCTP packets, with the CRC32c the
//! kernel's conntrack verifies, and just enough of an association for conntrack to track it as
//! one: INIT, INIT-ACK, COOKIE-ECHO, COOKIE-ACK, then HEARTBEAT and HEARTBEAT-ACK, and ABORT
//! for packets of an association a peer does not know (RFC 9260 8.4). No data, no
//! retransmission timers, no stream state: a test fixture, IPv4 only.
//!
//! [`SctpClient`] keeps its source port, heartbeats on its association every interval and, when
//! the association fails (its peer aborts it, or [`MAX_UNANSWERED`] heartbeats in a row go
//! unanswered, as a stack's path failure detection would declare, only faster), starts a new
//! one from the same port (as SIGTRAN and Diameter peers with a configured port do). [`sctp_backend`] answers like a host's SCTP stack would,
//! and says who it is in its State Cookie, so the client knows which backend it is associated
//! with.

use std::collections::HashMap;
use std::net::{Ipv4Addr, SocketAddrV4};
use std::os::fd::{AsRawFd, OwnedFd};
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use nix::sys::socket::{
    self, AddressFamily, MsgFlags, SockFlag, SockProtocol, SockType, SockaddrIn,
};

use crate::netns::Netns;
use crate::traffic::Running;

const INIT: u8 = 1;
const INIT_ACK: u8 = 2;
const HEARTBEAT: u8 = 4;
const HEARTBEAT_ACK: u8 = 5;
const ABORT: u8 = 6;
const COOKIE_ECHO: u8 = 10;
const COOKIE_ACK: u8 = 11;
/// ABORT's T bit: the verification tag is the one of the packet answered.
const FLAG_T: u8 = 1;
/// Parameter types: Heartbeat Info, State Cookie.
const PARAM_HEARTBEAT_INFO: u16 = 1;
const PARAM_STATE_COOKIE: u16 = 7;
const TICK: Duration = Duration::from_millis(10);
/// Heartbeats in a row without an answer after which the client gives its association up
/// (a real stack's Association.Max.Retrans, with a much shorter RTO).
pub const MAX_UNANSWERED: u32 = 3;

/// CRC32c (Castagnoli), as SCTP's checksum (RFC 9260 appendix A).
pub fn crc32c(data: &[u8]) -> u32 {
    let mut crc = !0u32;
    for b in data {
        crc ^= u32::from(*b);
        for _ in 0..8 {
            crc = if crc & 1 != 0 {
                (crc >> 1) ^ 0x82F6_3B78
            } else {
                crc >> 1
            };
        }
    }
    !crc
}

/// One chunk: type, flags, value.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Chunk {
    ty: u8,
    flags: u8,
    value: Vec<u8>,
}

impl Chunk {
    fn new(ty: u8, value: Vec<u8>) -> Chunk {
        Chunk {
            ty,
            flags: 0,
            value,
        }
    }

    /// INIT or INIT-ACK: initiate tag, a_rwnd, streams, initial TSN, then `params`.
    fn init(ty: u8, tag: u32, params: &[u8]) -> Chunk {
        let mut v = Vec::new();
        v.extend_from_slice(&tag.to_be_bytes());
        v.extend_from_slice(&65_536u32.to_be_bytes());
        v.extend_from_slice(&1u16.to_be_bytes());
        v.extend_from_slice(&1u16.to_be_bytes());
        v.extend_from_slice(&tag.to_be_bytes());
        v.extend_from_slice(params);
        Chunk::new(ty, v)
    }

    /// The initiate tag of an INIT or INIT-ACK.
    fn init_tag(&self) -> Option<u32> {
        Some(u32::from_be_bytes(self.value.get(0..4)?.try_into().ok()?))
    }
}

fn param(ty: u16, value: &[u8]) -> Vec<u8> {
    let mut p = Vec::new();
    p.extend_from_slice(&ty.to_be_bytes());
    p.extend_from_slice(&((4 + value.len()) as u16).to_be_bytes());
    p.extend_from_slice(value);
    p.resize(p.len().div_ceil(4) * 4, 0);
    p
}

/// The value of the first parameter of type `ty` in `params`.
fn find_param(mut params: &[u8], ty: u16) -> Option<&[u8]> {
    while params.len() >= 4 {
        let t = u16::from_be_bytes([params[0], params[1]]);
        let len = usize::from(u16::from_be_bytes([params[2], params[3]]));
        if len < 4 || len > params.len() {
            return None;
        }
        if t == ty {
            return Some(&params[4..len]);
        }
        params = &params[(len.div_ceil(4) * 4).min(params.len())..];
    }
    None
}

/// An SCTP packet: common header with its checksum, then the chunks.
fn packet(src: u16, dst: u16, vtag: u32, chunks: &[Chunk]) -> Vec<u8> {
    let mut p = Vec::new();
    p.extend_from_slice(&src.to_be_bytes());
    p.extend_from_slice(&dst.to_be_bytes());
    p.extend_from_slice(&vtag.to_be_bytes());
    p.extend_from_slice(&[0; 4]);
    for c in chunks {
        p.push(c.ty);
        p.push(c.flags);
        p.extend_from_slice(&((4 + c.value.len()) as u16).to_be_bytes());
        p.extend_from_slice(&c.value);
        p.resize(p.len().div_ceil(4) * 4, 0);
    }
    let sum = crc32c(&p);
    // Linux writes the CRC little-endian (`cpu_to_le32`), as RFC 9260 appendix A's
    // reference code does.
    p[8..12].copy_from_slice(&sum.to_le_bytes());
    p
}

/// A received IPv4 packet carrying SCTP: source address, ports, tag, chunks.
struct Received {
    from: Ipv4Addr,
    to: Ipv4Addr,
    src: u16,
    dst: u16,
    vtag: u32,
    chunks: Vec<Chunk>,
}

fn parse(ip: &[u8]) -> Option<Received> {
    let ihl = usize::from(ip.first()? & 0x0f) * 4;
    let from = Ipv4Addr::from(<[u8; 4]>::try_from(ip.get(12..16)?).ok()?);
    let to = Ipv4Addr::from(<[u8; 4]>::try_from(ip.get(16..20)?).ok()?);
    let s = ip.get(ihl..)?;
    let word = |i: usize| u16::from_be_bytes([s[i], s[i + 1]]);
    if s.len() < 12 {
        return None;
    }
    let mut chunks = Vec::new();
    let mut rest = &s[12..];
    while rest.len() >= 4 {
        let len = usize::from(u16::from_be_bytes([rest[2], rest[3]]));
        if len < 4 || len > rest.len() {
            break;
        }
        chunks.push(Chunk {
            ty: rest[0],
            flags: rest[1],
            value: rest[4..len].to_vec(),
        });
        rest = &rest[(len.div_ceil(4) * 4).min(rest.len())..];
    }
    Some(Received {
        from,
        to,
        src: word(0),
        dst: word(2),
        vtag: u32::from_be_bytes(s[4..8].try_into().ok()?),
        chunks,
    })
}

/// A raw IPPROTO_SCTP socket in `ns`, with a receive timeout of [`TICK`].
fn raw_socket(ns: &Netns) -> OwnedFd {
    ns.run(|| {
        let fd = socket::socket(
            AddressFamily::Inet,
            SockType::Raw,
            SockFlag::SOCK_CLOEXEC,
            SockProtocol::Sctp,
        )?;
        socket::setsockopt(
            &fd,
            socket::sockopt::ReceiveTimeout,
            &nix::sys::time::TimeVal::new(0, TICK.as_micros() as i64),
        )?;
        Ok::<_, nix::Error>(fd)
    })
    .unwrap_or_else(|e| panic!("a raw SCTP socket in {}: {e}", ns.name()))
}

fn send(fd: &OwnedFd, to: Ipv4Addr, pkt: &[u8]) {
    let addr = SockaddrIn::from(SocketAddrV4::new(to, 0));
    let _ = socket::sendto(fd.as_raw_fd(), pkt, &addr, MsgFlags::empty());
}

fn recv(fd: &OwnedFd, buf: &mut [u8]) -> Option<Received> {
    let n = socket::recv(fd.as_raw_fd(), buf, MsgFlags::empty()).ok()?;
    parse(&buf[..n])
}

/// A backend answering SCTP on `addr:port` in `ns`, until dropped.
pub struct SctpBackend {
    /// Every packet it received: when, its first chunk's type, whether it belonged to an
    /// association the backend knows.
    pub received: Arc<Mutex<Vec<(Instant, u8, bool)>>>,
    _running: Running,
}

/// Answers like a host's SCTP stack: INIT with an INIT-ACK whose State Cookie is `name`, a
/// COOKIE-ECHO of that cookie with a COOKIE-ACK (the association is up), a HEARTBEAT on an
/// association it knows with a HEARTBEAT-ACK; anything else of an association it does not know
/// with an ABORT (T bit set).
pub fn sctp_backend(ns: &Netns, addr: Ipv4Addr, port: u16, name: &str) -> SctpBackend {
    let fd = raw_socket(ns);
    let received = Arc::new(Mutex::new(Vec::new()));
    let log = Arc::clone(&received);
    let name = name.to_owned();
    // Its own tag, the same for every association: enough to tell backends apart.
    let own = 0xB000_0000 | (crc32c(name.as_bytes()) & 0xffff);
    let running = Running::spawn(format!("sctp-{name}"), move |stop| {
        let mut peers: HashMap<(Ipv4Addr, u16), u32> = HashMap::new();
        let mut buf = vec![0u8; 65_536];
        while !stop.load(Ordering::Relaxed) {
            let Some(r) = recv(&fd, &mut buf) else {
                continue;
            };
            if r.to != addr || r.dst != port {
                continue;
            }
            let Some(first) = r.chunks.first() else {
                continue;
            };
            let peer = (r.from, r.src);
            let known = r.vtag == own && peers.contains_key(&peer);
            let reply = match first.ty {
                INIT => first.init_tag().map(|tag| {
                    // The State Cookie: the backend's name, then the peer's tag, which the
                    // COOKIE-ECHO brings back.
                    let mut cookie = name.as_bytes().to_vec();
                    cookie.push(0);
                    cookie.extend_from_slice(&tag.to_be_bytes());
                    let cookie = param(PARAM_STATE_COOKIE, &cookie);
                    (tag, vec![Chunk::init(INIT_ACK, own, &cookie)])
                }),
                COOKIE_ECHO if r.vtag == own => cookie_tag(&first.value).map(|tag| {
                    peers.insert(peer, tag);
                    (tag, vec![Chunk::new(COOKIE_ACK, Vec::new())])
                }),
                HEARTBEAT if known => Some((
                    peers[&peer],
                    vec![Chunk::new(HEARTBEAT_ACK, first.value.clone())],
                )),
                ABORT => {
                    peers.remove(&peer);
                    None
                }
                _ => Some((
                    r.vtag,
                    vec![Chunk {
                        ty: ABORT,
                        flags: FLAG_T,
                        value: Vec::new(),
                    }],
                )),
            };
            log.lock()
                .expect("backend log")
                .push((Instant::now(), first.ty, known));
            if let Some((vtag, chunks)) = reply {
                send(&fd, r.from, &packet(r.dst, r.src, vtag, &chunks));
            }
        }
    });
    SctpBackend {
        received,
        _running: running,
    }
}

/// The backend's name and the peer's tag from a State Cookie (`name\0tag`).
fn split_cookie(cookie: &[u8]) -> Option<(String, u32)> {
    let i = cookie.iter().position(|b| *b == 0)?;
    let tag = u32::from_be_bytes(cookie.get(i + 1..i + 5)?.try_into().ok()?);
    Some((String::from_utf8_lossy(&cookie[..i]).into_owned(), tag))
}

fn cookie_tag(cookie: &[u8]) -> Option<u32> {
    split_cookie(cookie).map(|(_, tag)| tag)
}

/// What the client heard.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SctpEvent {
    /// An association with the backend of this name is up.
    Up(String),
    /// A HEARTBEAT-ACK on the association with this backend.
    HeartbeatAck(String),
    /// The association was aborted by its peer.
    Aborted,
    /// The client gave the association up: its heartbeats went unanswered.
    Failed,
}

/// An SCTP client on a fixed source port, until dropped: associates with `dst`, heartbeats
/// every `interval`, and associates again from the same port when aborted.
pub struct SctpClient {
    events: Arc<Mutex<Vec<(Instant, SctpEvent)>>>,
    _running: Running,
}

impl SctpClient {
    pub fn start(
        ns: &Netns,
        src: SocketAddrV4,
        dst: SocketAddrV4,
        interval: Duration,
    ) -> SctpClient {
        let fd = raw_socket(ns);
        let events = Arc::new(Mutex::new(Vec::new()));
        let log = Arc::clone(&events);
        let running = Running::spawn(format!("sctp-client-{src}"), move |stop| {
            let mut c = ClientState::new(fd, src, dst, log);
            let mut next = Instant::now();
            while !stop.load(Ordering::Relaxed) {
                if Instant::now() >= next {
                    c.tick();
                    next += interval;
                }
                c.receive();
            }
        });
        SctpClient {
            events,
            _running: running,
        }
    }

    pub fn events(&self) -> Vec<(Instant, SctpEvent)> {
        self.events.lock().expect("client log").clone()
    }

    /// The backends whose HEARTBEAT-ACKs came at or after `since`.
    pub fn acks_since(&self, since: Instant) -> Vec<(Instant, String)> {
        self.events()
            .into_iter()
            .filter(|(t, _)| *t >= since)
            .filter_map(|(t, e)| match e {
                SctpEvent::HeartbeatAck(b) => Some((t, b)),
                _ => None,
            })
            .collect()
    }
}

/// The client's side of its association.
struct ClientState {
    fd: OwnedFd,
    src: SocketAddrV4,
    dst: SocketAddrV4,
    log: Arc<Mutex<Vec<(Instant, SctpEvent)>>>,
    /// Its tag for the association of now (a new one for each).
    tag: u32,
    /// The peer's tag and name, once the INIT-ACK came; `up` once the COOKIE-ACK did.
    peer: Option<(u32, String)>,
    up: bool,
    /// HEARTBEATs sent (their Heartbeat Info).
    beats: u64,
    /// HEARTBEATs sent since the last answer.
    unanswered: u32,
    buf: Vec<u8>,
}

impl ClientState {
    fn new(
        fd: OwnedFd,
        src: SocketAddrV4,
        dst: SocketAddrV4,
        log: Arc<Mutex<Vec<(Instant, SctpEvent)>>>,
    ) -> ClientState {
        ClientState {
            fd,
            src,
            dst,
            log,
            tag: 0xC000_0001,
            peer: None,
            up: false,
            beats: 0,
            unanswered: 0,
            buf: vec![0u8; 65_536],
        }
    }

    fn note(&self, e: SctpEvent) {
        self.log
            .lock()
            .expect("client log")
            .push((Instant::now(), e));
    }

    fn send(&self, vtag: u32, chunks: &[Chunk]) {
        let p = packet(self.src.port(), self.dst.port(), vtag, chunks);
        send(&self.fd, *self.dst.ip(), &p);
    }

    /// Every interval: (re)send the INIT while not associated, else a HEARTBEAT; give the
    /// association up after too many unanswered ones.
    fn tick(&mut self) {
        if self.up && self.unanswered >= MAX_UNANSWERED {
            self.note(SctpEvent::Failed);
            self.restart();
            return;
        }
        match (&self.peer, self.up) {
            (Some((peer_tag, _)), true) => {
                self.unanswered += 1;
                self.beats += 1;
                let info = param(PARAM_HEARTBEAT_INFO, &self.beats.to_be_bytes());
                self.send(*peer_tag, &[Chunk::new(HEARTBEAT, info)]);
            }
            _ => self.send(0, &[Chunk::init(INIT, self.tag, &[])]),
        }
    }

    /// A new association from the same port, at once.
    fn restart(&mut self) {
        self.tag = self.tag.wrapping_add(1);
        self.peer = None;
        self.up = false;
        self.unanswered = 0;
        self.send(0, &[Chunk::init(INIT, self.tag, &[])]);
    }

    fn receive(&mut self) {
        let Some(r) = recv(&self.fd, &mut self.buf) else {
            return;
        };
        if r.from != *self.dst.ip() || r.src != self.dst.port() || r.dst != self.src.port() {
            return;
        }
        let Some(first) = r.chunks.first().cloned() else {
            return;
        };
        match first.ty {
            INIT_ACK if r.vtag == self.tag && !self.up => {
                let params = first.value.get(16..).unwrap_or_default();
                let (Some(peer_tag), Some(cookie)) =
                    (first.init_tag(), find_param(params, PARAM_STATE_COOKIE))
                else {
                    return;
                };
                let Some((name, _)) = split_cookie(cookie) else {
                    return;
                };
                self.send(peer_tag, &[Chunk::new(COOKIE_ECHO, cookie.to_vec())]);
                self.peer = Some((peer_tag, name));
            }
            COOKIE_ACK if r.vtag == self.tag => {
                if let Some((_, name)) = &self.peer {
                    self.up = true;
                    self.note(SctpEvent::Up(name.clone()));
                }
            }
            HEARTBEAT_ACK if r.vtag == self.tag && self.up => {
                self.unanswered = 0;
                if let Some((_, name)) = &self.peer {
                    self.note(SctpEvent::HeartbeatAck(name.clone()));
                }
            }
            ABORT => {
                self.note(SctpEvent::Aborted);
                self.restart();
            }
            _ => {}
        }
    }
}

/// Whether this kernel offers SCTP sockets (it does not when `CONFIG_IP_SCTP` is off).
pub fn kernel_has_sctp_sockets() -> bool {
    socket::socket(
        AddressFamily::Inet,
        SockType::SeqPacket,
        SockFlag::SOCK_CLOEXEC,
        SockProtocol::Sctp,
    )
    .is_ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn crc32c_is_castagnoli() {
        // The CRC-32C check value (RFC 3720 B.4 and every CRC catalogue).
        assert_eq!(crc32c(b"123456789"), 0xE306_9283);
    }

    #[test]
    fn packets_parse_back() {
        let chunks = [Chunk::init(INIT, 7, &param(PARAM_STATE_COOKIE, b"b0"))];
        let mut ip = vec![0x45u8; 1];
        ip.resize(20, 0);
        ip[12..16].copy_from_slice(&[203, 0, 113, 2]);
        ip[16..20].copy_from_slice(&[203, 0, 113, 1]);
        ip.extend_from_slice(&packet(40132, 9132, 0, &chunks));
        let r = parse(&ip).expect("parses");
        assert_eq!((r.src, r.dst, r.vtag), (40132, 9132, 0));
        assert_eq!(r.chunks, chunks);
        assert_eq!(
            find_param(&r.chunks[0].value[16..], PARAM_STATE_COOKIE),
            Some(&b"b0"[..])
        );
    }
}
