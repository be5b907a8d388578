//! Watch events in, the planner's [`Objects`] and the set of changed Services out.
//!
//! Services and EndpointSlices are kept once, here: each object the watches read
//! ([`nodelb_core::objects::wire`]) is converted to the form the index keeps ([`nodelb_core::objects::index`])
//! as it arrives. A re-list (after a watch expired) does not report deletions, so it replaces
//! its kind whole and asks for a full replan. A Service whose only change is what a status
//! write changes (see [`index::Service::plans_like`]) is kept for the status writer but not
//! handed to the planner: every status the leader writes comes back to every agent that way.

use kube::core::DeserializeGuard;
use kube::runtime::watcher::Event;
use nodelb_core::objects::index;
use nodelb_core::objects::wire::{EndpointSlice, Service};
use nodelb_core::plan::Objects;
use nodelb_core::vocab::ServiceKey;
use std::collections::BTreeSet;
use std::sync::Arc;

/// The Service and EndpointSlice watches' names, in readiness and in metrics.
pub const SERVICE_WATCH: &str = "services";
pub const SLICE_WATCH: &str = "endpointslices";

/// One event from the Service or EndpointSlice watch.
#[derive(Debug)]
pub enum ObjectEvent {
    Service(Box<Event<DeserializeGuard<Service>>>),
    Slice(Box<Event<DeserializeGuard<EndpointSlice>>>),
}

