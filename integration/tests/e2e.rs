//! End-to-end: the real `nodelb-agent` binary in a node namespace, talking to a real
//! kube-apiserver with etcd that the harness starts in a control-plane namespace (RBAC from
//! `manifests/`, the agent's Pod-bound ServiceAccount token) or, with `NODELB_E2E_KUBECONFIG`,
//! to an existing cluster; Services and EndpointSlices are written through
//! the API and real TCP connections go from client namespaces through the node to backend
//! namespaces. See `nodelb_integration::e2e` for the network.
//!
//! Assertions are on signals — answered (by which backend, seeing which source), refused (TCP
//! reset), timed out (silence) — with generous polling bounds for a change to take effect,
//! never on how fast it happened.
//!
//! Run as root: `cargo test -p nodelb-integration --test e2e` (the test builds the agent binary
//! first when run under cargo; see `e2e::agent_binary`).

use std::collections::BTreeSet;
use std::io::Read;
use std::net::{IpAddr, SocketAddr, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use nix::sys::signal::Signal;
use nodelb_integration::e2e::{http_get, metric_sum, wait_for, Cluster, ClusterOptions};
use nodelb_integration::netns::{require_root, Netns};
use nodelb_integration::nft::nft_f;
use nodelb_integration::traffic::{tcp_request, tcp_server, Outcome, Server};
use serde_json::json;

/// The port every backend listens on (the slices' target port).
const BACKEND_PORT: u16 = 8080;
/// How long a change may take to show in the dataplane.
const CHANGE: Duration = Duration::from_secs(10);
/// Deadline of one request expected to be answered or refused.
const ANSWER: Duration = Duration::from_secs(2);
/// Deadline of one request expected to get nothing back.
const SILENCE: Duration = Duration::from_secs(1);

// ---- objects ---------------------------------------------------------------------------------

/// A LoadBalancer Service with one TCP port named `tcp`; `spec_extra` lines are appended to
/// the spec (two-space indent), `meta_extra` to the metadata flow map.
fn service(name: &str, port: u32, spec_extra: &str) -> String {
    format!(
        "apiVersion: v1\nkind: Service\nmetadata: {{name: {name}}}\nspec:\n  type: LoadBalancer\n  ports: [{{name: tcp, port: {port}, protocol: TCP}}]\n{spec_extra}"
    )
}

/// An IPv4 EndpointSlice `<svc>-<suffix>` of Service `svc`, port `tcp` → `BACKEND_PORT`, one
/// endpoint per backend index, on the backend's node.
fn slice(c: &Cluster, svc: &str, suffix: &str, backends: &[usize]) -> String {
    slice_on(
        svc,
        suffix,
        "IPv4",
        &backends
            .iter()
            .map(|j| {
                (
                    c.backend_v4(*j).to_string(),
                    c.node_name(c.backend_node(*j)).to_string(),
                )
            })
            .collect::<Vec<_>>(),
    )
}

/// An IPv6 EndpointSlice like [`slice`].
fn slice6(c: &Cluster, svc: &str, suffix: &str, backends: &[usize]) -> String {
    slice_on(
        svc,
        suffix,
        "IPv6",
        &backends
            .iter()
            .map(|j| {
                (
                    c.backend_v6(*j).to_string(),
                    c.node_name(c.backend_node(*j)).to_string(),
                )
            })
            .collect::<Vec<_>>(),
    )
}

/// An EndpointSlice with `(address, nodeName)` endpoints.
fn slice_on(svc: &str, suffix: &str, family: &str, endpoints: &[(String, String)]) -> String {
    let eps: Vec<serde_json::Value> = endpoints
        .iter()
        .map(|(a, n)| json!({"addresses": [a], "nodeName": n, "conditions": {"ready": true}}))
        .collect();
    json!({
        "apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
        "metadata": {"name": format!("{svc}-{suffix}"),
                     "labels": {"kubernetes.io/service-name": svc}},
        "addressType": family,
        "ports": [{"name": "tcp", "port": BACKEND_PORT, "protocol": "TCP"}],
        "endpoints": eps,
    })
    .to_string()
}

/// A LoadBalancer Service with one UDP port named `udp`.
fn udp_service(name: &str, port: u32) -> String {
    format!(
        "apiVersion: v1\nkind: Service\nmetadata: {{name: {name}}}\nspec:\n  type: LoadBalancer\n  ports: [{{name: udp, port: {port}, protocol: UDP}}]\n"
    )
}

/// An IPv4 EndpointSlice `<svc>-1` of Service `svc`, port `udp` → `BACKEND_PORT`, on backend
/// `j`.
fn udp_slice(c: &Cluster, svc: &str, j: usize) -> String {
    json!({
        "apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
        "metadata": {"name": format!("{svc}-1"),
                     "labels": {"kubernetes.io/service-name": svc}},
        "addressType": "IPv4",
        "ports": [{"name": "udp", "port": BACKEND_PORT, "protocol": "UDP"}],
        "endpoints": [{"addresses": [c.backend_v4(j).to_string()],
                       "nodeName": c.node_name(c.backend_node(j)),
                       "conditions": {"ready": true}}],
    })
    .to_string()
}

/// A Service's stored ingress addresses.
fn ips(c: &Cluster, name: &str) -> Vec<String> {
    let api: kube::Api<k8s_openapi::api::core::v1::Service> =
        kube::Api::namespaced(c.admin().clone(), c.namespace());
    let svc = c
        .block_on(api.get(name))
        .unwrap_or_else(|e| panic!("reading Service {name}: {e}"));
    nodelb_integration::e2e::ingress_ips(&svc)
}

// ---- traffic -----------------------------------------------------------------------------------

/// A TCP server `b<j>` on every backend's `BACKEND_PORT` (IPv4, and IPv6 when `v6`).
fn start_backends(c: &Cluster, v6: bool) -> Vec<Server> {
    let mut servers = Vec::new();
    for j in 0..c.backend_count() {
        let name = format!("b{j}");
        servers.push(tcp_server(
            c.backend(j),
            SocketAddr::new(c.backend_v4(j).into(), BACKEND_PORT),
            &name,
        ));
        if v6 {
            servers.push(tcp_server(
                c.backend(j),
                SocketAddr::new(c.backend_v6(j).into(), BACKEND_PORT),
                &name,
            ));
        }
    }
    servers
}

/// `(backend name, source address it saw)` of an answer, or the outcome as an error.
fn answer(out: &Outcome) -> Result<(String, IpAddr), String> {
    match out {
        Outcome::Answered(line) => {
            let (name, peer) = line
                .split_once(' ')
                .ok_or_else(|| format!("malformed reply {line:?}"))?;
            let peer = peer
                .parse()
                .map_err(|e| format!("bad peer in {line:?}: {e}"))?;
            Ok((name.to_string(), peer))
        }
        other => Err(format!("{other:?}")),
    }
}

/// Waits until a request from `ns` to `dst` is answered by `backend`; returns the source the
/// backend saw.
fn wait_answer_from(c: &Cluster, ns: &Netns, dst: SocketAddr, backend: &str) -> IpAddr {
    let what = format!("{dst} answered by {backend} from {}", ns.name());
    wait_with_ruleset(c, &what, || {
        let out = tcp_request(ns, dst, ANSWER);
        match answer(&out)? {
            (name, peer) if name == backend => Ok(peer),
            (name, _) => Err(format!("answered by {name}")),
        }
    })
}

/// Waits until a request from `ns` to `dst` is refused (TCP reset).
fn wait_refused(c: &Cluster, ns: &Netns, dst: SocketAddr) {
    let what = format!("{dst} refused from {}", ns.name());
    wait_with_ruleset(c, &what, || match tcp_request(ns, dst, ANSWER) {
        Outcome::Refused { .. } => Ok(()),
        other => Err(format!("{other:?}")),
    });
}

/// Waits until a request from `ns` to `dst` gets no answer at all within `SILENCE` (a drop,
/// not a reset); `what` names the rule.
fn wait_silence(c: &Cluster, ns: &Netns, dst: SocketAddr, what: &str) {
    wait_with_ruleset(c, what, || match tcp_request(ns, dst, SILENCE) {
        Outcome::TimedOut => Ok(()),
        other => Err(format!("{other:?}")),
    });
}

/// [`wait_for`] over `CHANGE`, printing node 0's ruleset when it gives up.
fn wait_with_ruleset<T>(c: &Cluster, what: &str, f: impl FnMut() -> Result<T, String>) -> T {
    let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| wait_for(what, CHANGE, f)));
    match r {
        Ok(v) => v,
        Err(p) => {
            eprintln!(
                "ruleset of node 0 when `{what}` failed:\n{}",
                c.node_ns(0).sh_ok("nft list ruleset").unwrap_or_default()
            );
            std::panic::resume_unwind(p)
        }
    }
}

