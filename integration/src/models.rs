//! Models shared by the differential tests, the dataplane tests and the benchmark.

use nodelb_netfilter::*;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

/// Addresses and field spellings for one family.
#[derive(Clone, Copy, Debug)]
pub struct Fam {
    pub family: Family,
}

impl Fam {
    pub const V4: Fam = Fam { family: Family::Ip };
    pub const V6: Fam = Fam {
        family: Family::Ip6,
    };

    pub fn saddr(self) -> Expr {
        Expr::Payload(if self.v6() {
            Payload::Ip6Saddr
        } else {
            Payload::IpSaddr
        })
    }
    pub fn daddr(self) -> Expr {
        Expr::Payload(if self.v6() {
            Payload::Ip6Daddr
        } else {
            Payload::IpDaddr
        })
    }
    pub fn proto(self) -> Expr {
        Expr::Payload(if self.v6() {
            Payload::Ip6Nexthdr
        } else {
            Payload::IpProtocol
        })
    }
    pub fn addr_type(self) -> DataType {
        if self.v6() {
            DataType::Ipv6Addr
        } else {
            DataType::Ipv4Addr
        }
    }
    pub fn v6(self) -> bool {
        self.family == Family::Ip6
    }
    /// A documentation address: `net` picks 192.0.2/198.51.100/203.0.113 (v4) or
    /// 2001:db8:<net>:: (v6), `host` the last part.
    pub fn addr(self, net: u8, host: u16) -> IpAddr {
        if self.v6() {
            IpAddr::V6(Ipv6Addr::new(0x2001, 0xdb8, net as u16, 0, 0, 0, 0, host))
        } else {
            let (a, b, c) = match net {
                0 => (192, 0, 2),
                1 => (198, 51, 100),
                _ => (203, 0, 113),
            };
            IpAddr::V4(Ipv4Addr::new(a, b, c, host as u8))
        }
    }
    pub fn prefix_len(self) -> u8 {
        if self.v6() {
            64
        } else {
            24
        }
    }
}

fn v(ip: IpAddr) -> Value {
    Value::from(ip)
}

fn rule(stmts: Vec<Stmt>) -> Rule {
    Rule::new(stmts)
}

fn verdict(v: Verdict) -> Stmt {
    Stmt::Verdict(v)
}

