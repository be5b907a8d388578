//! Kubernetes objects from files, for `render` and `apply`: YAML or JSON, one or many documents
//! per file, `kind: List` (and `ServiceList`-style lists) unpacked. Services, EndpointSlices and
//! Nodes are kept; anything else is skipped and reported.

use crate::plan::slim::{EndpointSlice, Service};
use k8s_openapi::api::core::v1::Node;
use serde::Deserialize;
use std::io::Read;
use std::path::{Path, PathBuf};

/// What the files held.
#[derive(Clone, Debug, Default)]
pub struct Objects {
    pub services: Vec<Service>,
    pub slices: Vec<EndpointSlice>,
    pub nodes: Vec<Node>,
    /// Objects of other kinds, skipped: `file: Kind name`.
    pub skipped: Vec<String>,
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
    #[error("{path}: document {document}: {kind} {name} is not a valid {kind}")]
    Decode {
        path: PathBuf,
        document: usize,
        kind: String,
        name: String,
        #[source]
        source: serde_json::Error,
    },
}

impl Objects {
    /// Read every file (`-` is standard input), in order.
    pub fn read_files(paths: &[PathBuf]) -> Result<Objects, Error> {
        let mut out = Objects::default();
        for path in paths {
            let text = read_text(path)?;
            out.add_text(path, &text)?;
        }
        Ok(out)
    }

    /// Add the objects in one file's text. `path` only names the file in errors.
    pub fn add_text(&mut self, path: &Path, text: &str) -> Result<(), Error> {
        for (i, doc) in serde_yaml_ng::Deserializer::from_str(text).enumerate() {
            let document = i + 1;
            let value = serde_json::Value::deserialize(doc).map_err(|source| Error::Parse {
                path: path.to_path_buf(),
                document,
                source,
            })?;
            self.add_value(path, document, value)?;
        }
        Ok(())
    }

    fn add_value(
        &mut self,
        path: &Path,
        document: usize,
        value: serde_json::Value,
    ) -> Result<(), Error> {
        let shape = |what: String| Error::Shape {
            path: path.to_path_buf(),
            document,
            what,
        };
        let obj = match value {
            // An empty document (`---` at the end, comments only).
            serde_json::Value::Null => return Ok(()),
            serde_json::Value::Object(o) => o,
            other => return Err(shape(format!("expected an object, found {other}"))),
        };
        let kind = obj
            .get("kind")
            .and_then(|k| k.as_str())
            .ok_or_else(|| shape("object has no kind".into()))?
            .to_string();
        let name = obj
            .get("metadata")
            .and_then(|m| {
                let name = m.get("name")?.as_str()?;
                Some(match m.get("namespace").and_then(|n| n.as_str()) {
                    Some(ns) => format!("{ns}/{name}"),
                    None => name.to_string(),
                })
            })
            .unwrap_or_else(|| "(unnamed)".into());
        let value = serde_json::Value::Object(obj);
        let decode = |source| Error::Decode {
            path: path.to_path_buf(),
            document,
            kind: kind.clone(),
            name: name.clone(),
            source,
        };
        // An object of a kind nodelb reads that does not deserialize is skipped with its
        // reason, as the agent's watches skip it: the rest of the file is still planned.
        let skip = |e: serde_json::Error| self_skipped(decode(e));
        match kind.as_str() {
            "Service" => match serde_json::from_value(value) {
                Ok(v) => self.services.push(v),
                Err(e) => self.skipped.push(skip(e)),
            },
            "EndpointSlice" => match serde_json::from_value(value) {
                Ok(v) => self.slices.push(v),
                Err(e) => self.skipped.push(skip(e)),
            },
            "Node" => match serde_json::from_value(value) {
                Ok(v) => self.nodes.push(v),
                Err(e) => self.skipped.push(skip(e)),
            },
            k if k == "List" || k.ends_with("List") => {
                let serde_json::Value::Object(mut obj) = value else {
                    unreachable!("built from an object above")
                };
                let items = match obj.remove("items") {
                    Some(serde_json::Value::Array(items)) => items,
                    Some(serde_json::Value::Null) | None => Vec::new(),
                    Some(_) => return Err(shape(format!("{kind}: items is not a list"))),
                };
                // `kubectl get services -o yaml` items carry no kind of their own.
                let item_kind = k.strip_suffix("List").filter(|s| !s.is_empty());
                for mut item in items {
                    if let (Some(ik), Some(o)) = (item_kind, item.as_object_mut()) {
                        o.entry("kind").or_insert_with(|| ik.into());
                    }
                    self.add_value(path, document, item)?;
                }
            }
            _ => self.skipped.push(format!(
                "{}: {kind} {name}: not a Service, EndpointSlice or Node",
                path.display()
            )),
        }
        Ok(())
    }
}

/// The line a skipped, undecodable object leaves in [`Objects::skipped`].
fn self_skipped(e: Error) -> String {
    match &e {
        Error::Decode { source, .. } => format!("{e}: {source}"),
        _ => e.to_string(),
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

    fn read(text: &str) -> Result<Objects, Error> {
        let mut o = Objects::default();
        o.add_text(Path::new("test.yaml"), text)?;
        Ok(o)
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
            o.skipped,
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
            o.skipped[0].starts_with("test.yaml: document 1: Service d/s is not a valid Service: "),
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
        let o = Objects::read_files(std::slice::from_ref(&p)).unwrap();
        assert_eq!(o.services.len(), 1);
        let missing = Objects::read_files(&[dir.join("nope.yaml")]).unwrap_err();
        assert!(matches!(missing, Error::Read { .. }));
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
