//! The object layer: the shapes Services and EndpointSlices take inside nodelb. `wire` is how
//! they are read from the API's JSON (only what nodelb reads is kept), `index` how they are kept
//! and looked up (the planner's and the status leader's input).

pub mod index;
pub mod wire;
