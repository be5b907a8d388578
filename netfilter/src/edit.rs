//! A change to one table described by what changes, not by a whole new model.
//!
//! Comparing two whole models costs time in proportion to the table's size. A caller that
//! already knows what changed (the agent knows which Services did) describes just that as an
//! `Edit`: the operations and the validation then cost in proportion to the change, so one
//! endpoint moving in a large table costs what it costs in a small one.

use crate::model::TableRef;
use crate::model::*;
use crate::ops::Op;
use crate::validate::{Invalid, Names};
use std::collections::{BTreeMap, BTreeSet};

/// Elements of one existing set to remove and to add. A changed element is in both: its key
/// in `del`, its new value in `add`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ElemEdit {
    pub del: Vec<Key>,
    pub add: Vec<(Key, Element)>,
}

/// What changes in one table.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Edit {
    /// Sets to create, with their elements.
    pub add_sets: Vec<Set>,
    /// Sets to delete (after every rule that used them is gone).
    pub del_sets: Vec<String>,
    /// Chains to create, or whose rules are replaced.
    pub put_chains: Vec<Chain>,
    /// Chains to remove: flushed in this batch, deleted in a later one (a chain just
    /// unreferenced can still be busy on older kernels, kubernetes/kubernetes#122604).
    pub del_chains: Vec<String>,
    /// Element changes in sets that exist before the edit, by set name.
    pub elements: BTreeMap<String, ElemEdit>,
    /// Counter objects to create (before the rules and elements that use them).
    pub add_counters: Vec<Counter>,
    /// Counter objects to delete (after every rule and element that used them is gone).
    pub del_counters: Vec<String>,
}

/// The entries of two sorted maps (or lists of key and value, sorted by key, each key once)
/// that differ, each key once and in order, with its value in `old` and in `new` (`None`: not
/// there). One walk of both side by side, so comparing two large maps costs no lookup per key.
pub fn changed_entries<K: Ord, V: PartialEq>(
    old: impl IntoIterator<Item = (K, V)>,
    new: impl IntoIterator<Item = (K, V)>,
) -> impl Iterator<Item = (K, Option<V>, Option<V>)> {
    let (mut o, mut n) = (old.into_iter().peekable(), new.into_iter().peekable());
    std::iter::from_fn(move || loop {
        let order = match (o.peek(), n.peek()) {
            (None, None) => return None,
            (Some(_), None) => std::cmp::Ordering::Less,
            (None, Some(_)) => std::cmp::Ordering::Greater,
            (Some((ok, _)), Some((nk, _))) => ok.cmp(nk),
        };
        let (k, ov, nv) = match order {
            std::cmp::Ordering::Less => o.next().map(|(k, v)| (k, Some(v), None))?,
            std::cmp::Ordering::Greater => n.next().map(|(k, v)| (k, None, Some(v)))?,
            std::cmp::Ordering::Equal => {
                let ((k, ov), (_, nv)) = (o.next()?, n.next()?);
                (k, Some(ov), Some(nv))
            }
        };
        if ov != nv {
            return Some((k, ov, nv));
        }
    })
}

impl ElemEdit {
    /// The elements to remove and add to go from `old` to `new`.
    pub fn between(old: &BTreeMap<Key, Element>, new: &BTreeMap<Key, Element>) -> ElemEdit {
        let mut out = ElemEdit::default();
        for (k, o, n) in changed_entries(old, new) {
            out.note(k, o.is_some(), n);
        }
        out
    }

    /// One key changes: removed if `was` there, then added with `now` if any.
    pub fn note(&mut self, key: &Key, was: bool, now: Option<&Element>) {
        if was {
            self.del.push(key.clone());
        }
        if let Some(e) = now {
            self.add.push((key.clone(), e.clone()));
        }
    }
}

impl Edit {
    pub fn is_empty(&self) -> bool {
        self.add_sets.is_empty()
            && self.del_sets.is_empty()
            && self.put_chains.is_empty()
            && self.del_chains.is_empty()
            && self.add_counters.is_empty()
            && self.del_counters.is_empty()
            && self
                .elements
                .values()
                .all(|e| e.del.is_empty() && e.add.is_empty())
    }

