//! Watch events in, the planner's [`Objects`] and the set of changed Services out.
//!
//! Services and EndpointSlices are kept once, here: each object the watches read
//! ([`crate::kube::wire`]) is converted to the form the index keeps ([`crate::plan::index`]) as it
//! arrives, so 10,000 Services fit the memory goal. A re-list (after a watch expired) does not
//! report deletions, so it replaces its kind whole and asks for a full replan.

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
            ObjectEvent::Service(ev) => match *ev {
                Event::Init => self.relist_services = Some(Vec::new()),
                Event::InitApply(DeserializeGuard(Ok(s))) => {
                    self.relist_services
                        .get_or_insert_default()
                        .push(Arc::new(s.into()));
                }
                Event::InitDone => {
                    let all = self.relist_services.take().unwrap_or_default();
                    self.objects_mut().replace_services(all);
                    self.full = true;
                    self.services_synced = true;
                }
                Event::Apply(DeserializeGuard(Ok(s))) => {
                    let k = self.objects_mut().put_service(Arc::new(s.into()));
                    self.dirty.extend(k);
                }
                Event::Delete(DeserializeGuard(Ok(s))) => {
                    let k = self.objects_mut().delete_service(&s.into());
                    self.dirty.extend(k);
                }
                Event::InitApply(_) | Event::Apply(_) | Event::Delete(_) => {}
            },
            ObjectEvent::Slice(ev) => match *ev {
                Event::Init => self.relist_slices = Some(Vec::new()),
                Event::InitApply(DeserializeGuard(Ok(s))) => {
                    self.relist_slices
                        .get_or_insert_default()
                        .push(Arc::new(s.into()));
                }
                Event::InitDone => {
                    let all = self.relist_slices.take().unwrap_or_default();
                    self.objects_mut().replace_slices(all);
                    self.full = true;
                    self.slices_synced = true;
                }
                Event::Apply(DeserializeGuard(Ok(s))) => {
                    let k = self.objects_mut().put_slice(Arc::new(s.into()));
                    self.dirty.extend(k);
                }
                Event::Delete(DeserializeGuard(Ok(s))) => {
                    let k = self.objects_mut().delete_slice(&s.into());
                    self.dirty.extend(k);
                }
                Event::InitApply(_) | Event::Apply(_) | Event::Delete(_) => {}
            },
        }
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
