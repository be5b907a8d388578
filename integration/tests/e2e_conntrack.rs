//! End-to-end conntrack cleanup: the real agent against the real kube-apiserver (see
//! `nodelb_integration::e2e`), clients that keep their source port sending a UDP datagram
//! every 100 ms, EndpointSlices changed through the API.
//!
//! Run as root: `cargo test -p nodelb-integration --test e2e_conntrack`.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use nix::sys::signal::Signal;
use nodelb_integration::e2e::{metric_sum, wait_for, Cluster, ClusterOptions};
use nodelb_integration::netns::require_root;
use nodelb_integration::traffic::{
    tcp_echo_server, udp_request, udp_server, Outcome, Server, TcpSession, UdpFlow,
};
use serde_json::{json, Value};

/// The port every backend listens on (the slices' target port).
const BACKEND_PORT: u16 = 8053;
/// How often a flow's client sends.
const INTERVAL: Duration = Duration::from_millis(100);
/// How long a change may take to show.
const CHANGE: Duration = Duration::from_secs(10);
/// DESIGN's goal: a flow reaches an endpoint that serves within this of the EndpointSlice
/// update.
const GOAL: Duration = Duration::from_secs(1);
const ANSWER: Duration = Duration::from_secs(2);

/// A LoadBalancer Service with one port `p` of `protocol`.
fn service(name: &str, protocol: &str, port: u16) -> String {
    format!(
        "apiVersion: v1\nkind: Service\nmetadata: {{name: {name}}}\nspec:\n  type: LoadBalancer\n  ports: [{{name: p, port: {port}, protocol: {protocol}}}]\n"
    )
}

/// The IPv4 EndpointSlice `<svc>-1`: port `p` → `BACKEND_PORT` on these backends.
fn slice(c: &Cluster, svc: &str, protocol: &str, backends: &[usize]) -> String {
    let ready: Vec<(usize, Value)> = backends
        .iter()
        .map(|j| (*j, c.endpoint_v4(*j, true)["conditions"].clone()))
        .collect();
    slice_with(c, svc, protocol, &ready)
}

fn udp_backends(c: &Cluster) -> Vec<Server> {
    (0..c.backend_count())
        .map(|j| {
            let addr = SocketAddr::new(c.backend_v4(j).into(), BACKEND_PORT);
            udp_server(c.backend(j), addr, &format!("b{j}"))
        })
        .collect()
}

fn name_of(reply: &str) -> String {
    reply
        .split_whitespace()
        .next()
        .unwrap_or_default()
        .to_string()
}

/// A flow from the client's fixed `port` to the node's `service_port`.
fn flow(c: &Cluster, port: u16, service_port: u16) -> UdpFlow {
    UdpFlow::start(
        c.client(),
        SocketAddr::new(c.client_v4(0).into(), port),
        SocketAddr::new(c.node_v4(0).into(), service_port),
        INTERVAL,
    )
}

/// Waits for a reply after `since`; the name of who sent it, and when.
fn first_reply(c: &Cluster, f: &UdpFlow, since: Instant, from: Option<&str>) -> (String, Instant) {
    let what = format!(
        "a reply{} after {since:?}",
        from.map(|b| format!(" from {b}")).unwrap_or_default()
    );
    wait_for(&what, CHANGE, || {
        f.replies_since(since)
            .into_iter()
            .map(|(t, r)| (name_of(&r), t))
            .find(|(n, _)| from.is_none_or(|b| b == n))
            .ok_or_else(|| {
                format!(
                    "heard {:?}; ruleset:\n{}",
                    f.heard().iter().rev().take(3).collect::<Vec<_>>(),
                    c.node_ns(0)
                        .sh_ok("nft list table ip nodelb")
                        .unwrap_or_default()
                )
            })
    })
}

