//! What one Service port adds to a family's table: its elements of the shared sets and maps,
//! its own chains and sets, its counters ([`Part`]).

use super::*;

/// What one Service port does on this node and family.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Action {
    Forward(Vec<EndpointAddr>),
    /// `Local` without a local endpoint: drop, except clients on this node, which go to these
    /// endpoints on other nodes.
    DropExceptNode(Vec<EndpointAddr>),
    Reject,
}

impl Action {
    /// The same endpoints in `order` (their slots in the endpoint map, see `plan::slots`).
    pub fn in_order(self, order: &[EndpointAddr]) -> Action {
        match self {
            Action::Forward(_) => Action::Forward(order.to_vec()),
            Action::DropExceptNode(_) => Action::DropExceptNode(order.to_vec()),
            Action::Reject => Action::Reject,
        }
    }
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
    /// The Service's own sets: its source-range set, its affinity ports' client sets.
    pub sets: SmallMap<Set>,
    /// Endpoint addresses for the shared `hairpin` set, with this Service port's comment.
    pub hairpin: BTreeMap<IpAddr, Arc<str>>,
    /// The Service's counter objects, by name (equal by name and comment only).
    pub counters: SmallMap<Counter>,
    /// The shared chains this Service goes to.
    pub shared_chains: BTreeSet<SharedChain>,
}

/// A chain Service ports share, made only of what names it. Only these bind `map endpoints`:
/// the kernel walks a map's elements each time a new chain binds it, and checks each element
/// added against every rule that binds it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum SharedChain {
    /// `endpoints-N`: one of N endpoints.
    Endpoints(usize),
    /// `slot-I`: the endpoint in slot I (a ClientIP affinity port's pick).
    Slot(usize),
}

impl SharedChain {
    pub fn name(self) -> String {
        match self {
            SharedChain::Endpoints(n) => endpoint_chain_name(n),
            SharedChain::Slot(i) => slot_chain_name(i),
        }
    }

    pub(super) fn chain(self) -> Chain {
        match self {
            SharedChain::Endpoints(n) => endpoint_chain(n),
            SharedChain::Slot(i) => slot_chain(i),
        }
    }
}

/// The shared chain that sends a packet to the endpoint in slot `i` of the Service port it is
/// for.
pub(super) fn slot_chain(i: usize) -> Chain {
    let comment = format!("the endpoint in slot {i}");
    dnat_chain(slot_chain_name(i), Expr::constant(i as u32), comment)
}

/// The shared chain that picks one of `n` endpoints of the Service port the packet is for.
pub(super) fn endpoint_chain(n: usize) -> Chain {
    let comment = format!("one of {n} endpoints");
    dnat_chain(endpoint_chain_name(n), Expr::random(n as u32), comment)
}

/// A chain of one rule: DNAT to `map endpoints`' element `protocol . port . slot`.
fn dnat_chain(name: String, slot: Expr, comment: String) -> Chain {
    Chain::regular(name).rule(
        Rule::new(vec![Stmt::NatMap {
            kind: NatKind::Dnat,
            keys: vec![L4, TH_DPORT, slot],
            map: ENDPOINTS_MAP.into(),
        }])
        .with_comment(comment),
    )
}

