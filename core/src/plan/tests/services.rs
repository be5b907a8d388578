//! Which Services are nodelb's: the class, the type, the service-proxy-name label, the allowed namespaces.

use super::*;

#[test]
fn handled_when_class_is_nodelb() {
    let p = World::new()
        .service(web().spec("loadBalancerClass", "nodelb.io/nodelb"))
        .slice(web_slice("web-1", &["198.51.100.10"]))
        .plan();
    assert_eq!(p.port("default/web", IpFamily::V4), &forwards(1));
    assert!(
        p.v4()
            .contains("203.0.113.1 . tcp . 80 comment \"default/web:http\" : goto endpoints-1"),
        "{}",
        p.v4()
    );
}

#[test]
fn other_class_is_ignored() {
    let p = World::new()
        .service(web().spec("loadBalancerClass", "example.com/other"))
        .slice(web_slice("web-1", &["198.51.100.10"]))
        .plan();
    assert!(p.services.is_empty());
    assert!(!p.v4().contains("default/web"));
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
    assert!(!p.v4().contains("default/web"));
}

#[test]
fn non_loadbalancer_services_are_ignored() {
    let p = World::new()
        .service(web().spec("type", "ClusterIP"))
        .slice(web_slice("web-1", &["198.51.100.10"]))
        .plan();
    assert!(p.services.is_empty());
    assert!(!p.v4().contains("default/web"));
}

#[test]
fn service_proxy_name_label_is_left_alone() {
    let labelled = |value: &str| web().label("service.kubernetes.io/service-proxy-name", value);
    for value in ["other-proxy", ""] {
        let p = World::new()
            .service(labelled(value))
            .slice(web_slice("web-1", &["198.51.100.10"]))
            .plan();
        assert!(p.services.is_empty(), "{value:?}: {:?}", p.services);
        assert!(!p.v4().contains("default/web"), "{}", p.v4());
        assert!(p.warnings.is_empty(), "{:?}", p.warnings);
    }
    // Without the label the same Service is nodelb's.
    let p = World::new()
        .service(web())
        .slice(web_slice("web-1", &["198.51.100.10"]))
        .plan();
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
    assert!(!p.v4().contains("default/web"));
}
