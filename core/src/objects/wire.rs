//! Services and EndpointSlices as the API sends them and nodelb reads them: k8s-openapi's types
//! cut down to the fields nodelb reads, with the same names and field types (but for strings,
//! [`Str`]: inline up to 24 bytes, so a name or an address is not an allocation of its own), so
//! readers do not change. Fields nothing reads (the managed fields' JSON trees, `targetRef`,
//! the last-applied annotation) are skipped while parsing and never stored. An endpoint's
//! topology `hints` are read leniently, into names only (see [`Hints`]): a malformed hint
//! never costs the slice, which read as before when hints were skipped. Each object
//! is then converted once to the smaller form the index keeps ([`crate::objects::index`]); the
//! body (spec, status, ports) is the index's own types, read here.
//!
//! The watches deserialize straight into these types (they are `kube::Resource`s through
//! k8s-openapi's traits), and so does the file reader. A kept field has k8s-openapi's type and
//! reads as k8s-openapi reads it (a required field that is missing or null is its default;
//! `apiVersion` and `kind`, when present, must be the type's own), so an object fails here when
//! it failed there because of a kept field (a `Str` reads what a `String` reads). Values the
//! planner checks itself (protocols, addresses, CIDRs, families) stay raw strings, so bad ones
//! still reach it and are warned about.

use crate::objects::index::{self, or_default, EndpointPort, Hints, ServiceSpec, ServiceStatus};
use crate::vocab::{Str, LBPOOL_LABEL, SERVICE_NAME_LABEL, SERVICE_PROXY_NAME_LABEL};
use k8s_openapi::api::discovery::v1::EndpointConditions;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ManagedFieldsEntry, ObjectMeta, Time};
use serde::de::{self, DeserializeSeed, Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor};
use serde::Deserialize;
use std::collections::BTreeMap;
use std::fmt;

/// nodelb's own annotations (such as [`crate::plan::service::NODE_SELECTOR_ANNOTATION`]): the only
/// ones it reads. Others, like kubectl's last-applied copy of the whole object, are skipped.
const OWN_ANNOTATIONS: &str = "nodelb.io/";

/// A Service: `metadata` holds name, namespace, uid (Events), resourceVersion (the watch and
/// the status writer), creationTimestamp (oldest wins a port), nodelb's own annotations (the
/// node selector), of the labels only `service.kubernetes.io/service-proxy-name` (another
/// proxy's Service) and `svccontroller.k3s.cattle.io/lbpool` (ServiceLB's pool), and of the managed fields only the managers of
/// `status.loadBalancer.ingress`, each as its manager alone.
#[derive(Clone, Debug, Default, PartialEq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Service {
    #[serde(default, deserialize_with = "service_meta")]
    pub metadata: ObjectMeta,
    pub spec: Option<ServiceSpec>,
    pub status: Option<ServiceStatus>,
    /// `apiVersion` and `kind` are checked while reading (see `own`), not kept.
    #[serde(default, deserialize_with = "own_api_version::<Service, _>")]
    api_version: (),
    #[serde(default, deserialize_with = "own_kind::<Service, _>")]
    kind: (),
}

/// An EndpointSlice: `metadata` holds name, namespace, resourceVersion (the watch) and of the
/// labels only `kubernetes.io/service-name` (which files it under its Service).
#[derive(Clone, Debug, Default, PartialEq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct EndpointSlice {
    #[serde(default, deserialize_with = "slice_meta")]
    pub metadata: ObjectMeta,
    #[serde(default, deserialize_with = "or_default")]
    pub address_type: Str,
    #[serde(default, deserialize_with = "or_default")]
    pub endpoints: Vec<Endpoint>,
    pub ports: Option<Vec<EndpointPort>>,
    /// Checked, not kept, as for [`Service`].
    #[serde(default, deserialize_with = "own_api_version::<EndpointSlice, _>")]
    api_version: (),
    #[serde(default, deserialize_with = "own_kind::<EndpointSlice, _>")]
    kind: (),
}

/// One backend: its addresses (the first counts), readiness, node (`Local` policy) and
/// topology hints.
#[derive(Clone, Debug, Default, PartialEq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Endpoint {
    #[serde(default, deserialize_with = "or_default")]
    pub addresses: Vec<Str>,
    pub conditions: Option<EndpointConditions>,
    pub node_name: Option<Str>,
    /// `hints.forZones` and `hints.forNodes`, names only; read leniently (see [`hints`]).
    #[serde(default, deserialize_with = "hints")]
    pub hints: Hints,
}

