//! Sending batches: one netfilter netlink socket per handle, sized for batches of 10,000
//! Services, every ACK matched to its sequence number, every kernel error mapped to the object
//! that caused it.

use crate::encode::{Batch, EncodeError};
use crate::netlink::{self, messages};
use crate::ops::Op;
use std::collections::BTreeSet;
use std::io;
use std::os::fd::RawFd;
use std::time::{Duration, Instant};
use tracing::debug;

/// Socket buffers large enough for the batch of a full replace of 10,000 Services × 5
/// endpoints, with room to spare (the netfilter benchmark prints the batch's size).
pub const SOCKET_BUFFER_BYTES: usize = 64 << 20;
const RECV_TIMEOUT: Duration = Duration::from_secs(30);

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("opening a netfilter netlink socket")]
    Open(#[source] io::Error),
    #[error("setting netlink socket option {option}")]
    SocketOption {
        option: &'static str,
        #[source]
        source: io::Error,
    },
    #[error(transparent)]
    Encode(#[from] EncodeError),
    #[error("invalid model: {0}")]
    Invalid(#[from] crate::validate::Invalid),
    #[error("sending a {bytes}-byte batch")]
    Send {
        bytes: usize,
        #[source]
        source: io::Error,
    },
    #[error("receiving the kernel's answer to batch {seq}")]
    Recv {
        seq: u32,
        #[source]
        source: io::Error,
    },
    #[error("the kernel rejected {object}{}", .detail.as_ref().map(|d| format!(" ({d})")).unwrap_or_default())]
    Rejected {
        object: String,
        detail: Option<String>,
        #[source]
        source: io::Error,
    },
    #[error("dumping {what}")]
    Dump {
        what: String,
        #[source]
        source: io::Error,
    },
}

impl Error {
    /// The errno the kernel answered with, for rejected batches.
    pub fn errno(&self) -> Option<i32> {
        match self {
            Error::Rejected { source, .. } => source.raw_os_error(),
            _ => None,
        }
    }
}

/// Sizes and times of one committed batch.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CommitStats {
    pub messages: usize,
    pub bytes: usize,
    pub encode: Duration,
    pub commit: Duration,
}

impl CommitStats {
    /// Add another batch's sizes and times to these.
    pub fn add(&mut self, o: CommitStats) {
        self.messages += o.messages;
        self.bytes += o.bytes;
        self.encode += o.encode;
        self.commit += o.commit;
    }
}

/// A netfilter netlink socket, bound in the network namespace of the thread that opened it.
pub struct Nft {
    sock: mnl::Socket,
    seq: u32,
}

fn setsockopt_int(
    fd: RawFd,
    level: i32,
    opt: i32,
    name: &'static str,
    v: i32,
) -> Result<(), Error> {
    let r = unsafe {
        libc::setsockopt(
            fd,
            level,
            opt,
            &v as *const i32 as *const libc::c_void,
            std::mem::size_of::<i32>() as libc::socklen_t,
        )
    };
    if r < 0 {
        return Err(Error::SocketOption {
            option: name,
            source: io::Error::last_os_error(),
        });
    }
    Ok(())
}

/// A netfilter netlink socket, close-on-exec: a process the caller spawns (a test's agent,
/// say) must not inherit it, or a watch subscription would outlive its reader and make the
/// kernel build change events for nobody.
pub(crate) fn open_socket() -> Result<mnl::Socket, Error> {
    let sock = mnl::Socket::new(mnl::Bus::Netfilter).map_err(Error::Open)?;
    // SAFETY: fcntl on the socket's own fd.
    if unsafe { libc::fcntl(mnl_fd(&sock), libc::F_SETFD, libc::FD_CLOEXEC) } < 0 {
        return Err(Error::SocketOption {
            option: "FD_CLOEXEC",
            source: io::Error::last_os_error(),
        });
    }
    Ok(sock)
}

/// The most iovecs one `sendmsg` takes (`UIO_MAXIOV`).
const MAX_IOVECS: usize = 1024;

/// Send a batch's pieces to the kernel as one netlink datagram (one `sendmsg`, an iovec per
/// piece): the kernel reads a batch from one datagram.
fn send_pieces(fd: RawFd, pieces: &[Vec<u8>]) -> io::Result<usize> {
    if pieces.len() > MAX_IOVECS {
        // A batch of tens of MiB: sent from one copy rather than refused.
        return send_pieces(fd, &[pieces.concat()]);
    }
    let mut iov: Vec<libc::iovec> = pieces
        .iter()
        .map(|p| libc::iovec {
            iov_base: p.as_ptr() as *mut libc::c_void,
            iov_len: p.len(),
        })
        .collect();
    // SAFETY: an all-zero sockaddr_nl is valid; the family makes it the kernel's address.
    let mut kernel: libc::sockaddr_nl = unsafe { std::mem::zeroed() };
    kernel.nl_family = libc::AF_NETLINK as libc::sa_family_t;
    // SAFETY: as above for msghdr; every pointer set below outlives the call.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_name = &mut kernel as *mut libc::sockaddr_nl as *mut libc::c_void;
    msg.msg_namelen = std::mem::size_of::<libc::sockaddr_nl>() as libc::socklen_t;
    msg.msg_iov = iov.as_mut_ptr();
    msg.msg_iovlen = iov.len();
    loop {
        // SAFETY: `msg` points at live buffers only read by the kernel.
        let n = unsafe { libc::sendmsg(fd, &msg, 0) };
        if n >= 0 {
            return Ok(n as usize);
        }
        let e = io::Error::last_os_error();
        if e.kind() != io::ErrorKind::Interrupted {
            return Err(e);
        }
    }
}

pub(crate) fn mnl_fd(sock: &mnl::Socket) -> RawFd {
    unsafe { mnl::mnl_sys::mnl_socket_get_fd(sock.as_raw_socket()) }
}

/// Netlink port ids of this process's open `Nft` sockets: a watcher tells nodelb's own
/// commits from anyone else's by the port id the kernel puts on every change event.
pub(crate) fn own_portids() -> &'static std::sync::Mutex<std::collections::HashSet<u32>> {
    static IDS: std::sync::OnceLock<std::sync::Mutex<std::collections::HashSet<u32>>> =
        std::sync::OnceLock::new();
    IDS.get_or_init(Default::default)
}

