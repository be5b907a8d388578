//! The kitchen sinks: tables built by hand that use every expression, statement and object kind
//! the netfilter model has, for the encoder's differential test and the tracer (they test the
//! encoder and the tracer, not the planner, whose tables come from `nodelb_core::plan`).

use super::Fam;
use nodelb_netfilter::*;
use std::net::{IpAddr, Ipv4Addr};

fn v(ip: IpAddr) -> Value {
    Value::from(ip)
}

fn rule(stmts: Vec<Stmt>) -> Rule {
    Rule::new(stmts)
}

fn verdict(v: Verdict) -> Stmt {
    Stmt::Verdict(v)
}

/// `th dport`: the destination port whatever the transport.
const TH_DPORT: Expr = Expr::Payload(Payload::ThDport);
/// `meta l4proto`.
const L4: Expr = Expr::Meta(MetaKey::L4Proto);

/// A table that uses every expression, statement and object kind the model has, in one family.
pub fn kitchen_sink(f: Fam, name: &str) -> Table {
    let mut t = Table::new(f.family, name);
    add_address_sets(&mut t, f);
    add_dispatch_maps(&mut t, f);
    add_client_sets(&mut t, f);
    add_lookup_sets(&mut t, f);
    t.add_chain(prerouting(f));
    add_service_chains(&mut t, f);
    t.add_chain(output());
    t.add_chain(postrouting(f));
    add_named_counters(&mut t, f);
    t.add_chain(forward(f));
    t.add_chain(Chain::regular("count").rule(rule(vec![
        Stmt::Counter {
            packets: 7,
            bytes: 700,
        },
        verdict(Verdict::Return),
    ])));
    t.add_chain(input());
    t
}

/// Interval sets of addresses: `allowed` by type (a prefix with a comment, a single host),
/// `sources` by typeof.
fn add_address_sets(t: &mut Table, f: Fam) {
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
}

/// The maps a load balancer dispatches through: `services` (address . protocol . port to a
/// verdict), `endpoints` (protocol . port . random index to address . port) and `pick` (a
/// typeof verdict map, ClientIP affinity's random pick).
fn add_dispatch_maps(t: &mut Table, f: Fam) {
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
        SetType::Typeof(vec![L4, TH_DPORT, Expr::random(2)]),
        MapData::Value(SetType::Typeof(vec![f.daddr(), TH_DPORT])),
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
        SetType::Typeof(vec![L4, TH_DPORT, Expr::random(1)]),
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
}

/// Sets filled by packets, with timeouts.
fn add_client_sets(t: &mut Table, f: Fam) {
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
}

/// Sets and maps over marks, ports and addresses: `marks`, `ports`, `portmap` (port to
/// verdict), `addrmap` (address to address).
fn add_lookup_sets(t: &mut Table, f: Fam) {
    let mut marks = Set::new("marks", SetType::Type(vec![DataType::Mark]));
    marks.insert(Key::Values(vec![Value::U32(1)].into()), None, None);
    t.add_set(marks);

    let mut ports = Set::new("ports", SetType::Typeof(vec![TH_DPORT]));
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
}

