//! The commit as one call: [`Committer::commit`] takes a whole replace (a way to build the
//! tables) or the edits of an incremental sync, and the tables that must not exist; it carries
//! counters and what dynamic sets learned over a replace, validates, encodes, commits, deletes what must not exist, and keeps
//! what the kernel then holds as the model the next edit starts from. The caller holds no
//! nftables state of its own: after a failed commit it starts again with a whole replace.

use crate::edit::Edit;
use crate::encode::Batch;
use crate::model::{Table, TableRef};
use crate::ops::{self, Op};
use crate::readback::Drift;
use crate::transact::{CommitStats, Error, Nft};
use crate::watch::WatchPause;
use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};
use tracing::{debug, warn};

/// What one commit changes.
pub enum Change<'a> {
    /// Replace every table whole. `build` is called twice: once for the batch (the tables are
    /// consumed while encoded, so a model and its batch are never held whole at once), and
    /// once more after the batch is committed and freed, for the model kept as what the
    /// kernel holds. The second call may return fewer tables (none, for a caller that commits
    /// once): a table not given back is replaced whole by the next commit that names it.
    Replace(&'a mut dyn FnMut() -> Vec<Table>),
    /// Edit tables committed before: the cost follows the size of the edits, not of the
    /// tables.
    Edit(Vec<(TableRef, Edit)>),
}

/// One call to [`Committer::commit`]: the change, and what goes with it.
pub struct Commit<'a> {
    change: Change<'a>,
    absent: Vec<TableRef>,
    pause: Option<&'a WatchPause>,
    freed: Option<&'a mut dyn FnMut()>,
    carry_counters: bool,
}

impl<'a> Commit<'a> {
    /// A whole replace of the tables `build` returns (see [`Change::Replace`]); counters are
    /// carried over from the kernel unless [`Commit::reset_counters`] says otherwise.
    pub fn replace(build: &'a mut dyn FnMut() -> Vec<Table>) -> Commit<'a> {
        Commit::of(Change::Replace(build))
    }

    /// Edits of tables committed before (see [`Change::Edit`]).
    pub fn edit(edits: Vec<(TableRef, Edit)>) -> Commit<'a> {
        Commit::of(Change::Edit(edits))
    }

    fn of(change: Change<'a>) -> Commit<'a> {
        Commit {
            change,
            absent: Vec::new(),
            pause: None,
            freed: None,
            carry_counters: true,
        }
    }

    /// Tables that must not exist afterwards: deleted, in batches of their own, where the
    /// kernel holds them.
    pub fn absent(mut self, tables: impl IntoIterator<Item = TableRef>) -> Commit<'a> {
        self.absent.extend(tables);
        self
    }

    /// The drift watch to pause during a replace, so it does not hear the process's own.
    pub fn pause(mut self, pause: Option<&'a WatchPause>) -> Commit<'a> {
        self.pause = pause;
        self
    }

    /// Called each time a part of the replaced models was dropped while encoding (an
    /// allocator may return the pages before the batch grows further).
    pub fn freed(mut self, freed: &'a mut dyn FnMut()) -> Commit<'a> {
        self.freed = Some(freed);
        self
    }

    /// Create the counters of a replace from the values the models carry, not from the
    /// kernel's.
    pub fn reset_counters(mut self) -> Commit<'a> {
        self.carry_counters = false;
        self
    }
}

/// What a commit did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Committed {
    /// Every batch sent, added up.
    pub stats: CommitStats,
    /// Counters whose values were carried over a replace.
    pub carried: usize,
    /// Elements of dynamic sets carried over a replace (clients' session affinity).
    pub restored: usize,
    /// Tables deleted because they had to be absent.
    pub deleted: Vec<TableRef>,
    /// A replace: the time before encoding (the tables built, counters and learned elements
    /// read from the kernel, the tables validated).
    pub prepared: Duration,
    /// A replace: the time after the commit (absent tables deleted, the tables built again as
    /// the models kept, when `build` gives them).
    pub adopted: Duration,
}

/// Keeps what was last committed per table, so each sync sends only its edits, and deletes
/// chains that fell out of the model in a later batch of their own.
pub struct Committer {
    nft: Nft,
    committed: BTreeMap<TableRef, Table>,
    stale: BTreeMap<TableRef, BTreeSet<String>>,
}

impl Committer {
    pub fn new(nft: Nft) -> Committer {
        Committer {
            nft,
            committed: BTreeMap::new(),
            stale: BTreeMap::new(),
        }
    }

