//! `nodelb-agent`: the node-local agent.
//!
//! The pure decisions live in `nodelb-core` (its `plan`: Services and EndpointSlices → this
//! node's tables; its `status`: → each Service's status). This crate is the I/O around them,
//! each in its room: `kube` (the API: watches, Leases, status writes, Events),
//! `host` (sysctls, addresses, foreign forward policies), `run` (the agent: the sync loop,
//! the kernel actor that owns nodelb's netfilter state, health and metrics HTTP), `metrics`,
//! `readiness` (what the others record of their progress, judged when `/readyz` or the
//! heartbeat asks);
//! `object_files` reads objects from files for `render` and `apply`; `cli`, `check` and
//! `oneshot` are the binary's faces.

/// The agent's version: the image tag the manifests name.
pub const PACKAGE_VERSION: &str = env!("CARGO_PKG_VERSION");
/// The git commit the agent was built from (see `build.rs`), or `unknown`.
pub const GIT_COMMIT: &str = env!("NODELB_GIT_COMMIT");
/// What `--version` prints after the name.
pub const VERSION: &str = concat!(
    env!("CARGO_PKG_VERSION"),
    " (commit ",
    env!("NODELB_GIT_COMMIT"),
    ")"
);

pub mod check;
pub mod cli;
pub mod health_check;
pub mod host;
pub mod kube;
pub mod metrics;
pub mod object_files;
pub mod oneshot;
pub mod readiness;
pub mod run;

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
