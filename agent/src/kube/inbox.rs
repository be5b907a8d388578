//! Watch events in, the planner's [`Objects`] and the set of changed Services out.
//!
//! Services and EndpointSlices are kept once, here: each object the watches read
//! ([`nodelb_core::objects::wire`]) is converted to the form the index keeps ([`nodelb_core::objects::index`])
//! as it arrives. A re-list (after a watch expired) does not report deletions, so it replaces
//! its kind whole and asks for a full replan. A Service whose only change is what a status
//! write changes (see [`index::Service::plans_like`]) is kept for the status writer but not
//! handed to the planner: every status the leader writes comes back to every agent that way.
//! Nor is a change that touches no Service nodelb handles (`handled`, the planner's
//! [`nodelb_core::plan::service::is_handled`]): the EndpointSlices of a cluster's ClusterIP
//! Services, and of other load balancers' Services, change far more often than nodelb's, and
//! every agent watches them all.

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
    /// whose change only a status write could have made, a change of no Service `handled`
    /// says nodelb handles, before or after, or a re-list still in progress, need not). An
    /// object that did not deserialize changes nothing: the last good version (if any) stays
    /// planned, and the watch task has already reported it.
    pub fn apply(&mut self, ev: ObjectEvent, handled: &dyn Fn(&index::Service) -> bool) -> bool {
        match ev {
            ObjectEvent::Service(ev) => self.on_event(
                *ev,
                |i| (&mut i.relist_services, &mut i.services_synced),
                handled,
            ),
            ObjectEvent::Slice(ev) => self.on_event(
                *ev,
                |i| (&mut i.relist_slices, &mut i.slices_synced),
                handled,
            ),
        }
    }

    /// One event of one kind; `relist` picks that kind's re-list in progress and its synced
    /// flag. Returns whether the planner must look.
    fn on_event<W, K: Kept + From<W>>(
        &mut self,
        ev: Event<DeserializeGuard<W>>,
        relist: Relist<K>,
        handled: &dyn Fn(&index::Service) -> bool,
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
            Event::Apply(DeserializeGuard(Ok(o))) => {
                K::put(self.objects_mut(), Arc::new(o.into()), handled)
            }
            Event::Delete(DeserializeGuard(Ok(o))) => {
                K::delete(self.objects_mut(), &o.into(), handled)
            }
            Event::InitApply(_) | Event::Apply(_) | Event::Delete(_) => return false,
        };
        let replan = !keys.is_empty();
        self.dirty.extend(keys);
        replan
    }
}

/// Of the Services a slice change touched, those nodelb handles now. One it does not handle
/// (or that has not arrived) has nothing planned from its slices; its own event, when it
/// becomes nodelb's, replans it with the slices it has by then.
fn handled_keys(
    objects: &Objects,
    keys: Vec<ServiceKey>,
    handled: &dyn Fn(&index::Service) -> bool,
) -> Vec<ServiceKey> {
    keys.into_iter()
        .filter(|k| objects.service(k).is_some_and(handled))
        .collect()
}

/// Picks one kind's re-list in progress and whether that kind has listed once.
type Relist<K> = fn(&mut Inbox) -> (&mut Option<Vec<Arc<K>>>, &mut bool);

/// A kind the index keeps, as the inbox changes it. `put` and `delete` return the Services
/// the planner must look at again.
trait Kept: Sized {
    fn put(
        objects: &mut Objects,
        o: Arc<Self>,
        handled: &dyn Fn(&index::Service) -> bool,
    ) -> Vec<ServiceKey>;
    fn delete(
        objects: &mut Objects,
        o: &Self,
        handled: &dyn Fn(&index::Service) -> bool,
    ) -> Vec<ServiceKey>;
    fn replace(objects: &mut Objects, all: Vec<Arc<Self>>);
}

impl Kept for index::Service {
    /// The key, unless the planner would plan the new version as the one it replaces, or
    /// nodelb handles neither.
    fn put(
        objects: &mut Objects,
        o: Arc<Self>,
        handled: &dyn Fn(&index::Service) -> bool,
    ) -> Vec<ServiceKey> {
        let before = ServiceKey::of(&o).and_then(|k| objects.service(&k));
        let replan = match before {
            Some(before) => !o.plans_like(before) && (handled(before) || handled(&o)),
            None => handled(&o),
        };
        let key = objects.put_service(o);
        key.filter(|_| replan).into_iter().collect()
    }
    fn delete(
        objects: &mut Objects,
        o: &Self,
        handled: &dyn Fn(&index::Service) -> bool,
    ) -> Vec<ServiceKey> {
        // What was planned is the version kept, not the one the deletion carries.
        let kept = ServiceKey::of(o).and_then(|k| objects.service(&k));
        let replan = kept.is_some_and(handled) || handled(o);
        let key = objects.delete_service(o);
        key.filter(|_| replan).into_iter().collect()
    }
    fn replace(objects: &mut Objects, all: Vec<Arc<Self>>) {
        objects.replace_services(all)
    }
}

