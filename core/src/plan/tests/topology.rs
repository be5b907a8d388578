//! Topology: the hints and trafficDistribution narrow the endpoints to this zone's or node's.

use super::*;

/// The endpoints an outside client of `default/web` reaches through the plan's tables (on
/// the default World's host), by address.
fn endpoint_hosts(p: &Plan) -> Vec<String> {
    let out = traced(&p.tables, &World::new().local, to_web());
    assert!(out.accepted(), "{out}");
    out.endpoints().iter().map(|e| e.ip().to_string()).collect()
}

fn forwards_by(n: usize, topology: Topology) -> PortResult {
    PortResult::Forwards {
        endpoints: n,
        terminating: false,
        topology,
    }
}

/// `node-a` in `zone`.
fn in_zone(mut w: World, zone: &str) -> World {
    w.node
        .labels
        .insert("topology.kubernetes.io/zone".into(), zone.into());
    w
}

/// The plan of `node-a` in `zone` for Service `web` and one slice `web-1` of `endpoints`.
fn zoned(zone: &str, web: Svc, endpoints: &[&str]) -> Plan {
    in_zone(World::new(), zone)
        .service(web)
        .slice(web_slice("web-1", endpoints))
        .plan()
}

/// Three endpoints as the EndpointSlice controller hints them for `PreferClose`: .10 and .12
/// in zone-a, .11 in zone-b.
const ZONED: [&str; 3] = [
    "198.51.100.10 node-a for-zones=zone-a",
    "198.51.100.11 node-b for-zones=zone-b",
    "198.51.100.12 node-c for-zones=zone-a",
];

#[test]
fn prefer_close_uses_only_zone_hinted_endpoints() {
    let p = zoned(
        "zone-a",
        web().spec("trafficDistribution", "PreferClose"),
        &ZONED,
    );
    assert_eq!(
        p.port("default/web", IpFamily::V4),
        &forwards_by(2, Topology::SameZone)
    );
    assert_eq!(endpoint_hosts(&p), ["198.51.100.10", "198.51.100.12"]);
    // In zone-b, zone-b's.
    let p = zoned(
        "zone-b",
        web().spec("trafficDistribution", "PreferClose"),
        &ZONED,
    );
    assert_eq!(endpoint_hosts(&p), ["198.51.100.11"]);
    // The hints decide, as in kube-proxy, also without trafficDistribution (the older
    // topology-mode annotation makes the same hints).
    let p = zoned("zone-a", web(), &ZONED);
    assert_eq!(endpoint_hosts(&p), ["198.51.100.10", "198.51.100.12"]);
}

#[test]
fn prefer_same_node_uses_only_node_hinted_endpoints_and_else_its_zones() {
    let hinted = [
        "198.51.100.10 for-zones=zone-a for-nodes=node-a",
        "198.51.100.11 for-zones=zone-b for-nodes=node-b",
        "198.51.100.12 for-zones=zone-a for-nodes=node-c",
    ];
    let p = zoned(
        "zone-a",
        web().spec("trafficDistribution", "PreferSameNode"),
        &hinted,
    );
    assert_eq!(
        p.port("default/web", IpFamily::V4),
        &forwards_by(1, Topology::SameNode)
    );
    assert_eq!(endpoint_hosts(&p), ["198.51.100.10"]);
    // No endpoint for this node: this zone's.
    let mut w = in_zone(World::new(), "zone-a")
        .service(web().spec("trafficDistribution", "PreferSameNode"))
        .slice(web_slice("web-1", &hinted));
    w.node.name = "node-d".into();
    assert_eq!(
        endpoint_hosts(&w.plan()),
        ["198.51.100.10", "198.51.100.12"]
    );
}

#[test]
fn hints_missing_on_one_endpoint_fall_back_to_all() {
    let mut eps = ZONED.to_vec();
    eps.push("198.51.100.13 node-d");
    let p = zoned(
        "zone-a",
        web().spec("trafficDistribution", "PreferClose"),
        &eps,
    );
    assert_eq!(
        p.port("default/web", IpFamily::V4),
        &forwards_by(4, Topology::Ignored(Ignored::MissingHint))
    );
    // A terminating endpoint without hints does not count: only ready ones are looked at.
    eps[3] = "198.51.100.13 node-d ready=false serving=true terminating=true";
    let p = zoned(
        "zone-a",
        web().spec("trafficDistribution", "PreferClose"),
        &eps,
    );
    assert_eq!(endpoint_hosts(&p), ["198.51.100.10", "198.51.100.12"]);
}

