//! Health and metrics over HTTP: `/healthz` (the process answers), `/readyz` (caches synced,
//! last sync committed, every enabled family forwarding; the body says what is missing) on
//! `--health-addr`; `/metrics` on `--metrics-addr`.

use super::metrics::{Metrics, CONTENT_TYPE};
use crate::plan::IpFamily;
use axum::http::{header, StatusCode};
use axum::response::IntoResponse;
use axum::routing::get;
use axum::Router;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

/// What readiness depends on; the sync loop updates it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Readiness {
    pub caches_synced: bool,
    pub last_sync_committed: bool,
    /// The last sync's error, when it failed.
    pub last_error: Option<String>,
    /// Each enabled family and why it is not programmed (`None`: forwarding and programmed).
    pub families: Vec<(IpFamily, Option<String>)>,
    /// Things that do not make the node unready but an operator should know (foreign forward
    /// policies that drop).
    pub notes: Vec<String>,
}

impl Readiness {
    /// Ready or not, and a body that says what is missing.
    pub fn report(&self) -> (bool, String) {
        let mut missing = Vec::new();
        if !self.caches_synced {
            missing.push("watch caches not synced yet".to_string());
        }
        if !self.last_sync_committed {
            missing.push(match &self.last_error {
                Some(e) => format!("last sync not committed: {e}"),
                None => "no sync committed yet".to_string(),
            });
        }
        for (f, why) in &self.families {
            if let Some(why) = why {
                missing.push(format!("{f}: {why}"));
            }
        }
        let mut body = if missing.is_empty() {
            "ready\n".to_string()
        } else {
            let mut b = "not ready:\n".to_string();
            for m in &missing {
                b.push_str(&format!("- {m}\n"));
            }
            b
        };
        for n in &self.notes {
            body.push_str(&format!("note: {n}\n"));
        }
        (missing.is_empty(), body)
    }
}

pub type SharedReadiness = Arc<Mutex<Readiness>>;

fn health_routes(ready: SharedReadiness) -> Router {
    Router::new()
        .route("/healthz", get(|| async { "ok\n" }))
        .route(
            "/readyz",
            get(move || {
                let (ok, body) = ready.lock().expect("readiness lock").report();
                let code = if ok {
                    StatusCode::OK
                } else {
                    StatusCode::SERVICE_UNAVAILABLE
                };
                async move { (code, body) }
            }),
        )
}

fn metrics_routes(metrics: Arc<Metrics>) -> Router {
    Router::new().route(
        "/metrics",
        get(move || {
            let metrics = metrics.clone();
            async move {
                // Rendering reads the kernel's counters over netlink: off the async workers.
                match tokio::task::spawn_blocking(move || metrics.render()).await {
                    Ok(text) => ([(header::CONTENT_TYPE, CONTENT_TYPE)], text).into_response(),
                    Err(_) => StatusCode::INTERNAL_SERVER_ERROR.into_response(),
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
    ready: SharedReadiness,
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

    #[test]
    fn readiness_says_what_is_missing() {
        let mut r = Readiness::default();
        let (ok, body) = r.report();
        assert!(!ok);
        assert_eq!(
            body,
            "not ready:\n- watch caches not synced yet\n- no sync committed yet\n"
        );
        r.caches_synced = true;
        r.last_sync_committed = true;
        r.families = vec![
            (IpFamily::V4, None),
            (
                IpFamily::V6,
                Some("forwarding is off (run `sysctl -w net.ipv6.conf.all.forwarding=1`)".into()),
            ),
        ];
        let (ok, body) = r.report();
        assert!(!ok);
        assert!(body.contains("- IPv6: forwarding is off"), "{body}");
        r.families.pop();
        r.notes
            .push("table inet fw chain FORWARD (hook forward priority 0) has policy drop".into());
        let (ok, body) = r.report();
        assert!(ok);
        assert!(body.starts_with("ready\nnote: table inet fw"), "{body}");
    }

    #[tokio::test]
    async fn serves_health_readiness_and_metrics() {
        let ready: SharedReadiness = Default::default();
        let metrics = Arc::new(Metrics::new());
        // Port 0 on loopback: pick free ports; one listener when both addresses are equal.
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap();
        drop(l);
        let tasks = serve(addr, addr, ready.clone(), metrics.clone())
            .await
            .unwrap();
        assert_eq!(tasks.len(), 1);
        let get = |path: &str| {
            let path = path.to_string();
            async move {
                use tokio::io::{AsyncReadExt, AsyncWriteExt};
                let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
                s.write_all(
                    format!("GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
                        .as_bytes(),
                )
                .await
                .unwrap();
                let mut out = String::new();
                s.read_to_string(&mut out).await.unwrap();
                out
            }
        };
        assert!(get("/healthz").await.starts_with("HTTP/1.1 200"));
        assert!(get("/readyz").await.starts_with("HTTP/1.1 503"));
        {
            let mut r = ready.lock().unwrap();
            r.caches_synced = true;
            r.last_sync_committed = true;
        }
        assert!(get("/readyz").await.starts_with("HTTP/1.1 200"));
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
}
