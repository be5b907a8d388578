//! Field ownership: `metadata.managedFields`, server-side apply, and the
//! ownership an ordinary write (create, update, patch) takes.
//!
//! Minimal but honest model of kube-apiserver's structured-merge-diff:
//! - A field set is a set of leaf paths through JSON objects. A list, a
//!   scalar or an empty object is a leaf: lists are atomic here (real apply
//!   merges `listType: map` lists such as `ports` by key).
//! - Apply merges the applied object into the stored one (maps merge, lists
//!   replace), records the manager's field set with operation `Apply`,
//!   removes fields the manager applied last time but no longer applies and
//!   nobody else owns, and answers 409 Conflict when it would change a field
//!   another manager owns, unless `force=true`, which takes the field over.
//! - An update or patch takes ownership (operation `Update`) of the fields
//!   it changed, away from any other manager, without conflicts.

use std::collections::BTreeSet;

use serde_json::{json, Map, Value};

/// A set of leaf paths.
pub type FieldSet = BTreeSet<Vec<String>>;

/// Metadata fields the server owns; never part of a field set.
const SERVER_METADATA: &[&str] = &[
    "name",
    "namespace",
    "resourceVersion",
    "uid",
    "creationTimestamp",
    "generation",
    "managedFields",
    "selfLink",
    "deletionTimestamp",
];

/// A failed apply: the conflicting managers and paths.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("Apply failed with {} conflict(s): {}", .0.len(), describe(.0))]
pub struct ApplyConflict(pub Vec<(String, String)>);

fn describe(conflicts: &[(String, String)]) -> String {
    conflicts
        .iter()
        .map(|(manager, path)| format!("conflict with \"{manager}\": {path}"))
        .collect::<Vec<_>>()
        .join(", ")
}

/// Leaf paths of an object, without `apiVersion`, `kind` and the metadata
/// fields the server owns.
pub fn leaves(object: &Value) -> FieldSet {
    let mut out = FieldSet::new();
    if let Some(map) = object.as_object() {
        for (k, v) in map {
            if k == "apiVersion" || k == "kind" {
                continue;
            }
            if k == "metadata" {
                if let Some(meta) = v.as_object() {
                    for (mk, mv) in meta {
                        if !SERVER_METADATA.contains(&mk.as_str()) {
                            collect(mv, vec![k.clone(), mk.clone()], &mut out);
                        }
                    }
                }
                continue;
            }
            collect(v, vec![k.clone()], &mut out);
        }
    }
    out
}

fn collect(v: &Value, path: Vec<String>, out: &mut FieldSet) {
    match v.as_object() {
        Some(map) if !map.is_empty() => {
            for (k, child) in map {
                let mut p = path.clone();
                p.push(k.clone());
                collect(child, p, out);
            }
        }
        _ => {
            out.insert(path);
        }
    }
}

/// The `fieldsV1` encoding of a field set: `{"f:spec":{"f:type":{}}}`.
pub fn to_fields_v1(set: &FieldSet) -> Value {
    let mut root = Map::new();
    for path in set {
        let mut node = &mut root;
        for seg in path {
            node = node
                .entry(format!("f:{seg}"))
                .or_insert_with(|| Value::Object(Map::new()))
                .as_object_mut()
                .expect("field nodes are objects");
        }
    }
    Value::Object(root)
}

/// Reads a `fieldsV1` value back. A node with no `f:` children (only `k:`,
/// `v:`, `i:` or `.` entries, or none) is a leaf.
pub fn from_fields_v1(v: &Value) -> FieldSet {
    fn walk(v: &Value, path: &mut Vec<String>, out: &mut FieldSet) {
        let children: Vec<(&str, &Value)> = v
            .as_object()
            .map(|m| {
                m.iter()
                    .filter_map(|(k, c)| k.strip_prefix("f:").map(|k| (k, c)))
                    .collect()
            })
            .unwrap_or_default();
        if children.is_empty() {
            if !path.is_empty() {
                out.insert(path.clone());
            }
            return;
        }
        for (k, c) in children {
            path.push(k.to_string());
            walk(c, path, out);
            path.pop();
        }
    }
    let mut out = FieldSet::new();
    walk(v, &mut Vec::new(), &mut out);
    out
}

/// True when one path is a prefix of the other.
fn overlaps(a: &[String], b: &[String]) -> bool {
    let n = a.len().min(b.len());
    a[..n] == b[..n]
}

