//! Serving nodes: the exclusion label and the node-selector annotation.

use super::*;

#[test]
fn node_with_exclusion_label_does_not_serve() {
    let mut w = World::new()
        .service(web())
        .slice(web_slice("web-1", &["198.51.100.10"]));
    w.node.labels.insert(
        "node.kubernetes.io/exclude-from-external-load-balancers".into(),
        "".into(),
    );
    let p = w.plan();
    assert_eq!(
        p.outcome("default/web"),
        &ServiceOutcome::NotServed(NotServed::ExcludedByLabel)
    );
    let out = w.trace(to_web());
    assert!(untouched(&out), "{out}");
}

#[test]
fn node_selector_annotation_limits_serving_nodes() {
    let annotated = |sel: &str| web().annotation("nodelb.io/node-selector", sel);
    let serve = World::new()
        .service(annotated("kubernetes.io/hostname in (node-a,node-b)"))
        .slice(web_slice("web-1", &["198.51.100.10"]))
        .plan();
    assert_eq!(serve.port("default/web", IpFamily::V4), &forwards(1));

    let w = World::new()
        .service(annotated("kubernetes.io/hostname=node-b"))
        .slice(web_slice("web-1", &["198.51.100.10"]));
    let skip = w.plan();
    assert!(matches!(
        skip.outcome("default/web"),
        ServiceOutcome::NotServed(NotServed::NodeSelectorMismatch { .. })
    ));
    let out = w.trace(to_web());
    assert!(untouched(&out), "{out}");
}

#[test]
fn invalid_node_selector_serves_nowhere_with_a_warning() {
    let w = World::new()
        .service(web().annotation("nodelb.io/node-selector", "a in (b"))
        .slice(web_slice("web-1", &["198.51.100.10"]));
    let p = w.plan();
    assert!(matches!(
        p.outcome("default/web"),
        ServiceOutcome::NotServed(NotServed::InvalidNodeSelector { .. })
    ));
    assert!(p.warned("nodelb.io/node-selector"));
    let out = w.trace(to_web());
    assert!(untouched(&out), "{out}");
}
