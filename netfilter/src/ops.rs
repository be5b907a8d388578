//! Pure planning of what to send: a full replace of a table, or the difference between the
//! last committed model and a new one. No sockets here; `encode` turns operations into bytes.

use crate::model::*;
use std::collections::BTreeSet;
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
pub enum Op {
    AddTable(TableRef),
    DelTable(TableRef),
    /// Declares a chain (its rules are added by `AddRule`).
    AddChain(TableRef, Chain),
    FlushChain(TableRef, String),
    DelChain(TableRef, String),
    AddRule {
        table: TableRef,
        chain: String,
        index: usize,
        rule: Rule,
    },
    /// Declares a set (its elements are added by `AddElems`).
    AddSet(TableRef, Set),
    DelSet(TableRef, String),
    AddElems {
        table: TableRef,
        set: Set,
        elems: Vec<(Key, Element)>,
    },
    DelElems {
        table: TableRef,
        set: Set,
        keys: Vec<Key>,
    },
}

/// A set's declaration without its elements, for operations that only need the shape.
fn decl(s: &Set) -> Set {
    Set {
        elements: Default::default(),
        ..s.clone()
    }
}

fn chain_decl(c: &Chain) -> Chain {
    Chain {
        rules: Vec::new(),
        ..c.clone()
    }
}

/// Operations that create the table's whole content, in an order the kernel accepts:
/// chains before the elements and rules that jump to them, sets before rules that use them.
fn create_content(t: &Table, ops: &mut Vec<Op>) {
    let tr = TableRef::of(t);
    for c in t.chains.values() {
        ops.push(Op::AddChain(tr.clone(), chain_decl(c)));
    }
    for s in t.sets.values() {
        ops.push(Op::AddSet(tr.clone(), decl(s)));
        if !s.elements.is_empty() {
            ops.push(Op::AddElems {
                table: tr.clone(),
                set: decl(s),
                elems: s
                    .elements
                    .iter()
                    .map(|(k, e)| (k.clone(), e.clone()))
                    .collect(),
            });
        }
    }
    for c in t.chains.values() {
        push_rules(&tr, c, ops);
    }
}

fn push_rules(tr: &TableRef, c: &Chain, ops: &mut Vec<Op>) {
    for (i, r) in c.rules.iter().enumerate() {
        ops.push(Op::AddRule {
            table: tr.clone(),
            chain: c.name.clone(),
            index: i,
            rule: r.clone(),
        });
    }
}

