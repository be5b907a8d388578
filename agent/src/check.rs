//! `check`: can this node run nodelb? Kernel, privileges, nf_tables and the expressions nodelb
//! uses (proved by committing a throwaway table `nodelb-check` and deleting it), ctnetlink (for
//! conntrack cleanup), forwarding per family, and other tables' forward policies. Each finding
//! says what to fix.

use crate::host::forward_policy;
use crate::host::privileges;
use crate::host::sysctl::{forwarding_name, Forwarding, Sysctls};
use nodelb_core::plan::config::DEFAULT_TABLE_NAME;
use nodelb_core::vocab::IpFamily;
use nodelb_netfilter::*;
use std::fmt;
use std::net::IpAddr;

/// The throwaway table `check` commits and deletes; nodelb's own name.
pub const CHECK_TABLE: &str = "nodelb-check";

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Status {
    Ok,
    /// Works, but something may get in the way.
    Warn,
    /// nodelb cannot work as asked until this is fixed.
    Fail,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Finding {
    pub status: Status,
    pub what: String,
    pub detail: String,
    pub fix: Option<String>,
}

impl Finding {
    fn ok(what: impl Into<String>, detail: impl Into<String>) -> Finding {
        Finding {
            status: Status::Ok,
            what: what.into(),
            detail: detail.into(),
            fix: None,
        }
    }
    fn bad(
        status: Status,
        what: impl Into<String>,
        detail: impl Into<String>,
        fix: impl Into<String>,
    ) -> Finding {
        Finding {
            status,
            what: what.into(),
            detail: detail.into(),
            fix: Some(fix.into()),
        }
    }
}

impl fmt::Display for Finding {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let tag = match self.status {
            Status::Ok => "ok  ",
            Status::Warn => "WARN",
            Status::Fail => "FAIL",
        };
        write!(f, "{tag} {}: {}", self.what, self.detail)?;
        if let Some(fix) = &self.fix {
            write!(f, "\n     fix: {fix}")?;
        }
        Ok(())
    }
}

/// Every check, in order. `v4`/`v6` are the families the agent will be asked to program.
pub fn run(v4: bool, v6: bool, sysctls: &Sysctls) -> Vec<Finding> {
    let mut out = Vec::new();
    out.push(kernel());
    out.push(match privileges::has_net_admin() {
        Some(true) => Finding::ok("privileges", "CAP_NET_ADMIN is effective"),
        Some(false) => Finding::bad(
            Status::Fail,
            "privileges",
            "CAP_NET_ADMIN is not in the effective set",
            "run as root, or give the container NET_ADMIN (manifests/ has a NET_ADMIN-only DaemonSet)",
        ),
        None => Finding::bad(Status::Warn, "privileges", "cannot read /proc/self/status", "none; the checks below tell"),
    });
    let families: Vec<IpFamily> = [(v4, IpFamily::V4), (v6, IpFamily::V6)]
        .into_iter()
        .filter_map(|(on, f)| on.then_some(f))
        .collect();
    if families.is_empty() {
        out.push(Finding::bad(
            Status::Fail,
            "families",
            "both --ipv4 and --ipv6 are off",
            "enable at least one family",
        ));
    }
    match Nft::open().and_then(|mut n| n.list_tables(None).map(|t| (n, t))) {
        Err(e) => out.push(Finding::bad(
            Status::Fail,
            "nf_tables",
            crate::error_chain(&e),
            "a kernel with nf_tables (`modprobe nf_tables`), and CAP_NET_ADMIN",
        )),
        Ok((mut nft, tables)) => {
            out.push(Finding::ok(
                "nf_tables",
                format!("usable; {} tables present", tables.len()),
            ));
            for f in &families {
                out.push(features(&mut nft, *f));
            }
        }
    }
    out.push(conntrack());
    for f in &families {
        out.push(forwarding(sysctls, *f));
    }
    match forward_policy::drop_chains(DEFAULT_TABLE_NAME) {
        Ok(chains) if chains.is_empty() => out.push(Finding::ok(
            "foreign forward policies",
            "no other table drops forwarded traffic by policy",
        )),
        Ok(chains) => {
            for c in chains {
                out.push(Finding::bad(
                    Status::Warn,
                    "foreign forward policy",
                    format!("{c}: traffic nodelb forwards to endpoints on other hosts is dropped unless that chain accepts it (nodelb never changes other tables)"),
                    format!("accept forwarded traffic to your pod network in that chain, e.g. `nft insert rule {} {} {} ct status dnat accept`", c.family, c.table, c.chain),
                ));
            }
        }
        Err(e) => out.push(Finding::bad(
            Status::Warn,
            "foreign forward policies",
            crate::error_chain(&e),
            "none needed for nodelb itself; inspect `nft list ruleset` by hand",
        )),
    }
    out.push(Finding::ok(
        "iptables-legacy",
        "not inspected: legacy x_tables FORWARD policies are invisible to nftables; check `iptables-legacy -S FORWARD`",
    ));
    out
}

