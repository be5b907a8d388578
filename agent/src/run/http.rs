//! Health and metrics over HTTP: `/healthz` (the process answers), `/readyz` (the judgement of
//! `crate::readiness` at the instant it is asked: caches synced, last sync committed, every
//! enabled family forwarding, no change, watch or kernel request past its bound; the body says
//! what is missing) on `--health-addr`; `/metrics` on `--metrics-addr`, behind a bearer token
//! off loopback (see [`serve`]).

use super::scrape_auth::{Gate, Verdict};
use crate::metrics::{Metrics, CONTENT_TYPE};
use crate::readiness::Readiness;
use axum::body::Body;
use axum::http::{header, StatusCode};
use axum::response::IntoResponse;
use axum::routing::get;
use axum::Router;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::watch;

fn health_routes(ready: Readiness) -> Router {
    Router::new()
        .route("/healthz", get(|| async { "ok\n" }))
        .route(
            "/readyz",
            get(move || {
                let verdict = ready.report(std::time::Instant::now());
                let code = if verdict.ready {
                    StatusCode::OK
                } else {
                    StatusCode::SERVICE_UNAVAILABLE
                };
                async move { (code, verdict.body()) }
            }),
        )
}

fn metrics_routes(metrics: Arc<Metrics>) -> Router {
    Router::new().route(
        "/metrics",
        get(move || {
            let metrics = metrics.clone();
            async move {
                use futures::StreamExt;
                // Streamed as it is encoded, so a scrape never holds its whole text.
                let mut chunks = metrics.stream().boxed();
                // A scrape that fails before its first chunk still answers with a status that
                // says so.
                match chunks.next().await {
                    Some(Err(_)) => StatusCode::INTERNAL_SERVER_ERROR.into_response(),
                    first => {
                        let body = Body::from_stream(futures::stream::iter(first).chain(chunks));
                        ([(header::CONTENT_TYPE, CONTENT_TYPE)], body).into_response()
                    }
                }
            }
        }),
    )
}

#[derive(Debug, thiserror::Error)]
#[error("listening on {addr}")]
pub struct BindError {
    pub addr: SocketAddr,
    #[source]
    pub source: std::io::Error,
}

/// What [`serve`] started: its tasks, and where the API client goes once there is one (the
/// metrics listener off loopback reviews its scrapers' tokens with it).
pub struct Served {
    pub tasks: Vec<tokio::task::JoinHandle<()>>,
    pub scrape_client: watch::Sender<Option<kube::Client>>,
}

/// Bind both listeners (one, when the addresses are equal) and serve them in the background.
///
/// Health and readiness are plain HTTP: the kubelet probes them on loopback (the default
/// `--health-addr`). `/metrics` is plain HTTP on a loopback address; on any other it is HTTPS
/// with a certificate made at start, for callers the API server authenticates and allows to
/// `get` `/metrics` (`scrape_auth`). Equal addresses off loopback are refused: the probes
/// cannot authenticate.
pub async fn serve(
    health_addr: SocketAddr,
    metrics_addr: SocketAddr,
    ready: Readiness,
    metrics: Arc<Metrics>,
) -> Result<Served, BindError> {
    let (scrape_client, client_rx) = watch::channel(None);
    let open_metrics = metrics_addr.ip().is_loopback();
    let mut routers = vec![(health_addr, health_routes(ready), None)];
    if metrics_addr == health_addr {
        if !open_metrics {
            return Err(BindError {
                addr: metrics_addr,
                source: std::io::Error::other(
                    "--health-addr and --metrics-addr are equal off loopback, where /metrics \
                     needs a token the kubelet's probes do not have: give them different ports",
                ),
            });
        }
        routers[0].1 = routers[0].1.clone().merge(metrics_routes(metrics));
    } else if open_metrics {
        routers.push((metrics_addr, metrics_routes(metrics), None));
    } else {
        let gate = Arc::new(Gate::new(client_rx));
        let router =
            metrics_routes(metrics).layer(axum::middleware::from_fn_with_state(gate, authorized));
        let tls = tls_acceptor().map_err(|e| BindError {
            addr: metrics_addr,
            source: std::io::Error::other(format!("making the metrics certificate: {e}")),
        })?;
        routers.push((metrics_addr, router, Some(tls)));
    }
    if !health_addr.ip().is_loopback() {
        tracing::warn!(%health_addr, "/readyz is served off loopback: its text (Service names, \
            sync errors) is readable by anyone who reaches this address");
    }
    let mut tasks = Vec::new();
    for (addr, router, tls) in routers {
        let listener = tokio::net::TcpListener::bind(addr)
            .await
            .map_err(|source| BindError { addr, source })?;
        tracing::info!(%addr, tls = tls.is_some(), "serving HTTP");
        tasks.push(tokio::spawn(async move {
            let served = match tls {
                None => axum::serve(listener, router).await,
                Some(tls) => serve_tls(listener, router, tls).await,
            };
            if let Err(e) = served {
                tracing::error!(%addr, error = %e, "HTTP server stopped");
            }
        }));
    }
    Ok(Served {
        tasks,
        scrape_client,
    })
}

