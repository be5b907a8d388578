//! Model → `nft -f` text. The text is what an operator reads and what the differential tests
//! feed to `nft` to prove the netlink encoder right.

use crate::model::*;
use crate::types::{ct_bits_text, set_type_text, value_text, Layout};
use std::fmt::Write;

/// The table as one `table <family> <name> { ... }` block.
pub fn render_table(t: &Table) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "table {} {} {{", t.family, t.name);
    let mut first = true;
    for c in t.counters.values() {
        if !first {
            out.push('\n');
        }
        first = false;
        render_counter(&mut out, c);
    }
    for s in t.sets.values() {
        if !first {
            out.push('\n');
        }
        first = false;
        render_set(&mut out, t.family, s);
    }
    for c in t.chains.values() {
        if !first {
            out.push('\n');
        }
        first = false;
        render_chain(&mut out, t.family, c);
    }
    out.push_str("}\n");
    out
}

/// A script that atomically replaces the table, whether or not it exists: `add table` makes
/// sure the `delete` cannot fail, and `nft -f` commits the file as one transaction.
pub fn render_replace(t: &Table) -> String {
    format!(
        "add table {f} {n}\ndelete table {f} {n}\n{}",
        render_table(t),
        f = t.family,
        n = t.name
    )
}

fn quote(s: &str) -> String {
    format!("\"{}\"", s.replace('"', "'"))
}

/// A counter object with the values it starts from. Its name is written bare: nft's grammar
/// takes no quoted name in a declaration, so counter names must be nft identifiers.
fn render_counter(out: &mut String, c: &Counter) {
    let _ = writeln!(out, "\tcounter {} {{", c.name);
    if let Some(comment) = &c.comment {
        let _ = writeln!(out, "\t\tcomment {}", quote(comment));
    }
    let _ = writeln!(out, "\t\tpackets {} bytes {}", c.packets, c.bytes);
    out.push_str("\t}\n");
}

fn render_set(out: &mut String, family: Family, s: &Set) {
    let kind = if s.data.is_some() { "map" } else { "set" };
    let _ = writeln!(out, "\t{kind} {} {{", s.name);
    let data_text = match &s.data {
        None => String::new(),
        Some(MapData::Verdict) => " : verdict".into(),
        Some(MapData::Counter) => " : counter".into(),
        Some(MapData::Value(SetType::Type(d))) => format!(
            " : {}",
            d.iter()
                .map(|d| d.keyword())
                .collect::<Vec<_>>()
                .join(" . ")
        ),
        Some(MapData::Value(SetType::Typeof(e))) => format!(
            " : {}",
            e.iter()
                .map(|e| e.text(family))
                .collect::<Vec<_>>()
                .join(" . ")
        ),
    };
    let _ = writeln!(out, "\t\t{}{}", set_type_text(&s.key, family), data_text);
    if let Some(size) = s.size {
        let _ = writeln!(out, "\t\tsize {size}");
    }
    // nft lists a set's flags in this order, and its timeout after them.
    match (s.interval, s.timeout) {
        (_, Some(timeout)) => {
            let interval = if s.interval { "interval," } else { "" };
            let _ = writeln!(out, "\t\tflags dynamic,{interval}timeout");
            let _ = writeln!(out, "\t\ttimeout {}", duration_text(timeout));
        }
        (true, None) => out.push_str("\t\tflags interval\n"),
        (false, None) => {}
    }
    if let Some(c) = &s.comment {
        let _ = writeln!(out, "\t\tcomment {}", quote(c));
    }
    if !s.elements.is_empty() {
        let key_layout = Layout::of(&s.key, family);
        let data_layout = match &s.data {
            Some(MapData::Value(t)) => Some(Layout::of(t, family)),
            _ => None,
        };
        out.push_str("\t\telements = { ");
        let mut first = true;
        for (k, e) in &s.elements {
            if !first {
                out.push_str(",\n\t\t\t     ");
            }
            first = false;
            out.push_str(&key_text(&key_layout, k));
            if let Some(c) = &e.comment {
                let _ = write!(out, " comment {}", quote(c));
            }
            match (&e.data, &data_layout) {
                (Some(ElemData::Verdict(v)), _) => {
                    let _ = write!(out, " : {}", verdict_text(v));
                }
                (Some(ElemData::Values(vals)), Some(l)) => {
                    let _ = write!(out, " : {}", values_text(l, vals));
                }
                (Some(ElemData::Counter(name)), _) => {
                    let _ = write!(out, " : {}", quote(name));
                }
                _ => {}
            }
        }
        out.push_str(" }\n");
    }
    out.push_str("\t}\n");
}

