//! Real traffic between test namespaces: tiny TCP/UDP servers that say who
//! they are and who called, and one-shot clients that report what happened.
//!
//! Every client request runs on a fresh thread inside the namespace (via
//! [`Netns::run`]), so its sockets belong to that namespace. Servers run on
//! their own long-lived thread that joined the namespace before binding.

use std::io::{self, ErrorKind, IoSliceMut, Read};
use std::net::{IpAddr, SocketAddr, TcpListener, TcpStream, UdpSocket};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use nix::errno::Errno;
use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
use nix::sys::socket::{
    self, sockopt, AddressFamily, ControlMessageOwned, MsgFlags, SockFlag, SockType,
    SockaddrStorage,
};

use crate::netns::{self, Netns};

/// How often idle server threads look at their stop flag.
const SERVER_TICK: Duration = Duration::from_millis(20);

/// What one request saw.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// The server's reply line, trimmed.
    Answered(String),
    /// ECONNREFUSED: a TCP RST, or an ICMP port unreachable for UDP. For UDP
    /// `icmp` holds what the kernel queued on the socket's error queue.
    Refused { icmp: Option<IcmpError> },
    /// Nothing came back before the deadline.
    TimedOut,
    /// The reply came, but only after this long: more than a load test forgives (see
    /// `real_cluster::SLOW`), such as a SYN the network dropped once and the client sent again
    /// a second later. The reply is kept.
    Slow(Duration, String),
    /// Any other error, as errno text (e.g. "ENETUNREACH: Network is
    /// unreachable"). UDP errors caused by other ICMP messages (host
    /// unreachable, admin prohibited, ...) end up here with the ICMP origin,
    /// type and code appended.
    Failed(String),
}

/// An ICMP error as reported by the kernel in `struct sock_extended_err`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IcmpError {
    /// `SO_EE_ORIGIN_ICMP` (2) or `SO_EE_ORIGIN_ICMP6` (3).
    pub origin: u8,
    pub icmp_type: u8,
    pub code: u8,
}

impl IcmpError {
    /// ICMPv4 destination unreachable / port unreachable.
    pub const V4_PORT_UNREACHABLE: IcmpError = IcmpError {
        origin: libc::SO_EE_ORIGIN_ICMP,
        icmp_type: 3,
        code: 3,
    };
    /// ICMPv6 destination unreachable / port unreachable.
    pub const V6_PORT_UNREACHABLE: IcmpError = IcmpError {
        origin: libc::SO_EE_ORIGIN_ICMP6,
        icmp_type: 1,
        code: 4,
    };
}

/// A thread that runs until dropped: the drop raises its stop flag and joins it.
#[derive(Debug)]
pub struct Running {
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl Running {
    /// Runs `body` on a new thread named `name`; `body` returns once its flag is raised.
    pub fn spawn(name: String, body: impl FnOnce(&AtomicBool) + Send + 'static) -> Running {
        let stop = Arc::new(AtomicBool::new(false));
        let flag = Arc::clone(&stop);
        let thread = std::thread::Builder::new()
            .name(name)
            .spawn(move || body(&flag))
            .expect("cannot spawn a test thread");
        Running {
            stop,
            thread: Some(thread),
        }
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(thread) = self.thread.take() {
            // A panicking thread already printed its message; do not double-panic while a
            // test may be unwinding.
            let _ = thread.join();
        }
    }
}

/// A running test server; stops (and joins its thread) on drop.
#[derive(Debug)]
pub struct Server {
    addr: SocketAddr,
    _running: Running,
}

impl Server {
    /// The address the server is bound to (with the real port if 0 was asked).
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }
}

