//! Pure planning of what to send: the operations of a table's full replace or deletion (an
//! [`Edit`](crate::Edit) makes its own). No sockets here; `encode` turns operations into
//! bytes. Operations borrow from the models, so planning a large table copies nothing.

use crate::model::*;

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
    /// Gives a dynamic set back elements it learned before a full replace, each expiring when
    /// it would have (at most the set's timeout from now).
    RestoreElems {
        table: TableRef,
        set: &'a Set,
        learned: &'a [crate::model::Learned],
    },
    /// Creates a counter object, starting from the values it carries.
    AddCounter(TableRef, &'a Counter),
    DelCounter(TableRef, String),
}

/// Operations that create the table's whole content, in an order the kernel accepts:
/// chains before the elements and rules that jump to them, counters and sets before the
/// elements and rules that use them. One at a time, as they are taken: a list of them all
/// would hold an operation per counter, thousands in a large table.
fn create_content(t: &Table) -> impl Iterator<Item = Op<'_>> {
    let tr = TableRef::of(t);
    let counters = {
        let tr = tr.clone();
        t.counters
            .values()
            .map(move |c| Op::AddCounter(tr.clone(), c))
    };
    let chains = {
        let tr = tr.clone();
        t.chains.values().map(move |c| Op::AddChain(tr.clone(), c))
    };
    let sets = {
        let tr = tr.clone();
        t.sets.values().flat_map(move |s| {
            let elems = (!s.elements.is_empty()).then(|| Op::AddElems {
                table: tr.clone(),
                set: s,
                elems: s.elements.iter().collect(),
            });
            std::iter::once(Op::AddSet(tr.clone(), s)).chain(elems)
        })
    };
    let rules = t.chains.values().flat_map(move |c| {
        let tr = tr.clone();
        c.rules.iter().enumerate().map(move |(i, r)| Op::AddRule {
            table: tr.clone(),
            chain: &c.name,
            index: i,
            rule: r,
        })
    });
    counters.chain(chains).chain(sets).chain(rules)
}

/// Atomically replace the table, whether or not it exists: `add table` first, so the
/// `delete table` that follows cannot fail, then everything anew.
pub fn full_replace(t: &Table) -> Vec<Op<'_>> {
    replace_ops(t).collect()
}

/// [`full_replace`]'s operations, one at a time.
pub fn replace_ops(t: &Table) -> impl Iterator<Item = Op<'_>> {
    let tr = TableRef::of(t);
    [
        Op::AddTable(tr.clone()),
        Op::DelTable(tr.clone()),
        Op::AddTable(tr),
    ]
    .into_iter()
    .chain(create_content(t))
}

/// Delete the table if it exists (the same `add` then `delete` trick).
pub fn delete_table(t: &TableRef) -> Vec<Op<'static>> {
    vec![Op::AddTable(t.clone()), Op::DelTable(t.clone())]
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fixtures::{counted, kinds, table};
    use crate::validate::validate;

    #[test]
    fn counters_are_created_before_their_users() {
        let new = counted(80, 0);
        let k = kinds(&full_replace(&new));
        let first_use = k
            .iter()
            .position(|o| *o == "add elements" || *o == "add rule")
            .unwrap();
        assert!(k.iter().position(|o| *o == "add counter").unwrap() < first_use);
    }

    #[test]
    fn missing_counters_are_refused() {
        let mut t = counted(80, 0);
        t.counters.clear();
        assert!(validate(&t)
            .unwrap_err()
            .to_string()
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
            validate(&t).unwrap_err().to_string(),
            "rule 1 of chain ip ep jumps to missing chain gone"
        );
        let mut t = table(80, false);
        t.chain_mut("ep").unwrap().push(Rule::new(vec![Stmt::Vmap {
            keys: vec![],
            map: "nope".into(),
        }]));
        assert!(validate(&t)
            .unwrap_err()
            .to_string()
            .contains("missing set nope"));
    }
}
