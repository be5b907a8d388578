//! The HTTP front: authenticate, classify, authorize, dispatch to the store
//! or a watch, answer, audit. One axum fallback handler, since the paths are
//! decided by [`super::request::classify`] as kube-apiserver decides them.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::extract::{ConnectInfo, Query as QueryExtractor, State};
use axum::http::{header, HeaderMap, Method, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use axum::Router;
use serde_json::{json, Value};
use tracing::{debug, info};

use super::audit::{AuditLog, AuditRecord, ObjectRef};
use super::authn::{Authenticator, UserInfo};
use super::discovery;
use super::patch::PatchKind;
use super::rbac::{self, Authorizer, Decision};
use super::request::{self, Query, RequestInfo, ResourceRequest};
use super::resources::{self, ResourceDef};
use super::response::{json_response, ApiStatus};
use super::selector::Selectors;
use super::store::{ListOptions, Preconditions, Store, WriteContext};
use super::watch::{self, WatchRequest};

/// kube-apiserver's default `--min-request-timeout`: the longest a watch
/// without `timeoutSeconds` lasts.
const DEFAULT_WATCH_TIMEOUT: Duration = Duration::from_secs(1800);

#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    #[error("serving HTTP on {addr}")]
    Serve {
        addr: String,
        #[source]
        source: std::io::Error,
    },
}

/// State shared by every connection.
pub struct Shared {
    pub store: Arc<Mutex<Store>>,
    pub authn: Authenticator,
    pub authz: Authorizer,
    pub audit: AuditLog,
    pub bookmark_interval: Duration,
    pub version_minor: u32,
}

/// Serves `listener` until it fails.
pub async fn serve(
    shared: Arc<Shared>,
    listener: tokio::net::TcpListener,
) -> Result<(), ServeError> {
    let addr = listener
        .local_addr()
        .map(|a| a.to_string())
        .unwrap_or_else(|_| "?".into());
    info!(%addr, "API double listening");
    let app = Router::new().fallback(handle).with_state(shared);
    axum::serve(
        listener,
        app.into_make_service_with_connect_info::<SocketAddr>(),
    )
    .await
    .map_err(|source| ServeError::Serve { addr, source })
}

/// RFC 3339 now, seconds (object timestamps) or sub-second (audit).
fn now(precise: bool) -> String {
    let ts = k8s_openapi::jiff::Timestamp::now();
    if precise {
        ts.to_string()
    } else {
        k8s_openapi::jiff::Timestamp::from_second(ts.as_second())
            .expect("current time is in range")
            .to_string()
    }
}

/// The outcome of one request, before auditing.
struct Outcome {
    code: u16,
    response: Response,
    object: Option<ObjectRef>,
}

impl Outcome {
    fn status(s: ApiStatus) -> Outcome {
        Outcome {
            code: s.code,
            response: s.into_response(),
            object: None,
        }
    }

    fn json(code: StatusCode, body: &Value) -> Outcome {
        Outcome {
            code: code.as_u16(),
            response: json_response(code, body),
            object: None,
        }
    }
}

async fn handle(
    State(shared): State<Arc<Shared>>,
    ConnectInfo(peer): ConnectInfo<SocketAddr>,
    method: Method,
    uri: Uri,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let query: Query = QueryExtractor::<Vec<(String, String)>>::try_from_uri(&uri)
        .map(|q| q.0.into_iter().collect())
        .unwrap_or_default();
    let info = request::classify(method.as_str(), uri.path(), &query);
    let verb = match &info {
        RequestInfo::Resource(r) => r.verb.to_string(),
        RequestInfo::NonResource { .. } => method.as_str().to_ascii_lowercase(),
    };
    let user = shared.authn.authenticate(&headers).cloned();
    let outcome = match &user {
        None => Outcome::status(ApiStatus::unauthorized()),
        Some(user) => dispatch(&shared, user, &info, &method, &query, &headers, body),
    };
    let user_name = user.as_ref().map(|u| u.name.clone()).unwrap_or_default();
    debug!(
        %method,
        uri = %uri,
        user = %user_name,
        source = %peer,
        code = outcome.code,
        "request"
    );
    shared.audit.record(AuditRecord {
        time: now(true),
        verb,
        method: method.to_string(),
        uri: uri.to_string(),
        user: user_name,
        source: peer,
        code: outcome.code,
        object: outcome.object,
    });
    outcome.response
}

