//! Where a Service becomes chains, sets and map elements: one family's `nodelb` table.
//!
//! Shape (docs/design.md, "The netfilter shape"):
//! - `map services` (`addr . inet_proto . inet_service : verdict`) is the dispatch: nat
//!   `prerouting` and `output` look up `daddr . l4proto . th dport` in it, so a packet's cost does
//!   not grow with the number of Services. A plain Service port's element (no source ranges, no
//!   affinity, endpoints to forward to) goes (`goto`) straight to the shared chain `endpoints-N`
//!   for its endpoint count N, which DNATs through `numgen random mod N` and the global `map
//!   endpoints` (`l4proto . th dport . index : daddr . th dport`). A chain per Service port
//!   would cost the full install a large part of its kernel time (the `install_shapes` bench
//!   of `nodelb-integration`, docs/benchmarks.md), for a new-connection count no metric
//!   reads: the per-Service counters below count its traffic.
//! - The other Service ports' elements go to the port's own chain
//!   `svc-<namespace>/<name>-<proto>-<port>`, which drops clients outside
//!   `loadBalancerSourceRanges` (counted), then either counts and goes to `endpoints-N`, or, for
//!   `Local` without a local endpoint, sends clients on the node itself to the endpoints
//!   elsewhere (as kube-proxy does) and counts and drops the rest. Only the `endpoints-N` chains
//!   refer to the endpoint map: the kernel walks a whole map each time a new chain binds to it,
//!   so a DNAT rule per Service port would make a commit's cost grow with Services times
//!   endpoints, where a few shared chains bind it a few times.
//! - `sessionAffinity: ClientIP` (as kube-proxy's nftables mode does it): each endpoint of
//!   the Service port has a chain `ep-<namespace>/<name>-<proto>-<port>-<address>-<target
//!   port>` that records the client in its own set `affinity-<same>` (`flags
//!   dynamic,timeout`, `timeout` the Service's `timeoutSeconds`) and DNATs to the endpoint.
//!   The Service port's chain first sends a client found in an endpoint's set to that
//!   endpoint's chain, then picks one for the others: endpoint `i` of `N` when `numgen random
//!   mod (N - i)` is 0, the last one otherwise, each as likely. No map: a verdict map shared by
//!   the Service ports would make the kernel's loop check walk all of it once per Service port
//!   that reaches it, on every commit. Only affinity Services pay for chains and sets per
//!   endpoint. Chains and sets are named for the endpoint, not its index, so an endpoint that
//!   comes or goes leaves the others' clients where they are.
//! - Services without any endpoint are in `set no-endpoints`, whose new connections (`ct state
//!   new`: never a reply to the node's own connection from that port) are rejected in filter
//!   `input` and `filter-output` (TCP reset, ICMP port unreachable): reject is not allowed in
//!   prerouting.
//! - Masquerade (`fully-random`, as kube-proxy's) in nat `postrouting`, decided from
//!   conntrack's original destination (no packet mark): every client of a `Cluster` Service (`set masq-services`), and under both policies
//!   clients on the node itself (`set local-addresses`) and hairpin connections, an endpoint
//!   reaching its own Service (`set hairpin` of `endpoint . endpoint`).
//! - filter `forward` accepts DNATed traffic of nodelb's Services (`set lb-services`).
//! - Counting: each Service port has a counter object `svc/<namespace>/<name>/<port>` and, for
//!   each of its dispatch keys, an element in `map svc-counters` (`addr . inet_proto .
//!   inet_service : counter`). Filter `forward`, `input` and `filter-output` count every packet
//!   of a DNATed connection, both directions, into the counter its original destination names
//!   (`ct original daddr . l4proto . ct original proto-dst`); a packet crosses one of the three
//!   hooks, so it is counted once. Sources outside `loadBalancerSourceRanges` are dropped into
//!   `drops/<namespace>/<name>/<port>`. Counter names are nft identifiers (nft's grammar takes
//!   no quoted name in a declaration, and no `:`); the `svc/` and `drops/` prefixes keep a
//!   namespace that starts with a digit legal.
//!
//! Every rule and element carries the comment `namespace/name:port`.
//!
//! A table is assembled from a skeleton (declarations, base chains, host addresses) and one
//! [`Part`] per Service; between two syncs only the Parts of changed Services are compared.

use super::endpoints::Endpoint;
use super::service::{Cidr, ClientIpAffinity, TrafficPolicy};
use crate::packed::Packed;
use crate::vocab::IpFamily;
use crate::vocab::{Protocol, ServiceKey, ServicePortId};
use nodelb_netfilter::{
    ct_state, ct_status, Chain, ChainType, Counter, CtKey, DataType, Edit, ElemData, ElemEdit,
    Element, Expr, Hook, Key, L4Proto, MapData, MetaKey, NatKind, Payload, Policy, Reject, Rule,
    Set, SetType, Stmt, Table, Value, Verdict,
};
use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;
use std::sync::Arc;
use std::time::Duration;

/// Priority of nodelb's dispatch (nat `prerouting` and `output`): `dstnat - 10`, before every
/// other DNAT at `dstnat` (-100: kube-proxy, CNI hostPort/portmap, Docker), so for the addresses
/// and ports nodelb publishes, nodelb's DNAT is the one that applies, whatever registered its
/// chain first.
pub const DISPATCH_PRIORITY: i32 = -110;
/// Priority of nodelb's filter chains.
pub const FILTER_PRIORITY: i32 = 0;
/// Priority of the masquerade chain (srcnat).
pub const SRCNAT_PRIORITY: i32 = 100;

pub const SERVICES_MAP: &str = "services";
pub const ENDPOINTS_MAP: &str = "endpoints";
pub const MASQ_SET: &str = "masq-services";
pub const LB_SET: &str = "lb-services";
pub const NO_ENDPOINTS_SET: &str = "no-endpoints";
pub const LOCAL_ADDRESSES_SET: &str = "local-addresses";
pub const HAIRPIN_SET: &str = "hairpin";
pub const COUNTERS_MAP: &str = "svc-counters";

