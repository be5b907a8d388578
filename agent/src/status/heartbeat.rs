//! Node heartbeats: the Lease `nodelb-node-<node>` each agent renews in its namespace, with an
//! annotation naming the families it has programmed. Read here into plain values.

use crate::vocab::Families;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::jiff::Timestamp;
use std::collections::BTreeMap;
use std::time::{Duration, Instant};

/// Prefix of the heartbeat Lease names; the node name follows.
pub const LEASE_PREFIX: &str = "nodelb-node-";
/// Annotation on a heartbeat: the families the agent has programmed, `IPv4,IPv6`.
pub const FAMILIES_ANNOTATION: &str = "nodelb.io/families";
/// Label on a heartbeat: the node's name (Lease names may be shortened, labels are exact).
pub const NODE_LABEL: &str = "nodelb.io/node";

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Heartbeat {
    pub node: String,
    pub holder: Option<String>,
    pub renewed: Timestamp,
    pub families: Families,
}

/// Liveness as the leader sees it: when it last saw each node's heartbeat renewal change, on
/// its own monotonic clock. A node's `renewTime` is compared only with its own earlier value,
/// never with the leader's clock, so a node clock minutes behind or ahead changes nothing. A
/// node seen for the first time (by a new leader, or a new node) counts as just renewed: one
/// lease duration of grace before it can be dropped.
#[derive(Clone, Debug, Default)]
pub struct Observed {
    /// Node → its last renewal value and when it was first seen.
    seen: BTreeMap<String, (Timestamp, Instant)>,
}

impl Observed {
    /// Take the heartbeats read at `now`; returns each node's age: the time since its renewal
    /// was last seen to change.
    pub fn ages(
        &mut self,
        beats: &BTreeMap<String, Heartbeat>,
        now: Instant,
    ) -> BTreeMap<String, Duration> {
        self.seen.retain(|node, _| beats.contains_key(node));
        let mut ages = BTreeMap::new();
        for (node, b) in beats {
            let seen = self.seen.entry(node.clone()).or_insert((b.renewed, now));
            if seen.0 != b.renewed {
                *seen = (b.renewed, now);
            }
            ages.insert(node.clone(), now.saturating_duration_since(seen.1));
        }
        ages
    }
}

/// The name of a node's heartbeat Lease.
pub fn lease_name(node: &str) -> String {
    format!("{LEASE_PREFIX}{node}")
}

/// Heartbeats by node, from the Leases in the agents' namespace (others are ignored).
pub fn read(leases: &[Lease]) -> BTreeMap<String, Heartbeat> {
    let mut out = BTreeMap::new();
    for l in leases {
        let name = l.metadata.name.as_deref().unwrap_or("");
        let Some(from_name) = name.strip_prefix(LEASE_PREFIX) else {
            continue;
        };
        let node = l
            .metadata
            .labels
            .as_ref()
            .and_then(|m| m.get(NODE_LABEL))
            .map(String::as_str)
            .unwrap_or(from_name)
            .to_string();
        let Some(spec) = &l.spec else { continue };
        let Some(renewed) = spec.renew_time.as_ref().or(spec.acquire_time.as_ref()) else {
            continue;
        };
        let families = l
            .metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(FAMILIES_ANNOTATION))
            .map(|s| super::parse_families(s))
            .unwrap_or(Families {
                v4: false,
                v6: false,
            });
        out.insert(
            node.clone(),
            Heartbeat {
                node,
                holder: spec.holder_identity.clone(),
                renewed: renewed.0,
                families,
            },
        );
    }
    out
}
