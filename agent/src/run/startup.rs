//! The start-up timeline: when the agent began, when its API client was ready, when each
//! watch received its first and its last listed object, and what the first sync took — told
//! once, in one `info` line, when the first sync has committed (the moment `/readyz` can first
//! answer 200), so a slow start says where its time went.

use crate::kube::inbox::ObjectEvent;
use kube::runtime::watcher::Event;
use std::time::{Duration, Instant};
use tracing::info;

/// The log line's message; the latency bench finds it by this.
pub const READY: &str = "first sync committed: ready";

/// One kind's listing, as the sync loop received it.
#[derive(Debug, Default, Clone, Copy)]
struct Listing {
    /// Since the start: the first object received, and the end of the listing.
    first: Option<Duration>,
    done: Option<Duration>,
    objects: usize,
}

impl Listing {
    fn saw<K>(&mut self, ev: &Event<K>, at: Duration) {
        match ev {
            Event::InitApply(_) => {
                self.first.get_or_insert(at);
                self.objects += 1;
            }
            Event::InitDone => {
                self.done.get_or_insert(at);
            }
            Event::Init | Event::Apply(_) | Event::Delete(_) => {}
        }
    }
}

/// What the first sync took, from its stats.
#[derive(Debug, Clone, Copy)]
pub struct FirstSync {
    /// From the start of the sync to the plan (its inputs read, every Service planned).
    pub plan: Duration,
    /// Before encoding: the tables built from the plan, counters and learned elements read
    /// from the kernel, the tables validated.
    pub tables: Duration,
    pub encode: Duration,
    /// The kernel's commit (the batch sent and acknowledged).
    pub commit: Duration,
    /// After the commit: nodelb's tables of families not programmed deleted. (The tables are
    /// built again as the committer's models after the sync is told, see
    /// `Kernel::commit_early`.)
    pub absent: Duration,
    /// Then the foreign forward policies read and the freed pages returned.
    pub tidy: Duration,
    /// The whole sync, up to the end of the commit.
    pub took: Duration,
}

/// The timeline, kept by the sync loop until its first commit.
#[derive(Debug, Clone)]
pub struct Startup {
    began: Instant,
    client: Option<Duration>,
    node: Option<Duration>,
    services: Listing,
    slices: Listing,
}

impl Startup {
    /// The timeline of an agent that began at `began`.
    pub fn new(began: Instant) -> Startup {
        Startup {
            began,
            client: None,
            node: None,
            services: Listing::default(),
            slices: Listing::default(),
        }
    }

    /// The API client is ready (now).
    pub fn client_ready(&mut self) {
        self.client = Some(self.began.elapsed());
    }

    /// This node's Node (and with `--servicelb-compat` the ServiceLB watch) has listed (now).
    pub fn node_listed(&mut self) {
        self.node = Some(self.began.elapsed());
    }

    /// A Service or EndpointSlice event, received by its watch task at `received`.
    pub fn saw(&mut self, ev: &ObjectEvent, received: Instant) {
        let at = received.saturating_duration_since(self.began);
        match ev {
            ObjectEvent::Service(ev) => self.services.saw(ev.as_ref(), at),
            ObjectEvent::Slice(ev) => self.slices.saw(ev.as_ref(), at),
        }
    }

    /// Log the timeline, the first sync having committed now.
    pub fn ready(&self, sync: FirstSync) {
        let ms = |d: Option<Duration>| d.map_or(-1.0, round_ms);
        info!(
            client_ms = ms(self.client),
            node_listed_ms = ms(self.node),
            services = self.services.objects,
            services_first_ms = ms(self.services.first),
            services_listed_ms = ms(self.services.done),
            slices = self.slices.objects,
            slices_first_ms = ms(self.slices.first),
            slices_listed_ms = ms(self.slices.done),
            plan_ms = round_ms(sync.plan),
            tables_ms = round_ms(sync.tables),
            encode_ms = round_ms(sync.encode),
            commit_ms = round_ms(sync.commit),
            absent_ms = round_ms(sync.absent),
            tidy_ms = round_ms(sync.tidy),
            sync_ms = round_ms(sync.took),
            ready_ms = round_ms(self.began.elapsed()),
            "{READY}"
        );
    }
}

/// Milliseconds to a tenth.
fn round_ms(d: Duration) -> f64 {
    (d.as_secs_f64() * 10_000.0).round() / 10.0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_listing_counts_its_objects_from_the_first_to_the_end() {
        let mut l = Listing::default();
        let at = Duration::from_millis;
        l.saw(&Event::<()>::Init, at(1));
        l.saw(&Event::InitApply(()), at(5));
        l.saw(&Event::InitApply(()), at(9));
        l.saw(&Event::<()>::InitDone, at(12));
        l.saw(&Event::Apply(()), at(20));
        assert_eq!((l.first, l.done, l.objects), (Some(at(5)), Some(at(12)), 2));
    }
}
