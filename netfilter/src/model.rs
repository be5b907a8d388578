//! Plain data describing an nftables table: what nodelb wants the kernel to hold.
//!
//! The model is deliberately closed: every expression here has one encoding (see `encode`) and
//! one text form (see `render`), and the differential tests prove the two agree with `nft`.

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::sync::Arc;
use std::time::Duration;

pub use crate::scalar::{Family, L4Proto, Value};
pub use crate::values::Values;

/// Which table: its family and name.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct TableRef {
    pub family: Family,
    pub name: String,
}

impl TableRef {
    pub fn of(t: &Table) -> TableRef {
        TableRef {
            family: t.family,
            name: t.name.clone(),
        }
    }
}

impl std::fmt::Display for TableRef {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} {}", self.family, self.name)
    }
}

/// A whole table. Chains, sets and counters are keyed by name, so two models diff cheaply.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Table {
    pub family: Family,
    pub name: String,
    pub chains: BTreeMap<String, Chain>,
    pub sets: BTreeMap<String, Set>,
    /// Named counter objects (`counter <name> { ... }`).
    pub counters: BTreeMap<String, Counter>,
}

impl Table {
    pub fn new(family: Family, name: impl Into<String>) -> Table {
        Table {
            family,
            name: name.into(),
            chains: BTreeMap::new(),
            sets: BTreeMap::new(),
            counters: BTreeMap::new(),
        }
    }

    pub fn add_counter(&mut self, counter: Counter) -> &mut Counter {
        let name = counter.name.clone();
        self.counters.insert(name.clone(), counter);
        self.counters.get_mut(&name).expect("just inserted")
    }

    /// Start each counter that `values` names from those values (packets, bytes): what the
    /// kernel counted before a full replace, which would otherwise reset them.
    pub fn seed_counters(&mut self, values: &BTreeMap<String, (u64, u64)>) {
        for (name, c) in &mut self.counters {
            if let Some(&(packets, bytes)) = values.get(name) {
                c.packets = packets;
                c.bytes = bytes;
            }
        }
    }

    pub fn add_chain(&mut self, chain: Chain) -> &mut Chain {
        let name = chain.name.clone();
        self.chains.insert(name.clone(), chain);
        self.chains.get_mut(&name).expect("just inserted")
    }

    pub fn add_set(&mut self, set: Set) -> &mut Set {
        let name = set.name.clone();
        self.sets.insert(name.clone(), set);
        self.sets.get_mut(&name).expect("just inserted")
    }

    pub fn chain_mut(&mut self, name: &str) -> Option<&mut Chain> {
        self.chains.get_mut(name)
    }

    pub fn set_mut(&mut self, name: &str) -> Option<&mut Set> {
        self.sets.get_mut(name)
    }

    /// Number of objects the table holds: table, chains, rules, sets, elements and counters.
    pub fn object_count(&self) -> usize {
        1 + self.counters.len()
            + self
                .chains
                .values()
                .map(|c| 1 + c.rules.len())
                .sum::<usize>()
            + self
                .sets
                .values()
                .map(|s| 1 + s.elements.len())
                .sum::<usize>()
    }
}

/// A named counter object. Rules count into it by name (`counter name "x"`) or through a map
/// whose data are counters (`counter name <keys> map @m`).
///
/// Equality is identity: name and comment. `packets` and `bytes` are only the values the
/// kernel starts the counter from when it is created (carried over a full replace); they are
/// not something the model wants the kernel to hold, so they never make two models differ,
/// and a diff or an edit never deletes and re-creates a counter (which would reset it).
#[derive(Clone, Debug)]
pub struct Counter {
    pub name: String,
    pub comment: Option<String>,
    pub packets: u64,
    pub bytes: u64,
}

impl Counter {
    pub fn new(name: impl Into<String>) -> Counter {
        Counter {
            name: name.into(),
            comment: None,
            packets: 0,
            bytes: 0,
        }
    }

    pub fn with_comment(mut self, comment: impl Into<String>) -> Counter {
        self.comment = Some(comment.into());
        self
    }
}

impl PartialEq for Counter {
    fn eq(&self, other: &Counter) -> bool {
        self.name == other.name && self.comment == other.comment
    }
}

impl Eq for Counter {}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ChainType {
    Filter,
    Nat,
    Route,
}

