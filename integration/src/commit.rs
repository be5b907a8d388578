//! Committing whole models in tests and benches: the library commits a whole replace or an
//! [`Edit`]; a test that holds two models of a table derives the edit between them here and
//! commits it through [`Committer::commit`], the one call the agent uses.

use crate::netns::Netns;
use nodelb_core::objects::index::EndpointSlice;
use nodelb_core::plan::{Context, Objects, Planner, TableChange};
use nodelb_netfilter::*;
use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// The edit that turns `old` (what the kernel holds) into `new`, or `None` when only a whole
/// replace can (see [`needs_full_replace`]).
pub fn edit_between(old: &Table, new: &Table) -> Option<Edit> {
    if needs_full_replace(old, new) {
        return None;
    }
    let mut e = Edit {
        add_counters: only_in(&new.counters, &old.counters).cloned().collect(),
        del_counters: names(only_in(&old.counters, &new.counters), |c| &c.name),
        add_sets: only_in(&new.sets, &old.sets).cloned().collect(),
        del_sets: names(only_in(&old.sets, &new.sets), |s| &s.name),
        del_chains: names(only_in(&old.chains, &new.chains), |c| &c.name),
        ..Edit::default()
    };
    e.put_chains = new
        .chains
        .values()
        .filter(|c| old.chains.get(&c.name).is_none_or(|o| o.rules != c.rules))
        .cloned()
        .collect();
    for s in new.sets.values() {
        if let Some(o) = old.sets.get(&s.name) {
            let change = ElemEdit::between(&o.elements, &s.elements);
            if !change.del.is_empty() || !change.add.is_empty() {
                e.elements.insert(s.name.clone(), change);
            }
        }
    }
    Some(e)
}

/// Whether going from `old` to `new` changes a declaration that cannot be changed in place (a
/// set's, a base chain's hook, a counter's comment), so only a full replace can make it.
fn needs_full_replace(old: &Table, new: &Table) -> bool {
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

fn only_in<'a, V>(
    a: &'a BTreeMap<String, V>,
    b: &'a BTreeMap<String, V>,
) -> impl Iterator<Item = &'a V> {
    a.iter()
        .filter(|(k, _)| !b.contains_key(*k))
        .map(|(_, v)| v)
}

fn names<'a, V: 'a>(it: impl Iterator<Item = &'a V>, name: fn(&V) -> &String) -> Vec<String> {
    it.map(|v| name(v).clone()).collect()
}

/// Bring the kernel from the committer's models to `tables` in one commit: their edits when
/// every table was committed before and none needs a whole replace, else a whole replace of
/// `tables` (counters carried over from the kernel). Counters that stay are never sent again,
/// so they keep counting.
pub fn sync(c: &mut Committer, tables: Vec<Table>) -> Result<CommitStats, Error> {
    let edits: Option<Vec<(TableRef, Edit)>> = tables
        .iter()
        .map(|t| {
            let tr = TableRef::of(t);
            let e = edit_between(c.committed(&tr)?, t)?;
            Some((tr, e))
        })
        .collect();
    match edits {
        Some(edits) => Ok(c.commit(Commit::edit(edits))?.stats),
        None => Ok(replace_carrying(c, tables)?.stats),
    }
}

/// A whole replace of `tables`, its counters started from the kernel's values.
pub fn replace_carrying(c: &mut Committer, tables: Vec<Table>) -> Result<Committed, Error> {
    let mut build = twice(tables);
    c.commit(Commit::replace(&mut build))
}

/// A whole replace of `tables`, its counters started from the values the tables carry.
pub fn replace(c: &mut Committer, tables: Vec<Table>) -> Result<CommitStats, Error> {
    let mut build = twice(tables);
    Ok(c.commit(Commit::replace(&mut build).reset_counters())?
        .stats)
}

/// Builds `tables` for a replace: a copy for the batch, then the tables themselves as the
/// committer's model.
fn twice(tables: Vec<Table>) -> impl FnMut() -> Vec<Table> {
    let mut calls = 0;
    let mut tables = Some(tables);
    move || {
        calls += 1;
        match calls {
            1 => tables.clone().unwrap_or_default(),
            _ => tables.take().unwrap_or_default(),
        }
    }
}

/// What a series of planned syncs took, each from the slice's put to the last ACK.
#[derive(Default)]
pub struct PlannedSyncs {
    pub wall: Vec<Duration>,
    pub commit: Vec<Duration>,
    /// The distinct message counts of their batches.
    pub messages: BTreeSet<usize>,
}