/// Atomically replace the table, whether or not it exists: `add table` first, so the
/// `delete table` that follows cannot fail, then everything anew.
pub fn full_replace(t: &Table) -> Vec<Op> {
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
pub fn delete_table(t: &TableRef) -> Vec<Op> {
    vec![Op::AddTable(t.clone()), Op::DelTable(t.clone())]
}

/// The result of diffing two models of one table.
#[derive(Debug, Default, PartialEq)]
pub struct Diff {
    /// Operations for this sync's batch.
    pub ops: Vec<Op>,
    /// Chains no longer in the model. They were flushed in `ops`; deleting them is left to a
    /// later batch, because a chain just unreferenced can still be busy on older kernels
    /// (kubernetes/kubernetes#122604).
    pub stale_chains: Vec<String>,
    /// True when the difference could not be expressed incrementally (a set's declaration or
    /// a base chain's hook changed) and `ops` is a full replace.
    pub replaced: bool,
}

/// The operations that turn `old` (what the kernel holds) into `new`.
pub fn diff(old: &Table, new: &Table) -> Diff {
    assert_eq!(
        (old.family, &old.name),
        (new.family, &new.name),
        "diff compares two models of one table"
    );
    let tr = TableRef::of(new);

    // Declarations that cannot be changed in place: fall back to a full replace.
    let set_changed = new
        .sets
        .values()
        .any(|s| old.sets.get(&s.name).is_some_and(|o| !o.same_decl(s)));
    let base_changed = new
        .chains
        .values()
        .any(|c| old.chains.get(&c.name).is_some_and(|o| o.base != c.base));
    if set_changed || base_changed {
        return Diff {
            ops: full_replace(new),
            stale_chains: Vec::new(),
            replaced: true,
        };
    }

    let mut ops = Vec::new();
    // 1. New chains and sets, so that elements and rules below may refer to them.
    for c in new
        .chains
        .values()
        .filter(|c| !old.chains.contains_key(&c.name))
    {
        ops.push(Op::AddChain(tr.clone(), chain_decl(c)));
    }
    for s in new
        .sets
        .values()
        .filter(|s| !old.sets.contains_key(&s.name))
    {
        ops.push(Op::AddSet(tr.clone(), decl(s)));
    }
    // 2. Elements: delete what went or changed, then add what came or changed.
    for s in new.sets.values() {
        let Some(o) = old.sets.get(&s.name) else {
            if !s.elements.is_empty() {
                ops.push(Op::AddElems {
                    table: tr.clone(),
                    set: decl(s),
                    elems: s
                        .elements
                        .iter()
                        .map(|(k, e)| (k.clone(), e.clone()))
                        .collect(),
                });
            }
            continue;
        };
        let gone: Vec<Key> = o
            .elements
            .iter()
            .filter(|(k, e)| s.elements.get(*k) != Some(*e))
            .map(|(k, _)| k.clone())
            .collect();
        let came: Vec<(Key, Element)> = s
            .elements
            .iter()
            .filter(|(k, e)| o.elements.get(*k) != Some(*e))
            .map(|(k, e)| (k.clone(), e.clone()))
            .collect();
        if !gone.is_empty() {
            ops.push(Op::DelElems {
                table: tr.clone(),
                set: decl(s),
                keys: gone,
            });
        }
        if !came.is_empty() {
            ops.push(Op::AddElems {
                table: tr.clone(),
                set: decl(s),
                elems: came,
            });
        }
    }
    // 3. Rules: a chain whose rules changed is flushed and refilled; new chains are filled.
    for c in new.chains.values() {
        match old.chains.get(&c.name) {
            Some(o) if o.rules == c.rules => {}
            Some(_) => {
                ops.push(Op::FlushChain(tr.clone(), c.name.clone()));
                push_rules(&tr, c, &mut ops);
            }
            None => push_rules(&tr, c, &mut ops),
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
    Diff {
        ops,
        stale_chains,
        replaced: false,
    }
}

/// Check a model for references the kernel would reject, so a broken model fails before it
/// is sent, with a message that names the rule.
pub fn validate(t: &Table) -> Result<(), String> {
    let chains: BTreeSet<&str> = t.chains.keys().map(|s| s.as_str()).collect();
    for c in t.chains.values() {
        for (i, r) in c.rules.iter().enumerate() {
            for s in &r.stmts {
                for target in s.chain_targets() {
                    if !chains.contains(target) {
                        return Err(format!(
                            "rule {i} of chain {} {} jumps to missing chain {target}",
                            t.family, c.name
                        ));
                    }
                }
                if let Some(set) = s.set_refs() {
                    if !t.sets.contains_key(set) {
                        return Err(format!(
                            "rule {i} of chain {} {} refers to missing set {set}",
                            t.family, c.name
                        ));
                    }
                }
            }
        }
    }
    for s in t.sets.values() {
        for e in s.elements.values() {
            if let Some(ElemData::Verdict(v)) = &e.data {
                if let Some(target) = v.target() {
                    if !chains.contains(target) {
                        return Err(format!(
                            "an element of set {} {} jumps to missing chain {target}",
                            t.family, s.name
                        ));
                    }
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
            Key::Values(vec![Value::Port(port)]),
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
            })
            .collect()
    }

    #[test]
    fn unchanged_model_sends_nothing() {
        let d = diff(&table(80, false), &table(80, false));
        assert!(d.ops.is_empty() && d.stale_chains.is_empty() && !d.replaced);
    }

    #[test]
    fn changed_element_is_deleted_then_added_and_nothing_else() {
        let d = diff(&table(80, false), &table(81, false));
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
            kinds(&diff(&old, &new).ops),
            vec!["flush chain", "add rule", "add rule"]
        );
    }

    #[test]
    fn removed_chain_is_flushed_now_and_deleted_later() {
        let d = diff(&table(80, true), &table(80, false));
        assert_eq!(kinds(&d.ops), vec!["flush chain"]);
        assert_eq!(d.stale_chains, vec!["extra".to_string()]);
    }

    #[test]
    fn new_chain_is_declared_before_elements_that_jump_to_it() {
        let old = table(80, false);
        let mut new = old.clone();
        new.add_chain(Chain::regular("ep2"));
        new.set_mut("services").unwrap().insert(
            Key::Values(vec![Value::Port(90)]),
            Some(ElemData::Verdict(Verdict::Jump("ep2".into()))),
            None,
        );
        assert_eq!(
            kinds(&diff(&old, &new).ops),
            vec!["add chain", "add elements"]
        );
    }

    #[test]
    fn changed_set_declaration_falls_back_to_a_full_replace() {
        let old = table(80, false);
        let mut new = old.clone();
        new.set_mut("services").unwrap().comment = Some("now with a comment".into());
        let d = diff(&old, &new);
        assert!(d.replaced);
        assert_eq!(
            &kinds(&d.ops)[..3],
            &["add table", "delete table", "add table"]
        );
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
