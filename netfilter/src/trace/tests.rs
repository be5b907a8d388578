//! The tracer on small tables built by hand, one construct at a time.

use super::*;
use crate::model::*;
use std::collections::BTreeSet;
use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

const HOST: &str = "203.0.113.1";
const CLIENT: &str = "192.0.2.9";
const L4: Expr = Expr::Meta(MetaKey::L4Proto);
const TH_DPORT: Expr = Expr::Payload(Payload::ThDport);
const SADDR: Expr = Expr::Payload(Payload::IpSaddr);
const DADDR: Expr = Expr::Payload(Payload::IpDaddr);

fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}

fn ep(s: &str) -> SocketAddr {
    s.parse().unwrap()
}

fn v(s: &str) -> Value {
    Value::from(ip(s))
}

fn values(vals: &[Value]) -> Key {
    Key::Values(Values::new(vals))
}

fn rule(stmts: Vec<Stmt>) -> Rule {
    Rule::new(stmts)
}

fn verdict(v: Verdict) -> Stmt {
    Stmt::Verdict(v)
}

fn goto(c: &str) -> Stmt {
    verdict(Verdict::Goto(c.into()))
}

fn jump(c: &str) -> Stmt {
    verdict(Verdict::Jump(c.into()))
}

fn counter(name: &str) -> Stmt {
    Stmt::CounterRef(name.into())
}

fn dnat(to: &str) -> Stmt {
    let to = ep(to);
    Stmt::Nat {
        kind: NatKind::Dnat,
        addr: to.ip(),
        port: Some(to.port()),
    }
}

fn lookup(keys: Vec<Expr>, set: &str) -> Stmt {
    Stmt::Lookup {
        keys,
        set: set.into(),
        negate: false,
    }
}

fn nat(name: &str, hook: Hook, priority: i32) -> Chain {
    Chain::base(name, ChainType::Nat, hook, priority, Policy::Accept)
}

fn filter(name: &str, hook: Hook) -> Chain {
    Chain::base(name, ChainType::Filter, hook, 0, Policy::Accept)
}

fn dnatted() -> Stmt {
    Stmt::AnyBits {
        left: Expr::Ct(CtKey::Status),
        bits: ct_status::DNAT,
    }
}

fn new_only() -> Stmt {
    Stmt::AnyBits {
        left: Expr::Ct(CtKey::State),
        bits: ct_state::NEW,
    }
}

fn service_key_type() -> SetType {
    SetType::Type(vec![
        DataType::Ipv4Addr,
        DataType::InetProto,
        DataType::InetService,
    ])
}

fn service_key(addr: &str, p: L4Proto, port: u16) -> Key {
    values(&[v(addr), Value::Proto(p), Value::Port(port)])
}

/// nodelb's shape in small: `map services` sends TCP 443 on the host to `endpoints-2`, which
/// DNATs through `map endpoints` to one of two endpoints; postrouting masquerades what
/// `set masq` names by its original destination; forward counts by it; input rejects new
/// connections to `set no-endpoints` (TCP 80).
fn lb() -> Table {
    let mut t = Table::new(Family::Ip, "nodelb");
    let mut services = Set::map("services", service_key_type(), MapData::Verdict);
    services.insert(
        service_key(HOST, L4Proto::Tcp, 443),
        Some(ElemData::Verdict(Verdict::Goto("endpoints-2".into()))),
        None,
    );
    t.add_set(services);
    let mut endpoints = Set::map(
        "endpoints",
        SetType::Typeof(vec![L4, TH_DPORT, Expr::random(1)]),
        MapData::Value(SetType::Typeof(vec![DADDR, TH_DPORT])),
    );
    for (i, to) in ["198.51.100.1", "198.51.100.2"].iter().enumerate() {
        endpoints.insert(
            values(&[
                Value::Proto(L4Proto::Tcp),
                Value::Port(443),
                Value::U32(i as u32),
            ]),
            Some(ElemData::Values(Values::new(&[v(to), Value::Port(8443)]))),
            None,
        );
    }
    t.add_set(endpoints);
    let mut masq = Set::new("masq", service_key_type());
    masq.insert(service_key(HOST, L4Proto::Tcp, 443), None, None);
    t.add_set(masq);
    let mut none = Set::new("no-endpoints", service_key_type());
    none.insert(service_key(HOST, L4Proto::Tcp, 80), None, None);
    t.add_set(none);
    t.add_counter(Counter::new("svc/web"));
    let mut counters = Set::map("svc-counters", service_key_type(), MapData::Counter);
    counters.insert(
        service_key(HOST, L4Proto::Tcp, 443),
        Some(ElemData::Counter("svc/web".into())),
        None,
    );
    t.add_set(counters);
    lb_chains(&mut t);
    t
}

