//! Why a trace stopped without an answer: a rule the tracer cannot evaluate, or a table the
//! kernel would not run as written. Never a silent guess.

use super::outcome::RuleRef;
use crate::model::TableRef;

/// The most rules one trace evaluates, over all its branches, before it gives up.
pub const MAX_RULE_EVALUATIONS: usize = 1_000_000;
/// How deep jumps nest in the kernel (`NFT_JUMP_STACK_SIZE`).
pub const JUMP_STACK: usize = 16;

#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum TraceError {
    /// The rule is valid, but its meaning depends on something the tracer does not model.
    #[error("{at}: the tracer cannot evaluate {what}")]
    Unsupported { at: RuleRef, what: String },
    /// The rule refers to something that is not there, or mixes types: the kernel would
    /// refuse it, or it could never mean what it says.
    #[error("{at}: {what}")]
    Invalid { at: RuleRef, what: String },
    /// Where the table's base chains sit makes the order they run in unknowable, or is
    /// somewhere the kernel refuses.
    #[error("{table}: {what}")]
    Hooks { table: TableRef, what: String },
    #[error("{at}: jumps nest {JUMP_STACK} deep, where the kernel stops")]
    JumpStack { at: RuleRef },
    #[error("the trace took more than {MAX_RULE_EVALUATIONS} rule evaluations: gotos in a loop, or numgen draws without end")]
    TooLong,
}

/// A problem found evaluating one statement, before the walker says which rule it is in.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) enum Problem {
    Unsupported(String),
    Invalid(String),
}

impl Problem {
    pub(super) fn at(self, at: RuleRef) -> TraceError {
        match self {
            Problem::Unsupported(what) => TraceError::Unsupported { at, what },
            Problem::Invalid(what) => TraceError::Invalid { at, what },
        }
    }
}