/// A TCP server inside `ns` bound to `addr`: each connection gets
/// "<name> <peer-ip>\n" and is closed. Bound before this returns.
pub fn tcp_server(ns: &Netns, addr: SocketAddr, name: &str) -> Server {
    let name = name.to_owned();
    spawn_server(ns, addr, "tcp", move |stop| {
        let listener = TcpListener::bind(addr)?;
        listener.set_nonblocking(true)?;
        let local = listener.local_addr()?;
        Ok((local, move || {
            while !stop.load(Ordering::Relaxed) {
                match listener.accept() {
                    Ok((stream, peer)) => answer_tcp(stream, peer, &name),
                    Err(e) if e.kind() == ErrorKind::WouldBlock => std::thread::sleep(SERVER_TICK),
                    Err(e) if e.kind() == ErrorKind::Interrupted => {}
                    // e.g. ECONNABORTED: the client gave up; keep serving.
                    Err(_) => std::thread::sleep(SERVER_TICK),
                }
            }
        }))
    })
}

/// A UDP server inside `ns` bound to `addr`: each datagram is answered with
/// "<name> <peer-ip>". Bound before this returns.
pub fn udp_server(ns: &Netns, addr: SocketAddr, name: &str) -> Server {
    let name = name.to_owned();
    spawn_server(ns, addr, "udp", move |stop| {
        let socket = UdpSocket::bind(addr)?;
        socket.set_read_timeout(Some(SERVER_TICK))?;
        let local = socket.local_addr()?;
        Ok((local, move || {
            let mut buf = [0u8; 2048];
            while !stop.load(Ordering::Relaxed) {
                // Timeouts and errors such as ECONNREFUSED left behind by an
                // earlier reply are not fatal to the server.
                if let Ok((_, peer)) = socket.recv_from(&mut buf) {
                    let reply = format!("{name} {}", peer.ip().to_canonical());
                    let _ = socket.send_to(reply.as_bytes(), peer);
                }
            }
        }))
    })
}

fn answer_tcp(mut stream: TcpStream, peer: SocketAddr, name: &str) {
    use std::io::Write;
    let reply = format!("{name} {}\n", peer.ip().to_canonical());
    // The accepted socket may inherit O_NONBLOCK; a short blocking write of a
    // few bytes always fits in the send buffer. A client that has gone away
    // is its own problem.
    let _ = stream
        .set_nonblocking(false)
        .and_then(|()| stream.write_all(reply.as_bytes()));
}

/// Starts a server thread in `ns`. `setup` runs on that thread after it
/// joined the namespace; it binds and returns the bound address and the
/// serving loop. Bind errors are reported by panicking on the caller's thread.
fn spawn_server<S, L>(ns: &Netns, addr: SocketAddr, proto: &str, setup: S) -> Server
where
    S: FnOnce(Arc<AtomicBool>) -> io::Result<(SocketAddr, L)> + Send + 'static,
    L: FnOnce(),
{
    let stop = Arc::new(AtomicBool::new(false));
    let (ready_tx, ready_rx) = mpsc::channel();
    let ns_file = std::fs::File::open(ns.path())
        .unwrap_or_else(|e| panic!("cannot open {}: {e}", ns.path().display()));
    let ns_name = ns.name().to_owned();
    let thread_stop = Arc::clone(&stop);
    let thread = std::thread::Builder::new()
        .name(format!("{proto}-server-{addr}"))
        .spawn(move || {
            netns::enter(&ns_file, &ns_name);
            drop(ns_file);
            match setup(thread_stop) {
                Ok((local, serve)) => {
                    let _ = ready_tx.send(Ok(local));
                    serve();
                }
                Err(e) => {
                    let _ = ready_tx.send(Err(e));
                }
            }
        })
        .expect("cannot spawn a server thread");
    match ready_rx.recv() {
        Ok(Ok(addr)) => Server {
            addr,
            _running: Running {
                stop,
                thread: Some(thread),
            },
        },
        Ok(Err(e)) => {
            let _ = thread.join();
            panic!("{proto} server on {addr} in netns {}: {e}", ns.name());
        }
        Err(_) => {
            // The thread died before reporting: surface its panic.
            match thread.join() {
                Err(panic) => std::panic::resume_unwind(panic),
                Ok(()) => panic!("{proto} server thread on {addr} exited before binding"),
            }
        }
    }
}

