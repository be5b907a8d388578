//! Whether this node's kubelet answers its health check (`--kubelet-healthz`, the kubelet's
//! `healthzBindAddress:healthzPort`, `http://127.0.0.1:10248/healthz` by default): while it does
//! not, the kubelet renews neither its node Lease nor the agent Pod's Ready condition, so an
//! agent in a Pod renews its own heartbeat Lease instead (`lease::Heartbeat`). A local request a
//! second, nothing on the API.

use bytes::Bytes;
use http_body_util::Empty;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use std::time::{Duration, Instant};
use tokio::sync::watch;
use tracing::{info, warn};

/// How often the kubelet is asked, and how long an answer may take.
const EVERY: Duration = Duration::from_secs(1);

/// Ask `url` every second; publish on `renewing` whether the agent must renew its own Lease:
/// from the first failed check until the kubelet has answered for `hold` (long enough for the
/// kubelet to renew its node Lease and probe the agent's Pod ready again).
pub async fn watch(url: String, hold: Duration, renewing: watch::Sender<bool>) {
    let uri: axum::http::Uri = match url.parse() {
        Ok(u) => u,
        Err(e) => {
            warn!(url, error = %e, "--kubelet-healthz is not a URL: the heartbeat Lease is renewed every period");
            renewing.send_replace(true);
            return;
        }
    };
    // A new connection each time: a kubelet that stopped must not seem to answer over an idle
    // connection kept from before.
    let client = Client::builder(TokioExecutor::new())
        .pool_max_idle_per_host(0)
        .build_http::<Empty<Bytes>>();
    let mut failed: Option<Instant> = None;
    loop {
        let answer = tokio::time::timeout(EVERY, client.get(uri.clone())).await;
        let why_not = match answer {
            Err(_) => Some(format!("no answer within {EVERY:?}")),
            Ok(Err(e)) => Some(e.to_string()),
            Ok(Ok(r)) if !r.status().is_success() => Some(format!("status {}", r.status())),
            Ok(Ok(_)) => None,
        };
        match why_not {
            Some(why) => {
                if !*renewing.borrow() {
                    warn!(url, error = %why, "the kubelet does not answer its health check: renewing the heartbeat Lease until it does");
                }
                failed = Some(Instant::now());
            }
            None => {
                if failed.is_some_and(|at| at.elapsed() >= hold) {
                    info!(url, "the kubelet has answered for {hold:?}: the heartbeat Lease is written only when it changes again");
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

    /// Renewing starts at the first check that finds nothing listening, and stops once the
    /// health check has answered for `hold`.
    #[tokio::test]
    async fn renews_from_the_first_failed_check_until_the_kubelet_answered_for_hold() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let server = answer(listener);
        let (tx, mut rx) = watch::channel(false);
        let hold = Duration::from_secs(3);
        let checks = tokio::spawn(watch(format!("http://{addr}/healthz"), hold, tx));
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
