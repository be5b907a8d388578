//! The object store: every object as JSON keyed by resource, namespace and
//! name; one global resourceVersion counter that every write bumps; and a
//! bounded history of change events that watches are served from.
//!
//! All methods are synchronous and run under the store's lock; the clock
//! comes in through [`WriteContext`].

use std::collections::{BTreeMap, VecDeque};
use std::sync::Arc;

use serde_json::{json, Value};
use tokio::sync::watch;

use super::apply::{self, ApplyConflict, Writer};
use super::dropped_fields::DroppedField;
use super::patch::{self, PatchError, PatchKind};
use super::resources::{self, ResourceDef};
use super::response::ApiStatus;
use super::selector::Selectors;
use super::validation;

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("{resource} {namespace}/{name} not found")]
    NotFound {
        resource: &'static ResourceDef,
        namespace: String,
        name: String,
    },
    #[error("{resource} {namespace}/{name} already exists")]
    AlreadyExists {
        resource: &'static ResourceDef,
        namespace: String,
        name: String,
    },
    #[error("conflict writing {resource} {name}: {why}")]
    Conflict {
        resource: &'static ResourceDef,
        name: String,
        why: String,
    },
    #[error("server-side apply to {resource} {name}")]
    ApplyConflict {
        resource: &'static ResourceDef,
        name: String,
        #[source]
        source: ApplyConflict,
    },
    #[error("{resource} {name} is invalid: {causes:?}")]
    Invalid {
        resource: &'static ResourceDef,
        name: String,
        causes: Vec<String>,
    },
    #[error("bad request: {0}")]
    BadRequest(String),
    #[error("patching {resource} {name}")]
    Patch {
        resource: &'static ResourceDef,
        name: String,
        #[source]
        source: PatchError,
    },
    #[error("resourceVersion {requested} is older than the oldest retained event ({oldest})")]
    Expired { requested: u64, oldest: u64 },
    #[error("resourceVersion {requested} is newer than the current one ({current})")]
    TooLarge { requested: u64, current: u64 },
}

impl From<StoreError> for ApiStatus {
    fn from(e: StoreError) -> ApiStatus {
        match e {
            StoreError::NotFound { resource, name, .. } => {
                ApiStatus::not_found(resource.group, resource.resource, &name)
            }
            StoreError::AlreadyExists { resource, name, .. } => {
                ApiStatus::already_exists(resource.group, resource.resource, &name)
            }
            StoreError::Conflict {
                resource,
                name,
                why,
            } => ApiStatus::conflict(resource.group, resource.resource, &name, &why),
            StoreError::ApplyConflict {
                resource,
                name,
                source,
            } => ApiStatus::apply_conflict(resource.group, resource.resource, &name, &source),
            StoreError::Invalid {
                resource,
                name,
                causes,
            } => ApiStatus::invalid(resource.group, resource.kind, &name, &causes),
            StoreError::BadRequest(m) => ApiStatus::bad_request(m),
            StoreError::Patch {
                resource,
                name,
                source,
            } => {
                // The innermost cause says what was wrong with the body.
                let mut cause: &dyn std::error::Error = &source;
                while let Some(inner) = cause.source() {
                    cause = inner;
                }
                let message = format!("patching {resource} {name:?}: {source}: {cause}");
                match source {
                    // A well-formed JSON patch that cannot be applied (a
                    // failed `test`, a missing path) is 422, as upstream.
                    PatchError::JsonPatch(_) => {
                        ApiStatus::invalid(resource.group, resource.kind, &name, &[message])
                    }
                    _ => ApiStatus::bad_request(message),
                }
            }
            StoreError::Expired { requested, oldest } => {
                ApiStatus::expired(format!("too old resource version: {requested} ({oldest})"))
            }
            StoreError::TooLarge { requested, current } => ApiStatus {
                code: 504,
                reason: "Timeout",
                message: format!("Too large resource version: {requested}, current: {current}"),
                details: None,
            },
        }
    }
}

/// Where an object lives.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ObjectKey {
    pub resource: &'static ResourceDef,
    /// Empty for cluster-scoped objects.
    pub namespace: String,
    pub name: String,
}

/// The kind of a watch event.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EventType {
    Added,
    Modified,
    Deleted,
}

impl EventType {
    pub fn as_str(self) -> &'static str {
        match self {
            EventType::Added => "ADDED",
            EventType::Modified => "MODIFIED",
            EventType::Deleted => "DELETED",
        }
    }
}

