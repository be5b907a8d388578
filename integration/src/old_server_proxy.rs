//! A fault-injecting proxy in front of the real kube-apiserver that imitates an older server:
//! what the real server cannot do on demand. Used only by tests that ask for it
//! ([`crate::e2e::ClusterOptions::old_server`]).
//!
//! It is a plain HTTP/1.1 listener that forwards every request, as it came (method, path,
//! headers including `Authorization`, body; responses and watch streams are streamed back
//! unchanged) over HTTPS to the real server, with `X-Forwarded-For: <client ip>` so the real
//! server's audit log keeps the client's own address. Two things differ from the real server:
//!
//! - `GET /version` answers `1.<minor>` (gitVersion `v1.<minor>.0`), the rest of the real
//!   answer kept;
//! - with [`OldServer::drop_ip_mode`], writes of `services/<name>/status` lose every
//!   `status.loadBalancer.ingress[].ipMode` before they reach the server, as a server that
//!   does not know the field drops it; and Services read through the proxy (get, list, watch,
//!   and the answers to writes) show none either. That second half matters: the real server
//!   (1.30+) defaults `ipMode` to `VIP` on every ingress entry with an `ip`, so without it
//!   clients would read back a field a 1.29 server never returns.
//!
//! It runs on a thread of its own that joins the namespace, so its listener and its upstream
//! connections both live there, with a current-thread tokio runtime; dropping the proxy stops
//! that runtime (every connection, watches included, is closed) and joins the thread.

use std::convert::Infallible;
use std::fs::File;
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::thread::JoinHandle;

use futures::StreamExt;
use http_body_util::{combinators::BoxBody, BodyExt, Full, StreamBody};
use hyper::body::{Bytes, Frame, Incoming};
use hyper::header::{
    HeaderValue, ACCEPT_ENCODING, CONTENT_LENGTH, CONTENT_TYPE, TRANSFER_ENCODING,
};
use hyper::{Method, Request, Response, StatusCode};
use hyper_rustls::HttpsConnector;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::{TokioExecutor, TokioIo};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::CertificateDer;
use serde_json::Value;

use crate::netns::Netns;

/// How the proxy imitates an older server.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OldServer {
    /// `GET /version` answers `1.<minor>` (gitVersion `v1.<minor>.0`).
    pub minor: u32,
    /// Writes of `services/status` lose `status.loadBalancer.ingress[].ipMode` on the way, as
    /// a server older than 1.30 drops the field it does not know, and Services read through
    /// the proxy never carry it (the real server behind defaults it to `VIP`).
    pub drop_ip_mode: bool,
}

/// A running proxy; stopped on drop.
pub struct OldServerProxy {
    behaviour: OldServer,
    port: u16,
    upstream: SocketAddr,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<JoinHandle<()>>,
}

impl std::fmt::Debug for OldServerProxy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "the old-server proxy on :{} (HTTP) to https://{} ({:?})",
            self.port, self.upstream, self.behaviour
        )
    }
}

type Body = BoxBody<Bytes, hyper::Error>;
type Upstream = Client<HttpsConnector<HttpConnector>, Body>;

/// What every connection's requests share.
struct Forwarder {
    behaviour: OldServer,
    upstream: SocketAddr,
    client: Upstream,
}

