//! How every watch of the agent is asked for: how long one request lasts, and how soon a failed
//! one is tried again. Both are about what a node costs the API server and how fast it heals.
//!
//! - **Lifetime.** A watch is one request until the server ends it at its `timeoutSeconds`;
//!   then the watcher asks again from the last resourceVersion (bookmarks keep it current).
//!   At steady state an agent's requests are its watches' restarts, so they last
//!   [`LIFETIME`] (about half an hour, as kube-apiserver's own default of 30 to 60 minutes
//!   for clients that name none): a handful of requests per agent per hour, within the budget of
//!   one request per node per minute at 5,000 nodes (docs/design.md, "Liveness"). Each
//!   watch draws its own lifetime within ±10%, so agents started together (a DaemonSet
//!   rollout) do not all ask again in the same second. A dead connection is not left to the
//!   lifetime: TCP keep-alive closes it (`connection`).
//! - **Retry.** After an error (the server restarting, a connection closed as dead) the
//!   watcher asks again after [`Retry`]'s delay: 0.5 s doubling to at most 4 s, each drawn
//!   within ±50%. Short, because readiness waits on it: once a partition heals, the agent
//!   hears the server again within one delay and a connect, and its node is back in the
//!   status seconds later. The jitter spreads the reconnections of many agents.

use kube::runtime::utils::Backoff;
use kube::runtime::watcher;
use std::hash::{BuildHasher, Hasher};
use std::time::Duration;

/// A watch request's lifetime before its draw.
pub const LIFETIME: Duration = Duration::from_secs(1800);
/// The first retry's delay, before its draw.
pub const RETRY_FIRST: Duration = Duration::from_millis(500);
/// The longest retry delay, before its draw.
pub const RETRY_MAX: Duration = Duration::from_secs(4);

/// A random number in `[0, 1)`, from the standard library's per-process random hash keys.
fn unit() -> f64 {
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u64(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as u64),
    );
    (h.finish() >> 11) as f64 / (1u64 << 53) as f64
}

/// `d` drawn within `±spread` of itself.
fn drawn(d: Duration, spread: f64) -> Duration {
    d.mul_f64(1.0 - spread + 2.0 * spread * unit())
}

/// A watcher's config: its lifetime drawn, pages as given.
pub fn config() -> watcher::Config {
    let secs = drawn(LIFETIME, 0.1).as_secs();
    watcher::Config::default().timeout(u32::try_from(secs).unwrap_or(u32::MAX))
}

/// The retry delays of a watch: see the module's doc.
#[derive(Debug, Default)]
pub struct Retry {
    next: Option<Duration>,
}

impl Iterator for Retry {
    type Item = Duration;

    fn next(&mut self) -> Option<Duration> {
        let d = self.next.unwrap_or(RETRY_FIRST);
        self.next = Some((d * 2).min(RETRY_MAX));
        Some(drawn(d, 0.5))
    }
}

impl Backoff for Retry {
    fn reset(&mut self) {
        self.next = None;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn retries_double_to_four_seconds_within_half_and_start_over_after_a_success() {
        let mut r = Retry::default();
        let bases = [0.5, 1.0, 2.0, 4.0, 4.0, 4.0];
        for base in bases {
            let d = r.next().unwrap().as_secs_f64();
            assert!(d >= base * 0.5 && d <= base * 1.5, "{d} around {base}");
        }
        r.reset();
        let d = r.next().unwrap().as_secs_f64();
        assert!((0.25..=0.75).contains(&d), "{d}");
    }

    #[test]
    fn each_watch_draws_a_lifetime_within_a_tenth() {
        let lifetimes: Vec<u32> = (0..50).map(|_| config().timeout.unwrap()).collect();
        assert!(
            lifetimes.iter().all(|t| (1620..=1980).contains(t)),
            "{lifetimes:?}"
        );
        assert!(
            lifetimes.iter().any(|t| *t != lifetimes[0]),
            "drawn, not fixed: {lifetimes:?}"
        );
    }
}
