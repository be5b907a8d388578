//! Kubernetes objects from files, for `render -f`, `apply -f` and the golden tests: YAML or
//! JSON, one or many documents per file, `kind: List` (and `ServiceList`-style lists) unpacked.
//! Services and EndpointSlices are read into the watches' own types ([`nodelb_core::objects::wire`]) and
//! kept as the index keeps them; Nodes are kept whole; anything else is skipped and reported.
//!
//! Documents are read as they stream; each object in them is held whole once, as a JSON value,
//! and then read as its kind, so one that does not read as its kind is skipped with its reason
//! (as the watches skip it) and the rest of the file is still read.

use k8s_openapi::api::core::v1::Node;
use nodelb_core::objects::index;
use nodelb_core::objects::wire;
use serde::de::value::{MapAccessDeserializer, SeqAccessDeserializer};
use serde::de::{DeserializeOwned, DeserializeSeed, Deserializer, MapAccess, SeqAccess, Visitor};
use serde::Deserialize;
use serde_json::{Map, Value};
use std::fmt;
use std::io::Read;
use std::path::{Path, PathBuf};

/// What the files held.
#[derive(Clone, Debug, Default)]
pub struct ObjectFiles {
    pub services: Vec<index::Service>,
    pub slices: Vec<index::EndpointSlice>,
    pub nodes: Vec<Node>,
    /// Objects skipped: of other kinds, or of a kind nodelb reads that did not read as it.
    pub skipped: Vec<Skipped>,
}

/// One object that was not kept.
#[derive(Clone, Debug, PartialEq)]
pub struct Skipped {
    pub path: PathBuf,
    /// 1-based; the items of a list are in their list's document.
    pub document: usize,
    pub kind: String,
    pub namespace: Option<String>,
    pub name: Option<String>,
    /// Why: `None` for a kind nodelb does not read, else why it did not read as its kind.
    pub error: Option<String>,
}

impl Skipped {
    /// `namespace/name`, `name`, or `(unnamed)`.
    fn object(&self) -> String {
        match (&self.namespace, &self.name) {
            (Some(ns), Some(name)) => format!("{ns}/{name}"),
            (None, Some(name)) => name.clone(),
            (_, None) => "(unnamed)".into(),
        }
    }
}

impl fmt::Display for Skipped {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let (path, kind, object) = (self.path.display(), &self.kind, self.object());
        match &self.error {
            Some(e) => write!(
                f,
                "{path}: document {}: {kind} {object} is not a valid {kind}: {e}",
                self.document
            ),
            None => write!(
                f,
                "{path}: {kind} {object}: not a Service, EndpointSlice or Node"
            ),
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("reading {path}")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{path}: document {document} is not YAML or JSON")]
    Parse {
        path: PathBuf,
        document: usize,
        #[source]
        source: serde_yaml_ng::Error,
    },
    #[error("{path}: document {document}: {what}")]
    Shape {
        path: PathBuf,
        document: usize,
        what: String,
    },
}

/// Where in the files a value is, for errors and skips.
#[derive(Clone, Copy)]
struct Place<'a> {
    path: &'a Path,
    document: usize,
}

impl Place<'_> {
    fn shape(self, what: String) -> Error {
        Error::Shape {
            path: self.path.to_path_buf(),
            document: self.document,
            what,
        }
    }
}

impl ObjectFiles {
    /// Read every file (`-` is standard input), in order.
    pub fn read(paths: &[PathBuf]) -> Result<ObjectFiles, Error> {
        let mut out = ObjectFiles::default();
        for path in paths {
            let text = read_text(path)?;
            out.add_text(path, &text)?;
        }
        Ok(out)
    }

    /// The objects in one file's text. `path` only names the file in errors and skips.
    pub fn from_text(path: &Path, text: &str) -> Result<ObjectFiles, Error> {
        let mut out = ObjectFiles::default();
        out.add_text(path, text)?;
        Ok(out)
    }

