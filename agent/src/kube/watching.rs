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
//! - **Relist.** A watch that failed for longer than `--max-view-age` is started over
//!   ([`relisting`]): it lists again once it can, instead of resuming from its last
//!   resourceVersion, and readiness waits until that list is committed. A resumed watch hands
//!   over what it missed as ordinary events, with nothing to say when it is done; a list
//!   ends with `InitDone`. So an agent cut off long enough to be unready is ready again only
//!   once its rules say what the cluster says now, not the moment it hears the server again.

use futures::{Stream, StreamExt};
use kube::runtime::utils::Backoff;
use kube::runtime::watcher::{self, Event};
use std::hash::{BuildHasher, Hasher};
use std::pin::Pin;
use std::time::Duration;
use tokio::time::Instant;

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

/// A watch made by `make` (a watcher with its backoff), started over with a fresh `make()`
/// once it has failed for `stale_after`: at the first error past that (so the list is under way
/// while the server is still unreachable), or at the first event past it if no error came
/// meanwhile (that event is dropped: the list brings it). `on_relist` is called at each start
/// over. An event that arrives resets the count.
pub fn relisting<K, S>(
    make: impl Fn() -> S + Send + 'static,
    stale_after: Duration,
    on_relist: impl Fn() + Send + 'static,
) -> impl Stream<Item = Result<Event<K>, watcher::Error>> + Send
where
    K: Send + 'static,
    S: Stream<Item = Result<Event<K>, watcher::Error>> + Send + 'static,
{
    struct State<S, M, R> {
        inner: Pin<Box<S>>,
        make: M,
        on_relist: R,
        failing_since: Option<Instant>,
        started_over: bool,
    }
    let first = Box::pin(make());
    let state = State {
        inner: first,
        make,
        on_relist,
        failing_since: None,
        started_over: false,
    };
    futures::stream::unfold(state, move |mut st| async move {
        loop {
            let item = st.inner.next().await?;
            if item.is_err() {
                st.failing_since.get_or_insert_with(Instant::now);
            }
            let stale = st
                .failing_since
                .is_some_and(|since| since.elapsed() >= stale_after);
            if stale && !st.started_over {
                st.inner = Box::pin((st.make)());
                st.started_over = true;
                (st.on_relist)();
                if item.is_ok() {
                    continue;
                }
            } else if item.is_ok() {
                st.failing_since = None;
                st.started_over = false;
            }
            return Some((item, st));
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;

    /// The n-th watcher `make` returns: what it yields, each after a pause.
    fn script(n: usize) -> Vec<(u64, Result<Event<u32>, ()>)> {
        match n {
            // A watch that delivers, then fails three times 4 s apart, then resumes.
            0 => vec![
                (0, Ok(Event::Apply(1))),
                (1, Err(())),
                (4, Err(())),
                (4, Err(())),
                (4, Ok(Event::Apply(2))),
            ],
            // The one started over: fails once, then lists.
            _ => vec![
                (4, Err(())),
                (1, Ok(Event::Init)),
                (0, Ok(Event::InitApply(2))),
                (0, Ok(Event::InitDone)),
            ],
        }
    }

    fn made(n: usize) -> impl Stream<Item = Result<Event<u32>, watcher::Error>> + Send {
        futures::stream::iter(script(n)).then(|(pause, item)| async move {
            tokio::time::sleep(Duration::from_secs(pause)).await;
            item.map_err(|()| watcher::Error::NoResourceVersion)
        })
    }

    /// What a stream yields, with when (whole seconds since the start).
    async fn run(stale_after: Duration) -> (Vec<(u64, String)>, usize) {
        let makes = Arc::new(AtomicUsize::new(0));
        let relists = Arc::new(AtomicUsize::new(0));
        let (m, r) = (makes.clone(), relists.clone());
        let s = relisting(
            move || made(m.fetch_add(1, Ordering::SeqCst)),
            stale_after,
            move || {
                r.fetch_add(1, Ordering::SeqCst);
            },
        );
        let t0 = Instant::now();
        let out = s
            .map(|i| {
                let what = match i {
                    Ok(e) => format!("{e:?}"),
                    Err(_) => "error".to_string(),
                };
                (t0.elapsed().as_secs(), what)
            })
            .collect()
            .await;
        (out, relists.load(Ordering::SeqCst))
    }

    #[tokio::test(start_paused = true)]
    async fn a_watch_failing_past_its_bound_lists_again_and_a_shorter_failure_resumes() {
        let (out, relists) = run(Duration::from_secs(10)).await;
        let said: Vec<(u64, &str)> = out.iter().map(|(t, w)| (*t, w.as_str())).collect();
        assert_eq!(
            said,
            [
                (0, "Apply(1)"),
                (1, "error"),
                (5, "error"),
                // 8 s of failure at 9 s: not yet.
                (9, "error"),
                // Past 10 s: the resumed watch's event is dropped, the new one lists.
                (17, "error"),
                (18, "Init"),
                (18, "InitApply(2)"),
                (18, "InitDone"),
            ]
        );
        assert_eq!(relists, 1);
        let (out, relists) = run(Duration::from_secs(5)).await;
        assert_eq!(relists, 1, "started over once per loss");
        assert_eq!(
            out.last().unwrap(),
            &(14, "InitDone".to_string()),
            "started over at the error past the bound (9 s), not at the event (13 s): {out:?}"
        );
        let (out, relists) = run(Duration::from_secs(60)).await;
        assert_eq!(relists, 0);
        assert_eq!(out.last().unwrap(), &(13, "Apply(2)".to_string()));
    }

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