/// A table that uses every expression, statement and object kind the model has, in one family.
pub fn kitchen_sink(f: Fam, name: &str) -> Table {
    let mut t = Table::new(f.family, name);
    let th_dport = Expr::Payload(Payload::ThDport);
    let l4 = Expr::Meta(MetaKey::L4Proto);

    let mut allowed = Set::new("allowed", SetType::Type(vec![f.addr_type()])).interval();
    allowed.insert(
        Key::Prefix(f.addr(0, 0), f.prefix_len()),
        None,
        Some("clients".into()),
    );
    allowed.insert(
        Key::Prefix(f.addr(1, 7), if f.v6() { 128 } else { 32 }),
        None,
        None,
    );
    t.add_set(allowed);

    let mut sources = Set::new("sources", SetType::Typeof(vec![f.saddr()]))
        .interval()
        .with_comment("typeof interval");
    sources.insert(
        Key::Prefix(f.addr(2, 0), if f.v6() { 56 } else { 25 }),
        None,
        None,
    );
    t.add_set(sources);

    let mut services = Set::map(
        "services",
        SetType::Type(vec![
            f.addr_type(),
            DataType::InetProto,
            DataType::InetService,
        ]),
        MapData::Verdict,
    )
    .with_comment("dispatch");
    services.insert(
        Key::Values(vec![v(f.addr(2, 1)), Value::Proto(L4Proto::Tcp), Value::Port(80)].into()),
        Some(ElemData::Verdict(Verdict::Goto("svc-a".into()))),
        Some("default/web:http".into()),
    );
    services.insert(
        Key::Values(vec![v(f.addr(2, 1)), Value::Proto(L4Proto::Udp), Value::Port(53)].into()),
        Some(ElemData::Verdict(Verdict::Jump("svc-b".into()))),
        None,
    );
    t.add_set(services);

    let mut endpoints = Set::map(
        "endpoints",
        SetType::Typeof(vec![l4, th_dport, Expr::Numgen { modulus: 2 }]),
        MapData::Value(SetType::Typeof(vec![f.daddr(), th_dport])),
    );
    for i in 0..2u32 {
        endpoints.insert(
            Key::Values(vec![Value::Proto(L4Proto::Tcp), Value::Port(80), Value::U32(i)].into()),
            Some(ElemData::Values(
                vec![v(f.addr(1, 10 + i as u16)), Value::Port(8080)].into(),
            )),
            Some(format!("default/web:http endpoint {i}").into()),
        );
    }
    t.add_set(endpoints);

    // A verdict map declared with typeof, with elements (ClientIP affinity's random pick).
    let mut pick = Set::map(
        "pick",
        SetType::Typeof(vec![l4, th_dport, Expr::Numgen { modulus: 1 }]),
        MapData::Verdict,
    )
    .with_comment("protocol . port . random index: the endpoint's chain");
    for i in 0..2u32 {
        pick.insert(
            Key::Values(vec![Value::Proto(L4Proto::Tcp), Value::Port(80), Value::U32(i)].into()),
            Some(ElemData::Verdict(Verdict::Goto("sticky".into()))),
            Some("default/web:http".into()),
        );
    }
    t.add_set(pick);

    // Filled by packets: ClientIP session affinity's per-endpoint client sets.
    t.add_set(
        Set::new("clients", SetType::Type(vec![f.addr_type()]))
            .dynamic(std::time::Duration::from_secs(10_800))
            .with_comment("default/web:http"),
    );
    t.add_set(
        Set::new("clients-brief", SetType::Typeof(vec![f.saddr()]))
            .dynamic(std::time::Duration::from_millis(2_500)),
    );

    let mut marks = Set::new("marks", SetType::Type(vec![DataType::Mark]));
    marks.insert(Key::Values(vec![Value::U32(1)].into()), None, None);
    t.add_set(marks);

    let mut ports = Set::new("ports", SetType::Typeof(vec![th_dport]));
    ports.insert(
        Key::Values(vec![Value::Port(22)].into()),
        None,
        Some("ssh".into()),
    );
    ports.insert(Key::Values(vec![Value::Port(6443)].into()), None, None);
    t.add_set(ports);

    let mut portmap = Set::map(
        "portmap",
        SetType::Type(vec![DataType::InetService]),
        MapData::Verdict,
    );
    portmap.insert(
        Key::Values(vec![Value::Port(443)].into()),
        Some(ElemData::Verdict(Verdict::Accept)),
        None,
    );
    portmap.insert(
        Key::Values(vec![Value::Port(444)].into()),
        Some(ElemData::Verdict(Verdict::Drop)),
        None,
    );
    t.add_set(portmap);

    let mut addrmap = Set::map(
        "addrmap",
        SetType::Type(vec![f.addr_type()]),
        MapData::Value(SetType::Type(vec![f.addr_type()])),
    );
    addrmap.insert(
        Key::Values(vec![v(f.addr(2, 5))].into()),
        Some(ElemData::Values(vec![v(f.addr(1, 5))].into())),
        None,
    );
    t.add_set(addrmap);

    let mut pre = Chain::base(
        "prerouting",
        ChainType::Nat,
        Hook::Prerouting,
        -100,
        Policy::Accept,
    );
    pre.push(
        rule(vec![Stmt::Vmap {
            keys: vec![f.daddr(), l4, th_dport],
            map: "services".into(),
        }])
        .with_comment("dispatch by destination"),
    );
    pre.push(rule(vec![
        Stmt::Lookup {
            keys: vec![f.saddr()],
            set: "allowed".into(),
            negate: true,
        },
        Stmt::counter(),
        verdict(Verdict::Drop),
    ]));
    pre.push(rule(vec![
        Stmt::Cmp {
            left: Expr::Payload(Payload::TcpDport),
            op: CmpOp::Eq,
            right: Value::Port(8081),
        },
        Stmt::Nat {
            kind: NatKind::Dnat,
            addr: f.addr(1, 2),
            port: Some(80),
        },
    ]));
    pre.push(rule(vec![
        Stmt::Cmp {
            left: Expr::Payload(Payload::UdpDport),
            op: CmpOp::Eq,
            right: Value::Port(5353),
        },
        Stmt::Nat {
            kind: NatKind::Dnat,
            addr: f.addr(1, 2),
            port: None,
        },
    ]));
    pre.push(rule(vec![
        Stmt::Cmp {
            left: Expr::Payload(Payload::SctpDport),
            op: CmpOp::Neq,
            right: Value::Port(9),
        },
        verdict(Verdict::Return),
    ]));
    t.add_chain(pre);

    t.add_chain(
        Chain::regular("svc-a").rule(
            rule(vec![Stmt::NatMap {
                kind: NatKind::Dnat,
                keys: vec![l4, th_dport, Expr::Numgen { modulus: 2 }],
                map: "endpoints".into(),
            }])
            .with_comment("default/web:http"),
        ),
    );
    // A client that was here before keeps its endpoint; one that is new is remembered.
    t.add_chain(
        Chain::regular("sticky")
            .rule(
                rule(vec![
                    Stmt::Lookup {
                        keys: vec![f.saddr()],
                        set: "clients".into(),
                        negate: false,
                    },
                    Stmt::counter(),
                    verdict(Verdict::Goto("svc-b".into())),
                ])
                .with_comment("default/web:http"),
            )
            .rule(
                rule(vec![Stmt::SetUpdate {
                    keys: vec![f.saddr()],
                    set: "clients".into(),
                    timeout: Some(std::time::Duration::from_secs(10_800)),
                }])
                .with_comment("default/web:http"),
            )
            .rule(rule(vec![Stmt::SetUpdate {
                keys: vec![f.saddr()],
                set: "clients-brief".into(),
                timeout: None,
            }]))
            // A pick among endpoints by independent draws.
            .rule(rule(vec![
                Stmt::cmp(Expr::Numgen { modulus: 3 }, Value::U32(0)),
                Stmt::counter(),
                verdict(Verdict::Goto("svc-a".into())),
            ]))
            .rule(rule(vec![verdict(Verdict::Goto("svc-b".into()))])),
    );
    t.add_chain(Chain::regular("pick-2").rule(rule(vec![Stmt::Vmap {
        keys: vec![l4, th_dport, Expr::Numgen { modulus: 2 }],
        map: "pick".into(),
    }])));
    t.add_chain(Chain::regular("svc-b").rule(rule(vec![
        Stmt::cmp(l4, Value::Proto(L4Proto::Udp)),
        Stmt::Nat {
            kind: NatKind::Dnat,
            addr: f.addr(1, 3),
            port: Some(5353),
        },
    ])));

    let mut out = Chain::base("output", ChainType::Nat, Hook::Output, -100, Policy::Accept);
    out.push(rule(vec![
        Stmt::Cmp {
            left: Expr::Payload(Payload::TcpSport),
            op: CmpOp::Eq,
            right: Value::Port(1),
        },
        verdict(Verdict::Accept),
    ]));
    out.push(rule(vec![
        Stmt::Cmp {
            left: Expr::Payload(Payload::UdpSport),
            op: CmpOp::Eq,
            right: Value::Port(2),
        },
        verdict(Verdict::Accept),
    ]));
    out.push(rule(vec![
        Stmt::Cmp {
            left: Expr::Payload(Payload::SctpSport),
            op: CmpOp::Eq,
            right: Value::Port(3),
        },
        verdict(Verdict::Accept),
    ]));
    t.add_chain(out);

    let mut post = Chain::base(
        "postrouting",
        ChainType::Nat,
        Hook::Postrouting,
        100,
        Policy::Accept,
    );
    post.push(rule(vec![
        Stmt::AnyBits {
            left: Expr::Ct(CtKey::Status),
            bits: ct_status::DNAT,
        },
        Stmt::Masquerade {
            fully_random: false,
        },
    ]));
    post.push(rule(vec![
        Stmt::Masked {
            left: Expr::Meta(MetaKey::Mark),
            mask: 0x4000,
            value: 0x4000,
        },
        Stmt::Masquerade { fully_random: true },
    ]));
    post.push(rule(vec![
        Stmt::cmp(Expr::Ct(CtKey::Mark), Value::U32(1)),
        Stmt::cmp(l4, Value::Proto(L4Proto::Tcp)),
        Stmt::Nat {
            kind: NatKind::Snat,
            addr: f.addr(2, 1),
            port: Some(1000),
        },
    ]));
    t.add_chain(post);

    let mut fwd = Chain::base(
        "forward",
        ChainType::Filter,
        Hook::Forward,
        0,
        Policy::Accept,
    );
    fwd.push(rule(vec![
        Stmt::AnyBits {
            left: Expr::Ct(CtKey::State),
            bits: ct_state::ESTABLISHED | ct_state::RELATED,
        },
        verdict(Verdict::Accept),
    ]));
    fwd.push(rule(vec![
        Stmt::cmp(l4, Value::Proto(L4Proto::Tcp)),
        Stmt::cmp(Expr::Ct(CtKey::OriginalDaddr), v(f.addr(2, 1))),
        Stmt::cmp(Expr::Ct(CtKey::OriginalProtoDst), Value::Port(80)),
        Stmt::counter(),
        verdict(Verdict::Accept),
    ]));
    fwd.push(rule(vec![
        Stmt::cmp(l4, Value::Proto(L4Proto::Udp)),
        Stmt::Reject(Reject::PortUnreachable),
    ]));
    fwd.push(rule(vec![
        Stmt::cmp(Expr::Payload(Payload::TcpDport), Value::Port(81)),
        Stmt::Reject(Reject::TcpReset),
    ]));
    fwd.push(rule(vec![Stmt::MarkOr(0x4000)]));
    fwd.push(rule(vec![
        Stmt::cmp(Expr::Meta(MetaKey::Mark), Value::U32(0x10)),
        verdict(Verdict::Drop),
    ]));
    fwd.push(rule(vec![
        Stmt::Lookup {
            keys: vec![Expr::Meta(MetaKey::Mark)],
            set: "marks".into(),
            negate: false,
        },
        verdict(Verdict::Accept),
    ]));
    fwd.push(rule(vec![
        Stmt::Lookup {
            keys: vec![th_dport],
            set: "ports".into(),
            negate: false,
        },
        verdict(Verdict::Jump("count".into())),
    ]));
    fwd.push(rule(vec![
        Stmt::Lookup {
            keys: vec![f.saddr()],
            set: "sources".into(),
            negate: false,
        },
        verdict(Verdict::Goto("count".into())),
    ]));
    fwd.push(rule(vec![Stmt::Vmap {
        keys: vec![th_dport],
        map: "portmap".into(),
    }]));
    fwd.push(rule(vec![
        Stmt::cmp(f.proto(), Value::Proto(L4Proto::Tcp)),
        Stmt::AnonVmap {
            keys: vec![Expr::Numgen { modulus: 2 }],
            map: AnonVmap {
                elements: vec![
                    (vec![Value::U32(0)], Verdict::Jump("count".into())),
                    (vec![Value::U32(1)], Verdict::Return),
                ],
            },
        },
    ]));
    fwd.push(rule(vec![Stmt::AnonVmap {
        keys: vec![f.daddr(), th_dport],
        map: AnonVmap {
            elements: vec![(vec![v(f.addr(1, 9)), Value::Port(9)], Verdict::Drop)],
        },
    }]));
    fwd.push(rule(vec![
        Stmt::cmp(f.saddr(), v(f.addr(0, 9))),
        Stmt::Cmp {
            left: f.daddr(),
            op: CmpOp::Neq,
            right: v(f.addr(1, 9)),
        },
        verdict(Verdict::Drop),
    ]));
    // Named counters: seeded values, a comment, a counter map naming them, and rules counting
    // into one by name and into the map's by key.
    let mut web = Counter::new("svc/default/web/http").with_comment("default/web:http");
    web.packets = 42;
    web.bytes = 4200;
    t.add_counter(web);
    t.add_counter(Counter::new("drops/default/web/http"));
    let mut counters = Set::map(
        "svc-counters",
        SetType::Type(vec![
            f.addr_type(),
            DataType::InetProto,
            DataType::InetService,
        ]),
        MapData::Counter,
    )
    .with_comment("service counters");
    counters.insert(
        Key::Values(vec![v(f.addr(1, 1)), Value::Proto(L4Proto::Tcp), Value::Port(80)].into()),
        Some(ElemData::Counter("svc/default/web/http".into())),
        Some("default/web:http".into()),
    );
    counters.insert(
        Key::Values(vec![v(f.addr(1, 2)), Value::Proto(L4Proto::Tcp), Value::Port(80)].into()),
        Some(ElemData::Counter("svc/default/web/http".into())),
        None,
    );
    t.add_set(counters);
    fwd.push(
        rule(vec![
            Stmt::cmp(l4, Value::Proto(L4Proto::Tcp)),
            Stmt::AnyBits {
                left: Expr::Ct(CtKey::Status),
                bits: ct_status::DNAT,
            },
            Stmt::CounterMap {
                keys: vec![
                    Expr::Ct(CtKey::OriginalDaddr),
                    l4,
                    Expr::Ct(CtKey::OriginalProtoDst),
                ],
                map: "svc-counters".into(),
            },
        ])
        .with_comment("count Service traffic"),
    );
    fwd.push(rule(vec![
        Stmt::Lookup {
            keys: vec![f.saddr()],
            set: "allowed".into(),
            negate: true,
        },
        Stmt::CounterRef("drops/default/web/http".into()),
        verdict(Verdict::Drop),
    ]));
    t.add_chain(fwd);

    t.add_chain(Chain::regular("count").rule(rule(vec![
        Stmt::Counter {
            packets: 7,
            bytes: 700,
        },
        verdict(Verdict::Return),
    ])));

    let mut input = Chain::base("input", ChainType::Filter, Hook::Input, 10, Policy::Drop);
    input.push(rule(vec![
        Stmt::cmp(Expr::Payload(Payload::ThSport), Value::Port(7)),
        verdict(Verdict::Accept),
    ]));
    t.add_chain(input);
    t
}