/// One TCP connection from inside `ns` to `dst`: connect, read one line.
/// `timeout` bounds the whole exchange.
pub fn tcp_request(ns: &Netns, dst: SocketAddr, timeout: Duration) -> Outcome {
    ns.run(move || tcp_exchange(None, dst, timeout))
}

/// Like [`tcp_request`], with the client socket bound to `src` first (for
/// clients that own several addresses).
pub fn tcp_request_from(ns: &Netns, src: IpAddr, dst: SocketAddr, timeout: Duration) -> Outcome {
    ns.run(move || tcp_exchange(Some(src), dst, timeout))
}

/// `n` sequential [`tcp_request`]s, each with its own `timeout`; all run on
/// one thread inside `ns`.
pub fn tcp_requests(ns: &Netns, dst: SocketAddr, n: usize, timeout: Duration) -> Vec<Outcome> {
    ns.run(move || (0..n).map(|_| tcp_exchange(None, dst, timeout)).collect())
}

/// One UDP exchange from a connected socket inside `ns`: send "ping", wait
/// up to `timeout` for a reply or an ICMP error.
///
/// IP_RECVERR / IPV6_RECVERR is enabled, so an ICMP error is read back from
/// the socket's error queue: port unreachable gives
/// `Refused { icmp: Some(..) }`, other ICMP errors give `Failed` with the
/// ICMP details in the text.
pub fn udp_request(ns: &Netns, dst: SocketAddr, timeout: Duration) -> Outcome {
    ns.run(move || udp_exchange(dst, timeout))
}

/// One TCP request from the calling thread's own namespace (a thread that joined one with
/// [`Netns::enter_current_thread`], say): connect, read one line.
pub fn tcp_exchange_here(dst: SocketAddr, timeout: Duration) -> Outcome {
    tcp_exchange(None, dst, timeout)
}

/// One UDP request from the calling thread's own namespace: a datagram, one back.
pub fn udp_exchange_here(dst: SocketAddr, timeout: Duration) -> Outcome {
    udp_exchange(dst, timeout)
}

fn tcp_exchange(src: Option<IpAddr>, dst: SocketAddr, timeout: Duration) -> Outcome {
    let deadline = Instant::now() + timeout;
    let stream = match tcp_connect(src, dst, deadline) {
        Ok(Some(stream)) => stream,
        Ok(None) => return Outcome::TimedOut,
        Err(Errno::ECONNREFUSED) => return Outcome::Refused { icmp: None },
        Err(Errno::ETIMEDOUT) => return Outcome::TimedOut,
        Err(e) => return Outcome::Failed(errno_text(e)),
    };
    read_reply_line(stream, deadline)
}

/// Non-blocking connect (optionally from `src`) finished by `poll`.
/// `Ok(None)` means the deadline passed first.
fn tcp_connect(
    src: Option<IpAddr>,
    dst: SocketAddr,
    deadline: Instant,
) -> Result<Option<TcpStream>, Errno> {
    let fd = new_socket(dst, SockType::Stream)?;
    if let Some(src) = src {
        socket::bind(
            fd.as_raw_fd(),
            &SockaddrStorage::from(SocketAddr::new(src, 0)),
        )?;
    }
    match socket::connect(fd.as_raw_fd(), &SockaddrStorage::from(dst)) {
        Ok(()) | Err(Errno::EINPROGRESS) => {}
        Err(e) => return Err(e),
    }
    if wait_for(fd.as_fd(), PollFlags::POLLOUT, deadline)?.is_none() {
        return Ok(None);
    }
    match socket::getsockopt(&fd, sockopt::SocketError)? {
        0 => {}
        err => return Err(Errno::from_raw(err)),
    }
    let stream = TcpStream::from(fd);
    stream.set_nonblocking(false).map_err(io_errno)?;
    Ok(Some(stream))
}

