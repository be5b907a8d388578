//! Reading nodelb's tables back from the kernel: which chains and sets exist, how many rules
//! and elements they hold, and the ruleset generation; and telling whether that matches the
//! model nodelb last committed.

use crate::model::TableRef;
use crate::model::{
    expected_element_count, Family, Hook, Learned, LearnedElements, Policy, RawElement, Table,
};
use crate::netlink::{Attrs, Msg, Request};
use crate::transact::{Error, Nft};
use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

const NFT_MSG_GETTABLE: u16 = 1;
const NFT_MSG_GETCHAIN: u16 = 4;
const NFT_MSG_GETRULE: u16 = 7;
const NFT_MSG_GETSET: u16 = 10;
const NFT_MSG_GETSETELEM: u16 = 13;
const NFT_MSG_GETGEN: u16 = 16;
const NFT_MSG_GETOBJ: u16 = 19;

/// `NFTA_OBJ_*` and, nested in `NFTA_OBJ_DATA`, `NFTA_COUNTER_*`.
const NFTA_OBJ_TABLE: u16 = 1;
const NFTA_OBJ_NAME: u16 = 2;
const NFTA_OBJ_TYPE: u16 = 3;
const NFTA_OBJ_DATA: u16 = 4;
const NFTA_COUNTER_BYTES: u16 = 1;
const NFTA_COUNTER_PACKETS: u16 = 2;
/// `NFT_OBJECT_COUNTER`.
const OBJECT_COUNTER: u32 = 1;

/// `NFTA_SET_*`, and the set flag of a set packets fill (`NFT_SET_EVAL`, `flags dynamic`).
const NFTA_SET_TABLE: u16 = 1;
const NFTA_SET_NAME: u16 = 2;
const NFTA_SET_FLAGS: u16 = 3;
const NFT_SET_ANONYMOUS: u32 = 0x1;
const NFT_SET_EVAL: u32 = 0x20;
/// `NFTA_SET_ELEM_LIST_ELEMENTS`, each element an `NFTA_LIST_ELEM` of `NFTA_SET_ELEM_*`.
const NFTA_SET_ELEM_LIST_ELEMENTS: u16 = 3;
const NFTA_SET_ELEM_KEY: u16 = 1;
const NFTA_SET_ELEM_DATA: u16 = 2;
const NFTA_SET_ELEM_EXPIRATION: u16 = 5;
const NFTA_DATA_VALUE: u16 = 1;

/// `NFTA_CHAIN_*` and, nested in `NFTA_CHAIN_HOOK`, `NFTA_HOOK_*`.
const NFTA_CHAIN_TABLE: u16 = 1;
const NFTA_CHAIN_NAME: u16 = 3;
const NFTA_CHAIN_HOOK: u16 = 4;
const NFTA_CHAIN_POLICY: u16 = 5;
const NFTA_HOOK_HOOKNUM: u16 = 1;
const NFTA_HOOK_PRIORITY: u16 = 2;
/// `NF_DROP` and `NF_ACCEPT`, as a base chain's policy.
const NF_DROP: u32 = 0;
const NF_ACCEPT: u32 = 1;

/// A base chain of any table (nodelb's or another's) in an `ip`, `ip6` or `inet` table, as
/// the kernel holds it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BaseChainInfo {
    pub family: Family,
    pub table: String,
    pub name: String,
    pub hook: Hook,
    pub priority: i32,
    pub policy: Policy,
}

impl BaseChainInfo {
    /// Decode one `NFT_MSG_NEWCHAIN` message; `None` for a regular chain, or a family or hook
    /// nodelb does not model.
    fn decode(m: &Msg<'_>) -> Option<BaseChainInfo> {
        let family = Family::from_nfproto(m.family())?;
        let a = m.attrs();
        let hook = Attrs(a.get(NFTA_CHAIN_HOOK)?);
        let policy = match a.get_be32(NFTA_CHAIN_POLICY)? {
            NF_DROP => Policy::Drop,
            NF_ACCEPT => Policy::Accept,
            _ => return None,
        };
        Some(BaseChainInfo {
            family,
            table: a.get_str(NFTA_CHAIN_TABLE)?,
            name: a.get_str(NFTA_CHAIN_NAME).unwrap_or_default(),
            hook: Hook::from_number(hook.get_be32(NFTA_HOOK_HOOKNUM)?)?,
            priority: hook.get_be32(NFTA_HOOK_PRIORITY).unwrap_or(0) as i32,
            policy,
        })
    }
}