/// `hints` as the API writes it: `{forZones: [{name}], forNodes: [{name}]}`.
#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct RawHints {
    for_zones: Option<Vec<Named>>,
    for_nodes: Option<Vec<Named>>,
}

#[derive(Deserialize)]
struct Named {
    name: Option<String>,
}

/// Either form: hints as the API writes them, or anything else (read and dropped).
#[derive(Deserialize)]
#[serde(untagged)]
enum Lenient {
    Read(Option<RawHints>),
    Other(IgnoredAny),
}

/// An endpoint's hints, never an error: anything that does not read as the API writes hints
/// (a list that is not one, an entry without a name or with an empty one) marks them
/// malformed and keeps none of them, so the endpoint counts as carrying no hint (the planner
/// warns about its slice). Names are sorted and kept once each.
fn hints<'de, D: Deserializer<'de>>(d: D) -> Result<Hints, D::Error> {
    let raw = match Lenient::deserialize(d)? {
        Lenient::Read(None) => return Ok(Hints::default()),
        Lenient::Read(Some(raw)) => raw,
        Lenient::Other(_) => {
            return Ok(Hints {
                malformed: true,
                ..Hints::default()
            })
        }
    };
    let names = |list: Option<Vec<Named>>| -> Option<Box<[Str]>> {
        let mut names: Vec<Str> = Vec::new();
        for n in list.unwrap_or_default() {
            names.push(Str::from(n.name.filter(|n| !n.is_empty())?));
        }
        names.sort();
        names.dedup();
        Some(names.into())
    };
    match (names(raw.for_zones), names(raw.for_nodes)) {
        (Some(zones), Some(nodes)) => Ok(Hints {
            zones,
            nodes,
            malformed: false,
        }),
        _ => Ok(Hints {
            malformed: true,
            ..Hints::default()
        }),
    }
}

/// The API's names for each type are the real types' own: the watches ask for v1 Services and
/// discovery.k8s.io/v1 EndpointSlices, and kube-runtime needs the metadata as `ObjectMeta`.
macro_rules! mirror {
    ($wire:ty, $full:ty) => {
        impl k8s_openapi::Resource for $wire {
            const API_VERSION: &'static str = <$full as k8s_openapi::Resource>::API_VERSION;
            const GROUP: &'static str = <$full as k8s_openapi::Resource>::GROUP;
            const KIND: &'static str = <$full as k8s_openapi::Resource>::KIND;
            const VERSION: &'static str = <$full as k8s_openapi::Resource>::VERSION;
            const URL_PATH_SEGMENT: &'static str =
                <$full as k8s_openapi::Resource>::URL_PATH_SEGMENT;
            type Scope = <$full as k8s_openapi::Resource>::Scope;
        }

        impl k8s_openapi::Metadata for $wire {
            type Ty = ObjectMeta;

            fn metadata(&self) -> &ObjectMeta {
                &self.metadata
            }

            fn metadata_mut(&mut self) -> &mut ObjectMeta {
                &mut self.metadata
            }
        }
    };
}

mirror!(Service, k8s_openapi::api::core::v1::Service);
mirror!(
    EndpointSlice,
    k8s_openapi::api::discovery::v1::EndpointSlice
);

fn own_api_version<'de, K: k8s_openapi::Resource, D: Deserializer<'de>>(
    d: D,
) -> Result<(), D::Error> {
    own(d, K::API_VERSION)
}

fn own_kind<'de, K: k8s_openapi::Resource, D: Deserializer<'de>>(d: D) -> Result<(), D::Error> {
    own(d, K::KIND)
}