/// An `inet` table for what only `inet` can say (`meta nfproto`, ICMPX reject).
pub fn inet_sink(name: &str) -> Table {
    let mut t = Table::new(Family::Inet, name);
    let mut c = Chain::base("input", ChainType::Filter, Hook::Input, 0, Policy::Accept);
    c.push(Rule::new(vec![
        Stmt::cmp(Expr::Meta(MetaKey::NfProto), Value::NfProto(Family::Ip)),
        Stmt::cmp(Expr::Meta(MetaKey::L4Proto), Value::Proto(L4Proto::Tcp)),
        Stmt::Verdict(Verdict::Accept),
    ]));
    c.push(Rule::new(vec![
        Stmt::cmp(Expr::Meta(MetaKey::NfProto), Value::NfProto(Family::Ip6)),
        Stmt::Reject(Reject::PortUnreachable),
    ]));
    c.push(Rule::new(vec![
        Stmt::cmp(
            Expr::Payload(Payload::IpSaddr),
            Value::Ipv4(Ipv4Addr::new(192, 0, 2, 1)),
        ),
        Stmt::Verdict(Verdict::Drop),
    ]));
    c.push(Rule::new(vec![
        Stmt::cmp(
            Expr::Payload(Payload::Ip6Daddr),
            Value::Ipv6("2001:db8::1".parse().unwrap()),
        ),
        Stmt::Verdict(Verdict::Drop),
    ]));
    c.push(Rule::new(vec![
        Stmt::cmp(Expr::Meta(MetaKey::L4Proto), Value::Proto(L4Proto::Udp)),
        Stmt::Reject(Reject::PortUnreachable),
    ]));
    t.add_chain(c);
    let mut nat = Chain::base(
        "pre",
        ChainType::Nat,
        Hook::Prerouting,
        -100,
        Policy::Accept,
    );
    nat.push(Rule::new(vec![
        Stmt::cmp(
            Expr::Payload(Payload::IpDaddr),
            Value::Ipv4(Ipv4Addr::new(203, 0, 113, 1)),
        ),
        Stmt::cmp(Expr::Payload(Payload::TcpDport), Value::Port(80)),
        Stmt::Nat {
            kind: NatKind::Dnat,
            addr: IpAddr::V4(Ipv4Addr::new(198, 51, 100, 2)),
            port: Some(8080),
        },
    ]));
    t.add_chain(nat);
    t
}