/// Lets through a request whose bearer token the API server allows `get` on `/metrics`.
async fn authorized(
    axum::extract::State(gate): axum::extract::State<Arc<Gate>>,
    request: axum::extract::Request,
    next: axum::middleware::Next,
) -> axum::response::Response {
    let header = request
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|h| h.to_str().ok());
    let code = match gate.check(header).await {
        Verdict::Allowed => return next.run(request).await,
        Verdict::Unauthenticated => StatusCode::UNAUTHORIZED,
        Verdict::Forbidden => StatusCode::FORBIDDEN,
        Verdict::Busy => StatusCode::TOO_MANY_REQUESTS,
        Verdict::Unavailable => StatusCode::SERVICE_UNAVAILABLE,
    };
    let mut response = code.into_response();
    if code == StatusCode::UNAUTHORIZED {
        response.headers_mut().insert(
            header::WWW_AUTHENTICATE,
            header::HeaderValue::from_static("Bearer"),
        );
    }
    response
}

/// A TLS acceptor with a self-signed certificate made now (scrapers skip its verification, as
/// they do the kubelet's own).
fn tls_acceptor() -> Result<tokio_rustls::TlsAcceptor, Box<dyn std::error::Error>> {
    let key = rcgen::KeyPair::generate()?;
    let cert =
        rcgen::CertificateParams::new(vec!["nodelb-agent".to_string()])?.self_signed(&key)?;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()?
        .with_no_client_auth()
        .with_single_cert(
            vec![cert.der().clone()],
            rustls::pki_types::PrivateKeyDer::Pkcs8(key.serialize_der().into()),
        )?;
    Ok(tokio_rustls::TlsAcceptor::from(Arc::new(config)))
}

/// Connections served at once over TLS; past it, new ones are closed at once.
const TLS_CONNECTIONS: usize = 64;
/// How long a TLS connection may take to say hello and its request's headers.
const TLS_HANDSHAKE: Duration = Duration::from_secs(10);

