//! Kubernetes objects from YAML, as `nodelb-agent render -f` reads them: multi-document files
//! and `kind: List`, Services and EndpointSlices kept, other kinds ignored, documents that do
//! not read as their kind reported and skipped (bad input never stops planning).

use nodelb_agent::plan::slim::{EndpointSlice, Service};
use serde::Deserialize;
use serde_yaml_ng::Value;

/// What a YAML text held.
#[derive(Debug, Default)]
pub struct Objects {
    pub services: Vec<Service>,
    pub slices: Vec<EndpointSlice>,
    /// One line per document that was skipped: unreadable, or of a kind nodelb does not read.
    pub skipped: Vec<String>,
}

impl Objects {
    /// Reads every document of `text`. Panics only if the text is not YAML at all.
    pub fn from_yaml(text: &str) -> Objects {
        let mut out = Objects::default();
        for (i, doc) in serde_yaml_ng::Deserializer::from_str(text).enumerate() {
            let value = Value::deserialize(doc)
                .unwrap_or_else(|e| panic!("document {}: not YAML: {e}", i + 1));
            out.add(value, &format!("document {}", i + 1));
        }
        out
    }

    fn add(&mut self, value: Value, place: &str) {
        if value.is_null() {
            return;
        }
        let kind = value.get("kind").and_then(Value::as_str).unwrap_or("");
        let name = || {
            let meta = value.get("metadata");
            let s = |k: &str| {
                meta.and_then(|m| m.get(k))
                    .and_then(Value::as_str)
                    .unwrap_or("")
                    .to_string()
            };
            format!("{}/{}", s("namespace"), s("name"))
        };
        match kind {
            "Service" => match serde_yaml_ng::from_value(value.clone()) {
                Ok(s) => self.services.push(s),
                Err(e) => self
                    .skipped
                    .push(format!("{place}: Service {} unreadable: {e}", name())),
            },
            "EndpointSlice" => match serde_yaml_ng::from_value(value.clone()) {
                Ok(s) => self.slices.push(s),
                Err(e) => self
                    .skipped
                    .push(format!("{place}: EndpointSlice {} unreadable: {e}", name())),
            },
            "List" => {
                let items = match value.get("items") {
                    Some(Value::Sequence(items)) => items.clone(),
                    _ => Vec::new(),
                };
                for (j, item) in items.into_iter().enumerate() {
                    self.add(item, &format!("{place} item {}", j + 1));
                }
            }
            other => self
                .skipped
                .push(format!("{place}: kind {other:?} ({}) ignored", name())),
        }
    }
}