/// `apiVersion` or `kind`, when given, must be the type's own (a `discovery.k8s.io/v1beta1`
/// slice in a file is not read as a v1 one), with k8s-openapi's error.
fn own<'de, D: Deserializer<'de>>(d: D, want: &'static str) -> Result<(), D::Error> {
    let got = String::deserialize(d)?;
    if got == want {
        Ok(())
    } else {
        Err(de::Error::invalid_value(de::Unexpected::Str(&got), &want))
    }
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct ServiceMeta {
    name: Option<String>,
    namespace: Option<String>,
    uid: Option<String>,
    resource_version: Option<String>,
    creation_timestamp: Option<Time>,
    generation: Option<i64>,
    #[serde(default, deserialize_with = "service_labels")]
    labels: Option<BTreeMap<String, String>>,
    #[serde(default, deserialize_with = "own_annotations")]
    annotations: Option<BTreeMap<String, String>>,
    #[serde(default, deserialize_with = "ingress_owners")]
    managed_fields: Option<Vec<ManagedFieldsEntry>>,
}

fn service_meta<'de, D: Deserializer<'de>>(d: D) -> Result<ObjectMeta, D::Error> {
    let Some(m) = Option::<ServiceMeta>::deserialize(d)? else {
        return Ok(ObjectMeta::default());
    };
    Ok(ObjectMeta {
        name: m.name,
        namespace: m.namespace,
        uid: m.uid,
        resource_version: m.resource_version,
        creation_timestamp: m.creation_timestamp,
        generation: m.generation,
        labels: m.labels,
        annotations: m.annotations,
        managed_fields: m.managed_fields,
        ..ObjectMeta::default()
    })
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct SliceMeta {
    name: Option<String>,
    namespace: Option<String>,
    resource_version: Option<String>,
    #[serde(default, deserialize_with = "service_name_label")]
    labels: Option<BTreeMap<String, String>>,
}

fn slice_meta<'de, D: Deserializer<'de>>(d: D) -> Result<ObjectMeta, D::Error> {
    let Some(m) = Option::<SliceMeta>::deserialize(d)? else {
        return Ok(ObjectMeta::default());
    };
    Ok(ObjectMeta {
        name: m.name,
        namespace: m.namespace,
        resource_version: m.resource_version,
        labels: m.labels,
        ..ObjectMeta::default()
    })
}

fn own_annotations<'de, D: Deserializer<'de>>(
    d: D,
) -> Result<Option<BTreeMap<String, String>>, D::Error> {
    d.deserialize_option(Only(|k| k.starts_with(OWN_ANNOTATIONS)))
}

fn service_labels<'de, D: Deserializer<'de>>(
    d: D,
) -> Result<Option<BTreeMap<String, String>>, D::Error> {
    let labels =
        d.deserialize_option(Only(|k| k == SERVICE_PROXY_NAME_LABEL || k == LBPOOL_LABEL))?;
    Ok(labels.filter(|l| !l.is_empty()))
}

fn service_name_label<'de, D: Deserializer<'de>>(
    d: D,
) -> Result<Option<BTreeMap<String, String>>, D::Error> {
    d.deserialize_option(Only(|k| k == SERVICE_NAME_LABEL))
}

/// A string map (labels, annotations) of only the keys this accepts; other values are skipped
/// unread. Even one entry costs a whole B-tree node, so only what is read is
/// worth it.
struct Only(fn(&str) -> bool);

impl<'de> Visitor<'de> for Only {
    type Value = Option<BTreeMap<String, String>>;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a map")
    }

    fn visit_none<E>(self) -> Result<Self::Value, E> {
        Ok(None)
    }

    fn visit_unit<E>(self) -> Result<Self::Value, E> {
        Ok(None)
    }

    fn visit_some<D: Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
        d.deserialize_map(self)
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        let mut out = BTreeMap::new();
        while let Some(k) = map.next_key::<String>()? {
            if (self.0)(&k) {
                out.insert(k, map.next_value()?);
            } else {
                map.next_value::<IgnoredAny>()?;
            }
        }
        Ok(Some(out))
    }
}

/// One managed-fields entry, read only as far as [`ingress_owners`] needs.
#[derive(Deserialize)]
struct ManagedEntry {
    manager: Option<String>,
    subresource: Option<String>,
    #[serde(default, rename = "fieldsV1", deserialize_with = "owns_ingress")]
    owns_ingress: bool,
}

/// Of the managed fields, the entries that own `status.loadBalancer.ingress` through the
/// status subresource (where the API server records status writes), each kept as its manager
/// alone: the stored form keeps just their names (`index::ServiceMeta::ingress_owners`).
/// The rest, and every fieldsV1 tree, are walked and dropped.
fn ingress_owners<'de, D: Deserializer<'de>>(
    d: D,
) -> Result<Option<Vec<ManagedFieldsEntry>>, D::Error> {
    let Some(entries) = Option::<Vec<ManagedEntry>>::deserialize(d)? else {
        return Ok(None);
    };
    let mut kept: Vec<ManagedFieldsEntry> = entries
        .into_iter()
        .filter(|e| e.owns_ingress && e.subresource.as_deref() == Some("status"))
        .map(|e| ManagedFieldsEntry {
            manager: e.manager,
            ..ManagedFieldsEntry::default()
        })
        .collect();
    // Collecting a filter starts at room for four.
    kept.shrink_to_fit();
    Ok((!kept.is_empty()).then_some(kept))
}

const INGRESS_PATH: &[&str] = &["f:status", "f:loadBalancer", "f:ingress"];

fn owns_ingress<'de, D: Deserializer<'de>>(d: D) -> Result<bool, D::Error> {
    Holds(INGRESS_PATH).deserialize(d)
}

