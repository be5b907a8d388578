//! The planner with memory: what it decided for each Service last time, so that a sync after
//! one EndpointSlice changed replans that Service (and any Service whose port conflict it
//! changes) and describes the kernel change as an [`Edit`] of the size of the change.
//!
//! Still pure: objects and context in, decisions out; no clock, no I/O. `plan()` is this
//! planner run once from nothing, so the incremental and the full path share every rule, and
//! a test checks that a sequence of updates always equals planning from scratch.

use super::conflicts::{Claim, Claims, Slot};
use super::diagnosis::{ServiceOutcome, Warning};
use super::flows::{self, FlowChange, Flows, Touched};
use super::prepare::{prepare, Context, Prepared, Stage};
use super::settled::{self, Settled};
use super::slots::{self, Orders};
use super::table::{self, HairpinUsers, Shared, SharedBefore};
use crate::objects::index::Objects;
use crate::vocab::IpFamily;
use crate::vocab::ServiceKey;
use nodelb_netfilter::{Edit, Table, TableRef};
use std::collections::{BTreeMap, BTreeSet};

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
    /// How the UDP and SCTP ports' endpoints changed: the conntrack entries to delete once
    /// this update is committed ([`FlowChange::stale`]). The same after a rebuild as after the
    /// edit that gets to the same plan.
    pub flows: FlowChange,
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
    /// prepared Service and this outcome (see [`settled::recorded_winner`]).
    outcomes: BTreeMap<ServiceKey, ServiceOutcome>,
    /// The problems found in each Service and its slices, for those that have any.
    warnings: BTreeMap<ServiceKey, Vec<Warning>>,
    /// Who uses the shared `endpoints-N` chains and hairpin elements.
    shared: Shared,
    /// The endpoint slots of the ports whose endpoints are not in sorted order (see `slots`),
    /// by Service. Empty after a rebuild.
    slots: BTreeMap<ServiceKey, Orders>,
    /// The UDP and SCTP ports that DNAT and the endpoints whose flows they keep (not kept by an
    /// outcomes-only planner).
    flows: Flows,
}

/// The dirty Services whose preparation changed, and the slots whose claims moved with them.
#[derive(Default)]
struct Reprepared {
    /// Prepared before and now (a Service replanned only because a slot it claims changed
    /// holder is not here: it is prepared as before).
    prepared: BTreeMap<ServiceKey, Prep>,
    /// The holder of each slot whose claims moved, before they moved.
    winners_before: BTreeMap<Slot, Option<ServiceKey>>,
}

/// A dirty Service's preparation.
enum Prep {
    /// As it was prepared before the update and as it is now (boxed: a rebuild's map holds
    /// only keys and [`Prep::Again`]).
    Changed(Box<(Option<Prepared>, Option<Prepared>)>),
    /// A rebuild's (nothing was prepared before): prepared again when it is replanned, so a
    /// rebuild never holds every Service prepared at once. At 10,000 Services that was
    /// several MiB, freed piecemeal among what the rebuild kept, and the resident set kept the
    /// holes (the latency bench's leader, see docs/benchmarks.md and docs/sizing.md).
    Again,
}

/// What replanning the Services adds up to.
#[derive(Default)]
struct Replanned {
    /// Edits to each family's table, from the Services' Parts (empty after a rebuild).
    edits: BTreeMap<IpFamily, Edit>,
    /// The shared objects touched, as they were.
    shared_before: SharedBefore,
    /// Services whose outcome changed, appeared or went away.
    changed: BTreeSet<ServiceKey>,
    /// The datagram ports touched, with their endpoints before.
    touched: Touched,
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

    /// Keep `objects` as the version planned when it plans exactly like the one kept (only
    /// status writes changed since: see [`Objects::plans_like`]), so the Services those writes
    /// replaced are not held until the next update. Returns whether it did.
    pub fn follow(&mut self, objects: &Objects) -> bool {
        let like = objects.plans_like(&self.objects);
        if like {
            self.objects = objects.clone();
        }
        like
    }