fn lookup<'a>(v: &'a Value, path: &[String]) -> Option<&'a Value> {
    path.iter().try_fold(v, |v, seg| v.get(seg))
}

fn remove_path(v: &mut Value, path: &[String]) {
    let Some((last, parents)) = path.split_last() else {
        return;
    };
    let mut node = v;
    for seg in parents {
        match node.get_mut(seg) {
            Some(n) => node = n,
            None => return,
        }
    }
    if let Some(map) = node.as_object_mut() {
        map.remove(last);
    }
}

/// `.status.loadBalancer.ingress`, as conflicts name paths.
fn dotted(path: &[String]) -> String {
    path.iter().map(|s| format!(".{s}")).collect()
}

/// One entry of `metadata.managedFields`.
#[derive(Debug, Clone, PartialEq)]
struct Entry {
    manager: String,
    operation: String,
    subresource: String,
    api_version: String,
    time: String,
    fields: FieldSet,
}

impl Entry {
    fn from_json(v: &Value) -> Entry {
        let s = |k: &str| v.get(k).and_then(Value::as_str).unwrap_or("").to_string();
        Entry {
            manager: s("manager"),
            operation: s("operation"),
            subresource: s("subresource"),
            api_version: s("apiVersion"),
            time: s("time"),
            fields: v.get("fieldsV1").map(from_fields_v1).unwrap_or_default(),
        }
    }

    fn to_json(&self) -> Value {
        let mut v = json!({
            "manager": self.manager,
            "operation": self.operation,
            "apiVersion": self.api_version,
            "time": self.time,
            "fieldsType": "FieldsV1",
            "fieldsV1": to_fields_v1(&self.fields),
        });
        if !self.subresource.is_empty() {
            v["subresource"] = json!(self.subresource);
        }
        v
    }

    fn same_owner(&self, manager: &str, operation: &str, subresource: &str) -> bool {
        self.manager == manager && self.operation == operation && self.subresource == subresource
    }
}

fn entries(object: &Value) -> Vec<Entry> {
    object
        .pointer("/metadata/managedFields")
        .and_then(Value::as_array)
        .map(|a| a.iter().map(Entry::from_json).collect())
        .unwrap_or_default()
}

fn store_entries(object: &mut Value, list: Vec<Entry>) {
    let list: Vec<Value> = list
        .iter()
        .filter(|e| !e.fields.is_empty())
        .map(Entry::to_json)
        .collect();
    if let Some(obj) = object.as_object_mut() {
        obj.entry("metadata")
            .or_insert_with(|| Value::Object(Map::new()));
    }
    if let Some(meta) = object.get_mut("metadata").and_then(Value::as_object_mut) {
        if list.is_empty() {
            meta.remove("managedFields");
        } else {
            meta.insert("managedFields".into(), Value::Array(list));
        }
    }
}

/// Who writes, for the ownership bookkeeping.
#[derive(Debug, Clone)]
pub struct Writer<'a> {
    pub manager: &'a str,
    /// `status` or empty.
    pub subresource: &'a str,
    pub api_version: String,
    /// RFC 3339, seconds.
    pub time: &'a str,
}

