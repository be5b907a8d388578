//! Who may read `/metrics` on an address other than loopback: a caller with a bearer token the
//! API server authenticates (a `TokenReview`) and authorizes to `get` the non-resource URL
//! `/metrics` (a `SubjectAccessReview`), as the kubelet, kube-scheduler and kube-rbac-proxy
//! check their scrapers. Prometheus in the cluster scrapes with its ServiceAccount's token and
//! the ClusterRole `nodelb-metrics-reader`; a client that can only reach a node address gets
//! 401 and learns nothing.
//!
//! A verdict is kept per token for a while (allowed 60 s, refused 10 s), so a scrape every 15 s
//! costs the API server two reviews a minute at most. Reviews of tokens not yet known are
//! paced (5 a second, bursts of 10): a flood of made-up tokens gets 429 instead of turning
//! into a flood of reviews.

use crate::kube::rate_limit::TokenBucket;
use k8s_openapi::api::authentication::v1::{TokenReview, TokenReviewSpec};
use k8s_openapi::api::authorization::v1::{
    NonResourceAttributes, SubjectAccessReview, SubjectAccessReviewSpec,
};
use kube::api::{Api, PostParams};
use kube::Client;
use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};
use tokio::sync::watch;

/// The URL a scraper must be allowed to `get`.
pub const PATH: &str = "/metrics";
const ALLOWED_FOR: Duration = Duration::from_secs(60);
const REFUSED_FOR: Duration = Duration::from_secs(10);
/// Tokens whose verdict is kept; past it, the expired ones go, then the oldest.
const KEPT: usize = 256;
const REVIEWS_PER_SECOND: f64 = 5.0;
const REVIEW_BURST: u32 = 10;

/// What a scrape gets.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Verdict {
    Allowed,
    /// No bearer token, or one the API server does not know: 401.
    Unauthenticated,
    /// A known user the API server does not allow `get` on `/metrics`: 403.
    Forbidden,
    /// Too many unknown tokens at once, or no API server to ask yet: 429 or 503.
    Busy,
    Unavailable,
}

pub struct Gate {
    client: watch::Receiver<Option<Client>>,
    state: Mutex<State>,
}

struct State {
    verdicts: HashMap<String, (Instant, Verdict)>,
    reviews: TokenBucket,
}

impl Gate {
    /// A gate that asks the API server through the client sent on `client` (none yet: 503).
    pub fn new(client: watch::Receiver<Option<Client>>) -> Gate {
        Gate {
            client,
            state: Mutex::new(State {
                verdicts: HashMap::new(),
                reviews: TokenBucket::new(REVIEWS_PER_SECOND, REVIEW_BURST, Instant::now()),
            }),
        }
    }

    /// The verdict on a request with this `Authorization` header.
    pub async fn check(&self, authorization: Option<&str>) -> Verdict {
        let Some(token) = authorization
            .and_then(|h| h.strip_prefix("Bearer "))
            .map(str::trim)
            .filter(|t| !t.is_empty())
        else {
            return Verdict::Unauthenticated;
        };
        let now = Instant::now();
        {
            let mut state = self.state.lock().expect("the scrape gate");
            if let Some((until, verdict)) = state.verdicts.get(token) {
                if *until > now {
                    return verdict.clone();
                }
            }
            if !state.reviews.try_take(now) {
                return Verdict::Busy;
            }
        }
        let Some(client) = self.client.borrow().clone() else {
            return Verdict::Unavailable;
        };
        let verdict = review(client, token).await;
        let keep = match verdict {
            Verdict::Allowed => ALLOWED_FOR,
            Verdict::Unauthenticated | Verdict::Forbidden => REFUSED_FOR,
            Verdict::Busy | Verdict::Unavailable => return verdict,
        };
        let mut state = self.state.lock().expect("the scrape gate");
        state.keep(token, Instant::now() + keep, verdict.clone());
        verdict
    }
}