    /// Bring the plan up to date. `dirty` lists the Services whose Service object or slices
    /// changed since the last update; `None` (or a changed context) replans everything.
    pub fn update(
        &mut self,
        objects: &Objects,
        ctx: &Context,
        dirty: Option<&BTreeSet<ServiceKey>>,
    ) -> Update {
        let rebuild =
            dirty.is_none() || !self.ctx.as_ref().is_some_and(|c| c.same_but_listeners(ctx));
        // A rebuild forgets everything but what the ports DNATed to, to compare with after.
        let flows_before = rebuild.then(|| std::mem::take(&mut self.flows));
        let previous = std::mem::replace(&mut self.objects, objects.clone());
        let (keys, moved) = if rebuild {
            (self.reset(objects, ctx), BTreeSet::new())
        } else {
            (
                dirty.cloned().unwrap_or_default(),
                self.follow_listeners(ctx),
            )
        };
        let previous = (!rebuild).then_some(&previous);
        let reprepared = self.reprepare(keys, objects, previous, ctx);
        let mut refresh = self.settle_conflicts(&reprepared);
        // A listener that started or stopped: every Service claiming its slot.
        for slot in &moved {
            refresh.extend(self.claims.claimants(slot).cloned());
        }
        let replanned = refresh.len();
        let Replanned {
            mut edits,
            shared_before,
            changed,
            touched,
        } = self.replan(refresh, reprepared, objects, ctx, rebuild);
        let flows = match flows_before {
            Some(before) => FlowChange::between(&before, &self.flows),
            None => self.flows.change_since(touched),
        };
        if rebuild {
            self.pack();
            return Update {
                change: TableChange::Rebuild,
                changed,
                replanned,
                flows,
            };
        }
        self.shared.edits(shared_before, &mut edits);
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
            flows,
        }
    }

    /// After a rebuild, which filled the per-Service maps in key order: rebuild them packed
    /// (see `packed`).
    fn pack(&mut self) {
        crate::packed::repack(&mut self.outcomes);
        crate::packed::repack(&mut self.warnings);
        self.claims.pack();
        self.flows.pack();
    }

    /// Take the context's listeners (the rest of it is as before); returns the slots whose
    /// taker changed.
    fn follow_listeners(&mut self, ctx: &Context) -> BTreeSet<Slot> {
        if self.ctx.as_ref() == Some(ctx) {
            return BTreeSet::new();
        }
        let Some(before) = self.ctx.replace(ctx.clone()) else {
            return BTreeSet::new();
        };
        ctx.taken.moved(&before.taken)
    }

    /// Forget everything but the context (a rebuild); returns every Service to plan: those in
    /// `objects` and those planned before, whose outcomes go away.
    fn reset(&mut self, objects: &Objects, ctx: &Context) -> BTreeSet<ServiceKey> {
        let mut keys = objects.keys();
        keys.extend(self.outcomes.keys().cloned());
        *self = Planner {
            no_tables: self.no_tables,
            ctx: Some(ctx.clone()),
            objects: objects.clone(),
            ..Planner::default()
        };
        keys
    }

    /// Prepare the dirty Services, now and as they were in `previous` (`None`: after a rebuild
    /// nothing was), keep those whose preparation changed, and move their claims and
    /// warnings.
    fn reprepare(
        &mut self,
        keys: BTreeSet<ServiceKey>,
        objects: &Objects,
        previous: Option<&Objects>,
        ctx: &Context,
    ) -> Reprepared {
        let mut out = Reprepared::default();
        for key in keys {
            let new = prepare_in(objects, &key, ctx);
            let old = previous.and_then(|p| prepare_in(p, &key, ctx));
            if old == new && (old.is_some() || !self.outcomes.contains_key(&key)) {
                continue;
            }
            // A rebuild starts with no claims: every claimant is replanned anyway, so which
            // slots changed holder is not noted (a map of every slot, otherwise).
            let winners_before = previous.is_some().then_some(&mut out.winners_before);
            self.move_claims(old.as_ref(), new.as_ref(), winners_before);
            match new.as_ref().map(|p| &p.warnings).filter(|w| !w.is_empty()) {
                Some(w) => self.warnings.insert(key.clone(), w.clone()),
                None => self.warnings.remove(&key),
            };
            let prep = match previous {
                Some(_) => Prep::Changed(Box::new((old, new))),
                None => Prep::Again,
            };
            out.prepared.insert(key, prep);
        }
        out
    }

    /// A Service's claims go from those of `old` to those of `new`, noting each slot's holder
    /// before its first move in `winners_before` (unless `None`).
    fn move_claims(
        &mut self,
        old: Option<&Prepared>,
        new: Option<&Prepared>,
        mut winners_before: Option<&mut BTreeMap<Slot, Option<ServiceKey>>>,
    ) {
        let mut note = |claims: &Claims, slot: Slot| {
            if let Some(w) = winners_before.as_deref_mut() {
                w.entry(slot)
                    .or_insert_with(|| claims.holder(&slot).cloned());
            }
        };
        for (slot, claim) in claims_of(old) {
            note(&self.claims, slot);
            self.claims.remove(&slot, &claim);
        }
        for (slot, claim) in claims_of(new) {
            note(&self.claims, slot);
            self.claims.add(slot, claim);
        }
    }

    /// The Services to plan again: those prepared anew, and every Service claiming a slot with
    /// a new holder (a holder that lost its slot is a claimant still, or was dirty itself).
    fn settle_conflicts(&self, reprepared: &Reprepared) -> BTreeSet<ServiceKey> {
        let mut refresh: BTreeSet<ServiceKey> = reprepared.prepared.keys().cloned().collect();
        for (slot, before) in &reprepared.winners_before {
            if self.claims.holder(slot) != before.as_ref() {
                refresh.extend(self.claims.claimants(slot).cloned());
            }
        }
        refresh
    }

    /// New settled Services and outcomes for the `refresh` Services, and what they change in each
    /// table.
    fn replan(
        &mut self,
        refresh: BTreeSet<ServiceKey>,
        mut reprepared: Reprepared,
        objects: &Objects,
        ctx: &Context,
        rebuild: bool,
    ) -> Replanned {
        let mut out = Replanned::default();
        for key in refresh {
            let (old_prep, new_prep) = match reprepared.prepared.remove(&key) {
                Some(Prep::Changed(p)) => *p,
                Some(Prep::Again) => (None, prepare_in(objects, &key, ctx)),
                None => {
                    let p = prepare_in(objects, &key, ctx);
                    (p.clone(), p)
                }
            };
            let old_outcome = self.outcomes.remove(&key);
            let tables = !self.no_tables;
            let old_orders = self.slots.remove(&key).unwrap_or_default();
            let new_orders = match tables {
                true => slots::follow(old_prep.as_ref(), &old_orders, new_prep.as_ref()),
                false => Orders::new(),
            };
            let claims = &self.claims;
            let new = new_prep.as_ref().map(|p| {
                let holder = |s: &_| settled::holder_now(ctx, claims, s);
                settled::build(p, holder, tables.then_some(&new_orders))
            });
            // The Service's Parts before this update, rebuilt from what it was prepared as and
            // the holders its outcome recorded (the context is unchanged when not rebuilding,
            // but for its listeners, whose earlier holds the outcome recorded too).
            let old = match (&old_outcome, old_prep, rebuild || !tables) {
                (Some(outcome), Some(p), false) => Some(settled::build(
                    &p,
                    |s| settled::recorded_holder(outcome, s),
                    Some(&old_orders),
                )),
                _ => None,
            };
            if old_outcome.as_ref() != new.as_ref().map(|f| &f.outcome) {
                out.changed.insert(key.clone());
            }
            if tables {
                let now = match (&new_prep, &new) {
                    (Some(p), Some(f)) => flows::of_service(p, &f.outcome),
                    _ => Vec::new(),
                };
                self.flows.replace(&key, now, &mut out.touched);
            }
            self.replace_parts(old.as_ref(), new.as_ref(), ctx, rebuild, &mut out);
            if let Some(n) = new {
                if tables && !new_orders.is_empty() {
                    self.slots.insert(key.clone(), new_orders);
                }
                self.outcomes.insert(key, n.outcome);
            }
        }
        out
    }

    /// One Service's Parts go from `old` to `new` in every family: the shared objects' users
    /// move, and (but in a rebuild) the edits record the change.
    fn replace_parts(
        &mut self,
        old: Option<&Settled>,
        new: Option<&Settled>,
        ctx: &Context,
        rebuild: bool,
        out: &mut Replanned,
    ) {
        for family in ctx.families.iter() {
            let op = old.and_then(|f| f.parts.get(&family));
            let np = new.and_then(|f| f.parts.get(&family));
            if !rebuild {
                table::edit_part(op, np, out.edits.entry(family).or_default());
            }
            self.shared.replace(family, op, np, &mut out.shared_before);
        }
    }

    /// Whether some Service nodelb handles asks for ClientIP affinity (its ports keep clients
    /// by endpoint slot, see [`Planner::seed_slots`]).
    pub fn has_affinity(&self) -> bool {
        self.outcomes.keys().any(|k| self.asks_for_affinity(k))
    }

    /// Whether Service `key`'s spec asks for ClientIP affinity (read from the object, without
    /// preparing the Service).
    fn asks_for_affinity(&self, key: &ServiceKey) -> bool {
        let spec = self.objects.service(key).and_then(|s| s.spec.as_ref());
        spec.is_some_and(|s| s.session_affinity.as_deref() == Some("ClientIP"))
    }

    /// Take the endpoint slots the kernel's tables hold (`kernel`, by family; see
    /// [`slots::kernel_orders`]) for the ClientIP affinity ports whose order this planner
    /// does not know: a planner started from nothing would number them sorted and move their
    /// clients. Call it before the tables are built for a whole replace.
    pub fn seed_slots(&mut self, kernel: &BTreeMap<IpFamily, slots::KernelOrders>) {
        let (Some(ctx), false) = (&self.ctx, self.no_tables) else {
            return;
        };
        // Only affinity Services are prepared: at 10,000 Services preparing all of them would
        // add about 100 ms to every whole replace.
        for key in self.outcomes.keys() {
            if self.slots.contains_key(key) || !self.asks_for_affinity(key) {
                continue;
            }
            let Some(p) = prepare_in(&self.objects, key, ctx) else {
                continue;
            };
            let orders = slots::seed(&p, |f| kernel.get(&f));
            if !orders.is_empty() {
                self.slots.insert(key.clone(), orders);
            }
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
            let sorted = Orders::new();
            for key in self.outcomes.keys() {
                let Some(p) = prepare_in(&self.objects, key, ctx) else {
                    continue;
                };
                let orders = self.slots.get(key).unwrap_or(&sorted);
                let holder = |s: &_| settled::holder_now(ctx, &self.claims, s);
                let f = settled::build(&p, holder, Some(orders));
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
            .map(|(family, a)| a.finish(self.shared.hairpin(family).unwrap_or(&empty)))
            .collect()
    }

    /// The (family, protocol, port)s host listeners take on this node, each with its
    /// listener and whether a Service claims it here (a Service port the listener holds).
    /// (A node where every port counts as taken has no list: none.)
    pub fn taken_ports(&self) -> Vec<(Slot, &crate::vocab::Listener, bool)> {
        let Some(ctx) = &self.ctx else {
            return Vec::new();
        };
        ctx.taken
            .slots()
            .map(|(slot, l)| (*slot, l, self.claims.claimants(slot).next().is_some()))
            .collect()
    }

    /// The UDP and SCTP ports that DNAT now, and the endpoints whose flows they keep.
    pub fn flows(&self) -> &Flows {
        &self.flows
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
