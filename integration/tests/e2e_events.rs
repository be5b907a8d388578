//! End-to-end Events: every `events.k8s.io/v1` Event the agent creates is accepted by the real
//! kube-apiserver the harness starts (its validation, its RBAC from `manifests/`) and can be
//! read back from it. The Service Events come from the status leader — `EnsuredLoadBalancer`,
//! `UpdatedLoadBalancer`, `NoServingNodes`, `PortConflict` (naming the winner),
//! `ReservedPort`, `IngressOwnedElsewhere` — and a Node Event (`ForwardingOff`) from the
//! node's own agent, in namespace `default` (a Node has none).
//!
//! Each test also reads kube-apiserver's audit log: every Event request an agent made was
//! accepted (no 4xx on resource `events`), and every Event the agent created is one the
//! server lists.
//!
//! Run as root: `cargo test -p nodelb-integration --test e2e_events -- --test-threads=1
//! --nocapture`.

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{Node, Service};
use kube::api::{Api, Patch, PatchParams};
use nodelb_integration::control_plane::AuditRecord;
use nodelb_integration::e2e::{agent_pod_name, wait_for, Cluster};
use nodelb_integration::netns::require_root;
use serde_json::{json, Value};

mod common;
use common::{
    apply, events_about, events_in, fast_options, ips, service, slice, summary, wait_event,
};

/// Upper bound for an Event to show after the change that causes it.
const CHANGE: Duration = Duration::from_secs(20);
/// `reportingController` of every nodelb Event.
const CONTROLLER: &str = "nodelb.io/nodelb";

// ---- objects ---------------------------------------------------------------------------------

fn service_uid(c: &Cluster, name: &str) -> String {
    let api: Api<Service> = Api::namespaced(c.admin().clone(), c.namespace());
    c.block_on(api.get(name))
        .unwrap_or_else(|e| panic!("reading Service {name}: {e}"))
        .metadata
        .uid
        .expect("a stored Service has a uid")
}

fn node_uid(c: &Cluster, i: usize) -> String {
    let api: Api<Node> = Api::all(c.admin().clone());
    c.block_on(api.get(c.node_name(i)))
        .unwrap_or_else(|e| panic!("reading Node {}: {e}", c.node_name(i)))
        .metadata
        .uid
        .expect("a stored Node has a uid")
}

/// A lowercase RFC 1123 subdomain, as kube-apiserver validates `metadata.name`.
fn is_dns_subdomain(s: &str) -> bool {
    s.len() <= 253
        && s.split('.').all(|l| {
            !l.is_empty()
                && l.bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
                && !l.starts_with('-')
                && !l.ends_with('-')
        })
}

/// The fields every nodelb Event carries, as stored: named `<regarding>.<suffix>`, reported by
/// `pod` as nodelb, about the object with `uid`, of `type_`, with an event time.
fn assert_shape(ev: &Value, kind: &str, name: &str, uid: &str, type_: &str, pod: &str) {
    let ev_name = ev["metadata"]["name"].as_str().unwrap_or_default();
    assert!(
        is_dns_subdomain(ev_name) && ev_name.starts_with(&format!("{name}.")),
        "Event name {ev_name:?} is `<{name}>.<suffix>`"
    );
    assert_eq!(ev["regarding"]["kind"], kind, "{ev}");
    assert_eq!(ev["regarding"]["name"], name, "{ev}");
    assert_eq!(
        ev["regarding"]["uid"], uid,
        "regarding the stored object: {ev}"
    );
    assert_eq!(ev["type"], type_, "{ev}");
    assert_eq!(ev["reportingController"], CONTROLLER, "{ev}");
    assert_eq!(ev["reportingInstance"], pod, "{ev}");
    assert_eq!(ev["action"], "Program", "{ev}");
    assert!(ev["eventTime"].is_string(), "an eventTime: {ev}");
}

// ---- the audit log ---------------------------------------------------------------------------

/// Agent requests (from node `i`'s link) on resource `events`.
fn event_requests(c: &Cluster, records: &[AuditRecord], nodes: usize) -> Vec<AuditRecord> {
    records
        .iter()
        .filter(|r| (0..nodes).any(|i| r.source == std::net::IpAddr::V4(c.node_api_addr(i))))
        .filter(|r| r.object.as_ref().is_some_and(|o| o.resource == "events"))
        .cloned()
        .collect()
}

