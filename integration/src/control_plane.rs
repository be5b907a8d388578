//! The real control plane every end-to-end test and the latency benchmark run
//! against: etcd (Debian's `etcd-server`) and kube-apiserver, built by
//! `scripts/kubernetes.sh` from the pinned `k8s.io/kubernetes` Go module in
//! `integration/kubernetes/`, both started inside one network namespace the harness created.
//!
//! - etcd listens on that namespace's loopback only; its data lives on tmpfs (`/dev/shm`) when
//!   there is one, so a test pays no disk flush per write, and is deleted on drop.
//! - kube-apiserver serves HTTPS on `0.0.0.0:6443` of the namespace with a certificate of a CA
//!   made per control plane (its names: every address in [`ControlPlaneOptions::serving_ips`]),
//!   authenticates static tokens ([`ControlPlaneOptions::tokens`]) and ServiceAccount tokens
//!   signed with a key made per control plane, authorizes with RBAC only, admits privileged
//!   pods (as kubeadm configures it) and writes a JSON audit log of every request
//!   ([`ControlPlane::audit`]).
//! - ClusterIPs come from 198.18.0.0/16 and 2001:db8:5e::/112: the API server needs a range to
//!   allocate from, a 10,000-Service benchmark needs more addresses than a documentation /24
//!   holds, and 198.18.0.0/15 is reserved for benchmarks. No namespace has a route there and
//!   nodelb never programs ClusterIPs: nothing is ever sent to them.
//!
//! Processes are started with `ip netns exec` (which execs in place, so the pid is the server's),
//! die with the thread that started them (`PR_SET_PDEATHSIG`), and are killed by pid on drop.

use std::fmt::Write as _;
use std::net::{IpAddr, Ipv4Addr};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use k8s_openapi::jiff::Timestamp;
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::Client;
use nix::sys::signal::Signal;
use nix::unistd::Pid;
use serde_json::{json, Value};

use crate::netns::Netns;

/// The port kube-apiserver serves on inside its namespace.
pub const API_PORT: u16 = 6443;
/// How long kube-apiserver may take to answer `/readyz` with 200.
const READY_WAIT: Duration = Duration::from_secs(120);
/// Service ClusterIP ranges (see the module docs).
const SERVICE_CIDRS: &str = "198.18.0.0/16,2001:db8:5e::/112";

/// What to start.
#[derive(Debug, Clone)]
pub struct ControlPlaneOptions {
    /// `--advertise-address`: a namespace without a default route has no address to pick.
    pub advertise: Ipv4Addr,
    /// Addresses the serving certificate names (clients connect to these), 127.0.0.1 besides.
    pub serving_ips: Vec<IpAddr>,
    /// Static bearer tokens: (token, user name, groups).
    pub tokens: Vec<(String, String, Vec<String>)>,
}

/// A running etcd and kube-apiserver; both killed (by pid) and their data deleted on drop.
pub struct ControlPlane {
    etcd: Option<Child>,
    apiserver: Option<Child>,
    etcd_data: PathBuf,
    dir: PathBuf,
    ca_pem: String,
    version: String,
}

/// Where `scripts/kubernetes.sh` put the binaries (it builds them on first use, then
/// reuses its cache): `kube-apiserver` and `kubectl` of the pinned release.
pub fn binaries_dir() -> Result<PathBuf, String> {
    static DIR: OnceLock<Result<PathBuf, String>> = OnceLock::new();
    DIR.get_or_init(|| built_by("kubernetes.sh", "the real kube-apiserver"))
        .clone()
}

/// Runs `scripts/<script>`, which builds `what` into the cache (or finds it there) and prints
/// its path.
fn built_by(script: &str, what: &str) -> Result<PathBuf, String> {
    let script = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../scripts")
        .join(script);
    let out = Command::new("bash")
        .arg(&script)
        .stderr(Stdio::inherit())
        .output()
        .map_err(|e| format!("cannot run {}: {e}", script.display()))?;
    if !out.status.success() {
        return Err(format!(
            "{} failed ({}): {what} could not be built",
            script.display(),
            out.status
        ));
    }
    Ok(PathBuf::from(String::from_utf8_lossy(&out.stdout).trim()))
}

