//! The kernel actor: one blocking thread owns everything of the agent's that holds or changes
//! netfilter state — the committer with its nftables socket and the models it last committed,
//! the conntrack socket, the drift watch's pause handle — and takes requests over a channel.
//! Nobody else holds firewall state.
//!
//! - [`Kernel::commit`]: commit one sync's change in one batch (edits of the models, or a whole
//!   replace when there are none, after drift, or when the planner rebuilt), then, on the same
//!   thread and so always after the new rules are in, delete the conntrack entries the change
//!   made stale. The reply comes over a oneshot. The planner is lent with the request: a whole
//!   replace has it build the tables inside the commit for the batch (consumed while
//!   encoded), and once more for the models after the reply, before the planner goes back
//!   ([`Kernel::commit_early`]), so the agent never holds two copies of its tables, nor a
//!   whole table and its whole batch, and `/readyz` need not wait for the models. After a
//!   failed commit the committer (and its socket) is dropped: the next commit opens a fresh
//!   one and replaces the tables whole.
//! - [`Kernel::verify`]: the periodic resync. One verify path: read the tables back beside the
//!   commits (a thread and a socket of its own, so changes keep reaching the kernel), compare
//!   what was read with the models as committed when it is done, read again while commits made
//!   the read uncertain, and after that hold the commits for one read
//!   ([`Verifier`](super::decisions::Verifier) decides). The verdict — drift or none, and the
//!   foreign forward policies read with it — comes back to the sync loop as a
//!   [`Trigger::Verified`], as the drift watch's reports come.
//!
//! The conntrack cleanup lives here rather than in the loop: it must follow the commit that
//! made the flows stale (before it, a new packet would recreate the entry towards the old
//! endpoint), which one thread doing both in one request makes structural, and its socket is
//! kernel state held across syncs like the committer's.
//!
//! A request that panics is caught: the actor forgets its models (the next commit replaces
//! the tables whole over a fresh socket) and tells the loop as drift.

use super::decisions::{replaces_whole, AfterRead, Verifier};
use super::verify::{self, Readback};
use super::Trigger;
use crate::host::conntrack::{self as ct, Cleaned};
use crate::host::forward_policy;
use crate::readiness::{KernelWait, Ticket};
use nodelb_core::plan::config::Config;
use nodelb_core::plan::flows::FlowChange;
use nodelb_core::plan::slots;
use nodelb_core::plan::table::ENDPOINTS_MAP;
use nodelb_core::plan::{Planner, TableChange};
use nodelb_core::vocab::{Families, IpFamily};
use nodelb_netfilter::conntrack::Conntrack;
use nodelb_netfilter::{
    Commit as NftCommit, CommitStats, Committed, Committer, Edit, Nft, Table, TableRef, WatchPause,
};
use std::collections::BTreeMap;
use std::panic::AssertUnwindSafe;
use std::time::{Duration, Instant};
use tokio::sync::{mpsc, oneshot};
use tracing::{debug, error, info, warn};

/// The handle to the kernel actor. The actor ends once every handle is gone.
pub struct Kernel {
    requests: mpsc::UnboundedSender<Asked>,
    /// Readiness's record of the requests not answered yet.
    waits: KernelWait,
}

/// What the actor is asked to do.
enum Request {
    Commit(Box<(Commit, Replies)>),
    Verify,
    /// Answer, nothing else: an idle actor is asked this every [`PING_EVERY`], so one stuck
    /// in the kernel is found even when nothing changes (`--max-kernel-wait`).
    Ping,
    /// A read beside the commits is done (`None`: it panicked).
    Read(Option<Readback>),
}

/// A request, and its ticket in readiness's record when something waits for its answer.
struct Asked(Request, Option<Ticket>);

/// How often an idle actor is pinged.
const PING_EVERY: Duration = Duration::from_secs(2);

/// One sync's change, for the kernel.
pub struct Commit {
    pub change: TableChange,
    /// The families programmed: nodelb's tables of the others are deleted.
    pub families: Families,
    /// Drift was reported: replace the tables whole, whatever the change.
    pub drift: bool,
    /// Lent for the commit and given back with the reply: a whole replace has it build the
    /// tables.
    pub planner: Planner,
    /// How the UDP and SCTP ports' endpoints changed since the last sync: the flows the
    /// change makes stale, deleted once it is committed.
    pub flows: FlowChange,
}