fn original() -> Vec<Expr> {
    vec![
        Expr::Ct(CtKey::OriginalDaddr),
        L4,
        Expr::Ct(CtKey::OriginalProtoDst),
    ]
}

fn lb_chains(t: &mut Table) {
    let dispatch = rule(vec![Stmt::Vmap {
        keys: vec![DADDR, L4, TH_DPORT],
        map: "services".into(),
    }]);
    t.add_chain(nat("prerouting", Hook::Prerouting, -110).rule(dispatch.clone()));
    t.add_chain(nat("output", Hook::Output, -110).rule(dispatch));
    t.add_chain(Chain::regular("endpoints-2").rule(rule(vec![Stmt::NatMap {
        kind: NatKind::Dnat,
        keys: vec![L4, TH_DPORT, Expr::random(2)],
        map: "endpoints".into(),
    }])));
    t.add_chain(nat("postrouting", Hook::Postrouting, 100).rule(rule(vec![
        Stmt::cmp(L4, Value::Proto(L4Proto::Tcp)),
        dnatted(),
        lookup(original(), "masq"),
        Stmt::Masquerade { fully_random: true },
    ])));
    t.add_chain(filter("forward", Hook::Forward).rule(rule(vec![
        Stmt::cmp(L4, Value::Proto(L4Proto::Tcp)),
        dnatted(),
        Stmt::CounterMap {
            keys: original(),
            map: "svc-counters".into(),
        },
    ])));
    let no_endpoints = || lookup(vec![DADDR, L4, TH_DPORT], "no-endpoints");
    t.add_chain(
        filter("input", Hook::Input)
            .rule(rule(vec![
                new_only(),
                Stmt::cmp(L4, Value::Proto(L4Proto::Tcp)),
                no_endpoints(),
                Stmt::Reject(Reject::TcpReset),
            ]))
            .rule(rule(vec![
                new_only(),
                no_endpoints(),
                Stmt::Reject(Reject::PortUnreachable),
            ])),
    );
}

fn trace(t: &Table, p: Packet) -> Outcomes {
    Tracer::new([t])
        .host([HOST])
        .trace(&p)
        .unwrap_or_else(|e| panic!("{p}: {e}"))
}

#[test]
fn a_service_port_dnats_to_each_endpoint_as_likely_and_is_masqueraded() {
    let out = trace(&lb(), Packet::tcp(CLIENT, HOST, 443));
    let both = BTreeSet::from([ep("198.51.100.1:8443"), ep("198.51.100.2:8443")]);
    assert_eq!(out.endpoints(), both, "{out}");
    assert!(out.accepted() && out.masqueraded(), "{out}");
    for o in &out {
        assert_eq!(o.chance, Chance::of(1, 2), "{out}");
        assert_eq!(
            o.hooks,
            [Hook::Prerouting, Hook::Forward, Hook::Postrouting]
        );
        assert_eq!(
            o.snat,
            Some(Snat::Masquerade { fully_random: true }),
            "{out}"
        );
        // Forward saw the DNATed connection and counted it by its original destination.
        assert_eq!(o.counters, BTreeSet::from(["svc/web".to_string()]), "{out}");
    }
    assert_eq!(out.chance_of(ep("198.51.100.1:8443")), Chance::of(1, 2));
}