/// A netfilter netlink socket as nodelb uses one, in the current thread's network namespace:
/// close-on-exec, buffers for the batches (and dumps) of 10,000 Services, errors that echo only
/// the failed message's header with the kernel's text, and a receive timeout.
pub(crate) fn configured_socket() -> Result<mnl::Socket, Error> {
    let sock = open_socket()?;
    let fd = mnl_fd(&sock);
    let big = SOCKET_BUFFER_BYTES as i32;
    setsockopt_int(
        fd,
        libc::SOL_SOCKET,
        libc::SO_SNDBUFFORCE,
        "SO_SNDBUFFORCE",
        big,
    )?;
    setsockopt_int(
        fd,
        libc::SOL_SOCKET,
        libc::SO_RCVBUFFORCE,
        "SO_RCVBUFFORCE",
        big,
    )?;
    setsockopt_int(
        fd,
        libc::SOL_NETLINK,
        libc::NETLINK_CAP_ACK,
        "NETLINK_CAP_ACK",
        1,
    )?;
    setsockopt_int(
        fd,
        libc::SOL_NETLINK,
        libc::NETLINK_EXT_ACK,
        "NETLINK_EXT_ACK",
        1,
    )?;
    let tv = libc::timeval {
        tv_sec: RECV_TIMEOUT.as_secs() as libc::time_t,
        tv_usec: 0,
    };
    let r = unsafe {
        libc::setsockopt(
            fd,
            libc::SOL_SOCKET,
            libc::SO_RCVTIMEO,
            &tv as *const _ as *const libc::c_void,
            std::mem::size_of::<libc::timeval>() as libc::socklen_t,
        )
    };
    if r < 0 {
        return Err(Error::SocketOption {
            option: "SO_RCVTIMEO",
            source: io::Error::last_os_error(),
        });
    }
    Ok(sock)
}

/// A first sequence number from the clock, so two sockets of a process are easy to tell apart
/// in a trace (sequence numbers need only be distinct per socket).
pub(crate) fn clock_seq() -> u32 {
    (std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs() as u32)
        .unwrap_or(1))
        & 0x7fff_ffff
}

/// Send one request and hand each answer to it to `each`, until `NLMSG_DONE` (a dump) or the
/// first answer (a plain request). An error the kernel answers with is returned as the error.
pub(crate) fn exchange(
    sock: &mnl::Socket,
    req: &[u8],
    dump: bool,
    mut each: impl FnMut(netlink::Msg<'_>),
) -> io::Result<()> {
    let seq = u32::from_ne_bytes(req[8..12].try_into().expect("header"));
    sock.send(req)?;
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let n = sock.recv_raw(&mut buf)?;
        for m in messages(&buf[..n]) {
            if m.seq != seq {
                continue;
            }
            if m.ty == netlink::NLMSG_DONE {
                return Ok(());
            }
            if let Some((code, _, _)) = m.error() {
                if code != 0 {
                    return Err(io::Error::from_raw_os_error(-code));
                }
                return Ok(());
            }
            each(m);
            if !dump {
                return Ok(());
            }
        }
    }
}