/// The pinned `kubectl` (same release as the server).
pub fn kubectl() -> Result<PathBuf, String> {
    Ok(binaries_dir()?.join("kubectl"))
}

/// The pinned `helm` (`helm.sh/helm/v3` in `integration/helm/go.mod`), which
/// `scripts/helm.sh` builds into the cache on first use.
pub fn helm() -> Result<PathBuf, String> {
    static HELM: OnceLock<Result<PathBuf, String>> = OnceLock::new();
    HELM.get_or_init(|| built_by("helm.sh", "helm")).clone()
}

/// The `k8s.io/kubernetes` version `integration/kubernetes/go.mod` pins (`v1.36.3`).
pub fn pinned_version() -> String {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("kubernetes/go.mod");
    let text = std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("reading {}: {e}", path.display()));
    text.lines()
        .find_map(|l| {
            let mut w = l.split_whitespace();
            (w.next() == Some("k8s.io/kubernetes")).then(|| {
                w.next()
                    .filter(|v| v.starts_with("v1."))
                    .map(str::to_string)
            })?
        })
        .unwrap_or_else(|| panic!("{} requires no k8s.io/kubernetes", path.display()))
}

/// Starts `cmd` (already `ip netns exec …`) with its output appended to `log`, dying with the
/// calling thread.
fn spawn_logged(mut cmd: Command, log: &Path) -> Result<Child, String> {
    let file = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(log)
        .map_err(|e| format!("opening {}: {e}", log.display()))?;
    cmd.stdin(Stdio::null())
        .stdout(file.try_clone().map_err(|e| e.to_string())?)
        .stderr(file);
    crate::netns::dies_with_thread(&mut cmd)
        .spawn()
        .map_err(|e| format!("starting {cmd:?}: {e}"))
}

/// The last `n` lines of a log file, for failure messages.
pub fn tail(path: &Path, n: usize) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}

struct Pki {
    ca_pem: String,
    cert_pem: String,
    key_pem: String,
    service_account_key_pem: String,
    service_account_pub_pem: String,
}

fn pki(serving_ips: &[IpAddr]) -> Result<Pki, rcgen::Error> {
    use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, KeyPair, SanType};
    let ca_key = KeyPair::generate()?;
    let mut ca = CertificateParams::new(Vec::new())?;
    ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca.distinguished_name
        .push(DnType::CommonName, "nodelb e2e control plane CA");
    let ca_cert = ca.self_signed(&ca_key)?;
    let ca_issuer = rcgen::Issuer::new(ca, ca_key);
    let key = KeyPair::generate()?;
    let mut params = CertificateParams::new(vec![
        "kubernetes".to_string(),
        "kubernetes.default".to_string(),
        "kubernetes.default.svc".to_string(),
        "localhost".to_string(),
    ])?;
    params
        .distinguished_name
        .push(DnType::CommonName, "kube-apiserver");
    let mut ips: Vec<IpAddr> = serving_ips.to_vec();
    ips.push(IpAddr::V4(Ipv4Addr::LOCALHOST));
    ips.push("198.18.0.1".parse().expect("an address"));
    ips.sort();
    ips.dedup();
    params
        .subject_alt_names
        .extend(ips.into_iter().map(SanType::IpAddress));
    let cert = params.signed_by(&key, &ca_issuer)?;
    let sa = KeyPair::generate()?;
    Ok(Pki {
        ca_pem: ca_cert.pem(),
        cert_pem: cert.pem(),
        key_pem: key.serialize_pem(),
        service_account_key_pem: sa.serialize_pem(),
        service_account_pub_pem: sa.public_key_pem(),
    })
}

fn write(path: &Path, text: &str) -> Result<(), String> {
    std::fs::write(path, text).map_err(|e| format!("writing {}: {e}", path.display()))
}

/// The audit policy: every request at `Metadata` (who, what, from where, the answer), not its
/// body. Watches are logged when their response starts and when it ends.
const AUDIT_POLICY: &str = "apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: [RequestReceived]
rules:
  - level: Metadata
";

