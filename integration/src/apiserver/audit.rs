//! Audit log: one record per request, kept in memory for tests and
//! optionally appended to a file as JSON lines.

use std::fs::{File, OpenOptions};
use std::io::Write;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use serde::Serialize;
use tracing::warn;

#[derive(Debug, thiserror::Error)]
pub enum AuditError {
    #[error("opening audit file {path}")]
    Open {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

/// The object a write was about.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ObjectRef {
    pub resource: String,
    pub namespace: String,
    pub name: String,
    /// `status` or empty.
    pub subresource: String,
}

/// One request.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct AuditRecord {
    /// RFC 3339 with sub-second precision.
    pub time: String,
    /// RBAC verb (`list`, `watch`, `patch`, …) or, for non-resource
    /// requests, the lower-case HTTP method.
    pub verb: String,
    /// HTTP method.
    pub method: String,
    /// Path with query.
    pub uri: String,
    /// Empty when authentication failed.
    pub user: String,
    pub source: SocketAddr,
    /// Response code (for a watch, the code the stream started with).
    pub code: u16,
    /// For writes (create, update, patch, delete): the object.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub object: Option<ObjectRef>,
}

/// In-memory records plus the optional file.
#[derive(Debug)]
pub struct AuditLog {
    records: Mutex<Vec<AuditRecord>>,
    file: Option<(PathBuf, Mutex<File>)>,
}

impl AuditLog {
    pub fn new(file: Option<&Path>) -> Result<AuditLog, AuditError> {
        let file = match file {
            Some(path) => {
                let f = OpenOptions::new()
                    .create(true)
                    .append(true)
                    .open(path)
                    .map_err(|source| AuditError::Open {
                        path: path.to_path_buf(),
                        source,
                    })?;
                Some((path.to_path_buf(), Mutex::new(f)))
            }
            None => None,
        };
        Ok(AuditLog {
            records: Mutex::new(Vec::new()),
            file,
        })
    }

    /// Records a request. A failing file write is logged, not returned: the
    /// request it describes has already been answered.
    pub fn record(&self, rec: AuditRecord) {
        if let Some((path, file)) = &self.file {
            let mut line = serde_json::to_string(&rec).expect("audit records serialize");
            line.push('\n');
            let mut f = file.lock().expect("audit file lock");
            if let Err(error) = f.write_all(line.as_bytes()) {
                warn!(path = %path.display(), %error, "writing audit record failed");
            }
        }
        self.records.lock().expect("audit lock").push(rec);
    }

    pub fn records(&self) -> Vec<AuditRecord> {
        self.records.lock().expect("audit lock").clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rec(code: u16) -> AuditRecord {
        AuditRecord {
            time: "2024-01-01T00:00:00.5Z".into(),
            verb: "create".into(),
            method: "POST".into(),
            uri: "/api/v1/namespaces/a/services".into(),
            user: "alice".into(),
            source: "127.0.0.1:4000".parse().unwrap(),
            code,
            object: Some(ObjectRef {
                resource: "services".into(),
                namespace: "a".into(),
                name: "x".into(),
                subresource: String::new(),
            }),
        }
    }

    #[test]
    fn records_go_to_memory_and_file() {
        let path = std::env::temp_dir().join(format!("nodelb-audit-{}.jsonl", std::process::id()));
        let _ = std::fs::remove_file(&path);
        let log = AuditLog::new(Some(&path)).unwrap();
        log.record(rec(201));
        log.record(rec(409));
        assert_eq!(log.records().len(), 2);
        let text = std::fs::read_to_string(&path).unwrap();
        let lines: Vec<serde_json::Value> = text
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        assert_eq!(lines.len(), 2);
        assert_eq!(lines[1]["code"], 409);
        assert_eq!(lines[0]["source"], "127.0.0.1:4000");
        assert_eq!(lines[0]["object"]["name"], "x");
        std::fs::remove_file(&path).unwrap();
    }
}
