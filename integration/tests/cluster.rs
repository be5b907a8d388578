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

// Every test lives in `on_real_cluster`, so that scripts/test.sh can run the rest of the suite
// first (`--skip on_real_cluster::`) and these once the release agent for the image is built.
mod on_real_cluster {
    use std::collections::BTreeSet;
    use std::net::SocketAddr;
    use std::time::{Duration, Instant};

    use nodelb_integration::e2e::{ingress_ips, metric_value};
    use nodelb_integration::real_cluster::{
        backend_deployment, backend_service, pod_of, serving_condition, PodWatch, RealCluster,
        StatusWatch, TcpLoad, TestNamespace,
    };
    use nodelb_integration::traffic::{Heard, Outcome, TcpSession, UdpFlow};

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

    /// Every node's address, as the status publishes them.
    fn all_nodes(c: &RealCluster) -> BTreeSet<String> {
        c.nodes().iter().map(|(_, a)| a.to_string()).collect()
    }

    /// The node addresses Service `ns`/`name` publishes now.
    fn published(c: &RealCluster, ns: &str, name: &str) -> BTreeSet<String> {
        ingress_ips(&c.service(ns, name).unwrap_or_else(|e| panic!("{e}")))
            .into_iter()
            .collect()
    }

    /// Waits until Service `ns`/`name` publishes exactly `want`; returns how long it took.
    fn wait_publishing(
        c: &RealCluster,
        ns: &str,
        name: &str,
        want: &BTreeSet<String>,
        timeout: Duration,
    ) -> Duration {
        c.until(
            &format!("Service {ns}/{name} publishing {want:?}"),
            timeout,
            || {
                let svc = c.service(ns, name)?;
                let got: BTreeSet<String> = ingress_ips(&svc).into_iter().collect();
                (&got == want)
                    .then_some(())
                    .ok_or(format!("ingress {got:?}"))
            },
        )
        .1
    }

    /// Installs nodelb (`manifests/`), makes namespace `ns` with Deployment `web` of `replicas`
    /// backends draining for `drain` seconds, and the Services `(name, first port, spec extra)`;
    /// returns once every Service publishes every node.
    fn setup(
        c: &'static RealCluster,
        ns: &str,
        replicas: u32,
        drain: u32,
        services: &[(&str, u16, &str)],
    ) -> TestNamespace {
        c.install("").unwrap_or_else(|e| panic!("{e}"));
        serve(c, ns, replicas, drain, services)
    }