/// Keys, certificates, static tokens and the audit policy of a control plane, written to `dir`.
fn write_files(dir: &Path, options: &ControlPlaneOptions) -> Result<Pki, String> {
    let pki = pki(&options.serving_ips).map_err(|e| format!("making certificates: {e}"))?;
    write(&dir.join("ca.crt"), &pki.ca_pem)?;
    write(&dir.join("apiserver.crt"), &pki.cert_pem)?;
    write(&dir.join("apiserver.key"), &pki.key_pem)?;
    write(&dir.join("sa.key"), &pki.service_account_key_pem)?;
    write(&dir.join("sa.pub"), &pki.service_account_pub_pem)?;
    let mut tokens = String::new();
    for (token, user, groups) in &options.tokens {
        let _ = writeln!(tokens, "{token},{user},{user},\"{}\"", groups.join(","));
    }
    write(&dir.join("tokens.csv"), &tokens)?;
    write(&dir.join("audit-policy.yaml"), AUDIT_POLICY)?;
    Ok(pki)
}

/// etcd's data directory: on tmpfs (`/dev/shm`) when there is one, so a test pays no disk
/// flush per write.
fn etcd_data_dir(dir: &Path) -> PathBuf {
    let shm = Path::new("/dev/shm");
    if !shm.is_dir() {
        return dir.join("etcd");
    }
    shm.join(format!(
        "nodelb-etcd-{}",
        dir.parent()
            .and_then(Path::file_name)
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_else(|| std::process::id().to_string())
    ))
}

fn etcd_command(ns: &Netns, data: &Path) -> Command {
    let mut etcd = ns.command("etcd");
    etcd.arg("--name=nodelb-e2e")
        .arg(format!("--data-dir={}", data.display()))
        .arg("--listen-client-urls=http://127.0.0.1:2379")
        .arg("--advertise-client-urls=http://127.0.0.1:2379")
        .arg("--listen-peer-urls=http://127.0.0.1:2380")
        .arg("--initial-advertise-peer-urls=http://127.0.0.1:2380")
        .arg("--initial-cluster=nodelb-e2e=http://127.0.0.1:2380")
        .arg("--listen-metrics-urls=")
        .arg("--log-level=warn")
        .arg("--logger=zap");
    etcd
}

fn apiserver_command(
    ns: &Netns,
    bins: &Path,
    dir: &Path,
    options: &ControlPlaneOptions,
) -> Command {
    let d = |f: &str| dir.join(f).display().to_string();
    let mut api = ns.command(bins.join("kube-apiserver"));
    api.arg("--etcd-servers=http://127.0.0.1:2379")
        .arg("--bind-address=0.0.0.0")
        .arg(format!("--secure-port={API_PORT}"))
        .arg(format!("--advertise-address={}", options.advertise))
        .arg(format!("--tls-cert-file={}", d("apiserver.crt")))
        .arg(format!("--tls-private-key-file={}", d("apiserver.key")))
        .arg(format!("--token-auth-file={}", d("tokens.csv")))
        .arg("--authorization-mode=RBAC")
        .arg("--allow-privileged=true")
        .arg("--service-account-issuer=https://kubernetes.default.svc")
        .arg(format!("--service-account-key-file={}", d("sa.pub")))
        .arg(format!(
            "--service-account-signing-key-file={}",
            d("sa.key")
        ))
        .arg(format!("--service-cluster-ip-range={SERVICE_CIDRS}"))
        .arg(format!("--audit-policy-file={}", d("audit-policy.yaml")))
        .arg(format!("--audit-log-path={}", d("audit.log")))
        .arg("--audit-log-mode=blocking")
        .arg("--audit-log-maxsize=0")
        .arg("--audit-log-maxbackup=0")
        .arg("--profiling=false")
        .arg(format!("--cert-dir={}", d("certs")))
        .arg("--v=1");
    api
}

