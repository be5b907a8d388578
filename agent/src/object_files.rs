//! Kubernetes objects from files, for `render -f`, `apply -f` and the golden tests: YAML or
//! JSON, one or many documents per file, `kind: List` (and `ServiceList`-style lists) unpacked.
//! Services and EndpointSlices are read into the watches' own types ([`crate::kube::wire`]) and
//! kept as the index keeps them; Nodes are kept whole; anything else is skipped and reported.

use crate::kube::wire;
use crate::plan::index;
use k8s_openapi::api::core::v1::Node;
use serde::de::DeserializeOwned;
use serde::Deserialize;
use serde_yaml_ng::{Mapping, Value};
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

    /// Add the objects in one file's text. `path` only names the file in errors and skips.
    pub fn add_text(&mut self, path: &Path, text: &str) -> Result<(), Error> {
        for (i, doc) in serde_yaml_ng::Deserializer::from_str(text).enumerate() {
            let place = Place {
                path,
                document: i + 1,
            };
            let value = Value::deserialize(doc).map_err(|source| Error::Parse {
                path: path.to_path_buf(),
                document: place.document,
                source,
            })?;
            self.add_value(place, value)?;
        }
        Ok(())
    }

    fn add_value(&mut self, place: Place<'_>, value: Value) -> Result<(), Error> {
        let obj = match value {
            // An empty document (`---` at the end, comments only).
            Value::Null => return Ok(()),
            Value::Mapping(m) => m,
            other => {
                let shown = serde_json::to_string(&other).unwrap_or_else(|e| e.to_string());
                return Err(place.shape(format!("expected an object, found {shown}")));
            }
        };
        let kind = obj
            .get("kind")
            .and_then(Value::as_str)
            .ok_or_else(|| place.shape("object has no kind".into()))?
            .to_string();
        let meta = |k: &str| {
            let m = obj.get("metadata")?.get(k)?;
            m.as_str().map(str::to_string)
        };
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
        let value = Value::Mapping(obj);
        let kept = match skipped.kind.as_str() {
            "Service" => read::<wire::Service>(value).map(|s| self.services.push(s.into())),
            "EndpointSlice" => {
                read::<wire::EndpointSlice>(value).map(|s| self.slices.push(s.into()))
            }
            "Node" => read::<Node>(value).map(|n| self.nodes.push(n)),
            k if k == "List" || k.ends_with("List") => {
                let Value::Mapping(obj) = value else {
                    unreachable!("built from a mapping above")
                };
                return self.add_list(place, &skipped.kind, obj);
            }
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

    fn add_list(&mut self, place: Place<'_>, kind: &str, mut obj: Mapping) -> Result<(), Error> {
        let items = match obj.remove("items") {
            Some(Value::Sequence(items)) => items,
            Some(Value::Null) | None => Vec::new(),
            Some(_) => return Err(place.shape(format!("{kind}: items is not a list"))),
        };
        // `kubectl get services -o yaml` items carry no kind of their own.
        let item_kind = kind.strip_suffix("List").filter(|s| !s.is_empty());
        for mut item in items {
            if let (Some(ik), Value::Mapping(o)) = (item_kind, &mut item) {
                if !o.contains_key("kind") {
                    o.insert("kind".into(), ik.into());
                }
            }
            self.add_value(place, item)?;
        }
        Ok(())
    }
}

fn read<T: DeserializeOwned>(value: Value) -> Result<T, serde_yaml_ng::Error> {
    serde_yaml_ng::from_value(value)
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