fn dispatch(
    shared: &Shared,
    user: &UserInfo,
    info: &RequestInfo,
    method: &Method,
    query: &Query,
    headers: &HeaderMap,
    body: Bytes,
) -> Outcome {
    let req = match info {
        RequestInfo::NonResource { path } => {
            let verb = method.as_str().to_ascii_lowercase();
            let asked = rbac::Request::NonResource { verb: &verb, path };
            if shared.authz.authorize(user, &asked) == Decision::Deny {
                return Outcome::status(ApiStatus::forbidden(&user.name, &verb, "", path, "", ""));
            }
            return match discovery::document(path, shared.version_minor) {
                Some(doc) if method == Method::GET => Outcome::json(StatusCode::OK, &doc),
                _ => Outcome::status(ApiStatus::no_route()),
            };
        }
        RequestInfo::Resource(r) => r,
    };
    let Some(res) = resources::by_path(&req.group, &req.version, &req.resource) else {
        return Outcome::status(ApiStatus::no_route());
    };
    if req.verb.is_empty() {
        return Outcome::status(ApiStatus::method_not_allowed(method.as_str()));
    }
    let is_namespace_object = res.resource == "namespaces";
    let wrong_scope = if res.namespaced {
        req.namespace.is_empty() && !req.name.is_empty()
    } else {
        !req.namespace.is_empty() && !is_namespace_object
    };
    let bad_subresource = !req.subresource.is_empty()
        && (req.subresource != "status"
            || !res.status_subresource
            || !matches!(req.verb, "get" | "update" | "patch"));
    if wrong_scope || bad_subresource {
        return Outcome::status(ApiStatus::no_route());
    }
    let rbac_resource = req.rbac_resource();
    let asked = rbac::Request::Resource {
        verb: req.verb,
        group: &req.group,
        resource: &rbac_resource,
        namespace: &req.namespace,
        name: &req.name,
    };
    match shared.authz.authorize(user, &asked) {
        Decision::Deny => {
            return Outcome::status(ApiStatus::forbidden(
                &user.name,
                req.verb,
                &req.group,
                &rbac_resource,
                &req.namespace,
                &req.name,
            ))
        }
        Decision::Allow(why) => {
            debug!(user = %user.name, verb = req.verb, resource = %rbac_resource, %why, "allowed")
        }
    }
    if query.contains_key("dryRun") {
        return Outcome::status(ApiStatus::bad_request(
            "dryRun is not supported by the API double",
        ));
    }
    // The store keys Namespace objects without a namespace.
    let namespace = if is_namespace_object {
        ""
    } else {
        req.namespace.as_str()
    };
    let write = matches!(req.verb, "create" | "update" | "patch" | "delete");
    let mut name = req.name.clone();
    let mut outcome = match resource_verb(shared, res, req, namespace, query, headers, body) {
        Ok(Reply::Json(code, v)) => {
            if let Some(n) = v.pointer("/metadata/name").and_then(Value::as_str) {
                name = n.to_string();
            }
            Outcome::json(code, &v)
        }
        Ok(Reply::Stream(response)) => Outcome {
            code: 200,
            response,
            object: None,
        },
        Err(s) => Outcome::status(s),
    };
    if write {
        outcome.object = Some(ObjectRef {
            resource: res.to_string(),
            namespace: namespace.to_string(),
            name,
            subresource: req.subresource.clone(),
        });
    }
    outcome
}

enum Reply {
    Json(StatusCode, Value),
    Stream(Response),
}

fn param<'a>(query: &'a Query, key: &str) -> Option<&'a str> {
    query.get(key).map(String::as_str).filter(|v| !v.is_empty())
}

/// The field manager of a write: `fieldManager`, else the User-Agent up to
/// its first `/` (what kube-apiserver does), else `unknown`.
fn field_manager(query: &Query, headers: &HeaderMap) -> String {
    if let Some(m) = param(query, "fieldManager") {
        return m.to_string();
    }
    headers
        .get(header::USER_AGENT)
        .and_then(|v| v.to_str().ok())
        .and_then(|ua| ua.split('/').next())
        .filter(|ua| !ua.is_empty())
        .unwrap_or("unknown")
        .to_string()
}

fn decode_json(body: &[u8]) -> Result<Value, ApiStatus> {
    serde_json::from_slice(body)
        .map_err(|e| ApiStatus::bad_request(format!("decoding the request body: {e}")))
}