impl ChainType {
    pub fn keyword(self) -> &'static str {
        match self {
            ChainType::Filter => "filter",
            ChainType::Nat => "nat",
            ChainType::Route => "route",
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Hook {
    Prerouting,
    Input,
    Forward,
    Output,
    Postrouting,
}

impl Hook {
    pub fn keyword(self) -> &'static str {
        match self {
            Hook::Prerouting => "prerouting",
            Hook::Input => "input",
            Hook::Forward => "forward",
            Hook::Output => "output",
            Hook::Postrouting => "postrouting",
        }
    }

    /// The hook of an NF_INET_* number.
    pub fn from_number(n: u32) -> Option<Hook> {
        [
            Hook::Prerouting,
            Hook::Input,
            Hook::Forward,
            Hook::Output,
            Hook::Postrouting,
        ]
        .into_iter()
        .find(|h| h.number() == n)
    }

    /// NF_INET_* hook number.
    pub fn number(self) -> u32 {
        match self {
            Hook::Prerouting => 0,
            Hook::Input => 1,
            Hook::Forward => 2,
            Hook::Output => 3,
            Hook::Postrouting => 4,
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Policy {
    Accept,
    Drop,
}

/// What makes a chain a base chain.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BaseChain {
    pub chain_type: ChainType,
    pub hook: Hook,
    pub priority: i32,
    pub policy: Policy,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Chain {
    pub name: String,
    pub base: Option<BaseChain>,
    pub rules: Vec<Rule>,
}

impl Chain {
    pub fn regular(name: impl Into<String>) -> Chain {
        Chain {
            name: name.into(),
            base: None,
            rules: Vec::new(),
        }
    }

    pub fn base(
        name: impl Into<String>,
        chain_type: ChainType,
        hook: Hook,
        priority: i32,
        policy: Policy,
    ) -> Chain {
        Chain {
            name: name.into(),
            base: Some(BaseChain {
                chain_type,
                hook,
                priority,
                policy,
            }),
            rules: Vec::new(),
        }
    }

    pub fn rule(mut self, rule: Rule) -> Chain {
        self.rules.push(rule);
        self
    }

    pub fn push(&mut self, rule: Rule) {
        self.rules.push(rule);
    }
}

/// A rule: statements evaluated left to right, and an optional comment `nft list` shows.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Rule {
    pub stmts: Vec<Stmt>,
    pub comment: Option<String>,
}

impl Rule {
    pub fn new(stmts: Vec<Stmt>) -> Rule {
        Rule {
            stmts,
            comment: None,
        }
    }

    pub fn with_comment(mut self, comment: impl Into<String>) -> Rule {
        self.comment = Some(comment.into());
        self
    }
}

/// Fields loaded from packet headers.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Payload {
    IpSaddr,
    IpDaddr,
    IpProtocol,
    Ip6Saddr,
    Ip6Daddr,
    Ip6Nexthdr,
    TcpSport,
    TcpDport,
    UdpSport,
    UdpDport,
    SctpSport,
    SctpDport,
    /// Transport header source port, without a protocol dependency.
    ThSport,
    ThDport,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum MetaKey {
    Mark,
    L4Proto,
    NfProto,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum CtKey {
    State,
    Status,
    Mark,
    /// `ct original ip daddr` / `ct original ip6 daddr`, following the table's family.
    OriginalDaddr,
    /// `ct original proto-dst`; the rule must match the l4 protocol before it.
    OriginalProtoDst,
}

/// Something that loads a value into a register.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Expr {
    Payload(Payload),
    Meta(MetaKey),
    Ct(CtKey),
    /// `numgen random mod N offset O`: one of O..O+N. With N 1 it is always O: a constant
    /// that nft can print inside a concatenated key, where a literal cannot be.
    Numgen {
        modulus: u32,
        offset: u32,
    },
}

impl Expr {
    /// `numgen random mod N`: one of 0..N.
    pub const fn random(modulus: u32) -> Expr {
        Expr::Numgen { modulus, offset: 0 }
    }

    /// `numgen random mod 1 offset V`: always V.
    pub const fn constant(value: u32) -> Expr {
        Expr::Numgen {
            modulus: 1,
            offset: value,
        }
    }
}

/// `ct state` bits.
pub mod ct_state {
    pub const INVALID: u32 = 1;
    pub const ESTABLISHED: u32 = 2;
    pub const RELATED: u32 = 4;
    pub const NEW: u32 = 8;
    pub const UNTRACKED: u32 = 64;
}

/// `ct status` bits (IPS_*).
pub mod ct_status {
    pub const EXPECTED: u32 = 1;
    pub const SEEN_REPLY: u32 = 2;
    pub const ASSURED: u32 = 4;
    pub const CONFIRMED: u32 = 8;
    pub const SNAT: u32 = 16;
    pub const DNAT: u32 = 32;
}

#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Verdict {
    Accept,
    Drop,
    Return,
    Jump(String),
    Goto(String),
}

impl Verdict {
    pub fn target(&self) -> Option<&str> {
        match self {
            Verdict::Jump(c) | Verdict::Goto(c) => Some(c),
            _ => None,
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CmpOp {
    Eq,
    Neq,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NatKind {
    Snat,
    Dnat,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Reject {
    /// ICMP port unreachable (IPv4: type 3 code 3; IPv6: type 1 code 4).
    PortUnreachable,
    TcpReset,
}

/// An anonymous verdict map written inline in a rule: `... vmap { 0 : jump a, 1 : goto b }`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AnonVmap {
    pub elements: Vec<(Vec<Value>, Verdict)>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Stmt {
    /// `left == right` / `left != right`.
    Cmp {
        left: Expr,
        op: CmpOp,
        right: Value,
    },
    /// `left & mask == value` (32-bit keys: marks).
    Masked {
        left: Expr,
        mask: u32,
        value: u32,
    },
    /// Any of the bits set: `ct state established,related`.
    AnyBits {
        left: Expr,
        bits: u32,
    },
    /// `keys @set` / `keys != @set`.
    Lookup {
        keys: Vec<Expr>,
        set: String,
        negate: bool,
    },
    /// `keys vmap @map`.
    Vmap {
        keys: Vec<Expr>,
        map: String,
    },
    /// `keys vmap { ... }`.
    AnonVmap {
        keys: Vec<Expr>,
        map: AnonVmap,
    },
    /// `counter`, optionally seeded with carried-over values.
    Counter {
        packets: u64,
        bytes: u64,
    },
    /// `counter name "x"`: count into the named counter object.
    CounterRef(String),
    /// `counter name keys map @map`: count into the counter the map gives for the keys (no
    /// match: the rule stops here, like a failed lookup).
    CounterMap {
        keys: Vec<Expr>,
        map: String,
    },
    /// `update @set { keys timeout T }`: add the packet's keys to a dynamic set, or restart
    /// their timeout when they are there (a full set: the rule stops here).
    SetUpdate {
        keys: Vec<Expr>,
        set: String,
        /// The timeout of the element added or refreshed; `None`: the set's own.
        timeout: Option<Duration>,
    },
    /// `dnat to addr[:port]` / `snat to addr[:port]`.
    Nat {
        kind: NatKind,
        addr: IpAddr,
        port: Option<u16>,
    },
    /// `dnat ip to keys map @map`, where the map's data is `address . port`.
    NatMap {
        kind: NatKind,
        keys: Vec<Expr>,
        map: String,
    },
    /// `masquerade`, or with `fully_random` `masquerade fully-random`: the source port is
    /// picked at random for every connection (`NF_NAT_RANGE_PROTO_RANDOM_FULLY`), not kept
    /// when free, so many flows from one client port (high-rate UDP) do not collide on the
    /// same translated tuple.
    Masquerade {
        fully_random: bool,
    },
    Reject(Reject),
    /// `meta mark set meta mark | bits`.
    MarkOr(u32),
    Verdict(Verdict),
}

impl Stmt {
    pub fn cmp(left: Expr, right: Value) -> Stmt {
        Stmt::Cmp {
            left,
            op: CmpOp::Eq,
            right,
        }
    }

    pub fn counter() -> Stmt {
        Stmt::Counter {
            packets: 0,
            bytes: 0,
        }
    }

    /// Chains this statement can send a packet to.
    pub fn chain_targets(&self) -> Vec<&str> {
        match self {
            Stmt::Verdict(v) => v.target().into_iter().collect(),
            Stmt::AnonVmap { map, .. } => map
                .elements
                .iter()
                .filter_map(|(_, v)| v.target())
                .collect(),
            _ => Vec::new(),
        }
    }

    /// Named sets this statement refers to.
    pub fn set_refs(&self) -> Option<&str> {
        match self {
            Stmt::Lookup { set, .. } | Stmt::SetUpdate { set, .. } => Some(set),
            Stmt::Vmap { map, .. } | Stmt::NatMap { map, .. } | Stmt::CounterMap { map, .. } => {
                Some(map)
            }
            _ => None,
        }
    }

    /// The counter object this statement names.
    pub fn counter_ref(&self) -> Option<&str> {
        match self {
            Stmt::CounterRef(name) => Some(name),
            _ => None,
        }
    }
}

/// Named data types for `type a . b . c` declarations.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum DataType {
    Ipv4Addr,
    Ipv6Addr,
    InetProto,
    InetService,
    Mark,
}

/// How a set's key or a map's data is declared.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SetType {
    /// `type ipv4_addr . inet_proto . inet_service`.
    Type(Vec<DataType>),
    /// `typeof ip daddr . meta l4proto . th dport`.
    Typeof(Vec<Expr>),
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum MapData {
    Verdict,
    Value(SetType),
    /// `: counter`: each element names a counter object.
    Counter,
}

/// A key or data item of a set element.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Key {
    /// One value per concatenated field.
    Values(Values),
    /// A CIDR in an interval set (single-field keys only).
    Prefix(IpAddr, u8),
}

#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum ElemData {
    Verdict(Verdict),
    Values(Values),
    /// The name of a counter object, in a `: counter` map.
    Counter(String),
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Element {
    pub data: Option<ElemData>,
    /// Shared: the elements one Service port owns across sets all carry its comment, and
    /// there are tens of thousands of them.
    pub comment: Option<Arc<str>>,
}

/// A named set or map.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Set {
    pub name: String,
    pub key: SetType,
    pub data: Option<MapData>,
    pub interval: bool,
    /// Filled by packets (`flags dynamic,timeout`, with this default timeout): rules add and
    /// refresh elements ([`Stmt::SetUpdate`]) and the kernel expires them. The model holds
    /// none of them; they are what the kernel learned (see `Table::dynamic_sets`).
    pub timeout: Option<Duration>,
    /// The most elements the set holds (`size`); `None`: none declared (a set a rule fills
    /// then holds 65,535).
    pub size: Option<u32>,
    pub comment: Option<String>,
    pub elements: BTreeMap<Key, Element>,
}

impl Set {
    pub fn new(name: impl Into<String>, key: SetType) -> Set {
        Set {
            name: name.into(),
            key,
            data: None,
            interval: false,
            timeout: None,
            size: None,
            comment: None,
            elements: BTreeMap::new(),
        }
    }

    pub fn map(name: impl Into<String>, key: SetType, data: MapData) -> Set {
        Set {
            data: Some(data),
            ..Set::new(name, key)
        }
    }

    pub fn interval(mut self) -> Set {
        self.interval = true;
        self
    }

    /// A set filled by packets, whose elements expire `timeout` after they were last added or
    /// refreshed.
    pub fn dynamic(mut self, timeout: Duration) -> Set {
        self.timeout = Some(timeout);
        self
    }

    /// Declare the most elements the set holds.
    pub fn with_size(mut self, size: u32) -> Set {
        self.size = Some(size);
        self
    }

    /// Whether packets fill this set (its elements are the kernel's, not the model's).
    pub fn is_dynamic(&self) -> bool {
        self.timeout.is_some()
    }

    pub fn with_comment(mut self, comment: impl Into<String>) -> Set {
        self.comment = Some(comment.into());
        self
    }

    pub fn insert(&mut self, key: Key, data: Option<ElemData>, comment: Option<Arc<str>>) {
        self.elements.insert(key, Element { data, comment });
    }

    /// Same declaration (everything but the elements).
    pub fn same_decl(&self, other: &Set) -> bool {
        self.name == other.name
            && self.key == other.key
            && self.data == other.data
            && self.interval == other.interval
            && self.timeout == other.timeout
            && self.size == other.size
            && self.comment == other.comment
    }
}

/// One element of a map as the kernel holds it: key and data bytes (`Nft::read_map`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RawElement {
    pub key: Vec<u8>,
    pub data: Vec<u8>,
}

/// One element a dynamic set learned from packets: its key as the kernel holds it, and how
/// long it has left before it expires.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Learned {
    pub key: Vec<u8>,
    pub expires: Duration,
}

/// Dynamic set name → its elements, as `Nft::read_learned` returns them.
pub type LearnedElements = BTreeMap<String, Vec<Learned>>;

/// How many elements the kernel holds for a set of the model: an interval is a start and,
/// unless it runs to the top of the address space, an end.
pub fn expected_element_count(s: &Set) -> usize {
    s.elements
        .keys()
        .map(|k| match k {
            Key::Prefix(a, l) => 1 + usize::from(prefix_bounds(*a, *l).1.is_some()),
            Key::Values(_) => 1,
        })
        .sum()
}

pub fn prefix_bounds(addr: std::net::IpAddr, len: u8) -> (Vec<u8>, Option<Vec<u8>>) {
    match addr {
        std::net::IpAddr::V4(a) => {
            let bits = u32::from(a);
            let host = 32 - u32::from(len.min(32));
            let mask = if host == 32 { 0 } else { u32::MAX << host };
            let start = bits & mask;
            let end = (start as u64) + (1u64 << host);
            let end = (end <= u32::MAX as u64).then(|| (end as u32).to_be_bytes().to_vec());
            (start.to_be_bytes().to_vec(), end)
        }
        std::net::IpAddr::V6(a) => {
            let bits = u128::from(a);
            let host = 128 - u32::from(len.min(128));
            let mask = if host == 128 { 0 } else { u128::MAX << host };
            let start = bits & mask;
            let end = if host == 128 {
                None
            } else {
                start.checked_add(1u128 << host)
            };
            (
                start.to_be_bytes().to_vec(),
                end.map(|e| e.to_be_bytes().to_vec()),
            )
        }
    }
}
