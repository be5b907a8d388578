//! The resource types the double serves: one table, read by the router, the
//! store, discovery and the direct-access helpers.

use std::fmt;

/// One served resource (a group/version/resource triple plus what the
/// apiserver knows about it).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ResourceDef {
    /// API group; `""` for core.
    pub group: &'static str,
    pub version: &'static str,
    /// Plural, lower case, as in URLs and RBAC rules.
    pub resource: &'static str,
    pub kind: &'static str,
    pub namespaced: bool,
    /// Has a `/status` subresource: writes to the main resource keep the
    /// stored `.status`, writes to `/status` change only `.status`.
    pub status_subresource: bool,
    /// The `.status` kube-apiserver gives a new object, for resources whose
    /// create strategy resets it (Services get `{"loadBalancer":{}}`);
    /// `None` keeps what the client sent (the kubelet creates its Node
    /// with a status).
    pub initial_status: Option<&'static str>,
}

impl ResourceDef {
    /// `v1` or `group/version`, as in an object's `apiVersion`.
    pub fn api_version(&self) -> String {
        if self.group.is_empty() {
            self.version.to_string()
        } else {
            format!("{}/{}", self.group, self.version)
        }
    }

    /// Kind of the list object (`ServiceList`).
    pub fn list_kind(&self) -> String {
        format!("{}List", self.kind)
    }

    /// Singular name as discovery reports it.
    pub fn singular(&self) -> String {
        self.kind.to_ascii_lowercase()
    }

    /// Base path of the collection, without namespace: `/api/v1` or
    /// `/apis/group/version`.
    pub fn group_version_path(&self) -> String {
        if self.group.is_empty() {
            format!("/api/{}", self.version)
        } else {
            format!("/apis/{}/{}", self.group, self.version)
        }
    }
}

impl fmt::Display for ResourceDef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.group.is_empty() {
            write!(f, "{}", self.resource)
        } else {
            write!(f, "{}.{}", self.resource, self.group)
        }
    }
}

const fn def(
    group: &'static str,
    version: &'static str,
    resource: &'static str,
    kind: &'static str,
    namespaced: bool,
    status_subresource: bool,
    initial_status: Option<&'static str>,
) -> ResourceDef {
    ResourceDef {
        group,
        version,
        resource,
        kind,
        namespaced,
        status_subresource,
        initial_status,
    }
}

/// Every resource the double serves.
pub const RESOURCES: &[ResourceDef] = &[
    def("", "v1", "namespaces", "Namespace", false, true, None),
    def("", "v1", "nodes", "Node", false, true, None),
    def(
        "",
        "v1",
        "services",
        "Service",
        true,
        true,
        Some(r#"{"loadBalancer":{}}"#),
    ),
    def("", "v1", "pods", "Pod", true, true, None),
    def(
        "discovery.k8s.io",
        "v1",
        "endpointslices",
        "EndpointSlice",
        true,
        false,
        None,
    ),
    def(
        "coordination.k8s.io",
        "v1",
        "leases",
        "Lease",
        true,
        false,
        None,
    ),
    def("events.k8s.io", "v1", "events", "Event", true, false, None),
];

/// The resource served at `group`/`version`/`resource`.
pub fn by_path(group: &str, version: &str, resource: &str) -> Option<&'static ResourceDef> {
    RESOURCES
        .iter()
        .find(|r| r.group == group && r.version == version && r.resource == resource)
}

/// The resource whose objects have this `apiVersion` and `kind`.
pub fn by_kind(api_version: &str, kind: &str) -> Option<&'static ResourceDef> {
    RESOURCES
        .iter()
        .find(|r| r.kind == kind && r.api_version() == api_version)
}

/// Groups other than core, in table order, without repeats.
pub fn named_groups() -> Vec<(&'static str, &'static str)> {
    let mut out: Vec<(&'static str, &'static str)> = Vec::new();
    for r in RESOURCES.iter().filter(|r| !r.group.is_empty()) {
        if !out.contains(&(r.group, r.version)) {
            out.push((r.group, r.version));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lookups_agree() {
        let svc = by_path("", "v1", "services").unwrap();
        assert_eq!(svc.api_version(), "v1");
        assert_eq!(by_kind("v1", "Service"), Some(svc));
        let lease = by_kind("coordination.k8s.io/v1", "Lease").unwrap();
        assert_eq!(lease.group_version_path(), "/apis/coordination.k8s.io/v1");
        assert!(by_path("", "v1", "secrets").is_none());
        assert_eq!(named_groups().len(), 3);
    }
}
