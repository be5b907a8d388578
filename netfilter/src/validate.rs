//! What the kernel would refuse, found before a batch is sent: a reference to a chain, set or
//! counter that would not exist, or an edit that does not fit the table it edits. Each
//! problem is an [`Invalid`] naming the object.

use crate::model::*;
use std::collections::BTreeSet;

/// A model or an edit the kernel would refuse.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum Invalid {
    #[error("rule {index} of chain {family} {chain} jumps to missing chain {target}")]
    RuleJumpsToMissingChain {
        family: Family,
        chain: String,
        index: usize,
        target: String,
    },
    #[error("rule {index} of chain {family} {chain} refers to missing set {set}")]
    RuleRefersToMissingSet {
        family: Family,
        chain: String,
        index: usize,
        set: String,
    },
    #[error("rule {index} of chain {family} {chain} updates set {set}, which packets cannot fill (it has no timeout)")]
    RuleUpdatesStaticSet {
        family: Family,
        chain: String,
        index: usize,
        set: String,
    },
    #[error("rule {index} of chain {family} {chain} counts into missing counter {counter}")]
    RuleCountsIntoMissingCounter {
        family: Family,
        chain: String,
        index: usize,
        counter: String,
    },
    #[error("an element of map {family} {map} names missing counter {counter}")]
    ElementNamesMissingCounter {
        family: Family,
        map: String,
        counter: String,
    },
    #[error("an element of set {family} {set} jumps to missing chain {target}")]
    ElementJumpsToMissingChain {
        family: Family,
        set: String,
        target: String,
    },
    #[error("table {0} was not committed before; replace it first")]
    NotCommitted(TableRef),
    #[error("counter {family} {counter} already exists")]
    CounterExists { family: Family, counter: String },
    #[error("counter {family} {counter} is both removed and added")]
    CounterRemovedAndAdded { family: Family, counter: String },
    #[error("counter {family} {counter} to remove does not exist")]
    CounterToRemoveMissing { family: Family, counter: String },
    #[error("set {family} {set} already exists")]
    SetExists { family: Family, set: String },
    #[error("chain {family} {chain} to remove does not exist")]
    ChainToRemoveMissing { family: Family, chain: String },
    #[error("chain {family} {chain} is both replaced and removed")]
    ChainReplacedAndRemoved { family: Family, chain: String },
    #[error("set {family} {set} to remove does not exist")]
    SetToRemoveMissing { family: Family, set: String },
    #[error("set {family} {set} to edit does not exist")]
    SetToEditMissing { family: Family, set: String },
    #[error("set {family} {set} is both edited and removed")]
    SetEditedAndRemoved { family: Family, set: String },
    #[error("set {family} {set}: element {key:?} to remove is not there")]
    ElementToRemoveMissing {
        family: Family,
        set: String,
        key: Key,
    },
    #[error("set {family} {set}: element {key:?} is already there")]
    ElementExists {
        family: Family,
        set: String,
        key: Key,
    },
    #[error("chain {family} {chain}: a base chain's hook cannot be edited")]
    BaseChainHookEdited { family: Family, chain: String },
    #[error("counter {family} {counter} is removed but chain {chain} still uses it")]
    CounterStillUsedByChain {
        family: Family,
        counter: String,
        chain: String,
    },
    #[error("counter {family} {counter} is removed but map {map} still names it")]
    CounterStillNamedByMap {
        family: Family,
        counter: String,
        map: String,
    },
    #[error("set {family} {set} is removed but chain {chain} still uses it")]
    SetStillUsedByChain {
        family: Family,
        set: String,
        chain: String,
    },
}

/// What exists in the table a check is made against (the table itself, or a table with an
/// edit applied).
pub(crate) struct Names<'a> {
    pub family: Family,
    pub chain: &'a dyn Fn(&str) -> bool,
    /// `Some(dynamic)` when the set exists.
    pub set: &'a dyn Fn(&str) -> Option<bool>,
    pub counter: &'a dyn Fn(&str) -> bool,
}

impl Names<'_> {
    /// Every chain, set and counter rule `index` of `chain` refers to exists.
    pub(crate) fn check_rule(&self, chain: &str, index: usize, r: &Rule) -> Result<(), Invalid> {
        let family = self.family;
        let chain = || chain.to_string();
        for s in &r.stmts {
            for target in s.chain_targets() {
                if !(self.chain)(target) {
                    return Err(Invalid::RuleJumpsToMissingChain {
                        family,
                        chain: chain(),
                        index,
                        target: target.to_string(),
                    });
                }
            }
            if let Some(set) = s.set_refs() {
                match (self.set)(set) {
                    None => {
                        return Err(Invalid::RuleRefersToMissingSet {
                            family,
                            chain: chain(),
                            index,
                            set: set.to_string(),
                        })
                    }
                    Some(false) if matches!(s, Stmt::SetUpdate { .. }) => {
                        return Err(Invalid::RuleUpdatesStaticSet {
                            family,
                            chain: chain(),
                            index,
                            set: set.to_string(),
                        })
                    }
                    Some(_) => {}
                }
            }
            if let Some(counter) = s.counter_ref() {
                if !(self.counter)(counter) {
                    return Err(Invalid::RuleCountsIntoMissingCounter {
                        family,
                        chain: chain(),
                        index,
                        counter: counter.to_string(),
                    });
                }
            }
        }
        Ok(())
    }

    /// The chain or counter an element of `set` names exists.
    pub(crate) fn check_element(&self, set: &str, e: &Element) -> Result<(), Invalid> {
        let family = self.family;
        match &e.data {
            Some(ElemData::Counter(name)) if !(self.counter)(name) => {
                Err(Invalid::ElementNamesMissingCounter {
                    family,
                    map: set.to_string(),
                    counter: name.clone(),
                })
            }
            Some(ElemData::Verdict(v)) => match v.target() {
                Some(target) if !(self.chain)(target) => Err(Invalid::ElementJumpsToMissingChain {
                    family,
                    set: set.to_string(),
                    target: target.to_string(),
                }),
                _ => Ok(()),
            },
            _ => Ok(()),
        }
    }
}

/// The names a table itself holds.
fn names_of(
    t: &Table,
    check: impl FnOnce(&Names<'_>) -> Result<(), Invalid>,
) -> Result<(), Invalid> {
    check(&Names {
        family: t.family,
        chain: &|n| t.chains.contains_key(n),
        set: &|n| t.sets.get(n).map(Set::is_dynamic),
        counter: &|n| t.counters.contains_key(n),
    })
}

/// Check a model for references the kernel would reject, so a broken model fails before it
/// is sent, with a message that names the rule.
pub fn validate(t: &Table) -> Result<(), Invalid> {
    names_of(t, |names| {
        for c in t.chains.values() {
            for (i, r) in c.rules.iter().enumerate() {
                names.check_rule(&c.name, i, r)?;
            }
        }
        for s in t.sets.values().filter(|s| s.data == Some(MapData::Counter)) {
            for e in s.elements.values() {
                names.check_element(&s.name, e)?;
            }
        }
        // Elements only jump to a handful of chains: check each distinct target once.
        for s in t.sets.values().filter(|s| s.data == Some(MapData::Verdict)) {
            let mut seen = BTreeSet::new();
            for e in s.elements.values() {
                if let Some(ElemData::Verdict(v)) = &e.data {
                    if v.target().is_some_and(|c| seen.insert(c)) {
                        names.check_element(&s.name, e)?;
                    }
                }
            }
        }
        Ok(())
    })
}
