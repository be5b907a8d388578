//! nodelb on a real cluster: `scripts/cluster.sh`'s two nodes (kubelet and containerd in each
//! node's namespace, kube-controller-manager, kube-scheduler, kube-proxy), nodelb installed
//! from its image with `kubectl apply -k`, backends as real pods behind EndpointSlices the
//! controller writes. Or any cluster, through `NODELB_E2E_KUBECONFIG` (see
//! `nodelb_integration::real_cluster`).
//!
//! The tests share the one cluster and take turns. Each prints its figures as `measured:`
//! lines: failed connections, and how long each status change took.
//!
//! Run as root: `cargo test -p nodelb-integration --test cluster -- --nocapture`.

use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use nodelb_integration::e2e::{ingress_ips, metric_value};
use nodelb_integration::real_cluster::{
    backend_deployment, backend_service, pod_of, serving_condition, RealCluster,
};
use nodelb_integration::traffic::Outcome;

/// How long a Service may take to be published on every node once its pods are ready.
const PUBLISH: Duration = Duration::from_secs(60);

/// The pods of Deployment `app` in `ns`, by name.
fn pods(c: &RealCluster, ns: &str, app: &str) -> BTreeSet<String> {
    c.kubectl(&[
        "-n",
        ns,
        "get",
        "pods",
        "-l",
        &format!("app={app}"),
        "-o",
        "jsonpath={.items[*].metadata.name}",
    ])
    .unwrap_or_else(|e| panic!("{e}"))
    .split_whitespace()
    .map(str::to_string)
    .collect()
}

/// Waits until the Service publishes every node's address; returns how long it took.
fn wait_published(c: &RealCluster, ns: &str, name: &str) -> Duration {
    let want: BTreeSet<String> = c.nodes().iter().map(|(_, a)| a.to_string()).collect();
    c.until(
        &format!("Service {ns}/{name} publishing {want:?}"),
        PUBLISH,
        || {
            let svc = c.service(ns, name)?;
            let got: BTreeSet<String> = ingress_ips(&svc).into_iter().collect();
            (got == want)
                .then_some(())
                .ok_or(format!("ingress {got:?}"))
        },
    )
    .1
}

/// `n` requests to `addr` from the client; the pods that answered and how many did not.
fn spread(c: &RealCluster, addr: SocketAddr, n: usize) -> (BTreeSet<String>, Vec<Outcome>) {
    let mut pods = BTreeSet::new();
    let mut failed = Vec::new();
    for _ in 0..n {
        match c.tcp_request(addr) {
            Outcome::Answered(r) => {
                pods.insert(pod_of(&r).to_string());
            }
            other => failed.push(other),
        }
    }
    (pods, failed)
}

#[test]
fn install_serves_a_deployment_through_every_node_address() {
    let Some((_turn, c)) =
        RealCluster::get("install_serves_a_deployment_through_every_node_address")
    else {
        return;
    };
    let rollout = c.install("").unwrap_or_else(|e| panic!("{e}"));
    println!("measured: nodelb installed and rolled out on every node in {rollout:.1?}");
    let ns = c.namespace("rc-install");
    c.apply(&backend_deployment(
        ns.name(),
        "web",
        c.backend_image(),
        2,
        3,
    ))
    .unwrap_or_else(|e| panic!("{e}"));
    c.kubectl(&[
        "-n",
        ns.name(),
        "rollout",
        "status",
        "deploy/web",
        "--timeout=120s",
    ])
    .unwrap_or_else(|e| panic!("{e}"));
    let created = Instant::now();
    c.apply(&backend_service(ns.name(), "web", ""))
        .unwrap_or_else(|e| panic!("{e}"));
    wait_published(c, ns.name(), "web");
    println!(
        "measured: Service published on {} nodes {:.1?} after it was created",
        c.nodes().len(),
        created.elapsed()
    );
    println!(
        "{}",
        c.kubectl(&["-n", ns.name(), "get", "svc", "web", "-o", "wide"])
            .unwrap_or_else(|e| panic!("{e}"))
    );

    let backends = pods(c, ns.name(), "web");
    assert_eq!(backends.len(), 2, "two backend pods: {backends:?}");
    for (node, addr) in c.nodes() {
        let (answered, failed) = spread(c, SocketAddr::new(*addr, 80), 30);
        println!(
            "measured: through {node} ({addr}): pods {answered:?}, failed {}",
            failed.len()
        );
        assert!(
            failed.is_empty(),
            "requests through {node} failed: {failed:?}"
        );
        assert_eq!(
            answered, backends,
            "30 requests through {node} reach both pods (Cluster policy)"
        );
    }

    let svc = c
        .service(ns.name(), "web")
        .unwrap_or_else(|e| panic!("{e}"));
    let (status, reason, message) = serving_condition(&svc)
        .unwrap_or_else(|| panic!("no nodelb.io/Serving condition: {svc:?}"));
    println!("Serving condition: {status} {reason}: {message}");
    assert_eq!((status.as_str(), reason.as_str()), ("True", "Serving"));

    let events = c
        .kubectl(&[
            "-n",
            ns.name(),
            "get",
            "events.events.k8s.io",
            "--field-selector",
            "regarding.name=web,regarding.kind=Service",
            "-o",
            "jsonpath={range .items[*]}{.reason} {.reportingController}{\"\\n\"}{end}",
        ])
        .unwrap_or_else(|e| panic!("{e}"));
    println!("Service Events:\n{events}");
    assert!(
        events
            .lines()
            .any(|l| l == "EnsuredLoadBalancer nodelb.io/nodelb"),
        "an EnsuredLoadBalancer Event from nodelb on the Service: {events}"
    );

    for (pod, node) in c.agent_pods().unwrap_or_else(|e| panic!("{e}")) {
        let text = c.agent_metrics(&pod).unwrap_or_else(|e| panic!("{e}"));
        let series = format!(
            "nodelb_service_packets_total{{namespace=\"{}\",service=\"web\",port=\"http\",family=\"IPv4\"}}",
            ns.name()
        );
        let packets = metric_value(&text, &series)
            .unwrap_or_else(|| panic!("{pod} on {node} exposes no {series}"));
        println!("measured: {pod} on {node}: {series} {packets}");
        assert!(packets > 0.0, "{pod} counted the requests through {node}");
    }
}
