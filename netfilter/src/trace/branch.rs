//! One way a packet is going, part way through the tables: the packet as it is now, what
//! conntrack holds for its connection, and what it has done so far.

use super::outcome::{Chance, Fate, Learned, Outcome, RuleRef, Snat};
use super::packet::{CtState, Packet};
use crate::model::{ct_status, Family, Hook, L4Proto};
use std::collections::BTreeSet;
use std::net::{IpAddr, SocketAddr};

/// Which half of a connection's NAT a hook decides: the destination in `prerouting` and
/// `output`, the source in `input` and `postrouting`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Manip {
    Dst,
    Src,
}

impl Manip {
    /// The half `hook` decides, where the kernel has NAT (not in `forward`).
    pub(super) fn of(hook: Hook) -> Option<Manip> {
        match hook {
            Hook::Prerouting | Hook::Output => Some(Manip::Dst),
            Hook::Input | Hook::Postrouting => Some(Manip::Src),
            Hook::Forward => None,
        }
    }

    /// Where in its hook the kernel's NAT runs every nat chain (`NF_IP_PRI_NAT_DST` and
    /// `NF_IP_PRI_NAT_SRC`), whatever their own priorities, which only order them.
    pub(super) fn priority(self) -> i32 {
        match self {
            Manip::Dst => -100,
            Manip::Src => 100,
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) struct Branch {
    // The packet as it is now.
    pub src: IpAddr,
    pub dst: IpAddr,
    pub sport: u16,
    pub dport: u16,
    pub proto: L4Proto,
    pub mark: u32,
    // Its connection.
    pub state: CtState,
    pub status: u32,
    pub ct_mark: u32,
    pub orig_dst: IpAddr,
    pub orig_dport: u16,
    pub dnat: Option<SocketAddr>,
    pub snat: Option<Snat>,
    /// The connection's destination NAT is decided (possibly as none).
    pub dst_bound: bool,
    pub src_bound: bool,
    // What it did.
    pub counters: BTreeSet<String>,
    pub learned: Vec<Learned>,
    pub hooks: Vec<Hook>,
    pub rules: Vec<RuleRef>,
    pub chance: Chance,
}

impl Branch {
    pub(super) fn new(p: &Packet) -> Branch {
        let known = p.state != CtState::New;
        Branch {
            src: p.src,
            dst: p.dst,
            sport: p.sport,
            dport: p.dport,
            proto: p.proto,
            mark: p.mark,
            state: p.state,
            status: p.ct_status(),
            ct_mark: p.ct_mark,
            orig_dst: p.dst,
            orig_dport: p.dport,
            dnat: p.dnatted_to,
            snat: None,
            dst_bound: known,
            src_bound: known,
            counters: BTreeSet::new(),
            learned: Vec::new(),
            hooks: Vec::new(),
            rules: Vec::new(),
            chance: Chance::CERTAIN,
        }
    }

    pub(super) fn family(&self) -> Family {
        match self.src {
            IpAddr::V4(_) => Family::Ip,
            IpAddr::V6(_) => Family::Ip6,
        }
    }

    pub(super) fn bound(&self, m: Manip) -> bool {
        match m {
            Manip::Dst => self.dst_bound,
            Manip::Src => self.src_bound,
        }
    }

    /// A DNAT statement: the connection's destination becomes `to`.
    pub(super) fn set_dnat(&mut self, to: SocketAddr) {
        self.dnat = Some(to);
        self.status |= ct_status::DNAT;
        self.dst_bound = true;
    }

    /// An SNAT or masquerade statement.
    pub(super) fn set_snat(&mut self, snat: Snat) {
        self.snat = Some(snat);
        self.status |= ct_status::SNAT;
        self.src_bound = true;
    }

    /// The kernel's NAT at its place in a hook, once the nat chains (if they ran) are done:
    /// the half is decided from now on (none, if no chain decided it), and the packet is
    /// rewritten as the connection's NAT says. A masquerade's address is routing's choice,
    /// so a masqueraded source stays as it was.
    pub(super) fn nat_done(&mut self, m: Manip) {
        match m {
            Manip::Dst => {
                self.dst_bound = true;
                if let Some(to) = self.dnat {
                    self.dst = to.ip();
                    self.dport = to.port();
                }
            }
            Manip::Src => {
                self.src_bound = true;
                if let Some(Snat::To(addr, port)) = self.snat {
                    self.src = addr;
                    self.sport = port.unwrap_or(self.sport);
                }
            }
        }
    }

    /// Conntrack confirms a new connection as its first packet leaves `postrouting` (or
    /// `input`): a packet looped back to this host sees it confirmed.
    pub(super) fn confirm(&mut self) {
        self.status |= ct_status::CONFIRMED;
    }

    /// Whether `other` is this branch by another path of draws.
    pub(super) fn same_but_chance(&self, other: &Branch) -> bool {
        let mut probe = other.clone();
        probe.chance = self.chance;
        probe == *self
    }

    pub(super) fn finish(self, fate: Fate) -> Outcome {
        Outcome {
            fate,
            dnat: self.dnat,
            snat: self.snat,
            counters: self.counters,
            learned: self.learned,
            hooks: self.hooks,
            rules: self.rules,
            chance: self.chance,
        }
    }
}