/// One Service port as the dataplane sees it, for the load-balancer shaped model below.
#[derive(Clone, Debug)]
pub struct LbService {
    /// `namespace/name:port`, the comment on every rule and element of this Service.
    pub key: String,
    pub proto: L4Proto,
    pub port: u16,
    pub endpoints: Vec<(IpAddr, u16)>,
    /// Rewrite the client's source to the node's address.
    pub masquerade: bool,
    /// Allowed client prefixes; empty allows everyone.
    pub source_ranges: Vec<(IpAddr, u8)>,
}

/// Name of the regular chain that picks one of `n` endpoints.
pub fn endpoint_chain(n: usize) -> String {
    format!("endpoints-{n}")
}

/// The load-balancer shape nodelb programs: one dispatch verdict map keyed
/// `daddr . l4proto . dport`, one global endpoint map keyed `l4proto . dport . numgen`, one small
/// chain per distinct endpoint count, masquerade decided from conntrack's original
/// destination, rejects in filter hooks every kernel from 5.10 allows.
pub fn lb_table(f: Fam, name: &str, node_addrs: &[IpAddr], services: &[LbService]) -> Table {
    let mut t = Table::new(f.family, name);
    let l4 = Expr::Meta(MetaKey::L4Proto);
    let th_dport = Expr::Payload(Payload::ThDport);
    let svc_key = || {
        SetType::Type(vec![
            f.addr_type(),
            DataType::InetProto,
            DataType::InetService,
        ])
    };

    let mut dispatch = Set::map("services", svc_key(), MapData::Verdict);
    let mut endpoints = Set::map(
        "endpoints",
        SetType::Typeof(vec![l4, th_dport, Expr::Numgen { modulus: 1 }]),
        MapData::Value(SetType::Typeof(vec![f.daddr(), th_dport])),
    );
    let mut masq = Set::new("masq-services", svc_key());
    let mut no_endpoints = Set::new("no-endpoints", svc_key());
    let mut counts = std::collections::BTreeSet::new();

    for (i, s) in services.iter().enumerate() {
        let n = s.endpoints.len();
        for (idx, (addr, port)) in s.endpoints.iter().enumerate() {
            endpoints.insert(
                Key::Values(
                    vec![
                        Value::Proto(s.proto),
                        Value::Port(s.port),
                        Value::U32(idx as u32),
                    ]
                    .into(),
                ),
                Some(ElemData::Values(vec![v(*addr), Value::Port(*port)].into())),
                Some(s.key.as_str().into()),
            );
        }
        let target = if n == 0 {
            None
        } else if s.source_ranges.is_empty() {
            counts.insert(n);
            Some(endpoint_chain(n))
        } else {
            counts.insert(n);
            let set = format!("sources-{i}");
            let mut src = Set::new(&set, SetType::Type(vec![f.addr_type()])).interval();
            for (a, l) in &s.source_ranges {
                src.insert(Key::Prefix(*a, *l), None, None);
            }
            t.add_set(src);
            let chain = format!("firewall-{i}");
            t.add_chain(
                Chain::regular(&chain).rule(
                    rule(vec![
                        Stmt::Lookup {
                            keys: vec![f.saddr()],
                            set,
                            negate: true,
                        },
                        Stmt::counter(),
                        verdict(Verdict::Drop),
                    ])
                    .with_comment(&s.key),
                ),
            );
            t.chain_mut(&chain)
                .expect("added")
                .push(rule(vec![verdict(Verdict::Goto(endpoint_chain(n)))]));
            Some(chain)
        };
        for addr in node_addrs {
            let key =
                Key::Values(vec![v(*addr), Value::Proto(s.proto), Value::Port(s.port)].into());
            match &target {
                Some(chain) => {
                    dispatch.insert(
                        key.clone(),
                        Some(ElemData::Verdict(Verdict::Goto(chain.clone()))),
                        Some(s.key.as_str().into()),
                    );
                    if s.masquerade {
                        masq.insert(key, None, Some(s.key.as_str().into()));
                    }
                }
                None => no_endpoints.insert(key, None, Some(s.key.as_str().into())),
            }
        }
    }
    for n in counts {
        t.add_chain(
            Chain::regular(endpoint_chain(n)).rule(rule(vec![Stmt::NatMap {
                kind: NatKind::Dnat,
                keys: vec![l4, th_dport, Expr::Numgen { modulus: n as u32 }],
                map: "endpoints".into(),
            }])),
        );
    }
    t.add_set(dispatch);
    t.add_set(endpoints);
    t.add_set(masq);
    t.add_set(no_endpoints);

    let dispatch_rule = || {
        rule(vec![Stmt::Vmap {
            keys: vec![f.daddr(), l4, th_dport],
            map: "services".into(),
        }])
    };
    t.add_chain(
        Chain::base(
            "prerouting",
            ChainType::Nat,
            Hook::Prerouting,
            -100,
            Policy::Accept,
        )
        .rule(dispatch_rule()),
    );
    t.add_chain(
        Chain::base("output", ChainType::Nat, Hook::Output, -100, Policy::Accept)
            .rule(dispatch_rule()),
    );

    let mut post = Chain::base(
        "postrouting",
        ChainType::Nat,
        Hook::Postrouting,
        100,
        Policy::Accept,
    );
    for p in [L4Proto::Tcp, L4Proto::Udp, L4Proto::Sctp] {
        post.push(rule(vec![
            Stmt::cmp(l4, Value::Proto(p)),
            Stmt::AnyBits {
                left: Expr::Ct(CtKey::Status),
                bits: ct_status::DNAT,
            },
            Stmt::Lookup {
                keys: vec![
                    Expr::Ct(CtKey::OriginalDaddr),
                    l4,
                    Expr::Ct(CtKey::OriginalProtoDst),
                ],
                set: "masq-services".into(),
                negate: false,
            },
            Stmt::Masquerade { fully_random: true },
        ]));
    }
    t.add_chain(post);

    let reject_rules = || {
        vec![
            rule(vec![
                Stmt::cmp(l4, Value::Proto(L4Proto::Tcp)),
                Stmt::Lookup {
                    keys: vec![f.daddr(), l4, th_dport],
                    set: "no-endpoints".into(),
                    negate: false,
                },
                Stmt::Reject(Reject::TcpReset),
            ]),
            rule(vec![
                Stmt::Lookup {
                    keys: vec![f.daddr(), l4, th_dport],
                    set: "no-endpoints".into(),
                    negate: false,
                },
                Stmt::Reject(Reject::PortUnreachable),
            ]),
        ]
    };
    let mut input = Chain::base("input", ChainType::Filter, Hook::Input, 0, Policy::Accept);
    input.rules = reject_rules();
    t.add_chain(input);
    let mut out = Chain::base(
        "filter-output",
        ChainType::Filter,
        Hook::Output,
        0,
        Policy::Accept,
    );
    out.rules = reject_rules();
    t.add_chain(out);
    t
}

