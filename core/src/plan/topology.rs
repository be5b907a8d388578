//! Topology-aware routing of `externalTrafficPolicy: Cluster` traffic, as kube-proxy's
//! `pkg/proxy/topology.go` (v1.36) routes its cluster endpoints: the EndpointSlice controller
//! turns a Service's `trafficDistribution` (or the older topology annotation) into hints on
//! its endpoints, and the hints decide, same rules, same order:
//!
//! 1. Only ready endpoints are looked at. None ready: no topology (the serving-and-terminating
//!    fallback takes every one of them).
//! 2. Every ready endpoint is hinted for some node (`hints.forNodes`), one for this node: use
//!    the endpoints hinted for this node (`PreferSameNode`).
//! 3. Else every ready endpoint is hinted for some zone (`hints.forZones`), one for this
//!    node's zone (its Node's `topology.kubernetes.io/zone` label): use the endpoints hinted
//!    for that zone (`PreferClose`, `PreferSameZone`).
//! 4. Else every endpoint: a hint is missing, or none fits this node.
//!
//! `Local` policy never narrows by topology (kube-proxy's local endpoints do not either).
//! Unlike kube-proxy, which logs at high verbosity only, every port whose hints are ignored says
//! why (its outcome, the agent's log, `nodelb_topology_hints_ignored`).

use crate::objects::index::{Hints, TrafficDistribution};
use std::fmt;

/// The Node label that names a node's zone.
pub const ZONE_LABEL: &str = "topology.kubernetes.io/zone";

/// Where this node is, in the names hints use.
#[derive(Clone, Copy, Debug)]
pub struct Place<'a> {
    pub node: &'a str,
    /// Its `topology.kubernetes.io/zone` label (`None`: none, or empty).
    pub zone: Option<&'a str>,
}

impl<'a> Place<'a> {
    pub fn of(node: &'a str, labels: &'a std::collections::BTreeMap<String, String>) -> Place<'a> {
        Place {
            node,
            zone: labels
                .get(ZONE_LABEL)
                .map(String::as_str)
                .filter(|z| !z.is_empty()),
        }
    }
}

/// How a port's `Cluster` endpoints are narrowed on this node.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Topology {
    /// No endpoint carries a hint and the Service sets no `trafficDistribution`: every
    /// endpoint, as always.
    None,
    /// Only the endpoints hinted for this node.
    SameNode,
    /// Only the endpoints hinted for this node's zone.
    SameZone,
    /// Hints (or a `trafficDistribution`) are there, but not used on this node: every
    /// endpoint, for this reason.
    Ignored(Ignored),
}

/// Why a port's hints are not used on this node (kube-proxy's fallbacks, in its order).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Ignored {
    /// No endpoint is ready: the serving-and-terminating ones stand in, all of them.
    OnlyTerminating,
    /// Some ready endpoint's hints do not read as the API writes them.
    MalformedHint,
    /// Some ready endpoint carries no hint (for its zone; and not every one is hinted for a
    /// node with one for this node).
    MissingHint,
    /// Every ready endpoint is hinted for a zone, but this node has no zone label.
    NodeHasNoZone,
    /// Every ready endpoint is hinted for a zone, none for this node's (nor for this node).
    NotForThisZone,
}

impl Ignored {
    pub const ALL: [Ignored; 5] = [
        Ignored::OnlyTerminating,
        Ignored::MalformedHint,
        Ignored::MissingHint,
        Ignored::NodeHasNoZone,
        Ignored::NotForThisZone,
    ];

    /// The metric's `reason` label.
    pub fn label(self) -> &'static str {
        match self {
            Ignored::OnlyTerminating => "only-terminating",
            Ignored::MalformedHint => "malformed-hint",
            Ignored::MissingHint => "missing-hint",
            Ignored::NodeHasNoZone => "node-without-zone",
            Ignored::NotForThisZone => "none-for-this-zone",
        }
    }
}

impl fmt::Display for Ignored {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Ignored::OnlyTerminating => "only terminating endpoints are left",
            Ignored::MalformedHint => "an endpoint's hints are malformed",
            Ignored::MissingHint => "an endpoint carries no hint",
            Ignored::NodeHasNoZone => "this node has no topology.kubernetes.io/zone label",
            Ignored::NotForThisZone => "no endpoint is hinted for this node or its zone",
        })
    }
}

impl fmt::Display for Topology {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Topology::None => Ok(()),
            Topology::SameNode => f.write_str(" (hinted for this node)"),
            Topology::SameZone => f.write_str(" (hinted for this zone)"),
            Topology::Ignored(why) => write!(f, " (topology hints ignored: {why})"),
        }
    }
}

fn names(list: &[crate::vocab::Str], name: &str) -> bool {
    list.binary_search_by(|n| n.as_str().cmp(name)).is_ok()
}