async fn serve_tls(
    listener: tokio::net::TcpListener,
    router: Router,
    tls: tokio_rustls::TlsAcceptor,
) -> std::io::Result<()> {
    let slots = Arc::new(tokio::sync::Semaphore::new(TLS_CONNECTIONS));
    loop {
        let (tcp, _) = match listener.accept().await {
            Ok(c) => c,
            Err(e) => {
                tracing::warn!(error = %e, "accepting a metrics connection failed");
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        let Ok(slot) = slots.clone().try_acquire_owned() else {
            continue;
        };
        let (tls, router) = (tls.clone(), router.clone());
        tokio::spawn(async move {
            let _slot = slot;
            let Ok(Ok(stream)) = tokio::time::timeout(TLS_HANDSHAKE, tls.accept(tcp)).await else {
                return;
            };
            let service = hyper_util::service::TowerToHyperService::new(router);
            let _ = hyper::server::conn::http1::Builder::new()
                .timer(hyper_util::rt::TokioTimer::new())
                .header_read_timeout(TLS_HANDSHAKE)
                .serve_connection(hyper_util::rt::TokioIo::new(stream), service)
                .await;
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::metrics::CounterSource;
    use nodelb_core::vocab::IpFamily;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    /// A free port on loopback (port 0: the kernel picks).
    fn free_addr() -> SocketAddr {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap()
    }

    /// The whole raw response to a GET of `path`.
    async fn get(addr: SocketAddr, path: &str) -> String {
        let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
        s.write_all(
            format!("GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").as_bytes(),
        )
        .await
        .unwrap();
        let mut out = String::new();
        s.read_to_string(&mut out).await.unwrap();
        out
    }

    #[tokio::test]
    async fn serves_health_readiness_and_metrics() {
        let ready = Readiness::new(Default::default());
        let metrics = Arc::new(Metrics::new());
        // One listener when both addresses are equal.
        let addr = free_addr();
        let tasks = serve(addr, addr, ready.clone(), metrics.clone())
            .await
            .unwrap()
            .tasks;
        assert_eq!(tasks.len(), 1);
        let get = |path: &'static str| get(addr, path);
        assert!(get("/healthz").await.starts_with("HTTP/1.1 200"));
        assert!(get("/readyz").await.starts_with("HTTP/1.1 503"));
        ready.set(|r| {
            r.caches_synced = true;
            r.last_sync = nodelb_core::readiness::LastSync::Committed;
        });
        assert!(get("/readyz").await.starts_with("HTTP/1.1 200"));
        // A change that waits past its bound (the sync loop or the kernel stuck) turns it
        // unready by itself, with nobody recording anything.
        ready.change_received(std::time::Instant::now() - std::time::Duration::from_secs(11));
        let r = get("/readyz").await;
        assert!(r.starts_with("HTTP/1.1 503"), "{r}");
        assert!(r.contains("--max-change-wait"), "{r}");
        metrics.drift_repairs.inc();
        let m = get("/metrics").await;
        assert!(m.contains("nodelb_drift_repairs_total 1"), "{m}");
        assert!(
            m.to_lowercase()
                .contains("content-type: application/openmetrics-text"),
            "{m}"
        );
        for t in tasks {
            t.abort();
        }
    }

    /// Traffic counters of `n` Service ports in IPv4.
    #[derive(Debug)]
    struct Ports(u64);

    impl CounterSource for Ports {
        fn visit(&self, each: &mut dyn FnMut(IpFamily, &str, u64, u64)) {
            for i in 0..self.0 {
                each(
                    IpFamily::V4,
                    &format!("svc/default/svc-{i}/http"),
                    i,
                    1000 * i,
                );
            }
        }
    }

    #[tokio::test]
    async fn a_client_that_hangs_up_mid_scrape_stops_its_encoding() {
        // About 10 MB of text: more than the sockets hold.
        let metrics = Arc::new(Metrics::with_counters(Box::new(Ports(50_000))));
        let addr = free_addr();
        let tasks = serve(
            addr,
            addr,
            Readiness::new(Default::default()),
            metrics.clone(),
        )
        .await
        .unwrap()
        .tasks;
        let idle = Arc::strong_count(&metrics);
        {
            let s = tokio::net::TcpSocket::new_v4().unwrap();
            s.set_recv_buffer_size(4096).unwrap();
            let mut s = s.connect(addr).await.unwrap();
            s.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
                .await
                .unwrap();
            let mut start = vec![0; 64 * 1024];
            s.read_exact(&mut start).await.unwrap();
            assert!(start.starts_with(b"HTTP/1.1 200"));
            // Hangs up here.
        }
        // The scrape's encoder holds a reference to the metrics until it stops.
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
        while Arc::strong_count(&metrics) > idle {
            assert!(
                std::time::Instant::now() < deadline,
                "the encoder still runs"
            );
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        }
        // The next scrape is whole: its last chunk ends the text and the chunked body.
        let m = get(addr, "/metrics").await;
        assert!(m.starts_with("HTTP/1.1 200"), "{}", &m[..200]);
        assert!(
            m.ends_with("\n# EOF\n\r\n0\r\n\r\n"),
            "{}",
            &m[m.len() - 200..]
        );
        for t in tasks {
            t.abort();
        }
    }
}