/// `n` TCP Services with `eps` endpoints each, on one node address: the benchmark's ruleset.
/// Ports 1024.. are the Services'; endpoints cycle through documentation addresses.
pub fn bench_services(n: usize, eps: usize) -> Vec<LbService> {
    (0..n)
        .map(|i| LbService {
            key: format!("bench/svc-{i}:http"),
            proto: L4Proto::Tcp,
            port: 1024 + i as u16,
            endpoints: (0..eps)
                .map(|e| {
                    let host = ((i * eps + e) % 250 + 2) as u8;
                    (
                        IpAddr::V4(Ipv4Addr::new(198, 51, 100, host)),
                        8000 + (e as u16),
                    )
                })
                .collect(),
            masquerade: true,
            source_ranges: Vec::new(),
        })
        .collect()
}

/// The node address of [`bench_table`] and of the objects of [`bench_objects`].
pub const BENCH_NODE_ADDRESS: IpAddr = IpAddr::V4(Ipv4Addr::new(203, 0, 113, 1));

/// The Kubernetes objects of [`bench_services`]: per Service `bench/svc-<i>` (LoadBalancer, TCP
/// port `1024 + i` named `http`) and its one EndpointSlice `bench/svc-<i>-1` (target port 8080,
/// `eps` endpoints), as JSON the API would accept.
pub fn bench_objects(n: usize, eps: usize) -> Vec<(serde_json::Value, serde_json::Value)> {
    bench_objects_with(n, eps, false)
}

