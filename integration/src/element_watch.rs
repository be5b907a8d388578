//! What each nftables transaction in a network namespace added to a table's sets, as the kernel
//! announces it: a subscriber to the `NFNLGRP_NFTABLES` multicast group, in a thread of its
//! own inside the namespace, that decodes every element added to the watched table (its key
//! and data, as raw bytes) and stamps each transaction when its closing new-generation message
//! arrives.
//!
//! `nodelb_netfilter::Watcher` tells the agent *that* another process changed its tables; this
//! says *what* a transaction added, so a bench can tell which transaction carried which change
//! (an endpoint's new address in the endpoint map) without reading the ruleset back.

use nix::poll::{poll, PollFd, PollFlags};
use nix::sys::socket::{
    bind, recv, setsockopt, socket, sockopt, AddressFamily, MsgFlags, NetlinkAddr, SockFlag,
    SockProtocol, SockType,
};
use nodelb_netfilter::netlink::{messages, Attrs, Msg};
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant};

use crate::netns::Netns;

const NFNLGRP_NFTABLES: u32 = 7;
const NFT_MSG_NEWSETELEM: u16 = 12;
const NFT_MSG_NEWGEN: u16 = 15;
/// `NFTA_GEN_PROC_PID`, `NFTA_GEN_PROC_NAME`.
const GEN_PID: u16 = 2;
const GEN_NAME: u16 = 3;
/// `NFTA_SET_ELEM_LIST_{SET,ELEMENTS}`, `NFTA_LIST_ELEM`, `NFTA_SET_ELEM_{KEY,DATA}`,
/// `NFTA_DATA_VALUE`.
const LIST_SET: u16 = 2;
const LIST_ELEMENTS: u16 = 3;
const LIST_ELEM: u16 = 1;
const ELEM_KEY: u16 = 1;
const ELEM_DATA: u16 = 2;
const DATA_VALUE: u16 = 1;
/// Room for a full replace's events at bench sizes.
const RECEIVE_BUFFER: usize = 64 << 20;

/// An element a transaction added to a set of the watched table.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Added {
    pub set: String,
    /// The key's bytes as the kernel holds them (each field of a concatenation padded to 4).
    pub key: Vec<u8>,
    /// The mapped value's bytes (empty for a plain set).
    pub data: Vec<u8>,
}

/// One committed transaction that touched the watched table.
#[derive(Debug, Clone)]
pub struct Transaction {
    /// When its closing new-generation message was read.
    pub at: Instant,
    /// The committing process (the thread group of the thread the kernel names), when it
    /// could still be read from `/proc`.
    pub tgid: Option<u32>,
    /// The committing thread's name, as the kernel gives it.
    pub process: Option<String>,
    /// Change events on the table (objects added or deleted, elements included).
    pub events: usize,
    pub added: Vec<Added>,
}

/// What the watch reports.
#[derive(Debug, Clone)]
pub enum Seen {
    Transaction(Transaction),
    /// The socket overran and events were lost: a transaction may be missing.
    Overrun(Instant),
}

/// A subscriber in a namespace; stops and joins its thread on drop.
pub struct ElementWatch {
    rx: mpsc::Receiver<Seen>,
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<Result<(), String>>>,
}

impl ElementWatch {
    /// Watches table `table` of nf_tables family `nfproto` (`libc::NFPROTO_IPV4`, …) in `ns`.
    pub fn start(ns: &Netns, nfproto: u8, table: &str) -> Result<ElementWatch, String> {
        let (tx, rx) = mpsc::channel();
        let (ready_tx, ready_rx) = mpsc::channel::<Result<(), String>>();
        let stop = Arc::new(AtomicBool::new(false));
        let stop2 = stop.clone();
        let path = ns.path();
        let name = ns.name().to_string();
        let table = table.to_string();
        let thread = std::thread::Builder::new()
            .name("element-watch".into())
            .spawn(move || -> Result<(), String> {
                let opened = std::fs::File::open(&path)
                    .map_err(|e| format!("opening {}: {e}", path.display()))
                    .and_then(|fd| {
                        nix::sched::setns(fd, nix::sched::CloneFlags::CLONE_NEWNET)
                            .map_err(|e| format!("setns into {name}: {e}"))
                    })
                    .and_then(|()| subscribe());
                let sock = match opened {
                    Ok(s) => {
                        let _ = ready_tx.send(Ok(()));
                        s
                    }
                    Err(e) => {
                        let _ = ready_tx.send(Err(e.clone()));
                        return Err(e);
                    }
                };
                let mut decoder = Decoder::new(nfproto, table);
                receive(&sock, &stop2, |seen| tx.send(seen).is_ok(), &mut decoder)
            })
            .map_err(|e| format!("spawning the element watch thread: {e}"))?;
        ready_rx
            .recv_timeout(Duration::from_secs(5))
            .map_err(|e| format!("the element watch thread did not start: {e}"))??;
        Ok(ElementWatch {
            rx,
            stop,
            thread: Some(thread),
        })
    }

    /// Everything seen since the last call.
    pub fn drain(&self) -> Vec<Seen> {
        self.rx.try_iter().collect()
    }

    /// Stops the thread; its error, if it ended on one.
    pub fn stop(mut self) -> Result<(), String> {
        self.finish()
    }

