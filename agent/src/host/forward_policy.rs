//! Base chains of other tables on the forward hook whose policy is drop (Docker, firewalld,
//! ufw, iptables-nft): an `accept` in nodelb's table cannot override them, so `check` and
//! `/readyz` report them. Read only, through a chain dump over netfilter netlink; the netfilter
//! crate's readback counts chains but does not decode hooks and policies.
//!
//! Not seen: iptables-legacy (x_tables) chains, which are not nftables objects.

use nodelb_netfilter::netlink::{messages, Attrs, Request};
use std::fmt;
use std::io;

const NETLINK_NETFILTER: i32 = 12;
const NFT_MSG_GETCHAIN: u16 = 4;
const NFTA_CHAIN_TABLE: u16 = 1;
const NFTA_CHAIN_NAME: u16 = 3;
const NFTA_CHAIN_HOOK: u16 = 4;
const NFTA_CHAIN_POLICY: u16 = 5;
const NFTA_HOOK_HOOKNUM: u16 = 1;
const NFTA_HOOK_PRIORITY: u16 = 2;
const NF_INET_FORWARD: u32 = 2;
const NF_DROP: u32 = 0;

/// A forward-hook base chain with policy drop, outside nodelb's tables.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct DropChain {
    /// `ip`, `ip6` or `inet`.
    pub family: &'static str,
    pub table: String,
    pub chain: String,
    pub priority: i32,
}

impl fmt::Display for DropChain {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "table {} {} chain {} (hook forward priority {}) has policy drop",
            self.family, self.table, self.chain, self.priority
        )
    }
}

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("opening a netfilter netlink socket to list chains")]
    Open(#[source] io::Error),
    #[error("dumping nftables chains")]
    Dump(#[source] io::Error),
}

fn family_name(nfproto: u8) -> Option<&'static str> {
    match nfproto {
        1 => Some("inet"),
        2 => Some("ip"),
        10 => Some("ip6"),
        _ => None,
    }
}

/// Parse one `NFT_MSG_NEWCHAIN` dump message: a forward-hook drop chain, or `None`.
fn drop_chain(family: u8, attrs: Attrs<'_>, own_table: &str) -> Option<DropChain> {
    let family = family_name(family)?;
    let table = attrs.get_str(NFTA_CHAIN_TABLE)?;
    if table == own_table && family != "inet" {
        return None;
    }
    let hook = Attrs(attrs.get(NFTA_CHAIN_HOOK)?);
    if hook.get_be32(NFTA_HOOK_HOOKNUM)? != NF_INET_FORWARD {
        return None;
    }
    if attrs.get_be32(NFTA_CHAIN_POLICY)? != NF_DROP {
        return None;
    }
    Some(DropChain {
        family,
        table,
        chain: attrs.get_str(NFTA_CHAIN_NAME).unwrap_or_default(),
        priority: hook.get_be32(NFTA_HOOK_PRIORITY).unwrap_or(0) as i32,
    })
}

struct Fd(i32);

impl Drop for Fd {
    fn drop(&mut self) {
        // SAFETY: the fd was returned by socket() and is closed once.
        unsafe { libc::close(self.0) };
    }
}

/// Every forward-hook base chain with policy drop in `ip`, `ip6` and `inet` tables other than
/// nodelb's own (`own_table` in `ip`/`ip6`). Needs CAP_NET_ADMIN.
pub fn drop_chains(own_table: &str) -> Result<Vec<DropChain>, Error> {
    // SAFETY: plain socket syscalls on an fd owned by `Fd`.
    let fd = unsafe {
        libc::socket(
            libc::AF_NETLINK,
            libc::SOCK_RAW | libc::SOCK_CLOEXEC,
            NETLINK_NETFILTER,
        )
    };
    if fd < 0 {
        return Err(Error::Open(io::Error::last_os_error()));
    }
    let fd = Fd(fd);
    let tv = libc::timeval {
        tv_sec: 5,
        tv_usec: 0,
    };
    // SAFETY: tv outlives the call; the size is the struct's.
    unsafe {
        libc::setsockopt(
            fd.0,
            libc::SOL_SOCKET,
            libc::SO_RCVTIMEO,
            &tv as *const _ as *const libc::c_void,
            std::mem::size_of::<libc::timeval>() as libc::socklen_t,
        )
    };
    let seq = 1;
    let req = Request::new(
        NFT_MSG_GETCHAIN,
        libc::NLM_F_DUMP as u16,
        libc::AF_UNSPEC as u8,
        seq,
    )
    .finish();
    // SAFETY: req is a valid buffer of its length; the kernel is the default destination.
    let sent = unsafe { libc::send(fd.0, req.as_ptr() as *const libc::c_void, req.len(), 0) };
    if sent < 0 {
        return Err(Error::Dump(io::Error::last_os_error()));
    }
    let mut out = Vec::new();
    let mut buf = vec![0u8; 1 << 16];
    loop {
        // SAFETY: buf is writable for its length.
        let n = unsafe { libc::recv(fd.0, buf.as_mut_ptr() as *mut libc::c_void, buf.len(), 0) };
        if n < 0 {
            return Err(Error::Dump(io::Error::last_os_error()));
        }
        for m in messages(&buf[..n as usize]) {
            if m.seq != seq {
                continue;
            }
            if m.ty == nodelb_netfilter::netlink::NLMSG_DONE {
                out.sort();
                return Ok(out);
            }
            if let Some((code, _, _)) = m.error() {
                if code != 0 {
                    return Err(Error::Dump(io::Error::from_raw_os_error(-code)));
                }
                out.sort();
                return Ok(out);
            }
            if let Some(c) = drop_chain(m.family(), m.attrs(), own_table) {
                out.push(c);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::process::Command;

    /// A foreign forward drop chain is found, an accept one and nodelb's own are not. Runs in a
    /// fresh network namespace on its own thread; needs root and the `nft` binary.
    #[test]
    fn finds_foreign_forward_drop_chains() {
        if !nix::unistd::geteuid().is_root()
            || Command::new("nft").arg("--version").output().is_err()
        {
            if std::env::var("CI").as_deref() == Ok("true") {
                panic!("finds_foreign_forward_drop_chains: needs root and nft; CI=true makes this a failure");
            }
            eprintln!("SKIP finds_foreign_forward_drop_chains: needs root and nft");
            return;
        }
        std::thread::spawn(|| {
            nix::sched::unshare(nix::sched::CloneFlags::CLONE_NEWNET).expect("unshare");
            assert_eq!(drop_chains("nodelb").unwrap(), vec![]);
            let script = "table inet fw {\n\
                 chain FORWARD { type filter hook forward priority 0; policy drop; }\n\
                 chain INPUT { type filter hook input priority 0; policy drop; }\n}\n\
                 table ip other {\nchain FORWARD { type filter hook forward priority 10; policy accept; }\n}\n\
                 table ip nodelb {\nchain FORWARD { type filter hook forward priority 0; policy drop; }\n}\n";
            let mut child = Command::new("nft")
                .args(["-f", "-"])
                .stdin(std::process::Stdio::piped())
                .spawn()
                .unwrap();
            use std::io::Write;
            child.stdin.take().unwrap().write_all(script.as_bytes()).unwrap();
            assert!(child.wait().unwrap().success());
            let found = drop_chains("nodelb").unwrap();
            assert_eq!(
                found,
                vec![DropChain { family: "inet", table: "fw".into(), chain: "FORWARD".into(), priority: 0 }]
            );
            assert_eq!(
                found[0].to_string(),
                "table inet fw chain FORWARD (hook forward priority 0) has policy drop"
            );
        })
        .join()
        .unwrap();
    }
}