/// The topology of a port's `Cluster` endpoints on this node, from each endpoint's readiness
/// and hints (kube-proxy's `topologyModeFromHints`), and why hints that are there go unused.
pub fn mode<'h>(
    endpoints: impl IntoIterator<Item = (bool, Option<&'h Hints>)>,
    distribution: Option<TrafficDistribution>,
    here: Place<'_>,
) -> Topology {
    let mut any_hints = false;
    let mut has_ready = false;
    let mut malformed = false;
    let (mut all_node, mut for_node) = (true, false);
    let (mut all_zone, mut for_zone) = (true, false);
    for (ready, hints) in endpoints {
        any_hints |= hints.is_some();
        if !ready {
            continue;
        }
        has_ready = true;
        malformed |= hints.is_some_and(|h| h.malformed);
        let (nodes, zones) = hints.map_or((&[][..], &[][..]), |h| (&h.nodes[..], &h.zones[..]));
        if nodes.is_empty() {
            all_node = false;
        } else {
            for_node |= names(nodes, here.node);
        }
        if zones.is_empty() {
            all_zone = false;
        } else {
            for_zone |= here.zone.is_some_and(|z| names(zones, z));
        }
    }
    let asked = any_hints || distribution.is_some();
    if !has_ready {
        return match asked {
            true => Topology::Ignored(Ignored::OnlyTerminating),
            false => Topology::None,
        };
    }
    if all_node && for_node {
        return Topology::SameNode;
    }
    if all_zone && for_zone {
        return Topology::SameZone;
    }
    if !asked {
        return Topology::None;
    }
    Topology::Ignored(if malformed {
        Ignored::MalformedHint
    } else if !all_zone {
        Ignored::MissingHint
    } else if here.zone.is_none() {
        Ignored::NodeHasNoZone
    } else {
        Ignored::NotForThisZone
    })
}

/// Whether an endpoint with these hints is used under `mode` (kube-proxy's
/// `availableForTopology`: no fallback here, that was decided by [`mode`]).
pub fn available(hints: Option<&Hints>, mode: Topology, here: Place<'_>) -> bool {
    match mode {
        Topology::SameNode => hints.is_some_and(|h| names(&h.nodes, here.node)),
        Topology::SameZone => hints.is_some_and(|h| here.zone.is_some_and(|z| names(&h.zones, z))),
        Topology::None | Topology::Ignored(_) => true,
    }
}

#[cfg(test)]
mod tests {
    //! kube-proxy's `TestCategorizeEndpoints` cases for cluster endpoints (v1.36, the
    //! PreferSameTrafficDistribution gate locked on), and the reasons nodelb gives.
    use super::*;
    use crate::vocab::Str;

