//! A kubeconfig for the double: one cluster (an `http://` server), one user
//! with a bearer token, one current context. kube-rs accepts plain HTTP
//! servers with tokens from such a file.

use std::path::{Path, PathBuf};

use serde_json::json;

#[derive(Debug, thiserror::Error)]
pub enum KubeconfigError {
    #[error("encoding the kubeconfig as YAML")]
    Encode(#[source] serde_yaml_ng::Error),
    #[error("writing kubeconfig {path}")]
    Write {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

/// The kubeconfig text.
pub fn render(server: &str, token: &str) -> Result<String, KubeconfigError> {
    let doc = json!({
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "nodelb-api-double", "cluster": {"server": server}}],
        "users": [{"name": "nodelb-api-double", "user": {"token": token}}],
        "contexts": [{
            "name": "nodelb-api-double",
            "context": {"cluster": "nodelb-api-double", "user": "nodelb-api-double"},
        }],
        "current-context": "nodelb-api-double",
        "preferences": {},
    });
    serde_yaml_ng::to_string(&doc).map_err(KubeconfigError::Encode)
}

/// Writes the kubeconfig to `path`.
pub fn write(path: &Path, server: &str, token: &str) -> Result<(), KubeconfigError> {
    let text = render(server, token)?;
    std::fs::write(path, text).map_err(|source| KubeconfigError::Write {
        path: path.to_path_buf(),
        source,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kube_rs_reads_it() {
        let text = render("http://127.0.0.1:6443", "secret").unwrap();
        let kc = kube::config::Kubeconfig::from_yaml(&text).unwrap();
        assert_eq!(kc.current_context.as_deref(), Some("nodelb-api-double"));
        assert_eq!(
            kc.clusters[0].cluster.as_ref().unwrap().server.as_deref(),
            Some("http://127.0.0.1:6443")
        );
    }
}