/// One change, as kept in the history.
#[derive(Debug, Clone)]
pub struct StoredEvent {
    pub rv: u64,
    pub key: ObjectKey,
    pub kind: EventType,
    /// The object after the change (for `Deleted`, the last state, carrying
    /// the deletion's resourceVersion).
    pub object: Value,
    /// The object before a `Modified` change, so watches with selectors can
    /// tell an object that stopped matching.
    pub previous: Option<Value>,
}

/// Who writes and when.
#[derive(Debug, Clone)]
pub struct WriteContext {
    /// Field manager recorded in managedFields.
    pub manager: String,
    /// RFC 3339, seconds.
    pub now: String,
}

/// Delete preconditions (`DeleteOptions.preconditions`).
#[derive(Debug, Clone, Default)]
pub struct Preconditions {
    pub uid: Option<String>,
    pub resource_version: Option<String>,
}

/// Paging and consistency parameters of a list.
#[derive(Debug, Clone, Default)]
pub struct ListOptions {
    pub limit: Option<usize>,
    pub continue_token: Option<String>,
    pub resource_version: Option<String>,
    pub resource_version_match: Option<String>,
}

pub struct Store {
    objects: BTreeMap<ObjectKey, Value>,
    rv: u64,
    history: VecDeque<Arc<StoredEvent>>,
    history_cap: usize,
    /// resourceVersion of the newest event evicted from the history: a
    /// watch from an older version would miss events.
    compacted: u64,
    drop_fields: Vec<DroppedField>,
    validate: bool,
    notify: watch::Sender<u64>,
    uid_seed: u64,
}

impl Store {
    pub fn new(history_cap: usize, drop_fields: Vec<DroppedField>, validate: bool) -> Store {
        use std::hash::{BuildHasher, RandomState};
        Store {
            objects: BTreeMap::new(),
            rv: 0,
            history: VecDeque::new(),
            history_cap: history_cap.max(1),
            compacted: 0,
            drop_fields,
            validate,
            notify: watch::Sender::new(0),
            uid_seed: RandomState::new().hash_one("nodelb-api-double"),
        }
    }

    /// The current (newest) resourceVersion.
    pub fn resource_version(&self) -> u64 {
        self.rv
    }

    /// Changes whenever the resourceVersion does.
    pub fn subscribe(&self) -> watch::Receiver<u64> {
        self.notify.subscribe()
    }

    fn uid(&self) -> String {
        let a = self.uid_seed;
        let b = self.rv.wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ a.rotate_left(17);
        format!(
            "{:08x}-{:04x}-4{:03x}-8{:03x}-{:012x}",
            (a >> 32) as u32,
            (a >> 16) as u16,
            (b >> 52) & 0xfff,
            (b >> 40) & 0xfff,
            b & 0xffff_ffff_ffff
        )
    }

    pub fn get(
        &self,
        resource: &'static ResourceDef,
        namespace: &str,
        name: &str,
    ) -> Result<Value, StoreError> {
        let key = key(resource, namespace, name);
        self.objects
            .get(&key)
            .cloned()
            .ok_or_else(|| not_found(&key))
    }

    /// A list object (`ServiceList`), paged by `limit` and `continue`.
    /// `namespace` empty lists all namespaces.
    ///
    /// Unlike kube-apiserver, later pages are read from the current state,
    /// not a snapshot at the first page's resourceVersion: objects created
    /// meanwhile may appear and deleted ones be missing. The list
    /// resourceVersion stays the first page's, so a watch from it still
    /// delivers every change.
    pub fn list(
        &self,
        resource: &'static ResourceDef,
        namespace: &str,
        selectors: &Selectors,
        opts: &ListOptions,
    ) -> Result<Value, StoreError> {
        let requested = match opts.resource_version.as_deref() {
            None | Some("") => None,
            Some(s) => Some(parse_rv(s)?),
        };
        if let Some(requested) = requested.filter(|r| *r > self.rv) {
            return Err(StoreError::TooLarge {
                requested,
                current: self.rv,
            });
        }
        if opts.resource_version_match.as_deref() == Some("Exact")
            && requested.is_some_and(|r| r != self.rv)
        {
            return Err(StoreError::Expired {
                requested: requested.unwrap_or(0),
                oldest: self.rv,
            });
        }
        let (list_rv, after) = match opts.continue_token.as_deref() {
            Some(token) if !token.is_empty() => {
                let (rv, ns, name) = decode_continue(token).ok_or_else(|| {
                    StoreError::BadRequest(format!("invalid continue token {token:?}"))
                })?;
                if rv < self.compacted {
                    return Err(StoreError::Expired {
                        requested: rv,
                        oldest: self.compacted,
                    });
                }
                (rv, Some(key(resource, &ns, &name)))
            }
            _ => (self.rv, None),
        };
        let mut matching = self
            .objects
            .iter()
            .filter(|(k, _)| k.resource == resource)
            .filter(|(k, _)| namespace.is_empty() || k.namespace == namespace)
            .filter(|(k, _)| after.as_ref().is_none_or(|a| *k > a))
            .filter(|(_, v)| selectors.matches(v));
        let limit = opts.limit.filter(|l| *l > 0).unwrap_or(usize::MAX);
        let mut items = Vec::new();
        let mut last_key = None;
        for (k, v) in matching.by_ref().take(limit) {
            items.push(v.clone());
            last_key = Some(k);
        }
        let remaining = matching.count();
        let mut metadata = json!({ "resourceVersion": list_rv.to_string() });
        if remaining > 0 {
            if let Some(k) = last_key {
                metadata["continue"] = json!(encode_continue(list_rv, &k.namespace, &k.name));
                if selectors.labels.0.is_empty() && selectors.fields == Default::default() {
                    metadata["remainingItemCount"] = json!(remaining);
                }
            }
        }
        Ok(json!({
            "kind": resource.list_kind(),
            "apiVersion": resource.api_version(),
            "metadata": metadata,
            "items": items,
        }))
    }