    /// Objects the edit touches: sets, chains, elements and counters (for logs and metrics).
    pub fn size(&self) -> usize {
        self.add_counters.len()
            + self.del_counters.len()
            + self
                .add_sets
                .iter()
                .map(|s| 1 + s.elements.len())
                .sum::<usize>()
            + self.del_sets.len()
            + self
                .put_chains
                .iter()
                .map(|c| 1 + c.rules.len())
                .sum::<usize>()
            + self.del_chains.len()
            + self
                .elements
                .values()
                .map(|e| e.del.len() + e.add.len())
                .sum::<usize>()
    }

    /// The operations that bring the kernel from `base` (what it holds) to `base` with this
    /// edit applied, in an order the kernel accepts, and the chains left to delete later.
    /// Fails, naming the object, when the edit does not fit `base` or leaves a reference to a
    /// chain or set that would not exist.
    pub fn ops<'a>(&'a self, base: &'a Table) -> Result<(Vec<Op<'a>>, Vec<String>), Invalid> {
        self.check(base)?;
        let tr = TableRef::of(base);
        let mut ops = Vec::new();
        for c in &self.add_counters {
            ops.push(Op::AddCounter(tr.clone(), c));
        }
        for c in self
            .put_chains
            .iter()
            .filter(|c| !base.chains.contains_key(&c.name))
        {
            ops.push(Op::AddChain(tr.clone(), c));
        }
        let flushed = self.redeclare_ops(&tr, base, &mut ops);
        for s in &self.add_sets {
            ops.push(Op::AddSet(tr.clone(), s));
            if !s.elements.is_empty() {
                ops.push(Op::AddElems {
                    table: tr.clone(),
                    set: s,
                    elems: s.elements.iter().collect(),
                });
            }
        }
        self.element_ops(&tr, base, &mut ops);
        for c in &self.put_chains {
            if base.chains.contains_key(&c.name) && !flushed.contains(c.name.as_str()) {
                ops.push(Op::FlushChain(tr.clone(), c.name.clone()));
            }
            for (i, r) in c.rules.iter().enumerate() {
                ops.push(Op::AddRule {
                    table: tr.clone(),
                    chain: &c.name,
                    index: i,
                    rule: r,
                });
            }
        }
        for c in self
            .del_chains
            .iter()
            .filter(|c| !flushed.contains(c.as_str()))
        {
            ops.push(Op::FlushChain(tr.clone(), c.clone()));
        }
        let redeclared = self.redeclared();
        for s in self
            .del_sets
            .iter()
            .filter(|s| !redeclared.contains(s.as_str()))
        {
            ops.push(Op::DelSet(tr.clone(), s.clone()));
        }
        for c in &self.del_counters {
            ops.push(Op::DelCounter(tr.clone(), c.clone()));
        }
        Ok((ops, self.del_chains.clone()))
    }

    /// Sets removed and added again under the same name (a new declaration: another timeout
    /// or comment).
    fn redeclared(&self) -> BTreeSet<&str> {
        self.add_sets
            .iter()
            .map(|s| s.name.as_str())
            .filter(|n| self.del_sets.iter().any(|d| d == n))
            .collect()
    }

    /// Delete the old declaration of each redeclared set, before the new one is added: first
    /// every chain that is replaced or removed is flushed (the only rules that may use the old
    /// set, as `check` makes sure), then the set goes. Returns the chains flushed here.
    fn redeclare_ops<'a>(
        &'a self,
        tr: &TableRef,
        base: &Table,
        ops: &mut Vec<Op<'a>>,
    ) -> BTreeSet<&'a str> {
        let redeclared = self.redeclared();
        let mut flushed = BTreeSet::new();
        if redeclared.is_empty() {
            return flushed;
        }
        let replaced = self
            .put_chains
            .iter()
            .map(|c| c.name.as_str())
            .filter(|c| base.chains.contains_key(*c));
        for c in replaced.chain(self.del_chains.iter().map(String::as_str)) {
            if flushed.insert(c) {
                ops.push(Op::FlushChain(tr.clone(), c.to_string()));
            }
        }
        for s in redeclared {
            ops.push(Op::DelSet(tr.clone(), s.to_string()));
        }
        flushed
    }

    /// Element changes in sets that exist before the edit: deletions, then additions.
    fn element_ops<'a>(&'a self, tr: &TableRef, base: &'a Table, ops: &mut Vec<Op<'a>>) {
        for (name, e) in &self.elements {
            let set = &base.sets[name];
            if !e.del.is_empty() {
                ops.push(Op::DelElems {
                    table: tr.clone(),
                    set,
                    keys: e.del.iter().collect(),
                });
            }
            if !e.add.is_empty() {
                ops.push(Op::AddElems {
                    table: tr.clone(),
                    set,
                    elems: e.add.iter().map(|(k, v)| (k, v)).collect(),
                });
            }
        }
    }

    /// Apply to a model: afterwards `t` is what the kernel holds once `ops` committed.
    pub fn apply(self, t: &mut Table) {
        for c in self.del_counters {
            t.counters.remove(&c);
        }
        for c in self.add_counters {
            t.counters.insert(c.name.clone(), c);
        }
        for s in self.del_sets {
            t.sets.remove(&s);
        }
        for s in self.add_sets {
            t.sets.insert(s.name.clone(), s);
        }
        for (name, e) in self.elements {
            if let Some(set) = t.sets.get_mut(&name) {
                for k in &e.del {
                    set.elements.remove(k);
                }
                set.elements.extend(e.add);
            }
        }
        for c in self.del_chains {
            t.chains.remove(&c);
        }
        for c in self.put_chains {
            t.chains.insert(c.name.clone(), c);
        }
    }

    /// Everything the kernel would refuse, found before sending.
    fn check(&self, base: &Table) -> Result<(), Invalid> {
        let x = Exists::new(self, base);
        self.check_counters(base)?;
        self.check_sets_and_chains(base, &x)?;
        let names = Names {
            family: base.family,
            chain: &|c| x.chain(c),
            set: &|s| x.set(s),
            counter: &|c| x.counter(c),
        };
        self.check_elements(base, &x, &names)?;
        self.check_put_chains(base, &names)?;
        if !x.gone_counters.is_empty() {
            self.check_removed_counters_unused(base, &x)?;
        }
        self.check_removed_sets_unused(base, &x)
    }

    fn check_counters(&self, base: &Table) -> Result<(), Invalid> {
        let family = base.family;
        let gone: BTreeSet<&str> = self.del_counters.iter().map(String::as_str).collect();
        for c in &self.add_counters {
            let counter = c.name.clone();
            if base.counters.contains_key(&c.name) && !gone.contains(c.name.as_str()) {
                return Err(Invalid::CounterExists { family, counter });
            }
            if gone.contains(c.name.as_str()) {
                // Its elements and rules would have to go first and come back after: not an
                // edit, and it would reset the counter.
                return Err(Invalid::CounterRemovedAndAdded { family, counter });
            }
        }
        match self
            .del_counters
            .iter()
            .find(|c| !base.counters.contains_key(*c))
        {
            Some(c) => Err(Invalid::CounterToRemoveMissing {
                family,
                counter: c.clone(),
            }),
            None => Ok(()),
        }
    }

    fn check_sets_and_chains(&self, base: &Table, x: &Exists<'_>) -> Result<(), Invalid> {
        let family = base.family;
        for s in &self.add_sets {
            if base.sets.contains_key(&s.name) && !x.gone_sets.contains(s.name.as_str()) {
                return Err(Invalid::SetExists {
                    family,
                    set: s.name.clone(),
                });
            }
        }
        for c in &self.del_chains {
            let chain = c.clone();
            if !base.chains.contains_key(c) {
                return Err(Invalid::ChainToRemoveMissing { family, chain });
            }
            if x.put.contains(c.as_str()) {
                return Err(Invalid::ChainReplacedAndRemoved { family, chain });
            }
        }
        match self.del_sets.iter().find(|s| !base.sets.contains_key(*s)) {
            Some(s) => Err(Invalid::SetToRemoveMissing {
                family,
                set: s.clone(),
            }),
            None => Ok(()),
        }
    }

    fn check_elements(
        &self,
        base: &Table,
        x: &Exists<'_>,
        names: &Names<'_>,
    ) -> Result<(), Invalid> {
        let family = base.family;
        for (name, e) in &self.elements {
            let set = || name.clone();
            let Some(existing) = base.sets.get(name) else {
                return Err(Invalid::SetToEditMissing { family, set: set() });
            };
            if x.gone_sets.contains(name.as_str()) {
                return Err(Invalid::SetEditedAndRemoved { family, set: set() });
            }
            let deleted: BTreeSet<&Key> = e.del.iter().collect();
            if let Some(k) = e.del.iter().find(|k| !existing.elements.contains_key(*k)) {
                return Err(Invalid::ElementToRemoveMissing {
                    family,
                    set: set(),
                    key: k.clone(),
                });
            }
            for (k, v) in &e.add {
                if existing.elements.contains_key(k) && !deleted.contains(k) {
                    return Err(Invalid::ElementExists {
                        family,
                        set: set(),
                        key: k.clone(),
                    });
                }
                names.check_element(name, v)?;
            }
        }
        for s in &self.add_sets {
            for e in s.elements.values() {
                names.check_element(&s.name, e)?;
            }
        }
        Ok(())
    }

    fn check_put_chains(&self, base: &Table, names: &Names<'_>) -> Result<(), Invalid> {
        for c in &self.put_chains {
            if base
                .chains
                .get(&c.name)
                .is_some_and(|old| old.base != c.base)
            {
                return Err(Invalid::BaseChainHookEdited {
                    family: base.family,
                    chain: c.name.clone(),
                });
            }
            for (i, r) in c.rules.iter().enumerate() {
                names.check_rule(&c.name, i, r)?;
            }
        }
        Ok(())
    }

    /// Chains of `base` that stay as they are: neither removed nor replaced.
    fn untouched_chains<'b>(
        &self,
        base: &'b Table,
        x: &'b Exists<'_>,
    ) -> impl Iterator<Item = &'b Chain> {
        base.chains.values().filter(move |c| {
            !x.gone_chains.contains(c.name.as_str()) && !x.put.contains(c.name.as_str())
        })
    }

    /// A removed counter must not be used by a rule or an element that stays. One pass over
    /// the chains and the counter maps.
    fn check_removed_counters_unused(&self, base: &Table, x: &Exists<'_>) -> Result<(), Invalid> {
        let family = base.family;
        for c in self.untouched_chains(base, x).chain(&self.put_chains) {
            for r in &c.rules {
                if let Some(name) = r.stmts.iter().find_map(|s| s.counter_ref()) {
                    if x.gone_counters.contains(name) {
                        return Err(Invalid::CounterStillUsedByChain {
                            family,
                            counter: name.to_string(),
                            chain: c.name.clone(),
                        });
                    }
                }
            }
        }
        for s in base
            .sets
            .values()
            .filter(|s| s.data == Some(MapData::Counter) && !x.gone_sets.contains(s.name.as_str()))
        {
            let removed: BTreeSet<&Key> = self
                .elements
                .get(&s.name)
                .map(|e| e.del.iter().collect())
                .unwrap_or_default();
            for (k, e) in &s.elements {
                if let Some(ElemData::Counter(name)) = &e.data {
                    if x.gone_counters.contains(name.as_str()) && !removed.contains(k) {
                        return Err(Invalid::CounterStillNamedByMap {
                            family,
                            counter: name.clone(),
                            map: s.name.clone(),
                        });
                    }
                }
            }
        }
        Ok(())
    }

    /// A removed set must not be used by any rule that stays; one declared anew may be used by
    /// the rules of replaced chains, which are flushed before it goes and added after it is
    /// back.
    fn check_removed_sets_unused(&self, base: &Table, x: &Exists<'_>) -> Result<(), Invalid> {
        let redeclared = self.redeclared();
        for s in &self.del_sets {
            let uses = |c: &Chain| {
                c.rules
                    .iter()
                    .any(|r| r.stmts.iter().any(|st| st.set_refs() == Some(s)))
            };
            let user = self
                .untouched_chains(base, x)
                .find(|c| uses(c))
                .or_else(|| {
                    self.put_chains
                        .iter()
                        .filter(|_| !redeclared.contains(s.as_str()))
                        .find(|c| uses(c))
                });
            if let Some(c) = user {
                return Err(Invalid::SetStillUsedByChain {
                    family: base.family,
                    set: s.clone(),
                    chain: c.name.clone(),
                });
            }
        }
        Ok(())
    }
}

