//! PATCH bodies: which kind of patch a Content-Type names, and applying
//! merge and JSON patches to a stored object.
//!
//! `application/strategic-merge-patch+json` is applied as a JSON merge
//! patch. The difference from kube-apiserver: a real strategic merge merges
//! lists that have a merge key (`ports` by `port`, `conditions` by `type`,
//! …) element by element and honours `$patch`/`$retainKeys` directives;
//! here every list in the patch replaces the stored list whole, and
//! directives are stored as ordinary keys. Server-side apply lives in
//! [`super::apply`].

use serde_json::Value;

#[derive(Debug, thiserror::Error)]
pub enum PatchError {
    #[error("decoding the patch body as JSON")]
    DecodeJson(#[source] serde_json::Error),
    #[error("decoding the apply body as YAML or JSON")]
    DecodeYaml(#[source] serde_yaml_ng::Error),
    #[error("applying the JSON patch")]
    JsonPatch(#[source] json_patch::PatchError),
    #[error("the patched object is not a JSON object")]
    NotAnObject,
}

/// The patch types kube-apiserver accepts, by Content-Type.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PatchKind {
    Merge,
    /// Applied as [`PatchKind::Merge`]; see the module documentation.
    StrategicMerge,
    Json,
    Apply,
}

impl PatchKind {
    /// The patch kind for a Content-Type header value (parameters such as
    /// `; charset=utf-8` ignored); `None` when it names no patch type.
    pub fn from_content_type(content_type: &str) -> Option<PatchKind> {
        let mime = content_type.split(';').next().unwrap_or("").trim();
        match mime {
            "application/merge-patch+json" => Some(PatchKind::Merge),
            "application/strategic-merge-patch+json" => Some(PatchKind::StrategicMerge),
            "application/json-patch+json" => Some(PatchKind::Json),
            "application/apply-patch+yaml" | "application/apply-patch+json" => {
                Some(PatchKind::Apply)
            }
            _ => None,
        }
    }
}

/// Applies a merge, strategic-merge or JSON patch to `current`.
pub fn apply_patch(kind: PatchKind, current: &Value, body: &[u8]) -> Result<Value, PatchError> {
    let mut out = current.clone();
    match kind {
        PatchKind::Merge | PatchKind::StrategicMerge => {
            let patch: Value = serde_json::from_slice(body).map_err(PatchError::DecodeJson)?;
            json_patch::merge(&mut out, &patch);
        }
        PatchKind::Json => {
            let patch: json_patch::Patch =
                serde_json::from_slice(body).map_err(PatchError::DecodeJson)?;
            json_patch::patch(&mut out, &patch.0).map_err(PatchError::JsonPatch)?;
        }
        PatchKind::Apply => {
            let patch = decode_apply_body(body)?;
            json_patch::merge(&mut out, &patch);
        }
    }
    if !out.is_object() {
        return Err(PatchError::NotAnObject);
    }
    Ok(out)
}

/// Decodes a server-side apply body: YAML, which JSON is a subset of.
pub fn decode_apply_body(body: &[u8]) -> Result<Value, PatchError> {
    let v: Value = serde_yaml_ng::from_slice(body).map_err(PatchError::DecodeYaml)?;
    if !v.is_object() {
        return Err(PatchError::NotAnObject);
    }
    Ok(v)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn merge_patch_merges_maps_and_deletes_nulls() {
        let cur = json!({"metadata": {"labels": {"a": "1", "b": "2"}}, "spec": {"x": [1, 2]}});
        let out = apply_patch(
            PatchKind::Merge,
            &cur,
            br#"{"metadata":{"labels":{"b":null,"c":"3"}},"spec":{"x":[3]}}"#,
        )
        .unwrap();
        assert_eq!(
            out,
            json!({"metadata": {"labels": {"a": "1", "c": "3"}}, "spec": {"x": [3]}})
        );
    }

    #[test]
    fn json_patch_operations_and_failed_test() {
        let cur = json!({"spec": {"ports": [{"port": 80}]}});
        let out = apply_patch(
            PatchKind::Json,
            &cur,
            br#"[{"op":"add","path":"/spec/ports/-","value":{"port":443}}]"#,
        )
        .unwrap();
        assert_eq!(out["spec"]["ports"][1]["port"], 443);
        let failed = apply_patch(
            PatchKind::Json,
            &cur,
            br#"[{"op":"test","path":"/spec/ports/0/port","value":81}]"#,
        );
        assert!(matches!(failed, Err(PatchError::JsonPatch(_))));
    }

    #[test]
    fn content_types() {
        assert_eq!(
            PatchKind::from_content_type("application/apply-patch+yaml; charset=utf-8"),
            Some(PatchKind::Apply)
        );
        assert_eq!(PatchKind::from_content_type("application/json"), None);
    }

    #[test]
    fn apply_body_may_be_yaml() {
        let v = decode_apply_body(b"apiVersion: v1\nkind: Service\nspec:\n  type: LoadBalancer\n")
            .unwrap();
        assert_eq!(v["spec"]["type"], "LoadBalancer");
    }
}
