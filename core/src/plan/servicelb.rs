//! `--servicelb-compat`: the node labels and Service pools of k3s ServiceLB, read the way its
//! own controller reads them, so nodes labelled for ServiceLB serve nodelb's Services unchanged.
//!
//! What k3s does (k3s-io/k3s `pkg/cloudprovider/servicelb.go`, `nodeHasDaemonSetLabel` and
//! `newDaemonSet`): when any Node carries the label `svccontroller.k3s.cattle.io/enablelb`,
//! whatever its value, each Service's DaemonSet selects only the nodes labelled
//! `svccontroller.k3s.cattle.io/enablelb=true` (exactly `true`: `false`, or any other value,
//! takes a node out). Only then, a Service *labelled* (not annotated)
//! `svccontroller.k3s.cattle.io/lbpool=<pool>`, with a value that is not empty, narrows these
//! to the nodes whose label `svccontroller.k3s.cattle.io/lbpool` is the same `<pool>`; a Service
//! without a pool runs on every `enablelb=true` node, pool or not. While no node carries
//! `enablelb`, every node serves every Service and pools mean nothing.
//!
//! The one difference: k3s rewrites the DaemonSets' node selectors when a node's `enablelb`
//! label changes and then forgets the pool until the Service changes (`updateDaemonSets`);
//! here the pool always holds.

use super::diagnosis::NotServed;
use k8s_openapi::api::core::v1::Node;
use std::collections::BTreeMap;

pub use crate::vocab::{ENABLELB_LABEL, LBPOOL_LABEL};

/// What ServiceLB's labels decide, as the planner is told.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum ServiceLb {
    /// `--servicelb-compat` is off: ServiceLB's labels mean nothing to nodelb.
    #[default]
    Ignored,
    /// On, and no Node carries [`ENABLELB_LABEL`]: every node serves, pools or not.
    Unlabelled,
    /// On, and some Node carries [`ENABLELB_LABEL`]: only nodes labelled `true` serve, and a
    /// Service with a pool only on its pool's nodes.
    Labelled,
}

impl ServiceLb {
    /// The setting of the flag `--servicelb-compat`, before any Node is seen.
    pub fn from_flag(on: bool) -> ServiceLb {
        match on {
            true => ServiceLb::Unlabelled,
            false => ServiceLb::Ignored,
        }
    }

    /// The same setting, knowing whether some Node carries [`ENABLELB_LABEL`]: the agent learns
    /// it from its watch of such Nodes, the leader from every Node it watches.
    pub fn seeing(self, labelled: bool) -> ServiceLb {
        match (self, labelled) {
            (ServiceLb::Ignored, _) => ServiceLb::Ignored,
            (_, true) => ServiceLb::Labelled,
            (_, false) => ServiceLb::Unlabelled,
        }
    }

    /// Whether the flag is on.
    pub fn enabled(self) -> bool {
        self != ServiceLb::Ignored
    }

    /// Whether a node's label `key` can decide whether it serves.
    pub fn reads(self, key: &str) -> bool {
        self == ServiceLb::Labelled && (key == ENABLELB_LABEL || key == LBPOOL_LABEL)
    }

    /// Whether a node with `labels` serves a Service in `pool` (its [`LBPOOL_LABEL`] label).
    pub fn serving(
        self,
        pool: Option<&str>,
        labels: &BTreeMap<String, String>,
    ) -> Result<(), NotServed> {
        if self != ServiceLb::Labelled {
            return Ok(());
        }
        if labels.get(ENABLELB_LABEL).map(String::as_str) != Some("true") {
            return Err(NotServed::ServiceLbNotEnabled);
        }
        match pool.filter(|p| !p.is_empty()) {
            Some(p) if labels.get(LBPOOL_LABEL).map(String::as_str) != Some(p) => {
                Err(NotServed::ServiceLbPoolMismatch {
                    pool: p.to_string(),
                })
            }
            _ => Ok(()),
        }
    }
}

/// Whether any of `nodes` carries [`ENABLELB_LABEL`], whatever its value.
pub fn labelled(nodes: &[Node]) -> bool {
    nodes.iter().any(|n| {
        n.metadata
            .labels
            .as_ref()
            .is_some_and(|l| l.contains_key(ENABLELB_LABEL))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn only_enablelb_true_serves_once_any_node_is_labelled() {
        let on = ServiceLb::from_flag(true).seeing(true);
        assert_eq!(
            on.serving(None, &labels(&[(ENABLELB_LABEL, "true")])),
            Ok(())
        );
        for value in ["false", "True", "", "yes"] {
            assert_eq!(
                on.serving(None, &labels(&[(ENABLELB_LABEL, value)])),
                Err(NotServed::ServiceLbNotEnabled),
                "{value:?}"
            );
        }
        assert_eq!(
            on.serving(None, &labels(&[])),
            Err(NotServed::ServiceLbNotEnabled)
        );
    }

    #[test]
    fn labels_mean_nothing_while_no_node_is_labelled_or_the_flag_is_off() {
        let false_label = labels(&[(ENABLELB_LABEL, "false"), (LBPOOL_LABEL, "b")]);
        for mode in [
            ServiceLb::from_flag(true),
            ServiceLb::from_flag(false).seeing(true),
        ] {
            assert_eq!(mode.serving(Some("a"), &false_label), Ok(()), "{mode:?}");
            assert!(!mode.reads(ENABLELB_LABEL) && !mode.reads(LBPOOL_LABEL));
        }
    }

    #[test]
    fn a_service_pool_picks_the_enabled_nodes_of_that_pool() {
        let on = ServiceLb::Labelled;
        let node = |pool: Option<&str>| {
            let mut l = labels(&[(ENABLELB_LABEL, "true")]);
            if let Some(p) = pool {
                l.insert(LBPOOL_LABEL.to_string(), p.to_string());
            }
            l
        };
        assert_eq!(on.serving(Some("a"), &node(Some("a"))), Ok(()));
        let not_a = Err(NotServed::ServiceLbPoolMismatch {
            pool: "a".to_string(),
        });
        assert_eq!(on.serving(Some("a"), &node(Some("b"))), not_a);
        assert_eq!(on.serving(Some("a"), &node(None)), not_a);
        // No pool (or an empty one): every enabled node, in a pool or not.
        for pool in [None, Some("")] {
            assert_eq!(on.serving(pool, &node(Some("b"))), Ok(()));
            assert_eq!(on.serving(pool, &node(None)), Ok(()));
        }
        // A pool does not bring back a node that is not enabled.
        let pooled = labels(&[(LBPOOL_LABEL, "a")]);
        assert_eq!(
            on.serving(Some("a"), &pooled),
            Err(NotServed::ServiceLbNotEnabled)
        );
    }
}