/// The nat prerouting base chain: a verdict-map dispatch, a negated lookup, DNAT with and
/// without a port, a `!=` comparison and `return`.
fn prerouting(f: Fam) -> Chain {
    let mut pre = Chain::base(
        "prerouting",
        ChainType::Nat,
        Hook::Prerouting,
        -100,
        Policy::Accept,
    );
    pre.push(
        rule(vec![Stmt::Vmap {
            keys: vec![f.daddr(), L4, TH_DPORT],
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
    pre
}

/// Regular chains the others jump and go to: a NAT map (`svc-a`), ClientIP affinity's
/// lookup, set updates and random draws (`sticky`), a typeof verdict map (`pick-2`) and DNAT
/// (`svc-b`).
fn add_service_chains(t: &mut Table, f: Fam) {
    t.add_chain(
        Chain::regular("svc-a").rule(
            rule(vec![Stmt::NatMap {
                kind: NatKind::Dnat,
                keys: vec![L4, TH_DPORT, Expr::random(2)],
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
                Stmt::cmp(Expr::random(3), Value::U32(0)),
                Stmt::counter(),
                verdict(Verdict::Goto("svc-a".into())),
            ]))
            .rule(rule(vec![verdict(Verdict::Goto("svc-b".into()))])),
    );
    t.add_chain(Chain::regular("pick-2").rule(rule(vec![Stmt::Vmap {
        keys: vec![L4, TH_DPORT, Expr::random(2)],
        map: "pick".into(),
    }])));
    t.add_chain(Chain::regular("svc-b").rule(rule(vec![
        Stmt::cmp(L4, Value::Proto(L4Proto::Udp)),
        Stmt::Nat {
            kind: NatKind::Dnat,
            addr: f.addr(1, 3),
            port: Some(5353),
        },
    ])));
}

/// The nat output base chain: a source port of each protocol.
fn output() -> Chain {
    let mut out = Chain::base("output", ChainType::Nat, Hook::Output, -100, Policy::Accept);
    for (sport, port) in [
        (Payload::TcpSport, 1),
        (Payload::UdpSport, 2),
        (Payload::SctpSport, 3),
    ] {
        out.push(rule(vec![
            Stmt::Cmp {
                left: Expr::Payload(sport),
                op: CmpOp::Eq,
                right: Value::Port(port),
            },
            verdict(Verdict::Accept),
        ]));
    }
    out
}

/// The nat postrouting base chain: masquerade by conntrack status and by mark (fully
/// random), SNAT by conntrack mark.
fn postrouting(f: Fam) -> Chain {
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
        Stmt::cmp(L4, Value::Proto(L4Proto::Tcp)),
        Stmt::Nat {
            kind: NatKind::Snat,
            addr: f.addr(2, 1),
            port: Some(1000),
        },
    ]));
    post
}

/// The filter forward base chain: conntrack and rejects, lookups and maps, and counting.
fn forward(f: Fam) -> Chain {
    let mut fwd = Chain::base(
        "forward",
        ChainType::Filter,
        Hook::Forward,
        0,
        Policy::Accept,
    );
    forward_conntrack_and_marks(&mut fwd, f);
    forward_lookups(&mut fwd, f);
    forward_counting(&mut fwd, f);
    fwd
}

/// Conntrack state and original destination, rejects of each kind, and marks.
fn forward_conntrack_and_marks(fwd: &mut Chain, f: Fam) {
    fwd.push(rule(vec![
        Stmt::AnyBits {
            left: Expr::Ct(CtKey::State),
            bits: ct_state::ESTABLISHED | ct_state::RELATED,
        },
        verdict(Verdict::Accept),
    ]));
    fwd.push(rule(vec![
        Stmt::cmp(L4, Value::Proto(L4Proto::Tcp)),
        Stmt::cmp(Expr::Ct(CtKey::OriginalDaddr), v(f.addr(2, 1))),
        Stmt::cmp(Expr::Ct(CtKey::OriginalProtoDst), Value::Port(80)),
        Stmt::counter(),
        verdict(Verdict::Accept),
    ]));
    fwd.push(rule(vec![
        Stmt::cmp(L4, Value::Proto(L4Proto::Udp)),
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
}

/// Lookups in named sets, a named and two anonymous verdict maps, and comparisons of
/// addresses.
fn forward_lookups(fwd: &mut Chain, f: Fam) {
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
            keys: vec![TH_DPORT],
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
        keys: vec![TH_DPORT],
        map: "portmap".into(),
    }]));
    fwd.push(rule(vec![
        Stmt::cmp(f.proto(), Value::Proto(L4Proto::Tcp)),
        Stmt::AnonVmap {
            keys: vec![Expr::random(2)],
            map: AnonVmap {
                elements: vec![
                    (vec![Value::U32(0)], Verdict::Jump("count".into())),
                    (vec![Value::U32(1)], Verdict::Return),
                ],
            },
        },
    ]));
    fwd.push(rule(vec![Stmt::AnonVmap {
        keys: vec![f.daddr(), TH_DPORT],
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
}

/// Named counters: seeded values, a comment, and a counter map naming them.
fn add_named_counters(t: &mut Table, f: Fam) {
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
}

/// Rules counting into a named counter by name and into the counter map's by key.
fn forward_counting(fwd: &mut Chain, f: Fam) {
    fwd.push(
        rule(vec![
            Stmt::cmp(L4, Value::Proto(L4Proto::Tcp)),
            Stmt::AnyBits {
                left: Expr::Ct(CtKey::Status),
                bits: ct_status::DNAT,
            },
            Stmt::CounterMap {
                keys: vec![
                    Expr::Ct(CtKey::OriginalDaddr),
                    L4,
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
}

/// The filter input base chain, policy drop: `th sport`.
fn input() -> Chain {
    let mut input = Chain::base("input", ChainType::Filter, Hook::Input, 10, Policy::Drop);
    input.push(rule(vec![
        Stmt::cmp(Expr::Payload(Payload::ThSport), Value::Port(7)),
        verdict(Verdict::Accept),
    ]));
    input
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