/// Whether a fieldsV1 tree holds a path of keys. Whatever is at its end counts; a value on the
/// way that is not a map holds nothing (fieldsV1 is free-form JSON, so it is not an error).
struct Holds(&'static [&'static str]);

impl<'de> DeserializeSeed<'de> for Holds {
    type Value = bool;

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<bool, D::Error> {
        if self.0.is_empty() {
            IgnoredAny::deserialize(d)?;
            return Ok(true);
        }
        d.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for Holds {
    type Value = bool;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("fieldsV1")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<bool, A::Error> {
        let (first, rest) = self.0.split_first().expect("an empty path is not walked");
        let mut found = false;
        while let Some(is_first) = map.next_key_seed(KeyIs(first))? {
            if is_first {
                found |= map.next_value_seed(Holds(rest))?;
            } else {
                map.next_value::<IgnoredAny>()?;
            }
        }
        Ok(found)
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<bool, A::Error> {
        while seq.next_element::<IgnoredAny>()?.is_some() {}
        Ok(false)
    }

    fn visit_some<D: Deserializer<'de>>(self, d: D) -> Result<bool, D::Error> {
        d.deserialize_any(self)
    }

    fn visit_none<E>(self) -> Result<bool, E> {
        Ok(false)
    }

    fn visit_unit<E>(self) -> Result<bool, E> {
        Ok(false)
    }

    fn visit_bool<E>(self, _: bool) -> Result<bool, E> {
        Ok(false)
    }

    fn visit_i64<E>(self, _: i64) -> Result<bool, E> {
        Ok(false)
    }

    fn visit_u64<E>(self, _: u64) -> Result<bool, E> {
        Ok(false)
    }

    fn visit_f64<E>(self, _: f64) -> Result<bool, E> {
        Ok(false)
    }

    fn visit_str<E>(self, _: &str) -> Result<bool, E> {
        Ok(false)
    }
}

/// Whether a map key is this one, compared without being kept: fieldsV1 has a key per field of
/// the object.
struct KeyIs(&'static str);

impl<'de> DeserializeSeed<'de> for KeyIs {
    type Value = bool;

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<bool, D::Error> {
        d.deserialize_str(self)
    }
}

impl<'de> Visitor<'de> for KeyIs {
    type Value = bool;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a string key")
    }

    fn visit_str<E>(self, v: &str) -> Result<bool, E> {
        Ok(v == self.0)
    }
}

impl From<Service> for index::Service {
    fn from(s: Service) -> index::Service {
        let Service {
            metadata: m,
            spec,
            status,
            ..
        } = s;
        // The watched form keeps only the entries that own the ingress (see `ingress_owners`); one
        // manager may have several (an Apply and an Update).
        let mut ingress_owners: Vec<Str> = Vec::new();
        for manager in m
            .managed_fields
            .into_iter()
            .flatten()
            .filter_map(|e| e.manager.map(Str::from))
        {
            if !ingress_owners.contains(&manager) {
                ingress_owners.push(manager);
            }
        }
        ingress_owners.shrink_to_fit();
        index::Service {
            metadata: index::ServiceMeta {
                name: m.name.map(Str::from),
                namespace: m.namespace.map(Str::from),
                uid: m.uid.map(Str::from),
                resource_version: m.resource_version.map(Str::from),
                creation_timestamp: m.creation_timestamp,
                generation: m.generation,
                annotations: m.annotations,
                other_proxy: m
                    .labels
                    .as_ref()
                    .is_some_and(|l| l.contains_key(SERVICE_PROXY_NAME_LABEL)),
                lbpool: m
                    .labels
                    .as_ref()
                    .and_then(|l| l.get(LBPOOL_LABEL))
                    .filter(|p| !p.is_empty())
                    .map(|p| Str::from(p.as_str())),
                ingress_owners,
            },
            spec: spec.map(|mut s| {
                exact(&mut s.cluster_ips);
                exact(&mut s.ip_families);
                exact(&mut s.load_balancer_source_ranges);
                exact(&mut s.ports);
                s
            }),
            status: status.map(|mut s| {
                if let Some(lb) = s.load_balancer.as_mut() {
                    exact(&mut lb.ingress);
                }
                s
            }),
        }
    }
}

/// A list as parsed has room to grow (four entries for one); stored, it has none: across
/// every Service that spare room adds up.
fn exact<T>(v: &mut Option<Vec<T>>) {
    if let Some(v) = v {
        v.shrink_to_fit();
    }
}

impl From<EndpointSlice> for index::EndpointSlice {
    fn from(s: EndpointSlice) -> index::EndpointSlice {
        let EndpointSlice {
            metadata: m,
            address_type,
            mut endpoints,
            ports,
            ..
        } = s;
        let hints =
            index::SliceHints::new(endpoints.iter_mut().map(|e| std::mem::take(&mut e.hints)))
                .map(Box::new);
        index::EndpointSlice {
            metadata: index::SliceMeta {
                name: m.name.map(Str::from),
                namespace: m.namespace.map(Str::from),
                service_name: m
                    .labels
                    .and_then(|mut l| l.remove(SERVICE_NAME_LABEL))
                    .map(Str::from),
            },
            address_type,
            endpoints: {
                // (Collected in place, with the parsed list's spare room.)
                let mut e: Vec<index::Endpoint> =
                    endpoints.into_iter().map(index::Endpoint::from).collect();
                e.shrink_to_fit();
                e
            },
            ports: {
                let mut p = ports;
                exact(&mut p);
                p
            },
            hints,
        }
    }
}

impl From<Endpoint> for index::Endpoint {
    fn from(e: Endpoint) -> index::Endpoint {
        index::Endpoint {
            address: e.addresses.into_iter().next(),
            conditions: e.conditions,
            node_name: e.node_name,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fixtures::{service_json, slice_json};
    use crate::objects::index::{
        LoadBalancerStatus, ServicePort, StoredIngress, TrafficDistribution,
    };
    use k8s_openapi::api::core::v1::{ClientIPConfig, SessionAffinityConfig};
    use serde_json::json;

    /// Read as the watches read objects (the agent's watches wrap the same deserialization in
    /// kube's `DeserializeGuard`, which its inbox tests exercise).
    pub(super) fn watched<K: for<'de> Deserialize<'de>>(v: serde_json::Value) -> K {
        serde_json::from_value(v).unwrap()
    }

    #[test]
    fn a_watched_service_keeps_only_what_nodelb_reads() {
        let s: Service = watched(service_json());
        let owner = |m: &str| ManagedFieldsEntry {
            manager: Some(m.into()),
            ..ManagedFieldsEntry::default()
        };
        assert_eq!(
            s.metadata,
            ObjectMeta {
                name: Some("web".into()),
                namespace: Some("shop".into()),
                uid: Some("6c1f8d3e-0000-4000-8000-000000000001".into()),
                resource_version: Some("4711".into()),
                creation_timestamp: Some(Time("2026-01-01T00:00:00Z".parse().unwrap())),
                // The observedGeneration of nodelb's condition.
                generation: Some(3),
                annotations: Some([("nodelb.io/node-selector".into(), "pool=edge".into())].into()),
                // Of five managers, the two that own the ingress, without their fieldsV1.
                managed_fields: Some(vec![owner("nodelb"), owner("metallb-controller")]),
                // Dropped: labels, other annotations, finalizers.
                ..ObjectMeta::default()
            },
        );
        let port = |name: &str, port, protocol: &str| ServicePort {
            name: Some(name.into()),
            port,
            protocol: Some(protocol.into()),
        };
        let strings = |v: &[&str]| Some(v.iter().map(|s| Str::from(*s)).collect());
        assert_eq!(
            s.spec,
            Some(ServiceSpec {
                cluster_ip: Some("10.96.0.10".into()),
                cluster_ips: strings(&["10.96.0.10", "fd00::10"]),
                external_traffic_policy: Some("Local".into()),
                health_check_node_port: Some(31000),
                ip_families: strings(&["IPv4", "IPv6"]),
                load_balancer_class: Some("nodelb.io/lb".into()),
                // Raw: the planner warns about the bad range and the bad protocol.
                load_balancer_source_ranges: strings(&["192.0.2.0/24", "not-a-cidr"]),
                ports: Some(vec![port("http", 80, "TCP"), port("odd", 81, "ICMP")]),
                session_affinity: Some("ClientIP".into()),
                session_affinity_config: Some(SessionAffinityConfig {
                    client_ip: Some(ClientIPConfig {
                        timeout_seconds: Some(600)
                    })
                }),
                traffic_distribution: Some(TrafficDistribution::PreferClose),
                type_: Some("LoadBalancer".into()),
            })
        );
        assert_eq!(
            s.status,
            Some(ServiceStatus {
                load_balancer: Some(LoadBalancerStatus {
                    ingress: Some(vec![StoredIngress {
                        ip: Some("192.0.2.1".into()),
                        ip_mode: Some("VIP".into()),
                        ..StoredIngress::default()
                    }]),
                }),
                // Another controller's condition is not kept.
                serving: None,
            })
        );
    }

    #[test]
    fn a_service_nobody_wrote_the_ingress_of_keeps_no_managed_fields() {
        let mut v = service_json();
        let mf = v["metadata"]["managedFields"].as_array_mut().unwrap();
        mf.retain(|e| !matches!(e["manager"].as_str(), Some("nodelb" | "metallb-controller")));
        // An ingress owned outside the status subresource is not a status write.
        mf.push(json!({"manager": "kubectl", "operation": "Update",
                       "fieldsV1": {"f:status": {"f:loadBalancer": {"f:ingress": {}}}}}));
        // Free-form fieldsV1 that does not hold the path is not an error.
        mf.push(json!({"manager": "odd", "subresource": "status",
                       "fieldsV1": {"f:status": ["f:loadBalancer"]}}));
        let s: Service = watched(v);
        assert_eq!(s.metadata.managed_fields, None);
    }

    #[test]
    fn a_watched_slice_keeps_only_what_nodelb_reads() {
        let s: EndpointSlice = watched(slice_json());
        let endpoint = |i: u8| Endpoint {
            addresses: vec![format!("198.51.100.{i}").into()],
            conditions: Some(EndpointConditions {
                ready: Some(i != 5),
                serving: Some(true),
                terminating: Some(i == 5),
            }),
            node_name: Some(format!("node-{i}").into()),
            hints: Hints {
                zones: ["zone-a".into()].into(),
                nodes: [format!("node-{i}").into()].into(),
                malformed: false,
            },
            // Dropped: hostname, zone, deprecatedTopology, targetRef.
        };
        assert_eq!(
            s,
            EndpointSlice {
                metadata: ObjectMeta {
                    name: Some("web-x7k2p".into()),
                    namespace: Some("shop".into()),
                    resource_version: Some("4712".into()),
                    labels: Some([(SERVICE_NAME_LABEL.into(), "web".into())].into()),
                    // Dropped: the other labels, generateName, uid, generation,
                    // creationTimestamp, annotations, ownerReferences, managedFields.
                    ..ObjectMeta::default()
                },
                address_type: "IPv4".into(),
                endpoints: (1..=5).map(endpoint).collect(),
                ports: Some(vec![EndpointPort {
                    name: Some("http".into()),
                    port: Some(8080),
                    protocol: Some("TCP".into()),
                }]),
                ..EndpointSlice::default()
            }
        );
    }

    /// Deserialize `v` as the k8s-openapi type and as ours: both must accept it, or both
    /// reject it with the same error.
    fn same_verdict<Full, Ours>(v: serde_json::Value) -> Option<(Full, Ours)>
    where
        Full: for<'de> Deserialize<'de>,
        Ours: for<'de> Deserialize<'de>,
    {
        let full = serde_json::from_value::<Full>(v.clone());
        let ours = serde_json::from_value::<Ours>(v.clone());
        match (full, ours) {
            (Ok(f), Ok(s)) => Some((f, s)),
            (Err(f), Err(s)) => {
                assert_eq!(f.to_string(), s.to_string(), "{v}");
                None
            }
            (f, s) => panic!("{v}: k8s-openapi {:?}, nodelb {:?}", f.err(), s.err()),
        }
    }

    #[test]
    fn kept_fields_are_read_as_k8s_openapi_reads_them() {
        use k8s_openapi::api::core::v1::Service as FullService;
        use k8s_openapi::api::discovery::v1::EndpointSlice as FullSlice;
        let svc = same_verdict::<FullService, Service>;
        let slice = same_verdict::<FullSlice, EndpointSlice>;
        for bad in [
            json!({"apiVersion": "v2", "kind": "Service"}),
            json!({"apiVersion": "v1", "kind": "Pod"}),
            json!({"spec": {"ports": [{"port": "eighty"}]}}),
            json!({"spec": {"ports": 3}}),
            json!({"metadata": {"name": 7}}),
            json!({"metadata": {"annotations": {"nodelb.io/node-selector": 1}}}),
            json!({"metadata": {"creationTimestamp": "yesterday"}}),
        ] {
            assert!(svc(bad).is_none());
        }
        for bad in [
            json!({"apiVersion": "discovery.k8s.io/v1beta1"}),
            json!({"metadata": {"labels": {"kubernetes.io/service-name": ["web"]}}}),
            json!({"endpoints": [{"addresses": "198.51.100.1"}]}),
            json!({"ports": [{"port": "http"}]}),
        ] {
            assert!(slice(bad).is_none());
        }
        // Required fields that are null or missing are their defaults.
        let (f, s) = svc(json!({"metadata": null, "spec": {"ports": [{"port": null}]}})).unwrap();
        assert_eq!(s.spec.unwrap().ports.unwrap()[0].port, 0);
        assert_eq!(f.spec.unwrap().ports.unwrap()[0].port, 0);
        let (f, s) =
            slice(json!({"addressType": null, "endpoints": [{"addresses": null}]})).unwrap();
        assert_eq!(
            (f.address_type, s.address_type),
            (String::new(), Str::default())
        );
        assert!(f.endpoints[0].addresses.is_empty() && s.endpoints[0].addresses.is_empty());
        // Both types read the realistic objects.
        let (f, s) = svc(service_json()).unwrap();
        assert_eq!(f.metadata.name, s.metadata.name);
        let (f, s) = slice(slice_json()).unwrap();
        assert_eq!(f.endpoints.len(), s.endpoints.len());
    }
}

#[cfg(test)]
mod stored_tests {
    use super::tests::watched;
    use super::*;
    use crate::fixtures::{service_json, slice_json};
    use crate::objects::index::{Endpoint, ServiceMeta, SliceMeta, TrafficDistribution};
    use serde_json::json;

    #[test]
    fn a_stored_service_keeps_the_read_metadata_and_the_ingress_owners_names() {
        let w: Service = watched(service_json());
        let s = index::Service::from(w.clone());
        assert_eq!(
            s.metadata,
            ServiceMeta {
                name: Some("web".into()),
                namespace: Some("shop".into()),
                uid: Some("6c1f8d3e-0000-4000-8000-000000000001".into()),
                resource_version: Some("4711".into()),
                creation_timestamp: Some(Time("2026-01-01T00:00:00Z".parse().unwrap())),
                generation: Some(3),
                annotations: Some([("nodelb.io/node-selector".into(), "pool=edge".into())].into()),
                other_proxy: false,
                lbpool: None,
                ingress_owners: vec!["nodelb".into(), "metallb-controller".into()],
            }
        );
        assert_eq!((s.spec, s.status), (w.spec, w.status), "the body as read");
    }

    #[test]
    fn a_service_labelled_for_another_proxy_is_marked_whatever_the_value() {
        for value in ["other-proxy", ""] {
            let mut v = service_json();
            v["metadata"]["labels"] =
                json!({"app": "web", "service.kubernetes.io/service-proxy-name": value});
            let w: Service = watched(v);
            assert_eq!(
                w.metadata.labels,
                Some([(SERVICE_PROXY_NAME_LABEL.into(), value.into())].into()),
                "of the labels only that one is kept"
            );
            assert!(index::Service::from(w).metadata.other_proxy, "{value:?}");
        }
    }

    #[test]
    fn a_service_keeps_its_servicelb_pool_label_and_an_empty_one_is_no_pool() {
        for (value, pool) in [("edge", Some("edge")), ("", None)] {
            let mut v = service_json();
            v["metadata"]["labels"] = json!({"app": "web", LBPOOL_LABEL: value});
            // An annotation of the same name is not ServiceLB's pool: k3s reads the label.
            v["metadata"]["annotations"] = json!({LBPOOL_LABEL: "other"});
            let s = index::Service::from(watched::<Service>(v));
            assert_eq!(s.metadata.lbpool.as_deref(), pool, "{value:?}");
            assert!(!s.metadata.other_proxy);
        }
    }

    #[test]
    fn an_unknown_traffic_distribution_is_kept_as_unknown_and_a_bad_one_fails_as_in_k8s_openapi() {
        let mut v = service_json();
        v["spec"]["trafficDistribution"] = json!("PreferFarAway");
        let s: Service = watched(v);
        assert_eq!(
            s.spec.unwrap().traffic_distribution,
            Some(TrafficDistribution::Unknown)
        );
        let mut v = service_json();
        v["spec"]["trafficDistribution"] = json!(7);
        let theirs = serde_json::from_value::<k8s_openapi::api::core::v1::Service>(v.clone());
        let ours = serde_json::from_value::<Service>(v);
        assert_eq!(
            theirs.unwrap_err().to_string(),
            ours.unwrap_err().to_string()
        );
    }

    #[test]
    fn a_manager_with_two_entries_owns_the_ingress_once() {
        let mut v = service_json();
        let mf = v["metadata"]["managedFields"].as_array_mut().unwrap();
        mf.push(
            json!({"manager": "nodelb", "operation": "Update", "subresource": "status",
                       "fieldsV1": {"f:status": {"f:loadBalancer": {"f:ingress": {}}}}}),
        );
        let s = index::Service::from(watched::<Service>(v));
        assert_eq!(s.metadata.ingress_owners, ["nodelb", "metallb-controller"]);
        let mut v = service_json();
        v["metadata"]["managedFields"] = json!([]);
        let s = index::Service::from(watched::<Service>(v));
        assert!(s.metadata.ingress_owners.is_empty());
    }

    #[test]
    fn a_stored_slice_keeps_its_service_name_not_its_labels_and_first_addresses() {
        let mut v = slice_json();
        v["endpoints"][0]["addresses"] = json!(["198.51.100.1", "198.51.100.101"]);
        let w: EndpointSlice = watched(v);
        let s = index::EndpointSlice::from(w.clone());
        assert_eq!(
            s.metadata,
            SliceMeta {
                name: Some("web-x7k2p".into()),
                namespace: Some("shop".into()),
                service_name: Some("web".into()),
            }
        );
        let endpoint = |i: u8| Endpoint {
            address: Some(format!("198.51.100.{i}").into()),
            conditions: Some(EndpointConditions {
                ready: Some(i != 5),
                serving: Some(true),
                terminating: Some(i == 5),
            }),
            node_name: Some(format!("node-{i}").into()),
        };
        assert_eq!(s.endpoints, (1..=5).map(endpoint).collect::<Vec<_>>());
        assert_eq!(
            (s.address_type, s.ports),
            (w.address_type, w.ports),
            "the rest as read"
        );
        let mut v = slice_json();
        v["metadata"]["labels"] = json!({"app": "web"});
        let s = index::EndpointSlice::from(watched::<EndpointSlice>(v));
        assert_eq!(s.metadata.service_name, None);
    }

    /// The hints of a slice's five endpoints: (zones, nodes) each, as JSON.
    fn hinted(hints: [serde_json::Value; 5]) -> index::EndpointSlice {
        let mut v = slice_json();
        for (i, h) in hints.into_iter().enumerate() {
            v["endpoints"][i]["hints"] = h;
        }
        index::EndpointSlice::from(watched::<EndpointSlice>(v))
    }

    #[test]
    fn a_stored_slice_keeps_each_distinct_set_of_hints_once() {
        let zone = |z: &str| json!({"forZones": [{"name": z}]});
        let s = hinted([
            zone("zone-b"),
            zone("zone-a"),
            json!(null),
            json!({"forZones": [{"name": "zone-b"}, {"name": "zone-a"}, {"name": "zone-a"}]}),
            zone("zone-b"),
        ]);
        let hints = s.hints.as_deref().expect("hints kept");
        let zones = |i: usize| -> Option<Vec<&str>> {
            Some(s.hints_of(i)?.zones.iter().map(|z| z.as_str()).collect())
        };
        assert_eq!(zones(0), Some(vec!["zone-b"]));
        assert_eq!(zones(1), Some(vec!["zone-a"]));
        assert_eq!(zones(2), None, "no hints");
        assert_eq!(
            zones(3),
            Some(vec!["zone-a", "zone-b"]),
            "sorted, once each"
        );
        assert!(
            std::ptr::eq(hints.of(0).unwrap(), hints.of(4).unwrap()),
            "shared"
        );
        assert_eq!(s.hints_of(5), None, "no such endpoint");
        // A slice without hints keeps none at all.
        let s = hinted(std::array::from_fn(|_| json!({})));
        assert_eq!(s.hints, None);
    }

    #[test]
    fn malformed_hints_are_marked_and_never_cost_the_slice() {
        let s = hinted([
            json!({"forZones": [{"name": ""}]}),
            json!({"forZones": [{}], "forNodes": [{"name": "node-2"}]}),
            json!({"forZones": "zone-a"}),
            json!("zone-a"),
            json!({"forZones": [{"name": "zone-a"}], "forNodes": [{"name": 5}]}),
        ]);
        assert_eq!(s.endpoints.len(), 5, "the slice reads");
        for i in 0..5 {
            let h = s
                .hints_of(i)
                .unwrap_or_else(|| panic!("endpoint {i} is marked"));
            assert!(h.malformed, "endpoint {i}");
            assert!(
                h.zones.is_empty() && h.nodes.is_empty(),
                "endpoint {i}: none kept"
            );
        }
        // Unknown fields beside well-formed hints are not a problem (k8s-openapi skips them).
        let s = hinted(std::array::from_fn(
            |_| json!({"forZones": [{"name": "zone-a", "weight": 1}], "forRegions": []}),
        ));
        assert!(!s.hints_of(0).unwrap().malformed);
    }
}