    /// Like [`setup`], with nodelb installed already.
    fn serve(
        c: &'static RealCluster,
        ns: &str,
        replicas: u32,
        drain: u32,
        services: &[(&str, u16, &str)],
    ) -> TestNamespace {
        let ns = c.namespace(ns);
        c.apply(&backend_deployment(
            ns.name(),
            "web",
            c.backend_image(),
            replicas,
            drain,
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
        for (name, first, extra) in services {
            c.apply(&backend_service(ns.name(), name, "web", *first, extra))
                .unwrap_or_else(|e| panic!("{e}"));
        }
        for (name, _, _) in services {
            wait_publishing(c, ns.name(), name, &all_nodes(c), PUBLISH);
        }
        ns
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
        c.apply(&backend_service(ns.name(), "web", "web", 80, ""))
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
            // What `kubectl logs` shows an operator: plain lines, no terminal escape codes.
            let logs = c
                .kubectl(&["-n", "nodelb-system", "logs", &pod])
                .unwrap_or_else(|e| panic!("{e}"));
            assert!(
                logs.contains("nodelb-agent starting") && !logs.contains('\u{1b}'),
                "{pod}'s log is plain text: {}",
                logs.lines().next().unwrap_or_default()
            );
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

    /// The pods a UDP flow's replies came from, in order: (when, pod), one entry per change.
    fn flow_pods(heard: &[(Instant, Heard)]) -> Vec<(Instant, String)> {
        let mut out: Vec<(Instant, String)> = Vec::new();
        for (t, h) in heard {
            if let Heard::Reply(r) = h {
                let pod = pod_of(r).to_string();
                if out.last().map(|(_, p)| p) != Some(&pod) {
                    out.push((*t, pod));
                }
            }
        }
        out
    }

    #[test]
    fn backend_rolling_update_and_scale_down_fail_no_connection_and_keep_draining_udp_flows() {
        const DRAIN: u32 = 6;
        let Some((_turn, c)) = RealCluster::get(
            "backend_rolling_update_and_scale_down_fail_no_connection_and_keep_draining_udp_flows",
        ) else {
            return;
        };
        let ns = setup(c, "rc-rolling", 3, DRAIN, &[("web", 80, "")]);
        let node_a = c.nodes()[0].1;
        let targets: Vec<SocketAddr> = c
            .nodes()
            .iter()
            .map(|(_, a)| SocketAddr::new(*a, 80))
            .collect();
        let pods_watch = PodWatch::start(c, ns.name());
        let load = TcpLoad::start(c.client(), targets, Duration::from_millis(50));
        let flow = UdpFlow::start(
            c.client(),
            "203.0.113.10:40000".parse().expect("an address"),
            SocketAddr::new(node_a, 82),
            Duration::from_millis(100),
        );
        std::thread::sleep(Duration::from_secs(2));
        let began = Instant::now();
        c.kubectl(&["-n", ns.name(), "rollout", "restart", "deploy/web"])
            .unwrap_or_else(|e| panic!("{e}"));
        c.kubectl(&[
            "-n",
            ns.name(),
            "rollout",
            "status",
            "deploy/web",
            "--timeout=180s",
        ])
        .unwrap_or_else(|e| panic!("{e}"));
        println!(
            "measured: rolling update of 3 backends took {:.1?}",
            began.elapsed()
        );
        let scaled = Instant::now();
        c.kubectl(&["-n", ns.name(), "scale", "deploy/web", "--replicas=1"])
            .unwrap_or_else(|e| panic!("{e}"));
        c.until("one backend pod left", Duration::from_secs(120), || {
            let n = pods(c, ns.name(), "web").len();
            (n == 1).then_some(()).ok_or(format!("{n} pods"))
        });
        println!("measured: scale-down 3 -> 1 took {:.1?}", scaled.elapsed());
        std::thread::sleep(Duration::from_secs(3));
        let report = load.stop();
        let heard = flow.heard();
        drop(flow);
        let ends = pods_watch.stop();

        println!(
            "measured: {} TCP connections over {:.1?}, {} failed; per pod {:?}",
            report.total(),
            report.ran,
            report.failed.len(),
            report.answered
        );
        assert!(
            report.failed.is_empty(),
            "failed TCP connections during the rolling update and scale-down: {:?}",
            report.failed
        );
        assert!(
            report.answered.len() >= 4,
            "the load reached old and new pods: {:?}",
            report.answered
        );

        // The UDP flow (one source port) stays on its pod while that pod drains, and moves only
        // once the pod stopped serving: never sooner than the preStop sleep after its deletion.
        let path = flow_pods(&heard);
        let refused = heard.iter().filter(|(_, h)| *h == Heard::Refused).count();
        println!(
            "UDP flow: {} datagrams answered or refused ({refused} refused), pods in turn:",
            heard.len()
        );
        for (t, pod) in &path {
            println!("  {:>6.1?} {pod}", t.saturating_duration_since(began));
        }
        assert!(
            path.len() >= 2,
            "the flow moved off a replaced pod: {path:?}"
        );
        for pair in path.windows(2) {
            let ((_, from), (moved, to)) = (&pair[0], &pair[1]);
            let deleting = ends
                .get(from)
                .and_then(|e| e.deleting)
                .unwrap_or_else(|| panic!("the flow left {from}, which was never deleted"));
            let after = moved.saturating_duration_since(deleting);
            println!(
                "measured: UDP flow moved from {from} to {to} {after:.1?} after {from}'s deletion \
                 (its preStop sleep: {DRAIN} s)"
            );
            assert!(
                after >= Duration::from_secs(u64::from(DRAIN) - 1),
                "the flow left {from} {after:?} after its deletion, while it still served (drain {DRAIN} s)"
            );
            let last_from = heard
                .iter()
                .filter_map(|(t, h)| match h {
                    Heard::Reply(r) if pod_of(r) == from => Some(*t),
                    _ => None,
                })
                .filter(|t| t < moved)
                .max()
                .expect("a reply from the pod it left");
            let gap = moved.saturating_duration_since(last_from);
            println!(
                "measured: UDP flow unanswered for {gap:.1?} while moving from {from} to {to}"
            );
        }
    }

    #[test]
    fn nodelb_rolling_update_to_the_hardened_variant_keeps_every_connection_and_serving_node() {
        let Some((_turn, c)) = RealCluster::get(
            "nodelb_rolling_update_to_the_hardened_variant_keeps_every_connection_and_serving_node",
        ) else {
            return;
        };
        let ns = setup(c, "rc-agent-rollout", 2, 3, &[("web", 80, "")]);
        let targets: Vec<SocketAddr> = c
            .nodes()
            .iter()
            .map(|(_, a)| SocketAddr::new(*a, 80))
            .collect();
        let mut sessions: Vec<(SocketAddr, TcpSession, String)> = c
            .nodes()
            .iter()
            .map(|(_, a)| {
                let dst = SocketAddr::new(*a, 81);
                let mut s = TcpSession::connect(c.client(), dst, Duration::from_secs(3))
                    .unwrap_or_else(|e| panic!("a session through {dst}: {e}"));
                let first = s.ask().unwrap_or_else(|e| panic!("{dst}: {e}"));
                (dst, s, pod_of(&first).to_string())
            })
            .collect();
        let watch = StatusWatch::start(c, ns.name(), "web");
        let load = TcpLoad::start(c.client(), targets, Duration::from_millis(50));
        let before = c.agent_pods().unwrap_or_else(|e| panic!("{e}"));
        // The pod template changes (the hardened overlay: NET_ADMIN only, read-only root), so the
        // DaemonSet replaces its pods one node at a time.
        let rollout = c.install("hardened").unwrap_or_else(|e| panic!("{e}"));
        let after = c.agent_pods().unwrap_or_else(|e| panic!("{e}"));
        println!("measured: nodelb's DaemonSet rolled {before:?} -> {after:?} in {rollout:.1?}");
        std::thread::sleep(Duration::from_secs(3));
        let mut kept = 0;
        for (dst, s, pod) in &mut sessions {
            let again = s.ask().unwrap_or_else(|e| {
                panic!("the connection through {dst} broke during the rollout: {e}")
            });
            assert_eq!(
                pod_of(&again),
                pod,
                "the connection through {dst} still reaches its pod"
            );
            kept += 1;
        }
        let report = load.stop();
        let versions = watch.stop();
        println!(
            "measured: {} TCP connections during nodelb's rollout, {} failed; {kept} of {} \
             established connections kept",
            report.total(),
            report.failed.len(),
            sessions.len()
        );
        println!("published addresses during the rollout: {versions:?}");
        assert!(
            report.failed.is_empty(),
            "failed connections: {:?}",
            report.failed
        );
        assert!(
            before.iter().all(|p| !after.contains(p)),
            "every agent pod was replaced: {before:?} -> {after:?}"
        );
        let privileged = c
            .kubectl(&[
                "-n",
                "nodelb-system",
                "get",
                "pods",
                "-l",
                "app.kubernetes.io/name=nodelb",
                "-o",
                "jsonpath={.items[*].spec.containers[0].securityContext.privileged}",
            ])
            .unwrap_or_else(|e| panic!("{e}"));
        assert!(
            !privileged.contains("true"),
            "the hardened agents are not privileged: {privileged}"
        );
        let all = all_nodes(c);
        for (t, ips) in &versions {
            assert_eq!(
                ips, &all,
                "at {t:?} the status lost a serving node: {versions:?}"
            );
        }
    }

    #[test]
    fn hairpin_a_pod_reaches_itself_and_the_others_through_a_node_address() {
        let Some((_turn, c)) =
            RealCluster::get("hairpin_a_pod_reaches_itself_and_the_others_through_a_node_address")
        else {
            return;
        };
        let ns = setup(c, "rc-hairpin", 3, 1, &[("web", 80, "")]);
        let backends = pods(c, ns.name(), "web");
        for (node, addr) in c.nodes() {
            for pod in &backends {
                let out = c
                    .kubectl(&[
                        "-n",
                        ns.name(),
                        "exec",
                        pod,
                        "--",
                        "sh",
                        "-c",
                        &format!(
                            "for i in $(seq 30); do nc {addr} 80 </dev/null || echo FAILED; done"
                        ),
                    ])
                    .unwrap_or_else(|e| panic!("{e}"));
                let answers: Vec<&str> = out.lines().collect();
                let reached: BTreeSet<&str> = answers.iter().map(|l| pod_of(l)).collect();
                println!("measured: {pod} through {node} ({addr}): reached {reached:?}");
                assert!(!out.contains("FAILED"), "{pod} through {node}: {out}");
                assert_eq!(answers.len(), 30, "{pod} through {node}: {out}");
                assert!(
                    reached.contains(pod.as_str()),
                    "{pod} reached itself through {node}: {out}"
                );
                assert!(
                    reached.len() >= 2,
                    "{pod} reached other pods through {node}: {out}"
                );
            }
        }
    }

    /// After an uninstall: Service `web` of `ns` has no status of nodelb's, the nodes have no
    /// nodelb table, and nothing answers on the nodes' addresses.
    fn assert_uninstalled(c: &RealCluster, ns: &str) {
        let svc = c.service(ns, "web").unwrap_or_else(|e| panic!("{e}"));
        assert!(
            ingress_ips(&svc).is_empty(),
            "the status is cleared: {:?}",
            svc.status
        );
        assert!(
            serving_condition(&svc).is_none(),
            "nodelb's condition is gone: {:?}",
            svc.status
        );
        if c.is_managed() {
            for (node, _) in c.nodes() {
                let e = c
                    .nft(node, &["list", "table", "ip", "nodelb"])
                    .expect_err("the table is gone");
                println!("node {node}: nft list table ip nodelb: {e}");
            }
            for (node, addr) in c.nodes() {
                let r = c.tcp_request(SocketAddr::new(*addr, 80));
                println!("after the uninstall, through {node}: {r:?}");
                assert!(
                    !matches!(r, Outcome::Answered(_)),
                    "nodelb no longer answers on {node}: {r:?}"
                );
            }
        } else {
            println!("SKIP the nftables check: it needs scripts/cluster.sh's nodes");
        }
    }

    /// The chart, on the real kube-apiserver: `helm install --dry-run=server` accepts the
    /// default and the hardened values and creates nothing; `helm install` with the image under
    /// test serves a Deployment through every node address; `helm uninstall` (its pre-delete
    /// hook) removes the tables and the statuses, then everything the release installed.
    #[test]
    fn helm_install_serves_and_helm_uninstall_removes_the_tables_and_the_statuses() {
        let Some((_turn, c)) = RealCluster::get(
            "helm_install_serves_and_helm_uninstall_removes_the_tables_and_the_statuses",
        ) else {
            return;
        };
        c.remove_kustomized().unwrap_or_else(|e| panic!("{e}"));
        let gone = || c.kubectl(&["get", "namespace", "nodelb-system", "--ignore-not-found"]);
        for values in [&[][..], &["hardened=true", "ipv6=true"]] {
            let out = c
                .helm_install(values, true)
                .unwrap_or_else(|e| panic!("helm install --dry-run=server {values:?}: {e}"));
            let status = out.lines().find(|l| l.starts_with("STATUS:"));
            println!("helm install --dry-run=server {values:?}: {status:?}");
            assert_eq!(gone().as_deref(), Ok(""), "a dry run creates nothing");
        }
        let began = Instant::now();
        c.helm_install(&[], false)
            .unwrap_or_else(|e| panic!("helm install: {e}"));
        println!("measured: helm install --wait took {:.1?}", began.elapsed());
        let ns = serve(c, "rc-helm", 2, 1, &[("web", 80, "")]);
        let backends = pods(c, ns.name(), "web");
        for (node, addr) in c.nodes() {
            let (answered, failed) = spread(c, SocketAddr::new(*addr, 80), 20);
            assert!(failed.is_empty(), "through {node}: {failed:?}");
            assert_eq!(answered, backends, "through {node}");
        }
        let began = Instant::now();
        c.helm(&["uninstall", "nodelb", "--wait", "--timeout=300s"])
            .unwrap_or_else(|e| panic!("helm uninstall: {e}"));
        println!(
            "measured: helm uninstall --wait took {:.1?}",
            began.elapsed()
        );
        assert_uninstalled(c, ns.name());
        c.until("nodelb-system deleted", Duration::from_secs(120), || {
            gone()?
                .is_empty()
                .then_some(())
                .ok_or("still there".to_string())
        });
        let left = c.kubectl(&["get", "clusterroles,clusterrolebindings", "-o", "name"]);
        assert!(
            !left.as_deref().unwrap_or_default().contains("/nodelb"),
            "helm uninstall left cluster objects: {left:?}"
        );
        assert_no_kubelet_lease_role(c);
    }

    /// The Role and RoleBinding nodelb has in `kube-node-lease` are gone.
    fn assert_no_kubelet_lease_role(c: &RealCluster) {
        let left = c.kubectl(&[
            "-n",
            "kube-node-lease",
            "get",
            "roles,rolebindings",
            "-o",
            "name",
        ]);
        assert!(
            !left.as_deref().unwrap_or_default().contains("/nodelb"),
            "the uninstall left nodelb's rights in kube-node-lease: {left:?}"
        );
    }

    #[test]
    fn uninstall_in_two_commands_removes_the_tables_and_the_statuses() {
        let Some((_turn, c)) =
            RealCluster::get("uninstall_in_two_commands_removes_the_tables_and_the_statuses")
        else {
            return;
        };
        let ns = setup(c, "rc-uninstall", 1, 1, &[("web", 80, "")]);
        if c.is_managed() {
            for (node, _) in c.nodes() {
                c.nft(node, &["list", "table", "ip", "nodelb"])
                    .unwrap_or_else(|e| panic!("node {node} has nodelb's table before: {e}"));
            }
        }
        let began = Instant::now();
        let dir = c
            .kustomization("cleanup", &[])
            .unwrap_or_else(|e| panic!("{e}"));
        let dir = dir.display().to_string();
        c.kubectl(&["apply", "-k", &dir])
            .unwrap_or_else(|e| panic!("{e}"));
        c.kubectl(&[
            "-n",
            "nodelb-system",
            "wait",
            "--for=condition=complete",
            "job/nodelb-clear-status",
            "--timeout=300s",
        ])
        .unwrap_or_else(|e| panic!("{e}"));
        c.kubectl(&[
            "-n",
            "nodelb-system",
            "rollout",
            "status",
            "ds/nodelb-cleanup",
            "--timeout=300s",
        ])
        .unwrap_or_else(|e| panic!("{e}"));
        println!(
            "measured: the uninstall's first command finished in {:.1?}",
            began.elapsed()
        );
        assert_uninstalled(c, ns.name());
        c.kubectl(&["delete", "-k", &dir, "--wait=true", "--timeout=120s"])
            .unwrap_or_else(|e| panic!("{e}"));
        let left = c.kubectl(&["get", "namespace", "nodelb-system", "--ignore-not-found"]);
        assert_eq!(
            left.as_deref(),
            Ok(""),
            "the second command removed nodelb-system"
        );
        assert_no_kubelet_lease_role(c);
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// The addresses of every node but `node`.
    fn all_but(c: &RealCluster, node: &str) -> BTreeSet<String> {
        c.nodes()
            .iter()
            .filter(|(n, _)| n != node)
            .map(|(_, a)| a.to_string())
            .collect()
    }

    /// Waits until every agent pod is ready again (a node that came back gets its agent back).
    fn agents_ready(c: &RealCluster) {
        c.rollout_status(Duration::from_secs(180))
            .unwrap_or_else(|e| panic!("{e}"));
    }

    /// Spreads Deployment `web` over the nodes again (after a drain moved it).
    fn respread(c: &RealCluster, ns: &str) {
        c.kubectl(&["-n", ns, "rollout", "restart", "deploy/web"])
            .unwrap_or_else(|e| panic!("{e}"));
        c.kubectl(&[
            "-n",
            ns,
            "rollout",
            "status",
            "deploy/web",
            "--timeout=180s",
        ])
        .unwrap_or_else(|e| panic!("{e}"));
    }

    /// Puts a node back as the cluster had it (kubelet running, schedulable) when a test ends,
    /// whether it passed or not, so the tests after it find both nodes.
    struct NodeBack(&'static RealCluster, String);

    impl Drop for NodeBack {
        fn drop(&mut self) {
            let (c, node) = (self.0, &self.1);
            let _ = c.cluster_sh(&["kubelet", "start", node]);
            let _ = c.kubectl(&["uncordon", node]);
            let ready = c.kubectl(&[
                "wait",
                "--for=condition=Ready",
                &format!("node/{node}"),
                "--timeout=120s",
            ]);
            if let Err(e) = ready.and_then(|_| c.rollout_status(Duration::from_secs(180))) {
                eprintln!("restoring node {node}: {e}");
            }
        }
    }

    /// Cordon, drain, a stopped kubelet and a deleted Node, each against a `Cluster` Service
    /// (`web`, ports 80-82) and a `Local` one (`local`, 90-92) over the same two pods. Bounds, as
    /// the README documents them:
    /// - cordon: no change (a cordoned node still forwards, as the cloud service controller has
    ///   it since Kubernetes 1.28);
    /// - drain: `Local` loses the node once its last local endpoint stops being ready; `Cluster`
    ///   keeps it;
    /// - kubelet stopped: its agent and rules still serve, so `Cluster` keeps it; `Local` loses
    ///   it once the node lifecycle controller marks its pods not ready (the controller manager's
    ///   `--node-monitor-grace-period`, 20 s on this cluster, 50 s by default, then one sync);
    /// - Node deleted: every Service loses it within one status round.
    #[test]
    fn cordon_drain_a_stopped_kubelet_and_a_deleted_node_reach_the_status() {
        let Some((_turn, c)) =
            RealCluster::get("cordon_drain_a_stopped_kubelet_and_a_deleted_node_reach_the_status")
        else {
            return;
        };
        if !c.is_managed() {
            println!(
                "SKIP cordon/drain/kubelet/node deletion: they need scripts/cluster.sh's nodes"
            );
            return;
        }
        let ns = setup(
            c,
            "rc-nodes",
            2,
            1,
            &[
                ("web", 80, ""),
                ("local", 90, "  externalTrafficPolicy: Local\n"),
            ],
        );
        let ns = ns.name();
        let (node, addr) = c.nodes()[1].clone();
        let _restore = NodeBack(c, node.clone());
        let all = all_nodes(c);
        let rest = all_but(c, &node);
        let both = |want_web: &BTreeSet<String>, want_local: &BTreeSet<String>, bound: Duration| {
            let web = wait_publishing(c, ns, "web", want_web, bound);
            let local = wait_publishing(c, ns, "local", want_local, bound);
            (web, local)
        };

        // Cordon: nothing changes.
        c.kubectl(&["cordon", &node])
            .unwrap_or_else(|e| panic!("{e}"));
        std::thread::sleep(Duration::from_secs(5));
        assert_eq!(
            published(c, ns, "web"),
            all,
            "cordoned {node}: Cluster unchanged"
        );
        assert_eq!(
            published(c, ns, "local"),
            all,
            "cordoned {node}: Local unchanged"
        );
        println!("measured: cordon of {node}: statuses unchanged after 5 s");

        // Drain: Local loses the node with its last local endpoint.
        let drained = Instant::now();
        c.kubectl(&[
            "drain",
            &node,
            "--ignore-daemonsets",
            "--delete-emptydir-data",
            "--timeout=180s",
        ])
        .unwrap_or_else(|e| panic!("{e}"));
        let (_, local) = both(&all, &rest, Duration::from_secs(60));
        println!(
            "measured: drain of {node}: Local dropped it {:.1?} after the drain began (drain took \
             {:.1?}); Cluster kept it",
            drained.elapsed() - local.min(drained.elapsed()),
            drained.elapsed()
        );
        assert_eq!(
            published(c, ns, "web"),
            all,
            "drained {node}: Cluster keeps it"
        );
        c.kubectl(&["uncordon", &node])
            .unwrap_or_else(|e| panic!("{e}"));
        respread(c, ns);
        let (_, back) = both(&all, &all, Duration::from_secs(60));
        println!(
            "measured: uncordon of {node} and a respread: Local back {back:.1?} after the rollout"
        );

        // A stopped kubelet: the node's agent and rules still serve.
        let watch_web = StatusWatch::start(c, ns, "web");
        let stopped = Instant::now();
        c.cluster_sh(&["kubelet", "stop", &node])
            .unwrap_or_else(|e| panic!("{e}"));
        let (_, local) = c.until(
            &format!("Local Service dropping {node} after its kubelet stopped"),
            Duration::from_secs(120),
            || {
                let got = published(c, ns, "local");
                (got == rest).then_some(()).ok_or(format!("{got:?}"))
            },
        );
        println!("measured: kubelet of {node} stopped: Local dropped it after {local:.1?}");
        let through = c.tcp_request(SocketAddr::new(addr, 80));
        assert!(
            matches!(through, Outcome::Answered(_)),
            "with its kubelet stopped {node} still forwards Cluster traffic: {through:?}"
        );
        let restarted = Instant::now();
        c.cluster_sh(&["kubelet", "start", &node])
            .unwrap_or_else(|e| panic!("{e}"));
        let (_, local) = both(&all, &all, Duration::from_secs(120));
        println!("measured: kubelet of {node} started again: Local back after {local:.1?}");
        let versions = watch_web.stop();
        assert!(
            versions.iter().all(|(_, ips)| ips == &all),
            "the Cluster Service kept {node} throughout ({:.1?}): {versions:?}",
            stopped.elapsed() - restarted.elapsed()
        );

        // A deleted Node: every Service loses it.
        c.cluster_sh(&["kubelet", "stop", &node])
            .unwrap_or_else(|e| panic!("{e}"));
        let deleted = Instant::now();
        c.kubectl(&["delete", "node", &node, "--wait=true"])
            .unwrap_or_else(|e| panic!("{e}"));
        let (web, local) = both(&rest, &rest, Duration::from_secs(30));
        println!(
            "measured: Node {node} deleted: Cluster dropped it after {web:.1?}, Local after \
             {:.1?} (from the delete)",
            deleted.elapsed().min(web + local)
        );
        c.cluster_sh(&["kubelet", "start", &node])
            .unwrap_or_else(|e| panic!("{e}"));
        c.until(
            &format!("Node {node} registered and Ready again"),
            Duration::from_secs(120),
            || {
                c.kubectl(&[
                    "get",
                    "node",
                    &node,
                    "-o",
                    "jsonpath={.status.conditions[?(@.type==\"Ready\")].status}",
                ])
                .and_then(|s| (s == "True").then_some(()).ok_or(s))
            },
        );
        agents_ready(c);
        respread(c, ns);
        let (web, local) = both(&all, &all, Duration::from_secs(120));
        println!(
            "measured: {node} registered again: Cluster back after {web:.1?}, Local {local:.1?}"
        );
    }

    /// The agent process of `node` (`nodelb-agent run` with `NODE_NAME=<node>`), found in
    /// `/proc`: the cluster's nodes share the machine's process namespace.
    fn agent_pid(node: &str) -> nix::unistd::Pid {
        let env = format!("NODE_NAME={node}");
        let found: Vec<i32> = std::fs::read_dir("/proc")
            .expect("/proc")
            .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<i32>().ok())
            .filter(|pid| {
                let read = |f: &str| std::fs::read(format!("/proc/{pid}/{f}")).unwrap_or_default();
                let fields = |b: Vec<u8>| -> Vec<String> {
                    b.split(|c| *c == 0)
                        .map(|f| String::from_utf8_lossy(f).into_owned())
                        .collect()
                };
                let cmdline = fields(read("cmdline"));
                cmdline.first().is_some_and(|c| c.ends_with("nodelb-agent"))
                    && cmdline.get(1).is_some_and(|a| a == "run")
                    && fields(read("environ")).contains(&env)
            })
            .collect();
        assert_eq!(found.len(), 1, "one agent process on {node}: {found:?}");
        nix::unistd::Pid::from_raw(found[0])
    }

    /// Sends SIGCONT to a stopped agent when the test ends, whether it passed or not.
    struct Resume(nix::unistd::Pid);

    impl Drop for Resume {
        fn drop(&mut self) {
            let _ = nix::sys::signal::kill(self.0, nix::sys::signal::Signal::SIGCONT);
        }
    }

    /// The node whose agent does not hold the status Lease.
    fn follower(c: &RealCluster) -> String {
        let leader = c
            .kubectl(&[
                "-n",
                "nodelb-system",
                "get",
                "lease",
                "nodelb-status",
                "-o",
                "jsonpath={.spec.holderIdentity}",
            ])
            .unwrap_or_else(|e| panic!("{e}"));
        let pods = c.agent_pods().unwrap_or_else(|e| panic!("{e}"));
        pods.into_iter()
            .find(|(pod, _)| *pod != leader)
            .map(|(_, node)| node)
            .unwrap_or_else(|| panic!("an agent besides the leader {leader}"))
    }

    /// The writes of nodelb's ServiceAccount among kube-apiserver's audit records, counted by
    /// verb, resource and object.
    fn nodelb_writes(
        records: &[nodelb_integration::control_plane::AuditRecord],
    ) -> std::collections::BTreeMap<(String, String, String), usize> {
        let mut out = std::collections::BTreeMap::new();
        for r in records {
            if r.user != "system:serviceaccount:nodelb-system:nodelb" {
                continue;
            }
            let o = r.object.clone().unwrap_or_default();
            let resource = format!(
                "{}{}",
                o.resource,
                if o.subresource.is_empty() {
                    String::new()
                } else {
                    format!("/{}", o.subresource)
                }
            );
            *out.entry((
                r.verb.clone(),
                resource,
                format!("{}/{}", o.namespace, o.name),
            ))
            .or_default() += 1;
        }
        out
    }

    /// Issue 30's write budget and liveness, with the manifests' DaemonSet. Agents in Pods
    /// write nothing at steady state: over 60 s, kube-apiserver's audit log holds no heartbeat
    /// write, no status and no Event of theirs, only the status leader's election renewals.
    /// Their liveness comes from the Pods' Ready condition and the kubelets' node Leases: a
    /// hung agent (SIGSTOP) turns unready and leaves the status within `--node-lease-duration`
    /// (15 s); a node whose kubelet and agent both stop leaves it within 15 s of its
    /// last renewal, plus one 2 s look (as a renewing agent's node does). A stopped kubelet
    /// alone changes nothing (`cordon_drain_a_stopped_kubelet_and_a_deleted_node_reach_the_status`).
    #[test]
    fn agents_in_pods_write_nothing_at_steady_state_and_a_hung_agent_or_a_dead_node_leaves_the_status(
    ) {
        let Some((_turn, c)) = RealCluster::get(
            "agents_in_pods_write_nothing_at_steady_state_and_a_hung_agent_or_a_dead_node_leaves_the_status",
        ) else {
            return;
        };
        if !c.is_managed() {
            println!("SKIP steady-state writes and liveness: they need scripts/cluster.sh's nodes and audit log");
            return;
        }
        let ns = setup(c, "rc-budget", 2, 1, &[("web", 80, "")]);
        let ns = ns.name();
        for (node, _) in c.nodes() {
            let liveness = c
                .kubectl(&[
                    "-n",
                    "nodelb-system",
                    "get",
                    "lease",
                    &format!("nodelb-node-{node}"),
                    "-o",
                    "jsonpath={.metadata.annotations.nodelb\\.io/liveness}",
                ])
                .unwrap_or_else(|e| panic!("{e}"));
            assert_eq!(liveness, "Pod", "{node}'s agent says it lives by its Pod");
        }

        // Steady state: nothing changes for a minute. It begins once the agents' start is
        // over: an agent renews its Lease until it has been ready for a lease duration (15 s),
        // the time the kubelet takes to probe its Pod ready.
        std::thread::sleep(Duration::from_secs(20));
        let before = c
            .audit_writes()
            .expect("the managed cluster's audit log")
            .len();
        let window = Duration::from_secs(60);
        std::thread::sleep(window);
        let records = c.audit_writes().expect("the managed cluster's audit log");
        let writes = nodelb_writes(&records[before..]);
        for ((verb, resource, object), n) in &writes {
            println!("audit: nodelb wrote {n} x {verb} {resource} {object}");
        }
        let count = |f: &dyn Fn(&str) -> bool| -> usize {
            writes
                .iter()
                .filter(|((_, _, o), _)| f(o))
                .map(|(_, n)| n)
                .sum()
        };
        let heartbeats = count(&|o| o.starts_with("nodelb-system/nodelb-node-"));
        let election = count(&|o| o == "nodelb-system/nodelb-status");
        let other = count(&|_| true) - heartbeats - election;
        let nodes = c.nodes().len();
        println!(
            "measured: in {window:?} at steady state on {nodes} nodes, nodelb wrote {heartbeats} \
             heartbeat Leases ({:.2} per node per minute), {election} election renewals (one \
             Lease for the cluster) and {other} other objects",
            heartbeats as f64 / nodes as f64 * 60.0 / window.as_secs_f64()
        );
        assert_eq!(
            heartbeats, 0,
            "agents in Pods write no heartbeat at steady state"
        );
        assert_eq!(other, 0, "no status or Event at steady state");
        assert!(
            election <= (window.as_secs() / 2 + 1) as usize,
            "the leader renews its Lease every --retry-period (2 s): {election}"
        );

        // A hung agent: its Pod turns unready, its node leaves the status.
        let node = follower(c);
        let rest = all_but(c, &node);
        let all = all_nodes(c);
        let pid = agent_pid(&node);
        let resume = Resume(pid);
        nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGSTOP).expect("SIGSTOP");
        let took = wait_publishing(c, ns, "web", &rest, Duration::from_secs(40));
        println!(
            "measured: agent on {node} stopped (SIGSTOP): {node} left the status after {took:.1?}"
        );
        assert!(
            took < Duration::from_secs(15),
            "a hung agent's node leaves within 15 s: {took:?}"
        );
        drop(resume);
        let back = wait_publishing(c, ns, "web", &all, Duration::from_secs(60));
        println!(
            "measured: agent on {node} resumed (SIGCONT): back in the status after {back:.1?}"
        );

        // A dead node: kubelet and agent both stop.
        let _restore = NodeBack(c, node.clone());
        let resume = Resume(pid);
        c.cluster_sh(&["kubelet", "stop", &node])
            .unwrap_or_else(|e| panic!("{e}"));
        nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGSTOP).expect("SIGSTOP");
        let took = wait_publishing(c, ns, "web", &rest, Duration::from_secs(40));
        println!(
            "measured: kubelet and agent on {node} stopped: {node} left the status after {took:.1?}"
        );
        assert!(
            took < Duration::from_secs(15 + 2 + 1),
            "a dead node leaves within 15 s of its last renewal and one look: {took:?}"
        );
        drop(resume);
    }

    #[test]
    fn kube_proxy_in_iptables_mode_beside_nodelb() {
        let Some((_turn, c)) = RealCluster::get("kube_proxy_in_iptables_mode_beside_nodelb") else {
            return;
        };
        if !c.is_managed() {
            println!("SKIP kube-proxy's mode: switching it needs scripts/cluster.sh's nodes");
            return;
        }
        c.cluster_sh(&["kube-proxy-mode", "iptables"])
            .unwrap_or_else(|e| panic!("{e}"));
        let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            let ns = setup(c, "rc-iptables", 2, 1, &[("web", 80, "")]);
            let backends = pods(c, ns.name(), "web");
            for (node, addr) in c.nodes() {
                c.until(
                    &format!("kube-proxy's iptables rules on {node}"),
                    Duration::from_secs(30),
                    || {
                        let t = c.nft(node, &["list", "table", "ip", "nat"])?;
                        t.contains("KUBE-SERVICES").then_some(()).ok_or(t)
                    },
                );
                assert!(
                    c.nft(node, &["list", "table", "ip", "kube-proxy"]).is_err(),
                    "kube-proxy removed its nftables table on {node}"
                );
                let (answered, failed) = spread(c, SocketAddr::new(*addr, 80), 30);
                println!(
                    "measured: kube-proxy in iptables mode, through {node}: pods {answered:?}, \
                     failed {}",
                    failed.len()
                );
                assert!(failed.is_empty(), "through {node}: {failed:?}");
                assert_eq!(answered, backends, "through {node}");
            }
        }));
        c.cluster_sh(&["kube-proxy-mode", "nftables"])
            .unwrap_or_else(|e| panic!("{e}"));
        if let Err(p) = result {
            std::panic::resume_unwind(p);
        }
    }

    /// `trafficDistribution: PreferClose` with the zone hints the EndpointSlice controller
    /// writes (node-a is zone-a, node-b zone-b; one pod on each): traffic entering a node
    /// reaches only the pod of its zone.
    #[test]
    fn prefer_close_keeps_traffic_in_the_zone_it_entered() {
        let Some((_turn, c)) =
            RealCluster::get("prefer_close_keeps_traffic_in_the_zone_it_entered")
        else {
            return;
        };
        let zones = c
            .kubectl(&[
                "get",
                "nodes",
                "-o",
                "jsonpath={range .items[*]}{.metadata.name}={.metadata.labels.topology\\.kubernetes\\.io/zone}{\"\\n\"}{end}",
            ])
            .unwrap_or_else(|e| panic!("{e}"));
        let zone_of: std::collections::BTreeMap<&str, &str> =
            zones.lines().filter_map(|l| l.split_once('=')).collect();
        let distinct: BTreeSet<&&str> = zone_of.values().filter(|z| !z.is_empty()).collect();
        if distinct.len() < 2 {
            println!("SKIP topology: the nodes carry fewer than two zones: {zone_of:?}");
            return;
        }
        let ns = setup(
            c,
            "rc-topology",
            2,
            1,
            &[("web", 80, "  trafficDistribution: PreferClose\n")],
        );
        let (_, hinted) = c.until("zone hints on every endpoint", Duration::from_secs(60), || {
            let out = c.kubectl(&[
                "-n",
                ns.name(),
                "get",
                "endpointslices",
                "-l",
                "kubernetes.io/service-name=web",
                "-o",
                "jsonpath={range .items[*].endpoints[*]}{.targetRef.name} {.zone} {.hints.forZones[*].name}{\"\\n\"}{end}",
            ])?;
            let lines: Vec<&str> = out.lines().collect();
            let complete = lines.len() == 2
                && lines.iter().all(|l| l.split_whitespace().count() == 3);
            complete.then_some(out.clone()).ok_or(out)
        });
        println!("measured: the controller's hints were there after {hinted:.1?}");
        let pod_zone: std::collections::BTreeMap<String, String> = c
            .kubectl(&[
                "-n",
                ns.name(),
                "get",
                "endpointslices",
                "-l",
                "kubernetes.io/service-name=web",
                "-o",
                "jsonpath={range .items[*].endpoints[*]}{.targetRef.name} {.hints.forZones[*].name}{\"\\n\"}{end}",
            ])
            .unwrap_or_else(|e| panic!("{e}"))
            .lines()
            .filter_map(|l| l.split_once(' '))
            .map(|(p, z)| (p.to_string(), z.to_string()))
            .collect();
        println!("endpoint hints: {pod_zone:?}");
        for (node, addr) in c.nodes() {
            let zone = zone_of.get(node.as_str()).copied().unwrap_or_default();
            let (answered, failed) = spread(c, SocketAddr::new(*addr, 80), 30);
            println!(
                "measured: entering {node} ({zone}): pods {answered:?}, failed {}",
                failed.len()
            );
            assert!(failed.is_empty(), "through {node}: {failed:?}");
            let want: BTreeSet<String> = pod_zone
                .iter()
                .filter(|(_, z)| z.as_str() == zone)
                .map(|(p, _)| p.clone())
                .collect();
            assert_eq!(answered, want, "traffic entering {node} stays in {zone}");
        }
    }

    /// 10 minutes of heavy status churn: no healthy node dropped. 1,000 simulated nodes
    /// (kwok, `scripts/cluster.sh kwok up`) beside the real two, nodelb's real agent on node-a
    /// leading, 10,000 Services each served by the real nodes and one pool of 10 simulated
    /// ones; for 10 minutes node-a's published address changes every 40 s (every status is
    /// rewritten) and node-b's agent Pod is deleted every 60 s. No status version may drop a
    /// node that was alive: a real node, or a simulated one whose Lease renewals came in time
    /// (`nodelb_integration::kwok`). Prints the kwok bench's row and figures too.
    #[test]
    fn ten_minutes_of_heavy_status_churn_over_a_thousand_simulated_nodes_drop_no_healthy_node() {
        let Some((_turn, c)) = RealCluster::get(
            "ten_minutes_of_heavy_status_churn_over_a_thousand_simulated_nodes_drop_no_healthy_node",
        ) else {
            return;
        };
        if !c.is_managed() {
            println!("SKIP simulated nodes: kwok runs beside scripts/cluster.sh's control plane");
            return;
        }
        let scenario = nodelb_integration::kwok::Scenario::from_env(1000, Duration::from_secs(600))
            .unwrap_or_else(|e| panic!("{e}"));
        let report = nodelb_integration::kwok::run(c, &scenario).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(
            report.false_removals,
            0,
            "status versions dropped nodes that were alive: {}",
            report.row()
        );
    }
}
