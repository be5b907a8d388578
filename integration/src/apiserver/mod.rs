//! An in-process double of kube-apiserver for end-to-end tests: the real
//! `nodelb-agent` (a kube-rs client with kube-runtime watchers) runs against
//! it. It behaves like kube-apiserver wherever a kube-rs client depends on
//! it: resourceVersions, list then watch with a bounded history and 410
//! `Expired`, label and field selectors, pagination, 409 on stale writes,
//! the status subresource, merge/JSON/apply patches with managedFields,
//! bearer-token authentication, RBAC from the repository's manifests, and an
//! audit log.
//!
//! Modules: [`resources`] (what is served), [`request`] (what a request
//! asks), [`authn`], [`rbac`], [`store`] (objects, resourceVersions,
//! history), [`selector`], [`patch`], [`apply`] (field ownership),
//! [`dropped_fields`], [`validation`], [`watch`], [`discovery`],
//! [`audit`], [`response`] (Status objects), [`server`] (HTTP),
//! [`kubeconfig`].

pub mod apply;
pub mod audit;
pub mod authn;
pub mod discovery;
pub mod dropped_fields;
pub mod kubeconfig;
pub mod patch;
pub mod rbac;
pub mod request;
pub mod resources;
pub mod response;
pub mod selector;
pub mod server;
pub mod store;
pub mod validation;
pub mod watch;

use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::{json, Value};

pub use audit::{AuditRecord, ObjectRef};
pub use response::ApiStatus;
pub use server::ServeError;

use self::resources::ResourceDef;
use self::store::{ListOptions, Preconditions, Store, WriteContext};

/// Namespaces every cluster starts with.
const INITIAL_NAMESPACES: &[&str] = &["default", "kube-system", "kube-public", "kube-node-lease"];

/// Field manager of writes made through [`ApiServer`]'s direct helpers.
const ADMIN_MANAGER: &str = "nodelb-api-double-admin";

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("loading RBAC manifests")]
    Rbac(#[from] rbac::RbacError),
    #[error("opening the audit log")]
    Audit(#[from] audit::AuditError),
    #[error("parsing drop_fields")]
    DropField(#[from] dropped_fields::InvalidPath),
    #[error("the double serves no {kind} in {api_version}")]
    UnknownKind { api_version: String, kind: String },
    #[error("{0}")]
    Api(#[from] ApiStatus),
}

/// How the double behaves.
#[derive(Debug, Clone)]
pub struct ApiServerConfig {
    /// Directory of YAML manifests whose RBAC objects are enforced. `None`:
    /// only kube-apiserver's bootstrap discovery roles, so only
    /// `system:masters` may touch resources.
    pub rbac_dir: Option<PathBuf>,
    /// `(token, user, groups)`.
    pub tokens: Vec<(String, String, Vec<String>)>,
    /// Watch history length (events, all resources together).
    pub history: usize,
    /// Interval of BOOKMARK events on watches that allow them.
    pub bookmark_interval: Duration,
    /// Fields stripped on write (`status.loadBalancer.ingress[].ipMode`), to
    /// imitate older API servers.
    pub drop_fields: Vec<String>,
    /// Reject objects kube-apiserver would reject (see [`validation`]).
    pub validate: bool,
    /// Served as Kubernetes 1.`version_minor`.
    pub version_minor: u32,
    /// Append audit records here as JSON lines.
    pub audit_file: Option<PathBuf>,
}

impl Default for ApiServerConfig {
    fn default() -> ApiServerConfig {
        ApiServerConfig {
            rbac_dir: None,
            tokens: Vec::new(),
            history: 1000,
            bookmark_interval: Duration::from_secs(60),
            drop_fields: Vec::new(),
            validate: false,
            version_minor: 33,
            audit_file: None,
        }
    }
}

/// Handle on a running double; cheap to clone.
#[derive(Clone)]
pub struct ApiServer {
    shared: Arc<server::Shared>,
}

impl std::fmt::Debug for ApiServer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ApiServer")
            .field("resource_version", &self.resource_version())
            .finish_non_exhaustive()
    }
}

fn admin_ctx() -> WriteContext {
    let now = k8s_openapi::jiff::Timestamp::now().as_second();
    WriteContext {
        manager: ADMIN_MANAGER.into(),
        now: k8s_openapi::jiff::Timestamp::from_second(now)
            .expect("current time is in range")
            .to_string(),
    }
}

fn resource_of(object: &Value) -> Result<&'static ResourceDef, Error> {
    let s = |k: &str| object.get(k).and_then(Value::as_str).unwrap_or("");
    resource_for(s("apiVersion"), s("kind"))
}

fn resource_for(api_version: &str, kind: &str) -> Result<&'static ResourceDef, Error> {
    resources::by_kind(api_version, kind).ok_or_else(|| Error::UnknownKind {
        api_version: api_version.to_string(),
        kind: kind.to_string(),
    })
}

fn meta<'a>(object: &'a Value, field: &str) -> &'a str {
    object
        .get("metadata")
        .and_then(|m| m.get(field))
        .and_then(Value::as_str)
        .unwrap_or("")
}

