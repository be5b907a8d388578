//! kube-proxy's health check of `externalTrafficPolicy: Local` Services, served by nodelb with
//! `--health-check-node-ports`: on each such Service's `healthCheckNodePort`, any path answers
//! 200 where this node forwards the Service's new connections to a ready local endpoint and
//! its last sync committed, 503 otherwise, with kube-proxy's JSON body and its
//! `X-Load-Balancing-Endpoint-Weight` header. An outer load balancer that asks sends clients
//! only to the nodes that answer 200.
//!
//! The ports are the API server's to allocate, from the NodePort range, and kube-proxy binds
//! the same ones where it runs: a port another process holds is left to it, said once in the
//! log (and again when the reason changes), and tried again later. The sync loop publishes
//! the answers; a task of this room binds, unbinds and answers.

use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Router;
use nodelb_core::plan::health::HealthCheck;
use nodelb_core::vocab::{Families, IpFamily};
use std::collections::BTreeMap;
use std::net::{Ipv4Addr, Ipv6Addr, SocketAddr};
use std::time::Duration;
use tokio::sync::watch;
use tokio::task::JoinHandle;

/// How often ports another process held are tried again when nothing else changes.
const RETRY: Duration = Duration::from_secs(30);

/// What the health checks answer: one per port, and whether the agent's last sync committed
/// (kube-proxy's `serviceProxyHealthy`).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Answers {
    pub checks: BTreeMap<u16, HealthCheck>,
    pub agent_healthy: bool,
}

/// The sync loop's handle: it publishes answers; the room's task does the rest.
pub struct HealthCheckNodePorts {
    answers: watch::Sender<Answers>,
    task: JoinHandle<()>,
}

impl HealthCheckNodePorts {
    /// Start the room: it answers on the ports of what is published, on the wildcard address
    /// of each of `families`.
    pub fn start(families: Families) -> HealthCheckNodePorts {
        let (answers, rx) = watch::channel(Answers::default());
        let task = tokio::spawn(run(rx, families));
        HealthCheckNodePorts { answers, task }
    }

    /// The answers from now on (binding and unbinding ports as they come and go).
    pub fn publish(&self, answers: Answers) {
        self.answers.send_if_modified(|a| {
            let changed = *a != answers;
            *a = answers;
            changed
        });
    }
}

