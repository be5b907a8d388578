//! `nodelb-core`: everything nodelb decides, and nothing it does. Plain data in, plain data
//! out: no client, no socket, no clock, no randomness.
//!
//! - `vocab`: the words every room shares (Service keys and ports, protocols, families).
//! - `objects`: the object layer, the shapes Services and EndpointSlices take inside nodelb:
//!   `wire` as read from the API's JSON, `index` as kept and looked up.
//! - `plan`: Services, EndpointSlices and this node → this node's tables and each Service's
//!   outcome here.
//! - `status`: every node's outcome and liveness → each Service's status, its condition and
//!   Events; heartbeats and the status election's state machine.
//! - `readiness`: whether this node's agent is applying the cluster now, from how old each
//!   part of what it knows is.
//! - `packed`: maps built with full B-tree nodes.
//!
//! The agent (`nodelb-agent`) is the I/O around it: watches, the kernel, the status writer.

#[cfg(any(test, feature = "test-fixtures"))]
pub mod fixtures;
pub mod objects;
pub mod packed;
pub mod plan;
pub mod readiness;
pub mod status;
pub mod vocab;
