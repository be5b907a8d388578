//! The periodic resync's read-back: nodelb's tables, read back from the kernel and compared
//! with the models last committed. It runs on a blocking thread over a socket of its own while
//! the sync loop keeps committing, so a change that arrives during the read (hundreds of
//! milliseconds at 10,000 Services, more on a busy node) reaches the kernel at once instead of
//! waiting for it. The foreign forward policies `/readyz` reports are read there too. What was
//! read is compared with the models as committed when the read is done; a difference while the
//! loop committed meanwhile may be the read seeing part of a commit (see
//! [`ReadbackJudge`](super::decisions::ReadbackJudge) for what follows).

use crate::host::forward_policy::{self, DropChain};
use nodelb_netfilter::readback::{compare, Drift, TableSummary};
use nodelb_netfilter::{Committer, Error, Nft, TableRef};

/// What the kernel holds for each table read (`None`: the table does not exist).
pub type Tables = Vec<(TableRef, Option<TableSummary>)>;

/// One read-back, off the loop.
pub struct Readback {
    /// The agent's commit count when the read started.
    pub commits_at_start: u64,
    pub tables: Result<Tables, Error>,
    pub forward: Result<Vec<DropChain>, forward_policy::Error>,
    /// How long the read took.
    pub took: std::time::Duration,
}

/// Start reading `tables` and the foreign forward policies on a blocking thread.
pub fn start(
    tables: Vec<TableRef>,
    own_table: String,
    commits_at_start: u64,
) -> tokio::task::JoinHandle<Readback> {
    tokio::task::spawn_blocking(move || {
        let t0 = std::time::Instant::now();
        let tables = Nft::open().and_then(|mut nft| read(&mut nft, tables));
        Readback {
            commits_at_start,
            tables,
            forward: forward_policy::drop_chains(&own_table),
            took: t0.elapsed(),
        }
    })
}

/// Read `tables` back over `nft`.
pub fn read(nft: &mut Nft, tables: Vec<TableRef>) -> Result<Tables, Error> {
    tables
        .into_iter()
        .map(|t| {
            let s = nft.read_table(&t)?;
            Ok((t, s))
        })
        .collect()
}

/// How what was read differs from what `committer` holds now, table by table (`None`: no
/// difference). A table committed but not read counts as a difference.
pub fn difference(committer: &Committer, read: &Result<Tables, Error>) -> Option<String> {
    let read = match read {
        Ok(r) => r,
        Err(e) => return Some(format!("the tables cannot be read back: {e}")),
    };
    let mut found = Vec::new();
    for tr in committer.committed_tables() {
        let Some(model) = committer.committed(&tr) else {
            continue;
        };
        let drift = match read.iter().find(|(t, _)| *t == tr) {
            Some((_, actual)) => compare(
                &TableSummary::expected(model),
                actual.as_ref(),
                &committer.stale_chains(&tr),
            ),
            None => Drift::Changed(vec!["not read back".into()]),
        };
        if drift != Drift::None {
            found.push(format!("{tr}: {drift:?}"));
        }
    }
    (!found.is_empty()).then(|| found.join("; "))
}