    /// Add the objects in one file's text.
    ///
    /// A text that is one JSON object (`kubectl get -o json`) is read by the JSON parser, which
    /// is much faster than the YAML one; anything else, or JSON that parser refuses, is read as
    /// YAML, of which JSON is a subset, with the same result. Either way the document is read
    /// as it streams: only one object at a time is held whole (see `Document`).
    pub fn add_text(&mut self, path: &Path, text: &str) -> Result<(), Error> {
        if text.trim_start().starts_with('{') {
            let place = Place { path, document: 1 };
            let mut json = serde_json::Deserializer::from_str(text);
            let mut out = ObjectFiles::default();
            let mut failed = None;
            let read = Document::new(&mut out, place, &mut failed).deserialize(&mut json);
            if read.and_then(|()| json.end()).is_ok() {
                if let Some(e) = failed {
                    return Err(e);
                }
                self.append(out);
                return Ok(());
            }
        }
        for (i, doc) in serde_yaml_ng::Deserializer::from_str(text).enumerate() {
            let place = Place {
                path,
                document: i + 1,
            };
            let mut failed = None;
            Document::new(self, place, &mut failed)
                .deserialize(doc)
                .map_err(|source| Error::Parse {
                    path: path.to_path_buf(),
                    document: place.document,
                    source,
                })?;
            if let Some(e) = failed {
                return Err(e);
            }
        }
        Ok(())
    }

    fn append(&mut self, mut other: ObjectFiles) {
        self.services.append(&mut other.services);
        self.slices.append(&mut other.slices);
        self.nodes.append(&mut other.nodes);
        self.skipped.append(&mut other.skipped);
    }

    /// One object, read whole.
    fn add_value(&mut self, place: Place<'_>, value: Value) -> Result<(), Error> {
        let mut obj = match value {
            // An empty document (`---` at the end, comments only).
            Value::Null => return Ok(()),
            Value::Object(o) => o,
            other => return Err(place.shape(format!("expected an object, found {other}"))),
        };
        let kind = object_kind(place, &obj)?.to_string();
        if is_list(&kind) {
            let items = list_items(place, &kind, obj.remove("items"))?;
            return self.add_items(place, &kind, items);
        }
        let meta = |k: &str| Some(obj.get("metadata")?.get(k)?.as_str()?.to_string());
        let mut skipped = Skipped {
            path: place.path.to_path_buf(),
            document: place.document,
            namespace: meta("namespace"),
            name: meta("name"),
            kind,
            error: None,
        };
        // An object of a kind nodelb reads that does not deserialize is skipped with its
        // reason, as the agent's watches skip it: the rest of the file is still planned.
        let value = Value::Object(obj);
        let kept = match skipped.kind.as_str() {
            "Service" => read::<wire::Service>(value).map(|s| self.services.push(s.into())),
            "EndpointSlice" => {
                read::<wire::EndpointSlice>(value).map(|s| self.slices.push(s.into()))
            }
            "Node" => read::<Node>(value).map(|n| self.nodes.push(n)),
            _ => {
                self.skipped.push(skipped);
                return Ok(());
            }
        };
        if let Err(e) = kept {
            skipped.error = Some(e.to_string());
            self.skipped.push(skipped);
        }
        Ok(())
    }

    /// The items of a list of `kind`, in order.
    fn add_items(
        &mut self,
        place: Place<'_>,
        kind: &str,
        items: impl IntoIterator<Item = Value>,
    ) -> Result<(), Error> {
        for item in items {
            self.add_value(place, with_kind(kind, item))?;
        }
        Ok(())
    }
}

fn object_kind<'o>(place: Place<'_>, obj: &'o Map<String, Value>) -> Result<&'o str, Error> {
    obj.get("kind")
        .and_then(Value::as_str)
        .ok_or_else(|| place.shape("object has no kind".into()))
}

fn is_list(kind: &str) -> bool {
    kind.ends_with("List")
}

fn list_items(place: Place<'_>, kind: &str, items: Option<Value>) -> Result<Vec<Value>, Error> {
    match items {
        Some(Value::Array(items)) => Ok(items),
        Some(Value::Null) | None => Ok(Vec::new()),
        Some(_) => Err(place.shape(format!("{kind}: items is not a list"))),
    }
}

/// `kubectl get services -o yaml` items carry no kind of their own: a `ServiceList`'s are
/// Services.
fn with_kind(list_kind: &str, mut item: Value) -> Value {
    let item_kind = list_kind.strip_suffix("List").filter(|s| !s.is_empty());
    if let (Some(ik), Value::Object(o)) = (item_kind, &mut item) {
        o.entry("kind").or_insert_with(|| ik.into());
    }
    item
}

fn read<T: DeserializeOwned>(value: Value) -> Result<T, serde_json::Error> {
    serde_json::from_value(value)
}