impl ControlPlane {
    /// Starts etcd and kube-apiserver in `ns`, writing keys, logs and the audit log under
    /// `dir`. Returns once both processes are running; [`ControlPlane::wait_ready`] waits for
    /// the API server to be ready.
    pub fn start(ns: &Netns, dir: &Path, options: &ControlPlaneOptions) -> Result<Self, String> {
        let bins = binaries_dir()?;
        let dir = dir.join("control-plane");
        std::fs::create_dir_all(&dir).map_err(|e| format!("creating {}: {e}", dir.display()))?;
        let pki = write_files(&dir, options)?;
        let etcd_data = etcd_data_dir(&dir);
        let _ = std::fs::remove_dir_all(&etcd_data);
        let mut cp = ControlPlane {
            etcd: None,
            apiserver: None,
            etcd_data: etcd_data.clone(),
            dir: dir.clone(),
            ca_pem: pki.ca_pem,
            version: pinned_version(),
        };

        cp.etcd = Some(
            spawn_logged(etcd_command(ns, &etcd_data), &dir.join("etcd.log")).map_err(|e| {
                format!("{e} (etcd comes from Debian's etcd-server: scripts/deps.sh installs it)")
            })?,
        );
        let api = apiserver_command(ns, &bins, &dir, options);
        cp.apiserver = Some(spawn_logged(api, &dir.join("kube-apiserver.log"))?);
        Ok(cp)
    }

    /// The API server's version (`v1.36.3`): what `scripts/kubernetes.sh` built.
    pub fn version(&self) -> &str {
        &self.version
    }

    /// The CA that signed the serving certificate, PEM.
    pub fn ca_pem(&self) -> &str {
        &self.ca_pem
    }

    /// The process ids of etcd and kube-apiserver, while they were started.
    pub fn pids(&self) -> Vec<u32> {
        [&self.etcd, &self.apiserver]
            .into_iter()
            .flatten()
            .map(Child::id)
            .collect()
    }

    /// etcd's data directory (deleted on drop).
    pub fn etcd_data(&self) -> &Path {
        &self.etcd_data
    }

    /// kube-apiserver's own log.
    pub fn log_path(&self) -> PathBuf {
        self.dir.join("kube-apiserver.log")
    }

    /// The audit log file (JSON lines).
    pub fn audit_path(&self) -> PathBuf {
        self.dir.join("audit.log")
    }

    /// A kubeconfig for `server` (`https://<ip>:<port>`) with this CA and a bearer token.
    pub fn kubeconfig(&self, server: &str, token: &str) -> String {
        use base64::Engine as _;
        let ca = base64::engine::general_purpose::STANDARD.encode(self.ca_pem.as_bytes());
        let doc = json!({
            "apiVersion": "v1", "kind": "Config",
            "clusters": [{"name": "nodelb-e2e", "cluster": {
                "server": server, "certificate-authority-data": ca}}],
            "users": [{"name": "nodelb-e2e", "user": {"token": token}}],
            "contexts": [{"name": "nodelb-e2e",
                "context": {"cluster": "nodelb-e2e", "user": "nodelb-e2e"}}],
            "current-context": "nodelb-e2e",
        });
        serde_yaml_ng::to_string(&doc).expect("kubeconfig YAML")
    }

    /// Whether both processes still run (reaps them if they exited).
    pub fn running(&mut self) -> Result<(), String> {
        for (what, child, log) in [
            ("etcd", &mut self.etcd, "etcd.log"),
            ("kube-apiserver", &mut self.apiserver, "kube-apiserver.log"),
        ] {
            if let Some(c) = child {
                if let Ok(Some(status)) = c.try_wait() {
                    return Err(format!(
                        "{what} exited ({status}); last lines of its log:\n{}",
                        tail(&self.dir.join(log), 15)
                    ));
                }
            }
        }
        Ok(())
    }

