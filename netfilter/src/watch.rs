//! Following nftables change events: every committed transaction is announced to the
//! `NFNLGRP_NFTABLES` multicast group, object by object, then closed by a new-generation
//! message naming the process that committed it. Changes to watched tables by any other
//! process are reported, so the agent can repair drift at once.

use crate::model::Family;
use crate::model::TableRef;
use crate::netlink::{messages, Msg};
use crate::transact::{mnl_fd, own_portids, Error, SOCKET_BUFFER_BYTES};
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::time::{Duration, Instant};

const NFNLGRP_NFTABLES: u32 = 7;
const NFT_MSG_NEWGEN: u16 = 15;

/// A transaction by another process touched a watched table.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ForeignChange {
    pub tables: Vec<TableRef>,
    pub pid: Option<u32>,
    pub process: Option<String>,
    /// Short descriptions of the events, such as `delete rule ip nodelb prerouting`.
    pub events: Vec<String>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum WatchEvent {
    Foreign(ForeignChange),
    /// Events were lost (the socket overran): assume anything may have changed.
    Overrun,
}

/// Join or leave the nftables event group.
fn membership(fd: RawFd, join: bool) -> Result<(), Error> {
    let (option, name) = if join {
        (libc::NETLINK_ADD_MEMBERSHIP, "NETLINK_ADD_MEMBERSHIP")
    } else {
        (libc::NETLINK_DROP_MEMBERSHIP, "NETLINK_DROP_MEMBERSHIP")
    };
    let group = NFNLGRP_NFTABLES as i32;
    let r = unsafe {
        libc::setsockopt(
            fd,
            libc::SOL_NETLINK,
            option,
            &group as *const i32 as *const libc::c_void,
            4,
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

/// Stops a [`Watcher`]'s subscription for a while, from any thread: for a process's own large
/// transactions. With any listener, the kernel builds an event per object a transaction
/// touches (a full replace touches every chain, rule, set element and counter), which
/// lengthens the commit and can overrun the watcher's buffer; a process need not be told of its
/// own. Changes committed by others while paused are not reported.
pub struct WatchPause {
    fd: OwnedFd,
}

impl WatchPause {
    /// Leave the event group until the returned guard is dropped.
    pub fn pause(&self) -> Result<Paused<'_>, Error> {
        membership(self.fd.as_raw_fd(), false)?;
        Ok(Paused(self))
    }
}

/// While it lives, the watcher hears nothing; dropped, it listens again.
pub struct Paused<'a>(&'a WatchPause);

impl Drop for Paused<'_> {
    fn drop(&mut self) {
        if let Err(e) = membership(self.0.fd.as_raw_fd(), true) {
            tracing::error!(error = %e, "cannot listen to nftables events again; drift is found by the periodic resync only");
        }
    }
}

pub struct Watcher {
    sock: mnl::Socket,
    tables: Vec<TableRef>,
    pending: Vec<(TableRef, String)>,
    buf: Vec<u8>,
}

// SAFETY: as for `Nft`: an fd and its address, used through `&mut self`.
unsafe impl Send for Watcher {}

fn kind_text(kind: u16) -> Option<(&'static str, &'static str)> {
    Some(match kind {
        0 => ("add", "table"),
        2 => ("delete", "table"),
        3 => ("add", "chain"),
        5 => ("delete", "chain"),
        6 => ("add", "rule"),
        8 => ("delete", "rule"),
        9 => ("add", "set"),
        11 => ("delete", "set"),
        12 => ("add", "element"),
        14 => ("delete", "element"),
        // object, flowtable: count them too
        18 => ("add", "object"),
        20 => ("delete", "object"),
        22 => ("add", "flowtable"),
        24 => ("delete", "flowtable"),
        _ => return None,
    })
}