/// [`bench_objects`], every Service with `sessionAffinity: ClientIP` (the default timeout)
/// when `affinity`.
pub fn bench_objects_with(
    n: usize,
    eps: usize,
    affinity: bool,
) -> Vec<(serde_json::Value, serde_json::Value)> {
    let mut objects = bench_objects_plain(n, eps);
    if affinity {
        for (service, _) in &mut objects {
            service["spec"]["sessionAffinity"] = serde_json::json!("ClientIP");
        }
    }
    objects
}

fn bench_objects_plain(n: usize, eps: usize) -> Vec<(serde_json::Value, serde_json::Value)> {
    bench_services(n, eps)
        .into_iter()
        .map(|s| {
            let name = s
                .key
                .trim_start_matches("bench/")
                .trim_end_matches(":http")
                .to_string();
            let service = serde_json::json!({
                "apiVersion": "v1",
                "kind": "Service",
                "metadata": {"namespace": "bench", "name": name, "creationTimestamp": "2024-01-01T00:00:00Z"},
                "spec": {"type": "LoadBalancer", "ports": [{"name": "http", "port": s.port, "protocol": "TCP"}]},
            });
            let endpoints: Vec<serde_json::Value> = s
                .endpoints
                .iter()
                .map(|(a, _)| serde_json::json!({"addresses": [a.to_string()]}))
                .collect();
            let slice = serde_json::json!({
                "apiVersion": "discovery.k8s.io/v1",
                "kind": "EndpointSlice",
                "metadata": {"namespace": "bench", "name": format!("{name}-1"),
                             "labels": {"kubernetes.io/service-name": name}},
                "addressType": "IPv4",
                "ports": [{"name": "http", "port": 8080, "protocol": "TCP"}],
                "endpoints": endpoints,
            });
            (service, slice)
        })
        .collect()
}