    /// Objects of a resource (in a namespace, or all when empty), with the
    /// current resourceVersion.
    pub fn snapshot(&self, resource: &'static ResourceDef, namespace: &str) -> (Vec<Value>, u64) {
        let items = self
            .objects
            .iter()
            .filter(|(k, _)| k.resource == resource)
            .filter(|(k, _)| namespace.is_empty() || k.namespace == namespace)
            .map(|(_, v)| v.clone())
            .collect();
        (items, self.rv)
    }

    /// Events of a resource (in a namespace, or all) newer than `after`,
    /// and the resourceVersion they bring the watcher up to.
    pub fn events_after(
        &self,
        resource: &'static ResourceDef,
        namespace: &str,
        after: u64,
    ) -> Result<(Vec<Arc<StoredEvent>>, u64), StoreError> {
        if after < self.compacted {
            return Err(StoreError::Expired {
                requested: after,
                oldest: self.compacted,
            });
        }
        let events = self
            .history
            .iter()
            .filter(|e| e.rv > after)
            .filter(|e| e.key.resource == resource)
            .filter(|e| namespace.is_empty() || e.key.namespace == namespace)
            .cloned()
            .collect();
        Ok((events, self.rv.max(after)))
    }

    pub fn create(
        &mut self,
        resource: &'static ResourceDef,
        path_namespace: &str,
        body: Value,
        ctx: &WriteContext,
    ) -> Result<Value, StoreError> {
        self.create_with(resource, path_namespace, body, ctx, false)
    }

    /// Create; `applied` keeps the managedFields server-side apply computed
    /// instead of recording an `Update` entry.
    fn create_with(
        &mut self,
        resource: &'static ResourceDef,
        path_namespace: &str,
        body: Value,
        ctx: &WriteContext,
        applied: bool,
    ) -> Result<Value, StoreError> {
        let mut obj = self.check_body(resource, path_namespace, None, body)?;
        if obj
            .pointer("/metadata/name")
            .and_then(Value::as_str)
            .unwrap_or("")
            .is_empty()
        {
            let prefix = obj
                .pointer("/metadata/generateName")
                .and_then(Value::as_str)
                .unwrap_or("")
                .to_string();
            if prefix.is_empty() {
                return Err(StoreError::Invalid {
                    resource,
                    name: String::new(),
                    causes: vec![
                        "metadata.name: Required value: name or generateName is required".into(),
                    ],
                });
            }
            let suffix = &self.uid().replace('-', "")[27..32];
            obj["metadata"]["name"] = json!(format!("{prefix}{suffix}"));
        }
        let key = key_of(resource, &obj);
        if self.objects.contains_key(&key) {
            return Err(StoreError::AlreadyExists {
                resource,
                namespace: key.namespace,
                name: key.name,
            });
        }
        if resource.namespaced {
            let ns_def = resources::by_path("", "v1", "namespaces").expect("namespaces are served");
            if !self
                .objects
                .contains_key(&self::key(ns_def, "", &key.namespace))
            {
                return Err(StoreError::NotFound {
                    resource: ns_def,
                    namespace: String::new(),
                    name: key.namespace,
                });
            }
        }
        if let Some(status) = resource.initial_status {
            obj["status"] = serde_json::from_str(status).expect("initial status is JSON");
        }
        let meta = obj["metadata"]
            .as_object_mut()
            .expect("checked by check_body");
        if !applied {
            meta.remove("managedFields");
        }
        meta.remove("resourceVersion");
        meta.insert("uid".into(), json!(self.uid()));
        meta.insert("generation".into(), json!(1));
        if meta
            .get("creationTimestamp")
            .and_then(Value::as_str)
            .is_none()
        {
            meta.insert("creationTimestamp".into(), json!(ctx.now));
        }
        if !applied {
            apply::record_update(None, &mut obj, &writer(resource, "", ctx));
        }
        self.finish(key, None, obj)
    }

