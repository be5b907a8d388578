//! The leader's judgement of node liveness (`heartbeat::Liveness`): which signals keep a node
//! in the status, how long each may go unrenewed, what happens when one cannot be read, and
//! what a new leader does after a takeover. Time is an input: every rule is checked without
//! sleeping.

use super::election::Takeover;
use super::heartbeat::{self, kubelet_bound, AgentPod, Heartbeat, KubeletLease, Kubelets, Why};
use super::*;
use crate::fixtures::{heartbeat, NOW};
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use std::time::Instant;

/// `--node-lease-duration`'s default.
const LEASE: Duration = Duration::from_secs(15);

fn now() -> Timestamp {
    NOW.parse().unwrap()
}

fn secs(s: u64) -> Duration {
    Duration::from_secs(s)
}

fn at(s: i64) -> Timestamp {
    now() + SignedDuration::from_secs(s)
}

/// The heartbeat of `node`'s agent outside a Pod, renewed at `renewed`.
fn plain(node: &str, renewed: Timestamp) -> (String, Heartbeat) {
    let beat = heartbeat(node).renewed(renewed).families("IPv4");
    (node.to_string(), beat.heartbeat())
}

/// The heartbeat of `node`'s agent in Pod `nodelb-<node>`, written at `written`.
fn in_pod(node: &str, written: Timestamp) -> (String, Heartbeat) {
    let beat = heartbeat(node).renewed(written).families("IPv4").by_pod();
    (node.to_string(), beat.heartbeat())
}

fn beats(list: &[(String, Heartbeat)]) -> BTreeMap<String, Heartbeat> {
    list.iter().cloned().collect()
}

/// Every node's Pod `nodelb-<node>` on its node, Ready or not, and its kubelet's node Lease
/// renewed at `renewed` (the kubelet's default 40 s Lease).
fn kubelets(nodes: &[(&str, Timestamp, bool)]) -> Kubelets {
    Kubelets {
        pods: Some(
            nodes
                .iter()
                .map(|(n, _, ready)| {
                    let pod = AgentPod {
                        node: n.to_string(),
                        ready: *ready,
                    };
                    (format!("nodelb-{n}"), pod)
                })
                .collect(),
        ),
        leases: Some(
            nodes
                .iter()
                .map(|(n, renewed, _)| {
                    let lease = KubeletLease {
                        renewed: *renewed,
                        duration: Some(secs(40)),
                    };
                    (n.to_string(), lease)
                })
                .collect(),
        ),
        unknown: BTreeSet::new(),
    }
}

/// Whether node-a lives at `t` (the leader's clock).
fn alive(
    o: &mut heartbeat::Liveness,
    b: &BTreeMap<String, Heartbeat>,
    k: &Kubelets,
    t: Instant,
) -> bool {
    o.judge(b, k, LEASE, t)["node-a"].alive
}

#[test]
fn a_node_clock_minutes_behind_or_ahead_still_serves() {
    let mut o = heartbeat::Liveness::default();
    let t0 = Instant::now();
    // node-behind writes renewTimes 3 minutes in the past, node-ahead 3 minutes in the future:
    // each renewal changes the value, and that change is all the leader looks at.
    for round in 0..10u64 {
        let t = at(round as i64 * 2);
        let b = beats(&[
            plain("node-behind", t - SignedDuration::from_mins(3)),
            plain("node-ahead", t + SignedDuration::from_mins(3)),
        ]);
        let judged = o.judge(&b, &Kubelets::default(), LEASE, t0 + secs(round * 2));
        assert!(judged["node-behind"].alive, "round {round}");
        assert_eq!(judged["node-ahead"].age, Duration::ZERO, "round {round}");
    }
}

#[test]
fn an_agent_outside_a_pod_lives_while_its_heartbeat_is_younger_than_a_lease_duration() {
    let mut o = heartbeat::Liveness::default();
    let t0 = Instant::now();
    let k = Kubelets::default();
    o.judge(&beats(&[plain("node-a", at(0))]), &k, LEASE, t0);
    let renewed = beats(&[plain("node-a", at(5))]);
    assert!(alive(&mut o, &renewed, &k, t0 + secs(5)));
    // No renewal after that: the age grows on the leader's clock alone.
    let j = o.judge(&renewed, &k, LEASE, t0 + secs(19));
    assert_eq!((j["node-a"].alive, j["node-a"].age), (true, secs(14)));
    let j = o.judge(&renewed, &k, LEASE, t0 + secs(20));
    assert_eq!(
        (j["node-a"].alive, j["node-a"].why),
        (false, Some(Why::Heartbeat))
    );
}