#[test]
fn a_packet_for_no_service_reaches_the_host_untouched() {
    let out = trace(&lb(), Packet::tcp(CLIENT, HOST, 22));
    assert!(out.delivered_to_host(), "{out}");
    assert!(!out.sometimes_masqueraded(), "{out}");
    assert!(out.counters().is_empty(), "{out}");
    assert_eq!(
        out.iter().next().unwrap().hooks,
        [Hook::Prerouting, Hook::Input]
    );
    // Addressed elsewhere: forwarded, and nothing masquerades it (not DNATed).
    let out = trace(&lb(), Packet::tcp(CLIENT, "198.51.100.7", 443));
    let o = out.iter().next().unwrap();
    assert_eq!(
        o.hooks,
        [Hook::Prerouting, Hook::Forward, Hook::Postrouting]
    );
    assert!(out.accepted() && !out.sometimes_masqueraded(), "{out}");
}

#[test]
fn a_port_without_endpoints_rejects_new_connections_only() {
    let t = lb();
    let out = trace(&t, Packet::tcp(CLIENT, HOST, 80));
    assert_eq!(out.rejected(), Some(Reject::TcpReset), "{out}");
    // A reply to the host's own connection from port 80 is established: through.
    let out = trace(&t, Packet::tcp(CLIENT, HOST, 80).sport(9000).established());
    assert!(out.delivered_to_host(), "{out}");
    // The TCP reset does not match UDP (the encoder's `meta l4proto tcp`)...
    let mut t = t;
    let s = t.set_mut("no-endpoints").unwrap();
    s.insert(service_key(HOST, L4Proto::Udp, 53), None, None);
    let out = trace(&t, Packet::udp(CLIENT, HOST, 53));
    // ...so the port unreachable after it does.
    assert_eq!(out.rejected(), Some(Reject::PortUnreachable), "{out}");
}

#[test]
fn a_masquerade_needs_the_dnat_and_the_original_destination_in_its_set() {
    let mut t = lb();
    t.set_mut("masq").unwrap().elements.clear();
    let out = trace(&t, Packet::tcp(CLIENT, HOST, 443));
    assert_eq!(out.endpoints().len(), 2, "{out}");
    assert!(!out.sometimes_masqueraded(), "{out}");
    // In the set, but never DNATed: `ct status dnat` does not match.
    let mut t = lb();
    t.set_mut("services").unwrap().elements.clear();
    let out = trace(&t, Packet::tcp(CLIENT, "198.51.100.7", 443));
    assert!(!out.sometimes_masqueraded(), "{out}");
}

#[test]
fn the_hosts_own_connection_dnats_in_output() {
    let out = trace(&lb(), Packet::tcp(HOST, HOST, 443).from_host());
    assert_eq!(out.endpoints().len(), 2, "{out}");
    for o in &out {
        assert_eq!(o.hooks, [Hook::Output, Hook::Postrouting], "{out}");
    }
    assert!(out.masqueraded(), "{out}");
    // To itself without a Service: out through postrouting and back in, no NAT chain twice.
    let out = trace(&lb(), Packet::tcp(HOST, HOST, 22).from_host());
    let o = out.iter().next().unwrap();
    let round = [
        Hook::Output,
        Hook::Postrouting,
        Hook::Prerouting,
        Hook::Input,
    ];
    assert_eq!(o.hooks, round, "{out}");
    assert!(out.delivered_to_host(), "{out}");
    // The dispatch rule ran in output only (the looped packet's destination NAT is decided).
    let dispatch = |r: &&RuleRef| r.chain == "prerouting" || r.chain == "output";
    assert_eq!(o.rules.iter().filter(dispatch).count(), 0, "{o}");
}

