//! The control plane the end-to-end tests run against is the real thing and leaves nothing
//! behind: etcd and kube-apiserver start in a namespace of the test's own, report the pinned
//! version, authenticate and authorize (an unknown token is refused, an RBAC-less user is
//! forbidden), record every request in the audit log, and are gone, with etcd's data, once
//! dropped. Needs root (network namespaces); under `CI=true` a server that cannot be built or
//! started fails here.

use std::net::{IpAddr, Ipv4Addr};
use std::time::Duration;

use nix::sys::signal::kill;
use nix::unistd::Pid;
use nodelb_integration::control_plane::{
    client_from_kubeconfig, pinned_version, ControlPlane, ControlPlaneOptions, API_PORT,
};
use nodelb_integration::netns::{require_root, Netns};

#[test]
fn control_plane_is_real_enforces_rbac_and_cleans_up() {
    if !require_root("control_plane_is_real_enforces_rbac_and_cleans_up") {
        return;
    }
    let ns = Netns::new("cp");
    ns.ip(&["addr", "add", "192.0.2.1/32", "dev", "lo"]);
    let dir = std::env::temp_dir().join(format!("nodelb-cp-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let mut cp = ControlPlane::start(
        &ns,
        &dir,
        &ControlPlaneOptions {
            advertise: Ipv4Addr::new(192, 0, 2, 1),
            serving_ips: vec![IpAddr::V4(Ipv4Addr::new(192, 0, 2, 1))],
            tokens: vec![
                (
                    "admin-token".into(),
                    "admin".into(),
                    vec!["system:masters".into()],
                ),
                ("nobody-token".into(), "nobody".into(), vec![]),
            ],
        },
    )
    .unwrap_or_else(|e| panic!("{e}"));
    let pids = cp.pids();
    assert_eq!(pids.len(), 2, "etcd and kube-apiserver");
    let etcd_data = cp.etcd_data().to_path_buf();

    // The test process lives outside `ns`: its client runs on a thread inside it.
    let ca_server = format!("https://192.0.2.1:{API_PORT}");
    let admin_cfg = cp.kubeconfig(&ca_server, "admin-token");
    let nobody_cfg = cp.kubeconfig(&ca_server, "nobody-token");
    let stranger_cfg = cp.kubeconfig(&ca_server, "unknown-token");
    let (version, nobody, stranger) = ns.run(|| {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async {
            let admin = client_from_kubeconfig(&admin_cfg).await.unwrap();
            let took = cp
                .wait_ready(&admin)
                .await
                .unwrap_or_else(|e| panic!("{e}"));
            eprintln!(
                "measured: kube-apiserver ready in {:.1} s",
                took.as_secs_f64()
            );
            let version = admin.apiserver_version().await.unwrap().git_version;
            let list = |cfg: String| async move {
                let c = client_from_kubeconfig(&cfg).await.unwrap();
                let nodes: kube::Api<k8s_openapi::api::core::v1::Node> = kube::Api::all(c);
                match nodes.list(&Default::default()).await {
                    Err(kube::Error::Api(s)) => s.code,
                    other => panic!("listing Nodes without a grant: {other:?}"),
                }
            };
            (version, list(nobody_cfg).await, list(stranger_cfg).await)
        })
    });
    assert_eq!(
        version,
        pinned_version(),
        "the server reports the pinned release"
    );
    assert_eq!(nobody, 403, "RBAC: a user without a grant is forbidden");
    assert_eq!(stranger, 401, "an unknown token is not authenticated");

    // The audit log recorded the refusal, with who and where from.
    let audit = cp.audit();
    let refused = audit
        .iter()
        .find(|r| r.user == "nobody" && r.code == 403)
        .unwrap_or_else(|| panic!("no 403 for nobody in the audit log: {audit:#?}"));
    assert_eq!(refused.verb, "list");
    assert_eq!(refused.object.as_ref().unwrap().resource, "nodes");
    assert!(
        refused.source.is_loopback() || refused.source == IpAddr::V4(Ipv4Addr::new(192, 0, 2, 1)),
        "source {}",
        refused.source
    );

    drop(cp);
    std::thread::sleep(Duration::from_millis(100));
    for pid in pids {
        assert!(
            kill(Pid::from_raw(pid as i32), None).is_err(),
            "process {pid} still runs after drop"
        );
    }
    assert!(!etcd_data.exists(), "{} left behind", etcd_data.display());
    let _ = std::fs::remove_dir_all(&dir);
}
