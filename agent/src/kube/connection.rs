//! The agent's connections to the API server, and what they tell readiness.
//!
//! A connection can die without a word: a black-holed path, a node cut off, a NAT entry
//! dropped between the agent and the server. No RST arrives, an idle watch just stays quiet,
//! and the agent would go on serving what it last knew. So every connection the agent opens
//! keeps itself alive at the TCP level: after [`KEEPALIVE_IDLE`] without traffic the kernel
//! sends a probe every [`KEEPALIVE_INTERVAL`], and `TCP_USER_TIMEOUT` ([`USER_TIMEOUT`]) has it
//! close a connection whose probes or data went unacknowledged that long. A dead connection is
//! closed within about [`USER_TIMEOUT`] of the last packet heard, and its watch stream ends
//! with an error, which is what [`ApiView`] sees (kube's client speaks HTTP/1.1 here, one
//! connection per watch, so there is no HTTP/2 ping to lean on). This costs the server one
//! probe and its acknowledgement per idle connection every few seconds and no request.
//!
//! The client of the agent's inputs (Services, EndpointSlices, its Node) also records each
//! watch stream it opens and closes in the agent's [`ApiView`]: readiness judges how long a
//! watch has gone without one (`--max-view-age`).
//!
//! The stack is kube's own (base URI, authentication with token refresh, extra headers) over
//! an HTTP connector configured as above, with TLS from the kubeconfig. A kubeconfig that names
//! a proxy gets kube's default stack instead, without these settings (said once in the log).

use crate::readiness::ApiView;
use futures::future::BoxFuture;
use http::{Request, Response};
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use kube::client::{Body, ConfigExt};
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};
use tower::{BoxError, Layer, Service, ServiceBuilder};
use tracing::warn;

/// Idle time before the first keep-alive probe.
pub const KEEPALIVE_IDLE: Duration = Duration::from_secs(5);
/// Time between keep-alive probes.
pub const KEEPALIVE_INTERVAL: Duration = Duration::from_secs(5);
/// How long sent data or probes may go unacknowledged before the kernel closes the
/// connection (`TCP_USER_TIMEOUT`).
pub const USER_TIMEOUT: Duration = Duration::from_secs(10);
/// How long a new connection may take (a SYN into a black hole gets no answer at all).
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(4);

/// A client for `config`; with `view`, one whose watch streams are recorded there.
pub fn client(config: kube::Config, view: Option<ApiView>) -> Result<kube::Client, kube::Error> {
    if config.proxy_url.is_some() {
        warn!("the kubeconfig names a proxy: kube's default connections are used, without TCP keep-alive; a dead connection to the API server is found only when a watch times out");
        return kube::Client::try_from(config);
    }
    let mut http = HttpConnector::new();
    http.enforce_http(false);
    http.set_nodelay(true);
    http.set_connect_timeout(Some(CONNECT_TIMEOUT));
    http.set_keepalive(Some(KEEPALIVE_IDLE));
    http.set_keepalive_interval(Some(KEEPALIVE_INTERVAL));
    http.set_keepalive_retries(Some(3));
    http.set_tcp_user_timeout(Some(USER_TIMEOUT));
    let https = config.rustls_https_connector_with_connector(http)?;
    let hyper: hyper_util::client::legacy::Client<_, Body> =
        hyper_util::client::legacy::Client::builder(TokioExecutor::new()).build(https);
    let service = ServiceBuilder::new()
        .layer(ViewLayer(view))
        .layer(config.base_uri_layer())
        .option_layer(config.auth_layer()?)
        .layer(config.extra_headers_layer()?)
        .map_err(BoxError::from)
        .service(hyper);
    Ok(kube::client::ClientBuilder::new(service, config.default_namespace.clone()).build())
}

/// What a watch request watches, as readiness names it: the resource, and its selectors (an
/// agent watches its own Node by name). `None`: not a watch.
fn watch_of(uri: &http::Uri) -> Option<String> {
    let query = uri.query()?;
    let mut watch = false;
    let mut selectors = Vec::new();
    for (k, v) in url_pairs(query) {
        match k.as_str() {
            "watch" => watch = v == "true" || v == "1",
            "fieldSelector" | "labelSelector" if !v.is_empty() => selectors.push(v),
            _ => {}
        }
    }
    if !watch {
        return None;
    }
    let resource = uri.path().rsplit('/').next().unwrap_or_default();
    Some(if selectors.is_empty() {
        resource.to_string()
    } else {
        format!("{resource} ({})", selectors.join(", "))
    })
}

