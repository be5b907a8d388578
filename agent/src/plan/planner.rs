//! The planner with memory: what it decided for each Service last time, so that a sync after
//! one EndpointSlice changed replans that Service (and any Service whose port conflict it
//! changes) and describes the kernel change as an [`Edit`] of the size of the change.
//!
//! Still pure: objects and context in, decisions out; no clock, no I/O. `plan()` is this
//! planner run once from nothing, so the incremental and the full path share every rule, and
//! a test checks that a sequence of updates always equals planning from scratch.

use super::conflicts::{Claim, Claims, Slot};
use super::diagnosis::{ServiceOutcome, Warning};
use super::fragment;
use super::objects::Objects;
use super::prepare::{prepare, Context, Prepared, Stage};
use super::table::{self, HairpinUsers};
use crate::vocab::IpFamily;
use crate::vocab::ServiceKey;
use nodelb_netfilter::{Edit, Table, TableRef};
use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;
use std::sync::Arc;

/// What the kernel must do after an update.
#[derive(Debug)]
pub enum TableChange {
    /// Everything was replanned (first update, or the node, its addresses, the families or
    /// the configuration changed): program [`Planner::tables`] whole.
    Rebuild,
    /// Only these edits, one per table that changed.
    Edit(Vec<(TableRef, Edit)>),
}

#[derive(Debug)]
pub struct Update {
    pub change: TableChange,
    /// Services whose outcome changed, appeared or went away.
    pub changed: BTreeSet<ServiceKey>,
    /// Services that were planned again (for logging what was looked at).
    pub replanned: usize,
}

#[derive(Clone, Debug, Default)]
pub struct Planner {
    /// Decide outcomes only, no table content (see [`Planner::outcomes_only`]).
    no_tables: bool,
    ctx: Option<Context>,
    /// The objects as of the last update (a persistent map's clone shares everything with
    /// the caller's: what changes later is copied there, not here). Nothing derived per
    /// Service is kept beyond outcomes, claims and warnings: what a Service was prepared as
    /// before, and its Parts, are built again from these objects when an update needs them.
    objects: Objects,
    claims: Claims,
    /// What each Service got (exactly the Services nodelb handles). Parts are rebuilt from the
    /// prepared Service and this outcome (see [`fragment::recorded_winner`]).
    outcomes: BTreeMap<ServiceKey, ServiceOutcome>,
    /// The problems found in each Service and its slices, for those that have any.
    warnings: BTreeMap<ServiceKey, Vec<Warning>>,
    hairpin: BTreeMap<IpFamily, HairpinUsers>,
    /// How many Service ports use each shared `endpoints-N` chain, per family.
    endpoint_chains: BTreeMap<IpFamily, BTreeMap<usize, usize>>,
}

/// One Service of `objects`, prepared (`None`: not nodelb's).
fn prepare_in(objects: &Objects, key: &ServiceKey, ctx: &Context) -> Option<Prepared> {
    prepare(key, objects.service(key), &objects.slices_of(key), ctx)
}

fn claims_of(p: Option<&Prepared>) -> Vec<(Slot, Claim)> {
    let Some(Prepared {
        key,
        stage: Stage::Ports { created, ports, .. },
        ..
    }) = p
    else {
        return Vec::new();
    };
    ports
        .iter()
        .map(|pp| {
            (
                (pp.family, pp.port.protocol, pp.port.port),
                Claim::new(created.as_ref(), key),
            )
        })
        .collect()
}

impl Planner {
    pub fn new() -> Planner {
        Planner::default()
    }

    /// A planner that decides what each Service gets but builds no table content: what the
    /// status writer needs for every node.
    pub fn outcomes_only() -> Planner {
        Planner {
            no_tables: true,
            ..Planner::default()
        }
    }

