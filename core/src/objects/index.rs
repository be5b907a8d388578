//! The cluster objects the planner reads, as it keeps them and indexed the way it reads them:
//! Services by key, and each Service's EndpointSlices by the `kubernetes.io/service-name`
//! label. Watch events update it in one place and say which Service they touched, so a sync
//! replans only those.
//!
//! Each object is converted once from what the API sends (`wire.rs`), by the watches'
//! inbox or the file reader. Of the metadata only the read fields are kept, under the API's names
//! and types, plus the two derived facts nodelb asks of the rest: the Service of a slice, and the
//! managers of a Service's ingress (a watched object must carry a whole `ObjectMeta`, and a slice
//! a B-tree node for its one read label). The body is kept as the API spells it (the types
//! below, which the wire types embed), but for an endpoint's addresses, of which only the first
//! counts.

use crate::vocab::{ServiceKey, Str};
use imbl::OrdMap;
use k8s_openapi::api::core::v1::{LoadBalancerIngress, PortStatus, SessionAffinityConfig};
use k8s_openapi::api::discovery::v1::EndpointConditions;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use serde::{Deserialize, Deserializer};
use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

/// A Service.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Service {
    pub metadata: ServiceMeta,
    pub spec: Option<ServiceSpec>,
    pub status: Option<ServiceStatus>,
}

impl Service {
    /// Whether the planner would plan `self` as it planned `before`: they differ at most in
    /// what a status write changes (the status, the resourceVersion, the owners of the
    /// ingress), none of which the planner reads. The leader's every status write comes back
    /// through every agent's watch as such a change; only the status writer needs it. Every
    /// other field counts, read or not, so a field added later is replanned unless it is named
    /// here.
    pub fn plans_like(&self, before: &Service) -> bool {
        let ServiceMeta {
            name,
            namespace,
            uid,
            resource_version: _,
            creation_timestamp,
            generation,
            annotations,
            other_proxy,
            lbpool,
            ingress_owners: _,
        } = &self.metadata;
        let b = &before.metadata;
        name == &b.name
            && namespace == &b.namespace
            && uid == &b.uid
            && creation_timestamp == &b.creation_timestamp
            && generation == &b.generation
            && annotations == &b.annotations
            && other_proxy == &b.other_proxy
            && lbpool == &b.lbpool
            && self.spec == before.spec
    }
}

/// What is read of a Service's metadata: name and namespace (its key, status writes, Events),
/// uid (Events), resourceVersion (the status writer), creationTimestamp (oldest wins a port),
/// nodelb's own annotations (the node selector), whether it carries the label
/// `service.kubernetes.io/service-proxy-name`, and k3s ServiceLB's pool label.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ServiceMeta {
    pub name: Option<Str>,
    pub namespace: Option<Str>,
    pub uid: Option<Str>,
    pub resource_version: Option<Str>,
    pub creation_timestamp: Option<Time>,
    /// The spec's generation: the `observedGeneration` of nodelb's condition.
    pub generation: Option<i64>,
    pub annotations: Option<BTreeMap<String, String>>,
    /// Labelled `service.kubernetes.io/service-proxy-name` (any value): another proxy's
    /// Service, which nodelb leaves alone, as kube-proxy does (no rules, no status).
    pub other_proxy: bool,
    /// The label `svccontroller.k3s.cattle.io/lbpool` when set and not empty: the ServiceLB
    /// pool whose nodes serve it under `--servicelb-compat`.
    pub lbpool: Option<Str>,
    /// The field managers that own `status.loadBalancer.ingress` through the status
    /// subresource, each once, in managedFields order: whether nodelb, someone else or nobody
    /// owns it is all the status writer asks of managedFields.
    pub ingress_owners: Vec<Str>,
}

/// An EndpointSlice.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct EndpointSlice {
    pub metadata: SliceMeta,
    pub address_type: Str,
    pub endpoints: Vec<Endpoint>,
    pub ports: Option<Vec<EndpointPort>>,
    /// The endpoints' topology hints, for a slice where some endpoint carries any (most carry
    /// none: a pointer, which fits the slice's allocation as it was).
    pub hints: Option<Box<SliceHints>>,
}

impl EndpointSlice {
    /// The hints of endpoint `i` (in `endpoints`), if it carries any.
    pub fn hints_of(&self, i: usize) -> Option<&Hints> {
        self.hints.as_deref()?.of(i)
    }
}