/// What one Service port does on this node and family.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Action {
    Forward(Vec<Endpoint>),
    /// `Local` without a local endpoint: drop, except clients on this node, which go to these
    /// endpoints on other nodes.
    DropExceptNode(Vec<Endpoint>),
    Reject,
}

/// One Service port to program in one family's table.
#[derive(Clone, Debug)]
pub struct PortProgram<'a> {
    pub service: &'a ServiceKey,
    pub port: &'a ServicePortId,
    pub policy: TrafficPolicy,
    /// The node's addresses of this family that serve it.
    pub addresses: &'a [IpAddr],
    /// `None`: every source; `Some`: only these prefixes (of any family; others are ignored).
    pub source_ranges: Option<&'a [Cidr]>,
    /// `sessionAffinity: ClientIP`: a client keeps its endpoint.
    pub affinity: Option<ClientIpAffinity>,
    pub action: Action,
}

/// What one Service owns in one family's table.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Part {
    /// Elements of the shared sets and maps, by set name and key.
    pub elements: BTreeMap<(&'static str, Key), Element>,
    pub chains: SmallMap<Chain>,
    /// The Service's own sets: its source-range set, and with ClientIP affinity each
    /// endpoint's set of clients.
    pub sets: SmallMap<Set>,
    /// Endpoint addresses for the shared `hairpin` set, with this Service port's comment.
    pub hairpin: BTreeMap<IpAddr, Arc<str>>,
    /// The Service's counter objects, by name (equal by name and comment only).
    pub counters: SmallMap<Counter>,
    /// Endpoint counts whose shared `endpoints-N` chain this Service goes to.
    pub endpoint_chains: BTreeSet<usize>,
}

/// Name of the shared chain that picks one of `n` endpoints.
fn endpoint_chain_name(n: usize) -> String {
    format!("endpoints-{n}")
}

/// The shared chain that picks one of `n` endpoints of the Service port the packet is for.
fn endpoint_chain(n: usize) -> Chain {
    Chain::regular(endpoint_chain_name(n)).rule(
        Rule::new(vec![Stmt::NatMap {
            kind: NatKind::Dnat,
            keys: vec![L4, TH_DPORT, Expr::Numgen { modulus: n as u32 }],
            map: ENDPOINTS_MAP.into(),
        }])
        .with_comment(format!("one of {n} endpoints")),
    )
}

/// A few named items (a Service's chains or counters: one to three), sorted by name in a
/// vector; a map would allocate room for eleven per Service.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SmallMap<V>(Vec<(String, V)>);

impl<V> Default for SmallMap<V> {
    fn default() -> Self {
        SmallMap(Vec::new())
    }
}

impl<V> SmallMap<V> {
    pub fn insert(&mut self, name: String, v: V) {
        match self.0.binary_search_by(|(n, _)| n.as_str().cmp(&name)) {
            Ok(i) => self.0[i].1 = v,
            Err(i) => self.0.insert(i, (name, v)),
        }
    }
    pub fn get(&self, name: &str) -> Option<&V> {
        self.0
            .binary_search_by(|(n, _)| n.as_str().cmp(name))
            .ok()
            .map(|i| &self.0[i].1)
    }
    pub fn contains_key(&self, name: &str) -> bool {
        self.get(name).is_some()
    }
    pub fn keys(&self) -> impl Iterator<Item = &String> {
        self.0.iter().map(|(n, _)| n)
    }
    pub fn values(&self) -> impl Iterator<Item = &V> {
        self.0.iter().map(|(_, v)| v)
    }
    pub fn iter(&self) -> impl Iterator<Item = (&String, &V)> {
        self.0.iter().map(|(n, v)| (n, v))
    }
}

/// `namespace/name:port`, the comment on everything a Service port owns.
pub fn comment(service: &ServiceKey, port: &ServicePortId) -> String {
    format!("{service}:{}", port.label())
}

/// `<namespace>/<name>-<proto>-<port>`: what names a Service port's chains and sets.
fn port_ident(service: &ServiceKey, port: &ServicePortId) -> String {
    format!(
        "{}/{}-{}-{}",
        service.namespace,
        service.name,
        port.protocol.keyword(),
        port.port
    )
}

/// The chain of one Service port.
pub fn service_chain(service: &ServiceKey, port: &ServicePortId) -> String {
    format!("svc-{}", port_ident(service, port))
}

/// An endpoint in a chain or set name: its address and port, IPv6 with `.` for `:` (names
/// hold no `:`), written so that two addresses never read the same (no dotted IPv4 tail).
fn endpoint_ident(e: &Endpoint) -> String {
    let addr = match e.addr {
        IpAddr::V4(a) => a.to_string(),
        IpAddr::V6(a) => {
            let seg = a.segments();
            // The longest run of zero groups (two or more), the first of equals, as `..`.
            let mut run = (0, 0);
            let mut i = 0;
            while i < 8 {
                let len = seg[i..].iter().take_while(|g| **g == 0).count();
                if len > run.1 {
                    run = (i, len);
                }
                i += len.max(1);
            }
            let hex = |s: &[u16]| s.iter().map(|g| format!("{g:x}")).collect::<Vec<_>>();
            if run.1 >= 2 {
                let (head, tail) = (hex(&seg[..run.0]), hex(&seg[run.0 + run.1..]));
                format!("{}..{}", head.join("."), tail.join("."))
            } else {
                hex(&seg).join(".")
            }
        }
    };
    format!("{addr}-{}", e.port)
}

/// The chain of one endpoint of a Service port with ClientIP affinity.
pub fn affinity_endpoint_chain(service: &ServiceKey, port: &ServicePortId, e: &Endpoint) -> String {
    format!("ep-{}-{}", port_ident(service, port), endpoint_ident(e))
}