fn read_reply_line(mut stream: TcpStream, deadline: Instant) -> Outcome {
    let mut reply = Vec::new();
    let mut buf = [0u8; 512];
    while !reply.contains(&b'\n') {
        let Some(left) = remaining(deadline) else {
            return Outcome::TimedOut;
        };
        if let Err(e) = stream.set_read_timeout(Some(left)) {
            return Outcome::Failed(e.to_string());
        }
        match stream.read(&mut buf) {
            Ok(0) if reply.is_empty() => {
                return Outcome::Failed("connection closed without a reply".into())
            }
            Ok(0) => break,
            Ok(n) => reply.extend_from_slice(&buf[..n]),
            Err(e) if e.kind() == ErrorKind::Interrupted => {}
            Err(e) => return io_outcome(&e),
        }
    }
    let line = reply.split(|b| *b == b'\n').next().unwrap_or_default();
    Outcome::Answered(String::from_utf8_lossy(line).trim().to_owned())
}

fn udp_exchange(dst: SocketAddr, timeout: Duration) -> Outcome {
    let deadline = Instant::now() + timeout;
    let socket = match udp_connect(dst) {
        Ok(socket) => socket,
        Err(e) => return Outcome::Failed(errno_text(e)),
    };
    match socket.send(b"ping") {
        Ok(_) => {}
        // An ICMP error that arrived before the send surfaces here.
        Err(e) if e.kind() == ErrorKind::ConnectionRefused => return icmp_outcome(&socket),
        Err(e) => return io_outcome(&e),
    }
    let mut buf = [0u8; 2048];
    loop {
        let events = match wait_for(socket.as_fd(), PollFlags::POLLIN, deadline) {
            Ok(Some(events)) => events,
            Ok(None) => return Outcome::TimedOut,
            Err(e) => return Outcome::Failed(errno_text(e)),
        };
        // POLLERR: the error queue holds an ICMP error (or sk_err is set).
        if events.contains(PollFlags::POLLERR) {
            return icmp_outcome(&socket);
        }
        match socket.recv(&mut buf) {
            Ok(n) => {
                return Outcome::Answered(String::from_utf8_lossy(&buf[..n]).trim().to_owned())
            }
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::Interrupted) => {}
            Err(e) if e.kind() == ErrorKind::ConnectionRefused => return icmp_outcome(&socket),
            Err(e) => return io_outcome(&e),
        }
    }
}

/// A non-blocking UDP socket connected to `dst` with IP(V6)_RECVERR on.
fn udp_connect(dst: SocketAddr) -> Result<UdpSocket, Errno> {
    let fd = new_socket(dst, SockType::Datagram)?;
    match dst {
        SocketAddr::V4(_) => socket::setsockopt(&fd, sockopt::Ipv4RecvErr, &true)?,
        SocketAddr::V6(_) => socket::setsockopt(&fd, sockopt::Ipv6RecvErr, &true)?,
    }
    socket::connect(fd.as_raw_fd(), &SockaddrStorage::from(dst))?;
    Ok(UdpSocket::from(fd))
}

/// Turns a pending socket error into an outcome, preferring the ICMP details
/// from the error queue.
fn icmp_outcome(socket: &UdpSocket) -> Outcome {
    match read_error_queue(socket) {
        Ok(Some((Errno::ECONNREFUSED, icmp))) => Outcome::Refused { icmp: Some(icmp) },
        Ok(Some((errno, icmp))) => Outcome::Failed(format!(
            "{} (icmp origin {} type {} code {})",
            errno_text(errno),
            icmp.origin,
            icmp.icmp_type,
            icmp.code
        )),
        // Nothing queued: fall back to the plain socket error.
        Ok(None) => match socket.take_error() {
            Ok(Some(e)) => io_outcome(&e),
            Ok(None) => Outcome::Failed("socket reported an error but none was pending".into()),
            Err(e) => Outcome::Failed(e.to_string()),
        },
        Err(e) => Outcome::Failed(format!("reading the error queue: {}", errno_text(e))),
    }
}