/// The topology hints of one endpoint, by name: `hints.forZones` and `hints.forNodes`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct Hints {
    /// The zones it is hinted for, sorted, each once.
    pub zones: Box<[Str]>,
    /// The nodes it is hinted for, sorted, each once.
    pub nodes: Box<[Str]>,
    /// Something in `hints` did not read as the API writes it (an entry without a name, a
    /// value of the wrong type): the endpoint counts as carrying no hint at all, and the
    /// planner warns about its slice.
    pub malformed: bool,
}

impl Hints {
    /// Neither a hint nor anything malformed: nothing to keep.
    pub fn is_empty(&self) -> bool {
        self.zones.is_empty() && self.nodes.is_empty() && !self.malformed
    }
}

/// The hints of a slice's endpoints: each distinct set once (the EndpointSlice controller
/// gives every endpoint of a zone the same `forZones`), and per endpoint which it carries.
/// A slice of 100 endpoints hinted for three zones keeps three sets and 100 indexes, not a
/// string per endpoint.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SliceHints {
    distinct: Box<[Hints]>,
    /// Per endpoint, in the slice's order: 1 + its set's index in `distinct`, 0 for none.
    of_endpoint: Box<[u32]>,
}

impl SliceHints {
    /// From each endpoint's hints, in the slice's order; `None` when no endpoint has any.
    pub fn new(per_endpoint: impl IntoIterator<Item = Hints>) -> Option<SliceHints> {
        let mut distinct: Vec<Hints> = Vec::new();
        let mut index: std::collections::HashMap<Hints, u32> = Default::default();
        let mut of_endpoint = Vec::new();
        for h in per_endpoint {
            if h.is_empty() {
                of_endpoint.push(0);
                continue;
            }
            let i = *index.entry(h).or_insert_with_key(|h| {
                distinct.push(h.clone());
                distinct.len() as u32
            });
            of_endpoint.push(i);
        }
        if distinct.is_empty() {
            return None;
        }
        Some(SliceHints {
            distinct: distinct.into(),
            of_endpoint: of_endpoint.into(),
        })
    }

    /// The hints of endpoint `i`, if it carries any.
    pub fn of(&self, i: usize) -> Option<&Hints> {
        let at = *self.of_endpoint.get(i)?;
        at.checked_sub(1).map(|at| &self.distinct[at as usize])
    }
}

/// One backend: its first address, readiness, and node (`Local` policy).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Endpoint {
    /// The first of the endpoint's addresses: the API calls them fungible, and nodelb, like
    /// kube-proxy, uses only the first. A vector for it would be one more allocation per
    /// endpoint.
    pub address: Option<Str>,
    pub conditions: Option<EndpointConditions>,
    pub node_name: Option<Str>,
}

/// What is read of a slice's metadata: its name and namespace (warnings, its place among its
/// Service's slices) and its one read label.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct SliceMeta {
    pub name: Option<Str>,
    pub namespace: Option<Str>,
    /// The `kubernetes.io/service-name` label, as given: the Service the slice is filed under.
    pub service_name: Option<Str>,
}

/// What the planner reads of a Service's spec.
#[derive(Clone, Debug, Default, PartialEq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ServiceSpec {
    #[serde(rename = "clusterIP")]
    pub cluster_ip: Option<Str>,
    #[serde(rename = "clusterIPs")]
    pub cluster_ips: Option<Vec<Str>>,
    pub external_traffic_policy: Option<Str>,
    /// The port a `Local` Service's load balancer asks whether this node has its endpoints
    /// (kube-proxy's health check; nodelb answers it with `--health-check-node-ports`).
    pub health_check_node_port: Option<i32>,
    pub ip_families: Option<Vec<Str>>,
    pub load_balancer_class: Option<Str>,
    pub load_balancer_source_ranges: Option<Vec<Str>>,
    pub ports: Option<Vec<ServicePort>>,
    /// `None` or `ClientIP`, raw: the planner warns about anything else.
    pub session_affinity: Option<Str>,
    /// `clientIP.timeoutSeconds` of `ClientIP` affinity.
    pub session_affinity_config: Option<SessionAffinityConfig>,
    /// `spec.trafficDistribution`, read into one byte (it is on every Service that sets it);
    /// a value nodelb does not know is kept as such and warned about.
    #[serde(default, deserialize_with = "traffic_distribution")]
    pub traffic_distribution: Option<TrafficDistribution>,
    #[serde(rename = "type")]
    pub type_: Option<Str>,
}