/// A duration as nft prints one: days, hours, minutes, seconds and milliseconds, each only
/// when not zero (`3h`, `1m30s`, `2s500ms`).
pub fn duration_text(d: std::time::Duration) -> String {
    let mut ms = d.as_millis();
    let mut out = String::new();
    for (unit, len) in [
        ("d", 86_400_000),
        ("h", 3_600_000),
        ("m", 60_000),
        ("s", 1000),
    ] {
        if ms >= len {
            let _ = write!(out, "{}{unit}", ms / len);
            ms %= len;
        }
    }
    if ms > 0 {
        let _ = write!(out, "{ms}ms");
    }
    out
}

fn values_text(l: &Layout, vals: impl IntoIterator<Item = Value>) -> String {
    l.fields
        .iter()
        .zip(vals)
        .map(|(f, v)| value_text(*f, v))
        .collect::<Vec<_>>()
        .join(" . ")
}

fn key_text(l: &Layout, k: &Key) -> String {
    match k {
        Key::Values(vals) => values_text(l, vals),
        Key::Prefix(addr, len) => format!("{addr}/{len}"),
    }
}

fn verdict_text(v: &Verdict) -> String {
    match v {
        Verdict::Accept => "accept".into(),
        Verdict::Drop => "drop".into(),
        Verdict::Return => "return".into(),
        Verdict::Jump(c) => format!("jump {c}"),
        Verdict::Goto(c) => format!("goto {c}"),
    }
}

fn render_chain(out: &mut String, family: Family, c: &Chain) {
    let _ = writeln!(out, "\tchain {} {{", c.name);
    if let Some(b) = &c.base {
        let policy = match b.policy {
            Policy::Accept => "accept",
            Policy::Drop => "drop",
        };
        let _ = writeln!(
            out,
            "\t\ttype {} hook {} priority {}; policy {policy};",
            b.chain_type.keyword(),
            b.hook.keyword(),
            b.priority
        );
    }
    for r in &c.rules {
        let _ = writeln!(out, "\t\t{}", rule_text(family, r));
    }
    out.push_str("\t}\n");
}

/// One rule in nft syntax.
pub fn rule_text(family: Family, r: &Rule) -> String {
    let mut parts: Vec<String> = r.stmts.iter().map(|s| stmt_text(family, s)).collect();
    if let Some(c) = &r.comment {
        parts.push(format!("comment {}", quote(c)));
    }
    parts.join(" ")
}

fn keys_text(family: Family, keys: &[Expr]) -> String {
    keys.iter()
        .map(|k| k.text(family))
        .collect::<Vec<_>>()
        .join(" . ")
}

fn nat_family_kw(family: Family, addr_is_v6: bool) -> &'static str {
    if addr_is_v6 {
        "ip6"
    } else if family == Family::Ip6 {
        // an ip6 table can only NAT to IPv6; keep the keyword for clarity
        "ip6"
    } else {
        "ip"
    }
}

