//! `labelSelector` and `fieldSelector` query parameters: parsing and
//! matching against stored objects.
//!
//! Label selectors support `=`, `==`, `!=`, `in (…)`, `notin (…)`, `key`
//! (exists) and `!key`. Field selectors support `metadata.name` and
//! `metadata.namespace` with `=`, `==` and `!=`; other field labels are
//! refused with 400 as kube-apiserver refuses unsupported ones.

use std::collections::BTreeMap;

use serde_json::Value;

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SelectorError {
    #[error("unable to parse requirement {requirement:?}: {why}")]
    Parse {
        requirement: String,
        why: &'static str,
    },
    #[error("field label not supported: {0}")]
    UnsupportedField(String),
}

/// One label requirement.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Requirement {
    Equals(String, String),
    NotEquals(String, String),
    In(String, Vec<String>),
    NotIn(String, Vec<String>),
    Exists(String),
    DoesNotExist(String),
}

impl Requirement {
    fn matches(&self, labels: &BTreeMap<String, String>) -> bool {
        match self {
            Requirement::Equals(k, v) => labels.get(k) == Some(v),
            // Like kube: `!=` and `notin` also match objects without the key.
            Requirement::NotEquals(k, v) => labels.get(k) != Some(v),
            Requirement::In(k, vs) => labels.get(k).is_some_and(|l| vs.contains(l)),
            Requirement::NotIn(k, vs) => !labels.get(k).is_some_and(|l| vs.contains(l)),
            Requirement::Exists(k) => labels.contains_key(k),
            Requirement::DoesNotExist(k) => !labels.contains_key(k),
        }
    }
}

/// A parsed label selector: all requirements must hold. Empty matches all.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct LabelSelector(pub Vec<Requirement>);

impl LabelSelector {
    pub fn parse(s: &str) -> Result<LabelSelector, SelectorError> {
        let mut out = Vec::new();
        for raw in split_top_level(s) {
            let req = raw.trim();
            if req.is_empty() {
                continue;
            }
            out.push(parse_requirement(req)?);
        }
        Ok(LabelSelector(out))
    }

    pub fn matches(&self, object: &Value) -> bool {
        let labels = labels_of(object);
        self.0.iter().all(|r| r.matches(&labels))
    }
}