/// A query's pairs, percent-decoded.
fn url_pairs(query: &str) -> impl Iterator<Item = (String, String)> + '_ {
    query.split('&').filter(|p| !p.is_empty()).map(|p| {
        let (k, v) = p.split_once('=').unwrap_or((p, ""));
        (decode(k), decode(v))
    })
}

fn decode(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let escaped = (bytes[i] == b'%')
            .then(|| s.get(i + 1..i + 3))
            .flatten()
            .and_then(|hex| u8::from_str_radix(hex, 16).ok());
        match (bytes[i], escaped) {
            (_, Some(b)) => {
                out.push(b);
                i += 2;
            }
            (b'+', None) => out.push(b' '),
            (b, None) => out.push(b),
        }
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// Records the watch streams of the service it wraps in an [`ApiView`] (with none, it only
/// passes them on).
#[derive(Clone)]
struct ViewLayer(Option<ApiView>);

impl<S> Layer<S> for ViewLayer {
    type Service = ViewService<S>;

    fn layer(&self, inner: S) -> ViewService<S> {
        ViewService {
            inner,
            view: self.0.clone(),
        }
    }
}

#[derive(Clone)]
struct ViewService<S> {
    inner: S,
    view: Option<ApiView>,
}

impl<S, B> Service<Request<Body>> for ViewService<S>
where
    S: Service<Request<Body>, Response = Response<B>>,
    S::Future: Send + 'static,
    B: http_body::Body + Unpin + Send + 'static,
{
    type Response = Response<Watched<B>>;
    type Error = S::Error;
    type Future = BoxFuture<'static, Result<Self::Response, S::Error>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: Request<Body>) -> Self::Future {
        let what = self.view.as_ref().and_then(|_| watch_of(req.uri()));
        if let (Some(view), Some(w)) = (&self.view, &what) {
            view.asked(w);
        }
        let answer = self.inner.call(req);
        let view = self.view.clone();
        Box::pin(async move {
            let res = answer.await?;
            let open = match (view, what) {
                (Some(view), Some(what)) if res.status().is_success() => {
                    view.opened(&what);
                    Some(Open { view, what })
                }
                _ => None,
            };
            Ok(res.map(|body| Watched { body, open }))
        })
    }
}

/// A response body, and the watch stream it is, closed when the body ends or is dropped.
pub struct Watched<B> {
    body: B,
    open: Option<Open>,
}

struct Open {
    view: ApiView,
    what: String,
}

impl Drop for Open {
    fn drop(&mut self) {
        self.view.closed(&self.what, Instant::now());
    }
}

impl<B: http_body::Body + Unpin> http_body::Body for Watched<B> {
    type Data = B::Data;
    type Error = B::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<B::Data>, B::Error>>> {
        let polled = Pin::new(&mut self.body).poll_frame(cx);
        if let Poll::Ready(None | Some(Err(_))) = &polled {
            // The stream is over (or broken): closed now, not when the body is dropped.
            self.open = None;
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.body.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_watch_is_named_by_its_resource_and_selectors() {
        let uri: http::Uri = "/api/v1/nodes?&fieldSelector=metadata.name%3Dnode-a&timeoutSeconds=1800&watch=true&resourceVersion=5&allowWatchBookmarks=true"
            .parse()
            .unwrap();
        assert_eq!(
            watch_of(&uri).as_deref(),
            Some("nodes (metadata.name=node-a)")
        );
        let uri: http::Uri =
            "/apis/discovery.k8s.io/v1/endpointslices?watch=true&timeoutSeconds=1800"
                .parse()
                .unwrap();
        assert_eq!(watch_of(&uri).as_deref(), Some("endpointslices"));
        let list: http::Uri = "/api/v1/services?limit=500".parse().unwrap();
        assert_eq!(watch_of(&list), None);
        let get: http::Uri = "/api/v1/namespaces/nodelb-system/pods/p".parse().unwrap();
        assert_eq!(watch_of(&get), None);
    }

    #[test]
    fn percent_escapes_and_pluses_decode() {
        assert_eq!(decode("a%3Db+c%2"), "a=b c%2");
        assert_eq!(decode("%zz"), "%zz");
    }
}