/// Reads one entry from the socket's error queue (`MSG_ERRQUEUE`), returning
/// its errno and ICMP origin/type/code; `None` if the queue is empty or the
/// entry did not come from ICMP.
fn read_error_queue(socket: &UdpSocket) -> Result<Option<(Errno, IcmpError)>, Errno> {
    let mut payload = [0u8; 64];
    let mut iov = [IoSliceMut::new(&mut payload)];
    let mut control = nix::cmsg_space!(libc::sock_extended_err, libc::sockaddr_in6);
    let msg = match socket::recvmsg::<SockaddrStorage>(
        socket.as_raw_fd(),
        &mut iov,
        Some(&mut control),
        MsgFlags::MSG_ERRQUEUE | MsgFlags::MSG_DONTWAIT,
    ) {
        Ok(msg) => msg,
        Err(Errno::EAGAIN) => return Ok(None),
        Err(e) => return Err(e),
    };
    for cmsg in msg.cmsgs()? {
        let ee = match cmsg {
            ControlMessageOwned::Ipv4RecvErr(ee, _) | ControlMessageOwned::Ipv6RecvErr(ee, _) => ee,
            _ => continue,
        };
        if ee.ee_origin != libc::SO_EE_ORIGIN_ICMP && ee.ee_origin != libc::SO_EE_ORIGIN_ICMP6 {
            continue;
        }
        let icmp = IcmpError {
            origin: ee.ee_origin,
            icmp_type: ee.ee_type,
            code: ee.ee_code,
        };
        return Ok(Some((Errno::from_raw(ee.ee_errno as i32), icmp)));
    }
    Ok(None)
}

/// A close-on-exec, non-blocking socket of `dst`'s family.
fn new_socket(dst: SocketAddr, ty: SockType) -> Result<OwnedFd, Errno> {
    let family = match dst.ip() {
        IpAddr::V4(_) => AddressFamily::Inet,
        IpAddr::V6(_) => AddressFamily::Inet6,
    };
    socket::socket(
        family,
        ty,
        SockFlag::SOCK_CLOEXEC | SockFlag::SOCK_NONBLOCK,
        None,
    )
}

/// Polls `fd` for `events` until `deadline`; `None` on timeout. The returned
/// flags may also contain POLLERR / POLLHUP, which poll always reports.
fn wait_for(
    fd: BorrowedFd<'_>,
    events: PollFlags,
    deadline: Instant,
) -> Result<Option<PollFlags>, Errno> {
    loop {
        let Some(left) = remaining(deadline) else {
            return Ok(None);
        };
        // Round up so a sub-millisecond remainder still waits a little.
        let millis = left.as_millis().saturating_add(1);
        let timeout =
            PollTimeout::try_from(millis.min(i32::MAX as u128) as i32).unwrap_or(PollTimeout::MAX);
        let mut fds = [PollFd::new(fd, events)];
        match poll(&mut fds, timeout) {
            Ok(0) | Err(Errno::EINTR) => continue,
            Ok(_) => return Ok(Some(fds[0].revents().unwrap_or(PollFlags::empty()))),
            Err(e) => return Err(e),
        }
    }
}

/// Time left until `deadline`, or `None` once it has passed.
fn remaining(deadline: Instant) -> Option<Duration> {
    deadline
        .checked_duration_since(Instant::now())
        .filter(|left| !left.is_zero())
}

fn io_outcome(e: &io::Error) -> Outcome {
    match e.kind() {
        ErrorKind::ConnectionRefused => Outcome::Refused { icmp: None },
        ErrorKind::TimedOut | ErrorKind::WouldBlock => Outcome::TimedOut,
        _ => match e.raw_os_error() {
            Some(code) => Outcome::Failed(errno_text(Errno::from_raw(code))),
            None => Outcome::Failed(e.to_string()),
        },
    }
}

