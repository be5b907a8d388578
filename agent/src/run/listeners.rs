//! Following the host's listeners for the sync loop: read at start, at the start of every
//! sync (so a sync that adds ports plans with what listens now), and every [`LOOK`] in
//! between, where a change wakes a sync as an address change does. A read that fails keeps
//! the last set (logged, counted in `nodelb_listener_reads_total{result="error"}`): serving
//! never waits for it.

use super::Trigger;
use crate::host::listeners::Reader;
use crate::metrics::{Metrics, ResultLabel};
use nodelb_core::vocab::Listener;
use std::collections::BTreeSet;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::sync::mpsc;
use tracing::{debug, warn};

/// How often the listeners are read between syncs.
pub const LOOK: Duration = Duration::from_secs(2);

/// The reader and the last set read, shared by the sync loop and the periodic look.
#[derive(Clone)]
pub struct Listeners {
    reader: Arc<Reader>,
    current: Arc<Mutex<BTreeSet<Listener>>>,
    metrics: Arc<Metrics>,
}

impl Listeners {
    pub fn new(metrics: Arc<Metrics>) -> Listeners {
        Listeners {
            reader: Arc::new(Reader::new()),
            current: Default::default(),
            metrics,
        }
    }

    /// Read now. Returns the set to plan with (the last one read, if reading fails) and
    /// whether it differs from the one before. `name_new`: name sockets not seen before by
    /// their process (a walk over `/proc`, left to the periodic look so that no sync waits
    /// for it).
    pub fn look(&self, name_new: bool) -> (BTreeSet<Listener>, bool) {
        let t0 = Instant::now();
        let read = self.reader.read(name_new);
        let result = if read.is_ok() { "ok" } else { "error" };
        self.metrics
            .listener_reads
            .get_or_create(&ResultLabel { result })
            .inc();
        let mut current = self.current.lock().expect("listeners");
        match read {
            Ok(set) => {
                debug!(listeners = set.len(), took = ?t0.elapsed(), "read the host's listeners");
                let changed = *current != set;
                *current = set;
                (current.clone(), changed)
            }
            Err(e) => {
                warn!(error = %crate::error_chain(&e), "cannot read the host's listeners; planning with the last set read");
                (current.clone(), false)
            }
        }
    }

    /// The process of a listener of the last look (see [`Reader::process_of`]).
    pub fn process_of(&self, l: &Listener) -> Option<String> {
        self.reader.process_of(l)
    }

    /// Look every [`LOOK`] on a blocking thread; a change wakes the sync loop. Ends when the
    /// loop is gone.
    pub fn follow(self, tx: mpsc::UnboundedSender<Trigger>) {
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(LOOK);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tick.tick().await;
                if tx.is_closed() {
                    return;
                }
                let me = self.clone();
                let changed: bool = tokio::task::spawn_blocking(move || me.look(true).1)
                    .await
                    .unwrap_or_default();
                if changed && tx.send(Trigger::Changed).is_err() {
                    return;
                }
            }
        });
    }
}