/// One document, read as it streams: an object's fields are kept as read, but for a list's
/// `items`, each of which is read whole and added at once (so a list of thousands holds one
/// at a time). What the document means is decided when its end is reached; an error in it
/// (other than unparsable text, the deserializer's own error) is left in `failed`.
struct Document<'a> {
    files: &'a mut ObjectFiles,
    place: Place<'a>,
    failed: &'a mut Option<Error>,
}

impl<'a> Document<'a> {
    fn new(files: &'a mut ObjectFiles, place: Place<'a>, failed: &'a mut Option<Error>) -> Self {
        Document {
            files,
            place,
            failed,
        }
    }

    fn not_an_object<E>(self, v: Value) -> Result<(), E> {
        *self.failed = Some(self.place.shape(format!("expected an object, found {v}")));
        Ok(())
    }

    /// The document's object, its fields read; `items` as [`Items`] reads them.
    fn finish(self, fields: Map<String, Value>, items: Items) {
        let place = self.place;
        let done = match object_kind(place, &fields).map(str::to_string) {
            Err(e) => Err(e),
            Ok(kind) if is_list(&kind) => match items {
                Items::Absent => Ok(()),
                Items::Other(v) => list_items(place, &kind, Some(v)).map(|_| ()),
                Items::Read(ReadItems {
                    failed: Some(e), ..
                }) => Err(e),
                Items::Read(read) => {
                    self.files.append(read.files);
                    self.files.add_items(place, &kind, read.kindless)
                }
            },
            // Not a list: `items` (not among `fields`) means nothing to the kinds nodelb reads.
            Ok(_) => self.files.add_value(place, Value::Object(fields)),
        };
        if let Err(e) = done {
            *self.failed = Some(e);
        }
    }
}

impl<'de> DeserializeSeed<'de> for Document<'_> {
    type Value = ();

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for Document<'_> {
    type Value = ();

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a Kubernetes object")
    }

    fn visit_unit<E>(self) -> Result<(), E> {
        Ok(())
    }

    fn visit_none<E>(self) -> Result<(), E> {
        Ok(())
    }

    fn visit_some<D: Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
        d.deserialize_any(self)
    }

    fn visit_bool<E>(self, v: bool) -> Result<(), E> {
        self.not_an_object(v.into())
    }

    fn visit_i64<E>(self, v: i64) -> Result<(), E> {
        self.not_an_object(v.into())
    }

    fn visit_u64<E>(self, v: u64) -> Result<(), E> {
        self.not_an_object(v.into())
    }

    fn visit_f64<E>(self, v: f64) -> Result<(), E> {
        self.not_an_object(v.into())
    }

    fn visit_str<E>(self, v: &str) -> Result<(), E> {
        self.not_an_object(v.into())
    }

    fn visit_seq<A: SeqAccess<'de>>(self, seq: A) -> Result<(), A::Error> {
        let v = Value::deserialize(SeqAccessDeserializer::new(seq))?;
        self.not_an_object(v)
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<(), A::Error> {
        let mut fields = Map::new();
        let mut items = Items::Absent;
        while let Some(key) = map.next_key::<String>()? {
            if key == "items" {
                let list_kind = fields
                    .get("kind")
                    .and_then(Value::as_str)
                    .map(str::to_string);
                items = map.next_value_seed(ItemsSeed {
                    place: self.place,
                    list_kind,
                })?;
            } else {
                // As a map is read into a `Value`: of a repeated key, the last counts.
                fields.insert(key, map.next_value()?);
            }
        }
        self.finish(fields, items);
        Ok(())
    }
}

/// A document's `items`, read.
enum Items {
    Absent,
    /// Not a list: an error if the document is a list.
    Other(Value),
    Read(ReadItems),
}

/// The items of a list, read: those added (as the document's kind was a list's when they came,
/// or they had their own kind), then those that wait for the document's kind.
#[derive(Default)]
struct ReadItems {
    files: ObjectFiles,
    /// From the first item that had no kind while the list's was not known yet, in order.
    kindless: Vec<Value>,
    failed: Option<Error>,
}

struct ItemsSeed<'a> {
    place: Place<'a>,
    list_kind: Option<String>,
}

