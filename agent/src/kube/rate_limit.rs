//! Pacing requests to the API server as client-go's token-bucket rate limiter does
//! (`flowcontrol.NewTokenBucketRateLimiter`, over `golang.org/x/time/rate`): a bucket holds up to
//! `burst` tokens and refills at `qps` tokens a second; each request takes one, and when none is
//! left it waits until its token will have been refilled. [`TokenBucket`] is a pure function of
//! the time it is given; [`RateLimiter`] sleeps for it.

use std::time::{Duration, Instant};

#[derive(Clone, Debug)]
pub struct TokenBucket {
    qps: f64,
    burst: f64,
    /// Tokens left as of `at` (below zero: requests already promised a later token).
    tokens: f64,
    at: Instant,
}

impl TokenBucket {
    /// A full bucket at `now`.
    pub fn new(qps: f64, burst: u32, now: Instant) -> TokenBucket {
        TokenBucket {
            qps,
            burst: f64::from(burst),
            tokens: f64::from(burst),
            at: now,
        }
    }

    /// Take a token for a request at `now`: how long the request must wait before it goes.
    pub fn take(&mut self, now: Instant) -> Duration {
        self.tokens = self.refilled(now) - 1.0;
        self.at = self.at.max(now);
        if self.tokens >= 0.0 {
            Duration::ZERO
        } else {
            Duration::from_secs_f64(-self.tokens / self.qps)
        }
    }

    /// Take a token only if one is there at `now` (a request that would have to wait is
    /// turned away instead).
    pub fn try_take(&mut self, now: Instant) -> bool {
        let tokens = self.refilled(now);
        if tokens < 1.0 {
            return false;
        }
        self.at = self.at.max(now);
        self.tokens = tokens - 1.0;
        true
    }

    /// The tokens there are at `now`.
    fn refilled(&self, now: Instant) -> f64 {
        let refill = now.saturating_duration_since(self.at).as_secs_f64() * self.qps;
        (self.tokens + refill).min(self.burst)
    }
}

/// A token bucket shared by the requests of one task or several: each waits for its turn.
#[derive(Debug)]
pub struct RateLimiter(std::sync::Mutex<TokenBucket>);

impl RateLimiter {
    pub fn new(qps: f64, burst: u32) -> RateLimiter {
        RateLimiter(std::sync::Mutex::new(TokenBucket::new(
            qps,
            burst,
            Instant::now(),
        )))
    }

    /// Wait for the next request's turn.
    pub async fn wait(&self) {
        let wait = self
            .0
            .lock()
            .expect("the token bucket")
            .take(Instant::now());
        if !wait.is_zero() {
            tokio::time::sleep(wait).await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Requests sent one after another as soon as each may go: when each goes.
    fn back_to_back(bucket: &mut TokenBucket, start: Instant, n: usize) -> Vec<Duration> {
        let mut now = start;
        (0..n)
            .map(|_| {
                now += bucket.take(now);
                now - start
            })
            .collect()
    }

    #[test]
    fn a_burst_goes_at_once_then_requests_go_at_the_rate() {
        let t0 = Instant::now();
        let mut b = TokenBucket::new(100.0, 200, t0);
        let sent = back_to_back(&mut b, t0, 500);
        assert!(sent[..200].iter().all(|t| t.is_zero()));
        for (i, t) in sent.iter().enumerate().skip(200) {
            let want = Duration::from_secs_f64((i - 199) as f64 / 100.0);
            assert!(t.abs_diff(want) < Duration::from_micros(10), "{i}: {t:?}");
        }
    }

    #[test]
    fn an_idle_bucket_refills_up_to_the_burst_only() {
        let t0 = Instant::now();
        let mut b = TokenBucket::new(10.0, 5, t0);
        back_to_back(&mut b, t0, 5);
        // An hour idle buys five requests, not 36,000.
        let later = t0 + Duration::from_secs(3600);
        let sent = back_to_back(&mut b, later, 7);
        assert!(sent[..5].iter().all(|t| t.is_zero()), "{sent:?}");
        assert!(sent[5].abs_diff(Duration::from_millis(100)) < Duration::from_micros(10));
        assert!(sent[6].abs_diff(Duration::from_millis(200)) < Duration::from_micros(10));
    }

    #[test]
    fn requests_that_wait_keep_their_place() {
        // Two requests asking at the same moment of an empty bucket are promised successive
        // tokens, as `rate.Limiter.Wait` reserves them.
        let t0 = Instant::now();
        let mut b = TokenBucket::new(4.0, 1, t0);
        assert_eq!(b.take(t0), Duration::ZERO);
        assert_eq!(b.take(t0), Duration::from_millis(250));
        assert_eq!(b.take(t0), Duration::from_millis(500));
    }
}
