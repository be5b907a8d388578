//! Whether the kubelet's word on this agent is current. An agent in a Pod lets the leader read
//! its liveness from the Pod's Ready condition and the kubelet's node Lease
//! (`heartbeat::Liveness::ages`), which holds only while the kubelet runs and the agent's
//! `/readyz` answers 200. So it renews its own heartbeat Lease (`lease::Heartbeat`):
//! - while the kubelet does not answer its health check (`--kubelet-healthz`, the kubelet's
//!   `healthzBindAddress:healthzPort`, `http://127.0.0.1:10248/healthz` by default): its node
//!   Lease and the Pod's condition then stand still;
//! - while `/readyz` fails though the agent runs (a sync failing, say): the Pod turns unready,
//!   but the last committed families stand for a lease duration, as for an agent outside a Pod,
//!   until its heartbeat says `nodelb.io/unhealthy`;
//!
//! and for `hold` after both are well again, long enough for the kubelet to renew its node Lease
//! and probe the Pod ready. A local request a second, nothing on the API.

use crate::run::http::SharedReadiness;
use bytes::Bytes;
use http_body_util::Empty;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use std::time::{Duration, Instant};
use tokio::sync::watch;
use tracing::{info, warn};

/// How often the kubelet and the readiness are looked at, and how long an answer may take.
const EVERY: Duration = Duration::from_secs(1);

/// Look every second; publish on `renewing` whether the agent must renew its own Lease: from
/// the first look that finds the kubelet silent or `ready` failing, until both have been well
/// for `hold`.
pub async fn watch(
    url: String,
    ready: SharedReadiness,
    hold: Duration,
    renewing: watch::Sender<bool>,
) {
    let uri: Option<axum::http::Uri> = match url.parse() {
        Ok(u) => Some(u),
        Err(e) => {
            warn!(url, error = %e, "--kubelet-healthz is not a URL: the heartbeat Lease is renewed every period");
            None
        }
    };
    // A new connection each time: a kubelet that stopped must not seem to answer over an idle
    // connection kept from before.
    let client = Client::builder(TokioExecutor::new())
        .pool_max_idle_per_host(0)
        .build_http::<Empty<Bytes>>();
    let mut failed: Option<Instant> = None;
    loop {
        let kubelet = match &uri {
            None => Some("no URL".to_string()),
            Some(uri) => match tokio::time::timeout(EVERY, client.get(uri.clone())).await {
                Err(_) => Some(format!("no answer within {EVERY:?}")),
                Ok(Err(e)) => Some(e.to_string()),
                Ok(Ok(r)) if !r.status().is_success() => Some(format!("status {}", r.status())),
                Ok(Ok(_)) => None,
            },
        };
        let (ok, body) = ready.lock().expect("readiness lock").report();
        let why = match kubelet {
            Some(e) => Some(format!("the kubelet does not answer {url}: {e}")),
            None if !ok => Some(format!("/readyz fails: {}", body.trim())),
            None => None,
        };
        match why {
            Some(why) => {
                if !*renewing.borrow() {
                    warn!(reason = %why, "renewing the heartbeat Lease while the kubelet's word on this agent is not current");
                }
                failed = Some(Instant::now());
            }
            None => {
                if failed.is_some_and(|at| at.elapsed() >= hold) {
                    info!("the kubelet answers and /readyz too, for {hold:?}: the heartbeat Lease is written only when it changes again");
                    failed = None;
                }
            }
        }
        renewing.send_if_modified(|r| std::mem::replace(r, failed.is_some()) != failed.is_some());
        if renewing.is_closed() {
            return;
        }
        tokio::time::sleep(EVERY).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::routing::get;
    use axum::Router;

    /// A kubelet stand-in: `/healthz` answering 200 on `listener` until the task is aborted.
    fn answer(listener: std::net::TcpListener) -> tokio::task::JoinHandle<()> {
        listener.set_nonblocking(true).unwrap();
        let listener = tokio::net::TcpListener::from_std(listener).unwrap();
        let app = Router::new().route("/healthz", get(|| async { "ok" }));
        tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        })
    }

    /// What `/readyz` reports once the first sync committed.
    fn ready_now() -> crate::run::http::Readiness {
        crate::run::http::Readiness {
            caches_synced: true,
            last_sync_committed: true,
            ..Default::default()
        }
    }

    /// Renewing starts at the first check that finds nothing listening, and stops once the
    /// health check has answered for `hold`; the same for `/readyz` failing.
    #[tokio::test]
    async fn renews_from_the_first_failed_check_until_the_kubelet_answered_for_hold() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let server = answer(listener);
        let (tx, mut rx) = watch::channel(false);
        let hold = Duration::from_secs(3);
        let ready = SharedReadiness::default();
        *ready.lock().unwrap() = ready_now();
        let url = format!("http://{addr}/healthz");
        let checks = tokio::spawn(watch(url, ready.clone(), hold, tx));
        tokio::time::sleep(Duration::from_millis(2500)).await;
        assert!(!*rx.borrow_and_update(), "answering: no renewals");

        server.abort();
        let _ = server.await;
        let down = tokio::time::Instant::now();
        tokio::time::timeout(Duration::from_secs(5), rx.wait_for(|r| *r))
            .await
            .expect("renewing within a few checks of the kubelet going away")
            .unwrap();
        assert!(
            down.elapsed() < Duration::from_secs(3),
            "{:?}",
            down.elapsed()
        );

        let server = answer(std::net::TcpListener::bind(addr).unwrap());
        let up = tokio::time::Instant::now();
        tokio::time::timeout(Duration::from_secs(10), rx.wait_for(|r| !*r))
            .await
            .expect("no longer renewing once the kubelet answered for hold")
            .unwrap();
        assert!(
            up.elapsed() >= hold,
            "renewed for hold after it answered: {:?}",
            up.elapsed()
        );
        checks.abort();
        server.abort();
    }
}