impl State {
    fn keep(&mut self, token: &str, until: Instant, verdict: Verdict) {
        if self.verdicts.len() >= KEPT {
            let now = Instant::now();
            self.verdicts.retain(|_, (u, _)| *u > now);
        }
        if self.verdicts.len() >= KEPT {
            if let Some(oldest) = self
                .verdicts
                .iter()
                .min_by_key(|(_, (u, _))| *u)
                .map(|(t, _)| t.clone())
            {
                self.verdicts.remove(&oldest);
            }
        }
        self.verdicts.insert(token.to_string(), (until, verdict));
    }
}

/// A TokenReview, then for an authenticated user a SubjectAccessReview of `get` on `/metrics`.
async fn review(client: Client, token: &str) -> Verdict {
    let post = PostParams::default();
    let asked = TokenReview {
        spec: TokenReviewSpec {
            token: Some(token.to_string()),
            audiences: None,
        },
        ..Default::default()
    };
    let reviewed = match Api::<TokenReview>::all(client.clone())
        .create(&post, &asked)
        .await
    {
        Ok(r) => r,
        Err(e) => {
            tracing::warn!(error = %e, "reviewing a scraper's token failed; answering 503");
            return Verdict::Unavailable;
        }
    };
    let status = reviewed.status.unwrap_or_default();
    let user = match (status.authenticated, status.user) {
        (Some(true), Some(user)) => user,
        _ => return Verdict::Unauthenticated,
    };
    let asked = SubjectAccessReview {
        spec: SubjectAccessReviewSpec {
            user: user.username.clone(),
            uid: user.uid,
            groups: user.groups,
            extra: user.extra,
            non_resource_attributes: Some(NonResourceAttributes {
                path: Some(PATH.to_string()),
                verb: Some("get".to_string()),
            }),
            ..Default::default()
        },
        ..Default::default()
    };
    match Api::<SubjectAccessReview>::all(client)
        .create(&post, &asked)
        .await
    {
        Ok(r) if r.status.as_ref().is_some_and(|s| s.allowed) => Verdict::Allowed,
        Ok(_) => {
            tracing::info!(user = ?user.username, "a scraper may not get /metrics; answering 403");
            Verdict::Forbidden
        }
        Err(e) => {
            tracing::warn!(error = %e, "reviewing a scraper's access failed; answering 503");
            Verdict::Unavailable
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_request_without_a_bearer_token_is_refused_without_asking_anyone() {
        let (_tx, rx) = watch::channel(None);
        let gate = Gate::new(rx);
        for header in [None, Some(""), Some("Basic dXNlcjpwYXNz"), Some("Bearer  ")] {
            assert_eq!(
                gate.check(header).await,
                Verdict::Unauthenticated,
                "{header:?}"
            );
        }
        // No client yet: a token cannot be reviewed.
        assert_eq!(gate.check(Some("Bearer t")).await, Verdict::Unavailable);
    }

    #[tokio::test]
    async fn made_up_tokens_past_the_burst_get_busy_not_reviews() {
        let (_tx, rx) = watch::channel(None);
        let gate = Gate::new(rx);
        let verdicts: Vec<Verdict> = futures::future::join_all((0..30).map(|i| {
            let gate = &gate;
            async move { gate.check(Some(&format!("Bearer token-{i}"))).await }
        }))
        .await;
        let busy = verdicts.iter().filter(|v| **v == Verdict::Busy).count();
        assert!(
            busy >= 19,
            "{busy} of 30 made-up tokens were turned away: {verdicts:?}"
        );
    }

    #[test]
    fn the_kept_verdicts_stay_bounded() {
        let mut state = State {
            verdicts: HashMap::new(),
            reviews: TokenBucket::new(1.0, 1, Instant::now()),
        };
        let until = Instant::now() + Duration::from_secs(60);
        for i in 0..(KEPT * 3) {
            state.keep(&format!("t{i}"), until, Verdict::Forbidden);
        }
        assert_eq!(state.verdicts.len(), KEPT);
    }
}