fn v4(c: &Cluster, port: u16) -> SocketAddr {
    SocketAddr::new(c.node_v4(0).into(), port)
}

fn v6(c: &Cluster, port: u16) -> SocketAddr {
    SocketAddr::new(c.node_v6(0).into(), port)
}

/// The comment nodelb puts on a Service port's rules and elements.
fn tag(c: &Cluster, svc: &str, port: &str) -> String {
    format!("{}/{svc}:{port}", c.namespace())
}

/// Waits until `ip nodelb` on node 0 does (or does not) mention `needle`.
fn wait_table(c: &Cluster, family: &str, needle: &str, present: bool) {
    wait_for(
        &format!(
            "`{needle}` {} in table {family} nodelb",
            if present { "present" } else { "absent" }
        ),
        CHANGE,
        || {
            let table = c.nft_table(0, family).unwrap_or_default();
            if table.contains(needle) == present {
                Ok(())
            } else {
                Err(table)
            }
        },
    )
}

fn start(options: ClusterOptions) -> Cluster {
    Cluster::start(options)
}

// ---- tests -------------------------------------------------------------------------------------

/// A Service and its endpoints through their life: created → answered; endpoints added and
/// removed → traffic follows; no endpoints → reset; deleted or turned into ClusterIP → reset
/// and its rules gone. Ends with the RBAC check: the agent, as its ServiceAccount, was never
/// refused.
#[test]
fn services_and_endpoints_follow_the_api() {
    if !require_root("services_and_endpoints_follow_the_api") {
        return;
    }
    let c = start(ClusterOptions::default());
    let _servers = start_backends(&c, false);

    // Created: the client reaches b0 through the node address, masqueraded (Cluster policy).
    c.apply(&service("web", 8001, ""));
    c.apply(&slice(&c, "web", "1", &[0]));
    let seen = wait_answer_from(&c, c.client(), v4(&c, 8001), "b0");
    assert_eq!(
        seen,
        IpAddr::from([198, 51, 100, 1]),
        "Cluster policy masquerades to the node's address toward b0"
    );

    // An endpoint added: b1 answers too.
    c.apply(&slice(&c, "web", "1", &[0, 1]));
    wait_answer_from(&c, c.client(), v4(&c, 8001), "b1");

    // b0 removed: once only b1 answers, b0 never does again.
    c.apply(&slice(&c, "web", "1", &[1]));
    wait_with_ruleset(&c, "only b1 answers web", || {
        let backends: BTreeSet<String> = (0..20)
            .map(|_| answer(&tcp_request(c.client(), v4(&c, 8001), ANSWER)).map(|a| a.0))
            .collect::<Result<_, _>>()?;
        if backends == BTreeSet::from(["b1".to_string()]) {
            Ok(())
        } else {
            Err(format!("answered by {backends:?}"))
        }
    });
    for _ in 0..30 {
        let (name, _) = answer(&tcp_request(c.client(), v4(&c, 8001), ANSWER)).unwrap();
        assert_eq!(name, "b1", "a removed endpoint answered");
    }

    // No endpoints at all: reset, not silence.
    c.apply(&service("empty", 8002, ""));
    c.apply(&slice(&c, "empty", "1", &[]));
    wait_table(&c, "ip", &tag(&c, "empty", "tcp"), true);
    match tcp_request(c.client(), v4(&c, 8002), ANSWER) {
        Outcome::Refused { .. } => {}
        other => panic!("a Service without endpoints must reset, got {other:?}"),
    }

    // Deleted: its rules go, and the port is the node's own again (nothing listens: reset).
    c.delete("Service", "web");
    wait_table(&c, "ip", &tag(&c, "web", "tcp"), false);
    wait_refused(&c, c.client(), v4(&c, 8001));

    // Turned into ClusterIP: no longer nodelb's.
    c.apply(&service("flip", 8003, ""));
    c.apply(&slice(&c, "flip", "1", &[2]));
    wait_answer_from(&c, c.client(), v4(&c, 8003), "b2");
    c.apply(&service("flip", 8003, "").replace("LoadBalancer", "ClusterIP"));
    wait_table(&c, "ip", &tag(&c, "flip", "tcp"), false);
    wait_refused(&c, c.client(), v4(&c, 8003));

    assert!(c.readyz(0).is_ok_and(|(code, _)| code == 200));
    // Each of those changes was timed from its watch event to the kernel.
    let timed = metric_sum(&c.metrics(0), "nodelb_event_to_kernel_seconds_count");
    assert!(timed >= 5.0, "event-to-kernel observations: {timed}");
    c.assert_agents_authorized();
}