    fn finish(&mut self) -> Result<(), String> {
        self.stop.store(true, Ordering::Relaxed);
        match self.thread.take().map(|t| t.join()) {
            None | Some(Ok(Ok(()))) => Ok(()),
            Some(Ok(Err(e))) => Err(e),
            Some(Err(_)) => Err("the element watch thread panicked".into()),
        }
    }
}

impl Drop for ElementWatch {
    fn drop(&mut self) {
        if let Err(e) = self.finish() {
            eprintln!("element watch: {e}");
        }
    }
}

/// A close-on-exec netfilter netlink socket in the nftables event group, with a large
/// receive buffer.
fn subscribe() -> Result<OwnedFd, String> {
    let sock = socket(
        AddressFamily::Netlink,
        SockType::Raw,
        SockFlag::SOCK_CLOEXEC,
        SockProtocol::NetlinkNetFilter,
    )
    .map_err(|e| format!("a netfilter netlink socket: {e}"))?;
    setsockopt(&sock, sockopt::RcvBufForce, &RECEIVE_BUFFER)
        .map_err(|e| format!("SO_RCVBUFFORCE: {e}"))?;
    bind(
        sock.as_raw_fd(),
        &NetlinkAddr::new(0, 1 << (NFNLGRP_NFTABLES - 1)),
    )
    .map_err(|e| format!("joining the nftables event group: {e}"))?;
    Ok(sock)
}

/// Reads until `stop`, handing every transaction (and overrun) to `send` until it refuses.
fn receive(
    sock: &OwnedFd,
    stop: &AtomicBool,
    mut send: impl FnMut(Seen) -> bool,
    decoder: &mut Decoder,
) -> Result<(), String> {
    let mut buf = vec![0u8; 1 << 20];
    while !stop.load(Ordering::Relaxed) {
        let mut fds = [PollFd::new(sock.as_fd(), PollFlags::POLLIN)];
        match poll(&mut fds, 100u16) {
            Ok(0) | Err(nix::errno::Errno::EINTR) => continue,
            Ok(_) => {}
            Err(e) => return Err(format!("poll: {e}")),
        }
        let n = match recv(sock.as_raw_fd(), &mut buf, MsgFlags::empty()) {
            Ok(n) => n,
            Err(nix::errno::Errno::ENOBUFS) => {
                decoder.reset();
                if !send(Seen::Overrun(Instant::now())) {
                    break;
                }
                continue;
            }
            Err(e) => return Err(format!("recv: {e}")),
        };
        for m in messages(&buf[..n]) {
            if let Some(t) = decoder.handle(&m) {
                if !send(Seen::Transaction(t)) {
                    return Ok(());
                }
            }
        }
    }
    Ok(())
}

/// Gathers one transaction's events on the table until its new-generation message.
struct Decoder {
    nfproto: u8,
    table: String,
    events: usize,
    added: Vec<Added>,
}

impl Decoder {
    fn new(nfproto: u8, table: String) -> Decoder {
        Decoder {
            nfproto,
            table,
            events: 0,
            added: Vec::new(),
        }
    }

    fn reset(&mut self) {
        self.events = 0;
        self.added.clear();
    }

    fn handle(&mut self, m: &Msg<'_>) -> Option<Transaction> {
        let kind = m.nft_kind()?;
        if kind == NFT_MSG_NEWGEN {
            if self.events == 0 {
                return None;
            }
            let a = m.attrs();
            let tid = a.get_be32(GEN_PID);
            let t = Transaction {
                at: Instant::now(),
                tgid: tid.and_then(tgid),
                process: a.get_str(GEN_NAME),
                events: self.events,
                added: std::mem::take(&mut self.added),
            };
            self.events = 0;
            return Some(t);
        }
        // Attribute 1 names the table in table, chain, rule, set and element messages alike;
        // other kinds (objects, flowtables, generation) are counted the same way when they
        // name it.
        if m.family() != self.nfproto || m.attrs().get_str(1).as_deref() != Some(&self.table) {
            return None;
        }
        self.events += 1;
        if kind == NFT_MSG_NEWSETELEM {
            self.added.extend(elements(m.attrs()));
        }
        None
    }
}

/// The elements of a `NEWSETELEM` message.
fn elements(a: Attrs<'_>) -> Vec<Added> {
    let set = a.get_str(LIST_SET).unwrap_or_default();
    let Some(list) = a.get(LIST_ELEMENTS) else {
        return Vec::new();
    };
    Attrs(list)
        .filter(|(ty, _)| *ty == LIST_ELEM)
        .map(|(_, elem)| {
            let value = |ty: u16| {
                Attrs(elem)
                    .get(ty)
                    .and_then(|nested| Attrs(nested).get(DATA_VALUE))
                    .map(<[u8]>::to_vec)
                    .unwrap_or_default()
            };
            Added {
                set: set.clone(),
                key: value(ELEM_KEY),
                data: value(ELEM_DATA),
            }
        })
        .collect()
}

/// The thread group of thread `tid` (the kernel names the committing thread).
pub fn tgid(tid: u32) -> Option<u32> {
    let status = std::fs::read_to_string(format!("/proc/{tid}/status")).ok()?;
    status
        .lines()
        .find_map(|l| l.strip_prefix("Tgid:"))
        .and_then(|v| v.trim().parse().ok())
}
