//! The agent's readiness, in one place: what the sync loop, the watches, the API connections
//! and the kernel actor record as they go, and the judgement over it
//! (`nodelb_core::readiness::judge`), made at the instant it is asked for. So a sync loop or a
//! kernel actor that hangs, or a connection that died without a word, turns `/readyz` unready
//! by itself: ages grow while nobody records anything.
//!
//! Writers: the sync loop ([`Readiness::set`], [`Readiness::changes_applied`],
//! [`Readiness::caught_up`]), the watches ([`Readiness::change_received`],
//! [`Readiness::relisting`]), the API client's connection layer ([`ApiView`]) and the
//! kernel handle ([`KernelWait`]). Readers: the HTTP server (`/readyz`) and the heartbeat.

use nodelb_core::readiness::{judge, Bounds, LastSync, Signals, Verdict};
use nodelb_core::vocab::IpFamily;
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// What the sync loop says after each sync.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SyncState {
    pub caches_synced: bool,
    pub last_sync: LastSync,
    /// Each enabled family and why it is not programmed (`None`: it is).
    pub families: Vec<(IpFamily, Option<String>)>,
    /// Foreign forward policies that drop: said, not judged.
    pub notes: Vec<String>,
}

/// The shared readiness of this agent. Cheap to clone.
#[derive(Clone)]
pub struct Readiness {
    inner: Arc<Inner>,
}

struct Inner {
    bounds: Bounds,
    sync: Mutex<SyncState>,
    /// When the oldest change not yet committed was received (kube-proxy's "queued update").
    waiting: Mutex<Option<Instant>>,
    /// The watches listing again after a long loss of their stream, and since when.
    catching_up: Mutex<BTreeMap<&'static str, Instant>>,
    kernel: KernelWait,
    view: ApiView,
}

impl Readiness {
    pub fn new(bounds: Bounds) -> Readiness {
        Readiness {
            inner: Arc::new(Inner {
                bounds,
                sync: Mutex::new(SyncState::default()),
                waiting: Mutex::new(None),
                catching_up: Mutex::new(BTreeMap::new()),
                kernel: KernelWait::default(),
                view: ApiView::default(),
            }),
        }
    }

    pub fn bounds(&self) -> Bounds {
        self.inner.bounds
    }

    /// Where the API client records its watches' streams.
    pub fn view(&self) -> ApiView {
        self.inner.view.clone()
    }

    /// Where the kernel handle records its requests.
    pub fn kernel(&self) -> KernelWait {
        self.inner.kernel.clone()
    }

    /// The sync loop changes what it says.
    pub fn set(&self, f: impl FnOnce(&mut SyncState)) {
        f(&mut self.inner.sync.lock().expect("readiness"));
    }

    /// A watch delivered a change at `at` (kept if it is the oldest not committed).
    pub fn change_received(&self, at: Instant) {
        self.inner
            .waiting
            .lock()
            .expect("readiness")
            .get_or_insert(at);
    }

    /// Every change taken so far is committed, or needed no commit. `queued`: more wait to be
    /// taken (they arrived meanwhile): they wait from now on, at the latest.
    pub fn changes_applied(&self, queued: bool) {
        *self.inner.waiting.lock().expect("readiness") = queued.then(Instant::now);
    }

    /// The watch of `what` lists again after its stream was gone too long: not caught up
    /// until a sync that took the end of that list commits ([`Readiness::caught_up`]).
    pub fn relisting(&self, what: &'static str) {
        self.inner
            .catching_up
            .lock()
            .expect("readiness")
            .entry(what)
            .or_insert_with(Instant::now);
    }

    /// A sync that took the end of the lists of `whats` committed.
    pub fn caught_up<'a>(&self, whats: impl IntoIterator<Item = &'a &'static str>) {
        let mut c = self.inner.catching_up.lock().expect("readiness");
        for what in whats {
            c.remove(what);
        }
    }

    /// What readiness depends on at `now`.
    pub fn signals(&self, now: Instant) -> Signals {
        let sync = self.inner.sync.lock().expect("readiness").clone();
        let waiting = *self.inner.waiting.lock().expect("readiness");
        Signals {
            caches_synced: sync.caches_synced,
            last_sync: sync.last_sync,
            families: sync.families,
            notes: sync.notes,
            change_waiting: waiting.map(|at| now.saturating_duration_since(at)),
            views: self.inner.view.ages(now),
            kernel_waiting: self.inner.kernel.waiting(now),
            catching_up: self
                .inner
                .catching_up
                .lock()
                .expect("readiness")
                .iter()
                .map(|(what, since)| (what.to_string(), now.saturating_duration_since(*since)))
                .collect(),
        }
    }

    /// The judgement at `now`.
    pub fn report(&self, now: Instant) -> Verdict {
        judge(&self.signals(now), &self.inner.bounds)
    }
}

/// The kernel actor's requests not answered yet: each is noted when sent ([`KernelWait::asked`]
/// gives it a ticket) and taken off when the actor is done with it.
#[derive(Clone, Default)]
pub struct KernelWait {
    sent: Arc<Mutex<(u64, BTreeMap<u64, Instant>)>>,
}

/// One request's place in [`KernelWait`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Ticket(u64);

impl KernelWait {
    pub fn asked(&self, at: Instant) -> Ticket {
        let mut sent = self.sent.lock().expect("kernel wait");
        sent.0 += 1;
        let id = sent.0;
        sent.1.insert(id, at);
        Ticket(id)
    }

    /// The request is answered (again: nothing changes).
    pub fn answered(&self, t: Ticket) {
        self.sent.lock().expect("kernel wait").1.remove(&t.0);
    }

