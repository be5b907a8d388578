//! Pure planning of what to send: a full replace of a table, or the difference between the
//! last committed model and a new one. No sockets here; `encode` turns operations into bytes.
//! Operations borrow from the models, so planning a 60,000-element table copies nothing.

use crate::model::*;
use std::cmp::Ordering;
use std::collections::{BTreeMap, BTreeSet};
use std::fmt;

/// Which table an operation applies to.
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

impl fmt::Display for TableRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} {}", self.family, self.name)
    }
}

/// One change to the kernel's ruleset.
#[derive(Clone, Debug, PartialEq)]
pub enum Op<'a> {
    AddTable(TableRef),
    DelTable(TableRef),
    /// Declares a chain (its rules are added by `AddRule`).
    AddChain(TableRef, &'a Chain),
    FlushChain(TableRef, String),
    DelChain(TableRef, String),
    AddRule {
        table: TableRef,
        chain: &'a str,
        index: usize,
        rule: &'a Rule,
    },
    /// Declares a set (its elements are added by `AddElems`).
    AddSet(TableRef, &'a Set),
    DelSet(TableRef, String),
    /// Adds elements to `set` (whose declaration, not elements, is used).
    AddElems {
        table: TableRef,
        set: &'a Set,
        elems: Vec<(&'a Key, &'a Element)>,
    },
    DelElems {
        table: TableRef,
        set: &'a Set,
        keys: Vec<&'a Key>,
    },
    /// Creates a counter object, starting from the values it carries.
    AddCounter(TableRef, &'a Counter),
    DelCounter(TableRef, String),
}

/// Operations that create the table's whole content, in an order the kernel accepts:
/// chains before the elements and rules that jump to them, counters and sets before the
/// elements and rules that use them.
fn create_content<'a>(t: &'a Table, ops: &mut Vec<Op<'a>>) {
    let tr = TableRef::of(t);
    for c in t.counters.values() {
        ops.push(Op::AddCounter(tr.clone(), c));
    }
    for c in t.chains.values() {
        ops.push(Op::AddChain(tr.clone(), c));
    }
    for s in t.sets.values() {
        ops.push(Op::AddSet(tr.clone(), s));
        if !s.elements.is_empty() {
            ops.push(Op::AddElems {
                table: tr.clone(),
                set: s,
                elems: s.elements.iter().collect(),
            });
        }
    }
    for c in t.chains.values() {
        push_rules(&tr, c, ops);
    }
}

fn push_rules<'a>(tr: &TableRef, c: &'a Chain, ops: &mut Vec<Op<'a>>) {
    for (i, r) in c.rules.iter().enumerate() {
        ops.push(Op::AddRule {
            table: tr.clone(),
            chain: &c.name,
            index: i,
            rule: r,
        });
    }
}

/// Atomically replace the table, whether or not it exists: `add table` first, so the
/// `delete table` that follows cannot fail, then everything anew.
pub fn full_replace(t: &Table) -> Vec<Op<'_>> {
    let tr = TableRef::of(t);
    let mut ops = vec![
        Op::AddTable(tr.clone()),
        Op::DelTable(tr.clone()),
        Op::AddTable(tr),
    ];
    create_content(t, &mut ops);
    ops
}

/// Delete the table if it exists (the same `add` then `delete` trick).
pub fn delete_table(t: &TableRef) -> Vec<Op<'static>> {
    vec![Op::AddTable(t.clone()), Op::DelTable(t.clone())]
}

/// The result of diffing two models of one table.
#[derive(Debug, Default, PartialEq)]
pub struct Diff<'a> {
    /// Operations for this sync's batch.
    pub ops: Vec<Op<'a>>,
    /// Chains no longer in the model. They were flushed in `ops`; deleting them is left to a
    /// later batch, because a chain just unreferenced can still be busy on older kernels
    /// (kubernetes/kubernetes#122604).
    pub stale_chains: Vec<String>,
    /// True when the difference could not be expressed incrementally (a set's declaration, a
    /// base chain's hook or a counter's comment changed) and `ops` is a full replace.
    pub replaced: bool,
}