/// The set of the clients one endpoint of a ClientIP affinity Service port keeps.
pub fn affinity_set(service: &ServiceKey, port: &ServicePortId, e: &Endpoint) -> String {
    format!(
        "affinity-{}-{}",
        port_ident(service, port),
        endpoint_ident(e)
    )
}

/// What a counter object counts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CounterKind {
    /// Every packet of the Service port's connections, both directions.
    Traffic,
    /// Packets from sources outside `loadBalancerSourceRanges`, dropped.
    SourceRangeDrops,
}

impl CounterKind {
    fn prefix(self) -> &'static str {
        match self {
            CounterKind::Traffic => "svc",
            CounterKind::SourceRangeDrops => "drops",
        }
    }
}

/// The counter object of one Service port: `svc/<namespace>/<name>/<port>` or
/// `drops/<namespace>/<name>/<port>` (`<port>` is the port's name, else its number, as in
/// comments).
pub fn counter_name(kind: CounterKind, service: &ServiceKey, port: &ServicePortId) -> String {
    format!(
        "{}/{}/{}/{}",
        kind.prefix(),
        service.namespace,
        service.name,
        port.label()
    )
}

/// What a counter's name says: kind, namespace, Service name and port label; `None` for names
/// nodelb does not make. Namespaces, names and port names hold no `/`, so this is exact.
pub fn parse_counter_name(name: &str) -> Option<(CounterKind, &str, &str, &str)> {
    let mut it = name.split('/');
    let kind = match it.next()? {
        "svc" => CounterKind::Traffic,
        "drops" => CounterKind::SourceRangeDrops,
        _ => return None,
    };
    let (ns, svc, port) = (it.next()?, it.next()?, it.next()?);
    if it.next().is_some() || ns.is_empty() || svc.is_empty() || port.is_empty() {
        return None;
    }
    Some((kind, ns, svc, port))
}

/// The source-range set of one Service.
pub fn source_set(service: &ServiceKey) -> String {
    format!("src-{}/{}", service.namespace, service.name)
}

/// The IPv4 or IPv6 header, for the table of its family: the address type and the fields
/// rules match on.
struct IpHeader(IpFamily);

impl IpHeader {
    fn addr_type(&self) -> DataType {
        match self.0 {
            IpFamily::V4 => DataType::Ipv4Addr,
            IpFamily::V6 => DataType::Ipv6Addr,
        }
    }
    fn saddr(&self) -> Expr {
        Expr::Payload(match self.0 {
            IpFamily::V4 => Payload::IpSaddr,
            IpFamily::V6 => Payload::Ip6Saddr,
        })
    }
    fn daddr(&self) -> Expr {
        Expr::Payload(match self.0 {
            IpFamily::V4 => Payload::IpDaddr,
            IpFamily::V6 => Payload::Ip6Daddr,
        })
    }
    fn service_key_type(&self) -> SetType {
        SetType::Type(vec![
            self.addr_type(),
            DataType::InetProto,
            DataType::InetService,
        ])
    }
}

const L4: Expr = Expr::Meta(MetaKey::L4Proto);
const TH_DPORT: Expr = Expr::Payload(Payload::ThDport);
const PROTOCOLS: [Protocol; 3] = [Protocol::Tcp, Protocol::Udp, Protocol::Sctp];

fn value(ip: IpAddr) -> Value {
    Value::from(ip)
}

fn service_key(addr: IpAddr, port: &ServicePortId) -> Key {
    Key::Values(
        vec![
            value(addr),
            Value::Proto(port.protocol.l4()),
            Value::Port(port.port),
        ]
        .into(),
    )
}

fn element(data: Option<ElemData>, comment: &Arc<str>) -> Element {
    Element {
        data,
        comment: Some(comment.clone()),
    }
}

/// Add one Service port to a Service's Part.
pub fn add_port(part: &mut Part, family: IpFamily, p: &PortProgram<'_>) {
    let ip = IpHeader(family);
    let note: Arc<str> = comment(p.service, p.port).into();
    // Counted whatever the action, so a port that goes from rejecting to forwarding keeps its
    // counter and its map elements.
    let counter = counter_name(CounterKind::Traffic, p.service, p.port);
    for a in p.addresses {
        part.elements.insert(
            (COUNTERS_MAP, service_key(*a, p.port)),
            element(Some(ElemData::Counter(counter.clone())), &note),
        );
    }
    part.counters.insert(
        counter.clone(),
        Counter::new(counter).with_comment(note.to_string()),
    );
    let (eps, local_only) = match &p.action {
        Action::Reject => {
            add_rejecting_port(part, &ip, p, &note);
            return;
        }
        Action::DropExceptNode(eps) => (eps, true),
        Action::Forward(eps) => (eps, false),
    };
    // Endpoints that serve only this node's own clients are not reached by hairpin traffic.
    let hairpin = !local_only;
    let last = match p.affinity {
        Some(a) => {
            let sticky = add_affinity_endpoints(part, &ip, p, &note, eps, a, hairpin);
            Last::Affinity { sticky, local_only }
        }
        None => {
            add_endpoints(part, p, &note, eps, hairpin);
            match local_only {
                true => Last::DropExceptNode(eps.len()),
                false => Last::Dnat(eps.len()),
            }
        }
    };
    let target = match last {
        // Nothing to check first: the dispatch goes to the shared chain itself.
        Last::Dnat(n) if p.source_ranges.is_none() => {
            part.endpoint_chains.insert(n);
            endpoint_chain_name(n)
        }
        last => service_port_chain(part, &ip, p, &note, last),
    };
    for a in p.addresses {
        let key = service_key(*a, p.port);
        part.elements.insert(
            (SERVICES_MAP, key.clone()),
            element(
                Some(ElemData::Verdict(Verdict::Goto(target.clone()))),
                &note,
            ),
        );
        part.elements
            .insert((LB_SET, key.clone()), element(None, &note));
        if p.policy == TrafficPolicy::Cluster {
            part.elements.insert((MASQ_SET, key), element(None, &note));
        }
    }
}