impl<'de> DeserializeSeed<'de> for ItemsSeed<'_> {
    type Value = Items;

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Items, D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for ItemsSeed<'_> {
    type Value = Items;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a list of objects")
    }

    fn visit_unit<E>(self) -> Result<Items, E> {
        Ok(Items::Absent)
    }

    fn visit_none<E>(self) -> Result<Items, E> {
        Ok(Items::Absent)
    }

    fn visit_some<D: Deserializer<'de>>(self, d: D) -> Result<Items, D::Error> {
        d.deserialize_any(self)
    }

    fn visit_bool<E>(self, v: bool) -> Result<Items, E> {
        Ok(Items::Other(v.into()))
    }

    fn visit_i64<E>(self, v: i64) -> Result<Items, E> {
        Ok(Items::Other(v.into()))
    }

    fn visit_u64<E>(self, v: u64) -> Result<Items, E> {
        Ok(Items::Other(v.into()))
    }

    fn visit_f64<E>(self, v: f64) -> Result<Items, E> {
        Ok(Items::Other(v.into()))
    }

    fn visit_str<E>(self, v: &str) -> Result<Items, E> {
        Ok(Items::Other(v.into()))
    }

    fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<Items, A::Error> {
        Value::deserialize(MapAccessDeserializer::new(map)).map(Items::Other)
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Items, A::Error> {
        let mut read = ReadItems::default();
        while let Some(item) = seq.next_element::<Value>()? {
            if read.failed.is_some() {
                continue;
            }
            let waits = self.list_kind.is_none() && item.get("kind").is_none();
            if waits || !read.kindless.is_empty() {
                read.kindless.push(item);
                continue;
            }
            let item = match &self.list_kind {
                Some(k) => with_kind(k, item),
                None => item,
            };
            if let Err(e) = read.files.add_value(self.place, item) {
                read.failed = Some(e);
            }
        }
        Ok(Items::Read(read))
    }
}