/// Elements only in `old` (or changed), and only in `new` (or changed), by walking both
/// sorted maps side by side.
fn element_changes<'a>(
    old: &'a BTreeMap<Key, Element>,
    new: &'a BTreeMap<Key, Element>,
) -> (Vec<&'a Key>, Vec<(&'a Key, &'a Element)>) {
    let (mut gone, mut came) = (Vec::new(), Vec::new());
    let (mut o, mut n) = (old.iter().peekable(), new.iter().peekable());
    loop {
        match (o.peek(), n.peek()) {
            (None, None) => break,
            (Some(&(k, _)), None) => {
                gone.push(k);
                o.next();
            }
            (None, Some(&kv)) => {
                came.push(kv);
                n.next();
            }
            (Some(&(ok, oe)), Some(&(nk, ne))) => match ok.cmp(nk) {
                Ordering::Less => {
                    gone.push(ok);
                    o.next();
                }
                Ordering::Greater => {
                    came.push((nk, ne));
                    n.next();
                }
                Ordering::Equal => {
                    if oe != ne {
                        gone.push(ok);
                        came.push((nk, ne));
                    }
                    o.next();
                    n.next();
                }
            },
        }
    }
    (gone, came)
}

/// Whether going from `old` to `new` changes a declaration that cannot be changed in place (a
/// set's, a base chain's hook, a counter's comment), so `diff` falls back to a full replace.
pub fn needs_full_replace(old: &Table, new: &Table) -> bool {
    let set_changed = new
        .sets
        .values()
        .any(|s| old.sets.get(&s.name).is_some_and(|o| !o.same_decl(s)));
    let base_changed = new
        .chains
        .values()
        .any(|c| old.chains.get(&c.name).is_some_and(|o| o.base != c.base));
    // A counter is compared by name and comment only (`Counter`'s equality), never by its
    // values: a sync must not reset it.
    let counter_changed = new
        .counters
        .values()
        .any(|c| old.counters.get(&c.name).is_some_and(|o| o != c));
    set_changed || base_changed || counter_changed
}