    /// Bring the plan up to date. `dirty` lists the Services whose Service object or slices
    /// changed since the last update; `None` (or a changed context) replans everything.
    pub fn update(
        &mut self,
        objects: &Objects,
        ctx: &Context,
        dirty: Option<&BTreeSet<ServiceKey>>,
    ) -> Update {
        let rebuild = dirty.is_none() || self.ctx.as_ref() != Some(ctx);
        let previous = std::mem::replace(&mut self.objects, objects.clone());
        let keys: BTreeSet<ServiceKey> = if rebuild {
            let mut keys = objects.keys();
            keys.extend(self.outcomes.keys().cloned());
            *self = Planner {
                no_tables: self.no_tables,
                ctx: Some(ctx.clone()),
                objects: objects.clone(),
                ..Planner::default()
            };
            keys
        } else {
            dirty.cloned().unwrap_or_default()
        };

        // 1. Prepare the dirty Services, now and as they were (after a rebuild nothing was);
        // track the slots whose claims move.
        let mut refresh: BTreeSet<ServiceKey> = BTreeSet::new();
        let mut winners_before: BTreeMap<Slot, Option<ServiceKey>> = BTreeMap::new();
        let mut prepared: BTreeMap<ServiceKey, (Option<Prepared>, Option<Prepared>)> =
            BTreeMap::new();
        for key in keys {
            let new = prepare_in(objects, &key, ctx);
            let old = if rebuild {
                None
            } else {
                prepare_in(&previous, &key, ctx)
            };
            if old == new && (old.is_some() || !self.outcomes.contains_key(&key)) {
                continue;
            }
            for (slot, claim) in claims_of(old.as_ref()) {
                let w = self.claims.winner(&slot).cloned();
                winners_before.entry(slot).or_insert(w);
                self.claims.remove(&slot, &claim);
            }
            for (slot, claim) in claims_of(new.as_ref()) {
                let w = self.claims.winner(&slot).cloned();
                winners_before.entry(slot).or_insert(w);
                self.claims.add(slot, claim);
            }
            match new.as_ref().map(|p| &p.warnings).filter(|w| !w.is_empty()) {
                Some(w) => self.warnings.insert(key.clone(), w.clone()),
                None => self.warnings.remove(&key),
            };
            prepared.insert(key.clone(), (old, new));
            refresh.insert(key);
        }
        // 2. A slot with a new holder changes every Service claiming it.
        // (A holder that lost its slot is a claimant still, or was dirty itself.)
        for (slot, before) in winners_before {
            if self.claims.winner(&slot) != before.as_ref() {
                refresh.extend(self.claims.claimants(&slot).cloned());
            }
        }

        // 3. New fragments, and what they change in each table.
        let replanned = refresh.len();
        let mut edits: BTreeMap<IpFamily, Edit> = BTreeMap::new();
        let mut hairpin_before: BTreeMap<IpFamily, BTreeMap<IpAddr, Option<Arc<str>>>> =
            BTreeMap::new();
        let mut changed = BTreeSet::new();
        // Endpoint counts touched, with whether their chain existed before this update.
        let mut chains_before: BTreeMap<IpFamily, BTreeMap<usize, bool>> = BTreeMap::new();
        let tables = !self.no_tables;
        for key in refresh {
            // A Service refreshed only because a slot changed holder is prepared as before.
            let (old_prep, new_prep) = match prepared.remove(&key) {
                Some(p) => p,
                None => {
                    let p = prepare_in(objects, &key, ctx);
                    (p.clone(), p)
                }
            };
            let claims = &self.claims;
            let new = new_prep
                .as_ref()
                .map(|p| fragment::build(p, |s| claims.winner(s), ctx, tables));
            let old_outcome = self.outcomes.remove(&key);
            // The Service's Parts before this update, rebuilt from what it was prepared as and
            // the holders its outcome recorded (the context is unchanged when not rebuilding).
            let old = match (&old_outcome, old_prep, rebuild || !tables) {
                (Some(outcome), Some(p), false) => Some(fragment::build(
                    &p,
                    |s| fragment::recorded_winner(outcome, s),
                    ctx,
                    true,
                )),
                _ => None,
            };
            if old_outcome.as_ref() != new.as_ref().map(|f| &f.outcome) {
                changed.insert(key.clone());
            }
            for family in ctx.families.iter() {
                let op = old.as_ref().and_then(|f| f.parts.get(&family));
                let np = new.as_ref().and_then(|f| f.parts.get(&family));
                if !rebuild {
                    table::edit_part(op, np, edits.entry(family).or_default());
                }
                let uses = self.endpoint_chains.entry(family).or_default();
                let before_n = chains_before.entry(family).or_default();
                for n in op.iter().flat_map(|p| &p.endpoint_chains) {
                    before_n.entry(*n).or_insert_with(|| uses.contains_key(n));
                    if let Some(c) = uses.get_mut(n) {
                        *c -= 1;
                        if *c == 0 {
                            uses.remove(n);
                        }
                    }
                }
                for n in np.iter().flat_map(|p| &p.endpoint_chains) {
                    before_n.entry(*n).or_insert_with(|| uses.contains_key(n));
                    *uses.entry(*n).or_default() += 1;
                }
                let users = self.hairpin.entry(family).or_default();
                let before = hairpin_before.entry(family).or_default();
                for (addr, c) in op.iter().flat_map(|p| &p.hairpin) {
                    before
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
                for (addr, c) in np.iter().flat_map(|p| &p.hairpin) {
                    before
                        .entry(*addr)
                        .or_insert_with(|| users.get(addr).and_then(|u| u.first()).cloned());
                    let u = users.entry(*addr).or_default();
                    if let Err(i) = u.binary_search(c) {
                        u.reserve_exact(1);
                        u.insert(i, c.clone());
                    }
                }
            }
            if let Some(n) = new {
                self.outcomes.insert(key, n.outcome);
            }
        }
        if rebuild {
            return Update {
                change: TableChange::Rebuild,
                changed,
                replanned,
            };
        }
        for (family, before) in &chains_before {
            let uses = self.endpoint_chains.get(family);
            let edit = edits.entry(*family).or_default();
            for (n, existed) in before {
                let exists = uses.is_some_and(|u| u.contains_key(n));
                match (existed, exists) {
                    (false, true) => edit.put_chains.push(table::endpoint_chain(*n)),
                    (true, false) => edit.del_chains.push(table::endpoint_chain_name(*n)),
                    _ => {}
                }
            }
        }
        for (family, before) in &hairpin_before {
            let addrs: BTreeSet<IpAddr> = before.keys().copied().collect();
            table::edit_hairpin(
                &addrs,
                before,
                self.hairpin.get(family).unwrap_or(&HairpinUsers::new()),
                edits.entry(*family).or_default(),
            );
        }
        Update {
            change: TableChange::Edit(
                edits
                    .into_iter()
                    .filter(|(_, e)| !e.is_empty())
                    .map(|(f, e)| (ctx.config.table_ref(f), e))
                    .collect(),
            ),
            changed,
            replanned,
        }
    }

    /// Every table as planned now, one per programmed family. Each Service's Parts are built
    /// again here and moved into the tables.
    pub fn tables(&self) -> Vec<Table> {
        let Some(ctx) = &self.ctx else {
            return Vec::new();
        };
        let mut assemblies: Vec<(IpFamily, table::Assembly)> = ctx
            .families
            .iter()
            .map(|family| {
                let skeleton =
                    table::skeleton(family, &ctx.config.table_name, &ctx.local_addresses);
                (family, table::Assembly::new(skeleton))
            })
            .collect();
        if !self.no_tables {
            for key in self.outcomes.keys() {
                let Some(p) = prepare_in(&self.objects, key, ctx) else {
                    continue;
                };
                let f = fragment::build(&p, |s| self.claims.winner(s), ctx, true);
                for (family, part) in f.parts.into_parts() {
                    if let Some((_, a)) = assemblies.iter_mut().find(|(f, _)| *f == family) {
                        a.add(part);
                    }
                }
            }
        }
        let empty = HairpinUsers::new();
        assemblies
            .into_iter()
            .map(|(family, a)| a.finish(self.hairpin.get(&family).unwrap_or(&empty)))
            .collect()
    }

    /// What this node does for each Service nodelb handles.
    pub fn outcomes(&self) -> impl Iterator<Item = (&ServiceKey, &ServiceOutcome)> {
        self.outcomes.iter()
    }

    pub fn outcome(&self, key: &ServiceKey) -> Option<&ServiceOutcome> {
        self.outcomes.get(key)
    }

    /// The problems found in one Service and its slices.
    pub fn warnings_of(&self, key: &ServiceKey) -> &[Warning] {
        self.warnings
            .get(key)
            .map(Vec::as_slice)
            .unwrap_or_default()
    }

    /// Every problem found in the input, Service by Service.
    pub fn warnings(&self) -> impl Iterator<Item = &Warning> {
        self.warnings.values().flatten()
    }
}