/// What a commit did.
pub struct Done {
    pub result: Result<Sent, Error>,
    /// When the commit ended (before the conntrack cleanup): where the sync's time is taken.
    pub at: Instant,
    /// The foreign forward policies, read after a whole replace (`/readyz` notes).
    pub notes: Option<Vec<String>>,
    /// After a whole replace, reading those policies and returning the freed pages.
    pub tidied: Duration,
    /// The conntrack cleanup after the commit (`None`: the commit failed, or nothing was
    /// stale).
    pub cleanup: Option<Result<Vec<Cleaned>, nodelb_netfilter::conntrack::Error>>,
}

/// What a commit that succeeded sent.
#[derive(Clone, Debug)]
pub struct Sent {
    /// Objects of the tables replaced, or of the edits.
    pub objects: usize,
    pub stats: CommitStats,
    /// The tables were replaced whole.
    pub whole: bool,
    /// A whole replace's time before encoding and after the commit ([`Committed::prepared`],
    /// [`Committed::adopted`]; zero for edits).
    pub prepared: Duration,
    pub adopted: Duration,
}

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(transparent)]
    Netfilter(#[from] nodelb_netfilter::Error),
    #[error("the kernel actor panicked while committing")]
    Lost,
}

/// A verify's conclusion, for the sync loop.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Verified {
    /// How the kernel's tables differ from the models (`None`: they match).
    pub drift: Option<String>,
    /// The foreign forward policies read with them (`/readyz` notes).
    pub notes: Vec<String>,
}

impl Kernel {
    /// Start the actor on a thread of its own. `pause`: the drift watch's pause handle (held
    /// over each whole replace); `tell`: where verdicts and panics are reported.
    pub fn spawn(
        config: Config,
        pause: Option<WatchPause>,
        tell: mpsc::UnboundedSender<Trigger>,
        waits: KernelWait,
    ) -> std::io::Result<Kernel> {
        let (requests, rx) = mpsc::unbounded_channel();
        let actor = Actor {
            waits: waits.clone(),
            committer: None,
            conntrack: None,
            flows: FlowChange::default(),
            pause,
            verifier: Verifier::default(),
            config,
            me: requests.downgrade(),
            tell,
        };
        std::thread::Builder::new()
            .name("nodelb-kernel".into())
            .spawn(move || actor.run(rx))?;
        ping(requests.downgrade(), waits.clone());
        Ok(Kernel { requests, waits })
    }

    /// Send `r`, noted as waiting for its answer.
    fn ask(&self, r: Request) -> Result<(), Box<Request>> {
        let ticket = self.waits.asked(Instant::now());
        self.requests.send(Asked(r, Some(ticket))).map_err(|e| {
            self.waits.answered(ticket);
            Box::new(e.0 .0)
        })
    }

    /// Commit `c` and wait for it; the planner comes back with the reply (a fresh one, which
    /// replans everything, if the actor panicked meanwhile).
    pub async fn commit(&self, c: Commit) -> (Planner, Done) {
        let (done, back) = self.commit_early(c).await;
        (back.get().await, done)
    }

    /// Commit `c` and wait for the commit only: after a whole replace the actor builds the
    /// models the next edit starts from (the planner's tables, again) once it has replied,
    /// and the planner comes back after that ([`PlannerBack`]). So the kernel programmed is
    /// told, and `/readyz` answers, a table build sooner.
    pub async fn commit_early(&self, c: Commit) -> (Done, PlannerBack) {
        let (done, done_rx) = oneshot::channel();
        let (planner, planner_rx) = oneshot::channel();
        let replies = Replies { done, planner };
        if let Err(e) = self.ask(Request::Commit(Box::new((c, replies)))) {
            let Request::Commit(request) = *e else {
                unreachable!("a commit was sent")
            };
            return (Done::lost(), PlannerBack(Err(request.0.planner)));
        }
        let done = done_rx.await.unwrap_or_else(|_| Done::lost());
        (done, PlannerBack(Ok(planner_rx)))
    }

    /// Verify the tables against the models (the periodic resync); the verdict comes back as
    /// [`Trigger::Verified`].
    pub fn verify(&self) {
        let _ = self.ask(Request::Verify);
    }
}