/// A port without endpoints: rejected in the filter hooks. Clients outside the source ranges
/// are dropped and counted, not told the Service exists: its chain drops them and lets the
/// others on to the reject.
fn add_rejecting_port(part: &mut Part, ip: &IpHeader, p: &PortProgram<'_>, note: &Arc<str>) {
    for a in p.addresses {
        part.elements.insert(
            (NO_ENDPOINTS_SET, service_key(*a, p.port)),
            element(None, note),
        );
    }
    if p.source_ranges.is_some() {
        let chain = service_port_chain(part, ip, p, note, Last::Nothing);
        for a in p.addresses {
            part.elements.insert(
                (SERVICES_MAP, service_key(*a, p.port)),
                element(Some(ElemData::Verdict(Verdict::Jump(chain.clone()))), note),
            );
        }
    }
}

/// The endpoint map's elements of one Service port; `hairpin`: its endpoints may reach it
/// through this node (not for endpoints that serve only this node's own clients).
fn add_endpoints(
    part: &mut Part,
    p: &PortProgram<'_>,
    note: &Arc<str>,
    eps: &[Endpoint],
    hairpin: bool,
) {
    for (i, e) in eps.iter().enumerate() {
        part.elements.insert(
            (
                ENDPOINTS_MAP,
                Key::Values(
                    vec![
                        Value::Proto(p.port.protocol.l4()),
                        Value::Port(p.port.port),
                        Value::U32(i as u32),
                    ]
                    .into(),
                ),
            ),
            element(
                Some(ElemData::Values(
                    vec![value(e.addr), Value::Port(e.port)].into(),
                )),
                note,
            ),
        );
        if hairpin {
            part.hairpin.entry(e.addr).or_insert_with(|| note.clone());
        }
    }
}

/// With ClientIP affinity, each endpoint's set of clients and its chain, which records the
/// client there and DNATs. Returns each endpoint's (set, chain), in endpoint order.
fn add_affinity_endpoints(
    part: &mut Part,
    ip: &IpHeader,
    p: &PortProgram<'_>,
    note: &Arc<str>,
    eps: &[Endpoint],
    affinity: ClientIpAffinity,
    hairpin: bool,
) -> Vec<(String, String)> {
    let timeout = Duration::from_secs(affinity.timeout_seconds.into());
    let mut sticky = Vec::with_capacity(eps.len());
    for e in eps {
        let set = affinity_set(p.service, p.port, e);
        let chain = affinity_endpoint_chain(p.service, p.port, e);
        part.sets.insert(
            set.clone(),
            Set::new(&set, SetType::Type(vec![ip.addr_type()]))
                .dynamic(timeout)
                .with_comment(note.to_string()),
        );
        // Two rules: a full set stops the update, never the DNAT.
        let record = Stmt::SetUpdate {
            keys: vec![ip.saddr()],
            set: set.clone(),
            timeout: Some(timeout),
        };
        let dnat = Stmt::Nat {
            kind: NatKind::Dnat,
            addr: e.addr,
            port: Some(e.port),
        };
        let mut c = Chain::regular(&chain)
            .rule(Rule::new(vec![record]).with_comment(note.to_string()))
            .rule(Rule::new(vec![l4_is(p.port.protocol), dnat]).with_comment(note.to_string()));
        c.rules.shrink_to_fit();
        part.chains.insert(chain.clone(), c);
        if hairpin {
            part.hairpin.entry(e.addr).or_insert_with(|| note.clone());
        }
        sticky.push((set, chain));
    }
    sticky
}

/// How a Service port's chain ends, after the source-range check.
enum Last {
    /// DNAT to one of `n` endpoints.
    Dnat(usize),
    /// `Local` policy without a local endpoint: clients on this node DNAT to one of `n`
    /// endpoints elsewhere, everyone else is dropped.
    DropExceptNode(usize),
    /// ClientIP affinity: a client in an endpoint's set goes to that endpoint's chain, the
    /// others to one picked at random (`sticky`: each endpoint's set and chain, in endpoint
    /// order); `local_only`: as [`Last::DropExceptNode`], only this node's own clients get
    /// that far.
    Affinity {
        sticky: Vec<(String, String)>,
        local_only: bool,
    },
    /// Nothing: allowed clients go on (to the no-endpoints reject).
    Nothing,
}

/// The chain of one Service port: source ranges, then what `last` says. Returns its name.
fn service_port_chain(
    part: &mut Part,
    ip: &IpHeader,
    p: &PortProgram<'_>,
    note: &str,
    last: Last,
) -> String {
    let name = service_chain(p.service, p.port);
    let mut chain = Chain::regular(&name);
    if let Some(ranges) = p.source_ranges {
        chain.push(source_range_rule(part, ip, p, ranges, note));
    }
    chain.rules.extend(last_rules(part, ip, note, last));
    // The committed table keeps one such chain per Service port: no spare room.
    chain.rules.shrink_to_fit();
    part.chains.insert(name.clone(), chain);
    name
}

/// The rule that drops (and counts) clients outside the Service's source ranges, with the
/// Service's source-range set and drop counter.
fn source_range_rule(
    part: &mut Part,
    ip: &IpHeader,
    p: &PortProgram<'_>,
    ranges: &[Cidr],
    note: &str,
) -> Rule {
    let set_name = source_set(p.service);
    if !part.sets.contains_key(&set_name) {
        let mut set = Set::new(&set_name, SetType::Type(vec![ip.addr_type()]))
            .interval()
            .with_comment(format!("{}: loadBalancerSourceRanges", p.service));
        for c in ranges.iter().filter(|c| c.family() == ip.0) {
            set.insert(
                Key::Prefix(c.addr, c.len),
                None,
                Some(p.service.to_string().into()),
            );
        }
        part.sets.insert(set_name.clone(), set);
    }
    let drops = counter_name(CounterKind::SourceRangeDrops, p.service, p.port);
    part.counters.insert(
        drops.clone(),
        Counter::new(&drops).with_comment(format!("{note}: source-range drops")),
    );
    Rule::new(vec![
        Stmt::Lookup {
            keys: vec![ip.saddr()],
            set: set_name,
            negate: true,
        },
        Stmt::CounterRef(drops),
        Stmt::Verdict(Verdict::Drop),
    ])
    .with_comment(format!("{note}: source not in loadBalancerSourceRanges"))
}