    /// An endpoint: ready, zone hints, node hints (`None`: no hints at all).
    type Ep<'a> = (bool, Option<(&'a [&'a str], &'a [&'a str])>);

    fn hints(zones: &[&str], nodes: &[&str]) -> Hints {
        let list = |v: &[&str]| -> Box<[Str]> {
            let mut v: Vec<Str> = v.iter().map(|s| Str::from(*s)).collect();
            v.sort();
            v.into()
        };
        Hints {
            zones: list(zones),
            nodes: list(nodes),
            malformed: false,
        }
    }

    /// The mode, and the indexes of the ready endpoints it uses.
    fn pick(eps: &[Ep], node: &str, zone: Option<&str>) -> (Topology, Vec<usize>) {
        let hs: Vec<Option<Hints>> = eps
            .iter()
            .map(|(_, h)| h.map(|(z, n)| hints(z, n)))
            .collect();
        let here = Place { node, zone };
        let m = mode(
            eps.iter().zip(&hs).map(|((r, _), h)| (*r, h.as_ref())),
            None,
            here,
        );
        let used = eps
            .iter()
            .zip(&hs)
            .enumerate()
            .filter(|(_, ((r, _), h))| *r && available(h.as_ref(), m, here))
            .map(|(i, _)| i)
            .collect();
        (m, used)
    }

    const A: &[&str] = &["zone-a"];
    const B: &[&str] = &["zone-b"];
    const C: &[&str] = &["zone-c"];
    const NONE: &[&str] = &[];

    #[test]
    fn zone_hints_narrow_to_this_zone() {
        let eps = [
            (true, Some((A, NONE))),
            (true, Some((B, NONE))),
            (true, Some((C, NONE))),
            (true, Some((A, NONE))),
        ];
        assert_eq!(
            pick(&eps, "n", Some("zone-a")),
            (Topology::SameZone, vec![0, 3])
        );
    }

    #[test]
    fn a_node_without_a_zone_or_in_another_zone_uses_every_endpoint() {
        let eps = [(true, Some((A, NONE)))];
        assert_eq!(
            pick(&eps, "n", None),
            (Topology::Ignored(Ignored::NodeHasNoZone), vec![0])
        );
        assert_eq!(
            pick(&eps, "n", Some("zone-b")),
            (Topology::Ignored(Ignored::NotForThisZone), vec![0])
        );
    }

    #[test]
    fn unready_endpoints_count_for_nothing() {
        // An unready endpoint of this zone is not used, and its hint does not select the zone.
        let eps = [
            (true, Some((A, NONE))),
            (true, Some((B, NONE))),
            (true, Some((C, NONE))),
            (false, Some((A, NONE))),
        ];
        assert_eq!(
            pick(&eps, "n", Some("zone-a")),
            (Topology::SameZone, vec![0])
        );
        let eps = [
            (false, Some((A, NONE))),
            (true, Some((B, NONE))),
            (true, Some((C, NONE))),
            (false, Some((A, NONE))),
        ];
        assert_eq!(
            pick(&eps, "n", Some("zone-a")),
            (Topology::Ignored(Ignored::NotForThisZone), vec![1, 2])
        );
        // An unready endpoint without hints does not stop the others'.
        let eps = [(true, Some((A, NONE))), (false, None)];
        assert_eq!(
            pick(&eps, "n", Some("zone-a")),
            (Topology::SameZone, vec![0])
        );
    }

    #[test]
    fn a_missing_hint_falls_back_to_every_endpoint() {
        let eps = [
            (true, Some((A, NONE))),
            (true, Some((B, NONE))),
            (true, None),
            (true, Some((A, NONE))),
        ];
        assert_eq!(
            pick(&eps, "n", Some("zone-a")),
            (Topology::Ignored(Ignored::MissingHint), vec![0, 1, 2, 3])
        );
    }

    #[test]
    fn an_endpoint_hinted_for_several_zones_serves_each() {
        let eps = [
            (true, Some((&["zone-a", "zone-b", "zone-c"][..], NONE))),
            (true, Some((&["zone-b", "zone-c"][..], NONE))),
            (true, Some((&["zone-b", "zone-d"][..], NONE))),
            (true, Some((C, NONE))),
        ];
        assert_eq!(
            pick(&eps, "n", Some("zone-c")),
            (Topology::SameZone, vec![0, 1, 3])
        );
    }

    #[test]
    fn node_hints_come_first_and_fall_back_to_zones() {
        let eps = [
            (true, Some((A, &["node-1"][..]))),
            (true, Some((B, &["node-2"][..]))),
            (true, Some((C, &["node-3"][..]))),
            (true, Some((A, &["node-4"][..]))),
        ];
        assert_eq!(
            pick(&eps, "node-1", Some("zone-a")),
            (Topology::SameNode, vec![0])
        );
        // No endpoint for this node: its zone's.
        assert_eq!(
            pick(&eps, "node-0", Some("zone-a")),
            (Topology::SameZone, vec![0, 3])
        );
        // One endpoint without hints: none of them.
        let mut some_unhinted = eps;
        some_unhinted[1] = (true, None);
        assert_eq!(
            pick(&some_unhinted, "node-1", Some("zone-a")),
            (Topology::Ignored(Ignored::MissingHint), vec![0, 1, 2, 3])
        );
    }

    #[test]
    fn without_hints_nothing_is_ignored_unless_a_distribution_was_asked_for() {
        let none = [(true, None), (true, None)];
        assert_eq!(
            pick(&none, "n", Some("zone-a")),
            (Topology::None, vec![0, 1])
        );
        let here = Place {
            node: "n",
            zone: Some("zone-a"),
        };
        let asked = mode(
            [(true, None), (true, None)],
            Some(TrafficDistribution::PreferClose),
            here,
        );
        assert_eq!(asked, Topology::Ignored(Ignored::MissingHint));
        assert_eq!(
            mode(
                [(false, None)],
                Some(TrafficDistribution::PreferClose),
                here
            ),
            Topology::Ignored(Ignored::OnlyTerminating)
        );
        assert_eq!(mode([(false, None)], None, here), Topology::None);
    }

    #[test]
    fn a_malformed_hint_counts_as_none_and_says_so() {
        let good = hints(A, NONE);
        let bad = Hints {
            malformed: true,
            ..Hints::default()
        };
        let here = Place {
            node: "n",
            zone: Some("zone-a"),
        };
        let m = mode([(true, Some(&good)), (true, Some(&bad))], None, here);
        assert_eq!(m, Topology::Ignored(Ignored::MalformedHint));
        assert!(available(Some(&bad), m, here));
        assert!(!available(Some(&bad), Topology::SameZone, here));
    }

    #[test]
    fn an_empty_zone_label_is_no_zone() {
        let labels = [(ZONE_LABEL.to_string(), String::new())].into();
        assert_eq!(Place::of("n", &labels).zone, None);
        let labels = [(ZONE_LABEL.to_string(), "zone-a".to_string())].into();
        assert_eq!(Place::of("n", &labels).zone, Some("zone-a"));
    }
}
