//! `nodelb-agent`: the node-local agent. Pure decisions live in `plan`; I/O wraps them.

pub mod check;
pub mod cli;
pub mod host;
pub mod kube;
pub mod object_files;
pub mod oneshot;
pub mod plan;
pub mod run;
pub mod status;
pub mod vocab;