/// From the audit log: no Event request of an agent was refused, at least `min_created` were
/// created, and every Event an agent created is one the server lists in `namespaces`.
fn assert_no_event_refused(c: &Cluster, nodes: usize, min_created: usize, namespaces: &[&str]) {
    let Some(records) = c.audit() else { return };
    let requests = event_requests(c, &records, nodes);
    let line = |r: &AuditRecord| format!("{} {} {} -> {}", r.source, r.verb, r.uri, r.code);
    let refused: Vec<String> = requests
        .iter()
        .filter(|r| r.code >= 400)
        .map(line)
        .collect();
    eprintln!(
        "measured: {} Event requests by agents, {} refused",
        requests.len(),
        refused.len()
    );
    assert!(
        refused.is_empty(),
        "the server refused Event requests of the agent (see the agent log for its message):\n{}",
        refused.join("\n")
    );
    let created: Vec<&AuditRecord> = requests
        .iter()
        .filter(|r| r.verb == "create" && r.code == 201)
        .collect();
    assert!(
        created.len() >= min_created,
        "at least {min_created} Events created; the audit log has: {:?}",
        requests.iter().map(line).collect::<Vec<_>>()
    );
    let stored: BTreeSet<(String, String)> = namespaces
        .iter()
        .flat_map(|ns| events_in(c, ns))
        .map(|e| {
            (
                e["metadata"]["namespace"]
                    .as_str()
                    .unwrap_or_default()
                    .to_string(),
                e["metadata"]["name"]
                    .as_str()
                    .unwrap_or_default()
                    .to_string(),
            )
        })
        .collect();
    for r in created {
        let o = r
            .object
            .as_ref()
            .expect("an Event request names its resource");
        assert!(
            !o.name.is_empty(),
            "the audit log names the created Event: {}",
            line(r)
        );
        assert!(
            stored.contains(&(o.namespace.clone(), o.name.clone())),
            "Event {}/{} was created but the server does not list it; it lists {stored:?}",
            o.namespace,
            o.name
        );
    }
}

// ---- tests -----------------------------------------------------------------------------------

/// Every Service Event reason the leader has, each accepted by the server and read back:
/// `IngressOwnedElsewhere` (another manager wrote the ingress before the agent started),
/// `EnsuredLoadBalancer` (a new Service gets its status), `UpdatedLoadBalancer` and
/// `NoServingNodes` (its only local endpoint goes unready, so no node serves it),
/// `PortConflict` naming the older Service, and `ReservedPort` (port 22).
#[test]
fn every_service_event_is_accepted_and_readable() {
    if !require_root("every_service_event_is_accepted_and_readable") {
        return;
    }
    let t0 = Instant::now();
    let mut c = Cluster::build(fast_options(1));
    let ns = c.namespace().to_string();
    let pod = agent_pod_name(c.node_name(0));
    let node_ip = c.node_v4(0).to_string();

    // Owned elsewhere: another field manager writes the ingress before any agent runs.
    apply(&c, service("owned", 8002));
    let theirs = json!({"apiVersion": "v1", "kind": "Service",
        "metadata": {"name": "owned", "namespace": ns},
        "status": {"loadBalancer": {"ingress": [{"ip": "192.0.2.201"}]}}});
    let api: Api<Service> = Api::namespaced(c.admin().clone(), &ns);
    c.block_on(api.patch_status(
        "owned",
        &PatchParams::apply("metallb"),
        &Patch::Apply(&theirs),
    ))
    .expect("metallb applies the status of owned");
    c.start_agent(0);
    c.wait_ready(0);

    let ev = wait_event(&c, &ns, "Service", "owned", "IngressOwnedElsewhere", |n| {
        n.contains("metallb")
    });
    assert_shape(
        &ev,
        "Service",
        "owned",
        &service_uid(&c, "owned"),
        "Warning",
        &pod,
    );
    assert_eq!(ips(&c, "owned"), ["192.0.2.201"], "metallb's status stands");

    // Ensured, then Updated when the only local endpoint goes unready (and NoServingNodes).
    let mut local = service("local", 8001);
    local["spec"]["externalTrafficPolicy"] = json!("Local");
    apply(&c, local);
    apply(&c, slice(&c, "local", &[(0, true)]));
    let ev = wait_event(&c, &ns, "Service", "local", "EnsuredLoadBalancer", |n| {
        n.contains(&node_ip)
    });
    let local_uid = service_uid(&c, "local");
    assert_shape(&ev, "Service", "local", &local_uid, "Normal", &pod);
    assert_eq!(ips(&c, "local"), std::slice::from_ref(&node_ip));
    apply(&c, slice(&c, "local", &[(0, false)]));
    let ev = wait_event(&c, &ns, "Service", "local", "UpdatedLoadBalancer", |n| {
        n.contains("no node serves it")
    });
    assert_shape(&ev, "Service", "local", &local_uid, "Normal", &pod);
    let ev = wait_event(&c, &ns, "Service", "local", "NoServingNodes", |n| {
        n.contains("ready endpoint")
    });
    assert_shape(&ev, "Service", "local", &local_uid, "Warning", &pod);
    assert!(ips(&c, "local").is_empty(), "the status was emptied");

    // A port conflict: the server stamps creationTimestamp in whole seconds, so the winner is
    // older only if the loser is created more than a second later.
    apply(&c, service("winner", 8003));
    wait_event(&c, &ns, "Service", "winner", "EnsuredLoadBalancer", |n| {
        n.contains(&node_ip)
    });
    std::thread::sleep(Duration::from_millis(1100));
    apply(&c, service("loser", 8003));
    let ev = wait_event(&c, &ns, "Service", "loser", "PortConflict", |_| true);
    assert_shape(
        &ev,
        "Service",
        "loser",
        &service_uid(&c, "loser"),
        "Warning",
        &pod,
    );
    let winner = format!("{ns}/winner");
    assert!(
        ev["note"].as_str().is_some_and(|n| n.contains(&winner)),
        "the PortConflict Event names the winner {winner}: {ev}"
    );

    // A reserved port.
    apply(&c, service("ssh", 22));
    let ev = wait_event(&c, &ns, "Service", "ssh", "ReservedPort", |n| {
        n.contains("22")
    });
    assert_shape(
        &ev,
        "Service",
        "ssh",
        &service_uid(&c, "ssh"),
        "Warning",
        &pod,
    );

    for (name, reason) in [("winner", "PortConflict"), ("local", "PortConflict")] {
        assert!(
            events_about(&c, &ns, "Service", name, reason).is_empty(),
            "{name} has no {reason} Event"
        );
    }
    // Owned, local (Ensured, Updated, NoServingNodes), winner, loser, ssh; and in `default`, a
    // `NodeServing` on the Node when the leader's first look came before the node's heartbeat.
    assert_no_event_refused(&c, 1, 7, &[&ns, "default"]);
    c.assert_agents_authorized();
    eprintln!("measured: test took {:.1} s", t0.elapsed().as_secs_f64());
}