    /// PUT. `status` true for the status subresource.
    pub fn update(
        &mut self,
        resource: &'static ResourceDef,
        namespace: &str,
        name: &str,
        body: Value,
        status: bool,
        ctx: &WriteContext,
    ) -> Result<Value, StoreError> {
        let key = key(resource, namespace, name);
        let old = self
            .objects
            .get(&key)
            .cloned()
            .ok_or_else(|| not_found(&key))?;
        let body = self.check_body(resource, namespace, Some(name), body)?;
        check_resource_version(&key, &old, &body)?;
        let mut new = merge_for_subresource(resource, &old, body, status);
        apply::record_update(Some(&old), &mut new, &writer(resource, sub(status), ctx));
        self.finish(key, Some(old), new)
    }

    /// PATCH: merge, strategic-merge and JSON patches change an existing
    /// object; apply creates a missing one. Returns the object and whether it
    /// was created.
    #[allow(clippy::too_many_arguments)]
    pub fn patch(
        &mut self,
        resource: &'static ResourceDef,
        namespace: &str,
        name: &str,
        kind: PatchKind,
        body: &[u8],
        status: bool,
        force: bool,
        ctx: &WriteContext,
    ) -> Result<(Value, bool), StoreError> {
        let key = key(resource, namespace, name);
        let patch_err = |source| StoreError::Patch {
            resource,
            name: name.to_string(),
            source,
        };
        let old = self.objects.get(&key).cloned();
        if kind != PatchKind::Apply {
            let old = old.ok_or_else(|| not_found(&key))?;
            let patched = patch::apply_patch(kind, &old, body).map_err(patch_err)?;
            let patched = self.check_body(resource, namespace, Some(name), patched)?;
            check_resource_version(&key, &old, &patched)?;
            let mut new = merge_for_subresource(resource, &old, patched, status);
            apply::record_update(Some(&old), &mut new, &writer(resource, sub(status), ctx));
            return self.finish(key, Some(old), new).map(|v| (v, false));
        }

        let applied = patch::decode_apply_body(body).map_err(patch_err)?;
        for field in ["apiVersion", "kind"] {
            if applied.get(field).and_then(Value::as_str).is_none() {
                return Err(StoreError::BadRequest(format!(
                    "{field} must be set in a server-side apply body"
                )));
            }
        }
        let applied = self.check_body(resource, namespace, Some(name), applied)?;
        if let Some(old) = &old {
            check_resource_version(&key, old, &applied)?;
        }
        let scoped = match (status, resource.status_subresource) {
            (true, _) => json!({ "status": applied.get("status").cloned().unwrap_or(json!({})) }),
            (false, true) => {
                let mut a = applied.clone();
                a.as_object_mut().map(|m| m.remove("status"));
                a
            }
            (false, false) => applied.clone(),
        };
        let who = writer(resource, sub(status), ctx);
        match old {
            Some(old) => {
                let merged = apply::apply(Some(&old), &scoped, &who, force).map_err(|source| {
                    StoreError::ApplyConflict {
                        resource,
                        name: name.to_string(),
                        source,
                    }
                })?;
                let new = merge_for_subresource(resource, &old, merged, status);
                self.finish(key, Some(old), new).map(|v| (v, false))
            }
            None if status => Err(not_found(&key)),
            None => {
                let merged = apply::apply(None, &scoped, &who, force).map_err(|source| {
                    StoreError::ApplyConflict {
                        resource,
                        name: name.to_string(),
                        source,
                    }
                })?;
                let created = self.create_with(resource, namespace, merged, ctx, true)?;
                Ok((created, true))
            }
        }
    }