fn resource_verb(
    shared: &Shared,
    res: &'static ResourceDef,
    req: &ResourceRequest,
    namespace: &str,
    query: &Query,
    headers: &HeaderMap,
    body: Bytes,
) -> Result<Reply, ApiStatus> {
    let selectors = || {
        Selectors::parse(param(query, "labelSelector"), param(query, "fieldSelector"))
            .map_err(|e| ApiStatus::bad_request(e.to_string()))
    };
    let ctx = || WriteContext {
        manager: field_manager(query, headers),
        now: now(false),
    };
    let status = req.subresource == "status";
    let metadata_only = headers
        .get(header::ACCEPT)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|a| a.contains("as=PartialObjectMetadata"));
    let store = &shared.store;
    let lock = || store.lock().expect("store lock");
    let ok = |v| Ok(Reply::Json(StatusCode::OK, v));
    match req.verb {
        "get" if metadata_only => ok(watch::partial_object_metadata(
            &lock().get(res, namespace, &req.name)?,
        )),
        "get" => ok(lock().get(res, namespace, &req.name)?),
        "list" => {
            let limit = match param(query, "limit") {
                Some(l) => Some(
                    l.parse()
                        .map_err(|_| ApiStatus::bad_request(format!("invalid limit {l:?}")))?,
                ),
                None => None,
            };
            let opts = ListOptions {
                limit,
                continue_token: param(query, "continue").map(String::from),
                resource_version: param(query, "resourceVersion").map(String::from),
                resource_version_match: param(query, "resourceVersionMatch").map(String::from),
            };
            let mut list = lock().list(res, namespace, &selectors()?, &opts)?;
            if metadata_only {
                list["kind"] = json!("PartialObjectMetadataList");
                list["apiVersion"] = json!("meta.k8s.io/v1");
                if let Some(items) = list["items"].as_array_mut() {
                    for item in items {
                        *item = watch::partial_object_metadata(item);
                    }
                }
            }
            ok(list)
        }
        "watch" => {
            let from = match param(query, "resourceVersion") {
                None | Some("0") => None,
                Some(rv) => Some(rv.parse::<u64>().map_err(|_| {
                    ApiStatus::bad_request(format!("invalid resourceVersion {rv:?}"))
                })?),
            };
            let timeout = match param(query, "timeoutSeconds") {
                Some(t) => Duration::from_secs(t.parse().map_err(|_| {
                    ApiStatus::bad_request(format!("invalid timeoutSeconds {t:?}"))
                })?),
                None => DEFAULT_WATCH_TIMEOUT,
            };
            let wreq = WatchRequest {
                resource: res,
                namespace: namespace.to_string(),
                selectors: selectors()?,
                from,
                bookmarks: matches!(param(query, "allowWatchBookmarks"), Some("true" | "1")),
                bookmark_interval: shared.bookmark_interval,
                timeout,
                metadata_only,
            };
            let body = Body::from_stream(watch::stream(store.clone(), wreq));
            let response = Response::builder()
                .status(StatusCode::OK)
                .header(header::CONTENT_TYPE, "application/json")
                .body(body)
                .expect("static response parts are valid");
            Ok(Reply::Stream(response))
        }
        "create" => {
            let obj = decode_json(&body)?;
            let created = lock().create(res, namespace, obj, &ctx())?;
            Ok(Reply::Json(StatusCode::CREATED, created))
        }
        "update" => {
            let obj = decode_json(&body)?;
            ok(lock().update(res, namespace, &req.name, obj, status, &ctx())?)
        }
        "patch" => {
            let content_type = headers
                .get(header::CONTENT_TYPE)
                .and_then(|v| v.to_str().ok())
                .unwrap_or("");
            let kind = PatchKind::from_content_type(content_type)
                .ok_or_else(|| ApiStatus::unsupported_media_type(content_type))?;
            if kind == PatchKind::Apply && param(query, "fieldManager").is_none() {
                return Err(ApiStatus::bad_request(
                    "PatchOptions.meta.k8s.io \"\" is invalid: fieldManager: Required value: is required for apply patch",
                ));
            }
            let force = matches!(param(query, "force"), Some("true" | "1"));
            let (obj, created) = lock().patch(
                res,
                namespace,
                &req.name,
                kind,
                &body,
                status,
                force,
                &ctx(),
            )?;
            let code = if created {
                StatusCode::CREATED
            } else {
                StatusCode::OK
            };
            Ok(Reply::Json(code, obj))
        }
        "delete" => {
            let pre = preconditions(&body)?;
            ok(lock().delete(res, namespace, &req.name, &pre)?)
        }
        "deletecollection" => {
            let sel = selectors()?;
            let mut st = lock();
            let list = st.list(res, namespace, &sel, &ListOptions::default())?;
            let mut deleted = Vec::new();
            for item in list["items"].as_array().into_iter().flatten() {
                let s = |p: &str| item.pointer(p).and_then(Value::as_str).unwrap_or("");
                deleted.push(st.delete(
                    res,
                    s("/metadata/namespace"),
                    s("/metadata/name"),
                    &Preconditions::default(),
                )?);
            }
            ok(json!({
                "kind": res.list_kind(),
                "apiVersion": res.api_version(),
                "metadata": { "resourceVersion": st.resource_version().to_string() },
                "items": deleted,
            }))
        }
        other => Err(ApiStatus::method_not_allowed(other)),
    }
}

/// `DeleteOptions.preconditions` from an optional JSON body.
fn preconditions(body: &[u8]) -> Result<Preconditions, ApiStatus> {
    if body.iter().all(u8::is_ascii_whitespace) {
        return Ok(Preconditions::default());
    }
    let opts = decode_json(body)?;
    let s = |p: &str| opts.pointer(p).and_then(Value::as_str).map(String::from);
    Ok(Preconditions {
        uid: s("/preconditions/uid"),
        resource_version: s("/preconditions/resourceVersion"),
    })
}