impl Watcher {
    /// Subscribe, in the current thread's network namespace, to changes of `tables`.
    pub fn open(tables: Vec<TableRef>) -> Result<Watcher, Error> {
        let sock = crate::transact::open_socket()?;
        let fd = mnl_fd(&sock);
        let big = SOCKET_BUFFER_BYTES as i32;
        let r = unsafe {
            libc::setsockopt(
                fd,
                libc::SOL_SOCKET,
                libc::SO_RCVBUFFORCE,
                &big as *const i32 as *const libc::c_void,
                4,
            )
        };
        if r < 0 {
            return Err(Error::SocketOption {
                option: "SO_RCVBUFFORCE",
                source: io::Error::last_os_error(),
            });
        }
        membership(fd, true)?;
        Ok(Watcher {
            sock,
            tables,

            pending: Vec::new(),
            buf: vec![0; 1 << 20],
        })
    }

    /// A handle that stops and restarts this watcher's subscription from another thread.
    pub fn pause_handle(&self) -> Result<WatchPause, Error> {
        let fd = unsafe { libc::dup(self.fd()) };
        if fd < 0 {
            return Err(Error::SocketOption {
                option: "dup",
                source: io::Error::last_os_error(),
            });
        }
        // SAFETY: a new descriptor of our own (the same socket as the watcher's).
        Ok(WatchPause {
            fd: unsafe { OwnedFd::from_raw_fd(fd) },
        })
    }

    /// The socket, for callers that poll it from an event loop.
    pub fn fd(&self) -> std::os::fd::RawFd {
        mnl_fd(&self.sock)
    }

    /// Wait up to `timeout` for a change by another process to a watched table.
    pub fn next(&mut self, timeout: Duration) -> Result<Option<WatchEvent>, Error> {
        let deadline = Instant::now() + timeout;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            let mut pfd = libc::pollfd {
                fd: self.fd(),
                events: libc::POLLIN,
                revents: 0,
            };
            let ms = left.as_millis().min(i32::MAX as u128) as i32;
            let r = unsafe { libc::poll(&mut pfd, 1, ms) };
            if r < 0 {
                let e = io::Error::last_os_error();
                if e.kind() == io::ErrorKind::Interrupted {
                    continue;
                }
                return Err(Error::Dump {
                    what: "nftables events".into(),
                    source: e,
                });
            }
            if r == 0 {
                return Ok(None);
            }
            let n = match self.sock.recv_raw(&mut self.buf) {
                Ok(n) => n,
                Err(e) if e.raw_os_error() == Some(libc::ENOBUFS) => {
                    self.pending.clear();
                    return Ok(Some(WatchEvent::Overrun));
                }
                Err(e) => {
                    return Err(Error::Dump {
                        what: "nftables events".into(),
                        source: e,
                    })
                }
            };
            let buf = std::mem::take(&mut self.buf);
            let mut found = None;
            for m in messages(&buf[..n]) {
                if let Some(ev) = self.handle(&m) {
                    found = Some(ev);
                }
            }
            self.buf = buf;
            if let Some(ev) = found {
                return Ok(Some(WatchEvent::Foreign(ev)));
            }
        }
    }

    fn handle(&mut self, m: &Msg<'_>) -> Option<ForeignChange> {
        let kind = m.nft_kind()?;
        if kind == NFT_MSG_NEWGEN {
            let a = m.attrs();
            let pid = a.get_be32(2);
            let process = a.get_str(3);
            let pending = std::mem::take(&mut self.pending);
            // The kernel stamps change events with the committing socket's port id; the
            // process id it reports is the committing thread's, so it cannot tell ours apart.
            let ours = own_portids()
                .lock()
                .map(|ids| ids.contains(&m.pid))
                .unwrap_or(false);
            if pending.is_empty() || ours {
                return None;
            }
            let mut tables: Vec<TableRef> = pending.iter().map(|(t, _)| t.clone()).collect();
            tables.sort();
            tables.dedup();
            return Some(ForeignChange {
                tables,
                pid,
                process,
                events: pending.into_iter().map(|(_, e)| e).collect(),
            });
        }
        let (action, object) = kind_text(kind)?;
        let family = Family::from_nfproto(m.family())?;
        // Attribute 1 names the table in table, chain, rule, set and element messages alike.
        let name = m.attrs().get_str(1)?;
        let t = TableRef { family, name };
        if self.tables.contains(&t) {
            let what = format!("{action} {object} {t}");
            if self.pending.len() < 64 {
                self.pending.push((t, what));
            } else if let Some(last) = self.pending.last_mut() {
                last.1 = "… and more".into();
            }
        }
        None
    }
}
