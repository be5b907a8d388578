//! The condition `nodelb.io/Serving` each handled Service carries beside its ingress: whether
//! nodelb serves it, and in its message on how many nodes and why the others do not, or what
//! to do. Pure: from what the leader saw of the Service on each serving candidate.

use super::Problem;
use std::collections::BTreeMap;
use std::fmt::Write as _;

pub use crate::vocab::SERVING_CONDITION as CONDITION_TYPE;
/// Nodes named in a message before "and N more".
const NAMED_NODES: usize = 3;

/// The condition as decided: `status` True or False, a CamelCase reason, a message.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct Serving {
    pub status: bool,
    pub reason: &'static str,
    pub message: String,
}

/// What the leader saw of one Service on the serving candidates (nodes with a fresh heartbeat).
#[derive(Clone, Debug, Default)]
pub struct Seen {
    /// Serving candidates.
    pub candidates: usize,
    /// Nodes whose addresses are published for it.
    pub serving: usize,
    /// The other candidates, each with why it does not serve the Service.
    pub why_not: WhyNot,
    /// Whether a serving node forwards to an endpoint (else every connection is refused).
    pub any_endpoint: bool,
    /// `--allowed-namespaces` leaves its namespace out.
    pub namespace_denied: bool,
    /// No valid port, or a name nodelb cannot use.
    pub invalid: bool,
}

/// The candidates that do not serve a Service, each with why: the first few by name (as many
/// as a message names) and how many in all. What a message says of them is all that is kept,
/// so a Service seen on a thousand nodes costs no more than one seen on ten.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct WhyNot {
    first: BTreeMap<String, String>,
    count: usize,
}

impl WhyNot {
    /// `count` nodes do not serve it, for the same reason; `nodes` lists them in name order
    /// (only the first few are read).
    pub fn add<'a>(&mut self, nodes: impl IntoIterator<Item = &'a str>, count: usize, why: &str) {
        self.add_each(nodes.into_iter().map(|n| (n, why.to_string())), count);
    }

    /// `count` nodes do not serve it; `nodes` lists them in name order, each with why (only
    /// the first few are read, so only their reasons are made).
    pub fn add_each<'a>(
        &mut self,
        nodes: impl IntoIterator<Item = (&'a str, String)>,
        count: usize,
    ) {
        self.count += count;
        for (node, why) in nodes.into_iter().take(NAMED_NODES) {
            if self.first.len() == NAMED_NODES
                && self
                    .first
                    .last_key_value()
                    .is_some_and(|(last, _)| last.as_str() < node)
            {
                break;
            }
            self.first.insert(node.to_string(), why);
            if self.first.len() > NAMED_NODES {
                self.first.pop_last();
            }
        }
    }
}

/// The condition from what was seen and the problems found (see [`Problem`]).
pub fn decide(seen: &Seen, problems: &[Problem], namespace: &str) -> Serving {
    let not = |reason, message: String| Serving {
        status: false,
        reason,
        message,
    };
    if seen.namespace_denied {
        return not(
            "NamespaceNotAllowed",
            format!("namespace {namespace} is not in the agents' --allowed-namespaces: nodelb does not serve it; create it in an allowed namespace or widen the flag"),
        );
    }
    if let Some(p @ Problem::ReservedPort { .. }) = problems.first_of("ReservedPort") {
        return not("ReservedPort", format!("{}; use another port", p.note()));
    }
    if seen.invalid {
        let what: Vec<String> = problems
            .iter()
            .filter(|p| p.reason() == "InvalidInput")
            .map(Problem::note)
            .collect();
        return not(
            "InvalidService",
            format!(
                "nodelb cannot program this Service ({}); fix spec.ports",
                bounded(&what, what.len())
            ),
        );
    }
    let served = format!("served on {} of {} nodes", seen.serving, seen.candidates);
    if seen.serving > 0 {
        // What a served Service's status leaves out is said after who serves it.
        let others = others(&seen.why_not) + &ignored(problems);
        if !seen.any_endpoint {
            return not(
                "NoEndpoints",
                format!("no ready endpoint: connections are refused until a Pod of the Service is ready ({served}{others})"),
            );
        }
        return Serving {
            status: true,
            reason: "Serving",
            message: format!("{served}{others}"),
        };
    }
    if let Some(p @ Problem::PortConflict { .. }) = problems.first_of("PortConflict") {
        return not(
            "PortConflict",
            format!(
                "{}; use another port, or node selectors that do not overlap",
                p.note()
            ),
        );
    }
    if let Some(p @ Problem::PortInUseOnNode { .. }) = problems.first_of("PortInUseOnNode") {
        return not(
            "PortInUseOnNode",
            format!(
                "{}; stop that process, use another port, or a node selector without those nodes",
                p.note()
            ),
        );
    }
    let why = match problems.first_of("NoServingNodes") {
        Some(Problem::NoServingNodes { why }) => why.clone(),
        _ => "no node serves it".to_string(),
    };
    not(
        "NoServingNodes",
        format!(
            "{why}{}; check the nodelb agents' heartbeats, the node selector, the address types and CIDRs and the endpoints",
            others(&seen.why_not)
        ),
    )
}

/// `; <note>` for a `nodelb.io/published-addresses` of the Service's that was ignored.
fn ignored(problems: &[Problem]) -> String {
    problems
        .iter()
        .filter(|p| matches!(p, Problem::PublishedAddressesIgnored { .. }))
        .map(|p| format!("; {}", p.note()))
        .collect()
}

trait FirstOf {
    fn first_of(&self, reason: &str) -> Option<&Problem>;
}

impl FirstOf for [Problem] {
    fn first_of(&self, reason: &str) -> Option<&Problem> {
        self.iter().find(|p| p.reason() == reason)
    }
}

/// `; node-d: why; node-e: why and 2 more` for the nodes that do not serve.
fn others(why_not: &WhyNot) -> String {
    let items: Vec<String> = why_not
        .first
        .iter()
        .map(|(n, w)| format!("{n}: {w}"))
        .collect();
    if items.is_empty() {
        String::new()
    } else {
        format!("; {}", bounded(&items, why_not.count))
    }
}

/// The first few of `count` items joined with `; `, then how many more.
fn bounded(items: &[String], count: usize) -> String {
    let mut out = items
        .iter()
        .take(NAMED_NODES)
        .cloned()
        .collect::<Vec<_>>()
        .join("; ");
    if count > NAMED_NODES {
        let _ = write!(out, " and {} more", count - NAMED_NODES);
    }
    out
}