fn io_errno(e: io::Error) -> Errno {
    Errno::from_raw(e.raw_os_error().unwrap_or(libc::EIO))
}

/// "ENETUNREACH: Network is unreachable".
fn errno_text(e: Errno) -> String {
    format!("{e:?}: {}", e.desc())
}

/// What a long-lived client heard back for one message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Heard {
    /// The server's reply, trimmed ("<name> <peer-ip>" from [`udp_server`]).
    Reply(String),
    /// An ICMP error (port unreachable) or a TCP reset.
    Refused,
}

/// A UDP client that keeps its source port, as DNS resolvers, syslog, SIP or WireGuard do:
/// from `src` (address and a fixed port, which flows to other destinations may share) in its
/// namespace it sends a datagram to `dst` every `interval` and notes what comes back and when,
/// until dropped.
pub struct UdpFlow {
    heard: Arc<std::sync::Mutex<Vec<(Instant, Heard)>>>,
    _running: Running,
}

impl UdpFlow {
    /// Binds `src` in `ns` (before this returns) and starts sending.
    pub fn start(ns: &Netns, src: SocketAddr, dst: SocketAddr, interval: Duration) -> UdpFlow {
        let heard = Arc::new(std::sync::Mutex::new(Vec::new()));
        let socket = ns
            .run(move || -> Result<UdpSocket, Errno> {
                let fd = new_socket(dst, SockType::Datagram)?;
                match dst {
                    SocketAddr::V4(_) => socket::setsockopt(&fd, sockopt::Ipv4RecvErr, &true)?,
                    SocketAddr::V6(_) => socket::setsockopt(&fd, sockopt::Ipv6RecvErr, &true)?,
                }
                // Flows to two destinations may share a source port: each socket is
                // connected, so the kernel hands it only its own destination's replies.
                socket::setsockopt(&fd, sockopt::ReuseAddr, &true)?;
                socket::bind(fd.as_raw_fd(), &SockaddrStorage::from(src))?;
                socket::connect(fd.as_raw_fd(), &SockaddrStorage::from(dst))?;
                Ok(UdpSocket::from(fd))
            })
            .unwrap_or_else(|e| panic!("UDP flow {src} -> {dst} in {}: {e}", ns.name()));
        let log = Arc::clone(&heard);
        let running = Running::spawn(format!("udp-flow-{src}"), move |stop| {
            udp_flow(socket, interval, stop, &log)
        });
        UdpFlow {
            heard,
            _running: running,
        }
    }

    /// Everything heard so far, in order, with when it came.
    pub fn heard(&self) -> Vec<(Instant, Heard)> {
        self.heard.lock().expect("flow log").clone()
    }

    /// Replies heard at or after `since`.
    pub fn replies_since(&self, since: Instant) -> Vec<(Instant, String)> {
        self.heard()
            .into_iter()
            .filter(|(t, _)| *t >= since)
            .filter_map(|(t, h)| match h {
                Heard::Reply(r) => Some((t, r)),
                Heard::Refused => None,
            })
            .collect()
    }
}

