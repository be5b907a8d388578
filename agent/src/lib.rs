//! `nodelb-agent`: the node-local agent. Pure decisions live in `plan`; I/O wraps them.

pub mod plan;
