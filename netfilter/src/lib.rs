//! `nodelb-netfilter`: a typed nftables model, compiled into atomic libnftnl batches and sent
//! over netlink; read back, watched for foreign changes, and rendered as `nft -f` text.
//! Knows nothing of Kubernetes.

pub mod edit;
pub mod encode;
pub mod model;
pub mod netlink;
pub mod ops;
pub mod readback;
pub mod render;
mod sys;
pub mod transact;
pub mod types;
pub mod udata;
pub mod values;
pub mod watch;

pub use edit::{Edit, ElemEdit};
pub use encode::{Batch, EncodeError, ObjectRef};
pub use model::*;
pub use ops::{diff, full_replace, needs_full_replace, Diff, Op, TableRef};
pub use readback::{CounterValues, Drift, TableSummary};
pub use render::{render_replace, render_table};
pub use transact::{CommitStats, Committer, Error, Nft};
pub use watch::{ForeignChange, Paused, WatchEvent, WatchPause, Watcher};