fn udp_flow(
    socket: UdpSocket,
    interval: Duration,
    stop: &AtomicBool,
    heard: &std::sync::Mutex<Vec<(Instant, Heard)>>,
) {
    let mut buf = [0u8; 2048];
    let mut next = Instant::now();
    while !stop.load(Ordering::Relaxed) {
        if Instant::now() >= next {
            // A refusal queued since the last datagram surfaces on send as well.
            if let Err(e) = socket.send(b"ping") {
                if e.kind() == ErrorKind::ConnectionRefused {
                    let _ = read_error_queue(&socket);
                    heard
                        .lock()
                        .expect("flow log")
                        .push((Instant::now(), Heard::Refused));
                }
            }
            next += interval;
        }
        let wait = next
            .saturating_duration_since(Instant::now())
            .min(SERVER_TICK);
        let got = match wait_for(socket.as_fd(), PollFlags::POLLIN, Instant::now() + wait) {
            Ok(Some(events)) if events.contains(PollFlags::POLLERR) => {
                let _ = read_error_queue(&socket);
                Some(Heard::Refused)
            }
            Ok(Some(_)) => match socket.recv(&mut buf) {
                Ok(n) => Some(Heard::Reply(
                    String::from_utf8_lossy(&buf[..n]).trim().to_owned(),
                )),
                Err(e) if e.kind() == ErrorKind::ConnectionRefused => Some(Heard::Refused),
                Err(_) => None,
            },
            _ => None,
        };
        if let Some(h) = got {
            heard.lock().expect("flow log").push((Instant::now(), h));
        }
    }
}

/// A TCP server inside `ns` bound to `addr` that keeps each connection open and answers every
/// line with "<name> <peer-ip>\n", until the client closes or the server stops.
pub fn tcp_echo_server(ns: &Netns, addr: SocketAddr, name: &str) -> Server {
    let name = name.to_owned();
    spawn_server(ns, addr, "tcp-echo", move |stop| {
        let listener = TcpListener::bind(addr)?;
        listener.set_nonblocking(true)?;
        let local = listener.local_addr()?;
        Ok((local, move || {
            std::thread::scope(|scope| {
                while !stop.load(Ordering::Relaxed) {
                    match listener.accept() {
                        Ok((stream, peer)) => {
                            let (name, stop) = (&name, &stop);
                            scope.spawn(move || echo_lines(stream, peer, name, stop));
                        }
                        Err(e) if e.kind() == ErrorKind::Interrupted => {}
                        Err(_) => std::thread::sleep(SERVER_TICK),
                    }
                }
            })
        }))
    })
}

fn echo_lines(stream: TcpStream, peer: SocketAddr, name: &str, stop: &AtomicBool) {
    use std::io::{BufRead, Write};
    let _ = stream.set_nonblocking(false);
    let _ = stream.set_read_timeout(Some(SERVER_TICK));
    let Ok(mut writer) = stream.try_clone() else {
        return;
    };
    let mut reader = io::BufReader::new(stream);
    let mut line = String::new();
    while !stop.load(Ordering::Relaxed) {
        match reader.read_line(&mut line) {
            Ok(0) => return,
            Ok(_) => {
                let reply = format!("{name} {}\n", peer.ip().to_canonical());
                if writer.write_all(reply.as_bytes()).is_err() {
                    return;
                }
                line.clear();
            }
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {}
            Err(_) => return,
        }
    }
}

/// One long-lived TCP connection from a namespace, asked one line at a time.
pub struct TcpSession {
    reader: io::BufReader<TcpStream>,
}

impl TcpSession {
    /// Connects from inside `ns` to `dst`.
    pub fn connect(ns: &Netns, dst: SocketAddr, timeout: Duration) -> Result<TcpSession, String> {
        let stream = ns
            .run(move || TcpStream::connect_timeout(&dst, timeout))
            .map_err(|e| format!("connecting to {dst}: {e}"))?;
        stream
            .set_read_timeout(Some(timeout))
            .map_err(|e| e.to_string())?;
        Ok(TcpSession {
            reader: io::BufReader::new(stream),
        })
    }

    /// Sends a line and reads the answer line (trimmed), or says what went wrong.
    pub fn ask(&mut self) -> Result<String, String> {
        use std::io::{BufRead, Write};
        self.reader
            .get_mut()
            .write_all(b"ping\n")
            .map_err(|e| format!("send: {e}"))?;
        let mut line = String::new();
        match self.reader.read_line(&mut line) {
            Ok(0) => Err("the connection was closed".into()),
            Ok(_) => Ok(line.trim().to_owned()),
            Err(e) => Err(format!("receive: {e}")),
        }
    }
}