/// The benchmark's table: the `ip nodelb` table the agent's planner builds for `n` LoadBalancer
/// Services (`bench/svc-<i>`, TCP port `1024 + i`) with `eps` ready endpoints each, on a node
/// whose address is 203.0.113.1 — the shape nodelb really programs (dispatch map, endpoint
/// map, per-Service chains and counters). Reserved ports are switched off so every port counts.
pub fn bench_table(n: usize, eps: usize) -> Table {
    let (planner, _, _) = bench_planner(n, eps, false);
    planner.tables().into_iter().next().expect("the ip table")
}

/// The agent's planner after planning [`bench_objects_with`] from nothing, with the objects
/// and the context it planned them in (the node of [`bench_table`]), for benchmarks that
/// change the objects and commit the planner's edits as the agent does.
pub fn bench_planner(
    n: usize,
    eps: usize,
    affinity: bool,
) -> (
    nodelb_core::plan::Planner,
    nodelb_core::plan::Objects,
    nodelb_core::plan::Context,
) {
    use nodelb_core::plan;
    let mut services = Vec::with_capacity(n);
    let mut slices = Vec::with_capacity(n);
    for (service, slice) in bench_objects_with(n, eps, affinity) {
        services.push(bench_service(service));
        slices.push(bench_slice(slice));
    }
    let node_addr = BENCH_NODE_ADDRESS;
    let node = plan::node::NodeInfo {
        name: "bench-node".into(),
        labels: Default::default(),
        addresses: vec![(plan::node::AddressKind::InternalIP, node_addr)],
    };
    let config = plan::config::Config {
        reserved_ports: plan::reserved::ReservedPorts::default(),
        ..plan::config::Config::default()
    };
    let families = nodelb_core::vocab::Families {
        v4: true,
        v6: false,
    };
    let ctx = plan::Context::new(node, [node_addr].into(), families, config);
    let objects = plan::Objects::from_lists(services, slices);
    let mut planner = plan::Planner::new();
    planner.update(&objects, &ctx, None);
    (planner, objects, ctx)
}