fn kernel() -> Finding {
    match privileges::kernel_release() {
        Some((release, v)) if v >= (5, 10) => Finding::ok("kernel", format!("Linux {release}")),
        Some((release, _)) => Finding::bad(
            Status::Fail,
            "kernel",
            format!("Linux {release} is older than 5.10"),
            "a kernel ≥ 5.10",
        ),
        None => Finding::bad(
            Status::Warn,
            "kernel",
            "cannot read the kernel release",
            "make sure the kernel is ≥ 5.10",
        ),
    }
}

/// ctnetlink, through which the agent deletes stale UDP and SCTP entries: a dump of the UDP
/// entries proves it (read only).
fn conntrack() -> Finding {
    let dumped = nodelb_netfilter::conntrack::Conntrack::open()
        .and_then(|mut ct| ct.dump(Family::Ip, L4Proto::Udp));
    match dumped {
        Ok(entries) => Finding::ok(
            "conntrack",
            format!("ctnetlink usable; {} UDP entries", entries.len()),
        ),
        Err(e) => Finding::bad(
            Status::Warn,
            "conntrack",
            format!(
                "{}: UDP and SCTP clients that keep their source port stay on an endpoint that left until they go quiet",
                crate::error_chain(&e)
            ),
            "a kernel with ctnetlink (`modprobe nf_conntrack_netlink`), and CAP_NET_ADMIN",
        ),
    }
}

fn forwarding(sysctls: &Sysctls, f: IpFamily) -> Finding {
    let what = format!("{f} forwarding");
    match sysctls.forwarding(f) {
        Ok(Forwarding::Forwarding) => Finding::ok(what, format!("{} is on", forwarding_name(f))),
        Ok(Forwarding::Off { fix }) => Finding::bad(
            Status::Fail,
            what,
            format!("{} is 0: {f} will not be programmed", forwarding_name(f)),
            format!("`{fix}`, or run the agent with --set-sysctls"),
        ),
        Ok(Forwarding::Absent) => Finding::bad(
            Status::Fail,
            what,
            format!(
                "{} does not exist: {f} is absent on this host",
                forwarding_name(f)
            ),
            match f {
                IpFamily::V4 => "a host with IPv4".to_string(),
                IpFamily::V6 => "run with --ipv6=false, or enable IPv6 in the kernel".to_string(),
            },
        ),
        Err(e) => Finding::bad(
            Status::Fail,
            what,
            crate::error_chain(&e),
            "make /proc/sys readable",
        ),
    }
}

/// A table using every kernel feature nodelb's tables need: nat hooks, a `numgen` key in a
/// named dnat map, `ct status` and `ct original` matches, masquerade, and both rejects.
/// Addresses are documentation ones, so nothing real matches in the moment it exists.
pub fn feature_table(f: IpFamily) -> Table {
    let (daddr, addr): (Expr, IpAddr) = match f {
        IpFamily::V4 => (
            Expr::Payload(Payload::IpDaddr),
            "192.0.2.1".parse().expect("address"),
        ),
        IpFamily::V6 => (
            Expr::Payload(Payload::Ip6Daddr),
            "2001:db8::1".parse().expect("address"),
        ),
    };
    let mut t = Table::new(f.netfilter(), CHECK_TABLE);
    add_endpoints(&mut t, daddr, addr);
    add_base_chains(&mut t, daddr, addr);
    t
}

/// A numgen-keyed DNAT map and the regular chain that uses it.
fn add_endpoints(t: &mut Table, addr_ty: Expr, addr: IpAddr) {
    let l4 = Expr::Meta(MetaKey::L4Proto);
    let dport = Expr::Payload(Payload::ThDport);
    let mut map = Set::map(
        "endpoints",
        SetType::Typeof(vec![l4, dport, Expr::random(1)]),
        MapData::Value(SetType::Typeof(vec![addr_ty, dport])),
    );
    map.insert(
        Key::Values(vec![Value::Proto(L4Proto::Tcp), Value::Port(9), Value::U32(0)].into()),
        Some(ElemData::Values(
            vec![Value::from(addr), Value::Port(9)].into(),
        )),
        Some("nodelb check".into()),
    );
    t.add_set(map);
    t.add_chain(
        Chain::regular("endpoints-1").rule(Rule::new(vec![Stmt::NatMap {
            kind: NatKind::Dnat,
            keys: vec![l4, dport, Expr::random(1)],
            map: "endpoints".into(),
        }])),
    );
}