/// The rules that end a Service port's chain (noting the shared chains they go to).
fn last_rules(part: &mut Part, ip: &IpHeader, note: &str, last: Last) -> Vec<Rule> {
    let from_node = || Stmt::Lookup {
        keys: vec![ip.saddr()],
        set: LOCAL_ADDRESSES_SET.into(),
        negate: false,
    };
    let count_and = |v: Verdict| vec![Stmt::counter(), Stmt::Verdict(v)];
    let drop_note = || format!("{note}: Local policy, no endpoint on this node");
    let drop_rule = || Rule::new(count_and(Verdict::Drop)).with_comment(drop_note());
    let node_note = || format!("{note}: Local policy, this node's own clients");
    match last {
        Last::Dnat(n) => {
            part.endpoint_chains.insert(n);
            let goto = Verdict::Goto(endpoint_chain_name(n));
            vec![Rule::new(count_and(goto)).with_comment(note)]
        }
        Last::DropExceptNode(n) => {
            part.endpoint_chains.insert(n);
            let mut stmts = vec![from_node()];
            stmts.extend(count_and(Verdict::Goto(endpoint_chain_name(n))));
            vec![Rule::new(stmts).with_comment(node_note()), drop_rule()]
        }
        Last::Affinity { sticky, local_only } => {
            let mut rules = Vec::with_capacity(2 * sticky.len() + 1);
            if local_only {
                let mut stmts = vec![Stmt::Lookup {
                    keys: vec![ip.saddr()],
                    set: LOCAL_ADDRESSES_SET.into(),
                    negate: true,
                }];
                stmts.extend(count_and(Verdict::Drop));
                rules.push(Rule::new(stmts).with_comment(drop_note()));
            }
            for (set, chain) in sticky.iter() {
                let known = Stmt::Lookup {
                    keys: vec![ip.saddr()],
                    set: set.clone(),
                    negate: false,
                };
                let mut stmts = vec![known];
                stmts.extend(count_and(Verdict::Goto(chain.clone())));
                rules.push(Rule::new(stmts).with_comment(note));
            }
            // Endpoint i of n when a draw of n - i comes up 0: each is picked with chance
            // 1/n (the first 1/n, the next (n-1)/n * 1/(n-1), ...).
            let pick_note = if local_only { node_note() } else { note.into() };
            let n = sticky.len();
            for (i, (_, chain)) in sticky.iter().enumerate() {
                let mut stmts = Vec::with_capacity(3);
                if n - i > 1 {
                    let draw = Expr::Numgen {
                        modulus: (n - i) as u32,
                    };
                    stmts.push(Stmt::cmp(draw, Value::U32(0)));
                }
                stmts.extend(count_and(Verdict::Goto(chain.clone())));
                rules.push(Rule::new(stmts).with_comment(pick_note.clone()));
            }
            rules
        }
        Last::Nothing => Vec::new(),
    }
}

/// Who uses each hairpin address, by the comment of each user, sorted; the element's comment
/// is the first user's, so it does not depend on the order Services were added. (Usually one
/// user: a vector, where a set would allocate room for eleven per address.)
pub type HairpinUsers = BTreeMap<IpAddr, Vec<Arc<str>>>;

fn hairpin_key(addr: IpAddr) -> Key {
    Key::Values(vec![value(addr), value(addr)].into())
}

/// The table with no Service in it: declarations, base chains and the host's addresses.
pub fn skeleton(family: IpFamily, name: &str, local_addresses: &BTreeSet<IpAddr>) -> Table {
    let ip = IpHeader(family);
    let mut t = Table::new(family.netfilter(), name);
    t.add_set(
        Set::map(SERVICES_MAP, ip.service_key_type(), MapData::Verdict).with_comment(
            "node address . protocol . port: the Service port's chain, or endpoints-N",
        ),
    );
    t.add_set(
        Set::map(
            ENDPOINTS_MAP,
            SetType::Typeof(vec![L4, TH_DPORT, Expr::Numgen { modulus: 1 }]),
            MapData::Value(SetType::Typeof(vec![ip.daddr(), TH_DPORT])),
        )
        .with_comment("protocol . port . random index: endpoint"),
    );
    t.add_set(
        Set::new(MASQ_SET, ip.service_key_type())
            .with_comment("Cluster policy: clients are masqueraded"),
    );
    t.add_set(Set::new(LB_SET, ip.service_key_type()).with_comment("dispatched Service ports"));
    t.add_set(
        Set::new(NO_ENDPOINTS_SET, ip.service_key_type())
            .with_comment("Service ports without endpoints: rejected"),
    );
    let mut local = Set::new(LOCAL_ADDRESSES_SET, SetType::Type(vec![ip.addr_type()]))
        .with_comment("addresses of this host: its own clients are masqueraded");
    for a in local_addresses.iter().filter(|a| IpFamily::of(a) == family) {
        local.insert(
            Key::Values(vec![value(*a)].into()),
            None,
            Some("host address".into()),
        );
    }
    t.add_set(local);
    t.add_set(
        Set::new(
            HAIRPIN_SET,
            SetType::Type(vec![ip.addr_type(), ip.addr_type()]),
        )
        .with_comment("endpoint . endpoint: hairpin connections are masqueraded"),
    );
    t.add_set(
        Set::map(COUNTERS_MAP, ip.service_key_type(), MapData::Counter)
            .with_comment("node address . protocol . port: the Service port's counter"),
    );
    base_chains(&mut t, &ip);
    t
}