#[test]
fn an_established_packet_skips_the_nat_chains_and_keeps_its_connections_dnat() {
    let mut t = lb();
    // Were the nat chains run, this would send it elsewhere.
    t.chain_mut("prerouting")
        .unwrap()
        .rules
        .insert(0, rule(vec![dnat("198.51.100.9:1")]));
    let p = Packet::tcp(CLIENT, HOST, 443)
        .established()
        .dnatted_to(ep("198.51.100.2:8443"));
    let out = trace(&t, p);
    assert_eq!(out.endpoints(), BTreeSet::from([ep("198.51.100.2:8443")]));
    let o = out.iter().next().unwrap();
    assert_eq!(
        o.hooks,
        [Hook::Prerouting, Hook::Forward, Hook::Postrouting]
    );
    // Forward sees `ct status dnat` and the original destination; no masquerade decided now.
    assert_eq!(o.counters, BTreeSet::from(["svc/web".to_string()]), "{o}");
    assert_eq!(o.snat, None, "{o}");
    // A new one takes the inserted DNAT.
    let out = trace(&t, Packet::tcp(CLIENT, HOST, 443));
    assert_eq!(out.endpoints(), BTreeSet::from([ep("198.51.100.9:1")]));
}

#[test]
fn nat_chains_run_at_the_kernels_nat_priority_and_stop_once_one_decides() {
    let mut t = Table::new(Family::Ip, "t");
    t.add_counter(Counter::new("early"));
    t.add_counter(Counter::new("late"));
    let seen = |name: &str, priority| {
        Chain::base(
            name,
            ChainType::Filter,
            Hook::Prerouting,
            priority,
            Policy::Accept,
        )
        .rule(rule(vec![
            Stmt::cmp(DADDR, v("198.51.100.2")),
            counter(name),
        ]))
    };
    t.add_chain(seen("early", -150));
    t.add_chain(seen("late", -50));
    // At -200 and -90, both run where the kernel's NAT is (-100): the early filter sees the
    // destination before, the late one after; the second never runs.
    t.add_chain(nat("first", Hook::Prerouting, -200).rule(rule(vec![dnat("198.51.100.2:80")])));
    t.add_chain(nat("second", Hook::Prerouting, -90).rule(rule(vec![dnat("198.51.100.3:80")])));
    let out = trace(&t, Packet::tcp(CLIENT, HOST, 80));
    assert_eq!(out.endpoints(), BTreeSet::from([ep("198.51.100.2:80")]));
    assert_eq!(out.counters(), BTreeSet::from(["late"]), "{out}");
    // When the first does not decide, the second does.
    t.chain_mut("first").unwrap().rules[0]
        .stmts
        .insert(0, Stmt::cmp(TH_DPORT, Value::Port(81)));
    let out = trace(&t, Packet::tcp(CLIENT, HOST, 80));
    assert_eq!(out.endpoints(), BTreeSet::from([ep("198.51.100.3:80")]));
}

#[test]
fn jumps_return_gotos_return_to_the_caller_and_marks_carry() {
    let mut t = Table::new(Family::Ip, "t");
    t.add_counter(Counter::new("after"));
    t.add_counter(Counter::new("skipped"));
    t.add_chain(
        filter("input", Hook::Input)
            .rule(rule(vec![jump("mark")]))
            .rule(rule(vec![
                Stmt::Masked {
                    left: Expr::Meta(MetaKey::Mark),
                    mask: 0x4000,
                    value: 0x4000,
                },
                jump("via"),
            ]))
            .rule(rule(vec![counter("after"), verdict(Verdict::Accept)])),
    );
    t.add_chain(
        Chain::regular("mark").rule(rule(vec![Stmt::MarkOr(0x4000), verdict(Verdict::Return)])),
    );
    // A goto from `via` ends in `end`, whose end returns to `input`, past the jump to `via`.
    t.add_chain(
        Chain::regular("via")
            .rule(rule(vec![goto("end")]))
            .rule(rule(vec![counter("skipped")])),
    );
    t.add_chain(Chain::regular("end"));
    let out = trace(&t, Packet::tcp(CLIENT, HOST, 80));
    assert!(out.delivered_to_host(), "{out}");
    assert_eq!(out.counters(), BTreeSet::from(["after"]), "{out}");
    let rules: Vec<(&str, usize)> = out
        .iter()
        .next()
        .unwrap()
        .rules
        .iter()
        .map(|r| (r.chain.as_str(), r.index))
        .collect();
    let want = [
        ("input", 0),
        ("mark", 0),
        ("input", 1),
        ("via", 0),
        ("input", 2),
    ];
    assert_eq!(rules, want, "{out}");
}

