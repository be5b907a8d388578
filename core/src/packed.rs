//! Maps whose B-tree nodes are full. A `BTreeMap` filled one insert at a time in ascending
//! order (a list walked in key order) or in no order (one Service's elements at a time) ends
//! with its nodes about half full; one built from a sorted list, or merged with
//! [`BTreeMap::append`], has them full. The agent's large maps (the tables it assembles, the
//! leader's desired statuses) are built so (what it saves: the plan bench of `nodelb-agent`,
//! docs/benchmarks.md).

use std::collections::BTreeMap;

/// A map filled in any order of its keys that ends with full nodes: insertions are gathered
/// in a short list, which is sorted and merged in ([`BTreeMap::append`] builds the merged
/// tree packed, freeing the old one's nodes as it goes) each time it is full. A later insert
/// of a key replaces an earlier one, as with [`BTreeMap::insert`].
pub struct Packed<K, V> {
    map: BTreeMap<K, V>,
    pending: Vec<(K, V)>,
}

impl<K: Ord, V> Packed<K, V> {
    /// Inserts gathered before a merge: a merge moves every element, so the list is long
    /// enough that a set of 50,000 elements is moved about 25 times, short enough to cost
    /// little beside the map (80 bytes an element).
    const PENDING: usize = 2048;

    pub fn insert(&mut self, k: K, v: V) {
        self.pending.push((k, v));
        if self.pending.len() >= Self::PENDING {
            self.merge();
        }
    }

    fn merge(&mut self) {
        // `collect` sorts (stably: of equal keys the last pushed is kept) and builds packed.
        let mut batch: BTreeMap<K, V> = self.pending.drain(..).collect();
        self.map.append(&mut batch);
    }

    pub fn finish(mut self) -> BTreeMap<K, V> {
        self.merge();
        self.map
    }
}

impl<K, V> From<BTreeMap<K, V>> for Packed<K, V> {
    fn from(map: BTreeMap<K, V>) -> Packed<K, V> {
        Packed {
            map,
            pending: Vec::new(),
        }
    }
}

/// Rebuild `map` with full nodes (after many inserts in key order). The first entry is taken
/// out and the rest merged back into it: [`BTreeMap::append`] of two non-empty maps builds
/// the merged tree packed while it frees the old one's nodes, so no list of the entries is
/// made (collecting them, as before, held a list of all of them for a moment, a peak of its
/// own: docs/benchmarks.md).
pub fn repack<K: Ord, V>(map: &mut BTreeMap<K, V>) {
    let Some((k, v)) = map.pop_first() else {
        return;
    };
    let mut rest = std::mem::take(map);
    map.insert(k, v);
    map.append(&mut rest);
}

#[cfg(test)]
mod tests {
    use super::{repack, Packed};
    use rand::{Rng, SeedableRng};
    use std::collections::BTreeMap;

    #[test]
    fn a_packed_map_holds_what_inserting_one_by_one_holds() {
        let mut rng = rand::rngs::StdRng::seed_from_u64(7);
        // Keys repeat (a later value must replace an earlier one, across merges too), and
        // there are more than a few merges' worth.
        let inserts: Vec<(u32, u32)> = (0..5 * Packed::<u32, u32>::PENDING as u32 + 17)
            .map(|i| (rng.random_range(0..6000), i))
            .collect();
        let mut one_by_one = BTreeMap::from([(3, 99), (7000, 1)]);
        let mut packed = Packed::from(one_by_one.clone());
        for (k, v) in &inserts {
            one_by_one.insert(*k, *v);
            packed.insert(*k, *v);
        }
        assert_eq!(packed.finish(), one_by_one);
    }

    #[test]
    fn a_repacked_map_keeps_every_entry() {
        let mut m: BTreeMap<u32, u32> = (0..10_000).map(|i| (i, i * 2)).collect();
        m.insert(20_000, 1);
        let before = m.clone();
        repack(&mut m);
        assert_eq!(m, before);
        for mut small in [BTreeMap::new(), BTreeMap::from([(1, 2)])] {
            let before = small.clone();
            repack(&mut small);
            assert_eq!(small, before);
        }
    }
}