/// Who replied to `f` in `[from, to)`.
/// The flow `f` reaches `to` after `updated` (`what` changed then): prints how long it took
/// against the goal, and asserts that from `GOAL` after the change on, for two seconds, only
/// `to` answers.
fn moved_to(c: &Cluster, f: &UdpFlow, updated: Instant, to: &str, what: &str) {
    let (_, switched) = first_reply(c, f, updated, Some(to));
    let took = switched.duration_since(updated);
    println!(
        "measured: the UDP flow reached {to} {:.0} ms after {what} (goal < {} ms): {}",
        took.as_secs_f64() * 1e3,
        GOAL.as_millis(),
        nodelb_integration::bench::goal(took < GOAL)
    );
    let settled = updated + GOAL;
    std::thread::sleep(
        (settled + Duration::from_secs(2)).saturating_duration_since(Instant::now()),
    );
    let after = repliers(f, settled, Instant::now());
    assert!(
        after.len() >= 10 && after.iter().all(|r| r == to),
        "from {GOAL:?} after the update on, only {to} may answer: {after:?}"
    );
}

fn repliers(f: &UdpFlow, from: Instant, to: Instant) -> Vec<String> {
    f.replies_since(from)
        .into_iter()
        .filter(|(t, _)| *t < to)
        .map(|(_, r)| name_of(&r))
        .collect()
}

/// Backend `j`'s server answers when asked directly from the node (which routes to it).
fn still_answers(c: &Cluster, j: usize) {
    let dst = SocketAddr::new(c.backend_v4(j).into(), BACKEND_PORT);
    match udp_request(c.node_ns(0), dst, ANSWER) {
        Outcome::Answered(r) if name_of(&r) == format!("b{j}") => {}
        other => panic!("b{j} must still answer at {dst}: {other:?}"),
    }
}

fn index(name: &str) -> usize {
    name.trim_start_matches('b')
        .parse()
        .expect("a backend name")
}

/// A UDP client on a fixed source port, sending every 100 ms to a Service with two endpoints:
/// the endpoint it landed on leaves the EndpointSlice, and from within a second of the update
/// (measured from just before the PUT) every datagram reaches the other endpoint, while the
/// one that left still runs and answers. The agent counts the entry it deleted. An
/// established TCP connection to an endpoint that leaves is not cut.
#[test]
fn a_udp_client_on_a_fixed_port_follows_the_endpointslice() {
    if !require_root("a_udp_client_on_a_fixed_port_follows_the_endpointslice") {
        return;
    }
    let c = Cluster::start(ClusterOptions::default());
    let _servers = udp_backends(&c);
    c.apply(&service("dns", "UDP", 1053));
    c.apply(&slice(&c, "dns", "UDP", &[0, 1]));
    let f = flow(&c, 40053, 1053);
    let t0 = Instant::now();
    let (landed, _) = first_reply(&c, &f, t0, None);
    let other = 1 - index(&landed);
    let before = metric_sum(&c.metrics(0), "nodelb_conntrack_entries_deleted_total");

    let updated = Instant::now();
    c.apply(&slice(&c, "dns", "UDP", &[other]));
    let other_name = format!("b{other}");
    moved_to(&c, &f, updated, &other_name, "the EndpointSlice update");
    still_answers(&c, index(&landed));
    let deleted = metric_sum(&c.metrics(0), "nodelb_conntrack_entries_deleted_total") - before;
    assert!(
        deleted >= 1.0,
        "nodelb_conntrack_entries_deleted_total grew by {deleted}"
    );
    assert!(c.agent_log(0).contains("deleted stale conntrack entries"));

    // TCP: an established connection to the endpoint that leaves keeps working.
    let tcp: Vec<Server> = (0..2)
        .map(|j| {
            let addr = SocketAddr::new(c.backend_v4(j).into(), BACKEND_PORT);
            tcp_echo_server(c.backend(j), addr, &format!("b{j}"))
        })
        .collect();
    c.apply(&service("web", "TCP", 1080));
    c.apply(&slice(&c, "web", "TCP", &[0, 1]));
    let web = SocketAddr::new(c.node_v4(0).into(), 1080);
    let (mut session, landed) = wait_for("a TCP connection to web", CHANGE, || {
        let mut s = TcpSession::connect(c.client(), web, ANSWER)?;
        let first = s.ask()?;
        Ok((s, name_of(&first)))
    });
    let stays = 1 - index(&landed);
    c.apply(&slice(&c, "web", "TCP", &[stays]));
    // Once a new connection reaches the other endpoint, the change is in the kernel.
    wait_for(
        "a new connection reaches the endpoint that stays",
        CHANGE,
        || {
            let mut s = TcpSession::connect(c.client(), web, ANSWER)?;
            match name_of(&s.ask()?) {
                n if n == format!("b{stays}") => Ok(()),
                n => Err(format!("answered by {n}")),
            }
        },
    );
    for k in 0..10 {
        let a = session
            .ask()
            .unwrap_or_else(|e| panic!("the connection to {landed} was cut at exchange {k}: {e}"));
        assert_eq!(name_of(&a), landed);
        std::thread::sleep(INTERVAL);
    }
    drop(tcp);
    c.assert_agents_authorized();
}