/// The rules that keep a client on one of `n` endpoints of a Service port with ClientIP
/// affinity, or pick one for it and remember it in the port's own set `set`: the slot a
/// client was sent to is in it as `client . slot`, and the shared chain `slot-I` sends a
/// packet to `map endpoints`' element `protocol . port . I`, as `endpoints-N` picks them. The
/// slot is written `numgen random mod 1 offset i`: a constant nft prints inside a
/// concatenation. Noted in `part`: the shared chains they go to.
pub(super) fn affinity_rules(
    part: &mut Part,
    ip: &IpHeader,
    set: &str,
    n: usize,
    note: &str,
) -> Vec<Rule> {
    let client = |i: usize| vec![ip.saddr(), Expr::constant(i as u32)];
    let remember = |i: usize| Stmt::SetUpdate {
        keys: client(i),
        set: set.into(),
        timeout: None,
    };
    let to_slot = |i: usize| Stmt::Verdict(Verdict::Goto(slot_chain_name(i)));
    let mut rules = Vec::with_capacity(2 * n + 1);
    for i in 0..n {
        let known = Stmt::Lookup {
            keys: client(i),
            set: set.into(),
            negate: false,
        };
        rules.push(
            Rule::new(vec![known, remember(i), to_slot(i)])
                .with_comment(format!("{note}: a client kept on endpoint {i} of {n}")),
        );
    }
    // Endpoint i of n when a draw of n - i comes up 0: each is picked with chance 1/n (the
    // first 1/n, the next (n-1)/n * 1/(n-1), ...). Remembering a new client fails only when
    // the set is full, which stops that rule; the last rule still sends it somewhere.
    for i in 0..n {
        let mut stmts = Vec::with_capacity(3);
        if n - i > 1 {
            let draw = Expr::random((n - i) as u32);
            stmts.push(Stmt::cmp(draw, Value::U32(0)));
        }
        stmts.extend([remember(i), to_slot(i)]);
        rules.push(
            Rule::new(stmts).with_comment(format!("{note}: a new client to endpoint {i} of {n}")),
        );
    }
    rules.push(
        Rule::new(vec![Stmt::Verdict(Verdict::Goto(endpoint_chain_name(n)))]).with_comment(
            format!("{note}: one of {n} endpoints, not remembered: {set} is full"),
        ),
    );
    part.shared_chains.extend((0..n).map(SharedChain::Slot));
    part.shared_chains.insert(SharedChain::Endpoints(n));
    rules
}

/// The most clients one Service port's affinity set holds, as many as one of kube-proxy's
/// per-endpoint sets (a set a rule fills holds 65,535 when it declares no size). Each costs
/// the kernel about 165 bytes (100,000 took 16.5 MB of slab), so a full set about 10.3 MiB.
/// A multiple of 65,536: the kernel sizes a set's first hash table from a 16-bit hint, which
/// this leaves at its smallest, where 65,535 would allocate about 2 MiB up front for every
/// affinity port.
pub const AFFINITY_CLIENTS: u32 = 1 << 16;

/// The dynamic set of the clients one Service port's ClientIP affinity keeps for `timeout`
/// seconds.
pub(super) fn affinity_clients(ip: &IpHeader, name: &str, timeout: u32, note: &str) -> Set {
    let slot = Expr::random(1);
    Set::new(name, SetType::Typeof(vec![ip.saddr(), slot]))
        .dynamic(Duration::from_secs(timeout.into()))
        .with_size(AFFINITY_CLIENTS)
        .with_comment(format!(
            "{note}: client . endpoint slot, ClientIP affinity for {timeout} s"
        ))
}