impl Drop for HealthCheckNodePorts {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// The ports bound, and the ones that could not be, with why.
#[derive(Default)]
struct Ports {
    serving: BTreeMap<u16, Vec<JoinHandle<()>>>,
    unavailable: BTreeMap<u16, String>,
}

impl Drop for Ports {
    fn drop(&mut self) {
        for tasks in self.serving.values() {
            tasks.iter().for_each(JoinHandle::abort);
        }
    }
}

async fn run(mut rx: watch::Receiver<Answers>, families: Families) {
    let mut ports = Ports::default();
    loop {
        let wanted = rx.borrow_and_update().checks.clone();
        reconcile(&mut ports, &wanted, families, &rx);
        let retry = !ports.unavailable.is_empty();
        tokio::select! {
            changed = rx.changed() => if changed.is_err() { return },
            _ = tokio::time::sleep(RETRY), if retry => {}
        }
    }
}

/// Bind the ports `wanted` has and `ports` does not serve; unbind the ones it no longer has.
fn reconcile(
    ports: &mut Ports,
    wanted: &BTreeMap<u16, HealthCheck>,
    families: Families,
    rx: &watch::Receiver<Answers>,
) {
    ports.serving.retain(|port, tasks| {
        let kept = wanted.contains_key(port);
        if !kept {
            tasks.iter().for_each(JoinHandle::abort);
            tracing::info!(port, "health check node port closed");
        }
        kept
    });
    ports
        .unavailable
        .retain(|port, _| wanted.contains_key(port));
    for (&port, check) in wanted {
        if ports.serving.contains_key(&port) {
            continue;
        }
        match serve_port(port, families, rx.clone()) {
            Ok(tasks) => {
                ports.unavailable.remove(&port);
                tracing::info!(port, service = %check.service, "answering health checks");
                ports.serving.insert(port, tasks);
            }
            Err(why) => {
                if ports.unavailable.get(&port) != Some(&why) {
                    tracing::warn!(
                        port,
                        service = %check.service,
                        error = %why,
                        "cannot answer this Service's health checks: the port is not free on \
                         this node (kube-proxy answers them where it runs; run nodelb without \
                         --health-check-node-ports there); trying again every {}s",
                        RETRY.as_secs()
                    );
                }
                ports.unavailable.insert(port, why);
            }
        }
    }
}

/// Listen on `port` of every family's wildcard address and answer there, or say why not
/// (nothing stays bound then).
fn serve_port(
    port: u16,
    families: Families,
    rx: watch::Receiver<Answers>,
) -> Result<Vec<JoinHandle<()>>, String> {
    let mut listeners = Vec::new();
    for f in families.iter() {
        let addr = match f {
            IpFamily::V4 => SocketAddr::from((Ipv4Addr::UNSPECIFIED, port)),
            IpFamily::V6 => SocketAddr::from((Ipv6Addr::UNSPECIFIED, port)),
        };
        listeners.push(bind(addr).map_err(|e| format!("listening on {addr}: {e}"))?);
    }
    let router = Router::new().fallback(move || {
        let answer = answer(&rx.borrow(), port);
        async move { answer }
    });
    Ok(listeners
        .into_iter()
        .map(|l| {
            let router = router.clone();
            tokio::spawn(async move {
                if let Err(e) = axum::serve(l, router).await {
                    tracing::error!(port, error = %e, "health check server stopped");
                }
            })
        })
        .collect())
}

/// A listener on `addr`; an IPv6 one takes IPv6 only, so the IPv4 wildcard stays its own.
fn bind(addr: SocketAddr) -> std::io::Result<tokio::net::TcpListener> {
    use socket2::{Domain, Protocol, Socket, Type};
    let s = Socket::new(Domain::for_address(addr), Type::STREAM, Some(Protocol::TCP))?;
    if addr.is_ipv6() {
        s.set_only_v6(true)?;
    }
    s.set_reuse_address(true)?;
    s.set_nonblocking(true)?;
    s.bind(&addr.into())?;
    s.listen(128)?;
    tokio::net::TcpListener::from_std(s.into())
}

/// kube-proxy's answer for `port`: status, headers and body.
fn answer(answers: &Answers, port: u16) -> Response {
    let Some(check) = answers.checks.get(&port) else {
        return StatusCode::SERVICE_UNAVAILABLE.into_response();
    };
    let healthy = check.healthy(answers.agent_healthy);
    let code = if healthy {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    };
    let mut r = (code, check.body(answers.agent_healthy)).into_response();
    let h = r.headers_mut();
    h.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    h.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    h.insert(
        "X-Load-Balancing-Endpoint-Weight",
        HeaderValue::from(check.local_endpoints),
    );
    r
}

#[cfg(test)]
mod tests {
    use super::*;
    use nodelb_core::vocab::ServiceKey;

    fn answers(local_endpoints: usize, agent_healthy: bool) -> Answers {
        Answers {
            checks: [(
                31000,
                HealthCheck {
                    service: ServiceKey::new("shop", "web"),
                    local_endpoints,
                },
            )]
            .into(),
            agent_healthy,
        }
    }

    fn weight(r: &Response) -> &str {
        r.headers()["X-Load-Balancing-Endpoint-Weight"]
            .to_str()
            .unwrap()
    }

    #[test]
    fn local_endpoints_and_a_committed_sync_answer_200_with_their_weight() {
        let r = answer(&answers(3, true), 31000);
        assert_eq!(r.status(), StatusCode::OK);
        assert_eq!(weight(&r), "3");
        assert_eq!(r.headers()[header::CONTENT_TYPE], "application/json");
    }

    #[test]
    fn no_local_endpoint_or_a_failed_sync_answers_503() {
        let r = answer(&answers(0, true), 31000);
        assert_eq!(r.status(), StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(weight(&r), "0");
        let r = answer(&answers(2, false), 31000);
        assert_eq!(r.status(), StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(
            weight(&r),
            "2",
            "kube-proxy's weight is the count either way"
        );
        let r = answer(&answers(2, true), 31001);
        assert_eq!(r.status(), StatusCode::SERVICE_UNAVAILABLE);
    }
}