/// The agent is down while an endpoint leaves: when it starts again, its first sync (a full
/// replace, nothing known of before) deletes the entries of the endpoint that left, and keeps
/// those of endpoints that still serve: a flow on one of them is never interrupted.
#[test]
fn a_restarted_agent_deletes_the_entries_of_endpoints_that_left_meanwhile_and_keeps_the_rest() {
    if !require_root(
        "a_restarted_agent_deletes_the_entries_of_endpoints_that_left_meanwhile_and_keeps_the_rest",
    ) {
        return;
    }
    let mut c = Cluster::start(ClusterOptions::default());
    let _servers = udp_backends(&c);
    c.apply(&service("moves", "UDP", 1054));
    c.apply(&slice(&c, "moves", "UDP", &[0]));
    c.apply(&service("stays", "UDP", 1055));
    c.apply(&slice(&c, "stays", "UDP", &[1]));
    let moves = flow(&c, 40054, 1054);
    let stays = flow(&c, 40055, 1055);
    let t0 = Instant::now();
    first_reply(&c, &moves, t0, Some("b0"));
    first_reply(&c, &stays, t0, Some("b1"));

    c.stop_agent(0, Signal::SIGTERM);
    c.apply(&slice(&c, "moves", "UDP", &[2]));
    let down = Instant::now();
    std::thread::sleep(Duration::from_secs(1));
    let heard = repliers(&moves, down, Instant::now());
    assert!(
        !heard.is_empty() && heard.iter().all(|r| r == "b0"),
        "with the agent down the flow stays: {heard:?}"
    );
    let started = Instant::now();
    c.start_agent(0);
    c.wait_ready(0);
    let (_, moved) = first_reply(&c, &moves, down, Some("b2"));
    // The flow on an endpoint that still serves kept going to it, with no gap.
    let kept = repliers(&stays, t0, Instant::now());
    assert!(kept.iter().all(|r| r == "b1"), "{kept:?}");
    let gaps: Vec<Duration> = stays
        .replies_since(t0)
        .windows(2)
        .map(|w| w[1].0.duration_since(w[0].0))
        .filter(|d| *d > Duration::from_millis(500))
        .collect();
    assert!(gaps.is_empty(), "the kept flow went silent: {gaps:?}");
    println!(
        "measured: the moved flow reached b2 {:.0} ms after the agent was started",
        moved.duration_since(started).as_secs_f64() * 1e3
    );
}