/// Ping the actor every [`PING_EVERY`] while nothing else waits for it, until it is gone, from
/// a thread of its own (so the pings do not depend on the runtime the sync loop may starve).
fn ping(requests: mpsc::WeakUnboundedSender<Asked>, waits: KernelWait) {
    let spawned = std::thread::Builder::new()
        .name("nodelb-kernel-ping".into())
        .spawn(move || loop {
            std::thread::sleep(PING_EVERY);
            let Some(requests) = requests.upgrade() else {
                return;
            };
            if waits.idle() {
                let ticket = waits.asked(Instant::now());
                if requests.send(Asked(Request::Ping, Some(ticket))).is_err() {
                    waits.answered(ticket);
                    return;
                }
            }
        });
    if let Err(e) = spawned {
        warn!(error = %e, "cannot start the kernel actor's pinger: a stuck actor is found only by a commit or a verify that waits");
    }
}

/// Where a commit's reply goes: what it did, then the planner lent with it.
struct Replies {
    done: oneshot::Sender<Done>,
    planner: oneshot::Sender<Planner>,
}

/// The planner lent with a commit, on its way back ([`Kernel::commit_early`]).
pub struct PlannerBack(Result<oneshot::Receiver<Planner>, Planner>);

impl PlannerBack {
    /// The planner, once the actor is done with it (a fresh one, which replans everything, if
    /// the actor panicked meanwhile).
    pub async fn get(self) -> Planner {
        match self.0 {
            Ok(rx) => rx.await.unwrap_or_default(),
            Err(p) => p,
        }
    }
}

impl Done {
    fn lost() -> Done {
        Done {
            result: Err(Error::Lost),
            at: Instant::now(),
            notes: None,
            tidied: Duration::ZERO,
            cleanup: None,
        }
    }
}

/// The actor: what it holds between requests.
struct Actor {
    /// Told when each request that waits on it (all but reads beside the commits) is done.
    waits: KernelWait,
    /// The committed models and the nftables socket (none before the first commit, and after
    /// a failure).
    committer: Option<Committer>,
    /// The ctnetlink socket, once opened (dropped after a failure).
    conntrack: Option<Conntrack>,
    /// How the UDP and SCTP ports' endpoints changed since the last conntrack cleanup that
    /// succeeded: what the next cleanup deletes.
    flows: FlowChange,
    /// Pauses the drift watch around a whole replace: the agent need not hear its own (an
    /// event per object of the tables, built by the kernel during the commit).
    pause: Option<WatchPause>,
    verifier: Verifier,
    /// The tables' names.
    config: Config,
    /// For the reads beside the commits to send back what they read (weak, so the actor still
    /// ends with its last handle).
    me: mpsc::WeakUnboundedSender<Asked>,
    tell: mpsc::UnboundedSender<Trigger>,
}

impl Actor {
    fn run(mut self, mut requests: mpsc::UnboundedReceiver<Asked>) {
        while let Some(Asked(r, ticket)) = requests.blocking_recv() {
            let handled = std::panic::catch_unwind(AssertUnwindSafe(|| self.handle(r, ticket)));
            if let Some(t) = ticket {
                self.waits.answered(t);
            }
            if handled.is_err() {
                error!("the kernel actor panicked; the next sync replaces the tables whole");
                self.committer = None;
                self.conntrack = None;
                let _ = self
                    .tell
                    .send(Trigger::Drift("the kernel actor panicked".into()));
            }
        }
        debug!("the kernel actor stopped");
    }

    /// Do `r`; its ticket is answered as soon as its reply is sent (a commit's models are
    /// built after that).
    fn handle(&mut self, r: Request, ticket: Option<Ticket>) {
        let answered = |waits: &KernelWait| {
            if let Some(t) = ticket {
                waits.answered(t);
            }
        };
        match r {
            Request::Commit(request) => {
                let (c, replies) = *request;
                let (planner, done) = self.commit(c);
                let adopt = done.result.as_ref().is_ok_and(|s| s.whole);
                let _ = replies.done.send(done);
                answered(&self.waits);
                if adopt {
                    self.adopt(&planner);
                }
                let _ = replies.planner.send(planner);
            }
            Request::Verify => {
                if self.verifier.begin(self.committer.is_some()) {
                    self.read_beside();
                }
            }
            Request::Ping => {}
            Request::Read(read) => self.judge(read),
        }
        answered(&self.waits);
    }