/// A table being filled: the skeleton, then every Service's Part (moved in, not copied),
/// then the shared chains and the hairpin elements.
///
/// The shared sets' elements and the counters arrive one Service at a time, in no order of
/// their keys; inserted so, a map's nodes end about half full (see `packed`). They are
/// gathered in [`Packed`] maps instead, whose nodes are full.
pub struct Assembly {
    table: Table,
    /// By set: the skeleton's sets, the shared ones every Service's elements go in.
    elements: BTreeMap<String, Packed<Key, Element>>,
    counters: Packed<String, Counter>,
    endpoint_counts: BTreeSet<usize>,
}

impl Assembly {
    pub fn new(mut skeleton: Table) -> Assembly {
        let elements = skeleton
            .sets
            .iter_mut()
            .map(|(name, set)| {
                (
                    name.clone(),
                    Packed::from(std::mem::take(&mut set.elements)),
                )
            })
            .collect();
        let counters = Packed::from(std::mem::take(&mut skeleton.counters));
        Assembly {
            table: skeleton,
            elements,
            counters,
            endpoint_counts: BTreeSet::new(),
        }
    }

    pub fn add(&mut self, part: Part) {
        let t = &mut self.table;
        self.endpoint_counts.extend(part.endpoint_chains);
        for ((set, key), e) in part.elements {
            if let Some(s) = self.elements.get_mut(set) {
                s.insert(key, e);
            }
        }
        for (name, c) in part.chains.0 {
            t.chains.insert(name, c);
        }
        for (name, s) in part.sets.0 {
            t.sets.insert(name, s);
        }
        for (name, c) in part.counters.0 {
            self.counters.insert(name, c);
        }
    }

    pub fn finish(mut self, hairpin: &HairpinUsers) -> Table {
        for n in std::mem::take(&mut self.endpoint_counts) {
            self.table.add_chain(endpoint_chain(n));
        }
        if let Some(s) = self.elements.get_mut(HAIRPIN_SET) {
            for (addr, users) in hairpin {
                if let Some(first) = users.first() {
                    let e = Element {
                        data: None,
                        comment: Some(first.clone()),
                    };
                    s.insert(hairpin_key(*addr), e);
                }
            }
        }
        for (name, elements) in std::mem::take(&mut self.elements) {
            if let Some(s) = self.table.sets.get_mut(&name) {
                s.elements = elements.finish();
            }
        }
        self.table.counters = self.counters.finish();
        self.table
    }
}

/// Record in `edit` what changes when a Service's Part goes from `old` to `new` (hairpin
/// elements are shared and handled by [`edit_hairpin`]).
pub fn edit_part(old: Option<&Part>, new: Option<&Part>, edit: &mut Edit) {
    let empty = Part::default();
    let (old, new) = (old.unwrap_or(&empty), new.unwrap_or(&empty));
    if old == new {
        return;
    }
    for ((set, key), e) in &old.elements {
        match new.elements.get(&(*set, key.clone())) {
            Some(n) if n == e => {}
            _ => elem_edit(edit, set).del.push(key.clone()),
        }
    }
    for ((set, key), e) in &new.elements {
        match old.elements.get(&(*set, key.clone())) {
            Some(o) if o == e => {}
            _ => elem_edit(edit, set).add.push((key.clone(), e.clone())),
        }
    }
    // A set declared anew (another timeout or comment) goes and comes back in the edit: every
    // chain of the Service that may use it is replaced, so none holds the old one.
    let redeclared = edit_sets(old, new, edit);
    for (name, c) in new.chains.iter() {
        let existed = old.chains.get(name);
        if existed != Some(c) || (redeclared && existed.is_some()) {
            edit.put_chains.push(c.clone());
        }
    }
    for name in old.chains.keys() {
        if !new.chains.contains_key(name) {
            edit.del_chains.push(name.clone());
        }
    }
    // A counter's name says everything its comment does, so a counter that stays is equal
    // and never re-created (which would reset it).
    for (name, c) in new.counters.iter() {
        if !old.counters.contains_key(name) {
            edit.add_counters.push(c.clone());
        }
    }
    for name in old.counters.keys() {
        if !new.counters.contains_key(name) {
            edit.del_counters.push(name.clone());
        }
    }
}

/// Record in `edit` how a Service's own sets change: added, removed, their elements, or
/// declared anew under the same name (removed and added). Returns whether one was.
fn edit_sets(old: &Part, new: &Part, edit: &mut Edit) -> bool {
    let mut redeclared = false;
    for (name, n) in new.sets.iter() {
        match old.sets.get(name) {
            None => edit.add_sets.push(n.clone()),
            Some(o) if o == n => {}
            Some(o) if o.same_decl(n) => {
                let e = elem_edit(edit, name);
                for k in o.elements.keys() {
                    if n.elements.get(k) != o.elements.get(k) {
                        e.del.push(k.clone());
                    }
                }
                for (k, v) in &n.elements {
                    if o.elements.get(k) != Some(v) {
                        e.add.push((k.clone(), v.clone()));
                    }
                }
            }
            Some(_) => {
                redeclared = true;
                edit.del_sets.push(name.clone());
                edit.add_sets.push(n.clone());
            }
        }
    }
    for name in old.sets.keys() {
        if !new.sets.contains_key(name) {
            edit.del_sets.push(name.clone());
        }
    }
    redeclared
}

fn elem_edit<'e>(edit: &'e mut Edit, set: &str) -> &'e mut ElemEdit {
    edit.elements.entry(set.to_string()).or_default()
}