/// The IPv4 EndpointSlice `<svc>-1`: port `p` → `BACKEND_PORT` on these backends, each with
/// its conditions (`ready`, `serving`, `terminating`).
fn slice_with(c: &Cluster, svc: &str, protocol: &str, backends: &[(usize, Value)]) -> String {
    let eps: Vec<Value> = backends
        .iter()
        .map(|(j, conditions)| {
            let mut e = c.endpoint_v4(*j, true);
            e["conditions"] = conditions.clone();
            e
        })
        .collect();
    json!({
        "apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
        "metadata": {"name": format!("{svc}-1"), "labels": {"kubernetes.io/service-name": svc}},
        "addressType": "IPv4",
        "ports": [{"name": "p", "port": BACKEND_PORT, "protocol": protocol}],
        "endpoints": eps,
    })
    .to_string()
}

/// A rolling update, as kube-proxy drains it: a UDP client on a fixed source port lands on an
/// endpoint that then terminates but still serves. The node sends new flows to the other
/// endpoint only, yet the client's flow stays where it is (every reply for three seconds,
/// nothing deleted). Once the endpoint leaves the slice the flow moves: from a second after
/// that update on, only the other endpoint answers; the time it took is printed.
#[test]
fn a_udp_flow_stays_on_its_serving_terminating_endpoint_and_moves_when_it_leaves() {
    if !require_root(
        "a_udp_flow_stays_on_its_serving_terminating_endpoint_and_moves_when_it_leaves",
    ) {
        return;
    }
    let c = Cluster::start(ClusterOptions::default());
    let _servers = udp_backends(&c);
    let ready = || json!({"ready": true, "serving": true, "terminating": false});
    let draining = || json!({"ready": false, "serving": true, "terminating": true});
    c.apply(&service("drain", "UDP", 1056));
    c.apply(&slice_with(
        &c,
        "drain",
        "UDP",
        &[(0, ready()), (1, ready())],
    ));
    let f = flow(&c, 40056, 1056);
    let (landed, _) = first_reply(&c, &f, Instant::now(), None);
    let (stays, other) = (index(&landed), 1 - index(&landed));
    let other_name = format!("b{other}");
    let deleted = || metric_sum(&c.metrics(0), "nodelb_conntrack_entries_deleted_total");
    let before = deleted();

    // SIGTERM: the endpoint terminates, still serving.
    c.apply(&slice_with(
        &c,
        "drain",
        "UDP",
        &[(stays, draining()), (other, ready())],
    ));
    let in_map = |j: usize| format!("{} . {BACKEND_PORT}", c.backend_v4(j));
    wait_for("new flows go to the ready endpoint only", CHANGE, || {
        let table = c.nft_table(0, "ip").unwrap_or_default();
        match (
            table.contains(&in_map(stays)),
            table.contains(&in_map(other)),
        ) {
            (false, true) => Ok(()),
            _ => Err(table),
        }
    });
    let held = Instant::now();
    std::thread::sleep(Duration::from_secs(3));
    let heard = repliers(&f, held, Instant::now());
    assert!(
        heard.len() >= 20 && heard.iter().all(|r| *r == landed),
        "the flow stays on {landed} while it drains: {heard:?}"
    );
    for k in 0..5 {
        let dst = SocketAddr::new(c.node_v4(0).into(), 1056);
        match udp_request(c.client(), dst, ANSWER) {
            Outcome::Answered(r) if name_of(&r) == other_name => {}
            out => panic!("new flow {k} must reach {other_name}: {out:?}"),
        }
    }
    assert_eq!(
        deleted(),
        before,
        "nothing deleted while the endpoint serves"
    );

    // It leaves the slice: the flow moves.
    let updated = Instant::now();
    c.apply(&slice_with(&c, "drain", "UDP", &[(other, ready())]));
    moved_to(
        &c,
        &f,
        updated,
        &other_name,
        "its endpoint left the EndpointSlice",
    );
    assert!(deleted() > before, "the flow's entry was deleted");
    still_answers(&c, stays);
    c.assert_agents_authorized();
}
