//! Services and EndpointSlices as [`super::Objects`] stores them, for the planner, the status
//! code and everything after: each object is converted once from its watched form
//! ([`super::slim`]) by the inbox, or by [`super::plan`] for files and tests.
//!
//! The watched types must carry a whole `ObjectMeta` (kube-runtime's watcher reads the
//! resourceVersion through it): 360 bytes in every object, plus a B-tree node for a slice's one
//! kept label. Stored, the metadata holds only its read fields, under the same names and types,
//! and the two derived facts nodelb asks of the rest: the Service of a slice, and the managers
//! of a Service's ingress. The body is kept as watched, but for an endpoint's addresses, of
//! which only the first counts.

use super::slim::{self, EndpointPort, ServiceSpec, ServiceStatus};
use crate::vocab::Str;
use crate::vocab::SERVICE_NAME_LABEL;
use k8s_openapi::api::discovery::v1::EndpointConditions;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use std::collections::BTreeMap;

/// A Service.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Service {
    pub metadata: ServiceMeta,
    pub spec: Option<ServiceSpec>,
    pub status: Option<ServiceStatus>,
}

/// What is read of a Service's metadata: name and namespace (its key, status writes, Events),
/// uid (Events), resourceVersion (the status writer), creationTimestamp (oldest wins a port),
/// nodelb's own annotations (the node selector).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ServiceMeta {
    pub name: Option<Str>,
    pub namespace: Option<Str>,
    pub uid: Option<Str>,
    pub resource_version: Option<Str>,
    pub creation_timestamp: Option<Time>,
    pub annotations: Option<BTreeMap<String, String>>,
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

impl From<slim::Service> for Service {
    fn from(s: slim::Service) -> Service {
        let slim::Service {
            metadata: m,
            spec,
            status,
            ..
        } = s;
        // The watched form keeps only the entries that own the ingress (see `slim`); one
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
        Service {
            metadata: ServiceMeta {
                name: m.name.map(Str::from),
                namespace: m.namespace.map(Str::from),
                uid: m.uid.map(Str::from),
                resource_version: m.resource_version.map(Str::from),
                creation_timestamp: m.creation_timestamp,
                annotations: m.annotations,
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

/// A list as parsed has room to grow (four entries for one); stored, it has none: at 10,000
/// Services the spare room was megabytes.
fn exact<T>(v: &mut Option<Vec<T>>) {
    if let Some(v) = v {
        v.shrink_to_fit();
    }
}

impl From<slim::EndpointSlice> for EndpointSlice {
    fn from(s: slim::EndpointSlice) -> EndpointSlice {
        let slim::EndpointSlice {
            metadata: m,
            address_type,
            endpoints,
            ports,
            ..
        } = s;
        EndpointSlice {
            metadata: SliceMeta {
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
                let mut e: Vec<Endpoint> = endpoints.into_iter().map(Endpoint::from).collect();
                e.shrink_to_fit();
                e
            },
            ports: {
                let mut p = ports;
                exact(&mut p);
                p
            },
        }
    }
}

impl From<slim::Endpoint> for Endpoint {
    fn from(e: slim::Endpoint) -> Endpoint {
        Endpoint {
            address: e.addresses.into_iter().next(),
            conditions: e.conditions,
            node_name: e.node_name,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plan::slim::tests::{service_json, slice_json, watched};
    use serde_json::json;

    #[test]
    fn a_stored_service_keeps_the_read_metadata_and_the_ingress_owners_names() {
        let w: slim::Service = watched(service_json());
        let s = Service::from(w.clone());
        assert_eq!(
            s.metadata,
            ServiceMeta {
                name: Some("web".into()),
                namespace: Some("shop".into()),
                uid: Some("6c1f8d3e-0000-4000-8000-000000000001".into()),
                resource_version: Some("4711".into()),
                creation_timestamp: Some(Time("2026-01-01T00:00:00Z".parse().unwrap())),
                annotations: Some([("nodelb.io/node-selector".into(), "pool=edge".into())].into()),
                ingress_owners: vec!["nodelb".into(), "metallb-controller".into()],
            }
        );
        assert_eq!((s.spec, s.status), (w.spec, w.status), "the body as read");
    }

    #[test]
    fn a_manager_with_two_entries_owns_the_ingress_once() {
        let mut v = service_json();
        let mf = v["metadata"]["managedFields"].as_array_mut().unwrap();
        mf.push(
            json!({"manager": "nodelb", "operation": "Update", "subresource": "status",
                       "fieldsV1": {"f:status": {"f:loadBalancer": {"f:ingress": {}}}}}),
        );
        let s = Service::from(watched::<slim::Service>(v));
        assert_eq!(s.metadata.ingress_owners, ["nodelb", "metallb-controller"]);
        let mut v = service_json();
        v["metadata"]["managedFields"] = json!([]);
        let s = Service::from(watched::<slim::Service>(v));
        assert!(s.metadata.ingress_owners.is_empty());
    }

    #[test]
    fn a_stored_slice_keeps_its_service_name_not_its_labels_and_first_addresses() {
        let mut v = slice_json();
        v["endpoints"][0]["addresses"] = json!(["198.51.100.1", "198.51.100.101"]);
        let w: slim::EndpointSlice = watched(v);
        let s = EndpointSlice::from(w.clone());
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
        let s = EndpointSlice::from(watched::<slim::EndpointSlice>(v));
        assert_eq!(s.metadata.service_name, None);
    }
}
