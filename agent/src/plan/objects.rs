//! The cluster objects the planner reads, indexed the way it reads them: Services by key, and
//! each Service's EndpointSlices by the `kubernetes.io/service-name` label. Watch events update
//! it in one place and say which Service they touched, so a sync replans only those.

use super::service::ServiceKey;
use super::stored::{EndpointSlice, Service};
use imbl::OrdMap;
use std::sync::Arc;

/// `namespace/name` of an EndpointSlice.
type SliceId = (String, String);

/// Persistent maps: a clone shares everything and costs nothing, so the status writer can hold
/// a snapshot while the sync loop keeps changing its own copy (a change copies only the path
/// to what changed, not 20,000 entries).
#[derive(Clone, Debug, Default)]
pub struct Objects {
    services: OrdMap<ServiceKey, Arc<Service>>,
    slices: OrdMap<ServiceKey, OrdMap<String, Arc<EndpointSlice>>>,
    /// Which Service each slice was filed under, to move it when its label changes.
    slice_owner: OrdMap<SliceId, ServiceKey>,
    /// A counter bumped by every change, and the last change of each Service key: a reader
    /// that remembers a version learns what changed since (see [`Objects::changed_since`]).
    version: u64,
    changed: OrdMap<ServiceKey, u64>,
    /// The version of the last whole replacement (after which everything counts as changed).
    replaced: u64,
}

fn namespace(ns: Option<&str>) -> &str {
    ns.filter(|n| !n.is_empty()).unwrap_or("default")
}

impl Objects {
    /// From plain lists (files, tests). Of two Services with one key the first is kept.
    pub fn from_lists(
        services: impl IntoIterator<Item = Service>,
        slices: impl IntoIterator<Item = EndpointSlice>,
    ) -> Objects {
        let mut o = Objects::default();
        for s in services {
            if let Some(key) = ServiceKey::of(&s) {
                if !o.services.contains_key(&key) {
                    o.services.insert(key, Arc::new(s));
                }
            }
        }
        for s in slices {
            o.put_slice(Arc::new(s));
        }
        o
    }

    pub fn services(&self) -> impl Iterator<Item = (&ServiceKey, &Service)> {
        self.services.iter().map(|(k, v)| (k, v.as_ref()))
    }

    pub fn service(&self, key: &ServiceKey) -> Option<&Service> {
        self.services.get(key).map(Arc::as_ref)
    }

    pub fn service_count(&self) -> usize {
        self.services.len()
    }

    /// The slices labelled with this Service's name, in name order.
    pub fn slices_of(&self, key: &ServiceKey) -> Vec<&EndpointSlice> {
        self.slices
            .get(key)
            .map(|m| m.values().map(Arc::as_ref).collect())
            .unwrap_or_default()
    }

    /// The version of the last change.
    pub fn version(&self) -> u64 {
        self.version
    }

    /// The Services changed after `version`; `None` when everything was replaced since.
    pub fn changed_since(&self, version: u64) -> Option<std::collections::BTreeSet<ServiceKey>> {
        if self.replaced > version {
            return None;
        }
        Some(
            self.changed
                .iter()
                .filter(|(_, v)| **v > version)
                .map(|(k, _)| k.clone())
                .collect(),
        )
    }

    /// After a replacement every reader starts over: forget changes of keys that are gone.
    fn prune_changes(&mut self) {
        let (services, slices) = (&self.services, &self.slices);
        self.changed = self
            .changed
            .iter()
            .filter(|(k, _)| services.contains_key(*k) || slices.contains_key(*k))
            .map(|(k, v)| (k.clone(), *v))
            .collect();
    }

    fn touch(&mut self, key: &ServiceKey) {
        self.version += 1;
        self.changed.insert(key.clone(), self.version);
    }