impl Kept for index::EndpointSlice {
    fn put(
        objects: &mut Objects,
        o: Arc<Self>,
        handled: &dyn Fn(&index::Service) -> bool,
    ) -> Vec<ServiceKey> {
        let keys = objects.put_slice(o);
        handled_keys(objects, keys, handled)
    }
    fn delete(
        objects: &mut Objects,
        o: &Self,
        handled: &dyn Fn(&index::Service) -> bool,
    ) -> Vec<ServiceKey> {
        let keys = objects.delete_slice(o);
        handled_keys(objects, keys, handled)
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

    /// The planner's test, with its defaults (no class is nodelb's).
    fn handled(s: &index::Service) -> bool {
        nodelb_core::plan::service::is_handled(s, &nodelb_core::plan::config::Config::default())
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
            inbox.apply(service(ev), &handled);
        }
        for ev in [Event::Init, Event::InitDone] {
            inbox.apply(ObjectEvent::Slice(Box::new(ev)), &handled);
        }
        assert_eq!(inbox.take_dirty(), None);
        let version = inbox.objects().version();
        // The leader's status write comes back: kept, not for the planner.
        assert!(!inbox.apply(
            service(Event::Apply(with_status("a", "203.0.113.1", "2"))),
            &handled
        ));
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
        assert!(inbox.apply(service(Event::Apply(ports)), &handled));
        assert!(inbox.apply(service(Event::Apply(svc("b"))), &handled));
        assert!(inbox.apply(service(Event::Delete(svc("b"))), &handled));
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
            inbox.apply(ObjectEvent::Service(Box::new(ev)), &handled);
        }
        assert!(inbox.services_synced && !inbox.synced());
        assert_eq!(inbox.take_dirty(), None);
        // Changes after the list name their Service.
        inbox.apply(
            ObjectEvent::Slice(Box::new(Event::Apply(slice("a-1", "a")))),
            &handled,
        );
        inbox.apply(
            ObjectEvent::Service(Box::new(Event::Delete(svc("b")))),
            &handled,
        );
        let dirty = inbox.take_dirty().unwrap();
        assert_eq!(
            dirty,
            [ServiceKey::new("ns", "a"), ServiceKey::new("ns", "b")].into()
        );
        assert_eq!(inbox.take_dirty(), Some(BTreeSet::new()));
        // A re-list without `a` forgets it (the watch never said it was deleted).
        for ev in [Event::Init, Event::InitApply(svc("c")), Event::InitDone] {
            inbox.apply(ObjectEvent::Service(Box::new(ev)), &handled);
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

    /// Every agent watches every EndpointSlice and Service: those of ClusterIP Services and
    /// of other load balancers' change far more often than nodelb's, and wake no sync.
    #[test]
    fn changes_of_services_nodelb_does_not_handle_wake_no_sync() {
        let mut inbox = Inbox::default();
        let service = |ev| ObjectEvent::Service(Box::new(ev));
        let slice_ev = |ev| ObjectEvent::Slice(Box::new(ev));
        let cluster_ip = |name: &str| {
            DeserializeGuard(Ok(Svc::lb("ns", name)
                .bare_port(80)
                .spec("type", "ClusterIP")
                .wire()))
        };
        let other_class = DeserializeGuard(Ok(Svc::lb("ns", "metallb")
            .bare_port(80)
            .spec("loadBalancerClass", "metallb.io/metallb")
            .wire()));
        let initial = [
            Event::Init,
            Event::InitApply(svc("ours")),
            Event::InitApply(cluster_ip("web")),
            Event::InitApply(other_class),
            Event::InitDone,
        ];
        for ev in initial {
            inbox.apply(service(ev), &handled);
        }
        for ev in [Event::Init, Event::InitDone] {
            inbox.apply(slice_ev(ev), &handled);
        }
        assert_eq!(inbox.take_dirty(), None);
        // Slices of a ClusterIP Service, of another class's and of a Service not seen yet.
        for (name, of) in [
            ("web-1", "web"),
            ("metallb-1", "metallb"),
            ("later-1", "later"),
        ] {
            assert!(
                !inbox.apply(slice_ev(Event::Apply(slice(name, of))), &handled),
                "{name}"
            );
            assert!(
                !inbox.apply(slice_ev(Event::Delete(slice(name, of))), &handled),
                "{name}"
            );
        }
        // A ClusterIP Service's own change, and its deletion.
        let mut web = cluster_ip("web");
        if let DeserializeGuard(Ok(s)) = &mut web {
            s.spec.as_mut().unwrap().ports = Some(Vec::new());
        }
        assert!(!inbox.apply(service(Event::Apply(web)), &handled));
        assert!(!inbox.apply(service(Event::Delete(cluster_ip("web"))), &handled));
        assert_eq!(inbox.take_dirty(), Some(BTreeSet::new()));
        // nodelb's Service's slice is planned; the slices kept for the others are planned once
        // their Service becomes nodelb's, by its own event.
        assert!(inbox.apply(slice_ev(Event::Apply(slice("ours-1", "ours"))), &handled));
        inbox.apply(slice_ev(Event::Apply(slice("later-1", "later"))), &handled);
        assert!(inbox.apply(service(Event::Apply(svc("later"))), &handled));
        assert_eq!(
            inbox.take_dirty(),
            Some(
                [
                    ServiceKey::new("ns", "ours"),
                    ServiceKey::new("ns", "later")
                ]
                .into()
            )
        );
        let later = ServiceKey::new("ns", "later");
        assert_eq!(inbox.objects().slices_of(&later).len(), 1);
        // A Service that stops being nodelb's is planned once more (its rules go), then no
        // longer.
        assert!(inbox.apply(service(Event::Apply(cluster_ip("ours"))), &handled));
        assert!(!inbox.apply(slice_ev(Event::Apply(slice("ours-1", "ours"))), &handled));
    }
}