    /// Waits until `GET /readyz` through `client` answers `ok`; fails with the server's log if
    /// a process exits or the server is not ready within two minutes.
    pub async fn wait_ready(&mut self, client: &Client) -> Result<Duration, String> {
        let start = Instant::now();
        let mut last = String::new();
        while start.elapsed() < READY_WAIT {
            self.running()?;
            let req = http::Request::get("/readyz")
                .body(Vec::new())
                .expect("a request");
            match client.request_text(req).await {
                Ok(body) if body.trim() == "ok" => return Ok(start.elapsed()),
                Ok(body) => last = body,
                Err(e) => last = e.to_string(),
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        Err(format!(
            "kube-apiserver is not ready after {READY_WAIT:?} (last: {last}); last lines of its \
             log:\n{}",
            tail(&self.log_path(), 15)
        ))
    }

    /// Every request so far, from the audit log: one record per request, in the order the
    /// server finished logging them (a watch appears when its response started).
    pub fn audit(&self) -> Vec<AuditRecord> {
        let text = std::fs::read_to_string(self.audit_path()).unwrap_or_default();
        parse_audit(&text)
    }
}

impl Drop for ControlPlane {
    fn drop(&mut self) {
        for child in [self.apiserver.take(), self.etcd.take()]
            .into_iter()
            .flatten()
        {
            let mut child = child;
            let _ = nix::sys::signal::kill(Pid::from_raw(child.id() as i32), Signal::SIGKILL);
            let _ = child.wait();
        }
        let _ = std::fs::remove_dir_all(&self.etcd_data);
    }
}

/// The object a request was about.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ObjectRef {
    /// API group, `""` for the core group.
    pub group: String,
    pub resource: String,
    /// `""` for cluster-scoped or all-namespaces requests.
    pub namespace: String,
    /// `""` for a list, a watch or a create without a name.
    pub name: String,
    /// `status` or `""`.
    pub subresource: String,
}

impl ObjectRef {
    /// `resource` or `resource/subresource`, as RBAC names it.
    pub fn rbac_resource(&self) -> String {
        if self.subresource.is_empty() {
            self.resource.clone()
        } else {
            format!("{}/{}", self.resource, self.subresource)
        }
    }
}

/// One request, as kube-apiserver's audit log records it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AuditRecord {
    /// When the server logged it (RFC 3339, microseconds): its first line's `stageTimestamp`
    /// (for a watch, when its response started).
    pub time: String,
    /// When the server received it (RFC 3339, microseconds: `requestReceivedTimestamp`). A
    /// request sent after another's effect was seen is received after that one, whatever order
    /// their records reach the log in (a write's record can follow a read that saw it).
    pub received: String,
    /// When its response was complete (for a watch, when the stream ended); `None` while a
    /// watch still runs.
    pub ended: Option<String>,
    /// Request verb: `get`, `list`, `watch`, `create`, `update`, `patch`, `delete`, … (for a
    /// non-resource request the lower-case HTTP method).
    pub verb: String,
    /// Path with query.
    pub uri: String,
    /// The authenticated user; empty when authentication failed.
    pub user: String,
    /// The client's address (the first of the record's `sourceIPs`).
    pub source: IpAddr,
    /// The response code (for a watch, the one its stream started with).
    pub code: u16,
    /// The resource the request was about; `None` for non-resource requests (`/version`).
    pub object: Option<ObjectRef>,
    /// The Pod a ServiceAccount token was bound to (the user's extra
    /// `authentication.kubernetes.io/pod-name`), `""` for other credentials.
    pub pod: String,
}

impl AuditRecord {
    /// A write (`create`, `update` or `patch`) of a Service's `status` subresource.
    pub fn is_status_write(&self) -> bool {
        matches!(self.verb.as_str(), "create" | "update" | "patch")
            && self
                .object
                .as_ref()
                .is_some_and(|o| o.resource == "services" && o.subresource == "status")
    }

    /// A write: `create`, `update`, `patch`, `delete` or `deletecollection`.
    pub fn is_write(&self) -> bool {
        matches!(
            self.verb.as_str(),
            "create" | "update" | "patch" | "delete" | "deletecollection"
        )
    }

    /// A watch's `timeoutSeconds` (the lifetime it asked the server for), from its URI.
    pub fn timeout_seconds(&self) -> Option<u64> {
        query_param(&self.uri, "timeoutSeconds")?.parse().ok()
    }

    /// `time` as a timestamp.
    pub fn at(&self) -> Option<Timestamp> {
        self.time.parse().ok()
    }

    /// `ended` as a timestamp.
    pub fn ended_at(&self) -> Option<Timestamp> {
        self.ended.as_deref()?.parse().ok()
    }

    /// A `create` of an `events.k8s.io` Event.
    pub fn is_event_create(&self) -> bool {
        self.verb == "create"
            && self
                .object
                .as_ref()
                .is_some_and(|o| o.group == "events.k8s.io" && o.resource == "events")
    }
}

/// The value of `key` in a URI's query (not percent-decoded).
pub fn query_param<'a>(uri: &'a str, key: &str) -> Option<&'a str> {
    let (_, query) = uri.split_once('?')?;
    query
        .split('&')
        .filter_map(|kv| kv.split_once('='))
        .find(|(k, _)| *k == key)
        .map(|(_, v)| v)
}

