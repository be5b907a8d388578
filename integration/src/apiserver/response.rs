//! Failure responses as kube-apiserver sends them: a `Status` object
//! (`kind: Status`, `status: Failure`, a machine-readable `reason`, the HTTP
//! `code`) that kube-rs decodes into `kube::Error::Api`.

use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use serde_json::{json, Value};

/// An API failure; every module's error converts into one of these at the
/// HTTP edge.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{code} {reason}: {message}")]
pub struct ApiStatus {
    pub code: u16,
    /// `NotFound`, `AlreadyExists`, `Conflict`, `Forbidden`, …
    pub reason: &'static str,
    pub message: String,
    /// `details` of the Status: (name, group, kind).
    pub details: Option<(String, String, String)>,
}

impl ApiStatus {
    fn new(code: u16, reason: &'static str, message: impl Into<String>) -> ApiStatus {
        ApiStatus {
            code,
            reason,
            message: message.into(),
            details: None,
        }
    }

    fn with_details(mut self, name: &str, group: &str, kind: &str) -> ApiStatus {
        self.details = Some((name.to_string(), group.to_string(), kind.to_string()));
        self
    }

    pub fn not_found(group: &str, resource: &str, name: &str) -> ApiStatus {
        ApiStatus::new(
            404,
            "NotFound",
            format!("{} \"{name}\" not found", qualified(group, resource)),
        )
        .with_details(name, group, resource)
    }

    /// The path names no resource the double serves.
    pub fn no_route() -> ApiStatus {
        ApiStatus::new(
            404,
            "NotFound",
            "the server could not find the requested resource",
        )
    }

    pub fn already_exists(group: &str, resource: &str, name: &str) -> ApiStatus {
        ApiStatus::new(
            409,
            "AlreadyExists",
            format!("{} \"{name}\" already exists", qualified(group, resource)),
        )
        .with_details(name, group, resource)
    }

    /// Stale `metadata.resourceVersion` (or failed delete precondition).
    pub fn conflict(group: &str, resource: &str, name: &str, why: &str) -> ApiStatus {
        ApiStatus::new(
            409,
            "Conflict",
            format!(
                "Operation cannot be fulfilled on {} \"{name}\": {why}",
                qualified(group, resource)
            ),
        )
        .with_details(name, group, resource)
    }

    /// Server-side apply would change fields other managers own.
    pub fn apply_conflict(
        group: &str,
        resource: &str,
        name: &str,
        conflict: &impl std::fmt::Display,
    ) -> ApiStatus {
        ApiStatus::new(409, "Conflict", conflict.to_string()).with_details(name, group, resource)
    }

    pub fn invalid(group: &str, kind: &str, name: &str, causes: &[String]) -> ApiStatus {
        ApiStatus::new(
            422,
            "Invalid",
            format!("{kind} \"{name}\" is invalid: {}", causes.join(", ")),
        )
        .with_details(name, group, kind)
    }

    pub fn bad_request(message: impl Into<String>) -> ApiStatus {
        ApiStatus::new(400, "BadRequest", message)
    }

    pub fn unsupported_media_type(content_type: &str) -> ApiStatus {
        ApiStatus::new(
            415,
            "UnsupportedMediaType",
            format!("the body of the request was in an unknown format: {content_type}"),
        )
    }

    pub fn method_not_allowed(method: &str) -> ApiStatus {
        ApiStatus::new(
            405,
            "MethodNotAllowed",
            format!("the server does not allow this method on the requested resource: {method}"),
        )
    }

    pub fn unauthorized() -> ApiStatus {
        ApiStatus::new(401, "Unauthorized", "Unauthorized")
    }

    /// The message kube-apiserver's RBAC authorizer produces.
    pub fn forbidden(
        user: &str,
        verb: &str,
        group: &str,
        resource: &str,
        namespace: &str,
        name: &str,
    ) -> ApiStatus {
        let what = if name.is_empty() {
            qualified(group, resource)
        } else {
            format!("{} \"{name}\"", qualified(group, resource))
        };
        let scope = if namespace.is_empty() {
            "at the cluster scope".to_string()
        } else {
            format!("in the namespace \"{namespace}\"")
        };
        ApiStatus::new(
            403,
            "Forbidden",
            format!(
                "{what} is forbidden: User \"{user}\" cannot {verb} resource \"{resource}\" in API group \"{group}\" {scope}"
            ),
        )
        .with_details(name, group, resource)
    }

    /// A watch or continue token older than the retained history.
    pub fn expired(message: impl Into<String>) -> ApiStatus {
        ApiStatus::new(410, "Expired", message)
    }

    /// The Status object as JSON.
    pub fn to_json(&self) -> Value {
        let mut v = json!({
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": self.message,
            "reason": self.reason,
            "code": self.code,
        });
        if let Some((name, group, kind)) = &self.details {
            v["details"] = json!({ "name": name, "group": group, "kind": kind });
        }
        v
    }
}

/// `services` or `leases.coordination.k8s.io`, as kube-apiserver spells a
/// resource in messages.
fn qualified(group: &str, resource: &str) -> String {
    if group.is_empty() {
        resource.to_string()
    } else {
        format!("{resource}.{group}")
    }
}

impl IntoResponse for ApiStatus {
    fn into_response(self) -> Response {
        let code = StatusCode::from_u16(self.code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        json_response(code, &self.to_json())
    }
}

/// A JSON body with the given code.
pub fn json_response(code: StatusCode, body: &Value) -> Response {
    (
        code,
        [(header::CONTENT_TYPE, "application/json")],
        body.to_string(),
    )
        .into_response()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn status_object_has_the_fields_kube_rs_reads() {
        let s = ApiStatus::not_found("coordination.k8s.io", "leases", "x").to_json();
        assert_eq!(s["kind"], "Status");
        assert_eq!(s["status"], "Failure");
        assert_eq!(s["reason"], "NotFound");
        assert_eq!(s["code"], 404);
        assert_eq!(s["message"], "leases.coordination.k8s.io \"x\" not found");
    }

    #[test]
    fn forbidden_message_matches_kube_apiserver() {
        let s = ApiStatus::forbidden("u", "update", "", "services", "ns", "a");
        assert_eq!(
            s.message,
            "services \"a\" is forbidden: User \"u\" cannot update resource \"services\" in API group \"\" in the namespace \"ns\""
        );
    }
}