/// What several Services' Parts share in the tables, with who uses it, per family: the
/// `endpoints-N` chains (how many Service ports go to each) and the `hairpin` set's elements
/// (the users of each address). Moving a Part's uses is recorded in a [`SharedBefore`]; the
/// edits that follow are known once every Part of an update has moved ([`Shared::edits`]), so
/// an object one Service drops and another takes is left alone.
#[derive(Clone, Debug, Default)]
pub struct Shared {
    endpoint_chains: BTreeMap<IpFamily, BTreeMap<usize, usize>>,
    hairpin: BTreeMap<IpFamily, HairpinUsers>,
}

/// What each shared object an update touched was before it, per family: whether an
/// `endpoints-N` chain existed, and the first user of a hairpin address.
#[derive(Debug, Default)]
pub struct SharedBefore {
    chains: BTreeMap<IpFamily, BTreeMap<usize, bool>>,
    hairpin: BTreeMap<IpFamily, BTreeMap<IpAddr, Option<Arc<str>>>>,
}

impl Shared {
    /// The users of each hairpin address of one family.
    pub fn hairpin(&self, family: IpFamily) -> Option<&HairpinUsers> {
        self.hairpin.get(&family)
    }

    /// A Service's Part in `family` goes from `old` to `new`: move its uses, noting in `before`
    /// what each object it touches was before the update.
    pub fn replace(
        &mut self,
        family: IpFamily,
        old: Option<&Part>,
        new: Option<&Part>,
        before: &mut SharedBefore,
    ) {
        let uses = self.endpoint_chains.entry(family).or_default();
        let existed = before.chains.entry(family).or_default();
        for n in old.iter().flat_map(|p| &p.endpoint_chains) {
            existed.entry(*n).or_insert_with(|| uses.contains_key(n));
            if let Some(c) = uses.get_mut(n) {
                *c -= 1;
                if *c == 0 {
                    uses.remove(n);
                }
            }
        }
        for n in new.iter().flat_map(|p| &p.endpoint_chains) {
            existed.entry(*n).or_insert_with(|| uses.contains_key(n));
            *uses.entry(*n).or_default() += 1;
        }
        let users = self.hairpin.entry(family).or_default();
        let first = before.hairpin.entry(family).or_default();
        for (addr, c) in old.iter().flat_map(|p| &p.hairpin) {
            first
                .entry(*addr)
                .or_insert_with(|| users.get(addr).and_then(|u| u.first()).cloned());
            if let Some(u) = users.get_mut(addr) {
                if let Ok(i) = u.binary_search(c) {
                    u.remove(i);
                }
                if u.is_empty() {
                    users.remove(addr);
                }
            }
        }
        for (addr, c) in new.iter().flat_map(|p| &p.hairpin) {
            first
                .entry(*addr)
                .or_insert_with(|| users.get(addr).and_then(|u| u.first()).cloned());
            let u = users.entry(*addr).or_default();
            if let Err(i) = u.binary_search(c) {
                u.reserve_exact(1);
                u.insert(i, c.clone());
            }
        }
    }

    /// The edits the moves since `before` was empty cause, added to each family's edit: the
    /// `endpoints-N` chains that came or went, then the hairpin elements whose first user
    /// changed.
    pub fn edits(&self, before: SharedBefore, edits: &mut BTreeMap<IpFamily, Edit>) {
        for (family, existed) in &before.chains {
            let uses = self.endpoint_chains.get(family);
            let edit = edits.entry(*family).or_default();
            for (n, existed) in existed {
                let exists = uses.is_some_and(|u| u.contains_key(n));
                match (existed, exists) {
                    (false, true) => edit.put_chains.push(endpoint_chain(*n)),
                    (true, false) => edit.del_chains.push(endpoint_chain_name(*n)),
                    _ => {}
                }
            }
        }
        let none = HairpinUsers::new();
        for (family, first) in &before.hairpin {
            let users = self.hairpin.get(family).unwrap_or(&none);
            edit_hairpin(first, users, edits.entry(*family).or_default());
        }
    }
}

/// Record in `edit` the hairpin elements that change, given the first user of each address
/// touched before the update and the users after it.
fn edit_hairpin(
    before: &BTreeMap<IpAddr, Option<Arc<str>>>,
    after: &HairpinUsers,
    edit: &mut Edit,
) {
    for (a, old) in before {
        let new = after.get(a).and_then(|u| u.first()).cloned();
        if *old == new {
            continue;
        }
        if old.is_some() {
            elem_edit(edit, HAIRPIN_SET).del.push(hairpin_key(*a));
        }
        if let Some(c) = new {
            elem_edit(edit, HAIRPIN_SET)
                .add
                .push((hairpin_key(*a), element(None, &c)));
        }
    }
}

/// One of nodelb's base chains: where it hooks in, and its rules for one family's header.
/// Every base chain accepts what its rules let through.
struct BaseChainSpec {
    name: &'static str,
    chain_type: ChainType,
    hook: Hook,
    priority: i32,
    rules: fn(&IpHeader) -> Vec<Rule>,
}

const fn hooked(
    name: &'static str,
    chain_type: ChainType,
    hook: Hook,
    priority: i32,
    rules: fn(&IpHeader) -> Vec<Rule>,
) -> BaseChainSpec {
    BaseChainSpec {
        name,
        chain_type,
        hook,
        priority,
        rules,
    }
}

/// The chains the kernel's hooks run, as kube-proxy's nftables proxier lists its own. Every
/// other chain is reached from these, through `map services`.
#[rustfmt::skip]
const BASE_CHAINS: [BaseChainSpec; 6] = [
    hooked("prerouting", ChainType::Nat, Hook::Prerouting, DISPATCH_PRIORITY, dispatch_rules),
    hooked("output", ChainType::Nat, Hook::Output, DISPATCH_PRIORITY, dispatch_rules),
    hooked("postrouting", ChainType::Nat, Hook::Postrouting, SRCNAT_PRIORITY, masquerade_rules),
    hooked("forward", ChainType::Filter, Hook::Forward, FILTER_PRIORITY, forward_rules),
    hooked("input", ChainType::Filter, Hook::Input, FILTER_PRIORITY, reject_rules),
    hooked("filter-output", ChainType::Filter, Hook::Output, FILTER_PRIORITY, reject_rules),
];

