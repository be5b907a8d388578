//! Port conflicts on this node: two Services served here on the same (family, protocol, port).
//! The oldest (creationTimestamp, then namespace/name) wins; the other gets no rules for it.
//!
//! Claims are kept per slot, so a change to one Service re-decides only the slots it touches.

use crate::vocab::IpFamily;
use crate::vocab::{Protocol, ServiceKey};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use std::collections::BTreeMap;

/// What two Services can conflict on.
pub type Slot = (IpFamily, Protocol, u16);

/// A Service's claim on a slot, ordered oldest first: a Service without a creationTimestamp
/// (only in files) counts as newest; ties go by namespace/name.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct Claim {
    pub no_timestamp: bool,
    pub created: Option<Time>,
    pub service: ServiceKey,
}

impl Claim {
    pub fn new(created: Option<&Time>, service: &ServiceKey) -> Claim {
        Claim {
            no_timestamp: created.is_none(),
            created: created.cloned(),
            service: service.clone(),
        }
    }
}

/// The claims on each slot, sorted oldest first (usually one: a vector, where a set would
/// allocate room for eleven per slot).
#[derive(Clone, Debug, Default)]
pub struct Claims {
    slots: BTreeMap<Slot, Vec<Claim>>,
}

impl Claims {
    /// Rebuild packed (see `packed`), after every Service was added in key order.
    pub fn pack(&mut self) {
        crate::packed::repack(&mut self.slots);
    }

    /// The Service holding a slot.
    pub fn holder(&self, slot: &Slot) -> Option<&ServiceKey> {
        self.slots
            .get(slot)
            .and_then(|c| c.first())
            .map(|c| &c.service)
    }

    /// Every Service claiming a slot.
    pub fn claimants(&self, slot: &Slot) -> impl Iterator<Item = &ServiceKey> {
        self.slots
            .get(slot)
            .into_iter()
            .flat_map(|c| c.iter().map(|c| &c.service))
    }

    pub fn add(&mut self, slot: Slot, claim: Claim) {
        let c = self.slots.entry(slot).or_default();
        if let Err(i) = c.binary_search(&claim) {
            // Exactly: a vector grows to room for four claims at first.
            c.reserve_exact(1);
            c.insert(i, claim);
        }
    }

    pub fn remove(&mut self, slot: &Slot, claim: &Claim) {
        if let Some(c) = self.slots.get_mut(slot) {
            if let Ok(i) = c.binary_search(claim) {
                c.remove(i);
            }
            if c.is_empty() {
                self.slots.remove(slot);
            }
        }
    }
}