/// Counter name → (packets, bytes), as [`Nft::read_counters`] returns them.
pub type CounterValues = BTreeMap<String, (u64, u64)>;

/// What the kernel holds for one table, in counts.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct TableSummary {
    /// Chain name → number of rules.
    pub chains: BTreeMap<String, usize>,
    /// Named set → number of kernel elements (an interval counts its start and its end).
    pub sets: BTreeMap<String, usize>,
    /// Named sets packets fill (`flags dynamic`): their elements come and go with traffic, so
    /// only that they exist is compared, never what they hold.
    pub dynamic_sets: BTreeSet<String>,
    /// Named counter objects.
    pub counters: BTreeSet<String>,
}

impl TableSummary {
    /// The summary the kernel should show for a model.
    pub fn expected(t: &Table) -> TableSummary {
        TableSummary {
            chains: t
                .chains
                .values()
                .map(|c| (c.name.clone(), c.rules.len()))
                .collect(),
            sets: t
                .sets
                .values()
                .filter(|s| !s.is_dynamic())
                .map(|s| (s.name.clone(), expected_element_count(s)))
                .collect(),
            dynamic_sets: t
                .sets
                .values()
                .filter(|s| s.is_dynamic())
                .map(|s| s.name.clone())
                .collect(),
            counters: t.counters.keys().cloned().collect(),
        }
    }
}

/// How the kernel's table compares with the model.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Drift {
    None,
    Missing,
    /// What differs, one line per object.
    Changed(Vec<String>),
}

/// Compare, tolerating chains that were flushed and wait for deletion.
pub fn compare(
    expected: &TableSummary,
    actual: Option<&TableSummary>,
    stale_chains: &[String],
) -> Drift {
    let Some(actual) = actual else {
        return Drift::Missing;
    };
    let mut diffs = Vec::new();
    for (name, n) in &expected.chains {
        match actual.chains.get(name) {
            None => diffs.push(format!("chain {name} is missing")),
            Some(m) if m != n => diffs.push(format!("chain {name} has {m} rules, expected {n}")),
            _ => {}
        }
    }
    for (name, m) in &actual.chains {
        let flushed_stale = stale_chains.contains(name) && *m == 0;
        if !expected.chains.contains_key(name) && !flushed_stale {
            diffs.push(format!("chain {name} is not nodelb's"));
        }
    }
    for (name, n) in &expected.sets {
        match actual.sets.get(name) {
            None => diffs.push(format!("set {name} is missing")),
            Some(m) if m != n => diffs.push(format!("set {name} has {m} elements, expected {n}")),
            _ => {}
        }
    }
    for name in actual.sets.keys() {
        if !expected.sets.contains_key(name) {
            diffs.push(format!("set {name} is not nodelb's"));
        }
    }
    for name in expected.dynamic_sets.difference(&actual.dynamic_sets) {
        diffs.push(format!("dynamic set {name} is missing"));
    }
    for name in actual.dynamic_sets.difference(&expected.dynamic_sets) {
        diffs.push(format!("dynamic set {name} is not nodelb's"));
    }
    for name in expected.counters.difference(&actual.counters) {
        diffs.push(format!("counter {name} is missing"));
    }
    for name in actual.counters.difference(&expected.counters) {
        diffs.push(format!("counter {name} is not nodelb's"));
    }
    if diffs.is_empty() {
        Drift::None
    } else {
        Drift::Changed(diffs)
    }
}

/// A table of an `NFT_MSG_NEWTABLE` message.
fn table_of(m: &Msg<'_>) -> Option<TableRef> {
    Some(TableRef {
        family: Family::from_nfproto(m.family())?,
        name: m.attrs().get_str(1)?,
    })
}

/// A counter object of table `table` in an `NFT_MSG_NEWOBJ` message: name, packets, bytes.
fn counter_of<'m>(m: &Msg<'m>, table: &str) -> Option<(std::borrow::Cow<'m, str>, u64, u64)> {
    let a = m.attrs();
    if a.get_str_ref(NFTA_OBJ_TABLE).as_deref() != Some(table)
        || a.get_be32(NFTA_OBJ_TYPE) != Some(OBJECT_COUNTER)
    {
        return None;
    }
    let d = Attrs(a.get(NFTA_OBJ_DATA)?);
    Some((
        a.get_str_ref(NFTA_OBJ_NAME)?,
        d.get_be64(NFTA_COUNTER_PACKETS).unwrap_or(0),
        d.get_be64(NFTA_COUNTER_BYTES).unwrap_or(0),
    ))
}