/// Server-side apply of `applied` over `current` (`None`: create).
/// `applied` must already be restricted to what the subresource may change.
/// Returns the merged object with updated `managedFields`.
pub fn apply(
    current: Option<&Value>,
    applied: &Value,
    who: &Writer<'_>,
    force: bool,
) -> Result<Value, ApplyConflict> {
    let mut object = current
        .cloned()
        .unwrap_or_else(|| Value::Object(Map::new()));
    let mut list = entries(&object);
    let new_set = leaves(applied);

    // Two paths name the same field when equal, or when the shorter one is
    // an atomic leaf (a list or scalar) that contains the longer one. An
    // empty map owned by someone does not own its future children.
    let is_map = |obj: &Value, p: &[String]| {
        lookup(obj, p).is_none_or(Value::is_object)
            && lookup(applied, p).is_none_or(Value::is_object)
    };
    let related = |obj: &Value, a: &[String], b: &[String]| {
        a == b || (b.starts_with(a) && !is_map(obj, a)) || (a.starts_with(b) && !is_map(obj, b))
    };
    let changes = |obj: &Value, a: &[String], b: &[String]| {
        let longer = if a.len() >= b.len() { a } else { b };
        lookup(obj, longer) != lookup(applied, longer)
    };

    // Conflicts: another manager owns a field this apply would change.
    let mut conflicts = Vec::new();
    for e in list
        .iter()
        .filter(|e| !e.same_owner(who.manager, "Apply", who.subresource))
    {
        for theirs in &e.fields {
            if new_set
                .iter()
                .any(|mine| related(&object, mine, theirs) && changes(&object, mine, theirs))
            {
                conflicts.push((e.manager.clone(), dotted(theirs)));
            }
        }
    }
    if !conflicts.is_empty() && !force {
        return Err(ApplyConflict(conflicts));
    }
    for e in list
        .iter_mut()
        .filter(|e| !e.same_owner(who.manager, "Apply", who.subresource))
    {
        e.fields.retain(|theirs| {
            !new_set
                .iter()
                .any(|mine| related(&object, mine, theirs) && changes(&object, mine, theirs))
        });
    }

    // Fields this manager applied before and no longer does, owned by no
    // one else, are removed.
    let previous = list
        .iter()
        .find(|e| e.same_owner(who.manager, "Apply", who.subresource))
        .map(|e| e.fields.clone())
        .unwrap_or_default();
    for gone in previous.difference(&new_set) {
        let still_applied = new_set.iter().any(|p| p.starts_with(gone));
        let owned_elsewhere = list
            .iter()
            .filter(|e| !e.same_owner(who.manager, "Apply", who.subresource))
            .any(|e| {
                e.fields
                    .iter()
                    .any(|p| related(&object, p, gone) || p.starts_with(gone))
            });
        if !owned_elsewhere && !still_applied {
            remove_path(&mut object, gone);
        }
    }

    json_patch::merge(&mut object, &strip_nulls(applied));
    list.retain(|e| !e.same_owner(who.manager, "Apply", who.subresource));
    list.push(Entry {
        manager: who.manager.to_string(),
        operation: "Apply".into(),
        subresource: who.subresource.to_string(),
        api_version: who.api_version.clone(),
        time: who.time.to_string(),
        fields: new_set,
    });
    store_entries(&mut object, list);
    Ok(object)
}

/// Apply bodies set fields; a `null` in one does not delete (that is a
/// merge-patch rule), so nulls are dropped before merging.
fn strip_nulls(v: &Value) -> Value {
    match v {
        Value::Object(m) => Value::Object(
            m.iter()
                .filter(|(_, v)| !v.is_null())
                .map(|(k, v)| (k.clone(), strip_nulls(v)))
                .collect(),
        ),
        other => other.clone(),
    }
}

