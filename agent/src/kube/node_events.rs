//! Node-level problems (forwarding off, IPv6 absent, nf_tables unusable, an invalid
//! `nodelb.io/published-addresses`) as `events.k8s.io/v1`
//! Events on this node's Node, from this node's agent. One Event when a problem appears; none
//! while it persists; again if it comes back after going away.

use k8s_openapi::api::core::v1::ObjectReference;
use kube::runtime::events::EventType;
use kube::Client;
use std::collections::BTreeSet;
use tracing::warn;

use super::events::{create_event, new_event};

#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct NodeProblem {
    /// `ForwardingOff`, `FamilyAbsent`, `NfTablesUnavailable`, `SysctlUnreadable`,
    /// `InvalidPublishedAddresses`.
    pub reason: &'static str,
    pub note: String,
}

pub struct NodeEvents {
    client: Option<Client>,
    /// `reportingInstance`: the agent's Pod.
    instance: String,
    node_name: String,
    active: BTreeSet<NodeProblem>,
}

impl NodeEvents {
    pub fn new(client: Option<Client>, node_name: &str, pod_name: Option<String>) -> NodeEvents {
        NodeEvents {
            client,
            instance: pod_name.unwrap_or_else(|| format!("nodelb-agent-{node_name}")),
            node_name: node_name.to_string(),
            active: BTreeSet::new(),
        }
    }

    /// The problems that are new since the last call (and remember `now` as the current set).
    pub fn new_problems(&mut self, now: Vec<NodeProblem>) -> Vec<NodeProblem> {
        let now: BTreeSet<NodeProblem> = now.into_iter().collect();
        let fresh = now.difference(&self.active).cloned().collect();
        self.active = now;
        fresh
    }

    /// Publish an Event per new problem (in the background; a failed publish is logged).
    /// Returns the new problems.
    pub fn update(&mut self, now: Vec<NodeProblem>, node_uid: Option<String>) -> Vec<NodeProblem> {
        let fresh = self.new_problems(now);
        let Some(client) = self.client.clone() else {
            return fresh;
        };
        let reference = ObjectReference {
            api_version: Some("v1".into()),
            kind: Some("Node".into()),
            name: Some(self.node_name.clone()),
            uid: node_uid,
            ..Default::default()
        };
        for p in fresh.iter().cloned() {
            let ev = new_event(
                reference.clone(),
                EventType::Warning,
                p.reason,
                &p.note,
                &self.instance,
            );
            let client = client.clone();
            tokio::spawn(async move {
                if let Err(e) = create_event(client, &ev).await {
                    warn!(reason = p.reason, error = %e, "could not publish a Node Event");
                }
            });
        }
        fresh
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_new_problems_are_published() {
        let mut e = NodeEvents::new(None, "n1", None);
        let off = NodeProblem {
            reason: "ForwardingOff",
            note: "IPv4".into(),
        };
        assert_eq!(e.new_problems(vec![off.clone()]), vec![off.clone()]);
        assert_eq!(e.new_problems(vec![off.clone()]), vec![]);
        assert_eq!(e.new_problems(vec![]), vec![]);
        assert_eq!(e.new_problems(vec![off.clone()]), vec![off]);
    }
}
