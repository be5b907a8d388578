//! Health and metrics over HTTP: `/healthz` (the process answers), `/readyz` (the judgement of
//! `crate::readiness` at the instant it is asked: caches synced, last sync committed, every
//! enabled family forwarding, no change, watch or kernel request past its bound; the body says
//! what is missing) on `--health-addr`; `/metrics` on `--metrics-addr`.

use crate::metrics::{Metrics, CONTENT_TYPE};
use crate::readiness::Readiness;
use axum::body::Body;
use axum::http::{header, StatusCode};
use axum::response::IntoResponse;
use axum::routing::get;
use axum::Router;
use std::net::SocketAddr;
use std::sync::Arc;

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

/// Bind both listeners (one, when the addresses are equal) and serve them in the background.
pub async fn serve(
    health_addr: SocketAddr,
    metrics_addr: SocketAddr,
    ready: Readiness,
    metrics: Arc<Metrics>,
) -> Result<Vec<tokio::task::JoinHandle<()>>, BindError> {
    let mut routers = vec![(health_addr, health_routes(ready))];
    if metrics_addr == health_addr {
        routers[0].1 = routers[0].1.clone().merge(metrics_routes(metrics));
    } else {
        routers.push((metrics_addr, metrics_routes(metrics)));
    }
    let mut tasks = Vec::new();
    for (addr, router) in routers {
        let listener = tokio::net::TcpListener::bind(addr)
            .await
            .map_err(|source| BindError { addr, source })?;
        tracing::info!(%addr, "serving HTTP");
        tasks.push(tokio::spawn(async move {
            if let Err(e) = axum::serve(listener, router).await {
                tracing::error!(%addr, error = %e, "HTTP server stopped");
            }
        }));
    }
    Ok(tasks)
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
            .unwrap();
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
        .unwrap();
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
