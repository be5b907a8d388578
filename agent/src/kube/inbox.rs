//! Watch events in, the planner's [`Objects`] and the set of changed Services out.
//!
//! Services and EndpointSlices are kept once, here: each object the watches read
//! ([`crate::kube::wire`]) is converted to the form the index keeps ([`crate::plan::index`])
//! as it arrives. A re-list (after a watch expired) does not report deletions, so it replaces
//! its kind whole and asks for a full replan.

use crate::kube::wire::{EndpointSlice, Service};
use crate::plan::{index, Objects};
use crate::vocab::ServiceKey;
use kube::core::DeserializeGuard;
use kube::runtime::watcher::Event;
use std::collections::BTreeSet;
use std::sync::Arc;

/// One event from the Service or EndpointSlice watch.
#[derive(Debug)]
pub enum ObjectEvent {
    Service(Box<Event<DeserializeGuard<Service>>>),
    Slice(Box<Event<DeserializeGuard<EndpointSlice>>>),
}

#[derive(Debug, Default)]
pub struct Inbox {
    /// Shared with the status writer by snapshot; changed copy-on-write.
    objects: Arc<Objects>,
    dirty: BTreeSet<ServiceKey>,
    full: bool,
    relist_services: Option<Vec<Arc<index::Service>>>,
    relist_slices: Option<Vec<Arc<index::EndpointSlice>>>,
    pub services_synced: bool,
    pub slices_synced: bool,
}

impl Inbox {
    pub fn objects(&self) -> &Objects {
        &self.objects
    }

    /// The objects as they are now, to share (a later change copies them once).
    pub fn snapshot(&self) -> Arc<Objects> {
        self.objects.clone()
    }

    fn objects_mut(&mut self) -> &mut Objects {
        Arc::make_mut(&mut self.objects)
    }

    pub fn synced(&self) -> bool {
        self.services_synced && self.slices_synced
    }

    /// Take the Services changed since the last call; `None` asks for a full replan.
    pub fn take_dirty(&mut self) -> Option<BTreeSet<ServiceKey>> {
        let dirty = std::mem::take(&mut self.dirty);
        if std::mem::take(&mut self.full) {
            None
        } else {
            Some(dirty)
        }
    }

    /// Apply one event. An object that did not deserialize changes nothing: the last good
    /// version (if any) stays planned, and the watch task has already reported it.
    pub fn apply(&mut self, ev: ObjectEvent) {
        match ev {
            ObjectEvent::Service(ev) => {
                self.on_event(*ev, |i| (&mut i.relist_services, &mut i.services_synced))
            }
            ObjectEvent::Slice(ev) => {
                self.on_event(*ev, |i| (&mut i.relist_slices, &mut i.slices_synced))
            }
        }
    }

    /// One event of one kind; `relist` picks that kind's re-list in progress and its synced
    /// flag.
    fn on_event<W, K: Kept + From<W>>(
        &mut self,
        ev: Event<DeserializeGuard<W>>,
        relist: Relist<K>,
    ) {
        match ev {
            Event::Init => *relist(self).0 = Some(Vec::new()),
            Event::InitApply(DeserializeGuard(Ok(o))) => {
                relist(self)
                    .0
                    .get_or_insert_default()
                    .push(Arc::new(o.into()));
            }
            Event::InitDone => {
                let (pending, synced) = relist(self);
                let all = pending.take().unwrap_or_default();
                *synced = true;
                K::replace(self.objects_mut(), all);
                self.full = true;
            }
            Event::Apply(DeserializeGuard(Ok(o))) => {
                let k = K::put(self.objects_mut(), Arc::new(o.into()));
                self.dirty.extend(k);
            }
            Event::Delete(DeserializeGuard(Ok(o))) => {
                let k = K::delete(self.objects_mut(), &o.into());
                self.dirty.extend(k);
            }
            Event::InitApply(_) | Event::Apply(_) | Event::Delete(_) => {}
        }
    }
}

/// Picks one kind's re-list in progress and whether that kind has listed once.
type Relist<K> = fn(&mut Inbox) -> (&mut Option<Vec<Arc<K>>>, &mut bool);

/// A kind the index keeps, as the inbox changes it.
trait Kept: Sized {
    fn put(objects: &mut Objects, o: Arc<Self>) -> Vec<ServiceKey>;
    fn delete(objects: &mut Objects, o: &Self) -> Vec<ServiceKey>;
    fn replace(objects: &mut Objects, all: Vec<Arc<Self>>);
}

impl Kept for index::Service {
    fn put(objects: &mut Objects, o: Arc<Self>) -> Vec<ServiceKey> {
        objects.put_service(o).into_iter().collect()
    }
    fn delete(objects: &mut Objects, o: &Self) -> Vec<ServiceKey> {
        objects.delete_service(o).into_iter().collect()
    }
    fn replace(objects: &mut Objects, all: Vec<Arc<Self>>) {
        objects.replace_services(all)
    }
}

impl Kept for index::EndpointSlice {
    fn put(objects: &mut Objects, o: Arc<Self>) -> Vec<ServiceKey> {
        objects.put_slice(o)
    }
    fn delete(objects: &mut Objects, o: &Self) -> Vec<ServiceKey> {
        objects.delete_slice(o)
    }
    fn replace(objects: &mut Objects, all: Vec<Arc<Self>>) {
        objects.replace_slices(all)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn svc(name: &str) -> DeserializeGuard<Service> {
        DeserializeGuard(Ok(serde_json::from_value(serde_json::json!({
            "metadata": {"namespace": "ns", "name": name},
            "spec": {"type": "LoadBalancer", "ports": [{"port": 80}]},
        }))
        .unwrap()))
    }

    fn slice(name: &str, service: &str) -> DeserializeGuard<EndpointSlice> {
        DeserializeGuard(Ok(serde_json::from_value(serde_json::json!({
            "metadata": {"namespace": "ns", "name": name, "labels": {"kubernetes.io/service-name": service}},
            "addressType": "IPv4", "endpoints": [],
        }))
        .unwrap()))
    }

    #[test]
    fn a_relist_replaces_its_kind_and_asks_for_a_full_replan() {
        let mut inbox = Inbox::default();
        for ev in [
            Event::Init,
            Event::InitApply(svc("a")),
            Event::InitApply(svc("b")),
            Event::InitDone,
        ] {
            inbox.apply(ObjectEvent::Service(Box::new(ev)));
        }
        assert!(inbox.services_synced && !inbox.synced());
        assert_eq!(inbox.take_dirty(), None);
        // Changes after the list name their Service.
        inbox.apply(ObjectEvent::Slice(Box::new(Event::Apply(slice(
            "a-1", "a",
        )))));
        inbox.apply(ObjectEvent::Service(Box::new(Event::Delete(svc("b")))));
        let dirty = inbox.take_dirty().unwrap();
        assert_eq!(
            dirty,
            [ServiceKey::new("ns", "a"), ServiceKey::new("ns", "b")].into()
        );
        assert_eq!(inbox.take_dirty(), Some(BTreeSet::new()));
        // A re-list without `a` forgets it (the watch never said it was deleted).
        for ev in [Event::Init, Event::InitApply(svc("c")), Event::InitDone] {
            inbox.apply(ObjectEvent::Service(Box::new(ev)));
        }
        assert_eq!(inbox.take_dirty(), None);
        assert!(inbox
            .objects()
            .service(&ServiceKey::new("ns", "a"))
            .is_none());
        assert!(inbox
            .objects()
            .service(&ServiceKey::new("ns", "c"))
            .is_some());
    }
}