/// A periodic resync that reads the tables back as committed sends nothing: no nftables
/// transaction by the agent over several resync intervals, each resync counted `unchanged`.
#[test]
fn a_resync_of_unchanged_tables_sends_nothing() {
    if !require_root("a_resync_of_unchanged_tables_sends_nothing") {
        return;
    }
    let resync = Duration::from_millis(500);
    let c = start(ClusterOptions {
        resync_interval: resync,
        ..ClusterOptions::default()
    });
    let _servers = start_backends(&c, false);
    c.apply(&service("web", 8012, ""));
    c.apply(&slice(&c, "web", "1", &[0]));
    wait_answer_from(&c, c.client(), v4(&c, 8012), "b0");
    let resyncs = |c: &Cluster| {
        let text = c.metrics(0);
        text.lines()
            .filter(|l| l.starts_with("nodelb_resyncs_total{result=\"unchanged\"}"))
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .sum::<f64>()
    };
    let before = resyncs(&c);
    // Every transaction another process (the agent) commits on nodelb's tables, for a while.
    let window = 8 * resync;
    let changes = c.node_ns(0).run(|| {
        let tables = vec![
            nodelb_netfilter::TableRef {
                family: nodelb_netfilter::Family::Ip,
                name: "nodelb".into(),
            },
            nodelb_netfilter::TableRef {
                family: nodelb_netfilter::Family::Ip6,
                name: "nodelb".into(),
            },
        ];
        let mut w = nodelb_netfilter::Watcher::open(tables).expect("watching nftables events");
        let deadline = Instant::now() + window;
        let mut seen = Vec::new();
        while let Some(left) = deadline.checked_duration_since(Instant::now()) {
            if let Some(ev) = w.next(left).expect("reading nftables events") {
                seen.push(format!("{ev:?}"));
            }
        }
        seen
    });
    let after = resyncs(&c);
    assert!(
        after - before >= 4.0,
        "the agent resynced every {resync:?}: {before} -> {after} unchanged resyncs in {window:?}"
    );
    assert!(
        changes.is_empty(),
        "resyncs of unchanged tables sent transactions: {changes:?}"
    );
    // Still answering: the resyncs left the rules in place.
    wait_answer_from(&c, c.client(), v4(&c, 8012), "b0");
}

/// Another process changing nodelb's table (drift) is noticed through the nftables event
/// watch and repaired by a full replace — and so is the next change after that repair (the
/// watch is paused around the agent's own replace and must listen again).
#[test]
fn drift_is_repaired_each_time_another_process_changes_the_table() {
    if !require_root("drift_is_repaired_each_time_another_process_changes_the_table") {
        return;
    }
    let c = start(ClusterOptions::default());
    let _servers = start_backends(&c, false);
    c.apply(&service("web", 8011, ""));
    c.apply(&slice(&c, "web", "1", &[0]));
    wait_answer_from(&c, c.client(), v4(&c, 8011), "b0");
    for round in 1..=2 {
        // The dispatch to Service ports gone: the node's own port answers (reset) until the
        // agent puts it back.
        nft_f(c.node_ns(0), "flush chain ip nodelb prerouting").unwrap();
        wait_for(&format!("drift repair {round}"), CHANGE, || {
            match metric_sum(&c.metrics(0), "nodelb_drift_repairs_total") as usize {
                n if n >= round => Ok(()),
                n => Err(format!("{n} repairs")),
            }
        });
        wait_answer_from(&c, c.client(), v4(&c, 8011), "b0");
    }
    assert!(
        c.agent_log(0)
            .contains("repaired drift with a full replace"),
        "the repair is logged"
    );
}

/// externalTrafficPolicy Local (keeps the client's address; drops when the endpoint is on
/// another node), hairpin and node-local clients, loadBalancerSourceRanges, and a port
/// conflict won by the older Service.
#[test]
fn policies_source_ranges_hairpin_and_conflicts() {
    if !require_root("policies_source_ranges_hairpin_and_conflicts") {
        return;
    }
    let c = start(ClusterOptions::default());
    let _servers = start_backends(&c, false);
    let other_node = format!("{}node-z", c.node_prefix());

    // Local with a local endpoint: the backend sees the client's own address.
    c.apply(&service("local", 8011, "  externalTrafficPolicy: Local\n"));
    c.apply(&slice(&c, "local", "1", &[1]));
    let seen = wait_answer_from(&c, c.client(), v4(&c, 8011), "b1");
    assert_eq!(
        seen,
        IpAddr::from(c.client_v4(0)),
        "Local keeps the client's address"
    );

    // Local with the only endpoint on another node: this node drops (silence, not reset).
    c.apply(&service("remote", 8012, "  externalTrafficPolicy: Local\n"));
    c.apply(&slice_on(
        "remote",
        "1",
        "IPv4",
        &[(c.backend_v4(2).to_string(), other_node.clone())],
    ));
    // (The Service may be synced before its slice: rejecting, until the slice makes it drop.)
    wait_table(&c, "ip", &tag(&c, "remote", "tcp"), true);
    wait_silence(
        &c,
        c.client(),
        v4(&c, 8012),
        "Local without a local endpoint drops",
    );
    // The same endpoint under Cluster policy answers: the silence above is the policy.
    c.apply(&service(
        "remote",
        8012,
        "  externalTrafficPolicy: Cluster\n",
    ));
    wait_answer_from(&c, c.client(), v4(&c, 8012), "b2");

    // Hairpin: b0 reaches a Service whose endpoint is b0 itself; a client inside the node too.
    c.apply(&service("hairpin", 8013, ""));
    c.apply(&slice(&c, "hairpin", "1", &[0]));
    wait_answer_from(&c, c.backend(0), v4(&c, 8013), "b0");
    wait_answer_from(&c, c.node_ns(0), v4(&c, 8013), "b0");
    // The stranger reaches an unrestricted Service (so the drop below is the source range).
    wait_answer_from(&c, c.stranger(), v4(&c, 8013), "b0");

    // loadBalancerSourceRanges: the client is allowed, the stranger is not.
    c.apply(&service(
        "ranges",
        8014,
        &format!("  loadBalancerSourceRanges: [\"{}/32\"]\n", c.client_v4(0)),
    ));
    c.apply(&slice(&c, "ranges", "1", &[0]));
    wait_answer_from(&c, c.client(), v4(&c, 8014), "b0");
    for _ in 0..3 {
        let out = tcp_request(c.stranger(), v4(&c, 8014), SILENCE);
        assert!(
            answer(&out).is_err(),
            "a source outside loadBalancerSourceRanges got an answer: {out:?}"
        );
    }

    // Port conflict on 8015: the older Service wins.
    let older = "  ports: [{name: tcp, port: 8015, protocol: TCP}]\n";
    let svc = |name: &str, created: &str| {
        format!(
            "apiVersion: v1\nkind: Service\nmetadata: {{name: {name}, creationTimestamp: \"{created}\"}}\nspec:\n  type: LoadBalancer\n{older}"
        )
    };
    // kube-apiserver sets creationTimestamp itself (to the second), whatever the client
    // sends: the older one is the one created first, a second apart.
    c.apply(&svc("older", "2020-01-01T00:00:00Z"));
    std::thread::sleep(Duration::from_millis(1500));
    c.apply(&svc("newer", "2021-01-01T00:00:00Z"));
    c.apply(&slice(&c, "newer", "1", &[1]));
    c.apply(&slice(&c, "older", "1", &[0]));
    wait_answer_from(&c, c.client(), v4(&c, 8015), "b0");
    wait_table(&c, "ip", &tag(&c, "older", "tcp"), true);
    let table = c.nft_table(0, "ip").unwrap();
    assert!(
        !table.contains(&tag(&c, "newer", "tcp")),
        "the newer Service of a port conflict has rules:\n{table}"
    );
    for _ in 0..20 {
        let (name, _) = answer(&tcp_request(c.client(), v4(&c, 8015), ANSWER)).unwrap();
        assert_eq!(name, "b0", "the conflict's loser got traffic");
    }

    c.assert_agents_authorized();
}