fn read_text(path: &Path) -> Result<String, Error> {
    let read = |source| Error::Read {
        path: path.to_path_buf(),
        source,
    };
    if path.as_os_str() == "-" {
        let mut s = String::new();
        std::io::stdin().read_to_string(&mut s).map_err(read)?;
        Ok(s)
    } else {
        std::fs::read_to_string(path).map_err(read)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn read(text: &str) -> Result<ObjectFiles, Error> {
        let mut o = ObjectFiles::default();
        o.add_text(Path::new("test.yaml"), text)?;
        Ok(o)
    }

    /// The skipped objects as `render` and `apply` print them.
    fn skipped(o: &ObjectFiles) -> Vec<String> {
        o.skipped.iter().map(ToString::to_string).collect()
    }

    const SERVICE: &str = r#"
apiVersion: v1
kind: Service
metadata: {name: web, namespace: default}
spec:
  type: LoadBalancer
  ports: [{name: http, port: 80, protocol: TCP, targetPort: 8080}]
"#;

    const SLICE: &str = r#"
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata:
  name: web-abc
  namespace: default
  labels: {kubernetes.io/service-name: web}
addressType: IPv4
endpoints: [{addresses: [198.51.100.7], conditions: {ready: true}}]
ports: [{name: http, port: 8080, protocol: TCP}]
"#;

    #[test]
    fn multi_document_yaml_keeps_services_slices_and_nodes() {
        let text = format!(
            "{SERVICE}---\n{SLICE}---\napiVersion: v1\nkind: Node\nmetadata: {{name: n1}}\n---\n"
        );
        let o = read(&text).unwrap();
        assert_eq!(o.services.len(), 1);
        assert_eq!(o.services[0].metadata.name.as_deref(), Some("web"));
        assert_eq!(o.slices.len(), 1);
        assert_eq!(o.slices[0].endpoints.len(), 1);
        assert_eq!(o.nodes.len(), 1);
        assert!(o.skipped.is_empty());
    }

    #[test]
    fn lists_are_unpacked_including_kubectl_typed_lists_without_item_kinds() {
        let json = r#"{"apiVersion": "v1", "kind": "List", "items": [
            {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "a", "namespace": "x"}},
            {"apiVersion": "v1", "kind": "List", "items": [
                {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "b", "namespace": "x"}}
            ]}
        ]}"#;
        let o = read(json).unwrap();
        assert_eq!(o.services.len(), 2);
        let typed = "apiVersion: v1\nkind: ServiceList\nitems:\n- metadata: {name: c, namespace: y}\n  spec: {type: LoadBalancer}\n";
        let o = read(typed).unwrap();
        assert_eq!(o.services[0].metadata.name.as_deref(), Some("c"));
    }

    #[test]
    fn json_lists_are_read_whatever_the_order_of_their_fields() {
        // As kubectl prints them: `items` before `kind`.
        let json = r#"{"apiVersion": "v1", "items": [
            {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "a", "namespace": "x"}},
            {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "c", "namespace": "x"}},
            {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "b", "namespace": "x"}}
        ], "kind": "List", "metadata": {"resourceVersion": ""}}"#;
        let o = read(json).unwrap();
        let names: Vec<_> = o
            .services
            .iter()
            .map(|s| s.metadata.name.as_deref())
            .collect();
        assert_eq!(names, [Some("a"), Some("b")]);
        assert_eq!(o.skipped.len(), 1);
        // A typed list's items take its kind, also when it comes last; the order is kept.
        let json = r#"{"items": [
            {"metadata": {"name": "a", "namespace": "x"}},
            {"kind": "Service", "metadata": {"name": "b", "namespace": "x"}},
            {"metadata": {"name": "c", "namespace": "x"}}
        ], "kind": "ServiceList"}"#;
        let o = read(json).unwrap();
        let names: Vec<_> = o
            .services
            .iter()
            .map(|s| s.metadata.name.as_deref())
            .collect();
        assert_eq!(names, [Some("a"), Some("b"), Some("c")]);
        // Items of an object that is not a list mean nothing.
        let o = read(
            r#"{"items": [{"kind": "Service"}], "kind": "Service", "metadata": {"name": "s"}}"#,
        )
        .unwrap();
        assert_eq!(o.services.len(), 1);
        let e = read(r#"{"kind": "List", "items": {"kind": "Service"}}"#).unwrap_err();
        assert!(e.to_string().contains("items is not a list"), "{e}");
        let e = read(r#"{"items": [{"metadata": {}}], "kind": "List"}"#).unwrap_err();
        assert!(e.to_string().contains("no kind"), "{e}");
    }

    #[test]
    fn flow_yaml_that_is_not_json_is_read_as_yaml() {
        let o =
            read("{kind: Service, apiVersion: v1, metadata: {name: a, namespace: x}}\n").unwrap();
        assert_eq!(o.services.len(), 1);
        let o = read("{\"kind\": \"Service\", \"metadata\": {\"name\": \"a\"}}\n---\n{\"kind\": \"Service\", \"metadata\": {\"name\": \"b\"}}\n")
            .unwrap();
        assert_eq!(o.services.len(), 2, "two JSON documents are YAML");
    }

    #[test]
    fn unknown_kinds_are_skipped_and_named() {
        let text = format!(
            "apiVersion: v1\nkind: ConfigMap\nmetadata: {{name: cfg, namespace: kube-system}}\n---\n{SERVICE}"
        );
        let o = read(&text).unwrap();
        assert_eq!(o.services.len(), 1);
        assert_eq!(
            skipped(&o),
            vec![
                "test.yaml: ConfigMap kube-system/cfg: not a Service, EndpointSlice or Node"
                    .to_string()
            ]
        );
    }

    #[test]
    fn bad_documents_name_file_document_and_object() {
        let e = read(&format!("{SERVICE}---\nkind: [unclosed\n")).unwrap_err();
        assert!(matches!(e, Error::Parse { document: 2, .. }), "{e}");
        let o = read(&format!(
            "apiVersion: v1\nkind: Service\nmetadata: {{name: s, namespace: d}}\nspec: {{ports: 3}}\n---\n{SERVICE}"
        ))
        .unwrap();
        assert_eq!(o.services.len(), 1, "the valid Service is still read");
        assert!(
            skipped(&o)[0]
                .starts_with("test.yaml: document 1: Service d/s is not a valid Service: "),
            "{:?}",
            o.skipped
        );
        let e = read("just a string\n").unwrap_err();
        assert!(matches!(e, Error::Shape { .. }), "{e}");
        let e = read("metadata: {name: x}\n").unwrap_err();
        assert!(e.to_string().contains("no kind"), "{e}");
    }

    #[test]
    fn files_are_read_from_disk() {
        let dir = std::env::temp_dir().join(format!("nodelb-objects-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let p = dir.join("svc.yaml");
        std::fs::write(&p, SERVICE).unwrap();
        let o = ObjectFiles::read(std::slice::from_ref(&p)).unwrap();
        assert_eq!(o.services.len(), 1);
        let missing = ObjectFiles::read(&[dir.join("nope.yaml")]).unwrap_err();
        assert!(matches!(missing, Error::Read { .. }));
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
