//! One statement of one rule, on one branch: what its expressions load from the packet and
//! its connection, what it matches, what it changes, and where it sends the packet. A
//! `numgen` draw splits the branch, one way per value that leads somewhere else.

use super::branch::Branch;
use super::error::Problem;
use super::outcome::{Chance, Learned, Snat};
use crate::model::*;
use std::collections::{BTreeMap, BTreeSet};
use std::net::{IpAddr, SocketAddr};

/// Where the packet goes after a statement.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) enum Flow {
    /// On to the next statement (after the last: the rule is done, on to the next rule).
    Continue,
    /// The rule does not match: on to the next rule.
    Break,
    Verdict(Verdict),
    Reject(Reject),
}

/// What an expression loads.
enum Load {
    Value(Value),
    /// Not there for this packet (a `tcp dport` of a UDP packet): the rule does not match.
    Absent,
    /// `numgen random mod N offset O`: any of O..O+N, each as likely.
    Random {
        modulus: u32,
        offset: u32,
    },
}

/// The values a list of keys takes, one list per combination of `numgen` draws, each with
/// its chance.
type Draws = Vec<(Chance, Vec<Value>)>;

/// What a map's elements hold, as a statement wants it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Data {
    Verdict,
    Counter,
    Value,
}

/// A NAT statement, for where the kernel allows it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Nat {
    Dnat,
    Snat,
    Masquerade,
}

impl Nat {
    fn of(kind: NatKind) -> Nat {
        match kind {
            NatKind::Dnat => Nat::Dnat,
            NatKind::Snat => Nat::Snat,
        }
    }

    fn word(self) -> &'static str {
        match self {
            Nat::Dnat => "dnat",
            Nat::Snat => "snat",
            Nat::Masquerade => "masquerade",
        }
    }

    fn hooks(self) -> &'static [Hook] {
        match self {
            Nat::Dnat => &[Hook::Prerouting, Hook::Output],
            Nat::Snat => &[Hook::Postrouting, Hook::Input],
            Nat::Masquerade => &[Hook::Postrouting],
        }
    }
}

/// Dynamic sets' keys known before the trace, by table and set.
pub(super) type Known = BTreeMap<(TableRef, String), BTreeSet<Values>>;

/// The rule's surroundings: its table, and the base chain (hook and type) it runs under.
pub(super) struct Scope<'a> {
    pub table: &'a Table,
    pub table_ref: TableRef,
    pub hook: Hook,
    pub chain_type: ChainType,
    pub known: &'a Known,
}

/// What a value is, for checking that a comparison or a lookup compares like with like.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    Ipv4,
    Ipv6,
    Proto,
    Port,
    U32,
    NfProto,
}

fn kind(v: Value) -> Kind {
    match v {
        Value::Ipv4(_) => Kind::Ipv4,
        Value::Ipv6(_) => Kind::Ipv6,
        Value::Proto(_) => Kind::Proto,
        Value::Port(_) => Kind::Port,
        Value::U32(_) => Kind::U32,
        Value::NfProto(_) => Kind::NfProto,
    }
}

fn data_kind(d: DataType) -> Kind {
    match d {
        DataType::Ipv4Addr => Kind::Ipv4,
        DataType::Ipv6Addr => Kind::Ipv6,
        DataType::InetProto => Kind::Proto,
        DataType::InetService => Kind::Port,
        DataType::Mark => Kind::U32,
    }
}

/// What `e` loads in a table of `family`.
fn expr_kind(e: Expr, family: Family) -> Kind {
    use Payload::*;
    match e {
        Expr::Payload(IpSaddr | IpDaddr) => Kind::Ipv4,
        Expr::Payload(Ip6Saddr | Ip6Daddr) => Kind::Ipv6,
        Expr::Payload(IpProtocol | Ip6Nexthdr) | Expr::Meta(MetaKey::L4Proto) => Kind::Proto,
        Expr::Payload(_) | Expr::Ct(CtKey::OriginalProtoDst) => Kind::Port,
        Expr::Meta(MetaKey::NfProto) => Kind::NfProto,
        Expr::Ct(CtKey::OriginalDaddr) if family == Family::Ip6 => Kind::Ipv6,
        Expr::Ct(CtKey::OriginalDaddr) => Kind::Ipv4,
        Expr::Meta(MetaKey::Mark) | Expr::Ct(_) | Expr::Numgen { .. } => Kind::U32,
    }
}

