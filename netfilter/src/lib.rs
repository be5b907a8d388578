//! `nodelb-netfilter`: a typed nftables model, compiled into atomic libnftnl batches and sent
//! over netlink; read back, watched for foreign changes, and rendered as `nft -f` text.
//! Knows nothing of Kubernetes.
//!
//! Without the default feature `kernel`, only the model is built: the data (`model`, `scalar`,
//! `values`), edits of a table and the operations that make one (`edit`, `ops`), what the
//! kernel would refuse (`validate`), and the `nft -f` text (`render`, `types`, `udata`). No
//! libnftnl, no netlink: the planner, which only produces tables, depends on that much.

#[cfg(feature = "kernel")]
pub mod committer;
#[cfg(feature = "kernel")]
pub mod conntrack;
pub mod edit;
#[cfg(feature = "kernel")]
pub mod encode;
#[cfg(any(test, feature = "test-fixtures"))]
pub mod fixtures;
pub mod model;
#[cfg(feature = "kernel")]
pub mod netlink;
pub mod ops;
#[cfg(feature = "kernel")]
pub mod readback;
pub mod render;
pub mod scalar;
#[cfg(feature = "kernel")]
mod sys;
pub mod trace;
#[cfg(feature = "kernel")]
pub mod transact;
pub mod types;
pub mod udata;
pub mod validate;
pub mod values;
#[cfg(feature = "kernel")]
pub mod watch;

#[cfg(feature = "kernel")]
pub use committer::{Change, Commit, Committed, Committer};
pub use edit::{Edit, ElemEdit};
#[cfg(feature = "kernel")]
pub use encode::{Batch, EncodeError, ObjectRef};
pub use model::*;
pub use ops::{full_replace, Op};
#[cfg(feature = "kernel")]
pub use readback::{BaseChainInfo, CounterValues, Drift, TableSummary};
pub use render::{render_replace, render_table};
#[cfg(feature = "kernel")]
pub use transact::{CommitStats, Error, Nft};
pub use validate::Invalid;
#[cfg(feature = "kernel")]
pub use watch::{ForeignChange, Paused, WatchEvent, WatchPause, Watcher};
