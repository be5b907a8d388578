//! What a request asks for, decided from its method, path and query the way
//! kube-apiserver's `RequestInfoFactory` does: the verb RBAC sees (GET on a
//! collection is `list`, `watch=true` is `watch`), the group, version,
//! resource, subresource, namespace and name.

use std::collections::HashMap;

/// The parts of a resource request.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ResourceRequest {
    /// get, list, watch, create, update, patch, delete, deletecollection.
    pub verb: &'static str,
    pub group: String,
    pub version: String,
    pub resource: String,
    /// `status` for `…/{name}/status`; empty otherwise.
    pub subresource: String,
    /// Empty for cluster-scoped requests and cluster-wide lists.
    pub namespace: String,
    /// Empty for collection requests.
    pub name: String,
}

impl ResourceRequest {
    /// `resource` or `resource/subresource`, as RBAC rules name it.
    pub fn rbac_resource(&self) -> String {
        if self.subresource.is_empty() {
            self.resource.clone()
        } else {
            format!("{}/{}", self.resource, self.subresource)
        }
    }
}

/// A request classified.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RequestInfo {
    /// Discovery and other paths outside `/api/v1/…` and `/apis/g/v/…`
    /// resource trees.
    NonResource {
        path: String,
    },
    Resource(ResourceRequest),
}

/// Query parameters, last value wins.
pub type Query = HashMap<String, String>;

/// True when `watch=true` or `watch=1` (kube-apiserver accepts both).
pub fn is_watch(query: &Query) -> bool {
    matches!(query.get("watch").map(String::as_str), Some("true" | "1"))
}

/// Classifies a request the way kube-apiserver does.
pub fn classify(method: &str, path: &str, query: &Query) -> RequestInfo {
    let non_resource = || RequestInfo::NonResource {
        path: path.to_string(),
    };
    let parts: Vec<&str> = path.trim_matches('/').split('/').collect();
    let (group, version, mut rest) = match parts.as_slice() {
        ["api", version, rest @ ..] if !rest.is_empty() => ("", *version, rest),
        ["apis", group, version, rest @ ..] if !rest.is_empty() => (*group, *version, rest),
        _ => return non_resource(),
    };
    let mut legacy_watch = false;
    if rest.first() == Some(&"watch") {
        legacy_watch = true;
        rest = &rest[1..];
    }
    let mut namespace = "";
    if rest.first() == Some(&"namespaces") && rest.len() > 1 {
        namespace = rest[1];
        // `/namespaces/{ns}/status` and `/finalize` are subresources of the
        // Namespace itself; anything else after the name is a resource.
        if rest.len() > 2 && !matches!(rest[2], "status" | "finalize") {
            rest = &rest[2..];
        }
    }
    let (resource, name, subresource) = match rest {
        [resource] => (*resource, "", ""),
        [resource, name] => (*resource, *name, ""),
        [resource, name, sub] => (*resource, *name, *sub),
        _ => return non_resource(),
    };
    if resource.is_empty() {
        return non_resource();
    }
    let verb = match (method, name.is_empty()) {
        ("GET" | "HEAD", _) if legacy_watch || is_watch(query) => "watch",
        ("GET" | "HEAD", true) => "list",
        ("GET" | "HEAD", false) => "get",
        ("POST", _) => "create",
        ("PUT", _) => "update",
        ("PATCH", _) => "patch",
        ("DELETE", true) => "deletecollection",
        ("DELETE", false) => "delete",
        _ => "",
    };
    RequestInfo::Resource(ResourceRequest {
        verb,
        group: group.to_string(),
        version: version.to_string(),
        resource: resource.to_string(),
        subresource: subresource.to_string(),
        namespace: namespace.to_string(),
        name: name.to_string(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn res(method: &str, path: &str, query: &[(&str, &str)]) -> ResourceRequest {
        let q: Query = query
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        match classify(method, path, &q) {
            RequestInfo::Resource(r) => r,
            other => panic!("{path}: {other:?}"),
        }
    }

    #[test]
    fn collection_get_is_list_and_watch_param_is_watch() {
        assert_eq!(res("GET", "/api/v1/services", &[]).verb, "list");
        assert_eq!(
            res("GET", "/api/v1/services", &[("watch", "1")]).verb,
            "watch"
        );
        assert_eq!(
            res("GET", "/api/v1/watch/namespaces/a/services", &[]).verb,
            "watch"
        );
        assert_eq!(
            res("GET", "/api/v1/namespaces/a/services/b", &[]).verb,
            "get"
        );
    }

    #[test]
    fn namespaced_subresource() {
        let r = res("PATCH", "/api/v1/namespaces/a/services/b/status", &[]);
        assert_eq!(
            (
                r.verb,
                r.namespace.as_str(),
                r.name.as_str(),
                r.rbac_resource()
            ),
            ("patch", "a", "b", "services/status".to_string())
        );
    }

    #[test]
    fn named_group() {
        let r = res(
            "POST",
            "/apis/coordination.k8s.io/v1/namespaces/nodelb-system/leases",
            &[],
        );
        assert_eq!(r.group, "coordination.k8s.io");
        assert_eq!(r.resource, "leases");
        assert_eq!(r.verb, "create");
    }

    #[test]
    fn namespace_object_itself() {
        let r = res("GET", "/api/v1/namespaces/a", &[]);
        assert_eq!((r.resource.as_str(), r.name.as_str()), ("namespaces", "a"));
        let s = res("PUT", "/api/v1/namespaces/a/status", &[]);
        assert_eq!(
            (s.resource.as_str(), s.name.as_str(), s.subresource.as_str()),
            ("namespaces", "a", "status")
        );
        let l = res("GET", "/api/v1/namespaces", &[]);
        assert_eq!((l.verb, l.namespace.as_str()), ("list", ""));
    }

    #[test]
    fn discovery_is_non_resource() {
        for p in [
            "/api",
            "/apis",
            "/version",
            "/api/v1",
            "/apis/discovery.k8s.io/v1",
        ] {
            assert!(
                matches!(
                    classify("GET", p, &Query::new()),
                    RequestInfo::NonResource { .. }
                ),
                "{p}"
            );
        }
    }
}