/// Port 22 is reserved: the Service gets no rules (ssh on the node stays the node's) and the
/// leader emits a `ReservedPort` Warning Event about it. So are the overlay's 8472/UDP
/// (VXLAN) and routing's 179/TCP (BGP), per protocol: a Service on 8472/TCP is served.
#[test]
fn reserved_port_gets_no_rules_and_an_event() {
    if !require_root("reserved_port_gets_no_rules_and_an_event") {
        return;
    }
    let c = start(ClusterOptions::default());
    let _servers = start_backends(&c, false);
    c.apply(&service("ssh", 22, ""));
    c.apply(&slice(&c, "ssh", "1", &[0]));
    c.apply(&service("bgp", 179, ""));
    c.apply(&slice(&c, "bgp", "1", &[0]));
    c.apply(&udp_service("vxlan", 8472));
    c.apply(&udp_slice(&c, "vxlan", 0));
    c.apply(&service("tcp-8472", 8472, ""));
    c.apply(&slice(&c, "tcp-8472", "1", &[0]));
    // A Service applied after it is programmed: the agent has seen the others by then.
    c.apply(&service("after", 8021, ""));
    c.apply(&slice(&c, "after", "1", &[0]));
    wait_answer_from(&c, c.client(), v4(&c, 8021), "b0");
    wait_answer_from(&c, c.client(), v4(&c, 8472), "b0");
    let table = c.nft_table(0, "ip").unwrap();
    assert!(
        !table.contains(&tag(&c, "ssh", "tcp")) && !table.contains("dport 22 "),
        "a Service on reserved port 22 got rules:\n{table}"
    );
    for (svc, port) in [("bgp", "tcp"), ("vxlan", "udp")] {
        assert!(
            !table.contains(&tag(&c, svc, port)),
            "Service {svc} on a reserved port got rules:\n{table}"
        );
    }
    assert!(table.contains(&tag(&c, "tcp-8472", "tcp")), "{table}");
    // The served one is published; once it is, the leader has judged the others: none.
    wait_for("Service tcp-8472 published", CHANGE, || {
        match ips(&c, "tcp-8472").is_empty() {
            true => Err("no ingress yet".to_string()),
            false => Ok(()),
        }
    });
    for svc in ["ssh", "bgp", "vxlan"] {
        assert_eq!(
            ips(&c, svc),
            Vec::<String>::new(),
            "Service {svc} was published"
        );
    }
    for svc in ["bgp", "vxlan"] {
        wait_for(&format!("a ReservedPort Event about {svc}"), CHANGE, || {
            let found = c
                .events()
                .iter()
                .any(|e| e["reason"] == "ReservedPort" && e["regarding"]["name"] == svc);
            found.then_some(()).ok_or_else(|| "not yet".to_string())
        });
    }
    // Nothing listens on 22 in the node namespace: the kernel resets, nodelb did not DNAT.
    assert!(matches!(
        tcp_request(c.client(), v4(&c, 22), ANSWER),
        Outcome::Refused { .. }
    ));

    c.assert_agents_authorized();
    // The Event comes from the elected leader (leader election and Service Events).
    wait_for("a ReservedPort Event regarding Service ssh", CHANGE, || {
        let events = c.events();
        let found = events.iter().any(|e| {
            e["reason"] == "ReservedPort"
                && e["type"] == "Warning"
                && e["regarding"]["kind"] == "Service"
                && e["regarding"]["name"] == "ssh"
        });
        if found {
            Ok(())
        } else {
            Err(format!(
                "events: {:?}",
                events
                    .iter()
                    .map(|e| format!(
                        "{} {} {}",
                        e["reason"], e["regarding"]["kind"], e["regarding"]["name"]
                    ))
                    .collect::<Vec<_>>()
            ))
        }
    });
}

