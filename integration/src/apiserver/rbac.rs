//! RBAC authorization from manifests: every `ClusterRole`, `Role`,
//! `ClusterRoleBinding` and `RoleBinding` (rbac.authorization.k8s.io/v1)
//! in the YAML files under a directory, decoded with k8s-openapi types,
//! plus kube-apiserver's bootstrap discovery roles (any authenticated user
//! may GET `/api`, `/apis`, `/version`, …). Rule matching follows
//! kube-apiserver's `RuleAllows`: `*` wildcards for verbs, groups and
//! resources, `*/subresource`, `resourceNames` only for requests that name
//! an object, `nonResourceURLs` with a trailing `*` as a prefix.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use k8s_openapi::api::rbac::v1::{
    ClusterRole, ClusterRoleBinding, PolicyRule, Role, RoleBinding, RoleRef, Subject,
};
use serde::Deserialize;
use serde_json::Value;
use tracing::{debug, info};

use super::authn::{self, UserInfo};

const RBAC_API_VERSION: &str = "rbac.authorization.k8s.io/v1";

#[derive(Debug, thiserror::Error)]
pub enum RbacError {
    #[error("reading directory {path}")]
    ReadDir {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("reading {path}")]
    ReadFile {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("parsing YAML in {path}")]
    ParseYaml {
        path: PathBuf,
        #[source]
        source: serde_yaml_ng::Error,
    },
    #[error("decoding {kind} {name:?} in {path}")]
    Decode {
        path: PathBuf,
        kind: String,
        name: String,
        #[source]
        source: serde_json::Error,
    },
}

/// What is being asked.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Request<'a> {
    Resource {
        verb: &'a str,
        group: &'a str,
        /// `resource` or `resource/subresource`.
        resource: &'a str,
        /// Empty for cluster-scoped requests.
        namespace: &'a str,
        /// Empty when the request names no object.
        name: &'a str,
    },
    NonResource {
        /// Lower-case HTTP method: `get`, `post`, …
        verb: &'a str,
        path: &'a str,
    },
}

/// The outcome, with the binding that allowed it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decision {
    Allow(String),
    Deny,
}

/// The loaded policy.
#[derive(Debug, Clone, Default)]
pub struct Authorizer {
    cluster_roles: BTreeMap<String, Vec<PolicyRule>>,
    /// (namespace, name) → rules.
    roles: BTreeMap<(String, String), Vec<PolicyRule>>,
    cluster_bindings: Vec<ClusterRoleBinding>,
    role_bindings: Vec<RoleBinding>,
    /// ClusterRoles with an aggregationRule: name → label sets, any of
    /// which selects ClusterRoles whose rules it collects.
    aggregations: Vec<(String, Vec<BTreeMap<String, String>>)>,
    cluster_role_labels: BTreeMap<String, BTreeMap<String, String>>,
}

impl Authorizer {
    /// Only kube-apiserver's bootstrap discovery roles.
    pub fn bootstrap() -> Authorizer {
        let mut a = Authorizer::default();
        let discovery = PolicyRule {
            verbs: vec!["get".into()],
            non_resource_urls: Some(
                [
                    "/api",
                    "/api/*",
                    "/apis",
                    "/apis/*",
                    "/healthz",
                    "/livez",
                    "/readyz",
                    "/openapi",
                    "/openapi/*",
                    "/version",
                    "/version/",
                ]
                .map(String::from)
                .to_vec(),
            ),
            ..Default::default()
        };
        a.cluster_roles
            .insert("system:discovery".into(), vec![discovery]);
        a.cluster_bindings.push(ClusterRoleBinding {
            metadata: k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta {
                name: Some("system:discovery".into()),
                ..Default::default()
            },
            role_ref: RoleRef {
                api_group: "rbac.authorization.k8s.io".into(),
                kind: "ClusterRole".into(),
                name: "system:discovery".into(),
            },
            subjects: Some(vec![Subject {
                api_group: Some("rbac.authorization.k8s.io".into()),
                kind: "Group".into(),
                name: "system:authenticated".into(),
                namespace: None,
            }]),
        });
        a
    }

    /// The bootstrap roles plus every RBAC object in the `.yaml`/`.yml`
    /// files under `dir` (recursively).
    pub fn load_dir(dir: &Path) -> Result<Authorizer, RbacError> {
        let mut files = Vec::new();
        collect_yaml_files(dir, &mut files)?;
        files.sort();
        let mut a = Authorizer::bootstrap();
        for path in &files {
            let text = std::fs::read_to_string(path).map_err(|source| RbacError::ReadFile {
                path: path.clone(),
                source,
            })?;
            a.add_documents(path, &text)?;
        }
        a.aggregate();
        info!(
            dir = %dir.display(),
            files = files.len(),
            cluster_roles = a.cluster_roles.len(),
            roles = a.roles.len(),
            cluster_role_bindings = a.cluster_bindings.len(),
            role_bindings = a.role_bindings.len(),
            "loaded RBAC manifests"
        );
        Ok(a)
    }