    /// Commit, then delete the conntrack entries the commit made stale.
    fn commit(&mut self, c: Commit) -> (Planner, Done) {
        let Commit {
            change,
            families,
            drift,
            mut planner,
            flows,
        } = c;
        self.flows = std::mem::take(&mut self.flows).then(flows);
        let rebuilt = matches!(change, TableChange::Rebuild);
        let whole = replaces_whole(self.committer.is_some(), drift, rebuilt);
        let work = match change {
            TableChange::Edit(edits) if !whole => Work::Edit(edits),
            _ => Work::Replace,
        };
        let result = self
            .send(work, families, &mut planner)
            .map(|(objects, done)| Sent {
                objects,
                stats: done.stats,
                whole,
                prepared: done.prepared,
                adopted: done.adopted,
            });
        let sent = Instant::now();
        // Foreign forward policies: read after whole replaces (a dump of every chain), and by
        // each verify.
        let notes = whole
            .then(|| verify::policy_notes(forward_policy::drop_chains(&self.config.table_name)));
        if whole {
            // The old tables and the batch are freed: return their pages.
            super::malloc::trim();
        }
        let at = Instant::now();
        let tidied = at - sent;
        let cleanup = match result {
            Ok(_) => self.clean(),
            Err(_) => None,
        };
        let done = Done {
            result,
            at,
            notes,
            tidied,
            cleanup,
        };
        (planner, done)
    }

    /// After a whole replace (and its reply): the planner's tables, built again, become the
    /// models the next edit and verify start from.
    fn adopt(&mut self, planner: &Planner) {
        let Some(committer) = &mut self.committer else {
            return;
        };
        let started = Instant::now();
        committer.adopt(planner.tables());
        debug!(
            took_ms = started.elapsed().as_secs_f64() * 1e3,
            "the replaced tables kept as models"
        );
    }

    /// Commit the planner's tables (a whole replace) or edits, and delete nodelb's tables of
    /// families not programmed. Returns the objects sent and the stats.
    fn send(
        &mut self,
        work: Work,
        families: Families,
        planner: &mut Planner,
    ) -> Result<(usize, Committed), Error> {
        // After a failure the committer is dropped: the next try opens a fresh socket (and
        // replaces every table whole).
        let mut committer = match self.committer.take() {
            Some(c) => c,
            None => Committer::new(Nft::open()?),
        };
        if matches!(work, Work::Replace) {
            let tables = families.iter().map(|f| (f, self.config.table_ref(f)));
            if let Err(e) = seed_slots(committer.nft(), planner, tables) {
                warn!(error = %e, "cannot read the endpoint slots in the kernel: ClientIP affinity clients of ports whose endpoints changed since the last start are picked for anew");
            }
        }
        let absent: Vec<TableRef> = [IpFamily::V4, IpFamily::V6]
            .into_iter()
            .filter(|f| !families.contains(*f))
            .map(|f| self.config.table_ref(f))
            .collect();
        let (objects, done) =
            commit_blocking(&mut committer, planner, work, absent, self.pause.as_ref())?;
        self.verifier.committed(done.stats.messages > 0);
        for tr in &done.deleted {
            info!(table = %tr, "deleted: family not programmed");
        }
        self.committer = Some(committer);
        Ok((objects, done))
    }

    /// Delete the conntrack entries the changes committed since the last cleanup made stale
    /// (`None`: nothing was stale). After a failure the same changes are tried again after the
    /// next commit, composed with what it changes.
    fn clean(&mut self) -> Option<Result<Vec<Cleaned>, nodelb_netfilter::conntrack::Error>> {
        let stale = self.flows.stale();
        if stale.is_empty() {
            self.flows = FlowChange::default();
            return None;
        }
        let mut socket = match self.conntrack.take() {
            Some(s) => s,
            None => match Conntrack::open() {
                Ok(s) => s,
                Err(e) => return Some(Err(e)),
            },
        };
        let r = ct::delete_stale(&mut socket, &stale);
        if r.is_ok() {
            self.conntrack = Some(socket);
            self.flows = FlowChange::default();
        }
        Some(r)
    }

    /// Read the committed tables back on a thread of its own, over a socket of its own, while
    /// commits go on; what it read comes back as [`Request::Read`].
    fn read_beside(&mut self) {
        let (Some(committer), Some(me)) = (&self.committer, self.me.upgrade()) else {
            self.verifier.abandon();
            return;
        };
        let tables = committer.committed_tables();
        let own = self.config.table_name.clone();
        let spawned = std::thread::Builder::new()
            .name("nodelb-readback".into())
            .spawn(move || {
                let read = std::panic::catch_unwind(|| verify::read_beside(tables, &own));
                let _ = me.send(Asked(Request::Read(read.ok()), None));
            });
        if let Err(e) = spawned {
            warn!(error = %e, "cannot start reading the tables back; the next resync reads again");
            self.verifier.abandon();
        }
    }