/// `spec.trafficDistribution`. kube-proxy reads none of it: the EndpointSlice controller turns
/// it into hints on the endpoints, and the hints decide (see `plan::topology`). nodelb reads it
/// to tell a Service without hints from one whose hints are missing, and to warn about a value
/// it does not know.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TrafficDistribution {
    PreferClose,
    PreferSameZone,
    PreferSameNode,
    /// Any other value (the API server refuses them; a newer one may know more).
    Unknown,
}

impl TrafficDistribution {
    pub fn parse(s: &str) -> TrafficDistribution {
        match s {
            "PreferClose" => TrafficDistribution::PreferClose,
            "PreferSameZone" => TrafficDistribution::PreferSameZone,
            "PreferSameNode" => TrafficDistribution::PreferSameNode,
            _ => TrafficDistribution::Unknown,
        }
    }
}

/// `spec.trafficDistribution` as k8s-openapi reads it (an optional string), kept as one byte.
fn traffic_distribution<'de, D: Deserializer<'de>>(
    d: D,
) -> Result<Option<TrafficDistribution>, D::Error> {
    let s = Option::<std::borrow::Cow<'de, str>>::deserialize(d)?;
    Ok(s.map(|s| TrafficDistribution::parse(&s)))
}

#[derive(Clone, Debug, Default, PartialEq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ServicePort {
    pub name: Option<Str>,
    #[serde(default, deserialize_with = "or_default")]
    pub port: i32,
    pub protocol: Option<Str>,
}

#[derive(Clone, Debug, Default, PartialEq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ServiceStatus {
    pub load_balancer: Option<LoadBalancerStatus>,
    /// Of `conditions`, only nodelb's own (`nodelb.io/Serving`): the status writer compares it
    /// with what it wants. Read leniently: another controller's malformed condition is not
    /// nodelb's business.
    #[serde(rename = "conditions", default, deserialize_with = "serving_condition")]
    pub serving: Option<Box<ServingCondition>>,
}

/// nodelb's condition as stored, every field optional (boxed where kept: most Services carry
/// one, and the others pay a pointer).
#[derive(Clone, Debug, Default, PartialEq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ServingCondition {
    pub status: Option<Str>,
    pub reason: Option<Str>,
    /// The message's digest ([`crate::vocab::digest`] of the text), not its text: the status
    /// writer only asks whether it says what nodelb wants, and every Service's text would be
    /// kept (docs/benchmarks.md). A stored message hashing like the one wanted (about one chance in
    /// 2^64) would stay until the condition changes again.
    #[serde(default, deserialize_with = "message_digest")]
    pub message: Option<u64>,
    pub observed_generation: Option<i64>,
    pub last_transition_time: Option<Str>,
}

fn message_digest<'de, D: Deserializer<'de>>(d: D) -> Result<Option<u64>, D::Error> {
    let message = Option::<std::borrow::Cow<'de, str>>::deserialize(d)?;
    Ok(message.map(|m| crate::vocab::digest(m.as_ref())))
}

/// The entry of type `nodelb.io/Serving` of a conditions list, if any.
fn serving_condition<'de, D: Deserializer<'de>>(
    d: D,
) -> Result<Option<Box<ServingCondition>>, D::Error> {
    #[derive(Deserialize)]
    struct Entry {
        #[serde(rename = "type")]
        type_: Option<String>,
        #[serde(flatten)]
        rest: serde_json::Value,
    }
    let entries = Option::<Vec<Entry>>::deserialize(d)?.unwrap_or_default();
    Ok(entries
        .into_iter()
        .find(|e| e.type_.as_deref() == Some(crate::vocab::SERVING_CONDITION))
        .map(|e| Box::new(serde_json::from_value(e.rest).unwrap_or_default())))
}

/// The stored ingress, whole: the status writer compares it with what it wants entry by entry.
#[derive(Clone, Debug, Default, PartialEq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct LoadBalancerStatus {
    pub ingress: Option<Vec<StoredIngress>>,
}

/// One stored ingress entry, its strings inline (an address and its `ipMode` fit): read as
/// k8s-openapi's `LoadBalancerIngress`, each entry took two allocations more (what that
/// cost: docs/benchmarks.md).
#[derive(Clone, Debug, Default, PartialEq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct StoredIngress {
    pub hostname: Option<Str>,
    pub ip: Option<Str>,
    pub ip_mode: Option<Str>,
    pub ports: Option<Vec<PortStatus>>,
}