    /// The bootstrap roles plus the RBAC objects of one multi-document
    /// YAML text.
    pub fn from_yaml(text: &str) -> Result<Authorizer, RbacError> {
        let mut a = Authorizer::bootstrap();
        a.add_documents(Path::new("<inline>"), text)?;
        a.aggregate();
        Ok(a)
    }

    /// Adds the RBAC objects of a multi-document YAML text; other kinds are
    /// ignored. `path` only names the source in errors.
    fn add_documents(&mut self, path: &Path, text: &str) -> Result<(), RbacError> {
        for doc in serde_yaml_ng::Deserializer::from_str(text) {
            let v = Value::deserialize(doc).map_err(|source| RbacError::ParseYaml {
                path: path.to_path_buf(),
                source,
            })?;
            if v.get("apiVersion").and_then(Value::as_str) != Some(RBAC_API_VERSION) {
                continue;
            }
            let kind = v
                .get("kind")
                .and_then(Value::as_str)
                .unwrap_or("")
                .to_string();
            let name = v
                .pointer("/metadata/name")
                .and_then(Value::as_str)
                .unwrap_or("")
                .to_string();
            let decode_err = |source| RbacError::Decode {
                path: path.to_path_buf(),
                kind: kind.clone(),
                name: name.clone(),
                source,
            };
            match kind.as_str() {
                "ClusterRole" => {
                    let r: ClusterRole = serde_json::from_value(v).map_err(decode_err)?;
                    self.cluster_roles
                        .insert(name.clone(), r.rules.unwrap_or_default());
                    self.cluster_role_labels
                        .insert(name.clone(), r.metadata.labels.unwrap_or_default());
                    if let Some(agg) = r.aggregation_rule {
                        // matchExpressions are not supported; matchLabels are.
                        let selectors = agg
                            .cluster_role_selectors
                            .unwrap_or_default()
                            .into_iter()
                            .map(|s| s.match_labels.unwrap_or_default())
                            .collect();
                        self.aggregations.push((name.clone(), selectors));
                    }
                }
                "Role" => {
                    let r: Role = serde_json::from_value(v).map_err(decode_err)?;
                    let ns = r.metadata.namespace.unwrap_or_default();
                    self.roles
                        .insert((ns, name.clone()), r.rules.unwrap_or_default());
                }
                "ClusterRoleBinding" => {
                    let b: ClusterRoleBinding = serde_json::from_value(v).map_err(decode_err)?;
                    self.cluster_bindings.push(b);
                }
                "RoleBinding" => {
                    let b: RoleBinding = serde_json::from_value(v).map_err(decode_err)?;
                    self.role_bindings.push(b);
                }
                _ => continue,
            }
            debug!(path = %path.display(), kind = %kind, name = %name, "RBAC object");
        }
        Ok(())
    }

    /// What the clusterrole-aggregation controller does: an aggregated
    /// ClusterRole gets the rules of every ClusterRole its selectors match.
    fn aggregate(&mut self) {
        for (name, selectors) in &self.aggregations {
            let mut rules = Vec::new();
            for (other, labels) in &self.cluster_role_labels {
                let selected = selectors.iter().any(|sel| {
                    !sel.is_empty() && sel.iter().all(|(k, v)| labels.get(k) == Some(v))
                });
                if other != name && selected {
                    rules.extend(self.cluster_roles.get(other).cloned().unwrap_or_default());
                }
            }
            self.cluster_roles.insert(name.clone(), rules);
        }
    }