fn type_kinds(t: &SetType, family: Family) -> Vec<Kind> {
    match t {
        SetType::Type(d) => d.iter().map(|d| data_kind(*d)).collect(),
        SetType::Typeof(e) => e.iter().map(|e| expr_kind(*e, family)).collect(),
    }
}

/// Whether `prefix/len` holds `v`.
fn in_prefix(prefix: IpAddr, len: u8, v: Value) -> bool {
    let bits = |a: u128, width: u32| match u32::from(len) {
        0 => 0,
        l if l >= width => a,
        l => a >> (width - l),
    };
    match (prefix, v) {
        (IpAddr::V4(p), Value::Ipv4(a)) => {
            bits(u32::from(p).into(), 32) == bits(u32::from(a).into(), 32)
        }
        (IpAddr::V6(p), Value::Ipv6(a)) => bits(p.into(), 128) == bits(a.into(), 128),
        _ => false,
    }
}

/// The element of `set` that holds `key`: the exact key, or in an interval set a prefix.
fn element<'s>(set: &'s Set, key: &[Value]) -> Option<&'s Element> {
    if let Some(e) = set.elements.get(&Key::Values(Values::new(key))) {
        return Some(e);
    }
    match key {
        [v] if set.interval => set.elements.iter().find_map(|(k, e)| match k {
            Key::Prefix(p, len) if in_prefix(*p, *len, *v) => Some(e),
            _ => None,
        }),
        _ => None,
    }
}

/// The packet's transport protocol has ports (the tracer knows no ICMP header).
fn ported(b: &Branch, what: &str) -> Result<(), Problem> {
    match b.proto {
        L4Proto::Tcp | L4Proto::Udp | L4Proto::Sctp => Ok(()),
        p => Err(Problem::Unsupported(format!(
            "{what} of an {} packet",
            p.keyword()
        ))),
    }
}