#[test]
fn an_agent_in_a_ready_pod_lives_on_its_kubelets_renewals_without_its_own() {
    let mut o = heartbeat::Liveness::default();
    let t0 = Instant::now();
    let b = beats(&[in_pod("node-a", at(0)), plain("node-b", at(0))]);
    // The kubelets renew every 10 s; the agents never write again.
    for round in 0..12u64 {
        let k = kubelets(&[
            ("node-a", at(round as i64 * 10), true),
            ("node-b", at(round as i64 * 10), true),
        ]);
        o.judge(&b, &k, LEASE, t0 + secs(round * 10));
        let j = o.judge(&b, &k, LEASE, t0 + secs(round * 10 + 9));
        assert_eq!((j["node-a"].alive, j["node-a"].age), (true, secs(9)));
        assert_eq!(j["node-b"].alive, round == 0, "round {round}: not in a Pod");
    }
}

#[test]
fn a_stopped_kubelet_drops_its_node_after_two_of_its_periods_even_with_a_ready_pod() {
    let mut o = heartbeat::Liveness::default();
    let t0 = Instant::now();
    let b = beats(&[in_pod("node-a", at(0))]);
    let k = kubelets(&[("node-a", at(0), true)]);
    assert_eq!(kubelet_bound(Some(secs(40))), secs(20));
    o.judge(&b, &k, LEASE, t0);
    assert!(alive(&mut o, &b, &k, t0 + secs(19)));
    let j = o.judge(&b, &k, LEASE, t0 + secs(20));
    assert_eq!(
        (j["node-a"].alive, j["node-a"].why),
        (false, Some(Why::Kubelet))
    );
    // A kubelet Lease of 80 s renews every 20 s: judged against 40 s.
    let mut o = heartbeat::Liveness::default();
    let mut long = k.clone();
    long.leases
        .as_mut()
        .unwrap()
        .get_mut("node-a")
        .unwrap()
        .duration = Some(secs(80));
    o.judge(&b, &long, LEASE, t0);
    assert!(alive(&mut o, &b, &long, t0 + secs(39)));
    assert!(!alive(&mut o, &b, &long, t0 + secs(40)));
}

#[test]
fn an_unready_pod_keeps_its_node_only_while_its_agent_renews_the_heartbeat() {
    let t0 = Instant::now();
    let k = kubelets(&[("node-a", at(0), false)]);
    let mut o = heartbeat::Liveness::default();
    // The agent's readiness fails: it renews every 5 s, so the node stays.
    for round in 0..6u64 {
        let b = beats(&[in_pod("node-a", at(round as i64 * 5))]);
        let k = kubelets(&[("node-a", at(round as i64 * 10 / 10), false)]);
        assert!(alive(&mut o, &b, &k, t0 + secs(round * 5)), "round {round}");
    }
    // A hung or deaf agent renews nothing: once its Pod is unready it is out at once.
    let mut o = heartbeat::Liveness::after(None);
    let b = beats(&[in_pod("node-a", at(-3600))]);
    let ready = kubelets(&[("node-a", at(0), true)]);
    assert!(alive(&mut o, &b, &ready, t0));
    let j = o.judge(&b, &k, LEASE, t0 + secs(16));
    assert_eq!(
        (j["node-a"].alive, j["node-a"].why),
        (false, Some(Why::PodNotReady))
    );
    // A Pod on another node, or none, is no Ready Pod of this node's.
    let mut elsewhere = ready.clone();
    elsewhere
        .pods
        .as_mut()
        .unwrap()
        .get_mut("nodelb-node-a")
        .unwrap()
        .node = "node-b".into();
    assert!(!alive(&mut o, &b, &elsewhere, t0 + secs(17)));
    let mut none = ready.clone();
    none.pods = Some(BTreeMap::new());
    assert!(!alive(&mut o, &b, &none, t0 + secs(17)));
}