/// Which chains, sets and counters exist once an edit is applied to its base.
struct Exists<'a> {
    base: &'a Table,
    put: BTreeSet<&'a str>,
    gone_chains: BTreeSet<&'a str>,
    new_sets: BTreeMap<&'a str, &'a Set>,
    gone_sets: BTreeSet<&'a str>,
    new_counters: BTreeSet<&'a str>,
    gone_counters: BTreeSet<&'a str>,
}

impl<'a> Exists<'a> {
    fn new(e: &'a Edit, base: &'a Table) -> Exists<'a> {
        Exists {
            base,
            put: e.put_chains.iter().map(|c| c.name.as_str()).collect(),
            gone_chains: e.del_chains.iter().map(String::as_str).collect(),
            new_sets: e.add_sets.iter().map(|s| (s.name.as_str(), s)).collect(),
            gone_sets: e.del_sets.iter().map(String::as_str).collect(),
            new_counters: e.add_counters.iter().map(|c| c.name.as_str()).collect(),
            gone_counters: e.del_counters.iter().map(String::as_str).collect(),
        }
    }

    fn chain(&self, c: &str) -> bool {
        self.put.contains(c) || (self.base.chains.contains_key(c) && !self.gone_chains.contains(c))
    }

    /// `Some(dynamic)` when the set exists once the edit is applied.
    fn set(&self, s: &str) -> Option<bool> {
        match self.new_sets.get(s) {
            Some(new) => Some(new.is_dynamic()),
            None if self.gone_sets.contains(s) => None,
            None => self.base.sets.get(s).map(Set::is_dynamic),
        }
    }

    fn counter(&self, c: &str) -> bool {
        self.new_counters.contains(c)
            || (self.base.counters.contains_key(c) && !self.gone_counters.contains(c))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fixtures::{base, elem};

    #[test]
    fn counters_come_and_go_with_their_users_and_never_dangle() {
        let old = base();
        let mut add = Edit::default();
        add.add_counters.push(Counter::new("c").with_comment("a"));
        let mut m = Set::map(
            "counts",
            SetType::Type(vec![DataType::InetService]),
            MapData::Counter,
        );
        m.insert(
            Key::Values(vec![Value::Port(80)].into()),
            Some(ElemData::Counter("c".into())),
            None,
        );
        add.add_sets.push(m);
        add.put_chains
            .push(Chain::regular("a").rule(Rule::new(vec![Stmt::CounterRef("c".into())])));
        let (ops, _) = add.ops(&old).unwrap();
        assert!(matches!(ops[0], Op::AddCounter(..)));
        drop(ops);
        let mut t = old.clone();
        add.apply(&mut t);
        assert!(t.counters.contains_key("c"));

        // Removing the counter while the rule or the map element stays is refused.
        let mut del = Edit::default();
        del.del_counters.push("c".into());
        del.put_chains.push(Chain::regular("a"));
        assert!(del
            .ops(&t)
            .unwrap_err()
            .to_string()
            .contains("map counts still names it"));
        del.elements.insert(
            "counts".into(),
            ElemEdit {
                del: vec![Key::Values(vec![Value::Port(80)].into())],
                add: vec![],
            },
        );
        let (ops, _) = del.ops(&t).unwrap();
        assert!(matches!(ops.last(), Some(Op::DelCounter(..))));
        drop(ops);
        let mut only_counter = Edit::default();
        only_counter.del_counters.push("c".into());
        assert!(only_counter
            .ops(&t)
            .unwrap_err()
            .to_string()
            .contains("chain a still uses it"));

        // An element naming a counter that is not there is refused.
        let mut dangling = Edit::default();
        dangling.elements.insert(
            "counts".into(),
            ElemEdit {
                del: vec![],
                add: vec![(
                    Key::Values(vec![Value::Port(81)].into()),
                    Element {
                        data: Some(ElemData::Counter("nope".into())),
                        comment: None,
                    },
                )],
            },
        );
        assert!(dangling
            .ops(&t)
            .unwrap_err()
            .to_string()
            .contains("missing counter nope"));
    }

    /// `base()` with a dynamic set `clients` that chain `a` looks clients up in and chain
    /// `b` updates.
    fn with_dynamic_set(timeout_secs: u64) -> (Table, Set, Chain, Chain) {
        let mut t = base();
        let set = Set::new("clients", SetType::Type(vec![DataType::Ipv4Addr]))
            .dynamic(std::time::Duration::from_secs(timeout_secs));
        let saddr = || vec![Expr::Payload(Payload::IpSaddr)];
        let a = Chain::regular("a").rule(Rule::new(vec![
            Stmt::Lookup {
                keys: saddr(),
                set: "clients".into(),
                negate: false,
            },
            Stmt::Verdict(Verdict::Goto("b".into())),
        ]));
        let b = Chain::regular("b").rule(Rule::new(vec![Stmt::SetUpdate {
            keys: saddr(),
            set: "clients".into(),
            timeout: set.timeout,
        }]));
        t.add_set(set.clone());
        t.add_chain(a.clone());
        t.add_chain(b.clone());
        (t, set, a, b)
    }

    #[test]
    fn a_set_declared_anew_goes_after_its_users_are_flushed_and_comes_back_before_their_rules() {
        let (old, _, a, b) = with_dynamic_set(60);
        let (_, new_set, _, _) = with_dynamic_set(5);
        let mut e = Edit::default();
        e.del_sets.push("clients".into());
        e.add_sets.push(new_set);
        e.put_chains.push(a);
        e.put_chains.push(b.clone());
        let (ops, _) = e.ops(&old).unwrap();
        assert_eq!(
            crate::fixtures::kinds(&ops),
            [
                "flush chain",
                "flush chain",
                "delete set",
                "add set",
                "add rule",
                "add rule"
            ]
        );
        drop(ops);
        let mut t = old.clone();
        e.apply(&mut t);
        assert_eq!(
            t.sets["clients"].timeout,
            Some(std::time::Duration::from_secs(5))
        );

        // A chain left as it is would still use the old set: refused, naming it.
        let mut e = Edit::default();
        e.del_sets.push("clients".into());
        e.add_sets.push(with_dynamic_set(5).1);
        e.put_chains.push(b);
        assert_eq!(
            e.ops(&old).unwrap_err().to_string(),
            "set ip clients is removed but chain a still uses it"
        );
    }

    #[test]
    fn only_a_dynamic_set_can_be_updated_by_a_rule() {
        let (old, _, _, b) = with_dynamic_set(60);
        let mut e = Edit::default();
        e.del_sets.push("clients".into());
        e.add_sets
            .push(Set::new("clients", SetType::Type(vec![DataType::Ipv4Addr])));
        e.put_chains.push(b);
        e.put_chains.push(Chain::regular("a"));
        assert_eq!(
            e.ops(&old).unwrap_err().to_string(),
            "rule 0 of chain ip b updates set clients, which packets cannot fill (it has no timeout)"
        );
    }

    #[test]
    fn edits_that_do_not_fit_are_refused_with_the_object_named() {
        let old = base();
        let mut e = Edit::default();
        e.elements.insert(
            "services".into(),
            ElemEdit {
                del: vec![],
                add: vec![elem(80, "a")],
            },
        );
        assert!(e
            .ops(&old)
            .unwrap_err()
            .to_string()
            .contains("already there"));

        let mut e = Edit::default();
        e.elements.insert(
            "services".into(),
            ElemEdit {
                del: vec![],
                add: vec![elem(82, "nowhere")],
            },
        );
        assert!(e
            .ops(&old)
            .unwrap_err()
            .to_string()
            .contains("missing chain nowhere"));

        let mut e = Edit::default();
        e.del_chains.push("a".into());
        e.elements.insert(
            "services".into(),
            ElemEdit {
                del: vec![],
                add: vec![elem(83, "a")],
            },
        );
        assert!(e
            .ops(&old)
            .unwrap_err()
            .to_string()
            .contains("missing chain a"));

        let mut e = Edit::default();
        e.elements.insert("missing".into(), ElemEdit::default());
        assert!(e
            .ops(&old)
            .unwrap_err()
            .to_string()
            .contains("set ip missing to edit does not exist"));
        assert!(Edit::default().is_empty());
    }
}