    /// Whether `user` may make `req`. Members of `system:masters` may do
    /// anything.
    pub fn authorize(&self, user: &UserInfo, req: &Request<'_>) -> Decision {
        if user.is_master() {
            return Decision::Allow(format!("group {}", authn::MASTERS));
        }
        for b in &self.cluster_bindings {
            let subjects = b.subjects.as_deref().unwrap_or_default();
            if !subjects.iter().any(|s| applies_to(s, user, "")) {
                continue;
            }
            if b.role_ref.kind != "ClusterRole" {
                continue;
            }
            let rules = self.cluster_roles.get(&b.role_ref.name);
            if rules.is_some_and(|rules| rules.iter().any(|r| rule_allows(r, req))) {
                let name = b.metadata.name.as_deref().unwrap_or("");
                return Decision::Allow(format!(
                    "ClusterRoleBinding {name} of ClusterRole {}",
                    b.role_ref.name
                ));
            }
        }
        let Request::Resource { namespace, .. } = req else {
            return Decision::Deny;
        };
        if namespace.is_empty() {
            return Decision::Deny;
        }
        for b in &self.role_bindings {
            let binding_ns = b.metadata.namespace.as_deref().unwrap_or("");
            if binding_ns != *namespace {
                continue;
            }
            let subjects = b.subjects.as_deref().unwrap_or_default();
            if !subjects.iter().any(|s| applies_to(s, user, binding_ns)) {
                continue;
            }
            let rules = match b.role_ref.kind.as_str() {
                "ClusterRole" => self.cluster_roles.get(&b.role_ref.name),
                "Role" => self
                    .roles
                    .get(&(binding_ns.to_string(), b.role_ref.name.clone())),
                _ => None,
            };
            if rules.is_some_and(|rules| rules.iter().any(|r| rule_allows(r, req))) {
                let name = b.metadata.name.as_deref().unwrap_or("");
                return Decision::Allow(format!(
                    "RoleBinding {binding_ns}/{name} of {} {}",
                    b.role_ref.kind, b.role_ref.name
                ));
            }
        }
        Decision::Deny
    }
}

fn collect_yaml_files(dir: &Path, out: &mut Vec<PathBuf>) -> Result<(), RbacError> {
    let entries = std::fs::read_dir(dir).map_err(|source| RbacError::ReadDir {
        path: dir.to_path_buf(),
        source,
    })?;
    for entry in entries {
        let entry = entry.map_err(|source| RbacError::ReadDir {
            path: dir.to_path_buf(),
            source,
        })?;
        let path = entry.path();
        if path.is_dir() {
            collect_yaml_files(&path, out)?;
        } else if path.extension().is_some_and(|e| e == "yaml" || e == "yml") {
            out.push(path);
        }
    }
    Ok(())
}

/// kube-apiserver's `appliesTo`: a ServiceAccount subject without a
/// namespace takes the RoleBinding's.
fn applies_to(subject: &Subject, user: &UserInfo, binding_namespace: &str) -> bool {
    match subject.kind.as_str() {
        "User" => subject.name == user.name,
        "Group" => user.groups.contains(&subject.name),
        "ServiceAccount" => {
            let ns = subject
                .namespace
                .as_deref()
                .filter(|n| !n.is_empty())
                .unwrap_or(binding_namespace);
            !ns.is_empty() && authn::service_account(&user.name) == Some((ns, &subject.name))
        }
        _ => false,
    }
}

fn has(list: &[String], want: &str) -> bool {
    list.iter().any(|x| x == "*" || x == want)
}

/// kube-apiserver's `RuleAllows`.
pub fn rule_allows(rule: &PolicyRule, req: &Request<'_>) -> bool {
    match *req {
        Request::Resource {
            verb,
            group,
            resource,
            name,
            ..
        } => {
            let groups = rule.api_groups.as_deref().unwrap_or_default();
            let resources = rule.resources.as_deref().unwrap_or_default();
            let names = rule.resource_names.as_deref().unwrap_or_default();
            let subresource = resource.split_once('/').map(|(_, s)| s);
            let resource_ok = resources.iter().any(|r| {
                r == "*"
                    || r == resource
                    || subresource.is_some_and(|sub| r.strip_prefix("*/") == Some(sub))
            });
            let name_ok = names.is_empty() || (!name.is_empty() && names.iter().any(|n| n == name));
            has(&rule.verbs, verb) && has(groups, group) && resource_ok && name_ok
        }
        Request::NonResource { verb, path } => {
            let urls = rule.non_resource_urls.as_deref().unwrap_or_default();
            has(&rule.verbs, verb)
                && urls.iter().any(|u| {
                    u == "*"
                        || u == path
                        || u.strip_suffix('*')
                            .is_some_and(|prefix| path.starts_with(prefix))
                })
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const POLICY: &str = r#"
apiVersion: v1
kind: ServiceAccount
metadata: {name: sa, namespace: app}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata: {name: reader}
rules:
  - apiGroups: [""]
    resources: [services]
    verbs: [list, watch]
  - apiGroups: [""]
    resources: [services/status]
    verbs: [patch]
  - apiGroups: [""]
    resources: [nodes]
    resourceNames: [node-a]
    verbs: [get]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata: {name: reader}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: reader}
subjects:
  - {kind: ServiceAccount, name: sa, namespace: app}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: Role
metadata: {name: leases, namespace: app}
rules:
  - apiGroups: [coordination.k8s.io]
    resources: [leases]
    verbs: ["*"]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: RoleBinding
metadata: {name: leases, namespace: app}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: Role, name: leases}
subjects:
  - {kind: ServiceAccount, name: sa}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata: {name: agg}
aggregationRule:
  clusterRoleSelectors:
    - matchLabels: {rbac.example/aggregate: "true"}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata: {name: part, labels: {rbac.example/aggregate: "true"}}
rules:
  - apiGroups: [events.k8s.io]
    resources: ["*"]
    verbs: [create]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata: {name: agg}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: agg}