#[test]
fn hints_for_no_endpoint_of_this_zone_or_a_node_without_a_zone_fall_back_to_all() {
    let p = zoned("zone-c", web(), &ZONED);
    assert_eq!(
        p.port("default/web", IpFamily::V4),
        &forwards_by(3, Topology::Ignored(Ignored::NotForThisZone))
    );
    let p = World::new()
        .service(web())
        .slice(web_slice("web-1", &ZONED))
        .plan();
    assert_eq!(
        p.port("default/web", IpFamily::V4),
        &forwards_by(3, Topology::Ignored(Ignored::NodeHasNoZone))
    );
}

#[test]
fn only_terminating_endpoints_left_ignore_their_hints() {
    let eps = [
        "198.51.100.10 ready=false serving=true terminating=true for-zones=zone-a",
        "198.51.100.11 ready=false serving=true terminating=true for-zones=zone-b",
    ];
    let p = zoned(
        "zone-a",
        web().spec("trafficDistribution", "PreferClose"),
        &eps,
    );
    assert_eq!(
        p.port("default/web", IpFamily::V4),
        &PortResult::Forwards {
            endpoints: 2,
            terminating: true,
            topology: Topology::Ignored(Ignored::OnlyTerminating),
        }
    );
}

#[test]
fn topology_hints_do_not_narrow_local_policy() {
    let eps = [
        "198.51.100.10 node-a for-zones=zone-b",
        "198.51.100.11 node-b for-zones=zone-a",
    ];
    let p = zoned(
        "zone-a",
        web()
            .spec("externalTrafficPolicy", "Local")
            .spec("trafficDistribution", "PreferClose"),
        &eps,
    );
    assert_eq!(
        p.port("default/web", IpFamily::V4),
        &forwards_by(1, Topology::None)
    );
    assert_eq!(endpoint_hosts(&p), ["198.51.100.10"]);
}

#[test]
fn a_node_whose_zone_label_changes_uses_the_new_zones_endpoints() {
    // The zone is part of the planner's context: a change replans every Service.
    let w = in_zone(World::new(), "zone-a")
        .service(web())
        .slice(web_slice("web-1", &ZONED));
    let node_b = in_zone(World::new(), "zone-b").node;
    let objects = Objects::from_lists(w.services.clone(), w.slices.clone());
    let ctx =
        |node: &NodeInfo| Context::new(node.clone(), w.local.clone(), w.families, w.config.clone());
    let mut planner = Planner::new();
    planner.update(&objects, &ctx(&w.node), None);
    let before = planner.tables();
    let u = planner.update(&objects, &ctx(&node_b), Some(&BTreeSet::new()));
    assert!(matches!(u.change, TableChange::Rebuild));
    assert_eq!(u.changed, [ServiceKey::new("default", "web")].into());
    let after = planner.tables();
    let out = traced(&after, &w.local, to_web());
    assert_eq!(out.endpoints(), eps(&["198.51.100.11:8080"]), "{out}");
    assert_ne!(before, after);
}

#[test]
fn malformed_hints_are_warned_about_and_fall_back_to_all() {
    let mut eps = ZONED.to_vec();
    eps[1] = r#"198.51.100.11 node-b hints={"forZones":[{}]}"#;
    let p = zoned("zone-a", web(), &eps);
    assert_eq!(
        p.port("default/web", IpFamily::V4),
        &forwards_by(3, Topology::Ignored(Ignored::MalformedHint))
    );
    assert!(
        p.warned("EndpointSlice default/web-1: endpoint 198.51.100.11: hints are not"),
        "{:?}",
        p.warnings
    );
    // A hint list that is not a list at all reads the same way.
    eps[1] = r#"198.51.100.11 node-b hints={"forZones":"zone-b"}"#;
    let p = zoned("zone-a", web(), &eps);
    assert_eq!(
        p.port("default/web", IpFamily::V4),
        &forwards_by(3, Topology::Ignored(Ignored::MalformedHint))
    );
}

#[test]
fn an_unknown_traffic_distribution_is_warned_about_and_the_hints_still_decide() {
    let p = zoned(
        "zone-a",
        web().spec("trafficDistribution", "PreferFarAway"),
        &ZONED,
    );
    assert!(
        p.warned("trafficDistribution is not PreferClose, PreferSameZone or PreferSameNode"),
        "{:?}",
        p.warnings
    );
    assert_eq!(
        p.port("default/web", IpFamily::V4),
        &forwards_by(2, Topology::SameZone)
    );
}

#[test]
fn a_distribution_without_hints_says_they_are_missing() {
    let p = zoned(
        "zone-a",
        web().spec("trafficDistribution", "PreferClose"),
        &["198.51.100.10", "198.51.100.11"],
    );
    assert_eq!(
        p.port("default/web", IpFamily::V4),
        &forwards_by(2, Topology::Ignored(Ignored::MissingHint))
    );
    let outcome = p.outcome("default/web").to_string();
    assert!(
        outcome.contains(
            "forwards to 2 endpoints (topology hints ignored: an endpoint carries no hint)"
        ),
        "{outcome}"
    );
}