    /// Add or replace a Service; returns its key (`None` for a nameless object).
    pub fn put_service(&mut self, svc: Arc<Service>) -> Option<ServiceKey> {
        let key = ServiceKey::of(&svc)?;
        self.services.insert(key.clone(), svc);
        self.touch(&key);
        Some(key)
    }

    pub fn delete_service(&mut self, svc: &Service) -> Option<ServiceKey> {
        let key = ServiceKey::of(svc)?;
        self.services.remove(&key);
        self.touch(&key);
        Some(key)
    }

    /// Add or replace a slice; returns the Services whose endpoints may have changed (the one
    /// it is filed under, and the one it was filed under before if its label moved).
    pub fn put_slice(&mut self, slice: Arc<EndpointSlice>) -> Vec<ServiceKey> {
        let mut touched = self.delete_slice(&slice);
        let ns = namespace(slice.metadata.namespace.as_deref()).to_string();
        let name = slice.metadata.name.clone().unwrap_or_default();
        let Some(service) = slice
            .metadata
            .service_name
            .as_ref()
            .filter(|n| !n.is_empty())
        else {
            return touched;
        };
        let key = ServiceKey::new(ns.clone(), service.clone());
        self.slices
            .entry(key.clone())
            .or_default()
            .insert(name.clone(), slice);
        self.slice_owner.insert((ns, name), key.clone());
        if !touched.contains(&key) {
            touched.push(key);
        }
        for k in &touched {
            self.touch(k);
        }
        touched
    }

    /// Remove a slice; returns the Service it was filed under, if any.
    pub fn delete_slice(&mut self, slice: &EndpointSlice) -> Vec<ServiceKey> {
        let id = (
            namespace(slice.metadata.namespace.as_deref()).to_string(),
            slice.metadata.name.clone().unwrap_or_default(),
        );
        let Some(key) = self.slice_owner.remove(&id) else {
            return Vec::new();
        };
        if let Some(m) = self.slices.get_mut(&key) {
            m.remove(&id.1);
            if m.is_empty() {
                self.slices.remove(&key);
            }
        }
        self.touch(&key);
        vec![key]
    }

    /// Replace every Service (after a re-list, which does not report deletions).
    pub fn replace_services(&mut self, services: impl IntoIterator<Item = Arc<Service>>) {
        self.services = OrdMap::new();
        for s in services {
            self.put_service(s);
        }
        self.version += 1;
        self.replaced = self.version;
        self.prune_changes();
    }

    /// Replace every slice (after a re-list).
    pub fn replace_slices(&mut self, slices: impl IntoIterator<Item = Arc<EndpointSlice>>) {
        self.slices = OrdMap::new();
        self.slice_owner = OrdMap::new();
        for s in slices {
            self.put_slice(s);
        }
        self.version += 1;
        self.replaced = self.version;
        self.prune_changes();
    }

    pub fn slice_count(&self) -> usize {
        self.slice_owner.len()
    }

    /// Every Service key that has a Service or slices.
    pub fn keys(&self) -> std::collections::BTreeSet<ServiceKey> {
        self.services
            .keys()
            .chain(self.slices.keys())
            .cloned()
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plan::slim;

    fn svc(name: &str) -> Arc<Service> {
        let s: slim::Service = serde_json::from_value(
            serde_json::json!({"metadata": {"namespace": "ns", "name": name}}),
        )
        .unwrap();
        Arc::new(s.into())
    }

    #[test]
    fn readers_learn_what_changed_since_their_version() {
        let mut o = Objects::default();
        o.put_service(svc("a"));
        let v = o.version();
        o.put_service(svc("b"));
        o.delete_service(&svc("a"));
        let changed = o.changed_since(v).unwrap();
        assert_eq!(
            changed,
            [ServiceKey::new("ns", "a"), ServiceKey::new("ns", "b")].into()
        );
        assert!(o.changed_since(o.version()).unwrap().is_empty());
        o.replace_services([svc("c")]);
        assert_eq!(o.changed_since(v), None, "a replacement changes everything");
    }
}