/// The elements of an `NFT_MSG_NEWSETELEM` message: `NFTA_SET_ELEM_LIST_ELEMENTS` holds one
/// `NFTA_LIST_ELEM` per element.
fn elements_of<'m>(m: &Msg<'m>) -> impl Iterator<Item = Attrs<'m>> {
    let list = m.attrs().get(NFTA_SET_ELEM_LIST_ELEMENTS).unwrap_or(&[]);
    Attrs(list).map(|(_, elem)| Attrs(elem))
}

/// An element of a dynamic set with the time it has left (none once it expired).
fn learned_of(e: Attrs<'_>) -> Option<Learned> {
    let key = Attrs(e.get(NFTA_SET_ELEM_KEY)?).get(NFTA_DATA_VALUE)?;
    let ms = e.get_be64(NFTA_SET_ELEM_EXPIRATION).filter(|ms| *ms > 0)?;
    Some(Learned {
        key: key.to_vec(),
        expires: Duration::from_millis(ms),
    })
}

/// A map element's key and data bytes.
fn raw_element_of(e: Attrs<'_>) -> Option<RawElement> {
    let value = |attr| e.get(attr).and_then(|v| Attrs(v).get(NFTA_DATA_VALUE));
    Some(RawElement {
        key: value(NFTA_SET_ELEM_KEY)?.to_vec(),
        data: value(NFTA_SET_ELEM_DATA)?.to_vec(),
    })
}

/// Everything the reader takes from a buffer of netlink messages, read as each of its dumps
/// reads them, for the fuzz target `readback` (`fuzz/`): whatever the bytes, no panic, no
/// endless loop. Returns how many things were read, so nothing is optimised away.
pub fn read_any(buf: &[u8]) -> usize {
    let mut n = 0;
    for m in crate::netlink::messages(buf) {
        n += usize::from(m.error().is_some()) + usize::from(m.nft_kind().is_some());
        n += usize::from(table_of(&m).is_some());
        n += usize::from(BaseChainInfo::decode(&m).is_some());
        let table = m.attrs().get_str_ref(NFTA_OBJ_TABLE).unwrap_or_default();
        n += usize::from(counter_of(&m, &table).is_some());
        n += usize::from(m.attrs().get_be32(NFTA_SET_FLAGS).is_some());
        for e in elements_of(&m) {
            n += usize::from(learned_of(e).is_some()) + usize::from(raw_element_of(e).is_some());
        }
    }
    n
}

impl Nft {
    /// The ruleset generation: it changes with every committed transaction, anyone's.
    pub fn generation(&mut self) -> Result<u32, Error> {
        let seq = self.next_seq();
        let req = Request::new(NFT_MSG_GETGEN, 0, 0, seq).finish();
        let mut generation = None;
        self.request(&req, "the ruleset generation", false, |m| {
            generation = generation.or(m.attrs().get_be32(1));
        })?;
        generation.ok_or_else(|| Error::Dump {
            what: "the ruleset generation".into(),
            source: std::io::Error::other("no NFTA_GEN_ID in the answer"),
        })
    }

    /// All tables of a family (or of all families, with `None`).
    pub fn list_tables(&mut self, family: Option<Family>) -> Result<Vec<TableRef>, Error> {
        let seq = self.next_seq();
        let fam = family.map_or(0, |f| f.nfproto());
        let req = Request::new(NFT_MSG_GETTABLE, libc::NLM_F_DUMP as u16, fam, seq).finish();
        let mut out = Vec::new();
        self.request(&req, "tables", true, |m| out.extend(table_of(&m)))?;
        Ok(out)
    }

    /// Every base chain of every `ip`, `ip6` and `inet` table, in one chain dump.
    pub fn base_chains(&mut self) -> Result<Vec<BaseChainInfo>, Error> {
        let seq = self.next_seq();
        let req = Request::new(
            NFT_MSG_GETCHAIN,
            libc::NLM_F_DUMP as u16,
            libc::AF_UNSPEC as u8,
            seq,
        )
        .finish();
        let mut out = Vec::new();
        self.request(&req, "chains", true, |m| {
            out.extend(BaseChainInfo::decode(&m));
        })?;
        Ok(out)
    }