/// Which node addresses serve a Service (`nodelb.io/address-types`), on a node with two
/// addresses on two links: its InternalIP faces the client, its ExternalIP (listed in its
/// Node here) the stranger. A Service of `ExternalIP` answers on the ExternalIP and leaves
/// the InternalIP to the node (a reset, from the client and from the stranger alike), one of
/// `InternalIP` the other way round, and each status lists only the address serving it. An
/// unknown type serves nowhere: no rules, no status, an `InvalidInput` Event, and the
/// condition says why.
#[test]
fn address_types_serve_and_publish_only_the_chosen_node_addresses() {
    if !require_root("address_types_serve_and_publish_only_the_chosen_node_addresses") {
        return;
    }
    let c = start(ClusterOptions::default());
    let _servers = start_backends(&c, false);
    let (internal, external) = (c.node_v4(0), c.node_stranger_v4(0));
    let nodes: kube::Api<k8s_openapi::api::core::v1::Node> = kube::Api::all(c.admin().clone());
    let patch = json!({"status": {"addresses": [
        {"type": "InternalIP", "address": internal.to_string()},
        {"type": "ExternalIP", "address": external.to_string()},
        {"type": "Hostname", "address": c.node_name(0)}]}});
    c.block_on(nodes.patch_status(
        c.node_name(0),
        &kube::api::PatchParams::default(),
        &kube::api::Patch::Merge(&patch),
    ))
    .unwrap_or_else(|e| panic!("setting node 0's ExternalIP: {e}"));
    let on = |name: &str, port: u32, types: &str| {
        service(name, port, "").replace(
            &format!("metadata: {{name: {name}}}"),
            &format!("metadata: {{name: {name}, annotations: {{\"nodelb.io/address-types\": \"{types}\"}}}}"),
        )
    };
    c.apply(&on("ext", 8031, "ExternalIP"));
    c.apply(&slice(&c, "ext", "1", &[0]));
    c.apply(&on("int", 8032, "InternalIP"));
    c.apply(&slice(&c, "int", "1", &[1]));
    c.apply(&on("bad", 8033, "ExternalIP,Hostname"));
    c.apply(&slice(&c, "bad", "1", &[2]));
    let at = |addr: std::net::Ipv4Addr, port: u16| SocketAddr::new(addr.into(), port);

    wait_answer_from(&c, c.stranger(), at(external, 8031), "b0");
    wait_answer_from(&c, c.client(), at(internal, 8032), "b1");
    eprintln!(
        "example: ext (ExternalIP) answered at {} by b0, int (InternalIP) at {} by b1",
        at(external, 8031),
        at(internal, 8032)
    );
    // The other address is the node's own: nothing listens there, the kernel resets.
    for (ns, dst) in [
        (c.client(), at(internal, 8031)),
        (c.stranger(), at(internal, 8031)),
        (c.stranger(), at(external, 8032)),
    ] {
        match tcp_request(ns, dst, ANSWER) {
            Outcome::Refused { .. } => {}
            other => panic!("{dst} from {}: not served there, got {other:?}", ns.name()),
        }
        eprintln!("example: {dst} from {}: refused", ns.name());
    }

    for (svc, want) in [("ext", external), ("int", internal)] {
        wait_for(
            &format!("Service {svc} publishes {want} only"),
            CHANGE,
            || match ips(&c, svc) {
                ips if ips == [want.to_string()] => Ok(()),
                ips => Err(format!("{ips:?}")),
            },
        );
        eprintln!(
            "example: Service {svc}'s status.loadBalancer.ingress: {:?}",
            ips(&c, svc)
        );
    }

    // Invalid: no rules on either address, no status, an Event and the condition say why.
    let table = c.nft_table(0, "ip").unwrap_or_default();
    assert!(!table.contains(&tag(&c, "bad", "tcp")), "{table}");
    for dst in [at(external, 8033), at(internal, 8033)] {
        match tcp_request(c.stranger(), dst, ANSWER) {
            Outcome::Refused { .. } => {}
            other => panic!("{dst}: an invalid annotation serves nowhere, got {other:?}"),
        }
    }
    wait_for("an InvalidInput Event about Service bad", CHANGE, || {
        let events = c.events();
        let note = events.iter().find_map(|e| {
            (e["reason"] == "InvalidInput" && e["regarding"]["name"] == "bad")
                .then(|| e["note"].as_str().unwrap_or_default().to_string())
        });
        match note {
            Some(n) if n.contains("nodelb.io/address-types") && n.contains("\"Hostname\"") => {
                eprintln!("example: Event InvalidInput on Service bad: {n}");
                Ok(())
            }
            other => Err(format!("{other:?}")),
        }
    });
    assert!(ips(&c, "bad").is_empty());
    wait_for("Service bad's condition says why", CHANGE, || {
        let api: kube::Api<k8s_openapi::api::core::v1::Service> =
            kube::Api::namespaced(c.admin().clone(), c.namespace());
        let svc = c.block_on(api.get("bad")).map_err(|e| e.to_string())?;
        let condition = svc
            .status
            .and_then(|s| s.conditions)
            .unwrap_or_default()
            .into_iter()
            .find(|c| c.type_ == "nodelb.io/Serving");
        match condition {
            Some(c)
                if c.status == "False"
                    && c.message
                        .contains("invalid annotation nodelb.io/address-types") =>
            {
                Ok(())
            }
            other => Err(format!("{other:?}")),
        }
    });
    c.assert_agents_authorized();
}

/// `--ipv6=true`: a dual-stack Service answers an IPv6 client (and an IPv4 one), also when
/// its source ranges are IPv4 only; an IPv6-only Service answers IPv6 and leaves IPv4 alone.
#[test]
fn ipv6_with_the_flag() {
    if !require_root("ipv6_with_the_flag") {
        return;
    }
    let c = start(ClusterOptions {
        ipv6: true,
        ..ClusterOptions::default()
    });
    let _servers = start_backends(&c, true);

    c.apply(&service(
        "dual",
        8031,
        "  ipFamilyPolicy: RequireDualStack\n  ipFamilies: [IPv4, IPv6]\n",
    ));
    c.apply(&slice(&c, "dual", "v4", &[0]));
    c.apply(&slice6(&c, "dual", "v6", &[1]));
    let seen = wait_answer_from(&c, c.client(), v6(&c, 8031), "b1");
    assert_eq!(
        seen,
        IpAddr::from(std::net::Ipv6Addr::new(0x2001, 0xdb8, 0xb, 1, 0, 0, 0, 1))
    );
    wait_answer_from(&c, c.client(), v4(&c, 8031), "b0");

    // Source ranges of one family filter that family only (kube-proxy's MapCIDRsByIPFamily):
    // listing the client's IPv4 address leaves IPv6 clients unfiltered, and the stranger's
    // IPv4 address is dropped.
    c.apply(&service(
        "ranges4",
        8033,
        &format!(
            "  ipFamilyPolicy: RequireDualStack\n  ipFamilies: [IPv4, IPv6]\n  loadBalancerSourceRanges: [\"{}/32\"]\n",
            c.client_v4(0)
        ),
    ));
    c.apply(&slice(&c, "ranges4", "v4", &[0]));
    c.apply(&slice6(&c, "ranges4", "v6", &[1]));
    wait_answer_from(&c, c.client(), v4(&c, 8033), "b0");
    wait_answer_from(&c, c.client(), v6(&c, 8033), "b1");
    wait_answer_from(&c, c.stranger(), v6(&c, 8033), "b1");
    for _ in 0..3 {
        let out = tcp_request(c.stranger(), v4(&c, 8033), SILENCE);
        assert!(
            answer(&out).is_err(),
            "an IPv4 source outside the ranges got an answer: {out:?}"
        );
    }

    c.apply(&service(
        "only6",
        8032,
        "  ipFamilyPolicy: SingleStack\n  ipFamilies: [IPv6]\n  externalTrafficPolicy: Local\n",
    ));
    c.apply(&slice6(&c, "only6", "v6", &[2]));
    let seen = wait_answer_from(&c, c.client(), v6(&c, 8032), "b2");
    assert_eq!(
        seen,
        IpAddr::from(c.client_v6(0)),
        "Local keeps the IPv6 client's address"
    );
    wait_table(&c, "ip6", &tag(&c, "only6", "tcp"), true);
    assert!(!c
        .nft_table(0, "ip")
        .unwrap_or_default()
        .contains(&tag(&c, "only6", "tcp")));
    assert!(matches!(
        tcp_request(c.client(), v4(&c, 8032), ANSWER),
        Outcome::Refused { .. }
    ));
    c.assert_agents_authorized();
}