/// The operations that turn `old` (what the kernel holds) into `new`. Everything `new` adds
/// is checked for references the kernel would refuse (see `validate`).
pub fn diff<'a>(old: &'a Table, new: &'a Table) -> Result<Diff<'a>, String> {
    assert_eq!(
        (old.family, &old.name),
        (new.family, &new.name),
        "diff compares two models of one table"
    );
    let tr = TableRef::of(new);

    // Declarations that cannot be changed in place: fall back to a full replace.
    if needs_full_replace(old, new) {
        validate(new)?;
        return Ok(Diff {
            ops: full_replace(new),
            stale_chains: Vec::new(),
            replaced: true,
        });
    }

    let mut ops = Vec::new();
    // 1. New counters, chains and sets, so that elements and rules below may refer to them.
    for c in new
        .counters
        .values()
        .filter(|c| !old.counters.contains_key(&c.name))
    {
        ops.push(Op::AddCounter(tr.clone(), c));
    }
    for c in new
        .chains
        .values()
        .filter(|c| !old.chains.contains_key(&c.name))
    {
        ops.push(Op::AddChain(tr.clone(), c));
    }
    for s in new
        .sets
        .values()
        .filter(|s| !old.sets.contains_key(&s.name))
    {
        ops.push(Op::AddSet(tr.clone(), s));
    }
    // 2. Elements: delete what went or changed, then add what came or changed.
    for s in new.sets.values() {
        let (gone, came) = match old.sets.get(&s.name) {
            Some(o) => element_changes(&o.elements, &s.elements),
            None => (Vec::new(), s.elements.iter().collect()),
        };
        for (_, e) in &came {
            validate_element(new, s, e)?;
        }
        if !gone.is_empty() {
            ops.push(Op::DelElems {
                table: tr.clone(),
                set: s,
                keys: gone,
            });
        }
        if !came.is_empty() {
            ops.push(Op::AddElems {
                table: tr.clone(),
                set: s,
                elems: came,
            });
        }
    }
    // 3. Rules: a chain whose rules changed is flushed and refilled; new chains are filled.
    for c in new.chains.values() {
        let refill = match old.chains.get(&c.name) {
            Some(o) if o.rules == c.rules => false,
            Some(_) => {
                ops.push(Op::FlushChain(tr.clone(), c.name.clone()));
                true
            }
            None => true,
        };
        if refill {
            for (i, r) in c.rules.iter().enumerate() {
                validate_rule(new, c, i, r)?;
            }
            push_rules(&tr, c, &mut ops);
        }
    }
    // 4. Chains that went: flushed now (dropping their references), deleted later.
    let mut stale_chains = Vec::new();
    for c in old
        .chains
        .values()
        .filter(|c| !new.chains.contains_key(&c.name))
    {
        ops.push(Op::FlushChain(tr.clone(), c.name.clone()));
        stale_chains.push(c.name.clone());
    }
    // 5. Sets that went, once no rule refers to them any more.
    for s in old
        .sets
        .values()
        .filter(|s| !new.sets.contains_key(&s.name))
    {
        ops.push(Op::DelSet(tr.clone(), s.name.clone()));
    }
    // 6. Counters that went, once no rule or element refers to them any more.
    for c in old
        .counters
        .values()
        .filter(|c| !new.counters.contains_key(&c.name))
    {
        ops.push(Op::DelCounter(tr.clone(), c.name.clone()));
    }
    Ok(Diff {
        ops,
        stale_chains,
        replaced: false,
    })
}

/// What exists in the table a check is made against (the table itself, or a table with an
/// edit applied).
pub(crate) struct Names<'a> {
    pub family: Family,
    pub chain: &'a dyn Fn(&str) -> bool,
    pub set: &'a dyn Fn(&str) -> bool,
    pub counter: &'a dyn Fn(&str) -> bool,
}

impl Names<'_> {
    /// Every chain, set and counter rule `i` of `chain` refers to exists.
    pub(crate) fn check_rule(&self, chain: &str, i: usize, r: &Rule) -> Result<(), String> {
        let f = self.family;
        for s in &r.stmts {
            for target in s.chain_targets() {
                if !(self.chain)(target) {
                    return Err(format!(
                        "rule {i} of chain {f} {chain} jumps to missing chain {target}"
                    ));
                }
            }
            if let Some(set) = s.set_refs() {
                if !(self.set)(set) {
                    return Err(format!(
                        "rule {i} of chain {f} {chain} refers to missing set {set}"
                    ));
                }
            }
            if let Some(counter) = s.counter_ref() {
                if !(self.counter)(counter) {
                    return Err(format!(
                        "rule {i} of chain {f} {chain} counts into missing counter {counter}"
                    ));
                }
            }
        }
        Ok(())
    }

    /// The chain or counter an element of `set` names exists.
    pub(crate) fn check_element(&self, set: &str, e: &Element) -> Result<(), String> {
        let f = self.family;
        match &e.data {
            Some(ElemData::Counter(name)) if !(self.counter)(name) => Err(format!(
                "an element of map {f} {set} names missing counter {name}"
            )),
            Some(ElemData::Verdict(v)) => match v.target() {
                Some(target) if !(self.chain)(target) => Err(format!(
                    "an element of set {f} {set} jumps to missing chain {target}"
                )),
                _ => Ok(()),
            },
            _ => Ok(()),
        }
    }
}