    /// Counts of what a table holds, or `None` when it does not exist.
    pub fn read_table(&mut self, t: &TableRef) -> Result<Option<TableSummary>, Error> {
        if !self.list_tables(Some(t.family))?.contains(t) {
            return Ok(None);
        }
        let fam = t.family.nfproto();
        let dump = libc::NLM_F_DUMP as u16;
        let mut summary = TableSummary::default();

        let seq = self.next_seq();
        let req = Request::new(NFT_MSG_GETCHAIN, dump, fam, seq)
            .attr_str(1, &t.name)
            .finish();
        self.request(&req, &format!("chains of {t}"), true, |m| {
            let a = m.attrs();
            if a.get_str(1).as_deref() == Some(&t.name) {
                if let Some(name) = a.get_str(3) {
                    summary.chains.insert(name, 0);
                }
            }
        })?;

        let seq = self.next_seq();
        let req = Request::new(NFT_MSG_GETRULE, dump, fam, seq)
            .attr_str(1, &t.name)
            .finish();
        self.request(&req, &format!("rules of {t}"), true, |m| {
            let a = m.attrs();
            if a.get_str(1).as_deref() == Some(&t.name) {
                if let Some(chain) = a.get_str(2) {
                    *summary.chains.entry(chain).or_default() += 1;
                }
            }
        })?;

        let seq = self.next_seq();
        let req = Request::new(NFT_MSG_GETSET, dump, fam, seq)
            .attr_str(1, &t.name)
            .finish();
        let mut names = Vec::new();
        self.request(&req, &format!("sets of {t}"), true, |m| {
            let a = m.attrs();
            let flags = a.get_be32(NFTA_SET_FLAGS).unwrap_or(0);
            if a.get_str(NFTA_SET_TABLE).as_deref() != Some(&t.name)
                || flags & NFT_SET_ANONYMOUS != 0
            {
                return;
            }
            if let Some(name) = a.get_str(NFTA_SET_NAME) {
                if flags & NFT_SET_EVAL != 0 {
                    summary.dynamic_sets.insert(name);
                } else {
                    names.push(name);
                }
            }
        })?;
        for set in names {
            let mut n = 0;
            self.dump_elements(t, &set, |_| n += 1)?;
            summary.sets.insert(set, n);
        }
        let mut counters = Vec::new();
        self.each_counter(t, |name, _, _| counters.push(name.to_string()))?;
        summary.counters = counters.into_iter().collect();
        Ok(Some(summary))
    }

    /// Every counter object of a table with its values, in one `NFT_MSG_GETOBJ` dump
    /// (reading does not reset them). A missing table has no counters.
    pub fn read_counters(&mut self, t: &TableRef) -> Result<CounterValues, Error> {
        let mut out = CounterValues::new();
        self.each_counter(t, |name, packets, bytes| {
            out.insert(name.to_string(), (packets, bytes));
        })?;
        Ok(out)
    }

    /// Each counter object of a table as the dump gives it: name, packets, bytes, keeping
    /// nothing (a `/metrics` scrape would otherwise hold a map of every Service port's
    /// counters; its size: docs/benchmarks.md, `--bench metrics`). A missing table has no
    /// counters.
    pub fn each_counter(
        &mut self,
        t: &TableRef,
        mut each: impl FnMut(&str, u64, u64),
    ) -> Result<(), Error> {
        let seq = self.next_seq();
        let req = Request::new(
            NFT_MSG_GETOBJ,
            libc::NLM_F_DUMP as u16,
            t.family.nfproto(),
            seq,
        )
        .attr_str(NFTA_OBJ_TABLE, &t.name)
        .attr_be32(NFTA_OBJ_TYPE, OBJECT_COUNTER)
        .finish();
        let read = self.request(&req, &format!("counters of {t}"), true, |m| {
            if let Some((name, packets, bytes)) = counter_of(&m, &t.name) {
                each(&name, packets, bytes);
            }
        });
        missing_reads_empty(read)
    }

