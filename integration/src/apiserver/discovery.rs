//! Discovery documents: `/version`, `/api`, `/api/v1`, `/apis`,
//! `/apis/{group}`, `/apis/{group}/{version}`, built from the resource
//! table with k8s-openapi types.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{
    APIGroup, APIGroupList, APIResource, APIResourceList, APIVersions, GroupVersionForDiscovery,
    ServerAddressByClientCIDR,
};
use k8s_openapi::apimachinery::pkg::version::Info;
use serde_json::Value;

use super::resources::{self, RESOURCES};

fn to_json<T: serde::Serialize>(v: &T) -> Value {
    serde_json::to_value(v).expect("discovery types serialize")
}

/// `/version` for Kubernetes 1.`minor`.0.
pub fn version(minor: u32) -> Value {
    to_json(&Info {
        major: "1".into(),
        minor: minor.to_string(),
        git_version: format!("v1.{minor}.0"),
        git_commit: "0000000000000000000000000000000000000000".into(),
        git_tree_state: "clean".into(),
        build_date: "2024-01-01T00:00:00Z".into(),
        go_version: "go1.22.0".into(),
        compiler: "gc".into(),
        platform: "linux/amd64".into(),
        ..Default::default()
    })
}

fn group_version(group: &str, version: &str) -> GroupVersionForDiscovery {
    GroupVersionForDiscovery {
        group_version: format!("{group}/{version}"),
        version: version.to_string(),
    }
}

fn api_group(group: &str, version: &str) -> APIGroup {
    APIGroup {
        name: group.to_string(),
        preferred_version: Some(group_version(group, version)),
        server_address_by_client_cidrs: None,
        versions: vec![group_version(group, version)],
    }
}

/// The document for a discovery path, or `None` when the path is not one.
pub fn document(path: &str, minor: u32) -> Option<Value> {
    let parts: Vec<&str> = path.trim_matches('/').split('/').collect();
    match parts.as_slice() {
        ["version"] => Some(version(minor)),
        ["api"] => Some(to_json(&APIVersions {
            server_address_by_client_cidrs: vec![ServerAddressByClientCIDR {
                client_cidr: "0.0.0.0/0".into(),
                server_address: String::new(),
            }],
            versions: vec!["v1".into()],
        })),
        ["apis"] => Some(to_json(&APIGroupList {
            groups: resources::named_groups()
                .into_iter()
                .map(|(g, v)| api_group(g, v))
                .collect(),
        })),
        ["apis", group] => resources::named_groups()
            .into_iter()
            .find(|(g, _)| g == group)
            .map(|(g, v)| to_json(&api_group(g, v))),
        ["api", version] => resource_list("", version),
        ["apis", group, version] => resource_list(group, version),
        _ => None,
    }
}

fn resource_list(group: &str, version: &str) -> Option<Value> {
    let mut list = Vec::new();
    for r in RESOURCES
        .iter()
        .filter(|r| r.group == group && r.version == version)
    {
        let verbs = [
            "create",
            "delete",
            "deletecollection",
            "get",
            "list",
            "patch",
            "update",
            "watch",
        ]
        .map(String::from)
        .to_vec();
        list.push(APIResource {
            name: r.resource.to_string(),
            singular_name: r.singular(),
            namespaced: r.namespaced,
            kind: r.kind.to_string(),
            verbs,
            ..Default::default()
        });
        if r.status_subresource {
            list.push(APIResource {
                name: format!("{}/status", r.resource),
                singular_name: String::new(),
                namespaced: r.namespaced,
                kind: r.kind.to_string(),
                verbs: ["get", "patch", "update"].map(String::from).to_vec(),
                ..Default::default()
            });
        }
    }
    if list.is_empty() {
        return None;
    }
    let group_version = if group.is_empty() {
        version.to_string()
    } else {
        format!("{group}/{version}")
    };
    let mut v = to_json(&APIResourceList {
        group_version,
        resources: list,
    });
    v["kind"] = "APIResourceList".into();
    v["apiVersion"] = "v1".into();
    Some(v)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn documents_for_every_discovery_path() {
        assert_eq!(document("/version", 30).unwrap()["gitVersion"], "v1.30.0");
        assert_eq!(document("/api", 33).unwrap()["versions"][0], "v1");
        let groups = document("/apis", 33).unwrap();
        assert_eq!(groups["groups"].as_array().unwrap().len(), 3);
        let core = document("/api/v1", 33).unwrap();
        let names: Vec<&str> = core["resources"]
            .as_array()
            .unwrap()
            .iter()
            .map(|r| r["name"].as_str().unwrap())
            .collect();
        assert!(names.contains(&"services/status"));
        assert!(document("/apis/coordination.k8s.io/v1", 33).is_some());
        assert!(document("/apis/apps/v1", 33).is_none());
    }
}