    pub fn nft(&mut self) -> &mut Nft {
        &mut self.nft
    }

    /// Keep `tables` as what the kernel holds: the models of a replace whose `build` gave
    /// none the second time (see [`Change::Replace`]), built once the caller was told.
    pub fn adopt(&mut self, tables: Vec<Table>) {
        for t in tables {
            self.committed.insert(TableRef::of(&t), t);
        }
    }

    /// What the kernel holds for a table, as far as this committer knows.
    pub fn committed(&self, t: &TableRef) -> Option<&Table> {
        self.committed.get(t)
    }

    /// The tables this committer has committed models of.
    pub fn committed_tables(&self) -> Vec<TableRef> {
        self.committed.keys().cloned().collect()
    }

    /// Chains flushed but not yet deleted.
    pub fn stale_chains(&self, t: &TableRef) -> Vec<String> {
        self.stale
            .get(t)
            .map(|s| s.iter().cloned().collect())
            .unwrap_or_default()
    }

    /// Compare the kernel's table with what this committer last committed to it (without
    /// copying the model); `None` when it committed nothing to that table.
    pub fn drift(&mut self, t: &TableRef) -> Result<Option<Drift>, Error> {
        let Some(model) = self.committed.get(t) else {
            return Ok(None);
        };
        let stale = self.stale_chains(t);
        self.nft.drift(model, &stale).map(Some)
    }

    /// Commit one change in one batch (deleting absent tables and stale chains in batches of
    /// their own), and keep what the kernel then holds. On failure the caller starts again
    /// with a whole replace: after a failed replace this committer holds no model.
    pub fn commit(&mut self, c: Commit<'_>) -> Result<Committed, Error> {
        let Commit {
            change,
            absent,
            pause,
            freed,
            carry_counters,
        } = c;
        match change {
            Change::Edit(edits) => {
                let mut done = Committed {
                    stats: self.edit(edits)?,
                    ..Committed::default()
                };
                self.delete_absent(&absent, &mut done)?;
                Ok(done)
            }
            Change::Replace(build) => {
                let mut no_op = || {};
                let freed = freed.unwrap_or(&mut no_op);
                self.replace(build, carry_counters, pause, &absent, freed)
            }
        }
    }

    /// Forget every model, build the tables, carry counters, then encode (consuming the
    /// tables) and commit them; delete absent tables while the watch is still paused; build
    /// the tables again as the new models.
    fn replace(
        &mut self,
        build: &mut dyn FnMut() -> Vec<Table>,
        carry_counters: bool,
        pause: Option<&WatchPause>,
        absent: &[TableRef],
        freed: &mut dyn FnMut(),
    ) -> Result<Committed, Error> {
        // The models are dropped before the tables are built, so both are never held.
        self.committed.clear();
        self.stale.clear();
        let started = Instant::now();
        let mut tables = build();
        let mut done = Committed::default();
        if carry_counters {
            done.carried = self.carry_counters(&mut tables)?;
            debug!(counters = done.carried, "carried counters over the replace");
        }
        let learned = self.read_learned(&tables)?;
        done.restored = learned
            .values()
            .flat_map(|sets| sets.values())
            .map(Vec::len)
            .sum();
        if done.restored > 0 {
            debug!(
                elements = done.restored,
                "carrying what dynamic sets learned over the replace"
            );
        }
        for t in &tables {
            crate::validate::validate(t)?;
        }
        // The drift watch does not listen to our own replace (a change by another process
        // meanwhile goes unheard; a periodic read-back finds it).
        let _paused = pause.and_then(|p| {
            p.pause()
                .map_err(|e| warn!(error = %e, "cannot pause the nftables event watch"))
                .ok()
        });
        let t0 = Instant::now();
        done.prepared = t0 - started;
        let batch = Batch::encode_replace(self.nft.next_batch_seq(), tables, &learned, freed)?;
        drop(learned);
        let encode = t0.elapsed();
        done.stats = self.nft.commit(&batch)?;
        done.stats.encode = encode;
        drop(batch);
        let committed = Instant::now();
        self.delete_absent(absent, &mut done)?;
        drop(_paused);
        for t in build() {
            self.committed.insert(TableRef::of(&t), t);
        }
        done.adopted = committed.elapsed();
        Ok(done)
    }