impl From<&StoredIngress> for LoadBalancerIngress {
    fn from(i: &StoredIngress) -> LoadBalancerIngress {
        LoadBalancerIngress {
            hostname: i.hostname.as_deref().map(str::to_string),
            ip: i.ip.as_deref().map(str::to_string),
            ip_mode: i.ip_mode.as_deref().map(str::to_string),
            ports: i.ports.clone(),
        }
    }
}

#[derive(Clone, Debug, Default, PartialEq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct EndpointPort {
    pub name: Option<Str>,
    pub port: Option<i32>,
    pub protocol: Option<Str>,
}

/// A required field as k8s-openapi reads it: missing or null is the default.
pub(crate) fn or_default<'de, D, T>(d: D) -> Result<T, D::Error>
where
    D: Deserializer<'de>,
    T: Deserialize<'de> + Default,
{
    Ok(Option::<T>::deserialize(d)?.unwrap_or_default())
}

/// `namespace/name` of an EndpointSlice.
type SliceId = (String, String);

/// Persistent maps: a clone shares everything and costs nothing, so the status writer can hold
/// a snapshot while the sync loop keeps changing its own copy (a change copies only the path
/// to what changed, not every entry).
#[derive(Clone, Debug, Default)]
pub struct Objects {
    /// Everything about one Service key in one entry, so the key is stored once: its Service,
    /// its slices and its last change. An entry with neither Service nor slices remembers a
    /// change (a deletion) until the next whole replacement.
    entries: OrdMap<ServiceKey, Entry>,
    /// The Service name each slice was filed under (in the slice's namespace), to move it when
    /// its label changes.
    slice_owner: OrdMap<SliceId, String>,
    /// A counter bumped by every change: a reader that remembers a version learns what
    /// changed since (see [`Objects::changed_since`]).
    version: u64,
    /// The version of the last whole replacement (after which everything counts as changed).
    replaced: u64,
}

#[derive(Clone, Debug, Default)]
struct Entry {
    service: Option<Arc<Service>>,
    /// In name order; usually one. A map would allocate a whole node for it.
    slices: Vec<Arc<EndpointSlice>>,
    /// The version of the key's last change (0: none since it was listed).
    changed: u64,
}

impl Entry {
    fn is_empty(&self) -> bool {
        self.service.is_none() && self.slices.is_empty()
    }

    /// Where a slice of this name is, or would go.
    fn find(&self, name: &str) -> Result<usize, usize> {
        self.slices.binary_search_by(|s| slice_name(s).cmp(name))
    }
}

fn namespace(ns: Option<&str>) -> &str {
    ns.filter(|n| !n.is_empty()).unwrap_or("default")
}

fn slice_name(s: &EndpointSlice) -> &str {
    s.metadata.name.as_deref().unwrap_or_default()
}