fn stmt_text(family: Family, s: &Stmt) -> String {
    match s {
        Stmt::Cmp { left, op, right } => {
            let v = value_text(left.field(family), *right);
            match op {
                CmpOp::Eq => format!("{} {v}", left.text(family)),
                CmpOp::Neq => format!("{} != {v}", left.text(family)),
            }
        }
        Stmt::Masked { left, mask, value } => {
            format!("{} & 0x{mask:08x} == 0x{value:08x}", left.text(family))
        }
        Stmt::AnyBits { left, bits } => {
            let key = match left {
                Expr::Ct(k) => *k,
                _ => CtKey::State,
            };
            format!("{} {}", left.text(family), ct_bits_text(key, *bits))
        }
        Stmt::Lookup { keys, set, negate } => {
            let op = if *negate { "!= " } else { "" };
            format!("{} {op}@{set}", keys_text(family, keys))
        }
        Stmt::Vmap { keys, map } => format!("{} vmap @{map}", keys_text(family, keys)),
        Stmt::AnonVmap { keys, map } => anon_vmap_text(family, keys, map),
        Stmt::Counter { packets, bytes } => format!("counter packets {packets} bytes {bytes}"),
        Stmt::CounterRef(name) => format!("counter name {}", quote(name)),
        Stmt::CounterMap { keys, map } => {
            format!("counter name {} map @{map}", keys_text(family, keys))
        }
        Stmt::SetUpdate { keys, set, timeout } => {
            let timeout = timeout
                .map(|t| format!(" timeout {}", duration_text(t)))
                .unwrap_or_default();
            format!("update @{set} {{ {}{timeout} }}", keys_text(family, keys))
        }
        Stmt::Nat { kind, addr, port } => nat_text(family, *kind, addr, *port),
        Stmt::NatMap { kind, keys, map } => format!(
            "{}{} to {} map @{map}",
            nat_kind(*kind),
            if family == Family::Ip6 { " ip6" } else { " ip" },
            keys_text(family, keys)
        ),
        Stmt::Masquerade {
            fully_random: false,
        } => "masquerade".into(),
        Stmt::Masquerade { fully_random: true } => "masquerade fully-random".into(),
        Stmt::Reject(Reject::PortUnreachable) => "reject".into(),
        Stmt::Reject(Reject::TcpReset) => "reject with tcp reset".into(),
        Stmt::MarkOr(bits) => format!("meta mark set meta mark | 0x{bits:08x}"),
        Stmt::Verdict(v) => verdict_text(v),
    }
}

fn anon_vmap_text(family: Family, keys: &[Expr], map: &AnonVmap) -> String {
    let layout = Layout::of_exprs(keys, family);
    let elems: Vec<_> = map
        .elements
        .iter()
        .map(|(k, v)| {
            format!(
                "{} : {}",
                values_text(&layout, k.iter().copied()),
                verdict_text(v)
            )
        })
        .collect();
    format!(
        "{} vmap {{ {} }}",
        keys_text(family, keys),
        elems.join(", ")
    )
}

fn nat_text(family: Family, kind: NatKind, addr: &std::net::IpAddr, port: Option<u16>) -> String {
    let k = nat_kind(kind);
    let fam = if family == Family::Inet {
        format!(" {}", nat_family_kw(family, addr.is_ipv6()))
    } else {
        String::new()
    };
    match (addr, port) {
        (std::net::IpAddr::V6(a), Some(p)) => format!("{k}{fam} to [{a}]:{p}"),
        (a, Some(p)) => format!("{k}{fam} to {a}:{p}"),
        (a, None) => format!("{k}{fam} to {a}"),
    }
}