/// `sessionAffinity: ClientIP` through the real agent and API server, both families: a
/// Service's connections from one client spread until the Service asks for affinity; then 20
/// connections from one client land on one endpoint, and once the client has been away for the
/// (2-second) timeout it is picked for anew.
#[test]
fn client_ip_affinity_keeps_a_client_on_its_endpoint() {
    if !require_root("client_ip_affinity_keeps_a_client_on_its_endpoint") {
        return;
    }
    let c = start(ClusterOptions {
        ipv6: true,
        ..ClusterOptions::default()
    });
    let _servers = start_backends(&c, true);
    let dual = "  ipFamilyPolicy: RequireDualStack\n  ipFamilies: [IPv4, IPv6]\n";
    c.apply(&service("sticky", 8041, dual));
    c.apply(&slice(&c, "sticky", "v4", &[0, 1, 2]));
    c.apply(&slice6(&c, "sticky", "v6", &[0, 1, 2]));
    let backends = |dst: SocketAddr, n: usize| -> Result<Vec<String>, String> {
        (0..n)
            .map(|_| answer(&tcp_request(c.client(), dst, ANSWER)).map(|a| a.0))
            .collect()
    };
    for dst in [v4(&c, 8041), v6(&c, 8041)] {
        // 30 connections all on one of three endpoints without affinity: 3 * (1/3)^30.
        wait_with_ruleset(&c, &format!("{dst} spreads"), || {
            let seen: BTreeSet<String> = backends(dst, 30)?.into_iter().collect();
            match seen.len() {
                1 => Err(format!("only {seen:?}")),
                _ => Ok(()),
            }
        });
    }

    c.apply(&service(
        "sticky",
        8041,
        &format!(
            "{dual}  sessionAffinity: ClientIP\n  sessionAffinityConfig: {{clientIP: {{timeoutSeconds: 2}}}}\n"
        ),
    ));
    for family in ["ip", "ip6"] {
        wait_table(&c, family, "update @aff-", true);
    }
    for dst in [v4(&c, 8041), v6(&c, 8041)] {
        let seen = backends(dst, 20).unwrap_or_else(|e| panic!("{dst}: {e}"));
        let distinct: BTreeSet<&String> = seen.iter().collect();
        assert_eq!(
            distinct.len(),
            1,
            "{dst}: 20 connections of one client went to {seen:?}"
        );
    }
    // Away for the timeout, the client is picked for anew: within 16 waits, at least one
    // other endpoint (all 16 picks the first one, with chance (1/3)^16 = 2e-8 per family).
    for dst in [v4(&c, 8041), v6(&c, 8041)] {
        let first = backends(dst, 1).unwrap_or_else(|e| panic!("{dst}: {e}"));
        let mut picks = BTreeSet::from([first[0].clone()]);
        for _ in 0..16 {
            if picks.len() > 1 {
                break;
            }
            std::thread::sleep(Duration::from_millis(2_600));
            picks.extend(backends(dst, 1).unwrap_or_else(|e| panic!("{dst}: {e}")));
        }
        assert!(
            picks.len() > 1,
            "{dst}: after every timeout still {picks:?}"
        );
    }
    c.assert_agents_authorized();
}

/// SIGKILL under steady load: a client connecting every ~20 ms (50 connections before the kill,
/// 25 while the agent is down, 100 after the new one is ready) while the agent is killed and
/// restarted sees no failed connection (the rules stay in the kernel; the new
/// process waits for its caches, then replaces the tables in one batch). The restarted agent
/// then follows changes.
#[test]
fn sigkill_under_steady_load_loses_no_connection() {
    if !require_root("sigkill_under_steady_load_loses_no_connection") {
        return;
    }
    let mut c = start(ClusterOptions::default());
    let _servers = start_backends(&c, false);
    c.apply(&service("steady", 8041, ""));
    c.apply(&slice(&c, "steady", "1", &[0, 1]));
    wait_answer_from(&c, c.client(), v4(&c, 8041), "b0");
    wait_answer_from(&c, c.client(), v4(&c, 8041), "b1");

    let dst = v4(&c, 8041);
    let stop = AtomicBool::new(false);
    let tried = AtomicUsize::new(0);
    // Waits until the load thread has tried `n` more connections: every phase (before the
    // kill, while the agent is down and restarting, after it is ready) sees real traffic
    // however slow the machine is.
    let more_connections = |n: usize| {
        let target = tried.load(Ordering::Relaxed) + n;
        wait_for(
            "the load thread keeps connecting",
            Duration::from_secs(60),
            || {
                let now = tried.load(Ordering::Relaxed);
                if now >= target {
                    Ok(())
                } else {
                    Err(format!("{now} of {target} connections"))
                }
            },
        )
    };
    // The load thread joins the client namespace itself: the cluster is borrowed mutably to
    // kill and restart the agent meanwhile.
    let client_ns = std::fs::File::open(c.client().path()).expect("the client namespace");
    let (attempts, failures) = std::thread::scope(|s| {
        let load = s.spawn(|| {
            nix::sched::setns(&client_ns, nix::sched::CloneFlags::CLONE_NEWNET)
                .expect("joining the client namespace");
            let mut failures = Vec::new();
            let t0 = Instant::now();
            while !stop.load(Ordering::Relaxed) {
                if let Err(e) = one_connection(dst) {
                    failures.push(format!("{:?}: {e}", t0.elapsed()));
                }
                tried.fetch_add(1, Ordering::Relaxed);
                std::thread::sleep(Duration::from_millis(20));
            }
            (tried.load(Ordering::Relaxed), failures)
        });
        more_connections(50);
        let status = c.stop_agent(0, Signal::SIGKILL);
        eprintln!("agent killed: {status:?}");
        more_connections(25);
        c.start_agent(0);
        c.wait_ready(0);
        more_connections(100);
        stop.store(true, Ordering::Relaxed);
        load.join().expect("the load thread")
    });
    assert!(
        failures.is_empty(),
        "{} of {attempts} connections failed across SIGKILL and restart:\n{}",
        failures.len(),
        failures.join("\n")
    );

    // The new process programs changes.
    c.apply(&slice(&c, "steady", "1", &[2]));
    wait_answer_from(&c, c.client(), v4(&c, 8041), "b2");
    c.assert_agents_authorized();
}

/// Connect, read one line starting with a backend name.
fn one_connection(dst: SocketAddr) -> Result<(), String> {
    let mut s =
        TcpStream::connect_timeout(&dst, Duration::from_secs(2)).map_err(|e| e.to_string())?;
    s.set_read_timeout(Some(Duration::from_secs(2)))
        .map_err(|e| e.to_string())?;
    let mut reply = String::new();
    s.read_to_string(&mut reply).map_err(|e| e.to_string())?;
    if reply.starts_with('b') {
        Ok(())
    } else {
        Err(format!("reply {reply:?}"))
    }
}