    pub fn delete(
        &mut self,
        resource: &'static ResourceDef,
        namespace: &str,
        name: &str,
        pre: &Preconditions,
    ) -> Result<Value, StoreError> {
        let key = key(resource, namespace, name);
        let old = self
            .objects
            .get(&key)
            .cloned()
            .ok_or_else(|| not_found(&key))?;
        let meta = |f: &str| {
            old.pointer(&format!("/metadata/{f}"))
                .and_then(Value::as_str)
        };
        if pre.uid.as_deref().is_some_and(|u| Some(u) != meta("uid")) {
            return Err(StoreError::Conflict {
                resource,
                name: name.to_string(),
                why: "Precondition failed: UID in precondition does not match the UID in record"
                    .into(),
            });
        }
        if pre
            .resource_version
            .as_deref()
            .is_some_and(|rv| Some(rv) != meta("resourceVersion"))
        {
            return Err(StoreError::Conflict {
                resource,
                name: name.to_string(),
                why: "Precondition failed: ResourceVersion in precondition does not match the ResourceVersion in record".into(),
            });
        }
        if resource.resource == "namespaces" {
            // The namespace controller's job, done at once: everything in
            // the namespace goes with it.
            let inside: Vec<ObjectKey> = self
                .objects
                .keys()
                .filter(|k| k.resource.namespaced && k.namespace == name)
                .cloned()
                .collect();
            for k in inside {
                if let Some(v) = self.objects.remove(&k) {
                    self.record(k, EventType::Deleted, v, None);
                }
            }
        }
        let removed = self.objects.remove(&key).expect("checked above");
        Ok(self.record(key, EventType::Deleted, removed, None))
    }

    /// Validates the request body against the resource and the path:
    /// `apiVersion`/`kind` when set, namespace, name. Fills `apiVersion`,
    /// `kind` and the namespace from the path.
    fn check_body(
        &self,
        resource: &'static ResourceDef,
        path_namespace: &str,
        path_name: Option<&str>,
        mut body: Value,
    ) -> Result<Value, StoreError> {
        let bad = |m: String| Err(StoreError::BadRequest(m));
        let Some(obj) = body.as_object_mut() else {
            return bad("the request body is not a JSON object".into());
        };
        for (field, want) in [
            ("apiVersion", resource.api_version()),
            ("kind", resource.kind.to_string()),
        ] {
            match obj.get(field).and_then(Value::as_str) {
                Some(got) if got != want => {
                    return bad(format!(
                        "{field} {got:?} does not match the path ({want:?})"
                    ))
                }
                _ => {
                    obj.insert(field.into(), json!(want));
                }
            }
        }
        let meta = obj
            .entry("metadata")
            .or_insert_with(|| json!({}))
            .as_object_mut()
            .ok_or_else(|| StoreError::BadRequest("metadata is not an object".into()))?;
        if resource.namespaced {
            match meta.get("namespace").and_then(Value::as_str) {
                Some(ns) if !ns.is_empty() && ns != path_namespace => {
                    return bad(format!(
                        "the namespace of the provided object ({ns}) does not match the namespace sent on the request ({path_namespace})"
                    ));
                }
                _ => {
                    meta.insert("namespace".into(), json!(path_namespace));
                }
            }
            if path_namespace.is_empty() {
                return bad("a namespaced object needs a namespace in the path".into());
            }
        } else {
            meta.remove("namespace");
        }
        if let Some(path_name) = path_name {
            match meta.get("name").and_then(Value::as_str) {
                Some(n) if n != path_name => {
                    return bad(format!(
                        "the name of the object ({n}) does not match the name on the URL ({path_name})"
                    ));
                }
                _ => {
                    meta.insert("name".into(), json!(path_name));
                }
            }
        }
        Ok(body)
    }

    /// Strips dropped fields, validates, bumps the resourceVersion and
    /// stores; a write that changes nothing is not stored (no new
    /// resourceVersion, no event), as in kube-apiserver.
    fn finish(
        &mut self,
        key: ObjectKey,
        old: Option<Value>,
        mut new: Value,
    ) -> Result<Value, StoreError> {
        for f in &self.drop_fields {
            f.strip(&mut new);
        }
        if self.validate {
            let causes = validation::validate(key.resource, &new);
            if !causes.is_empty() {
                return Err(StoreError::Invalid {
                    resource: key.resource,
                    name: key.name,
                    causes,
                });
            }
        }
        if let Some(old) = &old {
            if without_volatile(old) == without_volatile(&new) {
                return Ok(old.clone());
            }
            let generation = old
                .pointer("/metadata/generation")
                .and_then(Value::as_i64)
                .unwrap_or(1);
            let bumped = if spec_of(old) != spec_of(&new) {
                generation + 1
            } else {
                generation
            };
            new["metadata"]["generation"] = json!(bumped);
        }
        let kind = if old.is_some() {
            EventType::Modified
        } else {
            EventType::Added
        };
        Ok(self.record(key, kind, new, old))
    }