impl ObjectEvent {
    /// The readiness name of the watch whose list this event ends, if it does.
    pub fn list_end(&self) -> Option<&'static str> {
        match self {
            ObjectEvent::Service(e) if matches!(**e, Event::InitDone) => Some(SERVICE_WATCH),
            ObjectEvent::Slice(e) if matches!(**e, Event::InitDone) => Some(SLICE_WATCH),
            _ => None,
        }
    }
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

    /// Apply one event; returns whether the planner must look at what it changed (a Service
    /// whose change only a status write could have made, or a re-list still in progress, need
    /// not). An object that did not deserialize changes nothing: the last good version (if
    /// any) stays planned, and the watch task has already reported it.
    pub fn apply(&mut self, ev: ObjectEvent) -> bool {
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
    /// flag. Returns whether the planner must look.
    fn on_event<W, K: Kept + From<W>>(
        &mut self,
        ev: Event<DeserializeGuard<W>>,
        relist: Relist<K>,
    ) -> bool {
        let keys = match ev {
            Event::Init => {
                *relist(self).0 = Some(Vec::new());
                return false;
            }
            Event::InitApply(DeserializeGuard(Ok(o))) => {
                relist(self)
                    .0
                    .get_or_insert_default()
                    .push(Arc::new(o.into()));
                return false;
            }
            Event::InitDone => {
                let (pending, synced) = relist(self);
                let all = pending.take().unwrap_or_default();
                *synced = true;
                K::replace(self.objects_mut(), all);
                self.full = true;
                return true;
            }
            Event::Apply(DeserializeGuard(Ok(o))) => K::put(self.objects_mut(), Arc::new(o.into())),
            Event::Delete(DeserializeGuard(Ok(o))) => K::delete(self.objects_mut(), &o.into()),
            Event::InitApply(_) | Event::Apply(_) | Event::Delete(_) => return false,
        };
        let replan = !keys.is_empty();
        self.dirty.extend(keys);
        replan
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
    /// The key, unless the planner would plan the new version as the one it replaces.
    fn put(objects: &mut Objects, o: Arc<Self>) -> Vec<ServiceKey> {
        let replan = ServiceKey::of(&o)
            .and_then(|k| objects.service(&k))
            .is_none_or(|before| !o.plans_like(before));
        let key = objects.put_service(o);
        key.filter(|_| replan).into_iter().collect()
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
    use nodelb_core::fixtures::{Slice, Svc};

    /// The watches read objects through kube's `DeserializeGuard`: a Service read as nodelb's
    /// wire type and as kube's guard of it is the same Service.
    #[test]
    fn the_watches_read_a_service_as_its_wire_type_reads_it() {
        let v = nodelb_core::fixtures::service_json();
        let g: DeserializeGuard<Service> = serde_json::from_value(v.clone()).unwrap();
        let plain: Service = serde_json::from_value(v).unwrap();
        assert_eq!(g.0.unwrap(), plain);
    }

    #[test]
    fn an_unreadable_service_is_still_named_for_the_watch_to_report() {
        let mut v = nodelb_core::fixtures::service_json();
        v["spec"]["ports"][0]["port"] = serde_json::json!("eighty");
        let full: DeserializeGuard<k8s_openapi::api::core::v1::Service> =
            serde_json::from_value(v.clone()).unwrap();
        let g: DeserializeGuard<Service> = serde_json::from_value(v).unwrap();
        let invalid = g.0.unwrap_err();
        assert_eq!(
            invalid.error,
            full.0.unwrap_err().error,
            "the same error is logged"
        );
        assert_eq!(invalid.metadata.name.as_deref(), Some("web"));
        assert_eq!(invalid.metadata.namespace.as_deref(), Some("shop"));
    }

    /// Service `ns/<name>` on port 80, as the watch delivers it.
    fn svc(name: &str) -> DeserializeGuard<Service> {
        DeserializeGuard(Ok(Svc::lb("ns", name).bare_port(80).wire()))
    }

    /// Slice `ns/<name>` of Service `service`, without endpoints, as the watch delivers it.
    fn slice(name: &str, service: &str) -> DeserializeGuard<EndpointSlice> {
        DeserializeGuard(Ok(Slice::ipv4("ns", name, service).wire()))
    }

    /// [`svc`] at `version` with `ip` in its stored status: the leader's status write.
    fn with_status(name: &str, ip: &str, version: &str) -> DeserializeGuard<Service> {
        let s = Svc::lb("ns", name)
            .meta("resourceVersion", version)
            .bare_port(80)
            .status(serde_json::json!({"loadBalancer": {"ingress": [{"ip": ip}]}}));
        DeserializeGuard(Ok(s.wire()))
    }

    #[test]
    fn a_status_only_change_is_kept_for_the_writer_but_not_replanned() {
        let mut inbox = Inbox::default();
        let service = |ev| ObjectEvent::Service(Box::new(ev));
        for ev in [Event::Init, Event::InitApply(svc("a")), Event::InitDone] {
            inbox.apply(service(ev));
        }
        for ev in [Event::Init, Event::InitDone] {
            inbox.apply(ObjectEvent::Slice(Box::new(ev)));
        }
        assert_eq!(inbox.take_dirty(), None);
        let version = inbox.objects().version();
        // The leader's status write comes back: kept, not for the planner.
        assert!(!inbox.apply(service(Event::Apply(with_status("a", "203.0.113.1", "2")))));
        assert_eq!(inbox.take_dirty(), Some(BTreeSet::new()));
        let a = ServiceKey::new("ns", "a");
        let kept = inbox.objects().service(&a).unwrap();
        assert_eq!(kept.metadata.resource_version.as_deref(), Some("2"));
        assert!(kept.status.is_some());
        assert_eq!(
            inbox.objects().changed_since(version),
            Some([a.clone()].into()),
            "the status writer learns of it"
        );
        // A change of the spec is planned; so is a new Service, and a deletion.
        let mut ports = with_status("a", "203.0.113.1", "3");
        if let DeserializeGuard(Ok(s)) = &mut ports {
            s.spec.as_mut().unwrap().ports = Some(Vec::new());
        }
        assert!(inbox.apply(service(Event::Apply(ports))));
        assert!(inbox.apply(service(Event::Apply(svc("b")))));
        assert!(inbox.apply(service(Event::Delete(svc("b")))));
        assert_eq!(
            inbox.take_dirty(),
            Some([a, ServiceKey::new("ns", "b")].into())
        );
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