/// IPv4 forwarding off in the node before the agent starts: the node is not ready (its
/// `/readyz` says why), and its agent publishes a `ForwardingOff` Warning about its Node, in
/// namespace `default`, which the server accepts. Turned on, the node becomes ready; off again,
/// the problem is reported again.
#[test]
fn forwarding_off_node_event_is_accepted_and_readable() {
    if !require_root("forwarding_off_node_event_is_accepted_and_readable") {
        return;
    }
    let t0 = Instant::now();
    let mut c = Cluster::build(fast_options(1));
    let node = c.node_name(0).to_string();
    let pod = agent_pod_name(&node);
    c.node_ns(0).sh("sysctl -qw net.ipv4.ip_forward=0");
    c.start_agent(0);

    // Not ready, and the body says why (wait_ready would wait for a 200 that never comes).
    let fix = "sysctl -w net.ipv4.ip_forward=1";
    wait_for(
        "node 0 is unready because forwarding is off",
        CHANGE,
        || match c.readyz(0) {
            Ok((503, body)) if body.contains("forwarding is off") && body.contains(fix) => Ok(()),
            other => Err(format!("{other:?}")),
        },
    );
    let ev = wait_event(&c, "default", "Node", &node, "ForwardingOff", |n| {
        n.contains(fix)
    });
    assert_shape(&ev, "Node", &node, &node_uid(&c, 0), "Warning", &pod);
    assert_eq!(ev["metadata"]["namespace"], "default", "{ev}");

    // On: ready. Off again: reported again (a new Event, or the same one counted twice).
    c.node_ns(0).sh("sysctl -qw net.ipv4.ip_forward=1");
    wait_for(
        "node 0 is ready once forwarding is on",
        CHANGE,
        || match c.readyz(0) {
            Ok((200, _)) => Ok(()),
            other => Err(format!("{other:?}")),
        },
    );
    c.node_ns(0).sh("sysctl -qw net.ipv4.ip_forward=0");
    wait_for("ForwardingOff reported twice", CHANGE, || {
        let evs = events_about(&c, "default", "Node", &node, "ForwardingOff");
        let times: u64 = evs
            .iter()
            .map(|e| e["series"]["count"].as_u64().unwrap_or(1))
            .sum();
        if times >= 2 {
            Ok(())
        } else {
            Err(format!("{times} occurrences: {}", summary(&evs)))
        }
    });

    // Both occurrences were created (nodelb does not patch a series).
    assert_no_event_refused(&c, 1, 2, &["default"]);
    c.assert_agents_authorized();
    eprintln!("measured: test took {:.1} s", t0.elapsed().as_secs_f64());
}