#[test]
fn a_drop_policy_drops_what_no_rule_accepts() {
    let mut t = Table::new(Family::Ip, "t");
    let mut input = Chain::base("input", ChainType::Filter, Hook::Input, 0, Policy::Drop);
    input.push(rule(vec![Stmt::cmp(TH_DPORT, Value::Port(22)), jump("ok")]));
    t.add_chain(input);
    t.add_chain(Chain::regular("ok").rule(rule(vec![verdict(Verdict::Accept)])));
    assert!(trace(&t, Packet::tcp(CLIENT, HOST, 22)).delivered_to_host());
    assert!(trace(&t, Packet::tcp(CLIENT, HOST, 23)).dropped());
}

#[test]
fn an_interval_set_drops_sources_outside_its_prefixes_and_counts_them() {
    let mut t = Table::new(Family::Ip, "t");
    let mut ranges = Set::new("ranges", SetType::Type(vec![DataType::Ipv4Addr])).interval();
    ranges.insert(Key::Prefix(ip("192.0.2.0"), 25), None, None);
    ranges.insert(Key::Prefix(ip("198.51.100.7"), 32), None, None);
    t.add_set(ranges);
    t.add_counter(Counter::new("drops"));
    t.add_chain(filter("input", Hook::Input).rule(rule(vec![
        Stmt::Lookup {
            keys: vec![SADDR],
            set: "ranges".into(),
            negate: true,
        },
        counter("drops"),
        verdict(Verdict::Drop),
    ])));
    for (client, inside) in [
        ("192.0.2.9", true),
        ("192.0.2.127", true),
        ("192.0.2.128", false),
        ("198.51.100.7", true),
        ("198.51.100.8", false),
    ] {
        let out = trace(&t, Packet::udp(client, HOST, 53));
        assert_eq!(out.delivered_to_host(), inside, "{client}: {out}");
        assert_eq!(out.dropped(), !inside, "{client}: {out}");
        assert_eq!(out.counters().contains("drops"), !inside, "{client}: {out}");
    }
}

#[test]
fn an_anonymous_vmap_on_concatenated_keys() {
    let mut t = Table::new(Family::Ip, "t");
    t.add_chain(filter("input", Hook::Input).rule(rule(vec![Stmt::AnonVmap {
        keys: vec![SADDR, TH_DPORT],
        map: AnonVmap {
            elements: vec![
                (vec![v(CLIENT), Value::Port(22)], Verdict::Drop),
                (vec![v(CLIENT), Value::Port(23)], Verdict::Accept),
            ],
        },
    }])));
    assert!(trace(&t, Packet::tcp(CLIENT, HOST, 22)).dropped());
    assert!(trace(&t, Packet::tcp(CLIENT, HOST, 23)).delivered_to_host());
    assert!(trace(&t, Packet::tcp("192.0.2.10", HOST, 22)).delivered_to_host());
}

/// ClientIP affinity in nodelb's shape: a remembered client goes to its endpoint's chain;
/// others pick endpoint i of n when `numgen random mod (n - i)` is 0; each endpoint's chain
/// remembers the client and DNATs.
fn sticky(endpoints: &[&str]) -> Table {
    let mut t = Table::new(Family::Ip, "t");
    let mut pick = nat("prerouting", Hook::Prerouting, -110);
    for (i, e) in endpoints.iter().enumerate() {
        let (set, chain) = (format!("clients-{i}"), format!("ep-{i}"));
        t.add_set(
            Set::new(&set, SetType::Type(vec![DataType::Ipv4Addr]))
                .dynamic(Duration::from_secs(60)),
        );
        t.add_chain(
            Chain::regular(&chain)
                .rule(rule(vec![Stmt::SetUpdate {
                    keys: vec![SADDR],
                    set: set.clone(),
                    timeout: None,
                }]))
                .rule(rule(vec![dnat(e)])),
        );
        pick.push(rule(vec![lookup(vec![SADDR], &set), goto(&chain)]));
    }
    let n = endpoints.len();
    for i in 0..n {
        let mut stmts = Vec::new();
        if n - i > 1 {
            let draw = Expr::random((n - i) as u32);
            stmts.push(Stmt::cmp(draw, Value::U32(0)));
        }
        stmts.push(goto(&format!("ep-{i}")));
        pick.push(rule(stmts));
    }
    t.add_chain(pick);
    t
}