/// The base chains nodelb uses: DNAT, masquerade, and rejects in `input`.
fn add_base_chains(t: &mut Table, daddr: Expr, addr: IpAddr) {
    let l4 = Expr::Meta(MetaKey::L4Proto);
    let dport = Expr::Payload(Payload::ThDport);
    let matches = || {
        vec![
            Stmt::cmp(daddr, Value::from(addr)),
            Stmt::cmp(l4, Value::Proto(L4Proto::Tcp)),
            Stmt::cmp(dport, Value::Port(9)),
        ]
    };
    let mut pre = matches();
    pre.push(Stmt::Verdict(Verdict::Goto("endpoints-1".into())));
    t.add_chain(
        Chain::base(
            "prerouting",
            ChainType::Nat,
            Hook::Prerouting,
            -100,
            Policy::Accept,
        )
        .rule(Rule::new(pre)),
    );
    t.add_chain(
        Chain::base(
            "postrouting",
            ChainType::Nat,
            Hook::Postrouting,
            100,
            Policy::Accept,
        )
        .rule(Rule::new(vec![
            Stmt::cmp(l4, Value::Proto(L4Proto::Tcp)),
            Stmt::AnyBits {
                left: Expr::Ct(CtKey::Status),
                bits: ct_status::DNAT,
            },
            Stmt::cmp(Expr::Ct(CtKey::OriginalDaddr), Value::from(addr)),
            Stmt::Masquerade { fully_random: true },
        ])),
    );
    let mut tcp_reject = matches();
    tcp_reject.push(Stmt::Reject(Reject::TcpReset));
    let unreachable = vec![
        Stmt::cmp(daddr, Value::from(addr)),
        Stmt::cmp(l4, Value::Proto(L4Proto::Udp)),
        Stmt::cmp(dport, Value::Port(9)),
        Stmt::Reject(Reject::PortUnreachable),
    ];
    t.add_chain(
        Chain::base("input", ChainType::Filter, Hook::Input, 0, Policy::Accept)
            .rule(Rule::new(tcp_reject))
            .rule(Rule::new(unreachable)),
    );
}

fn features(nft: &mut Nft, f: IpFamily) -> Finding {
    let t = feature_table(f);
    let tr = TableRef::of(&t);
    let what = format!("{f} nat/numgen/ct/masquerade/reject");
    let added = nft.apply(&full_replace(&t));
    // Delete whether or not the add went through: `delete_table` never fails on absence.
    let deleted = nft.apply(&nodelb_netfilter::ops::delete_table(&tr));
    match (added, deleted) {
        (Ok(_), Ok(_)) => Finding::ok(what, format!("committed and deleted table {tr}")),
        (Err(e), _) => Finding::bad(
            Status::Fail,
            what,
            crate::error_chain(&e),
            "a kernel ≥ 5.10 with nf_tables NAT, numgen, ct, masquerade and reject \
             (CONFIG_NFT_NAT, CONFIG_NFT_NUMGEN, CONFIG_NFT_CT, CONFIG_NFT_MASQ, CONFIG_NFT_REJECT); \
             `modprobe nft_nat nft_numgen nft_ct nft_masq nft_reject_inet` where they are modules",
        ),
        (Ok(_), Err(e)) => Finding::bad(
            Status::Fail,
            what,
            format!("committed, but deleting it failed: {}", crate::error_chain(&e)),
            format!("`nft delete table {} {CHECK_TABLE}`", f.netfilter()),
        ),
    }
}

/// Exit status for a set of findings: 1 when any failed.
pub fn exit_code(findings: &[Finding]) -> i32 {
    if findings.iter().any(|f| f.status == Status::Fail) {
        1
    } else {
        0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The throwaway table commits in a fresh network namespace (root only), is gone after the
    /// check, and the check of a clean namespace reports no failure except forwarding, which
    /// decides the exit status. The namespace sets its own forwarding first: a new namespace
    /// copies the host's IPv4 setting.
    #[test]
    fn feature_table_commits_and_is_deleted() {
        if !nix::unistd::geteuid().is_root() {
            if std::env::var("CI").as_deref() == Ok("true") {
                panic!("feature_table_commits_and_is_deleted: needs root; CI=true makes this a failure");
            }
            eprintln!("SKIP feature_table_commits_and_is_deleted: needs root");
            return;
        }
        std::thread::spawn(|| {
            nix::sched::unshare(nix::sched::CloneFlags::CLONE_NEWNET).expect("unshare");
            let mut nft = Nft::open().unwrap();
            for f in [IpFamily::V4, IpFamily::V6] {
                let r = features(&mut nft, f);
                assert_eq!(r.status, Status::Ok, "{r}");
            }
            assert!(nft.list_tables(None).unwrap().is_empty());
            let forward = |on: &str| {
                for name in ["ipv4/ip_forward", "ipv6/conf/all/forwarding"] {
                    std::fs::write(format!("/proc/sys/net/{name}"), on).expect(name);
                }
            };
            forward("0");
            let findings = run(true, true, &Sysctls::default());
            for f in &findings {
                let forwarding = f.what.ends_with("forwarding");
                assert_eq!(f.status == Status::Fail, forwarding, "{f}");
            }
            assert_eq!(exit_code(&findings), 1);
            forward("1");
            let findings = run(true, true, &Sysctls::default());
            assert_eq!(exit_code(&findings), 0, "{findings:?}");
        })
        .join()
        .unwrap();
    }

    #[test]
    fn findings_print_with_their_fix() {
        let f = Finding::bad(
            Status::Fail,
            "IPv4 forwarding",
            "off",
            "`sysctl -w net.ipv4.ip_forward=1`",
        );
        assert_eq!(
            f.to_string(),
            "FAIL IPv4 forwarding: off\n     fix: `sysctl -w net.ipv4.ip_forward=1`"
        );
        assert_eq!(exit_code(&[Finding::ok("a", "b")]), 0);
    }
}