impl OldServerProxy {
    /// Listens on `0.0.0.0:<port>` (plain HTTP) inside `ns` and forwards every request to the
    /// HTTPS server at `upstream` (also inside `ns`), trusting `ca_pem`. Returns once it
    /// listens.
    pub fn start(
        ns: &Netns,
        port: u16,
        upstream: SocketAddr,
        ca_pem: &str,
        behaviour: OldServer,
    ) -> Result<OldServerProxy, String> {
        let tls = client_tls(ca_pem)?;
        let ns_file =
            File::open(ns.path()).map_err(|e| format!("opening {}: {e}", ns.path().display()))?;
        let (ready_tx, ready_rx) = std::sync::mpsc::channel::<Result<(), String>>();
        let (stop_tx, stop_rx) = tokio::sync::oneshot::channel();
        let thread = std::thread::Builder::new()
            .name(format!("old-server-proxy-{port}"))
            .spawn(move || {
                let setup = (|| {
                    nix::sched::setns(&ns_file, nix::sched::CloneFlags::CLONE_NEWNET)
                        .map_err(|e| format!("joining the namespace: {e}"))?;
                    drop(ns_file);
                    let rt = tokio::runtime::Builder::new_current_thread()
                        .enable_all()
                        .build()
                        .map_err(|e| format!("a tokio runtime: {e}"))?;
                    let listener = rt
                        .block_on(tokio::net::TcpListener::bind(("0.0.0.0", port)))
                        .map_err(|e| format!("binding 0.0.0.0:{port}: {e}"))?;
                    Ok((rt, listener))
                })();
                let (rt, listener) = match setup {
                    Ok(v) => v,
                    Err(e) => {
                        let _ = ready_tx.send(Err(e));
                        return;
                    }
                };
                let connector = hyper_rustls::HttpsConnectorBuilder::new()
                    .with_tls_config(tls)
                    .https_only()
                    .enable_http1()
                    .build();
                let forwarder = Arc::new(Forwarder {
                    behaviour,
                    upstream,
                    client: Client::builder(TokioExecutor::new()).build(connector),
                });
                let _ = ready_tx.send(Ok(()));
                rt.block_on(serve(listener, forwarder, stop_rx));
                // Dropping the runtime here cancels every connection task.
            })
            .map_err(|e| format!("spawning the proxy thread: {e}"))?;
        match ready_rx.recv() {
            Ok(Ok(())) => Ok(OldServerProxy {
                behaviour,
                port,
                upstream,
                stop: Some(stop_tx),
                thread: Some(thread),
            }),
            Ok(Err(e)) => {
                let _ = thread.join();
                Err(e)
            }
            Err(_) => {
                let _ = thread.join();
                Err("the proxy thread ended before it listened".into())
            }
        }
    }

    /// What the proxy imitates.
    pub fn behaviour(&self) -> OldServer {
        self.behaviour
    }

    /// The port it listens on (every address of its namespace).
    pub fn port(&self) -> u16 {
        self.port
    }
}