    /// Bumps the resourceVersion, stamps it on the object, stores it (except
    /// for deletions) and appends the event to the history.
    fn record(
        &mut self,
        key: ObjectKey,
        kind: EventType,
        mut object: Value,
        previous: Option<Value>,
    ) -> Value {
        self.rv += 1;
        object["metadata"]["resourceVersion"] = json!(self.rv.to_string());
        if kind != EventType::Deleted {
            self.objects.insert(key.clone(), object.clone());
        }
        self.history.push_back(Arc::new(StoredEvent {
            rv: self.rv,
            key,
            kind,
            object: object.clone(),
            previous,
        }));
        while self.history.len() > self.history_cap {
            if let Some(e) = self.history.pop_front() {
                self.compacted = e.rv;
            }
        }
        self.notify.send_replace(self.rv);
        object
    }
}

fn key(resource: &'static ResourceDef, namespace: &str, name: &str) -> ObjectKey {
    ObjectKey {
        resource,
        namespace: if resource.namespaced {
            namespace.to_string()
        } else {
            String::new()
        },
        name: name.to_string(),
    }
}

fn key_of(resource: &'static ResourceDef, obj: &Value) -> ObjectKey {
    let s = |p: &str| obj.pointer(p).and_then(Value::as_str).unwrap_or("");
    key(resource, s("/metadata/namespace"), s("/metadata/name"))
}

fn not_found(key: &ObjectKey) -> StoreError {
    StoreError::NotFound {
        resource: key.resource,
        namespace: key.namespace.clone(),
        name: key.name.clone(),
    }
}

fn sub(status: bool) -> &'static str {
    if status {
        "status"
    } else {
        ""
    }
}

fn writer<'a>(resource: &ResourceDef, subresource: &'a str, ctx: &'a WriteContext) -> Writer<'a> {
    Writer {
        manager: &ctx.manager,
        subresource,
        api_version: resource.api_version(),
        time: &ctx.now,
    }
}

fn parse_rv(s: &str) -> Result<u64, StoreError> {
    s.parse()
        .map_err(|_| StoreError::BadRequest(format!("invalid resourceVersion {s:?}")))
}

/// 409 when the body names a resourceVersion other than the stored one.
fn check_resource_version(key: &ObjectKey, old: &Value, body: &Value) -> Result<(), StoreError> {
    let sent = body
        .pointer("/metadata/resourceVersion")
        .and_then(Value::as_str)
        .unwrap_or("");
    let stored = old
        .pointer("/metadata/resourceVersion")
        .and_then(Value::as_str)
        .unwrap_or("");
    if !sent.is_empty() && sent != stored {
        return Err(StoreError::Conflict {
            resource: key.resource,
            name: key.name.clone(),
            why: "the object has been modified; please apply your changes to the latest version and try again".into(),
        });
    }
    Ok(())
}

/// The object a write stores: for a status write, the old object with the
/// new `.status`; for a main-resource write of a resource with a status
/// subresource, the new object with the old `.status`; server-owned
/// metadata always from the old object.
fn merge_for_subresource(resource: &ResourceDef, old: &Value, new: Value, status: bool) -> Value {
    let mut out = if status {
        let mut o = old.clone();
        match new.get("status") {
            Some(s) => o["status"] = s.clone(),
            None => {
                o.as_object_mut().map(|m| m.remove("status"));
            }
        }
        if let Some(mf) = new.pointer("/metadata/managedFields") {
            o["metadata"]["managedFields"] = mf.clone();
        }
        o
    } else {
        let mut n = new;
        if resource.status_subresource {
            match old.get("status") {
                Some(s) => n["status"] = s.clone(),
                None => {
                    n.as_object_mut().map(|m| m.remove("status"));
                }
            }
        }
        n
    };
    for f in ["uid", "creationTimestamp", "generation", "resourceVersion"] {
        match old.pointer(&format!("/metadata/{f}")) {
            Some(v) => out["metadata"][f] = v.clone(),
            None => {
                out["metadata"].as_object_mut().map(|m| m.remove(f));
            }
        }
    }
    out
}

/// The object without resourceVersion and managedFields timestamps, to
/// decide whether a write changed anything.
fn without_volatile(v: &Value) -> Value {
    let mut v = v.clone();
    if let Some(meta) = v.get_mut("metadata").and_then(Value::as_object_mut) {
        meta.remove("resourceVersion");
        if let Some(mf) = meta.get_mut("managedFields").and_then(Value::as_array_mut) {
            for e in mf {
                e.as_object_mut().map(|m| m.remove("time"));
            }
        }
    }
    v
}

