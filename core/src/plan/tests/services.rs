//! Which Services are nodelb's: the class, the type, the service-proxy-name label, the allowed namespaces.

use super::*;

#[test]
fn handled_when_class_is_nodelb() {
    let w = World::new()
        .service(web().spec("loadBalancerClass", "nodelb.io/nodelb"))
        .slice(web_slice("web-1", &["198.51.100.10"]));
    assert_eq!(w.plan().port("default/web", IpFamily::V4), &forwards(1));
    let out = w.trace(to_web());
    assert_eq!(out.endpoints(), eps(&["198.51.100.10:8080"]), "{out}");
    assert!(out.masqueraded(), "{out}");
}

#[test]
fn other_class_is_ignored() {
    let w = World::new()
        .service(web().spec("loadBalancerClass", "example.com/other"))
        .slice(web_slice("web-1", &["198.51.100.10"]));
    let p = w.plan();
    assert!(p.services.is_empty());
    let out = w.trace(to_web());
    assert!(untouched(&out), "{out}");
}

#[test]
fn unset_class_is_handled_only_with_default_class() {
    let mut w = World::new()
        .service(web())
        .slice(web_slice("web-1", &["198.51.100.10"]));
    assert_eq!(w.plan().port("default/web", IpFamily::V4), &forwards(1));
    w.config.default_class = false;
    let p = w.plan();
    assert!(p.services.is_empty());
    let out = w.trace(to_web());
    assert!(untouched(&out), "{out}");
}

#[test]
fn non_loadbalancer_services_are_ignored() {
    let w = World::new()
        .service(web().spec("type", "ClusterIP"))
        .slice(web_slice("web-1", &["198.51.100.10"]));
    let p = w.plan();
    assert!(p.services.is_empty());
    let out = w.trace(to_web());
    assert!(untouched(&out), "{out}");
}

#[test]
fn service_proxy_name_label_is_left_alone() {
    let labelled = |value: &str| web().label("service.kubernetes.io/service-proxy-name", value);
    for value in ["other-proxy", ""] {
        let w = World::new()
            .service(labelled(value))
            .slice(web_slice("web-1", &["198.51.100.10"]));
        let p = w.plan();
        assert!(p.services.is_empty(), "{value:?}: {:?}", p.services);
        let out = w.trace(to_web());
        assert!(untouched(&out), "{value:?}: {out}");
        assert!(p.warnings.is_empty(), "{:?}", p.warnings);
    }
    // Without the label the same Service is nodelb's.
    let w = World::new()
        .service(web())
        .slice(web_slice("web-1", &["198.51.100.10"]));
    let p = w.plan();
    assert_eq!(p.port("default/web", IpFamily::V4), &forwards(1));
}

#[test]
fn allowed_namespaces_limit_which_services_are_programmed() {
    let mut w = World::new()
        .service(web())
        .slice(web_slice("web-1", &["198.51.100.10"]));
    w.config.allowed_namespaces = Some(["prod".to_string()].into());
    let p = w.plan();
    assert_eq!(
        p.outcome("default/web"),
        &ServiceOutcome::NamespaceNotAllowed
    );
    let out = w.trace(to_web());
    assert!(untouched(&out), "{out}");
}