/// Parses an audit log (JSON lines): one record per request (`auditID`), from its first line,
/// with `ended` from its `ResponseComplete` line.
pub fn parse_audit(text: &str) -> Vec<AuditRecord> {
    let mut at = std::collections::HashMap::new();
    let mut out: Vec<AuditRecord> = Vec::new();
    for e in text
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .filter(|e| e["kind"] == "Event")
    {
        let s = |v: &Value| v.as_str().unwrap_or_default().to_string();
        let complete = (e["stage"] == "ResponseComplete").then(|| s(&e["stageTimestamp"]));
        let id = s(&e["auditID"]);
        if let Some(&i) = at.get(&id) {
            let r: &mut AuditRecord = &mut out[i];
            if complete.is_some() {
                r.ended = complete;
            }
            continue;
        }
        at.insert(id, out.len());
        out.push({
            let o = &e["objectRef"];
            AuditRecord {
                time: s(&e["stageTimestamp"]),
                received: s(&e["requestReceivedTimestamp"]),
                ended: complete,
                verb: s(&e["verb"]),
                uri: s(&e["requestURI"]),
                user: s(&e["user"]["username"]),
                source: e["sourceIPs"][0]
                    .as_str()
                    .and_then(|a| a.parse().ok())
                    .unwrap_or(IpAddr::V4(Ipv4Addr::UNSPECIFIED)),
                code: e["responseStatus"]["code"].as_u64().unwrap_or(0) as u16,
                object: o.is_object().then(|| ObjectRef {
                    group: s(&o["apiGroup"]),
                    resource: s(&o["resource"]),
                    namespace: s(&o["namespace"]),
                    name: s(&o["name"]),
                    subresource: s(&o["subresource"]),
                }),
                pod: s(&e["user"]["extra"]["authentication.kubernetes.io/pod-name"][0]),
            }
        });
    }
    out
}

/// The records the server received after `mark` (`Cluster::audit_mark`), in log order. The
/// timestamps are one server's clock in one format (RFC 3339, UTC, microseconds), so they
/// compare as text; a record without one is kept (nothing is hidden from an assertion).
pub fn received_after(records: &[AuditRecord], mark: &str) -> Vec<AuditRecord> {
    records
        .iter()
        .filter(|r| r.received.is_empty() || r.received.as_str() > mark)
        .cloned()
        .collect()
}