/// Install `planner`'s tables in `ns` with a fresh [`Committer`] (which keeps them as its
/// model, as the agent's does), then, for each of `slices` in turn, put it into `objects`, let
/// the planner update only what it changed, and commit the planner's edit: the agent's sync,
/// without the watch. A change the planner cannot make as an edit is an error.
pub fn planned_slice_syncs(
    ns: &Netns,
    planner: &mut Planner,
    objects: &mut Objects,
    ctx: &Context,
    slices: &[Arc<EndpointSlice>],
) -> Result<PlannedSyncs, String> {
    let mut c = ns.run(|| -> Result<Committer, String> {
        let mut c = Committer::new(Nft::open().map_err(|e| format!("Nft::open: {e}"))?);
        let mut build = || planner.tables();
        c.commit(Commit::replace(&mut build))
            .map_err(|e| format!("install: {e}"))?;
        Ok(c)
    })?;
    let mut out = PlannedSyncs::default();
    for slice in slices {
        let t0 = Instant::now();
        let dirty: BTreeSet<_> = objects.put_slice(slice.clone()).into_iter().collect();
        let TableChange::Edit(edits) = planner.update(objects, ctx, Some(&dirty)).change else {
            return Err("a slice change planned as a rebuild".into());
        };
        let done = c
            .commit(Commit::edit(edits))
            .map_err(|e| format!("sync: {e}"))?;
        out.wall.push(t0.elapsed());
        out.commit.push(done.stats.commit);
        out.messages.insert(done.stats.messages);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use nodelb_netfilter::fixtures::{base, counted, elem, kinds, table};

    /// What the tests read of a sync: the operations, the chains left to delete later, and
    /// whether it was a whole replace.
    #[derive(Debug)]
    struct Diff<'a> {
        ops: Vec<Op<'a>>,
        stale_chains: Vec<String>,
        replaced: bool,
    }

    /// The operations a sync from `old` to `new` sends (the edit is leaked: tests only).
    fn diff<'a>(old: &'a Table, new: &'a Table) -> Result<Diff<'a>, String> {
        let Some(e) = edit_between(old, new) else {
            validate::validate(new).map_err(|e| e.to_string())?;
            return Ok(Diff {
                ops: full_replace(new),
                stale_chains: Vec::new(),
                replaced: true,
            });
        };
        let e: &'a Edit = Box::leak(Box::new(e));
        let (ops, stale_chains) = e.ops(old).map_err(|e| e.to_string())?;
        Ok(Diff {
            ops,
            stale_chains,
            replaced: false,
        })
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
    fn a_counter_whose_comment_changes_is_a_full_replace() {
        let old = counted(80, 0);
        let mut new = old.clone();
        new.counters.get_mut("svc/web").unwrap().comment = Some("renamed".into());
        assert!(diff(&old, &new).unwrap().replaced);
    }

    #[test]
    fn counters_are_created_before_their_users_and_deleted_after() {
        let (old, new) = (table(80, false), counted(80, 0));
        let k = kinds(&diff(&old, &new).unwrap().ops);
        assert_eq!(k[0], "add counter", "{k:?}");
        let k = kinds(&diff(&new, &old).unwrap().ops);
        assert_eq!(k.last(), Some(&"delete counter"), "{k:?}");
        // In a full replace, too: netfilter's ops test `counters_are_created_before_their_users`.
    }

    #[test]
    fn missing_counters_are_refused() {
        let mut t = counted(80, 0);
        t.counters.clear();
        let old = table(80, false);
        assert!(diff(&old, &t)
            .unwrap_err()
            .contains("missing counter svc/web"));
    }

    #[test]
    fn an_edit_applied_equals_the_model_it_describes_and_sends_what_diff_sends() {
        let old = base();
        let mut edit = Edit::default();
        edit.put_chains
            .push(Chain::regular("b").rule(Rule::new(vec![Stmt::Verdict(Verdict::Drop)])));
        edit.elements.insert(
            "services".into(),
            ElemEdit {
                del: vec![Key::Values(vec![Value::Port(80)].into())],
                add: vec![elem(80, "b"), elem(81, "b")],
            },
        );
        edit.del_chains.push("a".into());
        let mut want = old.clone();
        want.chains.remove("a");
        want.add_chain(Chain::regular("b").rule(Rule::new(vec![Stmt::Verdict(Verdict::Drop)])));
        let s = want.set_mut("services").unwrap();
        s.elements.clear();
        for (k, e) in [elem(80, "b"), elem(81, "b")] {
            s.elements.insert(k, e);
        }
        let (ops, stale) = edit.ops(&old).unwrap();
        let d = diff(&old, &want).unwrap();
        assert_eq!(ops.len(), d.ops.len());
        assert_eq!(stale, d.stale_chains);
        drop(ops);
        let mut got = old.clone();
        edit.apply(&mut got);
        assert_eq!(got, want);
    }
}