/// Splits on commas outside parentheses.
fn split_top_level(s: &str) -> Vec<&str> {
    let mut parts = Vec::new();
    let mut depth = 0usize;
    let mut start = 0;
    for (i, c) in s.char_indices() {
        match c {
            '(' => depth += 1,
            ')' => depth = depth.saturating_sub(1),
            ',' if depth == 0 => {
                parts.push(&s[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    parts.push(&s[start..]);
    parts
}

fn parse_requirement(req: &str) -> Result<Requirement, SelectorError> {
    let err = |why| SelectorError::Parse {
        requirement: req.to_string(),
        why,
    };
    if let Some(key) = req.strip_prefix('!') {
        let key = key.trim();
        check_key(key).map_err(err)?;
        return Ok(Requirement::DoesNotExist(key.to_string()));
    }
    for (op, make) in [
        (
            "!=",
            Requirement::NotEquals as fn(String, String) -> Requirement,
        ),
        ("==", Requirement::Equals),
        ("=", Requirement::Equals),
    ] {
        if let Some((k, v)) = req.split_once(op) {
            let (k, v) = (k.trim(), v.trim());
            check_key(k).map_err(err)?;
            check_value(v).map_err(err)?;
            return Ok(make(k.to_string(), v.to_string()));
        }
    }
    if let Some(open) = req.find('(') {
        let head = req[..open].trim();
        let close = req.rfind(')').ok_or_else(|| err("missing ')'"))?;
        if close != req.len() - 1 {
            return Err(err("text after ')'"));
        }
        let values: Vec<String> = req[open + 1..close]
            .split(',')
            .map(|v| v.trim().to_string())
            .filter(|v| !v.is_empty())
            .collect();
        for v in &values {
            check_value(v).map_err(err)?;
        }
        let (key, op) = head
            .rsplit_once(char::is_whitespace)
            .ok_or_else(|| err("expected 'key in (…)' or 'key notin (…)'"))?;
        let key = key.trim();
        check_key(key).map_err(err)?;
        return match op {
            "in" if values.is_empty() => Err(err("'in' needs at least one value")),
            "in" => Ok(Requirement::In(key.to_string(), values)),
            "notin" if values.is_empty() => Err(err("'notin' needs at least one value")),
            "notin" => Ok(Requirement::NotIn(key.to_string(), values)),
            _ => Err(err("unknown operator")),
        };
    }
    check_key(req).map_err(err)?;
    Ok(Requirement::Exists(req.to_string()))
}

/// A label key: optional DNS prefix and `/`, then a name of up to 63
/// characters of `[A-Za-z0-9._-]`, alphanumeric at both ends.
fn check_key(key: &str) -> Result<(), &'static str> {
    let name = match key.rsplit_once('/') {
        Some((prefix, name)) => {
            if prefix.is_empty()
                || prefix.len() > 253
                || !prefix
                    .chars()
                    .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-' || c == '.')
            {
                return Err("invalid key prefix");
            }
            name
        }
        None => key,
    };
    if name.is_empty() || name.len() > 63 || !is_label_chars(name) {
        return Err("invalid key");
    }
    Ok(())
}

fn check_value(v: &str) -> Result<(), &'static str> {
    if v.is_empty() {
        return Ok(());
    }
    if v.len() > 63 || !is_label_chars(v) {
        return Err("invalid value");
    }
    Ok(())
}

fn is_label_chars(s: &str) -> bool {
    let ok = |c: char| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.');
    s.chars().all(ok)
        && s.starts_with(|c: char| c.is_ascii_alphanumeric())
        && s.ends_with(|c: char| c.is_ascii_alphanumeric())
}

fn labels_of(object: &Value) -> BTreeMap<String, String> {
    object
        .pointer("/metadata/labels")
        .and_then(Value::as_object)
        .map(|m| {
            m.iter()
                .filter_map(|(k, v)| v.as_str().map(|v| (k.clone(), v.to_string())))
                .collect()
        })
        .unwrap_or_default()
}

/// One field requirement: (JSON pointer into the object, wanted value,
/// `true` for `=`/`==`, `false` for `!=`).
#[derive(Debug, Clone, PartialEq, Eq)]
struct FieldRequirement {
    pointer: &'static str,
    value: String,
    equal: bool,
}

/// A parsed field selector.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct FieldSelector(Vec<FieldRequirement>);

impl FieldSelector {
    pub fn parse(s: &str) -> Result<FieldSelector, SelectorError> {
        let mut out = Vec::new();
        for req in s.split(',').map(str::trim).filter(|r| !r.is_empty()) {
            let (field, value, equal) = if let Some((f, v)) = req.split_once("!=") {
                (f, v, false)
            } else if let Some((f, v)) = req.split_once("==") {
                (f, v, true)
            } else if let Some((f, v)) = req.split_once('=') {
                (f, v, true)
            } else {
                return Err(SelectorError::Parse {
                    requirement: req.to_string(),
                    why: "expected field=value or field!=value",
                });
            };
            let pointer = match field.trim() {
                "metadata.name" => "/metadata/name",
                "metadata.namespace" => "/metadata/namespace",
                other => return Err(SelectorError::UnsupportedField(other.to_string())),
            };
            out.push(FieldRequirement {
                pointer,
                value: value.trim().to_string(),
                equal,
            });
        }
        Ok(FieldSelector(out))
    }

    pub fn matches(&self, object: &Value) -> bool {
        self.0.iter().all(|r| {
            let actual = object
                .pointer(r.pointer)
                .and_then(Value::as_str)
                .unwrap_or("");
            (actual == r.value) == r.equal
        })
    }
}

/// Both selectors of a list or watch request.
#[derive(Debug, Clone, Default)]
pub struct Selectors {
    pub labels: LabelSelector,
    pub fields: FieldSelector,
}

impl Selectors {
    pub fn parse(labels: Option<&str>, fields: Option<&str>) -> Result<Selectors, SelectorError> {
        Ok(Selectors {
            labels: LabelSelector::parse(labels.unwrap_or(""))?,
            fields: FieldSelector::parse(fields.unwrap_or(""))?,
        })
    }

    pub fn matches(&self, object: &Value) -> bool {
        self.labels.matches(object) && self.fields.matches(object)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn obj(labels: Value) -> Value {
        json!({"metadata": {"name": "a", "namespace": "ns", "labels": labels}})
    }

    fn m(sel: &str, labels: Value) -> bool {
        LabelSelector::parse(sel).unwrap().matches(&obj(labels))
    }

    #[test]
    fn equality_operators() {
        assert!(m("app=web", json!({"app": "web"})));
        assert!(m("app==web", json!({"app": "web"})));
        assert!(!m("app=web", json!({"app": "db"})));
        assert!(m("app!=web", json!({"app": "db"})));
        assert!(m("app!=web", json!({})), "!= matches a missing key");
        assert!(!m("app!=web", json!({"app": "web"})));
    }

    #[test]
    fn set_operators() {
        let sel = "tier in (front, back),env notin (prod)";
        assert!(m(sel, json!({"tier": "back", "env": "dev"})));
        assert!(m(sel, json!({"tier": "front"})));
        assert!(!m(sel, json!({"tier": "mid"})));
        assert!(!m(sel, json!({"tier": "front", "env": "prod"})));
    }

    #[test]
    fn existence_operators() {
        assert!(m(
            "kubernetes.io/service-name",
            json!({"kubernetes.io/service-name": "x"})
        ));
        assert!(!m("kubernetes.io/service-name", json!({})));
        assert!(m("!excluded", json!({"other": "1"})));
        assert!(!m("!excluded", json!({"excluded": ""})));
    }

    #[test]
    fn empty_selector_matches_everything() {
        assert!(m("", json!({})));
    }

    #[test]
    fn bad_selectors_are_refused() {
        assert!(LabelSelector::parse("a in ()").is_err());
        assert!(LabelSelector::parse("a in (b").is_err());
        assert!(LabelSelector::parse("-a=b").is_err());
        assert!(LabelSelector::parse("a=b c").is_err());
    }

    #[test]
    fn field_selector_on_name_and_namespace() {
        let f = FieldSelector::parse("metadata.name=a,metadata.namespace!=kube-system").unwrap();
        assert!(f.matches(&obj(json!({}))));
        let g = FieldSelector::parse("metadata.name==b").unwrap();
        assert!(!g.matches(&obj(json!({}))));
        assert_eq!(
            FieldSelector::parse("spec.clusterIP=1"),
            Err(SelectorError::UnsupportedField("spec.clusterIP".into()))
        );
    }
}