impl Scope<'_> {
    fn text(&self, e: Expr) -> String {
        e.text(self.table.family)
    }

    /// A load of the wrong family: absent in an `inet` table (the rule's `meta nfproto`
    /// fails), meaningless in a table of one family.
    fn other_family(&self, what: String) -> Result<Load, Problem> {
        match self.table.family {
            Family::Inet => Ok(Load::Absent),
            f => Err(Problem::Invalid(format!("{what} in an {f} table"))),
        }
    }

    fn load(&self, b: &Branch, e: Expr) -> Result<Load, Problem> {
        let v = match e {
            Expr::Payload(p) => return self.payload(b, p),
            Expr::Meta(MetaKey::Mark) => Value::U32(b.mark),
            Expr::Meta(MetaKey::L4Proto) => Value::Proto(b.proto),
            Expr::Meta(MetaKey::NfProto) => Value::NfProto(b.family()),
            Expr::Ct(CtKey::State) => Value::U32(b.state.bit()),
            Expr::Ct(CtKey::Status) => Value::U32(b.status),
            Expr::Ct(CtKey::Mark) => Value::U32(b.ct_mark),
            Expr::Ct(CtKey::OriginalDaddr) => {
                if kind(Value::from(b.orig_dst)) != expr_kind(e, self.table.family) {
                    return self.other_family(self.text(e));
                }
                Value::from(b.orig_dst)
            }
            Expr::Ct(CtKey::OriginalProtoDst) => {
                ported(b, &self.text(e))?;
                Value::Port(b.orig_dport)
            }
            Expr::Numgen { modulus: 0, .. } => {
                return Err(Problem::Invalid("numgen random mod 0".into()))
            }
            Expr::Numgen { modulus, offset } => return Ok(Load::Random { modulus, offset }),
        };
        Ok(Load::Value(v))
    }

    fn payload(&self, b: &Branch, p: Payload) -> Result<Load, Problem> {
        use Payload::*;
        let d = p.desc();
        if d.nf_dependency.is_some_and(|f| f != b.family()) {
            return self.other_family(d.text.to_string());
        }
        if d.l4_dependency.is_some_and(|l4| l4 != b.proto) {
            return Ok(Load::Absent);
        }
        let v = match p {
            IpSaddr | Ip6Saddr => Value::from(b.src),
            IpDaddr | Ip6Daddr => Value::from(b.dst),
            IpProtocol | Ip6Nexthdr => Value::Proto(b.proto),
            TcpSport | UdpSport | SctpSport | ThSport => {
                ported(b, d.text)?;
                Value::Port(b.sport)
            }
            TcpDport | UdpDport | SctpDport | ThDport => {
                ported(b, d.text)?;
                Value::Port(b.dport)
            }
        };
        Ok(Load::Value(v))
    }

    /// The values `keys` take for this packet, one list per combination of `numgen` draws
    /// with its chance; `None` when a key is absent.
    fn keys(&self, b: &Branch, keys: &[Expr]) -> Result<Option<Draws>, Problem> {
        let mut combos = vec![(Chance::CERTAIN, Vec::with_capacity(keys.len()))];
        for k in keys {
            let draws: Vec<(Chance, Value)> = match self.load(b, *k)? {
                Load::Absent => return Ok(None),
                Load::Value(v) => vec![(Chance::CERTAIN, v)],
                Load::Random { modulus: n, offset } => (0..n)
                    .map(|i| (Chance::of(1, n.into()), Value::U32(offset.wrapping_add(i))))
                    .collect(),
            };
            combos = combos
                .into_iter()
                .flat_map(|(c, vals)| {
                    draws.iter().map(move |(dc, v)| {
                        let mut vals = vals.clone();
                        vals.push(*v);
                        (c.times(*dc), vals)
                    })
                })
                .collect();
        }
        Ok(Some(combos))
    }

    /// `f` for each combination of the keys' values, on its own copy of the branch; branches
    /// that end up the same are one, their chances added.
    fn each(
        &self,
        b: Branch,
        keys: &[Expr],
        mut f: impl FnMut(&mut Branch, &[Value]) -> Result<Flow, Problem>,
    ) -> Result<Vec<(Branch, Flow)>, Problem> {
        let Some(combos) = self.keys(&b, keys)? else {
            return Ok(vec![(b, Flow::Break)]);
        };
        let mut out: Vec<(Branch, Flow)> = Vec::new();
        for (chance, values) in combos {
            let mut next = b.clone();
            next.chance = b.chance.times(chance);
            let flow = f(&mut next, &values)?;
            match out
                .iter_mut()
                .find(|(o, of)| *of == flow && o.same_but_chance(&next))
            {
                Some((o, _)) => o.chance = o.chance.plus(next.chance),
                None => out.push((next, flow)),
            }
        }
        Ok(out)
    }

    /// `keys` load what `kinds` declares.
    fn check_kinds(&self, keys: &[Expr], kinds: &[Kind], what: &str) -> Result<(), Problem> {
        let loaded: Vec<Kind> = keys
            .iter()
            .map(|k| expr_kind(*k, self.table.family))
            .collect();
        if loaded == kinds {
            return Ok(());
        }
        let keys: Vec<String> = keys.iter().map(|k| self.text(*k)).collect();
        Err(Problem::Invalid(format!(
            "looks up {} ({loaded:?}) in {what}, keyed {kinds:?}",
            keys.join(" . ")
        )))
    }

    /// Named set or map `name`, whose keys `keys` must match.
    fn set(&self, name: &str, keys: &[Expr]) -> Result<&Set, Problem> {
        let set = self
            .table
            .sets
            .get(name)
            .ok_or_else(|| Problem::Invalid(format!("refers to missing set {name}")))?;
        let kinds = type_kinds(&set.key, self.table.family);
        self.check_kinds(keys, &kinds, &format!("set {name}"))?;
        Ok(set)
    }

    fn map(&self, name: &str, keys: &[Expr], data: Data) -> Result<&Set, Problem> {
        let set = self.set(name, keys)?;
        let holds = match &set.data {
            Some(MapData::Verdict) => Some(Data::Verdict),
            Some(MapData::Counter) => Some(Data::Counter),
            Some(MapData::Value(_)) => Some(Data::Value),
            None => None,
        };
        match holds == Some(data) {
            true => Ok(set),
            false => Err(Problem::Invalid(format!(
                "uses {name} as a {data:?} map; it holds {:?}",
                set.data
            ))),
        }
    }

    /// Whether `key` is in `set`: its elements, and for a dynamic set what packets wrote.
    fn contains(&self, b: &Branch, set: &Set, key: &[Value]) -> bool {
        if element(set, key).is_some() {
            return true;
        }
        if !set.is_dynamic() {
            return false;
        }
        let key = Values::new(key);
        let wrote = |l: &Learned| l.table == self.table_ref && l.set == set.name && l.key == key;
        b.learned.iter().any(wrote)
            || self
                .known
                .get(&(self.table_ref.clone(), set.name.clone()))
                .is_some_and(|k| k.contains(&key))
    }

    pub(super) fn stmt(&self, b: Branch, s: &Stmt) -> Result<Vec<(Branch, Flow)>, Problem> {
        let pass = |ok: bool| if ok { Flow::Continue } else { Flow::Break };
        match s {
            Stmt::Cmp { left, op, right } => {
                if kind(*right) != expr_kind(*left, self.table.family) {
                    return Err(Problem::Invalid(format!(
                        "compares {} with {right:?}",
                        self.text(*left)
                    )));
                }
                self.each(b, &[*left], |_, v| {
                    Ok(pass((v[0] == *right) == (*op == CmpOp::Eq)))
                })
            }
            Stmt::Masked { left, mask, value } => {
                self.bits(b, *left, "& mask ==", |x| x & mask == *value)
            }
            Stmt::AnyBits { left, bits } => self.bits(b, *left, "bits", |x| x & bits != 0),
            Stmt::Lookup { keys, set, negate } => {
                let set = self.set(set, keys)?;
                self.each(b, keys, |b, v| {
                    Ok(pass(self.contains(b, set, v) != *negate))
                })
            }
            Stmt::Vmap { keys, map } => {
                let map = self.map(map, keys, Data::Verdict)?;
                self.each(b, keys, |_, v| verdict_of(map, v))
            }
            Stmt::AnonVmap { keys, map } => {
                for (k, _) in &map.elements {
                    let kinds: Vec<Kind> = k.iter().map(|v| kind(*v)).collect();
                    self.check_kinds(keys, &kinds, "an anonymous verdict map")?;
                }
                self.anon_vmap(b, keys, map)
            }
            Stmt::Counter { .. } | Stmt::MarkOr(_) | Stmt::Verdict(_) => Ok(vec![plain(b, s)]),
            Stmt::CounterRef(name) => {
                self.counter(name)?;
                let mut b = b;
                b.counters.insert(name.clone());
                Ok(vec![(b, Flow::Continue)])
            }
            Stmt::CounterMap { keys, map } => {
                let map = self.map(map, keys, Data::Counter)?;
                self.each(b, keys, |b, v| self.count_by_map(b, map, v))
            }
            Stmt::SetUpdate { keys, set, .. } => self.update(b, keys, set),
            Stmt::Nat { kind, addr, port } => self.nat(b, *kind, *addr, *port),
            Stmt::NatMap { kind, keys, map } => self.nat_map(b, *kind, keys, map),
            Stmt::Masquerade { fully_random } => {
                self.nat_here(Nat::Masquerade)?;
                let mut b = b;
                b.set_snat(Snat::Masquerade {
                    fully_random: *fully_random,
                });
                Ok(vec![(b, Flow::Verdict(Verdict::Accept))])
            }
            Stmt::Reject(r) => self.reject(b, *r),
        }
    }

    fn anon_vmap(
        &self,
        b: Branch,
        keys: &[Expr],
        map: &AnonVmap,
    ) -> Result<Vec<(Branch, Flow)>, Problem> {
        self.each(b, keys, |_, v| {
            let hit = map.elements.iter().find(|(k, _)| k.as_slice() == v);
            Ok(hit.map_or(Flow::Break, |(_, verdict)| Flow::Verdict(verdict.clone())))
        })
    }

    /// A match on the bits of a 32-bit value (marks, `ct state`, `ct status`, numgen).
    fn bits(
        &self,
        b: Branch,
        left: Expr,
        what: &str,
        f: impl Fn(u32) -> bool,
    ) -> Result<Vec<(Branch, Flow)>, Problem> {
        if expr_kind(left, self.table.family) != Kind::U32 {
            return Err(Problem::Invalid(format!(
                "{} {what}: not a 32-bit integer",
                self.text(left)
            )));
        }
        self.each(b, &[left], |_, v| match v[0] {
            Value::U32(x) if f(x) => Ok(Flow::Continue),
            _ => Ok(Flow::Break),
        })
    }

    fn counter(&self, name: &str) -> Result<(), Problem> {
        match self.table.counters.contains_key(name) {
            true => Ok(()),
            false => Err(Problem::Invalid(format!(
                "counts into missing counter {name}"
            ))),
        }
    }

    fn count_by_map(&self, b: &mut Branch, map: &Set, key: &[Value]) -> Result<Flow, Problem> {
        match element(map, key).map(|e| &e.data) {
            None => Ok(Flow::Break),
            Some(Some(ElemData::Counter(name))) => {
                self.counter(name)?;
                b.counters.insert(name.clone());
                Ok(Flow::Continue)
            }
            Some(other) => Err(Problem::Invalid(format!(
                "counter map {} holds {other:?} for {key:?}",
                map.name
            ))),
        }
    }

    fn update(&self, b: Branch, keys: &[Expr], set: &str) -> Result<Vec<(Branch, Flow)>, Problem> {
        let s = self.set(set, keys)?;
        if !s.is_dynamic() {
            return Err(Problem::Invalid(format!(
                "updates set {set}, which packets cannot fill (it has no timeout)"
            )));
        }
        self.each(b, keys, |b, v| {
            b.learned.push(Learned {
                table: self.table_ref.clone(),
                set: set.to_string(),
                key: Values::new(v),
            });
            Ok(Flow::Continue)
        })
    }

    /// A NAT statement of `kind` may run here: a nat chain, on a hook that decides it.
    fn nat_here(&self, nat: Nat) -> Result<(), Problem> {
        if self.chain_type != ChainType::Nat || !nat.hooks().contains(&self.hook) {
            return Err(Problem::Invalid(format!(
                "{} in a {} chain on hook {}",
                nat.word(),
                self.chain_type.keyword(),
                self.hook.keyword()
            )));
        }
        Ok(())
    }

    /// NAT of the packet's family: whether it applies to the packet (in an `inet` table a
    /// NAT of the other family does nothing).
    fn nat_family(&self, b: &Branch, to: IpAddr, what: &str) -> Result<bool, Problem> {
        match (
            to.is_ipv4() == (b.family() == Family::Ip),
            self.table.family,
        ) {
            (true, _) => Ok(true),
            (false, Family::Inet) => Ok(false),
            (false, f) => Err(Problem::Invalid(format!("{what} to {to} in an {f} table"))),
        }
    }

    fn nat(
        &self,
        b: Branch,
        kind: NatKind,
        addr: IpAddr,
        port: Option<u16>,
    ) -> Result<Vec<(Branch, Flow)>, Problem> {
        let what = Nat::of(kind).word();
        self.nat_here(Nat::of(kind))?;
        let mut b = b;
        if !self.nat_family(&b, addr, what)? {
            return Ok(vec![(b, Flow::Continue)]);
        }
        match kind {
            NatKind::Dnat => b.set_dnat(SocketAddr::new(addr, port.unwrap_or(b.dport))),
            NatKind::Snat => b.set_snat(Snat::To(addr, port)),
        }
        Ok(vec![(b, Flow::Verdict(Verdict::Accept))])
    }

    fn nat_map(
        &self,
        b: Branch,
        kind: NatKind,
        keys: &[Expr],
        map: &str,
    ) -> Result<Vec<(Branch, Flow)>, Problem> {
        let what = Nat::of(kind).word();
        self.nat_here(Nat::of(kind))?;
        let m = self.map(map, keys, Data::Value)?;
        // The encoder NATs to the table's family (`ip` in an `inet` table).
        let addr = match self.table.family {
            Family::Ip6 => Kind::Ipv6,
            _ => Kind::Ipv4,
        };
        match &m.data {
            Some(MapData::Value(t)) if type_kinds(t, self.table.family) == [addr, Kind::Port] => {}
            other => {
                return Err(Problem::Unsupported(format!(
                    "{what} through map {map}, whose data is {other:?}, not address . port"
                )))
            }
        }
        let family_ok = (addr == Kind::Ipv4) == (b.family() == Family::Ip);
        if !family_ok && self.table.family == Family::Inet {
            return Ok(vec![(b, Flow::Continue)]);
        }
        self.each(b, keys, |b, v| match element(m, v).map(|e| &e.data) {
            None => Ok(Flow::Break),
            Some(Some(ElemData::Values(d))) => match d.to_vec()[..] {
                [a @ (Value::Ipv4(_) | Value::Ipv6(_)), Value::Port(p)] => {
                    let to = match a {
                        Value::Ipv4(a) => IpAddr::V4(a),
                        Value::Ipv6(a) => IpAddr::V6(a),
                        _ => unreachable!("matched an address"),
                    };
                    match kind {
                        NatKind::Dnat => b.set_dnat(SocketAddr::new(to, p)),
                        NatKind::Snat => b.set_snat(Snat::To(to, Some(p))),
                    }
                    Ok(Flow::Verdict(Verdict::Accept))
                }
                _ => Err(Problem::Invalid(format!("map {map} holds {d:?} for {v:?}"))),
            },
            Some(other) => Err(Problem::Invalid(format!(
                "map {map} holds {other:?} for {v:?}"
            ))),
        })
    }

    /// `reject with tcp reset` carries a `meta l4proto tcp` the encoder adds: other packets
    /// do not match it. Reject runs where the kernel allows it (not `postrouting`).
    fn reject(&self, b: Branch, r: Reject) -> Result<Vec<(Branch, Flow)>, Problem> {
        if self.hook == Hook::Postrouting {
            return Err(Problem::Invalid("reject on hook postrouting".into()));
        }
        if r == Reject::TcpReset && b.proto != L4Proto::Tcp {
            return Ok(vec![(b, Flow::Break)]);
        }
        Ok(vec![(b, Flow::Reject(r))])
    }
}

/// A statement that reads nothing: an anonymous counter (its rule shows in the outcome's
/// rules), a mark, a verdict.
fn plain(mut b: Branch, s: &Stmt) -> (Branch, Flow) {
    let flow = match s {
        Stmt::MarkOr(bits) => {
            b.mark |= bits;
            Flow::Continue
        }
        Stmt::Verdict(v) => Flow::Verdict(v.clone()),
        _ => Flow::Continue,
    };
    (b, flow)
}

fn verdict_of(map: &Set, key: &[Value]) -> Result<Flow, Problem> {
    match element(map, key).map(|e| &e.data) {
        None => Ok(Flow::Break),
        Some(Some(ElemData::Verdict(v))) => Ok(Flow::Verdict(v.clone())),
        Some(other) => Err(Problem::Invalid(format!(
            "verdict map {} holds {other:?} for {key:?}",
            map.name
        ))),
    }
}