#[test]
fn numgen_draws_pick_every_endpoint_as_likely() {
    let eps = ["198.51.100.1:80", "198.51.100.2:80", "198.51.100.3:80"];
    let out = trace(&sticky(&eps), Packet::tcp(CLIENT, HOST, 80));
    assert_eq!(out.len(), 3, "{out}");
    for e in eps {
        assert_eq!(out.chance_of(ep(e)), Chance::of(1, 3), "{e}: {out}");
    }
}

#[test]
fn a_client_a_dynamic_set_learned_keeps_its_endpoint() {
    let eps = ["198.51.100.1:80", "198.51.100.2:80", "198.51.100.3:80"];
    let t = sticky(&eps);
    let mut tracer = Tracer::new([&t]).host([HOST]);
    let first = tracer.trace(&Packet::tcp(CLIENT, HOST, 80)).unwrap();
    let taken = first
        .to(ep(eps[1]))
        .expect("one way reaches the second endpoint");
    assert_eq!(taken.learned.len(), 1, "{taken}");
    assert_eq!(taken.learned[0].set, "clients-1");
    tracer.learn(taken);
    let again = tracer.trace(&Packet::tcp(CLIENT, HOST, 80)).unwrap();
    assert_eq!(again.endpoints(), BTreeSet::from([ep(eps[1])]), "{again}");
    // Another client is picked for anew.
    let other = tracer.trace(&Packet::tcp("192.0.2.10", HOST, 80)).unwrap();
    assert_eq!(other.endpoints().len(), 3, "{other}");
}

#[test]
fn snat_to_an_address_is_the_source_translation() {
    let mut t = Table::new(Family::Ip, "t");
    t.add_chain(
        nat("postrouting", Hook::Postrouting, 100).rule(rule(vec![Stmt::Nat {
            kind: NatKind::Snat,
            addr: ip("198.51.100.254"),
            port: None,
        }])),
    );
    let out = trace(&t, Packet::udp(CLIENT, "198.51.100.7", 53));
    assert!(out.masqueraded(), "{out}");
    let o = out.iter().next().unwrap();
    assert_eq!(o.snat, Some(Snat::To(ip("198.51.100.254"), None)));
}

#[test]
fn an_inet_table_sees_both_families_and_its_ip_rules_skip_ipv6() {
    let mut t = Table::new(Family::Inet, "t");
    t.add_chain(
        filter("input", Hook::Input)
            .rule(rule(vec![
                Stmt::cmp(SADDR, v(CLIENT)),
                verdict(Verdict::Drop),
            ]))
            .rule(rule(vec![
                Stmt::cmp(Expr::Meta(MetaKey::NfProto), Value::NfProto(Family::Ip6)),
                Stmt::Reject(Reject::PortUnreachable),
            ])),
    );
    let tracer = Tracer::new([&t]).host([HOST, "2001:db8::1"]);
    assert!(tracer
        .trace(&Packet::tcp(CLIENT, HOST, 80))
        .unwrap()
        .dropped());
    let v6 = tracer
        .trace(&Packet::tcp("2001:db8::9", "2001:db8::1", 80))
        .unwrap();
    assert_eq!(v6.rejected(), Some(Reject::PortUnreachable), "{v6}");
    // An `ip` table does not see IPv6 at all.
    assert!(trace(&lb(), Packet::tcp("2001:db8::9", "2001:db8::1", 443)).accepted());
}