/// Records the ownership an ordinary write takes: the leaves that differ
/// between `old` (`None` on create) and `new` go to `who` with operation
/// `Update` and are taken from every other manager. `new` keeps the
/// managedFields of `old`, whatever the request body said.
pub fn record_update(old: Option<&Value>, new: &mut Value, who: &Writer<'_>) {
    let mut list = old.map(entries).unwrap_or_default();
    let null = Value::Null;
    let old_v = old.unwrap_or(&null);
    let old_leaves = leaves(old_v);
    let new_leaves = leaves(new);
    let changed: FieldSet = new_leaves
        .iter()
        .filter(|p| lookup(old_v, p) != lookup(new, p))
        .cloned()
        .collect();
    let removed: FieldSet = old_leaves
        .iter()
        .filter(|p| lookup(new, p).is_none())
        .cloned()
        .collect();
    for e in list.iter_mut() {
        e.fields
            .retain(|p| !changed.iter().chain(&removed).any(|c| overlaps(c, p)));
    }
    if !changed.is_empty() {
        match list
            .iter_mut()
            .find(|e| e.same_owner(who.manager, "Update", who.subresource))
        {
            Some(e) => {
                e.fields.extend(changed);
                e.time = who.time.to_string();
                e.api_version = who.api_version.clone();
            }
            None => list.push(Entry {
                manager: who.manager.to_string(),
                operation: "Update".into(),
                subresource: who.subresource.to_string(),
                api_version: who.api_version.clone(),
                time: who.time.to_string(),
                fields: changed,
            }),
        }
    }
    store_entries(new, list);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn who<'a>(manager: &'a str, sub: &'a str) -> Writer<'a> {
        Writer {
            manager,
            subresource: sub,
            api_version: "v1".into(),
            time: "2024-01-01T00:00:00Z",
        }
    }

    fn paths(set: &FieldSet) -> Vec<String> {
        set.iter().map(|p| dotted(p)).collect()
    }

    #[test]
    fn fields_v1_round_trip() {
        let obj = json!({"apiVersion": "v1", "kind": "Service",
            "metadata": {"name": "a", "labels": {"x": "1"}},
            "status": {"loadBalancer": {"ingress": [{"ip": "192.0.2.1"}]}}});
        let set = leaves(&obj);
        assert_eq!(
            paths(&set),
            vec![".metadata.labels.x", ".status.loadBalancer.ingress"]
        );
        let v1 = to_fields_v1(&set);
        assert_eq!(v1["f:status"]["f:loadBalancer"]["f:ingress"], json!({}));
        assert_eq!(from_fields_v1(&v1), set);
    }

    #[test]
    fn apply_records_manager_and_removes_what_it_stopped_applying() {
        let cur = json!({"metadata": {"name": "a"}, "status": {"loadBalancer": {}}});
        let first = json!({"status": {"loadBalancer": {"ingress": [{"ip": "192.0.2.1"}]}}});
        let out = apply(Some(&cur), &first, &who("nodelb", "status"), false).unwrap();
        let mf = &out["metadata"]["managedFields"][0];
        assert_eq!(mf["manager"], "nodelb");
        assert_eq!(mf["operation"], "Apply");
        assert_eq!(mf["subresource"], "status");
        let cleared = json!({"status": {"loadBalancer": {}}});
        let out2 = apply(Some(&out), &cleared, &who("nodelb", "status"), false).unwrap();
        assert_eq!(out2["status"]["loadBalancer"], json!({}));
    }

    #[test]
    fn apply_conflicts_with_another_manager_unless_forced() {
        let cur = json!({"metadata": {"name": "a"}});
        let theirs = json!({"status": {"loadBalancer": {"ingress": [{"ip": "192.0.2.9"}]}}});
        let owned = apply(Some(&cur), &theirs, &who("other", "status"), false).unwrap();
        let mine = json!({"status": {"loadBalancer": {"ingress": [{"ip": "192.0.2.1"}]}}});
        let err = apply(Some(&owned), &mine, &who("nodelb", "status"), false).unwrap_err();
        assert_eq!(
            err.0,
            vec![(
                "other".to_string(),
                ".status.loadBalancer.ingress".to_string()
            )]
        );
        let forced = apply(Some(&owned), &mine, &who("nodelb", "status"), true).unwrap();
        assert_eq!(
            forced["status"]["loadBalancer"]["ingress"][0]["ip"],
            "192.0.2.1"
        );
        let managers: Vec<&Value> = forced["metadata"]["managedFields"]
            .as_array()
            .unwrap()
            .iter()
            .map(|e| &e["manager"])
            .collect();
        assert_eq!(managers, vec!["nodelb"], "the forced field left 'other'");
    }

    #[test]
    fn same_value_is_shared_not_a_conflict() {
        let v = json!({"spec": {"type": "LoadBalancer"}});
        let a = apply(None, &v, &who("a", ""), false).unwrap();
        let b = apply(Some(&a), &v, &who("b", ""), false).unwrap();
        assert_eq!(b["metadata"]["managedFields"].as_array().unwrap().len(), 2);
    }

    #[test]
    fn update_takes_changed_fields_from_appliers() {
        let v = json!({"metadata": {"name": "a"}, "spec": {"type": "LoadBalancer", "x": "1"}});
        let applied = apply(None, &v, &who("a", ""), false).unwrap();
        let mut new = applied.clone();
        new["spec"]["x"] = json!("2");
        record_update(Some(&applied), &mut new, &who("kubectl", ""));
        let mf = new["metadata"]["managedFields"].as_array().unwrap();
        assert_eq!(mf.len(), 2);
        assert_eq!(mf[1]["manager"], "kubectl");
        assert_eq!(mf[1]["operation"], "Update");
        assert_eq!(mf[1]["fieldsV1"], json!({"f:spec": {"f:x": {}}}));
        assert_eq!(mf[0]["fieldsV1"], json!({"f:spec": {"f:type": {}}}));
    }
}
