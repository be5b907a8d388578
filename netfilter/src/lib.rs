//! `nodelb-netfilter`: a typed nftables model, compiled into atomic libnftnl batches and sent
//! over netlink; read back, watched for foreign changes, and rendered as `nft -f` text.
//! Knows nothing of Kubernetes.

pub mod committer;
pub mod conntrack;
pub mod edit;
pub mod encode;
#[cfg(any(test, feature = "test-fixtures"))]
pub mod fixtures;
pub mod model;
pub mod netlink;
pub mod ops;
pub mod readback;
pub mod render;
pub mod scalar;
mod sys;
pub mod trace;
pub mod transact;
pub mod types;
pub mod udata;
pub mod validate;
pub mod values;
pub mod watch;

pub use committer::{Change, Commit, Committed, Committer};
pub use edit::{Edit, ElemEdit};
pub use encode::{Batch, EncodeError, ObjectRef};
pub use model::*;
pub use ops::{full_replace, Op};
pub use readback::{BaseChainInfo, CounterValues, Drift, Learned, LearnedElements, TableSummary};
pub use render::{render_replace, render_table};
pub use transact::{CommitStats, Error, Nft};
pub use validate::Invalid;
pub use watch::{ForeignChange, Paused, WatchEvent, WatchPause, Watcher};
