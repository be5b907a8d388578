//! Fields the store strips on write, to imitate an API server older than
//! the field (before 1.30 kube-apiserver silently drops
//! `status.loadBalancer.ingress[].ipMode`).
//!
//! Path syntax: dot-separated keys; `name[]` steps into every element of
//! the list `name`: `status.loadBalancer.ingress[].ipMode`.

use serde_json::Value;

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid drop-field path {0:?}")]
pub struct InvalidPath(pub String);

#[derive(Debug, Clone, PartialEq, Eq)]
enum Step {
    Key(String),
    EachOf(String),
}

/// One parsed path.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DroppedField(Vec<Step>);

impl DroppedField {
    pub fn parse(path: &str) -> Result<DroppedField, InvalidPath> {
        let mut steps = Vec::new();
        for seg in path.split('.') {
            let step = match seg.strip_suffix("[]") {
                Some(list) => Step::EachOf(list.to_string()),
                None => Step::Key(seg.to_string()),
            };
            if matches!(&step, Step::Key(k) | Step::EachOf(k) if k.is_empty() || k.contains(['[', ']']))
            {
                return Err(InvalidPath(path.to_string()));
            }
            steps.push(step);
        }
        if matches!(steps.last(), Some(Step::EachOf(_)) | None) {
            return Err(InvalidPath(path.to_string()));
        }
        Ok(DroppedField(steps))
    }

    /// Removes the field wherever the path reaches it.
    pub fn strip(&self, object: &mut Value) {
        strip(object, &self.0);
    }
}

fn strip(v: &mut Value, steps: &[Step]) {
    let Some((first, rest)) = steps.split_first() else {
        return;
    };
    let Some(map) = v.as_object_mut() else {
        return;
    };
    match first {
        Step::Key(k) if rest.is_empty() => {
            map.remove(k);
        }
        Step::Key(k) => {
            if let Some(child) = map.get_mut(k) {
                strip(child, rest);
            }
        }
        Step::EachOf(k) => {
            if let Some(items) = map.get_mut(k).and_then(Value::as_array_mut) {
                for item in items {
                    strip(item, rest);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn strips_ip_mode_from_every_ingress() {
        let f = DroppedField::parse("status.loadBalancer.ingress[].ipMode").unwrap();
        let mut v = json!({"status": {"loadBalancer": {"ingress": [
            {"ip": "192.0.2.1", "ipMode": "Proxy"}, {"ip": "192.0.2.2", "ipMode": "VIP"}]}}});
        f.strip(&mut v);
        assert_eq!(
            v,
            json!({"status": {"loadBalancer": {"ingress": [{"ip": "192.0.2.1"}, {"ip": "192.0.2.2"}]}}})
        );
    }

    #[test]
    fn missing_parents_are_fine_and_bad_paths_refused() {
        let f = DroppedField::parse("spec.a").unwrap();
        let mut v = json!({"metadata": {}});
        f.strip(&mut v);
        assert_eq!(v, json!({"metadata": {}}));
        assert!(DroppedField::parse("a..b").is_err());
        assert!(DroppedField::parse("a.b[]").is_err());
        assert!(DroppedField::parse("").is_err());
    }
}
