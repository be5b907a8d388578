//! Base chains of other tables on the forward hook whose policy is drop (Docker, firewalld,
//! ufw, iptables-nft): an `accept` in nodelb's table cannot override them, so `check` and
//! `/readyz` report them. Read only: the netfilter crate reads the base chains back; this
//! module decides which of them drop forwarded traffic nodelb forwards.
//!
//! Not seen: iptables-legacy (x_tables) chains, which are not nftables objects.

use nodelb_netfilter::{BaseChainInfo, Family, Hook, Nft, Policy};
use std::fmt;

pub use nodelb_netfilter::Error;

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

/// A forward-hook drop chain of a table that is not nodelb's (`own_table` in `ip`/`ip6`;
/// an `inet` table of that name is someone else's), or `None`.
fn drop_chain(c: BaseChainInfo, own_table: &str) -> Option<DropChain> {
    if c.table == own_table && c.family != Family::Inet {
        return None;
    }
    if c.hook != Hook::Forward || c.policy != Policy::Drop {
        return None;
    }
    Some(DropChain {
        family: c.family.keyword(),
        table: c.table,
        chain: c.name,
        priority: c.priority,
    })
}

/// Every forward-hook base chain with policy drop in `ip`, `ip6` and `inet` tables other than
/// nodelb's own (`own_table` in `ip`/`ip6`). Needs CAP_NET_ADMIN.
pub fn drop_chains(own_table: &str) -> Result<Vec<DropChain>, Error> {
    let mut out: Vec<DropChain> = Nft::open()?
        .base_chains()?
        .into_iter()
        .filter_map(|c| drop_chain(c, own_table))
        .collect();
    out.sort();
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::process::Command;

    #[test]
    fn only_foreign_forward_drop_chains_are_reported() {
        let chain = |family, table: &str, hook, policy| BaseChainInfo {
            family,
            table: table.into(),
            name: "FORWARD".into(),
            hook,
            priority: -5,
            policy,
        };
        let found = |c| drop_chain(c, "nodelb");
        assert_eq!(
            found(chain(Family::Ip, "docker", Hook::Forward, Policy::Drop)),
            Some(DropChain {
                family: "ip",
                table: "docker".into(),
                chain: "FORWARD".into(),
                priority: -5
            })
        );
        assert!(found(chain(Family::Inet, "nodelb", Hook::Forward, Policy::Drop)).is_some());
        assert_eq!(
            found(chain(Family::Ip6, "nodelb", Hook::Forward, Policy::Drop)),
            None
        );
        assert_eq!(
            found(chain(Family::Ip, "fw", Hook::Input, Policy::Drop)),
            None
        );
        assert_eq!(
            found(chain(Family::Ip, "fw", Hook::Forward, Policy::Accept)),
            None
        );
    }

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