    /// Read the kernel's counters of each table and start the model's counter objects from
    /// them, so a full replace (which creates every counter anew) does not reset them.
    /// Packets counted between this read and the commit are lost. Returns how many counters
    /// were carried over.
    fn carry_counters(&mut self, tables: &mut [Table]) -> Result<usize, Error> {
        let mut carried = 0;
        for t in tables.iter_mut().filter(|t| !t.counters.is_empty()) {
            let values = self.nft.read_counters(&TableRef::of(t))?;
            carried += t
                .counters
                .keys()
                .filter(|n| values.contains_key(*n))
                .count();
            t.seed_counters(&values);
        }
        Ok(carried)
    }

    /// Read what each dynamic set of the new tables holds now under the same name, with the
    /// time each element has left, so the replace can give it back (a client keeps its
    /// endpoint). Elements learned between this read and the commit are lost.
    fn read_learned(
        &mut self,
        tables: &[Table],
    ) -> Result<BTreeMap<TableRef, crate::model::LearnedElements>, Error> {
        let mut out = BTreeMap::new();
        for t in tables {
            let dynamic = t.sets.values().filter(|s| s.is_dynamic());
            let names: Vec<&str> = dynamic.map(|s| s.name.as_str()).collect();
            if names.is_empty() {
                continue;
            }
            let tr = TableRef::of(t);
            if !self.nft.list_tables(Some(tr.family))?.contains(&tr) {
                continue;
            }
            let learned = self.nft.read_learned(&tr, names)?;
            if !learned.is_empty() {
                out.insert(tr, learned);
            }
        }
        Ok(out)
    }

    /// Commit edits to tables committed before, in one batch. On success the edits become
    /// part of the models; on failure nothing changed.
    fn edit(&mut self, edits: Vec<(TableRef, Edit)>) -> Result<CommitStats, Error> {
        let edits: Vec<(TableRef, Edit)> =
            edits.into_iter().filter(|(_, e)| !e.is_empty()).collect();
        if edits.is_empty() {
            // Nothing to send; chains still waiting for deletion get another try.
            return Ok(self.delete_stale_chains());
        }
        let mut ops = Vec::new();
        let mut new_stale: Vec<(TableRef, Vec<String>)> = Vec::new();
        for (tr, e) in &edits {
            let base = self
                .committed
                .get(tr)
                .ok_or_else(|| crate::validate::Invalid::NotCommitted(tr.clone()))?;
            let (o, stale) = e.ops(base)?;
            ops.extend(o);
            new_stale.push((tr.clone(), stale));
        }
        let mut stats = self.nft.apply(&ops)?;
        drop(ops);
        for (tr, e) in edits {
            // A chain that came back is no longer stale.
            if let Some(s) = self.stale.get_mut(&tr) {
                s.retain(|c| !e.put_chains.iter().any(|p| &p.name == c));
            }
            if let Some(t) = self.committed.get_mut(&tr) {
                e.apply(t);
            }
        }
        for (tr, chains) in new_stale {
            self.stale.entry(tr).or_default().extend(chains);
        }
        stats.add(self.delete_stale_chains());
        Ok(stats)
    }

    /// Try to delete flushed chains; one that is still busy is retried on the next commit.
    fn delete_stale_chains(&mut self) -> CommitStats {
        let mut total = CommitStats::default();
        let tables: Vec<TableRef> = self.stale.keys().cloned().collect();
        for tr in tables {
            let chains: Vec<String> = self.stale[&tr].iter().cloned().collect();
            for c in chains {
                // One chain per batch, so a busy chain does not hold back the others.
                match self.nft.apply(&[Op::DelChain(tr.clone(), c.clone())]) {
                    Ok(s) => {
                        total.add(s);
                        self.stale.get_mut(&tr).map(|s| s.remove(&c));
                    }
                    Err(e) if e.errno() == Some(libc::ENOENT) => {
                        self.stale.get_mut(&tr).map(|s| s.remove(&c));
                    }
                    Err(e) => {
                        warn!(table = %tr, chain = %c, error = %e, "stale chain not deleted yet; will retry")
                    }
                }
            }
        }
        self.stale.retain(|_, s| !s.is_empty());
        total
    }

    /// Delete each absent table the kernel holds, and forget it.
    fn delete_absent(&mut self, absent: &[TableRef], done: &mut Committed) -> Result<(), Error> {
        if absent.is_empty() {
            return Ok(());
        }
        let present = self.nft.list_tables(None)?;
        for tr in absent.iter().filter(|t| present.contains(t)) {
            done.stats.add(self.nft.apply(&ops::delete_table(tr))?);
            self.committed.remove(tr);
            self.stale.remove(tr);
            done.deleted.push(tr.clone());
        }
        Ok(())
    }
}
