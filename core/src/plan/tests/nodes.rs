//! Serving nodes: the exclusion label, the node-selector annotation, and ServiceLB's node
//! labels and pools under `--servicelb-compat`.

use super::*;
use crate::plan::service::EXCLUDE_LABEL;
use crate::plan::servicelb::{ServiceLb, ENABLELB_LABEL, LBPOOL_LABEL};

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

/// The World with `web` and one endpoint, this node labelled `labels`, and ServiceLB's labels
/// read as `servicelb` says.
fn servicelb_world(svc: Svc, servicelb: ServiceLb, labels: &[(&str, &str)]) -> World {
    let mut w = World::new()
        .service(svc)
        .slice(web_slice("web-1", &["198.51.100.10"]));
    w.config.servicelb = servicelb;
    for (k, v) in labels {
        w.node.labels.insert(k.to_string(), v.to_string());
    }
    w
}

/// `--servicelb-compat`, with some node of the cluster labelled enablelb.
const SOME_NODE_LABELLED: ServiceLb = ServiceLb::Labelled;

#[test]
fn servicelb_compat_serves_only_on_nodes_labelled_enablelb_true() {
    let w = servicelb_world(web(), SOME_NODE_LABELLED, &[(ENABLELB_LABEL, "true")]);
    let out = w.trace(to_web());
    assert_eq!(out.endpoints(), eps(&["198.51.100.10:8080"]), "{out}");

    // Labelled anything but `true`, or not at all, while another node is: left out.
    for value in [Some("false"), Some(""), None] {
        let labels: Vec<(&str, &str)> = value.map(|v| (ENABLELB_LABEL, v)).into_iter().collect();
        let w = servicelb_world(web(), SOME_NODE_LABELLED, &labels);
        assert_eq!(
            w.plan().outcome("default/web"),
            &ServiceOutcome::NotServed(NotServed::ServiceLbNotEnabled),
            "{value:?}"
        );
        let out = w.trace(to_web());
        assert!(untouched(&out), "{value:?}: {out}");
    }
}

#[test]
fn servicelb_labels_mean_nothing_without_the_flag_or_while_no_node_is_labelled() {
    let labels = [(ENABLELB_LABEL, "false"), (LBPOOL_LABEL, "b")];
    let pooled = || web().label(LBPOOL_LABEL, "a");
    for servicelb in [ServiceLb::Ignored, ServiceLb::Unlabelled] {
        let w = servicelb_world(pooled(), servicelb, &labels);
        let out = w.trace(to_web());
        assert_eq!(
            out.endpoints(),
            eps(&["198.51.100.10:8080"]),
            "{servicelb:?}: {out}"
        );
    }
}

#[test]
fn servicelb_pool_label_on_a_service_picks_the_enabled_nodes_of_its_pool() {
    fn enabled_in(pool: &str) -> [(&str, &str); 2] {
        [(ENABLELB_LABEL, "true"), (LBPOOL_LABEL, pool)]
    }
    let pooled = || web().label(LBPOOL_LABEL, "a");

    let w = servicelb_world(pooled(), SOME_NODE_LABELLED, &enabled_in("a"));
    let out = w.trace(to_web());
    assert_eq!(out.endpoints(), eps(&["198.51.100.10:8080"]), "{out}");

    let w = servicelb_world(pooled(), SOME_NODE_LABELLED, &enabled_in("b"));
    assert_eq!(
        w.plan().outcome("default/web"),
        &ServiceOutcome::NotServed(NotServed::ServiceLbPoolMismatch { pool: "a".into() })
    );
    let out = w.trace(to_web());
    assert!(untouched(&out), "{out}");

    // A Service without a pool is served on every enabled node, in a pool or not.
    let w = servicelb_world(web(), SOME_NODE_LABELLED, &enabled_in("b"));
    let out = w.trace(to_web());
    assert_eq!(out.endpoints(), eps(&["198.51.100.10:8080"]), "{out}");

    // The pool is ServiceLB's label, not an annotation of the same name.
    let annotated = web().annotation(LBPOOL_LABEL, "a");
    let w = servicelb_world(annotated, SOME_NODE_LABELLED, &enabled_in("b"));
    let out = w.trace(to_web());
    assert_eq!(out.endpoints(), eps(&["198.51.100.10:8080"]), "{out}");
}

#[test]
fn servicelb_compat_keeps_the_exclusion_label_and_the_node_selector() {
    let enabled = [(ENABLELB_LABEL, "true"), (EXCLUDE_LABEL, "")];
    let w = servicelb_world(web(), SOME_NODE_LABELLED, &enabled);
    assert_eq!(
        w.plan().outcome("default/web"),
        &ServiceOutcome::NotServed(NotServed::ExcludedByLabel)
    );
    let selected = web().annotation("nodelb.io/node-selector", "kubernetes.io/hostname=node-b");
    let w = servicelb_world(selected, SOME_NODE_LABELLED, &[(ENABLELB_LABEL, "true")]);
    assert!(matches!(
        w.plan().outcome("default/web"),
        ServiceOutcome::NotServed(NotServed::NodeSelectorMismatch { .. })
    ));
    let out = w.trace(to_web());
    assert!(untouched(&out), "{out}");
}