subjects:
  - {kind: Group, name: "system:serviceaccounts:app", apiGroup: rbac.authorization.k8s.io}
"#;

    fn sa() -> UserInfo {
        UserInfo::new("system:serviceaccount:app:sa", &[])
    }

    fn res<'a>(
        verb: &'a str,
        group: &'a str,
        resource: &'a str,
        ns: &'a str,
        name: &'a str,
    ) -> Request<'a> {
        Request::Resource {
            verb,
            group,
            resource,
            namespace: ns,
            name,
        }
    }

    fn allowed(user: &UserInfo, req: Request<'_>) -> bool {
        let a = Authorizer::from_yaml(POLICY).unwrap();
        matches!(a.authorize(user, &req), Decision::Allow(_))
    }

    #[test]
    fn cluster_role_binding_grants_listed_verbs_only() {
        assert!(allowed(&sa(), res("list", "", "services", "", "")));
        assert!(allowed(&sa(), res("watch", "", "services", "other", "")));
        assert!(!allowed(&sa(), res("get", "", "services", "other", "x")));
        assert!(!allowed(&sa(), res("update", "", "services", "app", "x")));
    }

    #[test]
    fn subresource_is_its_own_resource() {
        assert!(allowed(
            &sa(),
            res("patch", "", "services/status", "a", "x")
        ));
        assert!(!allowed(&sa(), res("patch", "", "services", "a", "x")));
    }

    #[test]
    fn resource_names_need_a_named_request() {
        assert!(allowed(&sa(), res("get", "", "nodes", "", "node-a")));
        assert!(!allowed(&sa(), res("get", "", "nodes", "", "node-b")));
    }

    #[test]
    fn role_binding_is_limited_to_its_namespace_and_defaults_the_sa_namespace() {
        let lease = |ns| res("create", "coordination.k8s.io", "leases", ns, "");
        assert!(allowed(&sa(), lease("app")));
        assert!(!allowed(&sa(), lease("default")));
        assert!(!allowed(
            &UserInfo::new("system:serviceaccount:other:sa", &[]),
            lease("app")
        ));
    }

    #[test]
    fn group_subjects_and_aggregation() {
        assert!(allowed(
            &sa(),
            res("create", "events.k8s.io", "events", "x", "")
        ));
        assert!(!allowed(
            &sa(),
            res("delete", "events.k8s.io", "events", "x", "e")
        ));
    }

    #[test]
    fn masters_bypass_and_strangers_are_denied() {
        let admin = UserInfo::new("admin", &["system:masters".into()]);
        assert!(allowed(&admin, res("delete", "", "nodes", "", "n")));
        let nobody = UserInfo::new("nobody", &[]);
        assert!(!allowed(&nobody, res("list", "", "services", "", "")));
    }

    #[test]
    fn discovery_is_open_to_authenticated_users() {
        let nobody = UserInfo::new("nobody", &[]);
        let get = |path| Request::NonResource { verb: "get", path };
        assert!(allowed(&nobody, get("/apis/discovery.k8s.io/v1")));
        assert!(allowed(&nobody, get("/version")));
        assert!(!allowed(&nobody, get("/metrics")));
    }

    #[test]
    fn wildcard_subresource_rule() {
        let rule = PolicyRule {
            api_groups: Some(vec!["".into()]),
            resources: Some(vec!["*/status".into()]),
            verbs: vec!["update".into()],
            ..Default::default()
        };
        assert!(rule_allows(
            &rule,
            &res("update", "", "nodes/status", "", "n")
        ));
        assert!(!rule_allows(&rule, &res("update", "", "nodes", "", "n")));
    }

    #[test]
    fn repository_manifests_load() {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../manifests");
        let a = Authorizer::load_dir(&dir).unwrap();
        let agent = UserInfo::new("system:serviceaccount:nodelb-system:nodelb", &[]);
        let ok = |req| matches!(a.authorize(&agent, &req), Decision::Allow(_));
        assert!(ok(res("list", "", "services", "", "")));
        assert!(ok(res("patch", "", "services/status", "a", "b")));
        assert!(!ok(res("update", "", "services", "a", "b")));
        assert!(ok(res(
            "create",
            "coordination.k8s.io",
            "leases",
            "nodelb-system",
            ""
        )));
        assert!(!ok(res(
            "create",
            "coordination.k8s.io",
            "leases",
            "default",
            ""
        )));
    }
}