fn slice_id(s: &EndpointSlice) -> SliceId {
    (
        namespace(s.metadata.namespace.as_deref()).to_string(),
        slice_name(s).to_string(),
    )
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
                let e = o.entries.entry(key).or_default();
                if e.service.is_none() {
                    e.service = Some(Arc::new(s));
                }
            }
        }
        for s in slices {
            o.put_slice(Arc::new(s));
        }
        o
    }

    pub fn services(&self) -> impl Iterator<Item = (&ServiceKey, &Service)> {
        self.entries
            .iter()
            .filter_map(|(k, e)| Some((k, e.service.as_deref()?)))
    }

    /// The keys an index kept beside the objects brings up to date: the `dirty` Services, or
    /// (`None`) every Service there is.
    pub fn keys_to_update(&self, dirty: Option<&BTreeSet<ServiceKey>>) -> Vec<ServiceKey> {
        match dirty {
            Some(d) => d.iter().cloned().collect(),
            None => self.services().map(|(k, _)| k.clone()).collect(),
        }
    }

    pub fn service(&self, key: &ServiceKey) -> Option<&Service> {
        self.entries.get(key)?.service.as_deref()
    }

    pub fn service_count(&self) -> usize {
        self.entries
            .values()
            .filter(|e| e.service.is_some())
            .count()
    }

    /// The slices labelled with this Service's name, in name order.
    pub fn slices_of(&self, key: &ServiceKey) -> Vec<&EndpointSlice> {
        self.entries
            .get(key)
            .map(|e| e.slices.iter().map(Arc::as_ref).collect())
            .unwrap_or_default()
    }

    /// The version of the last change.
    pub fn version(&self) -> u64 {
        self.version
    }

    /// The Services changed after `version`; `None` when everything was replaced since.
    pub fn changed_since(&self, version: u64) -> Option<BTreeSet<ServiceKey>> {
        Some(
            self.entries_changed_since(version)?
                .map(|(k, _)| k.clone())
                .collect(),
        )
    }

    /// The entries changed after `version`; `None` when everything was replaced since.
    fn entries_changed_since(
        &self,
        version: u64,
    ) -> Option<impl Iterator<Item = (&ServiceKey, &Entry)>> {
        if self.replaced > version {
            return None;
        }
        Some(
            self.entries
                .iter()
                .filter(move |(_, e)| e.changed > version),
        )
    }

    /// Whether a planner would plan these objects exactly as it planned `before`, an earlier
    /// version of them: every Service changed since differs only in what a status write
    /// changes (see [`Service::plans_like`]) and no slice changed. A planner can then keep
    /// these instead, so the versions the status writes replaced are freed.
    pub fn plans_like(&self, before: &Objects) -> bool {
        if before.version > self.version {
            return false;
        }
        let Some(mut changed) = self.entries_changed_since(before.version) else {
            return false;
        };
        changed.all(|(k, now)| {
            let Some(was) = before.entries.get(k) else {
                return now.is_empty();
            };
            let same_slices = now.slices.len() == was.slices.len()
                && now
                    .slices
                    .iter()
                    .zip(&was.slices)
                    .all(|(a, b)| Arc::ptr_eq(a, b));
            same_slices
                && match (&now.service, &was.service) {
                    (Some(a), Some(b)) => Arc::ptr_eq(a, b) || a.plans_like(b),
                    (a, b) => a.is_none() && b.is_none(),
                }
        })
    }

    /// The entry of a key, which changes now.
    fn touch(&mut self, key: &ServiceKey) -> &mut Entry {
        self.version += 1;
        let e = self.entries.entry(key.clone()).or_default();
        e.changed = self.version;
        e
    }

    /// Add or replace a Service; returns its key (`None` for a nameless object).
    pub fn put_service(&mut self, svc: Arc<Service>) -> Option<ServiceKey> {
        let key = ServiceKey::of(&svc)?;
        self.touch(&key).service = Some(svc);
        Some(key)
    }

    pub fn delete_service(&mut self, svc: &Service) -> Option<ServiceKey> {
        let key = ServiceKey::of(svc)?;
        self.touch(&key).service = None;
        Some(key)
    }

    /// Add or replace a slice; returns the Services whose endpoints may have changed (the one
    /// it is filed under, and the one it was filed under before if its label moved).
    pub fn put_slice(&mut self, slice: Arc<EndpointSlice>) -> Vec<ServiceKey> {
        let mut touched = self.delete_slice(&slice);
        let Some(service) = slice
            .metadata
            .service_name
            .as_deref()
            .filter(|n| !n.is_empty())
        else {
            return touched;
        };
        let (ns, name) = slice_id(&slice);
        let key = ServiceKey::new(ns.clone(), service);
        self.slice_owner.insert((ns, name), service.to_string());
        if !touched.contains(&key) {
            touched.push(key.clone());
        }
        for k in &touched {
            self.touch(k);
        }
        let e = self.entries.entry(key).or_default();
        match e.find(slice_name(&slice)) {
            Ok(at) => e.slices[at] = slice,
            Err(at) => {
                // Room for exactly one more: a growing vector would leave room for four.
                e.slices.reserve_exact(1);
                e.slices.insert(at, slice);
            }
        }
        touched
    }

    /// Remove a slice; returns the Service it was filed under, if any.
    pub fn delete_slice(&mut self, slice: &EndpointSlice) -> Vec<ServiceKey> {
        let id = slice_id(slice);
        let Some(service) = self.slice_owner.remove(&id) else {
            return Vec::new();
        };
        let (ns, name) = id;
        let key = ServiceKey::new(ns, service);
        let e = self.touch(&key);
        if let Ok(at) = e.find(&name) {
            e.slices.remove(at);
            e.slices.shrink_to_fit();
        }
        vec![key]
    }

    /// Replace every Service (after a re-list, which does not report deletions).
    pub fn replace_services(&mut self, services: impl IntoIterator<Item = Arc<Service>>) {
        self.entries = self
            .entries
            .iter()
            .filter(|(_, e)| !e.slices.is_empty())
            .map(|(k, e)| {
                let e = Entry {
                    service: None,
                    ..e.clone()
                };
                (k.clone(), e)
            })
            .collect();
        for s in services {
            self.put_service(s);
        }
        self.replaced();
    }

    /// Replace every slice (after a re-list).
    pub fn replace_slices(&mut self, slices: impl IntoIterator<Item = Arc<EndpointSlice>>) {
        self.entries = self
            .entries
            .iter()
            .filter(|(_, e)| e.service.is_some())
            .map(|(k, e)| {
                let e = Entry {
                    slices: Vec::new(),
                    ..e.clone()
                };
                (k.clone(), e)
            })
            .collect();
        self.slice_owner = OrdMap::new();
        for s in slices {
            self.put_slice(s);
        }
        self.replaced();
    }

    /// After a replacement every reader starts over: forget changes of keys that are gone
    /// (left by a slice listed twice, under two labels).
    fn replaced(&mut self) {
        self.version += 1;
        self.replaced = self.version;
        if self.entries.values().any(Entry::is_empty) {
            self.entries = self
                .entries
                .iter()
                .filter(|(_, e)| !e.is_empty())
                .map(|(k, e)| (k.clone(), e.clone()))
                .collect();
        }
    }

    pub fn slice_count(&self) -> usize {
        self.slice_owner.len()
    }

    /// Every Service key that has a Service or slices.
    pub fn keys(&self) -> BTreeSet<ServiceKey> {
        self.entries
            .iter()
            .filter(|(_, e)| !e.is_empty())
            .map(|(k, _)| k.clone())
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fixtures::{Slice, Svc};
    use serde_json::json;

    /// Service `ns/<name>` as the watch hands it to the index.
    fn svc(name: &str) -> Arc<Service> {
        Arc::new(Svc::lb("ns", name).index())
    }

    /// Slice `ns/<name>` of Service `service` as the watch hands it to the index.
    fn slice(name: &str, service: &str) -> Arc<EndpointSlice> {
        Arc::new(Slice::ipv4("ns", name, service).index())
    }

    fn key(name: &str) -> ServiceKey {
        ServiceKey::new("ns", name)
    }

    fn names(o: &Objects, service: &str) -> Vec<String> {
        o.slices_of(&key(service))
            .iter()
            .map(|s| s.metadata.name.as_deref().unwrap().to_string())
            .collect()
    }

    fn web() -> Svc {
        Svc::lb("ns", "web")
            .meta("uid", "u1")
            .meta("resourceVersion", "7")
            .meta("generation", 1)
            .created("2026-01-01T00:00:00Z")
            .annotation("nodelb.io/node-selector", "pool=a")
            .bare_port(80)
    }

    #[test]
    fn a_status_write_needs_no_replan() {
        let before = web().index();
        let after = web()
            .meta("resourceVersion", "8")
            .meta(
                "managedFields",
                json!([{
                    "manager": "nodelb", "operation": "Apply", "subresource": "status",
                    "fieldsType": "FieldsV1",
                    "fieldsV1": {"f:status": {"f:loadBalancer": {"f:ingress": {}}}},
                }]),
            )
            .status(json!({
                "loadBalancer": {"ingress": [{"ip": "203.0.113.1", "ipMode": "Proxy"}]},
                "conditions": [{"type": "nodelb.io/Serving", "status": "True", "reason": "Serving"}],
            }))
            .index();
        assert_ne!(after, before, "the writer sees the new status and version");
        assert!(!after.metadata.ingress_owners.is_empty());
        assert!(after.plans_like(&before));
    }

    #[test]
    fn a_change_of_spec_or_planned_metadata_is_replanned() {
        let before = web().index();
        let changed = |path: &[&str], to: serde_json::Value| match path {
            ["spec", field] => web().spec(field, to).index(),
            ["metadata", field] => web().meta(field, to).index(),
            _ => unreachable!("{path:?}"),
        };
        for (path, to) in [
            (&["spec", "ports"][..], json!([{"port": 81}])),
            (&["spec", "externalTrafficPolicy"], "Local".into()),
            (&["metadata", "annotations"], json!({})),
            (
                &["metadata", "creationTimestamp"],
                "2026-01-02T00:00:00Z".into(),
            ),
            (&["metadata", "uid"], "u2".into()),
            (&["metadata", "generation"], 2.into()),
            (
                &["metadata", "labels"],
                json!({"service.kubernetes.io/service-proxy-name": "other"}),
            ),
            (&["spec", "trafficDistribution"], "PreferClose".into()),
        ] {
            assert!(
                !changed(path, to.clone()).plans_like(&before),
                "{path:?} -> {to}"
            );
        }
    }

    #[test]
    fn readers_learn_what_changed_since_their_version() {
        let mut o = Objects::default();
        o.put_service(svc("a"));
        let v = o.version();
        o.put_service(svc("b"));
        o.delete_service(&svc("a"));
        let changed = o.changed_since(v).unwrap();
        assert_eq!(changed, [key("a"), key("b")].into());
        assert!(o.changed_since(o.version()).unwrap().is_empty());
        o.replace_services([svc("c")]);
        assert_eq!(o.changed_since(v), None, "a replacement changes everything");
    }

    #[test]
    fn slices_are_filed_by_label_in_name_order_and_move_with_it() {
        let mut o = Objects::default();
        o.put_service(svc("a"));
        for name in ["a-2", "a-3", "a-1"] {
            assert_eq!(o.put_slice(slice(name, "a")), [key("a")]);
        }
        assert_eq!(names(&o, "a"), ["a-1", "a-2", "a-3"]);
        // A new version replaces the old in place.
        o.put_slice(slice("a-2", "a"));
        assert_eq!(
            (names(&o, "a"), o.slice_count()),
            (vec!["a-1".into(), "a-2".into(), "a-3".into()], 3)
        );
        // Relabelled, it moves: both Services changed; the new one has no Service object.
        let v = o.version();
        assert_eq!(o.put_slice(slice("a-2", "b")), [key("a"), key("b")]);
        assert_eq!(o.changed_since(v).unwrap(), [key("a"), key("b")].into());
        assert_eq!(
            (names(&o, "a"), names(&o, "b")),
            (vec!["a-1".into(), "a-3".into()], vec!["a-2".into()])
        );
        assert_eq!(o.keys(), [key("a"), key("b")].into());
        // Deleted, it is gone, and so is `b`, but its change is still reported.
        let v = o.version();
        assert_eq!(o.delete_slice(&slice("a-2", "b")), [key("b")]);
        assert_eq!(o.delete_slice(&slice("a-2", "b")), Vec::<ServiceKey>::new());
        assert_eq!(o.keys(), [key("a")].into());
        assert_eq!(o.changed_since(v).unwrap(), [key("b")].into());
        // Without the label a slice is not filed, and leaves where it was.
        assert_eq!(o.put_slice(slice("a-1", "")), [key("a")]);
        assert_eq!((names(&o, "a"), o.slice_count()), (vec!["a-3".into()], 1));
        assert_eq!(o.service_count(), 1);
    }

    #[test]
    fn a_relist_forgets_what_is_gone_and_keeps_the_rest() {
        let mut o = Objects::default();
        o.put_service(svc("a"));
        o.put_slice(slice("b-1", "b"));
        o.put_slice(slice("c-1", "c"));
        o.delete_service(&svc("d"));
        // Services re-listed: `a` is gone, slices stay.
        o.replace_services([svc("c")]);
        assert_eq!(o.keys(), [key("b"), key("c")].into());
        assert_eq!((o.service_count(), o.slice_count()), (1, 2));
        let v = o.version();
        // Slices re-listed: `b` is gone with its slice, `c`'s Service stays. (A slice listed
        // twice is filed as the last copy says: under `c`, not `b`.)
        o.replace_slices([slice("c-2", "c"), slice("b-1", "b"), slice("b-1", "c")]);
        assert_eq!(o.keys(), [key("c")].into());
        assert_eq!(names(&o, "c"), ["b-1", "c-2"]);
        assert_eq!(o.changed_since(v), None);
        assert_eq!(o.entries.len(), 1, "nothing is kept of b or d");
        let v = o.version();
        o.put_service(svc("a"));
        assert_eq!(o.changed_since(v).unwrap(), [key("a")].into());
    }
}