impl Drop for OldServerProxy {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// A TLS client configuration that trusts only `ca_pem` (ring, as the rest of the workspace).
fn client_tls(ca_pem: &str) -> Result<rustls::ClientConfig, String> {
    let mut roots = rustls::RootCertStore::empty();
    for cert in CertificateDer::pem_slice_iter(ca_pem.as_bytes()) {
        let cert = cert.map_err(|e| format!("the CA PEM: {e}"))?;
        roots
            .add(cert)
            .map_err(|e| format!("the CA certificate: {e}"))?;
    }
    if roots.is_empty() {
        return Err("the CA PEM holds no certificate".into());
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    Ok(rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| format!("TLS versions: {e}"))?
        .with_root_certificates(roots)
        .with_no_client_auth())
}

async fn serve(
    listener: tokio::net::TcpListener,
    forwarder: Arc<Forwarder>,
    mut stop: tokio::sync::oneshot::Receiver<()>,
) {
    loop {
        let accepted = tokio::select! {
            _ = &mut stop => return,
            a = listener.accept() => a,
        };
        let Ok((stream, peer)) = accepted else {
            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
            continue;
        };
        let forwarder = forwarder.clone();
        tokio::spawn(async move {
            let service = hyper::service::service_fn(move |req| {
                let forwarder = forwarder.clone();
                async move { Ok::<_, Infallible>(forwarder.forward(req, peer.ip()).await) }
            });
            let _ = hyper::server::conn::http1::Builder::new()
                .serve_connection(TokioIo::new(stream), service)
                .await;
        });
    }
}

impl Forwarder {
    async fn forward(&self, req: Request<Incoming>, client: IpAddr) -> Response<Body> {
        let (mut parts, body) = req.into_parts();
        let path = parts.uri.path().to_string();
        let path_and_query = parts
            .uri
            .path_and_query()
            .map_or_else(|| "/".to_string(), |p| p.as_str().to_string());
        parts.uri = match format!("https://{}{path_and_query}", self.upstream).parse() {
            Ok(uri) => uri,
            Err(e) => return text(StatusCode::BAD_REQUEST, format!("old-server proxy: {e}")),
        };
        parts.headers.insert(
            "x-forwarded-for",
            HeaderValue::from_str(&client.to_string()).expect("an address is a header value"),
        );
        let body: Body = if self.behaviour.drop_ip_mode
            && is_service_status_write(&parts.method, &path)
        {
            let bytes = match body.collect().await {
                Ok(b) => b.to_bytes(),
                Err(e) => return text(StatusCode::BAD_GATEWAY, format!("old-server proxy: {e}")),
            };
            let bytes = without_ip_mode(bytes);
            parts.headers.remove(TRANSFER_ENCODING);
            parts.headers.insert(CONTENT_LENGTH, bytes.len().into());
            full(bytes)
        } else {
            body.boxed()
        };
        let is_version = parts.method == Method::GET && path == "/version";
        let is_watch = parts
            .uri
            .query()
            .is_some_and(|q| q.split('&').any(|kv| kv == "watch=true" || kv == "watch=1"));
        let strip_response = self.behaviour.drop_ip_mode && is_services_path(&path);
        if strip_response {
            // Plain JSON back, so the answer can be rewritten.
            parts.headers.remove(ACCEPT_ENCODING);
        }
        let response = match self.client.request(Request::from_parts(parts, body)).await {
            Ok(r) => r,
            Err(e) => {
                return text(
                    StatusCode::BAD_GATEWAY,
                    format!(
                        "old-server proxy: forwarding to https://{}: {e}",
                        self.upstream
                    ),
                )
            }
        };
        let json = response
            .headers()
            .get(CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .is_some_and(|t| t.starts_with("application/json"));
        let rewrite: fn(Bytes, &OldServer) -> Bytes =
            if is_version && response.status() == StatusCode::OK {
                |b, old| old_version(b, old.minor)
            } else if strip_response && json && !is_watch {
                |b, _| rewrite_json(b, strip_services)
            } else if strip_response && json {
                let (mut parts, body) = response.into_parts();
                parts.headers.remove(CONTENT_LENGTH);
                return Response::from_parts(parts, watch_without_ip_mode(body));
            } else {
                return response.map(BodyExt::boxed);
            };
        let (mut parts, body) = response.into_parts();
        let bytes = match body.collect().await {
            Ok(b) => b.to_bytes(),
            Err(e) => return text(StatusCode::BAD_GATEWAY, format!("old-server proxy: {e}")),
        };
        let bytes = rewrite(bytes, &self.behaviour);
        parts.headers.remove(TRANSFER_ENCODING);
        parts.headers.insert(CONTENT_LENGTH, bytes.len().into());
        Response::from_parts(parts, full(bytes))
    }
}

/// A watch stream of Services (JSON, one event a line) without `ipMode`, passed on line by
/// line as it comes.
fn watch_without_ip_mode<B>(body: B) -> Body
where
    B: hyper::body::Body<Data = Bytes, Error = hyper::Error> + Send + Sync + 'static,
{
    let mut pending: Vec<u8> = Vec::new();
    let events = body.into_data_stream().map(move |chunk| {
        let chunk = chunk?;
        pending.extend_from_slice(&chunk);
        let Some(end) = pending.iter().rposition(|b| *b == b'\n') else {
            return Ok(Bytes::new());
        };
        let lines: Vec<u8> = pending.drain(..=end).collect();
        let mut out = Vec::with_capacity(lines.len());
        for line in lines.split_inclusive(|b| *b == b'\n') {
            out.extend_from_slice(&rewrite_json(Bytes::copy_from_slice(line), strip_services));
            if out.last() != Some(&b'\n') {
                out.push(b'\n');
            }
        }
        Ok(Bytes::from(out))
    });
    let frames = events
        .filter(|r: &Result<Bytes, hyper::Error>| {
            std::future::ready(!matches!(r, Ok(b) if b.is_empty()))
        })
        .map(|r| r.map(Frame::data));
    BodyExt::boxed(StreamBody::new(frames))
}

/// `/api/v1/services`, `/api/v1/namespaces/<ns>/services[/<name>[/status]]`.
fn is_services_path(path: &str) -> bool {
    let segments: Vec<&str> = path.trim_matches('/').split('/').collect();
    match segments.as_slice() {
        ["api", "v1", "services"] => true,
        ["api", "v1", "namespaces", _, "services", rest @ ..] => {
            matches!(rest, [] | [_] | [_, "status"])
        }
        _ => false,
    }
}

/// `body` as JSON changed by `f`; as it came when it is not JSON.
fn rewrite_json(body: Bytes, f: fn(&mut Value)) -> Bytes {
    let Ok(mut v) = serde_json::from_slice::<Value>(&body) else {
        return body;
    };
    f(&mut v);
    Bytes::from(serde_json::to_vec(&v).expect("JSON"))
}

/// Strips `ipMode` from a Service, a list of them or a watch event about one.
fn strip_services(v: &mut Value) {
    if let Some(items) = v.get_mut("items").and_then(Value::as_array_mut) {
        items.iter_mut().for_each(|i| strip(i, &INGRESS));
    } else if let Some(object) = v.get_mut("object") {
        strip(object, &INGRESS);
    } else {
        strip(v, &INGRESS);
    }
}

fn full(bytes: Bytes) -> Body {
    Full::new(bytes).map_err(|never| match never {}).boxed()
}

fn text(code: StatusCode, message: String) -> Response<Body> {
    let mut r = Response::new(full(Bytes::from(message)));
    *r.status_mut() = code;
    r
}

/// `PUT`/`PATCH`/`POST` of `/api/v1/namespaces/<ns>/services/<name>/status`.
fn is_service_status_write(method: &Method, path: &str) -> bool {
    let segments: Vec<&str> = path.trim_matches('/').split('/').collect();
    matches!(*method, Method::PUT | Method::PATCH | Method::POST)
        && matches!(
            segments.as_slice(),
            ["api", "v1", "namespaces", _, "services", _, "status"]
        )
}

/// The real server's `/version` answer, as server `1.<minor>` would give it.
fn old_version(body: Bytes, minor: u32) -> Bytes {
    let Ok(mut v) = serde_json::from_slice::<Value>(&body) else {
        return body;
    };
    v["major"] = "1".into();
    v["minor"] = minor.to_string().into();
    v["gitVersion"] = format!("v1.{minor}.0").into();
    Bytes::from(serde_json::to_vec(&v).expect("JSON"))
}

const INGRESS: [&str; 3] = ["status", "loadBalancer", "ingress"];

/// A status write's body without any `status.loadBalancer.ingress[].ipMode`: an object body
/// (update, apply, merge or strategic merge patch; JSON, or YAML for apply) or a JSON patch
/// (each operation's value, and operations on an `ipMode` itself are dropped). Anything else
/// is forwarded as it came. The result is JSON (which is YAML too).
fn without_ip_mode(body: Bytes) -> Bytes {
    let parsed = serde_json::from_slice::<Value>(&body).ok().or_else(|| {
        std::str::from_utf8(&body)
            .ok()
            .and_then(|t| serde_yaml_ng::from_str::<Value>(t).ok())
    });
    let mut v = match parsed {
        Some(v @ (Value::Object(_) | Value::Array(_))) => v,
        _ => return body,
    };
    match &mut v {
        Value::Object(_) => strip(&mut v, &INGRESS),
        Value::Array(ops) => ops.retain_mut(|op| {
            let path: Vec<String> = op["path"]
                .as_str()
                .unwrap_or_default()
                .split('/')
                .skip(1)
                .map(|s| s.replace("~1", "/").replace("~0", "~"))
                .collect();
            let path: Vec<&str> = path.iter().map(String::as_str).collect();
            match path.as_slice() {
                [a, b, c, _, "ipMode"] if [*a, *b, *c] == INGRESS => false,
                [a, b, c, _] if [*a, *b, *c] == INGRESS => {
                    if let Some(entry) = op.get_mut("value").and_then(Value::as_object_mut) {
                        entry.remove("ipMode");
                    }
                    true
                }
                p if p.len() <= INGRESS.len() && INGRESS.starts_with(p) => {
                    if let Some(value) = op.get_mut("value") {
                        strip(value, &INGRESS[p.len()..]);
                    }
                    true
                }
                _ => true,
            }
        }),
        _ => unreachable!(),
    }
    Bytes::from(serde_json::to_vec(&v).expect("JSON"))
}

/// Removes `ipMode` from every entry of the ingress list found at `path` below `v`.
fn strip(v: &mut Value, path: &[&str]) {
    let mut at = v;
    for key in path {
        match at.get_mut(*key) {
            Some(next) => at = next,
            None => return,
        }
    }
    for entry in at.as_array_mut().into_iter().flatten() {
        if let Some(entry) = entry.as_object_mut() {
            entry.remove("ipMode");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn rewrite(v: Value) -> Value {
        serde_json::from_slice(&without_ip_mode(Bytes::from(v.to_string()))).unwrap()
    }

    #[test]
    fn apply_and_merge_bodies_lose_ip_mode_and_keep_the_rest() {
        let body = json!({"apiVersion": "v1", "kind": "Service",
            "metadata": {"name": "web"},
            "status": {"loadBalancer": {"ingress": [
                {"ip": "192.0.2.1", "ipMode": "Proxy"}, {"ip": "192.0.2.2"}]},
                "conditions": [{"type": "nodelb.io/Serving"}]}});
        let want = json!({"apiVersion": "v1", "kind": "Service",
            "metadata": {"name": "web"},
            "status": {"loadBalancer": {"ingress": [{"ip": "192.0.2.1"}, {"ip": "192.0.2.2"}]},
                "conditions": [{"type": "nodelb.io/Serving"}]}});
        assert_eq!(rewrite(body), want);
        let unrelated = json!({"metadata": {"labels": {"ipMode": "x"}}});
        assert_eq!(
            rewrite(unrelated.clone()),
            unrelated,
            "no status: unchanged"
        );
    }

    #[test]
    fn yaml_apply_bodies_become_json_without_ip_mode() {
        let yaml =
            "status:\n  loadBalancer:\n    ingress:\n    - ip: 192.0.2.1\n      ipMode: VIP\n";
        let out: Value = serde_json::from_slice(&without_ip_mode(Bytes::from(yaml))).unwrap();
        assert_eq!(
            out,
            json!({"status": {"loadBalancer": {"ingress": [{"ip": "192.0.2.1"}]}}})
        );
    }

    #[test]
    fn json_patches_lose_ip_mode_values_and_operations() {
        let patch = json!([
            {"op": "replace", "path": "/status/loadBalancer/ingress",
             "value": [{"ip": "192.0.2.1", "ipMode": "Proxy"}]},
            {"op": "add", "path": "/status/loadBalancer/ingress/1",
             "value": {"ip": "192.0.2.2", "ipMode": "Proxy"}},
            {"op": "replace", "path": "/status/loadBalancer/ingress/0/ipMode", "value": "VIP"},
            {"op": "replace", "path": "/status", "value": {"loadBalancer": {"ingress": [
                {"ip": "192.0.2.3", "ipMode": "VIP"}]}}},
        ]);
        assert_eq!(
            rewrite(patch),
            json!([
                {"op": "replace", "path": "/status/loadBalancer/ingress",
                 "value": [{"ip": "192.0.2.1"}]},
                {"op": "add", "path": "/status/loadBalancer/ingress/1",
                 "value": {"ip": "192.0.2.2"}},
                {"op": "replace", "path": "/status", "value": {"loadBalancer": {"ingress": [
                    {"ip": "192.0.2.3"}]}}},
            ])
        );
    }

    #[test]
    fn only_service_status_writes_are_rewritten() {
        let status = "/api/v1/namespaces/e2e/services/web/status";
        assert!(is_service_status_write(&Method::PATCH, status));
        assert!(is_service_status_write(&Method::PUT, status));
        assert!(!is_service_status_write(&Method::GET, status));
        assert!(!is_service_status_write(
            &Method::PATCH,
            "/api/v1/namespaces/e2e/services/web"
        ));
        assert!(!is_service_status_write(
            &Method::PATCH,
            "/api/v1/namespaces/e2e/pods/web/status"
        ));
    }

    #[test]
    fn services_read_through_the_proxy_lose_ip_mode() {
        for path in [
            "/api/v1/services",
            "/api/v1/namespaces/e2e/services",
            "/api/v1/namespaces/e2e/services/web",
            "/api/v1/namespaces/e2e/services/web/status",
        ] {
            assert!(is_services_path(path), "{path}");
        }
        assert!(!is_services_path("/api/v1/namespaces/e2e/endpoints/web"));
        assert!(!is_services_path(
            "/api/v1/namespaces/e2e/services/web/proxy/x"
        ));
        let ingress = json!({"loadBalancer": {"ingress": [{"ip": "192.0.2.1", "ipMode": "VIP"}]}});
        let bare = json!({"loadBalancer": {"ingress": [{"ip": "192.0.2.1"}]}});
        let mut list = json!({"kind": "ServiceList", "items": [{"status": ingress}]});
        strip_services(&mut list);
        assert_eq!(
            list,
            json!({"kind": "ServiceList", "items": [{"status": bare}]})
        );
        let mut one = json!({"kind": "Service", "status": ingress});
        strip_services(&mut one);
        assert_eq!(one, json!({"kind": "Service", "status": bare}));
    }

    #[tokio::test]
    async fn watch_events_lose_ip_mode_even_when_split_across_chunks() {
        let event = |t: &str, mode: Option<&str>| {
            let mut e = json!({"type": t, "object": {"kind": "Service", "status": {
                "loadBalancer": {"ingress": [{"ip": "192.0.2.1"}]}}}});
            if let Some(m) = mode {
                e["object"]["status"]["loadBalancer"]["ingress"][0]["ipMode"] = json!(m);
            }
            e
        };
        let text = format!(
            "{}\n{}\n",
            event("ADDED", Some("VIP")),
            event("MODIFIED", Some("Proxy"))
        );
        let (a, b) = text.split_at(text.len() / 2 + 7);
        let chunks: Vec<Result<Frame<Bytes>, hyper::Error>> = vec![
            Ok(Frame::data(Bytes::copy_from_slice(a.as_bytes()))),
            Ok(Frame::data(Bytes::copy_from_slice(b.as_bytes()))),
        ];
        let body = StreamBody::new(futures::stream::iter(chunks));
        let out = watch_without_ip_mode(body)
            .collect()
            .await
            .unwrap()
            .to_bytes();
        let lines: Vec<Value> = std::str::from_utf8(&out)
            .unwrap()
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        assert_eq!(lines, [event("ADDED", None), event("MODIFIED", None)]);
    }

    #[test]
    fn version_is_the_old_one_with_the_rest_kept() {
        let real = json!({"major": "1", "minor": "36", "gitVersion": "v1.36.3",
            "platform": "linux/amd64"});
        let out: Value =
            serde_json::from_slice(&old_version(Bytes::from(real.to_string()), 29)).unwrap();
        assert_eq!(
            out,
            json!({"major": "1", "minor": "29", "gitVersion": "v1.29.0",
                "platform": "linux/amd64"})
        );
    }
}