fn base_chains(t: &mut Table, ip: &IpHeader) {
    for spec in &BASE_CHAINS {
        let mut chain = Chain::base(
            spec.name,
            spec.chain_type,
            spec.hook,
            spec.priority,
            Policy::Accept,
        );
        chain.rules = (spec.rules)(ip);
        t.add_chain(chain);
    }
}

/// nat `prerouting` and `output`: a packet for a Service port goes to that port's chain.
fn dispatch_rules(ip: &IpHeader) -> Vec<Rule> {
    vec![Rule::new(vec![Stmt::Vmap {
        keys: vec![ip.daddr(), L4, TH_DPORT],
        map: SERVICES_MAP.into(),
    }])
    .with_comment("dispatch to Service ports")]
}

/// The packet's protocol is `p`.
fn l4_is(p: Protocol) -> Stmt {
    Stmt::cmp(L4, Value::Proto(p.l4()))
}

/// The packet's connection was DNATed.
fn dnatted() -> Stmt {
    Stmt::AnyBits {
        left: Expr::Ct(CtKey::Status),
        bits: ct_status::DNAT,
    }
}

/// The connection's original destination (before DNAT), as a dispatch key.
fn original_destination() -> Vec<Expr> {
    vec![
        Expr::Ct(CtKey::OriginalDaddr),
        L4,
        Expr::Ct(CtKey::OriginalProtoDst),
    ]
}

/// The connection's original destination is in `set`.
fn original_in(set: &str) -> Stmt {
    Stmt::Lookup {
        keys: original_destination(),
        set: set.into(),
        negate: false,
    }
}

/// `masquerade fully-random`, as kube-proxy masquerades: a fresh random source port for every
/// connection, so datagrams from many clients that reuse one source port (high-rate UDP) do
/// not collide on the node's translated tuple.
const MASQUERADE: Stmt = Stmt::Masquerade { fully_random: true };

/// nat `postrouting`: masquerade the clients of `Cluster` Services, clients on this node and
/// hairpin connections. `ct original proto-dst` needs the protocol matched first, so one rule
/// per protocol.
fn masquerade_rules(ip: &IpHeader) -> Vec<Rule> {
    let mut rules = Vec::new();
    for p in PROTOCOLS {
        rules.push(
            Rule::new(vec![l4_is(p), dnatted(), original_in(MASQ_SET), MASQUERADE])
                .with_comment("Cluster policy: masquerade clients"),
        );
    }
    for p in PROTOCOLS {
        rules.push(
            Rule::new(vec![
                l4_is(p),
                dnatted(),
                Stmt::Lookup {
                    keys: vec![ip.saddr()],
                    set: LOCAL_ADDRESSES_SET.into(),
                    negate: false,
                },
                original_in(LB_SET),
                MASQUERADE,
            ])
            .with_comment("clients on this node: masquerade"),
        );
    }
    for p in PROTOCOLS {
        rules.push(
            Rule::new(vec![
                l4_is(p),
                dnatted(),
                Stmt::Lookup {
                    keys: vec![ip.saddr(), ip.daddr()],
                    set: HAIRPIN_SET.into(),
                    negate: false,
                },
                original_in(LB_SET),
                MASQUERADE,
            ])
            .with_comment("hairpin: masquerade"),
        );
    }
    rules
}

/// Every packet of a DNATed connection, both directions, into its Service port's counter
/// (first in each filter chain: a packet crosses one of them).
fn count_rules() -> Vec<Rule> {
    PROTOCOLS
        .iter()
        .map(|p| {
            Rule::new(vec![
                l4_is(*p),
                dnatted(),
                Stmt::CounterMap {
                    keys: original_destination(),
                    map: COUNTERS_MAP.into(),
                },
            ])
            .with_comment("count Service traffic")
        })
        .collect()
}

/// filter `forward`: count, then accept DNATed traffic of nodelb's Services.
fn forward_rules(_: &IpHeader) -> Vec<Rule> {
    let mut rules = count_rules();
    for p in PROTOCOLS {
        rules.push(
            Rule::new(vec![
                l4_is(p),
                dnatted(),
                original_in(LB_SET),
                Stmt::Verdict(Verdict::Accept),
            ])
            .with_comment("forward DNATed Service traffic"),
        );
    }
    rules
}

/// filter `input` and `filter-output`: count, then reject new connections to Service ports
/// without endpoints (reject is not allowed in prerouting). Only new connections, as
/// kube-proxy's filter rules keyed on an address and port: a reply to the node's own outbound
/// connection whose ephemeral source port happens to be such a Service port is addressed to
/// that address and port too, and must get through, not draw a reset or a port unreachable.
fn reject_rules(ip: &IpHeader) -> Vec<Rule> {
    let no_endpoints = || Stmt::Lookup {
        keys: vec![ip.daddr(), L4, TH_DPORT],
        set: NO_ENDPOINTS_SET.into(),
        negate: false,
    };
    let new_connection = || Stmt::AnyBits {
        left: Expr::Ct(CtKey::State),
        bits: ct_state::NEW,
    };
    let mut rules = count_rules();
    rules.push(
        Rule::new(vec![
            new_connection(),
            Stmt::cmp(L4, Value::Proto(L4Proto::Tcp)),
            no_endpoints(),
            Stmt::Reject(Reject::TcpReset),
        ])
        .with_comment("no endpoints: TCP reset"),
    );
    rules.push(
        Rule::new(vec![
            new_connection(),
            no_endpoints(),
            Stmt::Reject(Reject::PortUnreachable),
        ])
        .with_comment("no endpoints: port unreachable"),
    );
    rules
}
