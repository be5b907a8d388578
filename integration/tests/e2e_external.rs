//! `NODELB_E2E_KUBECONFIG` keeps working: the end-to-end harness's mode for a cluster someone
//! already has, tried here against a control plane this test starts and reaches only through
//! a kubeconfig, as a user's cluster would be. The parent test starts etcd and kube-apiserver
//! in a namespace of its own, installs `manifests/` and runs the `#[ignore]`d child below in a
//! new process of this test binary with `NODELB_E2E_KUBECONFIG` set to the admin's kubeconfig;
//! the child builds its cluster in external mode (its own node namespace, unique Node names and
//! namespace, an unbound ServiceAccount token, API traffic relayed from its `api` namespace)
//! and checks traffic and status through it.

use std::net::{IpAddr, SocketAddr};
use std::process::Command;
use std::time::Duration;

use k8s_openapi::api::core::v1::Service;
use kube::Api;
use nodelb_integration::e2e::{start_control_plane, wait_for, Cluster, ClusterOptions};
use nodelb_integration::netns::{require_root, Netns};
use nodelb_integration::traffic::{tcp_request, tcp_server, Outcome};

const CHILD: &str = "external_cluster_child";

#[test]
fn external_cluster_mode_runs_against_a_kubeconfig() {
    if !require_root("external_cluster_mode_runs_against_a_kubeconfig") {
        return;
    }
    let ns = Netns::new("ext-api");
    ns.ip(&["addr", "add", "192.0.2.1/32", "dev", "lo"]);
    let dir = std::env::temp_dir().join(format!("nodelb-e2e-external-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    // The admin relay this starts (127.0.0.1 here) is the cluster's address for the child.
    let (cp, _admin, kubeconfig) = start_control_plane(&rt, &ns, &dir);
    let out = Command::new(std::env::current_exe().unwrap())
        .args([
            CHILD,
            "--exact",
            "--ignored",
            "--nocapture",
            "--test-threads=1",
        ])
        .env("NODELB_E2E_KUBECONFIG", &kubeconfig)
        .output()
        .expect("running the child test");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    eprintln!("----- child -----\n{text}\n----- end -----");
    assert!(out.status.success(), "the external-mode child failed");
    assert!(
        text.contains("1 passed") && text.contains("external cluster mode"),
        "the child ran in external mode"
    );
    // The child's agent really used this server: its requests are in this server's audit log,
    // as the ServiceAccount.
    let agent_requests = cp
        .audit()
        .iter()
        .filter(|r| r.user == "system:serviceaccount:nodelb-system:nodelb" && r.code < 300)
        .count();
    assert!(
        agent_requests > 0,
        "no agent request in the server's audit log"
    );
    drop(cp);
    rt.shutdown_background();
    let _ = std::fs::remove_dir_all(&dir);
}

/// Run by the test above, in external mode; not on its own.
#[test]
#[ignore = "run by external_cluster_mode_runs_against_a_kubeconfig with NODELB_E2E_KUBECONFIG"]
fn external_cluster_child() {
    assert!(
        nodelb_integration::e2e::external_cluster().is_some(),
        "{CHILD} runs only under external_cluster_mode_runs_against_a_kubeconfig"
    );
    let c = Cluster::start(ClusterOptions::default());
    assert!(c.is_external());
    let _server = tcp_server(
        c.backend(0),
        SocketAddr::new(c.backend_v4(0).into(), 8080),
        "b0",
    );
    let ns = c.namespace().to_string();
    c.apply(&format!(
        "apiVersion: v1\nkind: Service\nmetadata: {{name: web, namespace: {ns}}}\nspec:\n  type: LoadBalancer\n  allocateLoadBalancerNodePorts: false\n  ports: [{{name: tcp, port: 8001, protocol: TCP}}]\n"
    ));
    c.apply(&format!(
        "apiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata: {{name: web-1, namespace: {ns}, labels: {{kubernetes.io/service-name: web}}}}\naddressType: IPv4\nports: [{{name: tcp, port: 8080, protocol: TCP}}]\nendpoints: [{{addresses: [\"{}\"], nodeName: {}, conditions: {{ready: true}}}}]\n",
        c.backend_v4(0),
        c.node_name(0)
    ));
    let dst = SocketAddr::new(c.node_v4(0).into(), 8001);
    wait_for(
        "b0 answers through the node",
        Duration::from_secs(20),
        || match tcp_request(c.client(), dst, Duration::from_secs(2)) {
            Outcome::Answered(a) if a.starts_with("b0") => Ok(()),
            other => Err(format!("{other:?}")),
        },
    );
    let api: Api<Service> = Api::namespaced(c.admin().clone(), &ns);
    let want = IpAddr::from(c.node_v4(0)).to_string();
    wait_for("the status names the node", Duration::from_secs(30), || {
        let svc = c.block_on(api.get("web")).map_err(|e| e.to_string())?;
        let ips = nodelb_integration::e2e::ingress_ips(&svc);
        if ips == [want.clone()] {
            Ok(())
        } else {
            Err(format!("ingress {ips:?}"))
        }
    });
}
