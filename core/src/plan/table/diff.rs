//! Between two syncs: the edit from one Service's old [`Part`] to its new one, and the
//! elements several Services share (the hairpin set) kept consistent as Services come and go.

use super::*;
use nodelb_netfilter::edit::changed_entries;

/// Record in `edit` what changes when a Service's Part goes from `old` to `new` (hairpin
/// elements are shared and handled by [`edit_hairpin`]).
pub fn edit_part(old: Option<&Part>, new: Option<&Part>, edit: &mut Edit) {
    let empty = Part::default();
    let (old, new) = (old.unwrap_or(&empty), new.unwrap_or(&empty));
    if old == new {
        return;
    }
    for ((set, key), o, n) in changed_entries(&old.elements, &new.elements) {
        elem_edit(edit, set).note(key, o.is_some(), n);
    }
    // A set declared anew (another timeout or comment) goes and comes back in the edit: every
    // chain of the Service that may use it is replaced, so none holds the old one.
    let redeclared = edit_sets(old, new, edit);
    for (name, c) in new.chains.iter() {
        let existed = old.chains.get(name);
        if existed != Some(c) || (redeclared && existed.is_some()) {
            edit.put_chains.push(c.clone());
        }
    }
    for name in old.chains.keys() {
        if !new.chains.contains_key(name) {
            edit.del_chains.push(name.clone());
        }
    }
    // A counter's name says everything its comment does, so a counter that stays is equal
    // and never re-created (which would reset it).
    for (name, c) in new.counters.iter() {
        if !old.counters.contains_key(name) {
            edit.add_counters.push(c.clone());
        }
    }
    for name in old.counters.keys() {
        if !new.counters.contains_key(name) {
            edit.del_counters.push(name.clone());
        }
    }
}

/// Record in `edit` how a Service's own sets change: added, removed, their elements, or
/// declared anew under the same name (removed and added). Returns whether one was.
pub(super) fn edit_sets(old: &Part, new: &Part, edit: &mut Edit) -> bool {
    let mut redeclared = false;
    for (name, n) in new.sets.iter() {
        match old.sets.get(name) {
            None => edit.add_sets.push(n.clone()),
            Some(o) if o == n => {}
            Some(o) if o.same_decl(n) => {
                let e = elem_edit(edit, name);
                for (k, was, now) in changed_entries(&o.elements, &n.elements) {
                    e.note(k, was.is_some(), now);
                }
            }
            Some(_) => {
                redeclared = true;
                edit.del_sets.push(name.clone());
                edit.add_sets.push(n.clone());
            }
        }
    }
    for name in old.sets.keys() {
        if !new.sets.contains_key(name) {
            edit.del_sets.push(name.clone());
        }
    }
    redeclared
}

pub(super) fn elem_edit<'e>(edit: &'e mut Edit, set: &str) -> &'e mut ElemEdit {
    edit.elements.entry(set.to_string()).or_default()
}

/// What several Services' Parts share in the tables, with who uses it, per family: the
/// `endpoints-N` and `slot-I` chains (how many Service ports go to each) and the `hairpin` set's
/// elements (the users of each address). Moving a Part's uses is recorded in a
/// [`SharedBefore`]; the edits that follow are known once every Part of an update has moved
/// ([`Shared::edits`]), so an object one Service drops and another takes is left alone.
#[derive(Clone, Debug, Default)]
pub struct Shared {
    chains: BTreeMap<IpFamily, BTreeMap<SharedChain, usize>>,
    hairpin: BTreeMap<IpFamily, HairpinUsers>,
}

/// What each shared object an update touched was before it, per family: whether a shared
/// chain existed, and the first user of a hairpin address.
#[derive(Debug, Default)]
pub struct SharedBefore {
    chains: BTreeMap<IpFamily, BTreeMap<SharedChain, bool>>,
    hairpin: BTreeMap<IpFamily, BTreeMap<IpAddr, Option<Arc<str>>>>,
}

impl Shared {
    /// The users of each hairpin address of one family.
    pub fn hairpin(&self, family: IpFamily) -> Option<&HairpinUsers> {
        self.hairpin.get(&family)
    }

    /// A Service's Part in `family` goes from `old` to `new`: move its uses, noting in `before`
    /// what each object it touches was before the update.
    pub fn replace(
        &mut self,
        family: IpFamily,
        old: Option<&Part>,
        new: Option<&Part>,
        before: &mut SharedBefore,
    ) {
        let uses = self.chains.entry(family).or_default();
        let existed = before.chains.entry(family).or_default();
        for n in old.iter().flat_map(|p| &p.shared_chains) {
            existed.entry(*n).or_insert_with(|| uses.contains_key(n));
            if let Some(c) = uses.get_mut(n) {
                *c -= 1;
                if *c == 0 {
                    uses.remove(n);
                }
            }
        }
        for n in new.iter().flat_map(|p| &p.shared_chains) {
            existed.entry(*n).or_insert_with(|| uses.contains_key(n));
            *uses.entry(*n).or_default() += 1;
        }
        let users = self.hairpin.entry(family).or_default();
        let first = before.hairpin.entry(family).or_default();
        for (addr, c) in old.iter().flat_map(|p| &p.hairpin) {
            first
                .entry(*addr)
                .or_insert_with(|| users.get(addr).and_then(|u| u.first()).cloned());
            if let Some(u) = users.get_mut(addr) {
                if let Ok(i) = u.binary_search(c) {
                    u.remove(i);
                }
                if u.is_empty() {
                    users.remove(addr);
                }
            }
        }
        for (addr, c) in new.iter().flat_map(|p| &p.hairpin) {
            first
                .entry(*addr)
                .or_insert_with(|| users.get(addr).and_then(|u| u.first()).cloned());
            let u = users.entry(*addr).or_default();
            if let Err(i) = u.binary_search(c) {
                u.reserve_exact(1);
                u.insert(i, c.clone());
            }
        }
    }

    /// The edits the moves since `before` was empty cause, added to each family's edit: the
    /// shared chains that came or went, then the hairpin elements whose first user changed.
    pub fn edits(&self, before: SharedBefore, edits: &mut BTreeMap<IpFamily, Edit>) {
        let none = BTreeMap::new();
        for (family, existed) in &before.chains {
            let uses = self.chains.get(family).unwrap_or(&none);
            let edit = edits.entry(*family).or_default();
            for (c, existed) in existed {
                match (existed, uses.contains_key(c)) {
                    (false, true) => edit.put_chains.push(c.chain()),
                    (true, false) => edit.del_chains.push(c.name()),
                    _ => {}
                }
            }
        }
        let none = HairpinUsers::new();
        for (family, first) in &before.hairpin {
            let users = self.hairpin.get(family).unwrap_or(&none);
            edit_hairpin(first, users, edits.entry(*family).or_default());
        }
    }
}

/// Record in `edit` the hairpin elements that change, given the first user of each address
/// touched before the update and the users after it.
pub(super) fn edit_hairpin(
    before: &BTreeMap<IpAddr, Option<Arc<str>>>,
    after: &HairpinUsers,
    edit: &mut Edit,
) {
    for (a, old) in before {
        let new = after.get(a).and_then(|u| u.first()).cloned();
        if *old == new {
            continue;
        }
        if old.is_some() {
            elem_edit(edit, HAIRPIN_SET).del.push(hairpin_key(*a));
        }
        if let Some(c) = new {
            elem_edit(edit, HAIRPIN_SET)
                .add
                .push((hairpin_key(*a), element(None, &c)));
        }
    }
}
