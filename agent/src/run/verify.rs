//! The kernel actor's verify path, its reading and comparing half: nodelb's tables read back
//! from the kernel and compared with the models last committed. A read runs beside the commits
//! over a socket of its own ([`read_beside`]), so a change that arrives during the read
//! (hundreds of milliseconds at 10,000 Services, more on a busy node) reaches the kernel at
//! once instead of waiting for it; or over the committer's socket with commits held. The
//! foreign forward policies `/readyz` reports are read with it. What was read is compared
//! with the models as committed when the read is done; [`Verifier`](super::decisions::Verifier)
//! decides what follows.

use crate::host::forward_policy::{self, DropChain};
use nodelb_netfilter::readback::{compare, Drift, TableSummary};
use nodelb_netfilter::{Committer, Error, Nft, TableRef};

/// What the kernel holds for each table read (`None`: the table does not exist).
pub type Tables = Vec<(TableRef, Option<TableSummary>)>;

/// One read-back.
pub struct Readback {
    pub tables: Result<Tables, Error>,
    pub forward: Result<Vec<DropChain>, forward_policy::Error>,
    /// How long the read took.
    pub took: std::time::Duration,
}

/// Read `tables` and the foreign forward policies over a socket of its own (blocks).
pub fn read_beside(tables: Vec<TableRef>, own_table: &str) -> Readback {
    let t0 = std::time::Instant::now();
    let tables = Nft::open().and_then(|mut nft| read(&mut nft, tables));
    Readback {
        tables,
        forward: forward_policy::drop_chains(own_table),
        took: t0.elapsed(),
    }
}

/// Read what `committer` committed over its own socket, and the foreign forward policies.
pub fn read_held(committer: &mut Committer, own_table: &str) -> Readback {
    let t0 = std::time::Instant::now();
    let tables = committer.committed_tables();
    let tables = read(committer.nft(), tables);
    Readback {
        tables,
        forward: forward_policy::drop_chains(own_table),
        took: t0.elapsed(),
    }
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
/// difference). A table committed but not read counts as a difference; so does a read that
/// failed (the replace that follows repairs the tables, or reports the trouble with nf_tables).
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

/// What `/readyz` notes of the foreign forward policies read.
pub fn policy_notes(read: Result<Vec<DropChain>, forward_policy::Error>) -> Vec<String> {
    match read {
        Ok(chains) => chains.iter().map(|c| c.to_string()).collect(),
        Err(e) => vec![format!("foreign forward policies unknown: {e}")],
    }
}
