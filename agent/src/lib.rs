//! `nodelb-agent`: the node-local agent.
//!
//! `vocab` holds the words every room shares. The pure decisions live in `plan` (Services and
//! EndpointSlices → this node's tables) and `status` (→ each Service's status). Around them,
//! thin I/O, each in its room: `kube` (the API: watches, Leases, status writes, Events),
//! `host` (sysctls, addresses, foreign forward policies), `run` (the agent: the sync loop,
//! health and metrics HTTP), `metrics`; `object_files` reads objects from files for `render`
//! and `apply`; `cli`, `check` and `oneshot` are the binary's faces.

pub mod check;
pub mod cli;
pub mod host;
pub mod kube;
pub mod metrics;
pub mod object_files;
pub mod oneshot;
pub mod packed;
pub mod plan;
pub mod run;
pub mod status;
pub mod vocab;

/// An error and its sources, `: `-separated, as one line.
pub fn error_chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut cur = e.source();
    while let Some(c) = cur {
        s.push_str(": ");
        s.push_str(&c.to_string());
        cur = c.source();
    }
    s
}