fn nat_kind(k: NatKind) -> &'static str {
    match k {
        NatKind::Snat => "snat",
        NatKind::Dnat => "dnat",
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn durations_read_as_nft_prints_them() {
        for (ms, text) in [
            (10_800_000, "3h"),
            (2_000, "2s"),
            (90_000, "1m30s"),
            (86_400_000, "1d"),
            (93_784_005, "1d2h3m4s5ms"),
            (250, "250ms"),
        ] {
            assert_eq!(duration_text(Duration::from_millis(ms)), text);
        }
    }

    #[test]
    fn a_dynamic_set_and_its_update_render_as_nft_lists_them() {
        let mut t = Table::new(Family::Ip6, "nodelb");
        t.add_set(
            Set::new("affinity-a", SetType::Type(vec![DataType::Ipv6Addr]))
                .dynamic(Duration::from_secs(10_800))
                .with_comment("default/web:http"),
        );
        t.add_chain(Chain::regular("ep").rule(Rule::new(vec![Stmt::SetUpdate {
            keys: vec![Expr::Payload(Payload::Ip6Saddr)],
            set: "affinity-a".into(),
            timeout: Some(Duration::from_secs(10_800)),
        }])));
        let text = render_table(&t);
        assert!(
            text.contains(
                "\tset affinity-a {\n\t\ttype ipv6_addr\n\t\tflags dynamic,timeout\n\t\ttimeout 3h\n\t\tcomment \"default/web:http\"\n\t}"
            ),
            "{text}"
        );
        assert!(
            text.contains("\t\tupdate @affinity-a { ip6 saddr timeout 3h }\n"),
            "{text}"
        );
    }

    #[test]
    fn a_masquerade_renders_fully_random_only_when_asked() {
        for (fully_random, text) in [(false, "masquerade"), (true, "masquerade fully-random")] {
            assert_eq!(
                stmt_text(Family::Ip, &Stmt::Masquerade { fully_random }),
                text
            );
        }
    }

    #[test]
    fn renders_a_small_table_as_nft_text() {
        let mut t = Table::new(Family::Ip, "nodelb");
        let mut s = Set::map(
            "services",
            SetType::Type(vec![
                DataType::Ipv4Addr,
                DataType::InetProto,
                DataType::InetService,
            ]),
            MapData::Verdict,
        );
        s.insert(
            Key::Values(
                vec![
                    Value::Ipv4("203.0.113.1".parse().unwrap()),
                    Value::Proto(L4Proto::Tcp),
                    Value::Port(80),
                ]
                .into(),
            ),
            Some(ElemData::Verdict(Verdict::Goto("ep".into()))),
            Some("default/web:http".into()),
        );
        t.add_set(s);
        t.add_chain(
            Chain::base(
                "prerouting",
                ChainType::Nat,
                Hook::Prerouting,
                -100,
                Policy::Accept,
            )
            .rule(
                Rule::new(vec![Stmt::Vmap {
                    keys: vec![
                        Expr::Payload(Payload::IpDaddr),
                        Expr::Meta(MetaKey::L4Proto),
                        Expr::Payload(Payload::ThDport),
                    ],
                    map: "services".into(),
                }])
                .with_comment("dispatch"),
            ),
        );
        t.add_chain(Chain::regular("ep").rule(Rule::new(vec![
            Stmt::cmp(Expr::Meta(MetaKey::L4Proto), Value::Proto(L4Proto::Tcp)),
            Stmt::Nat {
                kind: NatKind::Dnat,
                addr: "198.51.100.2".parse().unwrap(),
                port: Some(8080),
            },
        ])));
        let want = "table ip nodelb {
\tmap services {
\t\ttype ipv4_addr . inet_proto . inet_service : verdict
\t\telements = { 203.0.113.1 . tcp . 80 comment \"default/web:http\" : goto ep }
\t}

\tchain ep {
\t\tmeta l4proto tcp dnat to 198.51.100.2:8080
\t}

\tchain prerouting {
\t\ttype nat hook prerouting priority -100; policy accept;
\t\tip daddr . meta l4proto . th dport vmap @services comment \"dispatch\"
\t}
}
";
        assert_eq!(render_table(&t), want);

        let mut c = Counter::new("svc/default/web/http").with_comment("default/web:http");
        c.packets = 3;
        c.bytes = 180;
        t.add_counter(c);
        let mut m = Set::map(
            "svc-counters",
            SetType::Type(vec![DataType::InetService]),
            MapData::Counter,
        );
        m.insert(
            Key::Values(vec![Value::Port(80)].into()),
            Some(ElemData::Counter("svc/default/web/http".into())),
            None,
        );
        t.add_set(m);
        t.chain_mut("ep").unwrap().push(Rule::new(vec![
            Stmt::CounterRef("svc/default/web/http".into()),
            Stmt::CounterMap {
                keys: vec![Expr::Payload(Payload::ThDport)],
                map: "svc-counters".into(),
            },
        ]));
        let text = render_table(&t);
        assert!(
            text.starts_with(
                "table ip nodelb {
\tcounter svc/default/web/http {
\t\tcomment \"default/web:http\"
\t\tpackets 3 bytes 180
\t}
"
            ),
            "{text}"
        );
        assert!(
            text.contains(
                "\t\ttype inet_service : counter\n\t\telements = { 80 : \"svc/default/web/http\" }"
            ),
            "{text}"
        );
        assert!(
            text.contains(
                "counter name \"svc/default/web/http\" counter name th dport map @svc-counters"
            ),
            "{text}"
        );
        assert!(render_replace(&t)
            .starts_with("add table ip nodelb\ndelete table ip nodelb\ntable ip nodelb {"));
    }
}
