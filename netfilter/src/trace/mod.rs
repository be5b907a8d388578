//! A packet tracer over the model: where a given packet goes through a host's tables, as
//! kube-proxy's `tracePacket` (`pkg/proxy/nftables/helpers_test.go`) says it for its own
//! rules, but over the model's statements and expressions rather than rule text.
//!
//! [`Tracer::trace`] walks the base chains of the hooks the packet goes through
//! (`prerouting`, then `input` for the host's own addresses or `forward` and `postrouting`
//! for others; `output` and `postrouting` for a packet the host sends, and back in by
//! `prerouting` and `input` when it sends to itself), each hook's chains in priority order,
//! following jumps, gotos and returns, set and map lookups (named and anonymous, concatenated,
//! intervals, dynamic sets), verdict maps, NAT and its maps, counters, marks and rejects.
//!
//! As in the kernel, every nat chain of a hook runs where the kernel's NAT sits in it
//! (`dstnat` -100 in `prerouting` and `output`, `srcnat` 100 in `input` and `postrouting`),
//! only for a new connection whose NAT of that half is not decided yet, until one decides it;
//! then the packet is rewritten, so later hooks see the DNATed destination, `ct status dnat`
//! and the original destination in `ct original`.
//!
//! `numgen random mod N` takes every value: the result is every way the packet can go, each
//! with its exact chance. Anything the tracer cannot evaluate is a [`TraceError`] naming the
//! rule, never a guess.
//!
//! Not modelled: where a masquerade's address comes from (routing), a set's size limit, the
//! time a dynamic set's element has left (the tracer holds what it is told or learned), reply
//! packets of a translated connection (an established packet goes the original way), and the
//! ports of ICMP.
//!
//! Pure: plain model types in, plain data out.

mod branch;
mod error;
mod eval;
mod outcome;
mod packet;
#[cfg(test)]
mod tests;
mod tracer;

pub use error::{TraceError, JUMP_STACK, MAX_RULE_EVALUATIONS};
pub use outcome::{Chance, Fate, Learned, Outcome, Outcomes, RuleRef, Snat};
pub use packet::{Address, CtState, Packet, DEFAULT_SOURCE_PORT};
pub use tracer::Tracer;