impl ApiServer {
    /// Loads RBAC, opens the audit file, and creates the namespaces every
    /// cluster has (`default`, `kube-system`, `kube-public`,
    /// `kube-node-lease`).
    pub fn new(cfg: ApiServerConfig) -> Result<ApiServer, Error> {
        let drop_fields = cfg
            .drop_fields
            .iter()
            .map(|p| dropped_fields::DroppedField::parse(p))
            .collect::<Result<Vec<_>, _>>()?;
        let authz = match &cfg.rbac_dir {
            Some(dir) => rbac::Authorizer::load_dir(dir)?,
            None => rbac::Authorizer::bootstrap(),
        };
        let mut store = Store::new(cfg.history, drop_fields, cfg.validate);
        let ns = resources::by_path("", "v1", "namespaces").expect("namespaces are served");
        for name in INITIAL_NAMESPACES {
            store
                .create(ns, "", json!({"metadata": {"name": name}}), &admin_ctx())
                .map_err(ApiStatus::from)?;
        }
        let shared = server::Shared {
            store: Arc::new(Mutex::new(store)),
            authn: authn::Authenticator::new(&cfg.tokens),
            authz,
            audit: audit::AuditLog::new(cfg.audit_file.as_deref())?,
            bookmark_interval: cfg.bookmark_interval,
            version_minor: cfg.version_minor,
        };
        Ok(ApiServer {
            shared: Arc::new(shared),
        })
    }

    /// Serves HTTP on `listener` until it fails. Call once per listener
    /// (for example in `tokio::spawn`, or use [`ApiServer::spawn`]).
    pub async fn serve(&self, listener: tokio::net::TcpListener) -> Result<(), ServeError> {
        server::serve(self.shared.clone(), listener).await
    }

    /// [`ApiServer::serve`] on a task of the current runtime.
    pub fn spawn(
        &self,
        listener: tokio::net::TcpListener,
    ) -> tokio::task::JoinHandle<Result<(), ServeError>> {
        let me = self.clone();
        tokio::spawn(async move { me.serve(listener).await })
    }

    /// Every request so far, oldest first.
    pub fn audit(&self) -> Vec<AuditRecord> {
        self.shared.audit.records()
    }

    /// The current global resourceVersion.
    pub fn resource_version(&self) -> u64 {
        self.store().resource_version()
    }

    fn store(&self) -> std::sync::MutexGuard<'_, Store> {
        self.shared.store.lock().expect("store lock")
    }

    /// Creates an object as the admin, without HTTP. The resource comes from
    /// `apiVersion` and `kind`, the namespace from `metadata.namespace`. An
    /// admin may set `metadata.creationTimestamp` (to control ages) and, for
    /// Nodes, `.status`; Services start with an empty status as on a real
    /// server (use [`ApiServer::update_status`]).
    pub fn create(&self, object: Value) -> Result<Value, Error> {
        let res = resource_of(&object)?;
        let ns = meta(&object, "namespace").to_string();
        Ok(self
            .store()
            .create(res, &ns, object, &admin_ctx())
            .map_err(ApiStatus::from)?)
    }

    /// Replaces an object (main resource; `.status` is kept) as the admin.
    /// A `metadata.resourceVersion` in `object` is checked (409 when stale).
    pub fn update(&self, object: Value) -> Result<Value, Error> {
        self.put(object, false)
    }

    /// Replaces an object's `.status` as the admin.
    pub fn update_status(&self, object: Value) -> Result<Value, Error> {
        self.put(object, true)
    }

    fn put(&self, object: Value, status: bool) -> Result<Value, Error> {
        let res = resource_of(&object)?;
        let ns = meta(&object, "namespace").to_string();
        let name = meta(&object, "name").to_string();
        Ok(self
            .store()
            .update(res, &ns, &name, object, status, &admin_ctx())
            .map_err(ApiStatus::from)?)
    }

    /// The stored object, if any. `namespace` is ignored for cluster-scoped
    /// kinds.
    pub fn get(
        &self,
        api_version: &str,
        kind: &str,
        namespace: &str,
        name: &str,
    ) -> Result<Option<Value>, Error> {
        let res = resource_for(api_version, kind)?;
        Ok(self.store().get(res, namespace, name).ok())
    }

    /// Every stored object of a kind (in `namespace`, or all when empty).
    pub fn list(
        &self,
        api_version: &str,
        kind: &str,
        namespace: &str,
    ) -> Result<Vec<Value>, Error> {
        let res = resource_for(api_version, kind)?;
        let list = self
            .store()
            .list(res, namespace, &Default::default(), &ListOptions::default())
            .map_err(ApiStatus::from)?;
        Ok(list["items"].as_array().cloned().unwrap_or_default())
    }

    /// Deletes an object as the admin; returns its last state.
    pub fn delete(
        &self,
        api_version: &str,
        kind: &str,
        namespace: &str,
        name: &str,
    ) -> Result<Value, Error> {
        let res = resource_for(api_version, kind)?;
        Ok(self
            .store()
            .delete(res, namespace, name, &Preconditions::default())
            .map_err(ApiStatus::from)?)
    }
}