#[test]
fn kubelet_leases_the_leader_cannot_read_never_drop_a_node_the_node_controller_still_trusts() {
    let t0 = Instant::now();
    let b = beats(&[in_pod("node-a", at(-3600)), in_pod("node-b", at(-3600))]);
    let mut k = kubelets(&[("node-a", at(0), true), ("node-b", at(0), true)]);
    k.leases = None;
    let mut o = heartbeat::Liveness::default();
    // Minutes without any renewal the leader can see: both Pods Ready, both nodes live.
    for t in [0, 60, 600] {
        let j = o.judge(&b, &k, LEASE, t0 + secs(t));
        assert!(j["node-a"].alive && j["node-b"].alive, "at {t} s");
    }
    // The node lifecycle controller marks node-b Unknown: it is out.
    k.unknown.insert("node-b".into());
    let j = o.judge(&b, &k, LEASE, t0 + secs(601));
    assert!(j["node-a"].alive);
    assert_eq!(
        (j["node-b"].alive, j["node-b"].why),
        (false, Some(Why::NodeUnknown))
    );
}

#[test]
fn pods_the_leader_cannot_read_give_every_agent_in_a_pod_the_slow_renewal_to_renew() {
    let t0 = Instant::now();
    let b = beats(&[in_pod("node-a", at(-3600))]);
    let k = kubelets(&[("node-a", at(0), true)]);
    let mut o = heartbeat::Liveness::default();
    assert!(alive(&mut o, &b, &k, t0));
    // The Pods stop being readable at 10 s; the kubelet keeps renewing.
    let mut no_pods = kubelets(&[("node-a", at(10), true)]);
    no_pods.pods = None;
    assert!(alive(&mut o, &b, &no_pods, t0 + secs(10)), "grace");
    let k2 = |s: i64| {
        let mut k = kubelets(&[("node-a", at(s), true)]);
        k.pods = None;
        k
    };
    assert!(alive(
        &mut o,
        &b,
        &k2(270),
        t0 + secs(10) + heartbeat::SLOW_BOUND - secs(1)
    ));
    assert!(
        !alive(&mut o, &b, &k2(280), t0 + secs(10) + heartbeat::SLOW_BOUND),
        "no slow renewal within the bound"
    );
    // An agent that renews every SLOW_RENEWAL lives.
    let mut o = heartbeat::Liveness::default();
    o.judge(&b, &k, LEASE, t0);
    for round in 1..10u64 {
        let renewed = beats(&[in_pod("node-a", at((round * 90) as i64))]);
        let t = t0 + heartbeat::SLOW_RENEWAL * round as u32;
        assert!(
            alive(&mut o, &renewed, &k2((round * 90) as i64), t),
            "round {round}"
        );
    }
}

#[test]
fn a_new_leader_gives_every_node_one_bound_of_grace() {
    // The stored renewals are an hour old by any clock; a leader that has just started sees
    // them for the first time and counts from then.
    let t0 = Instant::now();
    let old = at(-3600);
    let b = beats(&[plain("node-a", old), in_pod("node-b", old)]);
    let k = kubelets(&[("node-b", old, true)]);
    let mut o = heartbeat::Liveness::after(None);
    let j = o.judge(&b, &k, LEASE, t0);
    assert!(j["node-a"].alive && j["node-b"].alive);
    let j = o.judge(&b, &k, LEASE, t0 + LEASE);
    assert!(!j["node-a"].alive, "one lease duration without a change");
    assert!(j["node-b"].alive, "the kubelet's bound is longer");
    let j = o.judge(&b, &k, LEASE, t0 + secs(20));
    assert!(!j["node-b"].alive);
}