/// A kube client from kubeconfig text.
pub async fn client_from_kubeconfig(text: &str) -> Result<Client, String> {
    let kc = Kubeconfig::from_yaml(text).map_err(|e| format!("a kubeconfig: {e}"))?;
    let cfg = kube::Config::from_custom_kubeconfig(kc, &KubeConfigOptions::default())
        .await
        .map_err(|e| format!("a client config from the kubeconfig: {e}"))?;
    Client::try_from(cfg).map_err(|e| format!("a kube client: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn audit_lines_become_one_record_per_request() {
        let text = r#"{"kind":"Event","apiVersion":"audit.k8s.io/v1","level":"Metadata","auditID":"a","stage":"ResponseStarted","requestURI":"/api/v1/services?timeoutSeconds=290&watch=true","verb":"watch","user":{"username":"system:serviceaccount:nodelb-system:nodelb","extra":{"authentication.kubernetes.io/pod-name":["nodelb-agent-x1"]}},"sourceIPs":["192.0.2.2"],"objectRef":{"resource":"services","apiVersion":"v1"},"responseStatus":{"code":200},"stageTimestamp":"2026-11-24T01:00:00.000001Z"}
{"kind":"Event","apiVersion":"audit.k8s.io/v1","level":"Metadata","auditID":"b","stage":"ResponseComplete","requestURI":"/version","verb":"get","user":{"username":"admin"},"sourceIPs":["127.0.0.1"],"responseStatus":{"code":200},"stageTimestamp":"2026-11-24T01:00:00.000002Z"}
{"kind":"Event","apiVersion":"audit.k8s.io/v1","level":"Metadata","auditID":"a","stage":"ResponseComplete","requestURI":"/api/v1/services?watch=true","verb":"watch","user":{"username":"system:serviceaccount:nodelb-system:nodelb"},"sourceIPs":["192.0.2.2"],"objectRef":{"resource":"services","apiVersion":"v1"},"responseStatus":{"code":200},"stageTimestamp":"2026-11-24T01:05:00.000001Z"}
{"kind":"Event","apiVersion":"audit.k8s.io/v1","level":"Metadata","auditID":"c","stage":"ResponseComplete","requestURI":"/api/v1/namespaces/e2e/services/web/status","verb":"patch","user":{"username":"u"},"sourceIPs":["192.0.2.6","10.0.0.1"],"objectRef":{"resource":"services","namespace":"e2e","name":"web","subresource":"status","apiVersion":"v1"},"responseStatus":{"code":403},"stageTimestamp":"2026-11-24T01:00:00.000003Z"}"#;
        let r = parse_audit(text);
        assert_eq!(r.len(), 3, "{r:#?}");
        assert_eq!(r[0].verb, "watch");
        assert_eq!(
            r[0].time, "2026-11-24T01:00:00.000001Z",
            "the first line of a watch"
        );
        assert_eq!(
            r[0].ended.as_deref(),
            Some("2026-11-24T01:05:00.000001Z"),
            "the watch's last line"
        );
        assert_eq!(r[0].timeout_seconds(), Some(290));
        assert_eq!(r[0].pod, "nodelb-agent-x1");
        assert_eq!(
            r[0].ended_at().unwrap().duration_since(r[0].at().unwrap()),
            k8s_openapi::jiff::SignedDuration::from_secs(300)
        );
        assert_eq!(r[1].ended.as_deref(), Some("2026-11-24T01:00:00.000002Z"));
        assert_eq!(r[1].pod, "");
        assert_eq!(r[1].object, None);
        assert_eq!(r[1].source, IpAddr::V4(Ipv4Addr::LOCALHOST));
        let o = r[2].object.as_ref().unwrap();
        assert_eq!(
            (o.rbac_resource().as_str(), o.namespace.as_str(), r[2].code),
            ("services/status", "e2e", 403)
        );
        assert_eq!(r[2].source, "192.0.2.6".parse::<IpAddr>().unwrap());
    }

    /// The order of a failed CI run's log: the agent's status patch, received before the test
    /// saw its effect and marked the log, reached the log after the mark.
    #[test]
    fn records_received_after_a_mark_leave_out_a_write_logged_late() {
        let line = |id: &str, verb: &str, uri: &str, received: &str, done: &str| {
            format!(
                r#"{{"kind":"Event","auditID":"{id}","stage":"ResponseComplete","requestURI":"{uri}","verb":"{verb}","user":{{"username":"u"}},"sourceIPs":["192.0.2.6"],"responseStatus":{{"code":200}},"requestReceivedTimestamp":"{received}","stageTimestamp":"{done}"}}"#
            )
        };
        let text = [
            line(
                "get",
                "get",
                "/api/v1/namespaces/e2e/services/mine",
                "2026-12-03T11:05:44.095000Z",
                "2026-12-03T11:05:44.097955Z",
            ),
            line(
                "mark",
                "get",
                "/api/v1/namespaces/e2e/configmaps/m",
                "2026-12-03T11:05:44.101000Z",
                "2026-12-03T11:05:44.101500Z",
            ),
            line(
                "patch",
                "patch",
                "/api/v1/namespaces/e2e/services/mine/status",
                "2026-12-03T11:05:44.096000Z",
                "2026-12-03T11:05:44.102483Z",
            ),
            line(
                "later",
                "patch",
                "/api/v1/namespaces/e2e/services/mine/status",
                "2026-12-03T11:05:45.000000Z",
                "2026-12-03T11:05:45.001000Z",
            ),
        ]
        .join("\n");
        let r = parse_audit(&text);
        assert!(
            r[2].uri.ends_with("/status") && r[2].received < r[1].received,
            "logged after the mark, received before it: {r:#?}"
        );
        let after: Vec<String> = received_after(&r, &r[1].received)
            .into_iter()
            .map(|r| r.time)
            .collect();
        assert_eq!(
            after,
            ["2026-12-03T11:05:45.001000Z"],
            "only the later write"
        );
    }
}