/// A benchmark Service, from its JSON, as the planner keeps it.
pub fn bench_service(json: serde_json::Value) -> nodelb_core::objects::index::Service {
    let s: nodelb_core::objects::wire::Service =
        serde_json::from_value(json).expect("bench Service");
    s.into()
}

/// A benchmark EndpointSlice, from its JSON, as the planner keeps it.
pub fn bench_slice(json: serde_json::Value) -> nodelb_core::objects::index::EndpointSlice {
    let s: nodelb_core::objects::wire::EndpointSlice =
        serde_json::from_value(json).expect("bench EndpointSlice");
    s.into()
}

/// In a `bench_table`, move endpoint 0 of Service `i` to another target port: the smallest
/// change there is, used by the incremental test and the benchmark.
pub fn move_bench_endpoint(t: &mut Table, i: usize, to_port: u16) {
    let eps = t.set_mut("endpoints").expect("endpoints map");
    let key = Key::Values(
        vec![
            Value::Proto(L4Proto::Tcp),
            Value::Port(1024 + i as u16),
            Value::U32(0),
        ]
        .into(),
    );
    let e = eps
        .elements
        .get_mut(&key)
        .expect("endpoint 0 of the Service");
    let Some(ElemData::Values(vals)) = &mut e.data else {
        panic!("endpoint data is not a value list")
    };
    let mut v = vals.to_vec();
    v[1] = Value::Port(to_port);
    *vals = v.into();
}