fn validate_rule(t: &Table, c: &Chain, i: usize, r: &Rule) -> Result<(), String> {
    Names {
        family: t.family,
        chain: &|n| t.chains.contains_key(n),
        set: &|n| t.sets.contains_key(n),
        counter: &|n| t.counters.contains_key(n),
    }
    .check_rule(&c.name, i, r)
}

fn validate_element(t: &Table, s: &Set, e: &Element) -> Result<(), String> {
    Names {
        family: t.family,
        chain: &|n| t.chains.contains_key(n),
        set: &|n| t.sets.contains_key(n),
        counter: &|n| t.counters.contains_key(n),
    }
    .check_element(&s.name, e)
}

/// Check a model for references the kernel would reject, so a broken model fails before it
/// is sent, with a message that names the rule.
pub fn validate(t: &Table) -> Result<(), String> {
    for c in t.chains.values() {
        for (i, r) in c.rules.iter().enumerate() {
            validate_rule(t, c, i, r)?;
        }
    }
    for s in t.sets.values().filter(|s| s.data == Some(MapData::Counter)) {
        for e in s.elements.values() {
            validate_element(t, s, e)?;
        }
    }
    // Elements only jump to a handful of chains: check each distinct target once.
    for s in t.sets.values().filter(|s| s.data == Some(MapData::Verdict)) {
        let mut seen = BTreeSet::new();
        for e in s.elements.values() {
            if let Some(ElemData::Verdict(v)) = &e.data {
                if v.target().is_some_and(|c| seen.insert(c)) {
                    validate_element(t, s, e)?;
                }
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::Ipv4Addr;

    fn table(port: u16, extra_chain: bool) -> Table {
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

    fn kinds(ops: &[Op]) -> Vec<&'static str> {
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
                Op::AddCounter(..) => "add counter",
                Op::DelCounter(..) => "delete counter",
            })
            .collect()
    }

    #[test]
    fn unchanged_model_sends_nothing() {
        let (a, b) = (table(80, false), table(80, false));
        let d = diff(&a, &b).unwrap();
        assert!(d.ops.is_empty() && d.stale_chains.is_empty() && !d.replaced);
    }

    #[test]
    fn changed_element_is_deleted_then_added_and_nothing_else() {
        let (a, b) = (table(80, false), table(81, false));
        let d = diff(&a, &b).unwrap();
        assert_eq!(kinds(&d.ops), vec!["delete elements", "add elements"]);
    }

    #[test]
    fn changed_rule_refills_only_its_chain() {
        let old = table(80, false);
        let mut new = old.clone();
        new.chain_mut("ep")
            .unwrap()
            .push(Rule::new(vec![Stmt::counter()]));
        assert_eq!(
            kinds(&diff(&old, &new).unwrap().ops),
            vec!["flush chain", "add rule", "add rule"]
        );
    }

    #[test]
    fn removed_chain_is_flushed_now_and_deleted_later() {
        let (a, b) = (table(80, true), table(80, false));
        let d = diff(&a, &b).unwrap();
        assert_eq!(kinds(&d.ops), vec!["flush chain"]);
        assert_eq!(d.stale_chains, vec!["extra".to_string()]);
    }

    #[test]
    fn new_chain_is_declared_before_elements_that_jump_to_it() {
        let old = table(80, false);
        let mut new = old.clone();
        new.add_chain(Chain::regular("ep2"));
        new.set_mut("services").unwrap().insert(
            Key::Values(vec![Value::Port(90)].into()),
            Some(ElemData::Verdict(Verdict::Jump("ep2".into()))),
            None,
        );
        assert_eq!(
            kinds(&diff(&old, &new).unwrap().ops),
            vec!["add chain", "add elements"]
        );
    }

    #[test]
    fn changed_set_declaration_falls_back_to_a_full_replace() {
        let old = table(80, false);
        let mut new = old.clone();
        new.set_mut("services").unwrap().comment = Some("now with a comment".into());
        let d = diff(&old, &new).unwrap();
        assert!(d.replaced);
        assert_eq!(
            &kinds(&d.ops)[..3],
            &["add table", "delete table", "add table"]
        );
    }

    #[test]
    fn diff_refuses_new_references_to_missing_chains() {
        let old = table(80, false);
        let mut new = old.clone();
        new.set_mut("services").unwrap().insert(
            Key::Values(vec![Value::Port(90)].into()),
            Some(ElemData::Verdict(Verdict::Jump("nowhere".into()))),
            None,
        );
        assert!(diff(&old, &new)
            .unwrap_err()
            .contains("missing chain nowhere"));
    }

    /// `table(80)` plus a counter, a counter map naming it and a rule counting into both.
    fn counted(port: u16, packets: u64) -> Table {
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

    #[test]
    fn counter_values_never_make_a_difference() {
        // The kernel's baseline was seeded with carried-over values; the new plan has zeros.
        let (old, new) = (counted(80, 1234), counted(80, 0));
        assert_eq!(
            old, new,
            "a counter's values are not part of the model's identity"
        );
        let d = diff(&old, &new).unwrap();
        assert!(d.ops.is_empty() && !d.replaced, "{:?}", kinds(&d.ops));
        // Elements around the counter change; the counter is not touched.
        let (a, b) = (counted(80, 7), counted(81, 0));
        let d = diff(&a, &b).unwrap();
        assert!(!kinds(&d.ops).contains(&"add counter"));
        assert!(!kinds(&d.ops).contains(&"delete counter"));
    }

    #[test]
    fn counters_are_created_before_their_users_and_deleted_after() {
        let (old, new) = (table(80, false), counted(80, 0));
        let k = kinds(&diff(&old, &new).unwrap().ops);
        assert_eq!(k[0], "add counter", "{k:?}");
        let k = kinds(&diff(&new, &old).unwrap().ops);
        assert_eq!(k.last(), Some(&"delete counter"), "{k:?}");
        let k = kinds(&full_replace(&new));
        let first_use = k
            .iter()
            .position(|o| *o == "add elements" || *o == "add rule")
            .unwrap();
        assert!(k.iter().position(|o| *o == "add counter").unwrap() < first_use);
    }

    #[test]
    fn a_counter_whose_comment_changes_is_a_full_replace() {
        let old = counted(80, 0);
        let mut new = old.clone();
        new.counters.get_mut("svc/web").unwrap().comment = Some("renamed".into());
        assert!(diff(&old, &new).unwrap().replaced);
    }

    #[test]
    fn missing_counters_are_refused() {
        let mut t = counted(80, 0);
        t.counters.clear();
        assert!(validate(&t)
            .unwrap_err()
            .contains("missing counter svc/web"));
        let old = table(80, false);
        assert!(diff(&old, &t)
            .unwrap_err()
            .contains("missing counter svc/web"));
    }

    #[test]
    fn seeding_sets_only_named_counters() {
        let mut t = counted(80, 0);
        t.add_counter(Counter::new("other"));
        t.seed_counters(&[("svc/web".to_string(), (5, 500))].into());
        assert_eq!(
            (t.counters["svc/web"].packets, t.counters["svc/web"].bytes),
            (5, 500)
        );
        assert_eq!(t.counters["other"].packets, 0);
    }

    #[test]
    fn validate_names_missing_chains_and_sets() {
        let mut t = table(80, false);
        t.chain_mut("ep")
            .unwrap()
            .push(Rule::new(vec![Stmt::Verdict(Verdict::Goto("gone".into()))]));
        assert_eq!(
            validate(&t).unwrap_err(),
            "rule 1 of chain ip ep jumps to missing chain gone"
        );
        let mut t = table(80, false);
        t.chain_mut("ep").unwrap().push(Rule::new(vec![Stmt::Vmap {
            keys: vec![],
            map: "nope".into(),
        }]));
        assert!(validate(&t).unwrap_err().contains("missing set nope"));
    }
}