#[test]
fn after_a_takeover_the_silent_holders_node_gets_no_new_grace_for_what_it_did_not_renew() {
    let t0 = Instant::now();
    // node-a's agent held the Lease and last renewed it at 100 s by its node's clock; this
    // candidate saw that record first at t0 and took over 15 s later.
    let takeover = Takeover {
        holder: "nodelb-node-a".into(),
        renewed: Some(at(100)),
        silent_since: t0,
        margin: secs(2),
    };
    let later = t0 + secs(17);
    // Outside a Pod: its heartbeat, renewed before it fell silent (or less than its retry
    // period after its last election renewal: alive, it would have renewed that too), is as
    // old as the silence.
    let b = beats(&[plain("node-a", at(102)), plain("node-b", at(98))]);
    let mut o = heartbeat::Liveness::after(Some(takeover.clone()));
    let j = o.judge(&b, &Kubelets::default(), LEASE, later);
    assert_eq!(
        (j["node-a"].alive, j["node-a"].age),
        (false, secs(17)),
        "dropped at the first look"
    );
    assert_eq!(j["node-b"].age, Duration::ZERO, "another node: grace");
    // Renewed later than that (the agent restarted and renews): alive.
    let b = beats(&[plain("node-a", at(103))]);
    let mut o = heartbeat::Liveness::after(Some(takeover.clone()));
    assert!(o.judge(&b, &Kubelets::default(), LEASE, later)["node-a"].alive);
    // In a Pod on a dead node: the kubelet's Lease, renewed by the same node's clock before the
    // holder fell silent, counts from the silence too, so the node is out 20 s after it.
    let b = beats(&[in_pod("node-a", at(-3600))]);
    let k = kubelets(&[("node-a", at(95), true)]);
    let mut o = heartbeat::Liveness::after(Some(takeover.clone()));
    assert!(o.judge(&b, &k, LEASE, later)["node-a"].alive);
    let j = o.judge(&b, &k, LEASE, t0 + secs(20));
    assert_eq!(
        (j["node-a"].alive, j["node-a"].why),
        (false, Some(Why::Kubelet))
    );
    // Only the first look backdates: a renewal after it counts as usual.
    let mut o = heartbeat::Liveness::after(Some(takeover));
    o.judge(&b, &k, LEASE, later);
    let renewed = kubelets(&[("node-a", at(105), true)]);
    assert!(o.judge(&b, &renewed, LEASE, t0 + secs(18))["node-a"].alive);
    assert!(o.judge(&b, &renewed, LEASE, t0 + secs(37))["node-a"].alive);
}

#[test]
fn ages_for_the_status_put_the_dead_at_the_lease_duration() {
    let t0 = Instant::now();
    let b = beats(&[plain("node-a", at(0)), plain("node-b", at(0))]);
    let mut o = heartbeat::Liveness::default();
    o.judge(&b, &Kubelets::default(), LEASE, t0);
    let b2 = beats(&[plain("node-a", at(10)), plain("node-b", at(0))]);
    let j = o.judge(&b2, &Kubelets::default(), LEASE, t0 + secs(16));
    let ages = heartbeat::ages(&j, LEASE);
    assert_eq!(ages["node-a"], Duration::ZERO);
    assert_eq!(ages["node-b"], LEASE);
    // And the status drops the dead one.
    let w = super::tests::World::two_nodes().service(super::tests::lb("web", 80));
    let all = heartbeat::read(&w.leases);
    let mut s = Status::default();
    let fresh: BTreeMap<String, Duration> =
        all.keys().map(|n| (n.clone(), Duration::ZERO)).collect();
    s.compute(&w.objects, &w.nodes, &all, &fresh, &w.cfg);
    let key = crate::vocab::ServiceKey::new("default", "web");
    assert_eq!(s.desired()[&key].ingress.len(), 2);
    let dead: BTreeMap<String, Duration> = all.keys().map(|n| (n.clone(), LEASE)).collect();
    s.compute(&w.objects, &w.nodes, &all, &dead, &w.cfg);
    assert!(s.desired()[&key].ingress.is_empty());
}

#[test]
fn a_liveness_note_ends_every_condition_and_rewrites_each() {
    let w = super::tests::World::two_nodes().service(super::tests::lb("web", 80));
    let all = heartbeat::read(&w.leases);
    let fresh: BTreeMap<String, Duration> =
        all.keys().map(|n| (n.clone(), Duration::ZERO)).collect();
    let mut s = Status::default();
    s.compute(&w.objects, &w.nodes, &all, &fresh, &w.cfg);
    let key = crate::vocab::ServiceKey::new("default", "web");
    let plain = s.desired()[&key].serving.clone();
    let plain_message = plain.message.clone();
    let mut cfg = w.cfg.clone();
    cfg.liveness =
        Some("liveness degraded: nodelb cannot list and watch leases in kube-node-lease".into());
    let changed = s.compute(&w.objects, &w.nodes, &all, &fresh, &cfg);
    assert!(changed.contains(&key), "every condition is rewritten");
    let message = &s.desired()[&key].serving.message;
    assert_eq!(
        *message,
        format!("{plain_message}; liveness degraded: nodelb cannot list and watch leases in kube-node-lease")
    );
    assert_eq!(
        (
            s.desired()[&key].serving.status,
            s.desired()[&key].serving.reason
        ),
        (plain.status, plain.reason),
        "the same condition, with the note"
    );
    let changed = s.compute(&w.objects, &w.nodes, &all, &fresh, &w.cfg);
    assert!(changed.contains(&key));
    assert_eq!(s.desired()[&key].serving.message, plain_message);
}