    /// Whether nothing is waiting.
    pub fn idle(&self) -> bool {
        self.sent.lock().expect("kernel wait").1.is_empty()
    }

    /// How long the oldest request has waited at `now`.
    pub fn waiting(&self, now: Instant) -> Option<Duration> {
        let sent = self.sent.lock().expect("kernel wait");
        let oldest = sent.1.values().min()?;
        Some(now.saturating_duration_since(*oldest))
    }
}

/// The agent's view of the API: for each watch its client made (named by what it watches),
/// whether a stream is open, and since when none is. A watch whose stream is open is current:
/// the connection under it is kept alive and a dead one is closed by the kernel within the
/// client's TCP user timeout (see `kube::connection`), so its age is zero; a watch without
/// one is as old as the time since its last stream closed.
#[derive(Clone)]
pub struct ApiView {
    inner: Arc<Mutex<BTreeMap<String, Stream>>>,
    /// When the view began: the age of a watch that never opened.
    born: Instant,
}

impl Default for ApiView {
    fn default() -> ApiView {
        ApiView {
            inner: Default::default(),
            born: Instant::now(),
        }
    }
}

/// One watch's streams.
#[derive(Clone, Debug, Default)]
struct Stream {
    open: u32,
    /// When the last one closed (`None`: one is open, or none ever opened).
    closed: Option<Instant>,
}

impl ApiView {
    /// A watch stream of `what` was answered and is open.
    pub fn opened(&self, what: &str) {
        let mut m = self.inner.lock().expect("api view");
        let s = m.entry(what.to_string()).or_default();
        s.open += 1;
        s.closed = None;
    }

    /// A watch stream of `what` ended (or failed) at `at`.
    pub fn closed(&self, what: &str, at: Instant) {
        let mut m = self.inner.lock().expect("api view");
        let s = m.entry(what.to_string()).or_default();
        s.open = s.open.saturating_sub(1);
        if s.open == 0 {
            s.closed = Some(at);
        }
    }

    /// A watch of `what` was asked for: until a stream answers, its age counts from the
    /// view's start.
    pub fn asked(&self, what: &str) {
        let mut m = self.inner.lock().expect("api view");
        m.entry(what.to_string()).or_default();
    }

    /// Each watch without a stream open, and for how long, at `now`.
    pub fn ages(&self, now: Instant) -> Vec<(String, Duration)> {
        let m = self.inner.lock().expect("api view");
        m.iter()
            .filter(|(_, s)| s.open == 0)
            .map(|(what, s)| {
                let since = s.closed.unwrap_or(self.born);
                (what.clone(), now.saturating_duration_since(since))
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_watch_is_as_old_as_its_last_stream_and_current_while_one_is_open() {
        let view = ApiView::default();
        let t0 = view.born;
        view.asked("services");
        assert_eq!(
            view.ages(t0 + Duration::from_secs(2)),
            [("services".to_string(), Duration::from_secs(2))]
        );
        view.opened("services");
        assert!(view.ages(t0 + Duration::from_secs(60)).is_empty());
        // A second stream of the same watch (its next one, before the first is dropped).
        view.opened("services");
        view.closed("services", t0 + Duration::from_secs(61));
        assert!(view.ages(t0 + Duration::from_secs(90)).is_empty());
        view.closed("services", t0 + Duration::from_secs(100));
        assert_eq!(
            view.ages(t0 + Duration::from_secs(125)),
            [("services".to_string(), Duration::from_secs(25))]
        );
    }

    #[test]
    fn the_kernels_oldest_request_is_the_one_that_waits() {
        let k = KernelWait::default();
        let t0 = Instant::now();
        assert!(k.idle());
        let first = k.asked(t0);
        let second = k.asked(t0 + Duration::from_secs(5));
        assert_eq!(
            k.waiting(t0 + Duration::from_secs(12)),
            Some(Duration::from_secs(12))
        );
        k.answered(first);
        k.answered(first);
        assert_eq!(
            k.waiting(t0 + Duration::from_secs(12)),
            Some(Duration::from_secs(7)),
            "answering twice takes off one request"
        );
        k.answered(second);
        assert_eq!(k.waiting(t0 + Duration::from_secs(12)), None);
        assert!(k.idle());
    }

    #[test]
    fn a_change_waits_from_the_first_received_until_applied() {
        let r = Readiness::new(Bounds::default());
        r.set(|s| {
            s.caches_synced = true;
            s.last_sync = LastSync::Committed;
        });
        let t0 = Instant::now();
        r.change_received(t0);
        r.change_received(t0 + Duration::from_secs(8));
        let v = r.report(t0 + Duration::from_secs(11));
        assert!(!v.ready, "{v:?}");
        r.changes_applied(false);
        assert!(r.report(t0 + Duration::from_secs(11)).ready);
    }

    #[test]
    fn a_relisting_watch_is_caught_up_by_the_commit_of_its_list_only() {
        let r = Readiness::new(Bounds::default());
        r.set(|s| {
            s.caches_synced = true;
            s.last_sync = LastSync::Committed;
        });
        r.relisting("services");
        r.relisting("nodes");
        let v = r.report(Instant::now());
        assert!(!v.ready && v.behind, "{v:?}");
        r.caught_up(&["services"]);
        let v = r.report(Instant::now());
        assert_eq!(v.missing.len(), 1, "{v:?}");
        assert!(v.missing[0].starts_with("listing nodes again"), "{v:?}");
        r.caught_up(&["nodes", "endpointslices"]);
        assert!(r.report(Instant::now()).ready);
    }
}
