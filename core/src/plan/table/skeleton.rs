//! What every table has whatever its Services: the shared sets and maps declared, the base
//! chains and their fixed rules (dispatch, masquerade, counting, forward, reject), the host's
//! addresses.

use super::*;

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
            SetType::Typeof(vec![L4, TH_DPORT, Expr::random(1)]),
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

/// One of nodelb's base chains: where it hooks in, and its rules for one family's header.
/// Every base chain accepts what its rules let through.
pub(super) struct BaseChainSpec {
    name: &'static str,
    chain_type: ChainType,
    hook: Hook,
    priority: i32,
    rules: fn(&IpHeader) -> Vec<Rule>,
}

pub(super) const fn hooked(
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
pub(super) const BASE_CHAINS: [BaseChainSpec; 6] = [
    hooked("prerouting", ChainType::Nat, Hook::Prerouting, DISPATCH_PRIORITY, dispatch_rules),
    hooked("output", ChainType::Nat, Hook::Output, DISPATCH_PRIORITY, dispatch_rules),
    hooked("postrouting", ChainType::Nat, Hook::Postrouting, SRCNAT_PRIORITY, masquerade_rules),
    hooked("forward", ChainType::Filter, Hook::Forward, FILTER_PRIORITY, forward_rules),
    hooked("input", ChainType::Filter, Hook::Input, FILTER_PRIORITY, reject_rules),
    hooked("filter-output", ChainType::Filter, Hook::Output, FILTER_PRIORITY, reject_rules),
];

pub(super) fn base_chains(t: &mut Table, ip: &IpHeader) {
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
pub(super) fn dispatch_rules(ip: &IpHeader) -> Vec<Rule> {
    vec![Rule::new(vec![Stmt::Vmap {
        keys: vec![ip.daddr(), L4, TH_DPORT],
        map: SERVICES_MAP.into(),
    }])
    .with_comment("dispatch to Service ports")]
}

/// The packet's connection was DNATed.
pub(super) fn dnatted() -> Stmt {
    Stmt::AnyBits {
        left: Expr::Ct(CtKey::Status),
        bits: ct_status::DNAT,
    }
}

/// The connection's original destination (before DNAT), as a dispatch key.
pub(super) fn original_destination() -> Vec<Expr> {
    vec![
        Expr::Ct(CtKey::OriginalDaddr),
        L4,
        Expr::Ct(CtKey::OriginalProtoDst),
    ]
}

/// The connection's original destination is in `set`.
pub(super) fn original_in(set: &str) -> Stmt {
    Stmt::Lookup {
        keys: original_destination(),
        set: set.into(),
        negate: false,
    }
}

/// `masquerade fully-random`, as kube-proxy masquerades: a fresh random source port for every
/// connection, so datagrams from many clients that reuse one source port (high-rate UDP) do
/// not collide on the node's translated tuple.
pub(super) const MASQUERADE: Stmt = Stmt::Masquerade { fully_random: true };

/// nat `postrouting`: masquerade the clients of `Cluster` Services, clients on this node and
/// hairpin connections. `ct original proto-dst` needs the protocol matched first, so one rule
/// per protocol.
pub(super) fn masquerade_rules(ip: &IpHeader) -> Vec<Rule> {
    let lookup = |keys, set: &str| Stmt::Lookup {
        keys,
        set: set.into(),
        negate: false,
    };
    let kinds = [
        (
            vec![original_in(MASQ_SET)],
            "Cluster policy: masquerade clients",
        ),
        (
            vec![
                lookup(vec![ip.saddr()], LOCAL_ADDRESSES_SET),
                original_in(LB_SET),
            ],
            "clients on this node: masquerade",
        ),
        (
            vec![
                lookup(vec![ip.saddr(), ip.daddr()], HAIRPIN_SET),
                original_in(LB_SET),
            ],
            "hairpin: masquerade",
        ),
    ];
    let mut rules = Vec::new();
    for (matches, comment) in kinds {
        for p in PROTOCOLS {
            let mut stmts = vec![l4_is(p), dnatted()];
            stmts.extend(matches.iter().cloned());
            stmts.push(MASQUERADE);
            rules.push(Rule::new(stmts).with_comment(comment));
        }
    }
    rules
}

/// Every packet of a DNATed connection, both directions, into its Service port's counter
/// (first in each filter chain: a packet crosses one of them).
pub(super) fn count_rules() -> Vec<Rule> {
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
pub(super) fn forward_rules(_: &IpHeader) -> Vec<Rule> {
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
pub(super) fn reject_rules(ip: &IpHeader) -> Vec<Rule> {
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