/// A few named items (a Service's chains or counters: one to three), sorted by name in a
/// vector; a map would allocate room for eleven per Service.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SmallMap<V>(pub(super) Vec<(String, V)>);

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
    add_endpoints(part, p, &note, eps, hairpin);
    let n = eps.len();
    let last = match (p.affinity, local_only) {
        (Some(a), local_only) => Last::Affinity {
            timeout: a.timeout_seconds,
            n,
            local_only,
        },
        (None, true) => Last::DropExceptNode(n),
        (None, false) => Last::Dnat(n),
    };
    let target = match last {
        // Nothing to check first: the dispatch goes to the shared chain itself.
        Last::Dnat(n) if p.source_ranges.is_none() => {
            part.shared_chains.insert(SharedChain::Endpoints(n));
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
pub(super) fn add_rejecting_port(
    part: &mut Part,
    ip: &IpHeader,
    p: &PortProgram<'_>,
    note: &Arc<str>,
) {
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
pub(super) fn add_endpoints(
    part: &mut Part,
    p: &PortProgram<'_>,
    note: &Arc<str>,
    eps: &[EndpointAddr],
    hairpin: bool,
) {
    // Built apart and appended: the keys come in order, so the map is built in one pass,
    // where inserting each would search it (a Service may have thousands of endpoints).
    let mut elements: BTreeMap<_, _> = eps
        .iter()
        .enumerate()
        .map(|(i, e)| {
            let key = Key::Values(
                [
                    Value::Proto(p.port.protocol.l4()),
                    Value::Port(p.port.port),
                    Value::U32(i as u32),
                ]
                .into(),
            );
            let data = ElemData::Values([value(e.addr), Value::Port(e.port)].into());
            ((ENDPOINTS_MAP, key), element(Some(data), note))
        })
        .collect();
    part.elements.append(&mut elements);
    if hairpin {
        for e in eps {
            part.hairpin.entry(e.addr).or_insert_with(|| note.clone());
        }
    }
}

/// How a Service port's chain ends, after the source-range check.
pub(super) enum Last {
    /// DNAT to one of `n` endpoints.
    Dnat(usize),
    /// `Local` policy without a local endpoint: clients on this node DNAT to one of `n`
    /// endpoints elsewhere, everyone else is dropped.
    DropExceptNode(usize),
    /// ClientIP affinity (`timeout` seconds) among `n` endpoints, the port's own set
    /// remembering its clients; `local_only`: as [`Last::DropExceptNode`], only this node's
    /// own clients get that far.
    Affinity {
        timeout: u32,
        n: usize,
        local_only: bool,
    },
    /// Nothing: allowed clients go on (to the no-endpoints reject).
    Nothing,
}

/// The chain of one Service port: source ranges, then what `last` says. Returns its name.
pub(super) fn service_port_chain(
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
    chain.rules.extend(last_rules(part, ip, p, note, last));
    // The committed table keeps one such chain per Service port: no spare room.
    chain.rules.shrink_to_fit();
    part.chains.insert(name.clone(), chain);
    name
}

/// The rule that drops (and counts) clients outside the Service's source ranges, with the
/// Service's source-range set and drop counter.
pub(super) fn source_range_rule(
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

/// The rules that end a Service port's chain (noting the shared chains they go to, and adding
/// the port's affinity set).
pub(super) fn last_rules(
    part: &mut Part,
    ip: &IpHeader,
    p: &PortProgram<'_>,
    note: &str,
    last: Last,
) -> Vec<Rule> {
    let from_node = |negate| Stmt::Lookup {
        keys: vec![ip.saddr()],
        set: LOCAL_ADDRESSES_SET.into(),
        negate,
    };
    let count_and = |v: Verdict| vec![Stmt::counter(), Stmt::Verdict(v)];
    let drop_note = || format!("{note}: Local policy, no endpoint on this node");
    let drop_rule = || Rule::new(count_and(Verdict::Drop)).with_comment(drop_note());
    let node_note = || format!("{note}: Local policy, this node's own clients");
    match last {
        Last::Dnat(n) => {
            part.shared_chains.insert(SharedChain::Endpoints(n));
            let goto = Verdict::Goto(endpoint_chain_name(n));
            vec![Rule::new(count_and(goto)).with_comment(note)]
        }
        Last::DropExceptNode(n) => {
            part.shared_chains.insert(SharedChain::Endpoints(n));
            let mut stmts = vec![from_node(false)];
            stmts.extend(count_and(Verdict::Goto(endpoint_chain_name(n))));
            vec![Rule::new(stmts).with_comment(node_note()), drop_rule()]
        }
        Last::Affinity {
            timeout,
            n,
            local_only,
        } => {
            let set = affinity_set(p.service, p.port);
            let mut rules = Vec::with_capacity(2 * n + 2);
            if local_only {
                let mut stmts = vec![from_node(true)];
                stmts.extend(count_and(Verdict::Drop));
                rules.push(Rule::new(stmts).with_comment(drop_note()));
            }
            rules.extend(affinity_rules(part, ip, &set, n, note));
            part.sets
                .insert(set.clone(), affinity_clients(ip, &set, timeout, note));
            rules
        }
        Last::Nothing => Vec::new(),
    }
}