/// Bad input, as far as kube-apiserver lets it through: what its validation refuses never
/// reaches the agent (asserted refused, so a server that starts accepting one fails here and the
/// case needs an agent-side answer; the planner's unit tests cover every such object); what it
/// stores (duplicate endpoints) is counted in `nodelb_invalid_objects_total`. Either way the
/// agent keeps running and other Services keep answering. Also a 1,000-endpoint slice and a
/// slice created before its Service.
#[test]
fn bad_input_never_stops_the_agent() {
    if !require_root("bad_input_never_stops_the_agent") {
        return;
    }
    let mut c = start(ClusterOptions {
        ipv6: true,
        ..ClusterOptions::default()
    });
    let _servers = start_backends(&c, true);
    c.apply(&service("good", 8051, ""));
    c.apply(&slice(&c, "good", "1", &[0]));
    wait_answer_from(&c, c.client(), v4(&c, 8051), "b0");

    let node = c.node_name(0).to_string();
    let eps = |addrs: &[&str]| -> Vec<(String, String)> {
        addrs
            .iter()
            .map(|a| (a.to_string(), node.clone()))
            .collect()
    };
    // Whether the API server refuses the object (`false`: it stores it, and the agent counts it).
    let cases: Vec<(&str, bool, Vec<String>)> = vec![
        (
            "an endpoint address that is not an IP",
            true,
            vec![
                service("badip", 8052, ""),
                slice_on("badip", "1", "IPv4", &eps(&["198.51.100.300"])),
            ],
        ),
        (
            "port 0",
            true,
            vec![service("zero", 8053, "").replace("port: 8053", "port: 0")],
        ),
        (
            "port 70000",
            true,
            vec![service("big", 8054, "").replace("port: 8054", "port: 70000")],
        ),
        (
            "empty ports",
            true,
            vec![service("noports", 8055, "")
                .replace("[{name: tcp, port: 8055, protocol: TCP}]", "[]")],
        ),
        (
            "duplicate endpoints",
            false,
            vec![
                service("dup", 8056, ""),
                slice_on(
                    "dup",
                    "1",
                    "IPv4",
                    &eps(&["198.51.100.18", "198.51.100.18"]),
                ),
            ],
        ),
        (
            "an unknown protocol",
            true,
            vec![service("proto", 8057, "").replace("protocol: TCP", "protocol: HTTP")],
        ),
        (
            "an IPv6 address in an IPv4 slice",
            true,
            vec![
                service("mixed", 8058, ""),
                slice_on("mixed", "1", "IPv4", &eps(&["2001:db8:b:1::2"])),
            ],
        ),
        (
            "a port that is not a number (does not deserialize)",
            true,
            vec![service("unreadable", 8059, "").replace("port: 8059", "port: eighty")],
        ),
    ];
    for (what, refused, docs) in cases {
        let before = metric_sum(&c.metrics(0), "nodelb_invalid_objects_total");
        let mut rejected = None;
        for doc in &docs {
            for obj in nodelb_integration::e2e::parse_documents(doc) {
                if let Err(e) = c.apply_value(obj) {
                    rejected = Some(e);
                }
            }
        }
        match (refused, rejected) {
            (true, Some(e)) => eprintln!("{what}: kube-apiserver refused it ({e})"),
            (true, None) => panic!(
                "{what}: kube-apiserver stored it; the agent now meets it: make this case \
                 counted and check the agent's answer"
            ),
            (false, Some(e)) => panic!("{what}: kube-apiserver refused it: {e}"),
            (false, None) => {
                wait_for(
                    &format!("{what}: nodelb_invalid_objects_total grows past {before}"),
                    CHANGE,
                    || {
                        let now = metric_sum(&c.metrics(0), "nodelb_invalid_objects_total");
                        if now > before {
                            Ok(())
                        } else {
                            Err(format!("still {now}"))
                        }
                    },
                );
            }
        }
        assert!(
            c.agent_running(0),
            "{what}: the agent exited:\n{}",
            c.agent_log(0)
        );
        wait_answer_from(&c, c.client(), v4(&c, 8051), "b0");
    }
    // The duplicated endpoint is still served (counted once).
    wait_answer_from(&c, c.client(), v4(&c, 8056), "b1");

    // 1,000 endpoints in one IPv6 slice (all in 2001:db8:f::/64, plus b1).
    c.apply(&service(
        "thousand",
        8060,
        "  ipFamilyPolicy: SingleStack\n  ipFamilies: [IPv6]\n",
    ));
    let mut many: Vec<(String, String)> = (1..1000u32)
        .map(|i| (format!("2001:db8:f::{i:x}"), node.clone()))
        .collect();
    many.push((c.backend_v6(1).to_string(), node.clone()));
    c.apply(&slice_on("thousand", "1", "IPv6", &many));
    wait_for("1,000 endpoints programmed", CHANGE, || {
        let n = metric_sum(&c.metrics(0), "nodelb_endpoints_programmed");
        if n >= 1000.0 {
            Ok(())
        } else {
            Err(format!("nodelb_endpoints_programmed {n}"))
        }
    });
    assert!(c.agent_running(0));
    wait_answer_from(&c, c.client(), v4(&c, 8051), "b0");

    // A slice created before its Service: the Service answers once it exists.
    c.apply(&slice(&c, "late", "1", &[2]));
    wait_refused(&c, c.client(), v4(&c, 8061));
    c.apply(&service("late", 8061, ""));
    wait_answer_from(&c, c.client(), v4(&c, 8061), "b2");

    assert!(c.readyz(0).is_ok_and(|(code, _)| code == 200));
    c.assert_agents_authorized();
}

/// Two nodes, each with its own agent and backend: a Local Service whose only endpoint is on
/// node-b is answered through node-b (keeping the client's address) and dropped by node-a;
/// each agent reached the API server over its own link.
#[test]
fn two_nodes_local_policy_follows_the_endpoint() {
    if !require_root("two_nodes_local_policy_follows_the_endpoint") {
        return;
    }
    let c = start(ClusterOptions {
        nodes: 2,
        backends_per_node: 1,
        ..ClusterOptions::default()
    });
    let _servers = start_backends(&c, false);
    assert_eq!(c.backend_node(1), 1, "b1 hangs off node-b");
    c.apply(&service("local2", 8071, "  externalTrafficPolicy: Local\n"));
    c.apply(&slice(&c, "local2", "1", &[1]));
    let at_b = SocketAddr::new(c.node_v4(1).into(), 8071);
    let seen = wait_answer_from(&c, c.client(), at_b, "b1");
    assert_eq!(
        seen,
        IpAddr::from(c.client_v4(1)),
        "Local keeps the client's address"
    );
    // node-a has the Service (its table says so) but no local endpoint: silence.
    wait_table(&c, "ip", &tag(&c, "local2", "tcp"), true);
    wait_silence(
        &c,
        c.client(),
        v4(&c, 8071),
        "node-a must drop a Local Service whose endpoints are all on node-b",
    );
    c.assert_agents_authorized();
}