fn error(t: &Table, p: Packet) -> TraceError {
    match Tracer::new([t]).host([HOST]).trace(&p) {
        Ok(out) => panic!("{p} traced: {out}"),
        Err(e) => e,
    }
}

#[test]
fn what_the_tracer_cannot_evaluate_is_an_error_naming_the_rule() {
    let mut t = Table::new(Family::Ip, "t");
    t.add_chain(filter("input", Hook::Input).rule(rule(vec![
        Stmt::cmp(L4, Value::Proto(L4Proto::Icmp)),
        Stmt::cmp(TH_DPORT, Value::Port(8)),
    ])));
    let e = error(&t, Packet::new(L4Proto::Icmp, CLIENT, HOST, 0));
    assert!(matches!(e, TraceError::Unsupported { .. }), "{e}");
    assert_eq!(
        e.to_string(),
        "ip t chain input rule 0: the tracer cannot evaluate th dport of an icmp packet"
    );
}

#[test]
fn rules_the_kernel_would_refuse_are_errors() {
    let one = |stmts: Vec<Stmt>| {
        let mut t = Table::new(Family::Ip, "t");
        t.add_chain(filter("input", Hook::Input).rule(rule(stmts)));
        t
    };
    let cases = [
        (
            one(vec![Stmt::cmp(SADDR, Value::Port(80))]),
            "compares ip saddr with Port(80)",
        ),
        (one(vec![jump("nowhere")]), "jumps to missing chain nowhere"),
        (
            one(vec![lookup(vec![SADDR], "nothing")]),
            "refers to missing set nothing",
        ),
        (
            one(vec![counter("nothing")]),
            "counts into missing counter nothing",
        ),
        (
            one(vec![dnat("198.51.100.1:80")]),
            "dnat in a filter chain on hook input",
        ),
        (
            one(vec![Stmt::cmp(
                Expr::Payload(Payload::Ip6Saddr),
                v("2001:db8::1"),
            )]),
            "ip6 saddr in an ip table",
        ),
    ];
    for (t, want) in cases {
        let e = error(&t, Packet::tcp(CLIENT, HOST, 80));
        assert!(e.to_string().ends_with(want), "{e}, want {want:?}");
    }
    // A lookup whose keys are not what the set holds.
    let mut t = one(vec![lookup(vec![TH_DPORT], "ports")]);
    t.add_set(Set::new("ports", SetType::Type(vec![DataType::Ipv4Addr])));
    let e = error(&t, Packet::tcp(CLIENT, HOST, 80));
    assert!(matches!(e, TraceError::Invalid { .. }), "{e}");
}

#[test]
fn loops_and_deep_jumps_end_in_errors() {
    let mut t = Table::new(Family::Ip, "t");
    t.add_chain(filter("input", Hook::Input).rule(rule(vec![goto("a")])));
    t.add_chain(Chain::regular("a").rule(rule(vec![goto("b")])));
    t.add_chain(Chain::regular("b").rule(rule(vec![goto("a")])));
    assert_eq!(
        error(&t, Packet::tcp(CLIENT, HOST, 80)),
        TraceError::TooLong
    );

    let mut t = Table::new(Family::Ip, "t");
    t.add_chain(filter("input", Hook::Input).rule(rule(vec![jump("c0")])));
    for i in 0..=JUMP_STACK {
        t.add_chain(Chain::regular(format!("c{i}")).rule(rule(vec![jump(&format!("c{}", i + 1))])));
    }
    t.add_chain(Chain::regular(format!("c{}", JUMP_STACK + 1)));
    let e = error(&t, Packet::tcp(CLIENT, HOST, 80));
    assert!(matches!(e, TraceError::JumpStack { .. }), "{e}");
}

#[test]
fn a_filter_chain_at_the_nat_priority_has_no_known_order() {
    let mut t = lb();
    t.add_chain(Chain::base(
        "tie",
        ChainType::Filter,
        Hook::Prerouting,
        -100,
        Policy::Accept,
    ));
    let e = error(&t, Packet::tcp(CLIENT, HOST, 443));
    assert!(matches!(e, TraceError::Hooks { .. }), "{e}");
}