    /// Compare a read beside the commits with the models as committed now, and go on as the
    /// verifier says: report, read again, or read with commits held.
    fn judge(&mut self, read: Option<Readback>) {
        let Some(read) = read else {
            warn!("reading the tables back panicked; the next resync reads again");
            self.verifier.abandon();
            return;
        };
        // A failure since: the next commit replaces the tables whole anyway.
        let Some(committer) = &self.committer else {
            self.verifier.abandon();
            return;
        };
        let t0 = Instant::now();
        let difference = verify::difference(committer, &read.tables);
        let after = self.verifier.read_beside(difference);
        debug!(after = ?after, read = ?read.took, compare = ?t0.elapsed(),
               "verify read the tables back beside the commits");
        match after {
            AfterRead::Report(drift) => self.report(drift, read),
            AfterRead::ReadBeside => self.read_beside(),
            AfterRead::ReadHeld => self.read_held(),
        }
    }

    /// Read the tables back over the committer's socket: commits wait meanwhile, so what is
    /// read is conclusive.
    fn read_held(&mut self) {
        let Some(committer) = self.committer.as_mut() else {
            return;
        };
        let read = verify::read_held(committer, &self.config.table_name);
        let difference = verify::difference(committer, &read.tables);
        let drift = self.verifier.read_held(difference);
        debug!(drift = ?drift, read = ?read.took, "verify read the tables back with commits held");
        self.report(drift, read);
    }

    fn report(&self, drift: Option<String>, read: Readback) {
        let notes = verify::policy_notes(read.forward);
        let _ = self.tell.send(Trigger::Verified(Verified { drift, notes }));
    }
}

/// Before a whole replace, give the planner the endpoint slots the kernel's tables hold for
/// the ClientIP affinity ports whose order it does not know ([`Planner::seed_slots`]): an
/// agent that starts then keeps their clients where they are. Reads each table's `map
/// endpoints`, only when some Service asks for affinity.
pub fn seed_slots(
    nft: &mut Nft,
    planner: &mut Planner,
    tables: impl IntoIterator<Item = (IpFamily, TableRef)>,
) -> Result<(), nodelb_netfilter::Error> {
    if !planner.has_affinity() {
        return Ok(());
    }
    let mut kernel = BTreeMap::new();
    for (family, tr) in tables {
        let elements = nft.read_map(&tr, ENDPOINTS_MAP)?;
        kernel.insert(family, slots::kernel_orders(family, &elements));
    }
    planner.seed_slots(&kernel);
    Ok(())
}

/// What a commit sends: the planner's whole tables, or edits of the tables committed before.
enum Work {
    Replace,
    Edit(Vec<(TableRef, Edit)>),
}

/// One commit: a replace holds the drift watch's pause, consumes the tables while encoding them
/// (the pages of what is dropped going back as the batch grows), deletes the absent tables,
/// and leaves the models to [`Actor::adopt`].
/// Returns the objects sent and what the commit did.
fn commit_blocking(
    committer: &mut Committer,
    planner: &Planner,
    work: Work,
    absent: Vec<TableRef>,
    pause: Option<&WatchPause>,
) -> Result<(usize, Committed), nodelb_netfilter::Error> {
    match work {
        Work::Edit(edits) => {
            let objects = edits.iter().map(|(_, e)| e.size()).sum();
            Ok((objects, committer.commit(NftCommit::edit(edits))?))
        }
        Work::Replace => {
            let mut objects = None;
            let mut built = false;
            // The second call, for the models, gives nothing: the actor builds them after it
            // has replied (`Actor::adopt`).
            let mut build = || {
                if std::mem::replace(&mut built, true) {
                    return Vec::new();
                }
                let tables = planner.tables();
                objects.get_or_insert_with(|| tables.iter().map(Table::object_count).sum());
                tables
            };
            let mut trim = super::malloc::trim;
            let done = committer.commit(
                NftCommit::replace(&mut build)
                    .absent(absent)
                    .pause(pause)
                    .freed(&mut trim),
            )?;
            Ok((objects.unwrap_or_default(), done))
        }
    }
}