    /// The elements each of the dynamic `sets` of a table holds now, with the time each has
    /// left (a set or table that is gone holds none), for carrying them over a full replace.
    pub fn read_learned<'a>(
        &mut self,
        t: &TableRef,
        sets: impl IntoIterator<Item = &'a str>,
    ) -> Result<LearnedElements, Error> {
        let mut out = LearnedElements::new();
        for set in sets {
            let mut learned = Vec::new();
            let read = self.dump_elements(t, set, |e| learned.extend(learned_of(e)));
            missing_reads_empty(read)?;
            if !learned.is_empty() {
                out.insert(set.to_string(), learned);
            }
        }
        Ok(out)
    }

    /// Every element of map `set` as the kernel holds it: key and data bytes, in no order.
    /// A table or map that does not exist reads as none.
    pub fn read_map(&mut self, t: &TableRef, set: &str) -> Result<Vec<RawElement>, Error> {
        let mut out = Vec::new();
        let read = self.dump_elements(t, set, |e| out.extend(raw_element_of(e)));
        missing_reads_empty(read)?;
        Ok(out)
    }

    /// Call `each` with the attributes of every element of a set, in one dump.
    fn dump_elements(
        &mut self,
        t: &TableRef,
        set: &str,
        mut each: impl FnMut(Attrs<'_>),
    ) -> Result<(), Error> {
        let seq = self.next_seq();
        let req = Request::new(
            NFT_MSG_GETSETELEM,
            libc::NLM_F_DUMP as u16,
            t.family.nfproto(),
            seq,
        )
        .attr_str(1, &t.name)
        .attr_str(2, set)
        .finish();
        let what = format!("elements of set {t} {set}");
        self.request(&req, &what, true, |m| elements_of(&m).for_each(&mut each))
    }

    /// Compare the kernel's table with a model.
    pub fn drift(&mut self, model: &Table, stale_chains: &[String]) -> Result<Drift, Error> {
        let actual = self.read_table(&TableRef::of(model))?;
        Ok(compare(
            &TableSummary::expected(model),
            actual.as_ref(),
            stale_chains,
        ))
    }
}

/// A dump of a table or set that does not exist (`ENOENT`) read nothing: not an error.
fn missing_reads_empty(read: Result<(), Error>) -> Result<(), Error> {
    match read {
        Err(Error::Dump { source, .. }) if source.raw_os_error() == Some(libc::ENOENT) => Ok(()),
        r => r,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn summary(chains: &[(&str, usize)], sets: &[(&str, usize)]) -> TableSummary {
        TableSummary {
            chains: chains.iter().map(|(n, c)| (n.to_string(), *c)).collect(),
            sets: sets.iter().map(|(n, c)| (n.to_string(), *c)).collect(),
            dynamic_sets: BTreeSet::new(),
            counters: BTreeSet::new(),
        }
    }

    #[test]
    fn missing_table_is_missing() {
        assert_eq!(compare(&summary(&[], &[]), None, &[]), Drift::Missing);
    }

    #[test]
    fn extra_rule_is_drift() {
        let want = summary(&[("pre", 2)], &[("svc", 3)]);
        let got = summary(&[("pre", 3)], &[("svc", 3)]);
        assert_eq!(
            compare(&want, Some(&got), &[]),
            Drift::Changed(vec!["chain pre has 3 rules, expected 2".into()])
        );
    }

    #[test]
    fn a_dynamic_set_is_compared_by_its_existence_not_its_elements() {
        let mut t = Table::new(Family::Ip, "nodelb");
        t.add_set(
            crate::model::Set::new(
                "affinity-a",
                crate::model::SetType::Type(vec![crate::model::DataType::Ipv4Addr]),
            )
            .dynamic(Duration::from_secs(10)),
        );
        let want = TableSummary::expected(&t);
        assert!(want.sets.is_empty());
        assert_eq!(want.dynamic_sets, ["affinity-a".to_string()].into());
        // What packets wrote is never counted, so the kernel's table is as committed...
        assert_eq!(compare(&want, Some(&want), &[]), Drift::None);
        // ...but a dynamic set that is gone, or one nodelb does not know, is drift.
        let mut got = want.clone();
        got.dynamic_sets = ["affinity-b".to_string()].into();
        assert_eq!(
            compare(&want, Some(&got), &[]),
            Drift::Changed(vec![
                "dynamic set affinity-a is missing".into(),
                "dynamic set affinity-b is not nodelb's".into()
            ])
        );
    }

    #[test]
    fn flushed_stale_chain_is_tolerated_but_a_foreign_one_is_not() {
        let want = summary(&[("pre", 1)], &[]);
        let got = summary(&[("pre", 1), ("old", 0), ("alien", 0)], &[]);
        assert_eq!(
            compare(&want, Some(&got), &["old".into()]),
            Drift::Changed(vec!["chain alien is not nodelb's".into()])
        );
    }
}