/// Everything but metadata and status: what bumps `metadata.generation`.
fn spec_of(v: &Value) -> Value {
    let mut v = v.clone();
    if let Some(m) = v.as_object_mut() {
        m.remove("metadata");
        m.remove("status");
    }
    v
}

fn encode_continue(rv: u64, namespace: &str, name: &str) -> String {
    format!("{rv}/{namespace}/{name}")
        .bytes()
        .map(|b| format!("{b:02x}"))
        .collect()
}

fn decode_continue(token: &str) -> Option<(u64, String, String)> {
    if !token.len().is_multiple_of(2) {
        return None;
    }
    let bytes: Option<Vec<u8>> = (0..token.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(token.get(i..i + 2)?, 16).ok())
        .collect();
    let text = String::from_utf8(bytes?).ok()?;
    let mut parts = text.splitn(3, '/');
    let rv = parts.next()?.parse().ok()?;
    Some((rv, parts.next()?.to_string(), parts.next()?.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn res(kind: &str) -> &'static ResourceDef {
        resources::RESOURCES
            .iter()
            .find(|r| r.kind == kind)
            .unwrap()
    }

    fn ctx() -> WriteContext {
        WriteContext {
            manager: "test".into(),
            now: "2024-01-01T00:00:00Z".into(),
        }
    }

    fn store_with_ns() -> Store {
        let mut s = Store::new(100, vec![], false);
        s.create(
            res("Namespace"),
            "",
            json!({"metadata": {"name": "ns"}}),
            &ctx(),
        )
        .unwrap();
        s
    }

    fn svc(name: &str) -> Value {
        json!({"metadata": {"name": name}, "spec": {"type": "LoadBalancer"}})
    }

    #[test]
    fn every_write_bumps_the_global_resource_version() {
        let mut s = store_with_ns();
        let a = s.create(res("Service"), "ns", svc("a"), &ctx()).unwrap();
        assert_eq!(a["metadata"]["resourceVersion"], "2");
        assert_eq!(a["metadata"]["namespace"], "ns");
        assert_eq!(a["metadata"]["generation"], 1);
        assert_eq!(a["status"], json!({"loadBalancer": {}}));
        let mut b = a.clone();
        b["spec"]["type"] = json!("ClusterIP");
        let b = s
            .update(res("Service"), "ns", "a", b, false, &ctx())
            .unwrap();
        assert_eq!(b["metadata"]["resourceVersion"], "3");
        assert_eq!(b["metadata"]["generation"], 2);
        assert_eq!(b["metadata"]["uid"], a["metadata"]["uid"]);
    }

    #[test]
    fn stale_resource_version_conflicts() {
        let mut s = store_with_ns();
        let a = s.create(res("Service"), "ns", svc("a"), &ctx()).unwrap();
        let mut b = a.clone();
        b["spec"]["x"] = json!(1);
        s.update(res("Service"), "ns", "a", b, false, &ctx())
            .unwrap();
        let err = s
            .update(res("Service"), "ns", "a", a, false, &ctx())
            .unwrap_err();
        assert!(matches!(err, StoreError::Conflict { .. }), "{err}");
    }

    #[test]
    fn status_writes_and_main_writes_are_isolated() {
        let mut s = store_with_ns();
        let a = s.create(res("Service"), "ns", svc("a"), &ctx()).unwrap();
        let mut st = a.clone();
        st["status"] = json!({"loadBalancer": {"ingress": [{"ip": "192.0.2.1"}]}});
        st["spec"]["type"] = json!("NodePort");
        let after = s
            .update(res("Service"), "ns", "a", st, true, &ctx())
            .unwrap();
        assert_eq!(after["spec"]["type"], "LoadBalancer");
        assert_eq!(
            after["status"]["loadBalancer"]["ingress"][0]["ip"],
            "192.0.2.1"
        );
        let mut main = after.clone();
        main["status"] = json!({});
        let after2 = s
            .update(res("Service"), "ns", "a", main, false, &ctx())
            .unwrap();
        assert_eq!(
            after2["status"]["loadBalancer"]["ingress"][0]["ip"],
            "192.0.2.1"
        );
    }

    #[test]
    fn no_op_write_keeps_the_resource_version() {
        let mut s = store_with_ns();
        let a = s.create(res("Service"), "ns", svc("a"), &ctx()).unwrap();
        let again = s
            .update(res("Service"), "ns", "a", a.clone(), false, &ctx())
            .unwrap();
        assert_eq!(
            again["metadata"]["resourceVersion"],
            a["metadata"]["resourceVersion"]
        );
    }

    #[test]
    fn missing_namespace_and_duplicates_are_refused() {
        let mut s = store_with_ns();
        let e = s
            .create(res("Service"), "nope", svc("a"), &ctx())
            .unwrap_err();
        assert!(matches!(e, StoreError::NotFound { name, .. } if name == "nope"));
        s.create(res("Service"), "ns", svc("a"), &ctx()).unwrap();
        let e = s
            .create(res("Service"), "ns", svc("a"), &ctx())
            .unwrap_err();
        assert!(matches!(e, StoreError::AlreadyExists { .. }));
    }

    #[test]
    fn pagination_walks_all_objects_once() {
        let mut s = store_with_ns();
        for n in ["e", "b", "d", "a", "c"] {
            s.create(res("Service"), "ns", svc(n), &ctx()).unwrap();
        }
        let mut names = Vec::new();
        let mut opts = ListOptions {
            limit: Some(2),
            ..Default::default()
        };
        loop {
            let page = s
                .list(res("Service"), "ns", &Selectors::default(), &opts)
                .unwrap();
            assert_eq!(page["metadata"]["resourceVersion"], "6");
            for i in page["items"].as_array().unwrap() {
                names.push(i["metadata"]["name"].as_str().unwrap().to_string());
            }
            match page["metadata"]["continue"].as_str() {
                Some(c) => opts.continue_token = Some(c.to_string()),
                None => break,
            }
        }
        assert_eq!(names, vec!["a", "b", "c", "d", "e"]);
    }

    #[test]
    fn history_eviction_expires_old_watch_positions() {
        let mut s = Store::new(3, vec![], false);
        for i in 0..5 {
            s.create(
                res("Namespace"),
                "",
                json!({"metadata": {"name": format!("n{i}")}}),
                &ctx(),
            )
            .unwrap();
        }
        assert!(matches!(
            s.events_after(res("Namespace"), "", 1),
            Err(StoreError::Expired {
                requested: 1,
                oldest: 2
            })
        ));
        let (events, head) = s.events_after(res("Namespace"), "", 2).unwrap();
        assert_eq!((events.len(), head), (3, 5));
    }

    #[test]
    fn drop_fields_are_stripped_on_write() {
        let mut s = Store::new(
            10,
            vec![DroppedField::parse("status.loadBalancer.ingress[].ipMode").unwrap()],
            false,
        );
        s.create(
            res("Namespace"),
            "",
            json!({"metadata": {"name": "ns"}}),
            &ctx(),
        )
        .unwrap();
        s.create(res("Service"), "ns", svc("a"), &ctx()).unwrap();
        let (out, _) = s
            .patch(
                res("Service"),
                "ns",
                "a",
                PatchKind::Merge,
                br#"{"status":{"loadBalancer":{"ingress":[{"ip":"192.0.2.1","ipMode":"Proxy"}]}}}"#,
                true,
                false,
                &ctx(),
            )
            .unwrap();
        assert_eq!(
            out["status"]["loadBalancer"]["ingress"],
            json!([{"ip": "192.0.2.1"}])
        );
    }

    #[test]
    fn validation_only_when_enabled() {
        let bad = json!({"metadata": {"name": "a"}, "spec": {"ports": [{"port": 0}]}});
        let mut lax = store_with_ns();
        assert!(lax
            .create(res("Service"), "ns", bad.clone(), &ctx())
            .is_ok());
        let mut strict = Store::new(10, vec![], true);
        strict
            .create(
                res("Namespace"),
                "",
                json!({"metadata": {"name": "ns"}}),
                &ctx(),
            )
            .unwrap();
        assert!(matches!(
            strict.create(res("Service"), "ns", bad, &ctx()),
            Err(StoreError::Invalid { .. })
        ));
    }

    #[test]
    fn deleting_a_namespace_deletes_its_objects() {
        let mut s = store_with_ns();
        s.create(res("Service"), "ns", svc("a"), &ctx()).unwrap();
        s.delete(res("Namespace"), "", "ns", &Preconditions::default())
            .unwrap();
        assert!(s.get(res("Service"), "ns", "a").is_err());
    }

    #[test]
    fn continue_token_round_trip() {
        let t = encode_continue(42, "ns", "a.b");
        assert_eq!(decode_continue(&t), Some((42, "ns".into(), "a.b".into())));
        assert_eq!(decode_continue("zz"), None);
    }
}