/// `--health-check-node-ports`: a Local Service's `healthCheckNodePort` answers 200 with its
/// local endpoint count on the node that forwards to its endpoint, 503 on the node without
/// one and on the node whose endpoint left; a port a host process holds is left to it and
/// said so in the log, and taken once that process lets it go.
#[test]
fn health_check_node_ports_answer_where_the_service_is_served() {
    if !require_root("health_check_node_ports_answer_where_the_service_is_served") {
        return;
    }
    let c = start(ClusterOptions {
        nodes: 2,
        backends_per_node: 1,
        agent_args: vec!["--health-check-node-ports".into()],
        ..ClusterOptions::default()
    });
    let _servers = start_backends(&c, false);
    // A host process on node-b holds the port before the Service asks for it: a port of the
    // NodePort range the test picks, which the API server then allocates as asked.
    let port = 30000 + (std::process::id() % 2700) as u16;
    let squatter = c
        .node_ns(1)
        .run(move || std::net::TcpListener::bind(("0.0.0.0", port)))
        .expect("binding the health check port on node-b");
    c.apply(&service(
        "checked",
        8072,
        &format!("  externalTrafficPolicy: Local\n  healthCheckNodePort: {port}\n"),
    ));
    let allocated = wait_for("the healthCheckNodePort", CHANGE, || {
        c.services(c.namespace())?
            .into_iter()
            .find(|s| s.metadata.name.as_deref() == Some("checked"))
            .and_then(|s| s.spec?.health_check_node_port)
            .ok_or_else(|| "not allocated".to_string())
    });
    assert_eq!(allocated, i32::from(port));
    c.apply(&slice(&c, "checked", "1", &[0]));
    let at = |i: usize| SocketAddr::new(c.node_v4(i).into(), port);
    let local_endpoints = |body: &str| -> u64 {
        let v: serde_json::Value = serde_json::from_str(body).expect("a JSON body");
        assert_eq!(v["service"]["name"], "checked", "{body}");
        assert_eq!(v["serviceProxyHealthy"], true, "{body}");
        v["localEndpoints"].as_u64().expect("localEndpoints")
    };
    let (code, body) = wait_for("node-a's health check", CHANGE, || {
        match http_get(c.client(), at(0), "/healthz")? {
            (200, body) => Ok((200, body)),
            other => Err(format!("{other:?}")),
        }
    });
    assert_eq!((code, local_endpoints(&body)), (200, 1));
    wait_for("node-b's agent saying its port is taken", CHANGE, || {
        let log = c.agent_log(1);
        (log.contains("cannot answer this Service's health checks")
            && log.contains(&port.to_string()))
        .then_some(())
        .ok_or_else(|| "not logged yet".to_string())
    });
    drop(squatter);
    let (code, body) = wait_for(
        "node-b's health check once the port is free",
        Duration::from_secs(45),
        || http_get(c.client(), at(1), "/"),
    );
    assert_eq!(
        (code, local_endpoints(&body)),
        (503, 0),
        "node-b has no endpoint"
    );
    // The endpoint leaves: node-a answers 503 too.
    c.apply(&slice(&c, "checked", "1", &[1]));
    wait_for(
        "node-a's 503 once its endpoint left",
        CHANGE,
        || match http_get(c.client(), at(0), "/")? {
            (503, body) if local_endpoints(&body) == 0 => Ok(()),
            other => Err(format!("{other:?}")),
        },
    );
    wait_for(
        "node-b's 200 now that the endpoint is there",
        CHANGE,
        || match http_get(c.client(), at(1), "/")? {
            (200, body) if local_endpoints(&body) == 1 => Ok(()),
            other => Err(format!("{other:?}")),
        },
    );
    // A Service that stops being Local closes its port.
    c.apply(&service(
        "checked",
        8072,
        "  externalTrafficPolicy: Cluster\n",
    ));
    wait_for("the port closed on node-a", CHANGE, || {
        match http_get(c.client(), at(0), "/") {
            Err(e) if e.contains("connect") => Ok(()),
            other => Err(format!("{other:?}")),
        }
    });
}

/// Puts the node namespace's ephemeral port range back as it was when dropped, also when the
/// test fails.
struct PortRange<'a> {
    ns: &'a Netns,
    was: String,
}

impl<'a> PortRange<'a> {
    /// Pins `ns`'s `net.ipv4.ip_local_port_range` (which IPv6 uses too) to `port` alone.
    fn pin(ns: &'a Netns, port: u16) -> PortRange<'a> {
        let was = ns.sh("cat /proc/sys/net/ipv4/ip_local_port_range");
        let range = PortRange {
            ns,
            was: was.split_whitespace().collect::<Vec<_>>().join(" "),
        };
        ns.sh(&format!(
            "sysctl -qw net.ipv4.ip_local_port_range='{port} {port}'"
        ));
        range
    }
}

impl Drop for PortRange<'_> {
    fn drop(&mut self) {
        let _ = self.ns.sh_ok(&format!(
            "sysctl -qw net.ipv4.ip_local_port_range='{}'",
            self.was
        ));
    }
}

/// The node's own outbound connections whose ephemeral source port is a port of a Service
/// without endpoints get their replies: the agent's no-endpoints reject, keyed on the node's
/// address and that port like the replies, sees new connections only. The node namespace's
/// ephemeral port range is pinned to the Service's port (its own range only, for as short as
/// the connections take), so the node's TCP connection and UDP exchange with a server in the
/// client namespace both use it; a client's new connection to that port is still refused.
#[test]
fn the_nodes_own_connections_from_a_port_without_endpoints_get_their_replies() {
    if !require_root("the_nodes_own_connections_from_a_port_without_endpoints_get_their_replies") {
        return;
    }
    use nodelb_integration::traffic::{udp_request, udp_server};
    // At least ip_unprivileged_port_start (1024), as an ephemeral port must be.
    const PINNED: u16 = 40090;
    let c = start(ClusterOptions::default());
    let server = SocketAddr::new(c.client_v4(0).into(), 9000);
    let _servers = [
        tcp_server(c.client(), server, "client"),
        udp_server(c.client(), server, "client"),
    ];
    c.apply(&format!(
        "apiVersion: v1\nkind: Service\nmetadata: {{name: idle}}\nspec:\n  type: LoadBalancer\n  ports:\n  - {{name: tcp, port: {PINNED}, protocol: TCP}}\n  - {{name: udp, port: {PINNED}, protocol: UDP}}\n"
    ));
    // The reject is in place: a client's new connection to the port is reset, its datagram
    // answered with a port unreachable.
    wait_refused(&c, c.client(), v4(&c, PINNED));
    let out = udp_request(c.client(), v4(&c, PINNED), ANSWER);
    assert!(matches!(out, Outcome::Refused { icmp: Some(_) }), "{out:?}");
    let want = Outcome::Answered(format!("client {}", c.node_v4(0)));
    let (tcp, udp) = {
        let _pinned = PortRange::pin(c.node_ns(0), PINNED);
        (
            tcp_request(c.node_ns(0), server, ANSWER),
            udp_request(c.node_ns(0), server, ANSWER),
        )
    };
    assert_eq!(tcp, want, "the node's TCP connection from port {PINNED}");
    assert_eq!(udp, want, "the node's UDP exchange from port {PINNED}");
    c.assert_agents_authorized();
}