impl Drop for Nft {
    fn drop(&mut self) {
        if let Ok(mut ids) = own_portids().lock() {
            ids.remove(&self.sock.portid());
        }
    }
}

// SAFETY: an mnl_socket is an fd plus its bound address, with no thread-affine state; `Nft`
// is used through `&mut self`, so one thread at a time. The socket stays in the network
// namespace it was opened in whichever thread uses it later.
unsafe impl Send for Nft {}

impl Nft {
    /// Open a socket in the current thread's network namespace.
    pub fn open() -> Result<Nft, Error> {
        let sock = configured_socket()?;
        // Sequence numbers only need to be distinct per socket; start from the clock so two
        // handles in one process are easy to tell apart in a trace.
        let seq = clock_seq();
        own_portids()
            .lock()
            .expect("portid registry")
            .insert(sock.portid());
        Ok(Nft { sock, seq })
    }

    pub fn portid(&self) -> u32 {
        self.sock.portid()
    }

    /// The first sequence number of the next batch.
    pub(crate) fn next_batch_seq(&self) -> u32 {
        self.seq.wrapping_add(1)
    }

    pub(crate) fn next_seq(&mut self) -> u32 {
        self.seq = self.seq.wrapping_add(1);
        self.seq
    }

    /// Encode `ops` as one batch and commit it: all of it or nothing.
    pub fn apply(&mut self, ops: &[Op<'_>]) -> Result<CommitStats, Error> {
        let t0 = Instant::now();
        let batch = Batch::encode(self.next_batch_seq(), ops)?;
        let encode = t0.elapsed();
        let mut stats = self.commit(&batch)?;
        stats.encode = encode;
        Ok(stats)
    }

    /// Send an encoded batch and wait for every ACK.
    pub fn commit(&mut self, batch: &Batch) -> Result<CommitStats, Error> {
        let t0 = Instant::now();
        self.seq = batch.end_seq();
        if batch.is_empty() {
            return Ok(CommitStats::default());
        }
        let bytes = batch.len();
        let sent = send_pieces(mnl_fd(&self.sock), batch.pieces())
            .map_err(|source| Error::Send { bytes, source })?;
        if sent != bytes {
            return Err(Error::Send {
                bytes,
                source: io::Error::other(format!("only {sent} bytes sent")),
            });
        }
        let mut pending: BTreeSet<u32> = batch.acked_seqs().collect();
        let mut first_error: Option<Error> = None;
        let mut buf = vec![0u8; 1 << 20];
        while !pending.is_empty() {
            let n = match self.sock.recv_raw(&mut buf) {
                Ok(n) => n,
                Err(source) => {
                    return Err(first_error.unwrap_or(Error::Recv {
                        seq: batch.first_seq(),
                        source,
                    }))
                }
            };
            for m in messages(&buf[..n]) {
                let Some((code, seq, text)) = m.error() else {
                    continue;
                };
                if seq == batch.first_seq() && code != 0 {
                    // The batch as a whole was refused (or its commit failed).
                    pending.clear();
                    first_error.get_or_insert(Error::Rejected {
                        object: "the batch".into(),
                        detail: text,
                        source: io::Error::from_raw_os_error(-code),
                    });
                    continue;
                }
                if !pending.remove(&seq) {
                    debug!(seq, "answer to a message of another batch");
                    continue;
                }
                if code != 0 && first_error.is_none() {
                    let object = batch
                        .object(seq)
                        .map(str::to_string)
                        .unwrap_or_else(|| format!("message {seq}"));
                    first_error = Some(Error::Rejected {
                        object,
                        detail: text,
                        source: io::Error::from_raw_os_error(-code),
                    });
                }
            }
        }
        if let Some(e) = first_error {
            return Err(e);
        }
        Ok(CommitStats {
            messages: batch.message_count(),
            bytes,
            encode: Duration::ZERO,
            commit: t0.elapsed(),
        })
    }

    /// Send a request and hand each reply to `each` as it arrives (`dump`: until the dump
    /// is done): a large dump (a set's elements, a table's counters) is never held whole.
    pub(crate) fn request(
        &mut self,
        req: &[u8],
        what: &str,
        dump: bool,
        each: impl FnMut(netlink::Msg<'_>),
    ) -> Result<(), Error> {
        exchange(&self.sock, req, dump, each).map_err(|source| Error::Dump {
            what: what.into(),
            source,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn netfilter_sockets_are_close_on_exec() {
        let sock = open_socket().expect("a netfilter netlink socket (no privilege needed)");
        // SAFETY: F_GETFD on the socket's own fd.
        let flags = unsafe { libc::fcntl(mnl_fd(&sock), libc::F_GETFD) };
        assert!(
            flags >= 0 && flags & libc::FD_CLOEXEC != 0,
            "flags {flags:#x}"
        );
    }
}
