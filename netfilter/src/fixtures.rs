//! Small tables for tests, shared by this crate's unit tests and the integration crate's
//! (feature `test-fixtures`).

use crate::model::*;
use crate::ops::Op;
use std::net::Ipv4Addr;

/// A table with a service map sending `port` to chain `ep` (which DNATs), and an empty
/// chain `extra` when asked.
pub fn table(port: u16, extra_chain: bool) -> Table {
    let mut t = Table::new(Family::Ip, "nodelb");
    let mut m = Set::map(
        "services",
        SetType::Type(vec![DataType::InetService]),
        MapData::Verdict,
    );
    m.insert(
        Key::Values(vec![Value::Port(port)].into()),
        Some(ElemData::Verdict(Verdict::Goto("ep".into()))),
        None,
    );
    t.add_set(m);
    t.add_chain(Chain::regular("ep").rule(Rule::new(vec![Stmt::Nat {
        kind: NatKind::Dnat,
        addr: Ipv4Addr::new(198, 51, 100, 2).into(),
        port: None,
    }])));
    if extra_chain {
        t.add_chain(Chain::regular("extra"));
    }
    t
}

/// What each operation does, as `nft` words.
pub fn kinds(ops: &[Op]) -> Vec<&'static str> {
    ops.iter()
        .map(|o| match o {
            Op::AddTable(_) => "add table",
            Op::DelTable(_) => "delete table",
            Op::AddChain(..) => "add chain",
            Op::FlushChain(..) => "flush chain",
            Op::DelChain(..) => "delete chain",
            Op::AddRule { .. } => "add rule",
            Op::AddSet(..) => "add set",
            Op::DelSet(..) => "delete set",
            Op::AddElems { .. } => "add elements",
            Op::DelElems { .. } => "delete elements",
            Op::RestoreElems { .. } => "restore elements",
            Op::AddCounter(..) => "add counter",
            Op::DelCounter(..) => "delete counter",
        })
        .collect()
}

/// `table(80)` plus a counter, a counter map naming it and a rule counting into both.
pub fn counted(port: u16, packets: u64) -> Table {
    let mut t = table(port, false);
    let mut c = Counter::new("svc/web").with_comment("default/web:http");
    c.packets = packets;
    c.bytes = packets * 100;
    t.add_counter(c);
    let mut m = Set::map(
        "svc-counters",
        SetType::Type(vec![DataType::InetService]),
        MapData::Counter,
    );
    m.insert(
        Key::Values(vec![Value::Port(port)].into()),
        Some(ElemData::Counter("svc/web".into())),
        None,
    );
    t.add_set(m);
    t.chain_mut("ep").unwrap().rules.insert(
        0,
        Rule::new(vec![
            Stmt::CounterRef("svc/web".into()),
            Stmt::CounterMap {
                keys: vec![Expr::Payload(Payload::ThDport)],
                map: "svc-counters".into(),
            },
        ]),
    );
    t
}

/// A table with one map element (port 80 to chain `a`, commented `a`) and chain `a`.
pub fn base() -> Table {
    let mut t = Table::new(Family::Ip, "nodelb");
    let mut m = Set::map(
        "services",
        SetType::Type(vec![DataType::InetService]),
        MapData::Verdict,
    );
    m.insert(
        Key::Values(vec![Value::Port(80)].into()),
        Some(ElemData::Verdict(Verdict::Goto("a".into()))),
        Some("a".into()),
    );
    t.add_set(m);
    t.add_chain(Chain::regular("a").rule(Rule::new(vec![Stmt::counter()])));
    t
}

/// A map element sending `port` to `chain`, commented with the chain's name.
pub fn elem(port: u16, chain: &str) -> (Key, Element) {
    (
        Key::Values(vec![Value::Port(port)].into()),
        Element {
            data: Some(ElemData::Verdict(Verdict::Goto(chain.into()))),
            comment: Some(chain.into()),
        },
    )
}
