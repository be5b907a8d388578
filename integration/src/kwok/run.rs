//! The scenario's phases, in order (see the module's documentation), each timed.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::PathBuf;
use std::time::{Duration, Instant, SystemTime};

use k8s_openapi::api::core::v1::Node;
use kube::api::{Api, DeleteParams, Patch, PatchParams};
use kube::Client;
use serde_json::json;

use super::audit::{self, Lateness, Stretch};
use super::churn::{self, Churn, PUBLISHED_ADDRESS, PUBLISHED_ANNOTATION};
use super::fleet::{self, FakeNode, MANAGED_BY_KWOK, POOL_LABEL};
use super::sampler::Sampler;
use super::services;
use super::statuses::{Layout, StatusWatch};
use super::{Report, Scenario, NAMESPACE};
use crate::bench::{goal, loadavg, mib};
use crate::real_cluster::RealCluster;

/// How long a node in a Pod may go without a kubelet Lease renewal before the leader drops it
/// (`nodelb_core::status::heartbeat::kubelet_bound` of the kubelet's 40 s Lease: 20 s).
const LEASE_BOUND: f64 = 20.0;
/// How long after the renewal that ended a gap a removal it caused may still land: the node
/// lifecycle controller's next look, then a status round.
const SETTLE: f64 = 60.0;
/// The DESIGN's bound for a dead node to leave every status.
const NODE_LOSS_GOAL: f64 = 30.0;
/// The leader's memory goal at 10,000 Services (the latency bench's).
const LEADER_RSS_GOAL_MIB: f64 = 96.0;

fn epoch_now() -> f64 {
    SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64())
}

/// A moment of the run: the audit log's length then, and the wall clock.
#[derive(Debug, Clone, Copy)]
struct Mark {
    offset: u64,
    wall: f64,
}

/// Phases and how long each took, printed as they end.
struct Clock {
    began: Instant,
    last: Instant,
    phases: Vec<(String, Duration)>,
}

impl Clock {
    fn new() -> Clock {
        Clock {
            began: Instant::now(),
            last: Instant::now(),
            phases: Vec::new(),
        }
    }

    fn phase(&mut self, name: &str) {
        let took = self.last.elapsed();
        self.last = Instant::now();
        println!(
            "kwok: phase {name}: {:.1} s (load {})",
            took.as_secs_f64(),
            loadavg()
        );
        self.phases.push((name.to_string(), took));
    }
}

/// One run: the cluster, its client on a runtime of the run's own, and the real nodes' roles.
struct Sim<'a> {
    c: &'static RealCluster,
    s: &'a Scenario,
    rt: tokio::runtime::Runtime,
    client: Client,
    audit: PathBuf,
    /// The node whose agent leads and whose published address changes: (name, address).
    leader: (String, String),
    /// The node whose agent Pod is restarted.
    follower: (String, String),
    clock: Clock,
}

/// Runs the scenario on `c` (`scripts/cluster.sh`'s), then cleans up whatever happened;
/// prints every figure and the row.
pub fn run(c: &'static RealCluster, s: &Scenario) -> Result<Report, String> {
    if !c.is_managed() {
        return Err("the kwok scenario needs scripts/cluster.sh's cluster".into());
    }
    let real = c.nodes().to_vec();
    if real.len() != 2 {
        return Err(format!("two real nodes expected: {real:?}"));
    }
    let env = fleet::cluster_env()?;
    let get = |k: &str| {
        env.get(k)
            .cloned()
            .ok_or(format!("no {k} in cluster.sh env"))
    };
    let kubeconfig = std::fs::read_to_string(get("KUBECONFIG")?).map_err(|e| e.to_string())?;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .map_err(|e| format!("a runtime: {e}"))?;
    let client = rt.block_on(crate::control_plane::client_from_kubeconfig(&kubeconfig))?;
    println!("kwok: scenario {s:?}");
    let mut sim = Sim {
        c,
        s,
        rt,
        client,
        audit: PathBuf::from(get("AUDIT_LOG")?),
        leader: (real[0].0.clone(), real[0].1.to_string()),
        follower: (real[1].0.clone(), real[1].1.to_string()),
        clock: Clock::new(),
    };
    let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| sim.scenario()));
    let cleaned = sim.cleanup();
    sim.clock.phase("cleanup");
    let total = sim.clock.began.elapsed();
    let phases: Vec<String> = sim
        .clock
        .phases
        .iter()
        .map(|(n, d)| format!("{n} {:.0} s", d.as_secs_f64()))
        .collect();
    println!(
        "kwok: phases: {} (total {:.0} s)",
        phases.join(", "),
        total.as_secs_f64()
    );
    let report = match result {
        Ok(r) => r?,
        Err(panic) => std::panic::resume_unwind(panic),
    };
    cleaned?;
    println!("{}", report.row());
    Ok(report)
}

impl Sim<'_> {
    fn block_on<F: std::future::Future>(&self, f: F) -> F::Output {
        self.rt.block_on(f)
    }

    fn mark(&self) -> Result<Mark, String> {
        Ok(Mark {
            offset: audit::offset(&self.audit)?,
            wall: epoch_now(),
        })
    }

    fn scenario(&mut self) -> Result<Report, String> {
        self.prepare()?;
        let sampler = Sampler::start(self.rt.handle(), &self.leader.0, Duration::from_secs(5));
        let watch = StatusWatch::start(self.rt.handle(), self.client.clone(), NAMESPACE);
        let fakes = self.populate(&watch)?;
        let m0 = self.mark()?;
        self.converge(&watch)?;
        println!("kwok: so far: {}", sampler.peaks().describe());
        watch.count_removals();
        let s0 = self.mark()?;
        std::thread::sleep(self.s.steady);
        let s1 = self.mark()?;
        self.clock.phase("steady window");
        let churned = self.churn(&watch)?;
        let c1 = self.mark()?;
        let lost = self.lose(&watch, &fakes)?;
        let l1 = self.mark()?;
        let peaks = sampler.peaks();
        drop(sampler);
        println!("kwok: {}", peaks.describe());
        let (versions, errors) = watch.counts();
        println!("kwok: the watch saw {versions} status versions ({errors} watch errors)");
        let marks = [m0, s0, s1, c1, l1];
        self.analyse(&watch, &marks, &churned, &lost, peaks.leader_hwm)
    }

    /// nodelb installed, the real nodes labelled and unannotated, node-a's agent leading.
    fn prepare(&mut self) -> Result<(), String> {
        let took = self.c.install("")?;
        println!("kwok: nodelb installed in {:.1} s", took.as_secs_f64());
        for (node, _) in [&self.leader, &self.follower] {
            let patch = json!({"metadata": {"labels": {POOL_LABEL: "real"},
                                            "annotations": {PUBLISHED_ANNOTATION: null}}});
            self.block_on(patch_node(&self.client, node, patch))?;
        }
        self.block_on(lead_from(&self.client, &self.leader.0, &self.follower.0))?;
        self.clock.phase("install and leader");
        Ok(())
    }

    /// The namespace and the Services, then the simulated nodes (in this order: on this
    /// machine kube-apiserver's work per Service grows with the Services there are, and
    /// 10,000 took 11 minutes on their own; beside 1,000 simulated nodes' renewals they went
    /// at two thirds of that pace); then the agent Pods on the simulated nodes and their
    /// heartbeats, and the watch's layout.
    fn populate(&mut self, watch: &StatusWatch) -> Result<Vec<FakeNode>, String> {
        self.c
            .delete_namespace(NAMESPACE, Duration::from_secs(900))?;
        self.c.kubectl(&["create", "namespace", NAMESPACE])?;
        let ports = services::ports(self.s.services);
        let pools = self.s.pools();
        let objects = (0..self.s.services)
            .map(|i| {
                (
                    i,
                    services::service(i, ports[i], &format!("p{}", i % pools)),
                )
            })
            .collect();
        let applied = self.block_on(services::apply(
            &self.client,
            NAMESPACE,
            objects,
            self.s.concurrency,
        ))?;
        println!(
            "kwok: {} Services applied in {:.1} s",
            self.s.services,
            applied.as_secs_f64()
        );
        self.clock.phase("Services");
        let n = self.s.nodes;
        fleet::cluster_sh_kwok(&["up", &n.to_string()], self.s.pool_size)?;
        self.clock.phase("simulated nodes");
        let fakes = self.block_on(fleet::fake_nodes(&self.client))?;
        if fakes.len() < n {
            return Err(format!("{} simulated nodes of {n}", fakes.len()));
        }
        self.agents_on(&fakes)?;
        watch.set_layout(self.layout(&fakes));
        Ok(fakes)
    }

    /// Waits until every simulated node's agent Pod is Ready, then writes their heartbeats.
    fn agents_on(&mut self, fakes: &[FakeNode]) -> Result<(), String> {
        let deadline = Instant::now() + Duration::from_secs(300 + fakes.len() as u64 / 5);
        let mut said = Instant::now();
        let pods = loop {
            let pods = self.block_on(fleet::agent_pods(&self.client))?;
            let ready = fakes
                .iter()
                .filter(|f| pods.get(&f.name).is_some_and(|(_, r)| *r))
                .count();
            if ready == fakes.len() {
                break pods;
            }
            if Instant::now() > deadline {
                return Err(format!("{ready} of {} agent Pods Ready", fakes.len()));
            }
            if said.elapsed() > Duration::from_secs(15) {
                println!("kwok:   {ready} of {} agent Pods Ready", fakes.len());
                said = Instant::now();
            }
            std::thread::sleep(Duration::from_secs(3));
        };
        self.clock.phase("agent Pods on the simulated nodes");
        let pairs: Vec<(String, String)> = fakes
            .iter()
            .map(|f| (f.name.clone(), pods[&f.name].0.clone()))
            .collect();
        self.block_on(fleet::write_heartbeats(
            &self.client,
            &pairs,
            self.s.concurrency,
        ))?;
        self.clock.phase("heartbeats");
        Ok(())
    }

    /// Which node each address stands for, and the nodes each Service should list.
    fn layout(&self, fakes: &[FakeNode]) -> Layout {
        let mut node_of: HashMap<String, String> = fakes
            .iter()
            .map(|f| (f.address.clone(), f.name.clone()))
            .collect();
        let mut pools: HashMap<&str, BTreeSet<String>> = HashMap::new();
        for f in fakes {
            pools.entry(&f.pool).or_default().insert(f.name.clone());
        }
        let real: BTreeSet<String> = [&self.leader, &self.follower]
            .iter()
            .map(|(n, a)| {
                node_of.insert(a.clone(), n.clone());
                n.clone()
            })
            .collect();
        node_of.insert(PUBLISHED_ADDRESS.to_string(), self.leader.0.clone());
        let want = (0..self.s.services)
            .map(|i| {
                let pool = format!("p{}", i % self.s.pools());
                let mut nodes = real.clone();
                nodes.extend(pools.get(pool.as_str()).into_iter().flatten().cloned());
                (services::name(i), nodes)
            })
            .collect();
        Layout { node_of, want }
    }

    /// Waits until every status lists exactly its nodes.
    fn converge(&mut self, watch: &StatusWatch) -> Result<(), String> {
        let deadline = Instant::now() + Duration::from_secs(600 + self.s.services as u64 / 20);
        let mut said = Instant::now();
        loop {
            let (ok, all, other) = watch.converged();
            if ok == all {
                break;
            }
            if Instant::now() > deadline {
                return Err(format!(
                    "{ok} of {all} statuses list their nodes; one that does not: {other:?}"
                ));
            }
            if said.elapsed() > Duration::from_secs(20) {
                println!("kwok:   {ok} of {all} statuses list their nodes");
                said = Instant::now();
            }
            std::thread::sleep(Duration::from_secs(2));
        }
        self.clock.phase("every status listing its nodes");
        Ok(())
    }

    /// The churn window; then the restarted agent's Pod Ready again.
    fn churn(&mut self, watch: &StatusWatch) -> Result<churn::Outcome, String> {
        let outcome = self.block_on(
            Churn {
                client: self.client.clone(),
                watch,
                toggled: self.leader.clone(),
                restarted: self.follower.0.clone(),
                window: self.s.churn,
                toggle_every: self.s.toggle_every,
                restart_every: self.s.restart_every,
            }
            .run(),
        )?;
        let follower = self.follower.0.clone();
        let deadline = Instant::now() + Duration::from_secs(120);
        while !self
            .block_on(fleet::agent_pods(&self.client))?
            .get(&follower)
            .is_some_and(|(_, ready)| *ready)
        {
            if Instant::now() > deadline {
                return Err(format!("the agent on {follower} is not Ready again"));
            }
            std::thread::sleep(Duration::from_secs(1));
        }
        println!(
            "kwok: churn: {} rounds, {} restarts of {follower}'s agent ({:?})",
            outcome.rounds.len(),
            outcome.restarts.len(),
            outcome
                .restarts
                .iter()
                .map(|(t, _)| t.as_secs())
                .collect::<Vec<_>>()
        );
        self.clock.phase("churn window");
        Ok(outcome)
    }

    /// One simulated node stops renewing its Lease, another's Node is deleted; waits until no
    /// status lists either. The first node, when each was lost, and how long each took.
    fn lose(&mut self, watch: &StatusWatch, fakes: &[FakeNode]) -> Result<Lost, String> {
        let stopped = fakes[0].clone();
        let deleted = fakes
            .iter()
            .find(|f| f.pool != stopped.pool)
            .unwrap_or(&fakes[1])
            .clone();
        watch.lose(&stopped.name);
        let at = epoch_now();
        let patch = json!({"metadata": {"labels": {MANAGED_BY_KWOK: null}}});
        self.block_on(patch_node(&self.client, &stopped.name, patch))?;
        watch.lose(&deleted.name);
        self.block_on(async {
            Api::<Node>::all(self.client.clone())
                .delete(&deleted.name, &DeleteParams::default())
                .await
                .map_err(|e| format!("deleting Node {}: {e}", deleted.name))
        })?;
        let deadline = Instant::now() + Duration::from_secs(180);
        let (a, b) = loop {
            let (a, b) = (watch.loss(&stopped.name), watch.loss(&deleted.name));
            if (a.0 == 0 && b.0 == 0) || Instant::now() > deadline {
                break (a, b);
            }
            std::thread::sleep(Duration::from_secs(1));
        };
        println!(
            "kwok: node loss: {} (renewals stopped) left its last status after {:.1} s ({} \
             still listing it); Node {} deleted: {:.1} s ({} still listing it)",
            stopped.name,
            a.1.as_secs_f64(),
            a.0,
            deleted.name,
            b.1.as_secs_f64(),
            b.0
        );
        self.clock.phase("node loss");
        if a.0 > 0 || b.0 > 0 {
            return Err("a lost node stayed in some statuses for 180 s".into());
        }
        Ok(Lost {
            stopped: stopped.name,
            at,
            took: a.1,
            deleted: deleted.name,
            deleted_took: b.1,
        })
    }
}

/// What the node-loss phase measured.
struct Lost {
    stopped: String,
    /// When it was taken out of kwok's hands.
    at: f64,
    took: Duration,
    deleted: String,
    deleted_took: Duration,
}

async fn patch_node(client: &Client, node: &str, patch: serde_json::Value) -> Result<(), String> {
    Api::<Node>::all(client.clone())
        .patch(node, &PatchParams::default(), &Patch::Merge(patch))
        .await
        .map(|_| ())
        .map_err(|e| format!("patching Node {node}: {e}"))
}

/// Makes `leader`'s agent the status leader: while `follower`'s holds the Lease with both
/// agents Ready, the follower's Pod is deleted (gracefully: it releases the Lease on its way
/// out, and the leader's agent, already running, takes it; the follower's next agent may
/// be quicker, hence the retries).
async fn lead_from(client: &Client, leader: &str, follower: &str) -> Result<(), String> {
    let deadline = Instant::now() + Duration::from_secs(300);
    loop {
        let pods = fleet::agent_pods(client).await?;
        let holder = fleet::leader(client).await?;
        let ready = |n: &str| pods.get(n).filter(|(_, ready)| *ready).map(|(p, _)| p);
        match (ready(leader), ready(follower)) {
            (Some(l), Some(_)) if holder.as_ref() == Some(l) => {
                println!("kwok: {leader}'s agent {l} leads");
                return Ok(());
            }
            (Some(_), Some(f)) if holder.as_ref() == Some(f) => {
                println!("kwok: {follower}'s agent {f} leads: deleting its Pod");
                Api::<k8s_openapi::api::core::v1::Pod>::namespaced(
                    client.clone(),
                    crate::real_cluster::NODELB_NAMESPACE,
                )
                .delete(f, &DeleteParams::default())
                .await
                .map_err(|e| format!("deleting Pod {f}: {e}"))?;
                tokio::time::sleep(Duration::from_secs(5)).await;
            }
            _ => {}
        }
        if Instant::now() > deadline {
            return Err(format!("{leader}'s agent does not lead: holder {holder:?}"));
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}

impl Sim<'_> {
    /// Reads the audit log's stretches, judges every removal, prints every figure and goal.
    fn analyse(
        &self,
        watch: &StatusWatch,
        marks: &[Mark; 5],
        churned: &churn::Outcome,
        lost: &Lost,
        leader_hwm: u64,
    ) -> Result<Report, String> {
        let [m0, s0, s1, c1, l1] = *marks;
        let sources: BTreeMap<String, String> = [&self.leader, &self.follower]
            .iter()
            .map(|(n, a)| (a.clone(), n.clone()))
            .collect();
        let read = |a: Mark, b: Mark| audit::read(&self.audit, a.offset, b.offset, &sources);
        let setup = read(m0, s0)?;
        let steady = read(s0, s1)?;
        let mut until_churn_end = steady.clone();
        let churn_stretch = read(s1, c1)?;
        until_churn_end.merge(churn_stretch.clone());
        let mut all = until_churn_end.clone();
        all.merge(read(c1, l1)?);
        self.lateness(&setup, s0.wall, lost, "while the statuses converged");
        self.lateness(
            &until_churn_end,
            c1.wall,
            lost,
            "in the steady and churn windows",
        );
        all.merge(setup);
        let rate = self.requests(&steady, (s1.wall - s0.wall) / 60.0, "steady window");
        self.requests(&churn_stretch, (c1.wall - s1.wall) / 60.0, "churn window");
        let false_removals = self.removals(watch, &all);
        let hwm = self.leader_hwm().unwrap_or(leader_hwm);
        let round = churned
            .rounds
            .iter()
            .map(|r| r.took)
            .max()
            .unwrap_or_default();
        let dead_since = all
            .renewals
            .get(&lost.stopped)
            .and_then(|t| t.iter().rev().find(|t| **t <= lost.at + 1.0))
            .copied();
        let report = Report {
            nodes: self.s.nodes,
            services: self.s.services,
            leader_rss_mib: mib(hwm),
            round_ms: round.as_secs_f64() * 1e3,
            node_loss_s: lost.took.as_secs_f64(),
            requests_per_node_min: rate,
            false_removals,
        };
        self.goals(&report, churned, lost, dead_since);
        Ok(report)
    }

    fn leader_hwm(&self) -> Option<u64> {
        let pid = fleet::agent_pid(&self.leader.0)?;
        crate::bench::memory(pid).ok().map(|m| m.hwm)
    }

    /// Renewal lateness of the real kubelets' and kwok's Leases in a stretch that ended at
    /// `end` (the lost nodes left out).
    fn lateness(&self, stretch: &Stretch, end: f64, lost: &Lost, when: &str) {
        let real = [&self.leader.0, &self.follower.0];
        let is_real = |l: &str| real.iter().any(|r| *r == l);
        let classes = [
            (
                "real kubelets",
                Lateness::of(&stretch.renewals, is_real, end),
            ),
            (
                "kwok",
                Lateness::of(
                    &stretch.renewals,
                    |l| !is_real(l) && l != lost.stopped && l != lost.deleted,
                    end,
                ),
            ),
        ];
        for (who, l) in classes {
            println!(
                "kwok: Lease renewals of {who} {when}: {} Leases, {} renewals; gaps max {:.1} s, \
                 p99 {:.1} s, over 15 s: {}, over 20 s: {}",
                l.leases,
                l.renewals,
                l.max(),
                l.p99(),
                l.over(15.0),
                l.over(20.0)
            );
        }
    }

    /// nodelb's requests per minute by verb, the leader's and the follower's; returns the
    /// total extrapolated to every node of the run.
    fn requests(&self, stretch: &Stretch, minutes: f64, what: &str) -> f64 {
        let none = BTreeMap::new();
        let of = |n: &str| stretch.requests.get(n).unwrap_or(&none).clone();
        let (leader, follower) = (of(&self.leader.0), of(&self.follower.0));
        let verbs: BTreeSet<&String> = leader.keys().chain(follower.keys()).collect();
        let nodes = (self.s.nodes + 2) as f64;
        let per_min = |m: &BTreeMap<String, usize>, v: &str| {
            m.get(v).copied().unwrap_or(0) as f64 / minutes.max(1e-9)
        };
        let mut total = (0.0, 0.0);
        for v in verbs {
            let (l, f) = (per_min(&leader, v), per_min(&follower, v));
            total = (total.0 + l, total.1 + f);
            println!(
                "kwok: requests in the {what}, {v}: leader {l:.2}/min, follower {f:.2}/min, \
                 per node at {nodes} nodes {:.3}/min",
                (l + (nodes - 1.0) * f) / nodes
            );
        }
        for (role, node) in [("leader", &self.leader.0), ("follower", &self.follower.0)] {
            let mut top: Vec<(&String, &usize)> =
                stretch.objects.get(node).into_iter().flatten().collect();
            top.sort_by(|a, b| b.1.cmp(a.1).then(a.0.cmp(b.0)));
            let top: Vec<String> = top
                .iter()
                .take(6)
                .map(|(o, n)| format!("{o} x{n}"))
                .collect();
            println!(
                "kwok: requests in the {what}, the {role}'s most: {}",
                top.join("; ")
            );
        }
        let others: Vec<&String> = stretch
            .requests
            .keys()
            .filter(|n| **n != self.leader.0 && **n != self.follower.0)
            .collect();
        let at = |n: f64| (total.0 + (n - 1.0) * total.1) / n;
        println!(
            "kwok: requests in the {what} ({minutes:.1} min): leader {:.2}/min, follower \
             {:.2}/min; per node per minute at {nodes} nodes {:.3}, at 5000 nodes {:.3}{}",
            total.0,
            total.1,
            at(nodes),
            at(5000.0),
            if others.is_empty() {
                String::new()
            } else {
                format!(" (also from {others:?})")
            }
        );
        at(nodes)
    }

    /// Every removal, judged: a real node's is false; a simulated node's is false unless its
    /// Lease's renewals explain it. Prints them by node; returns how many were false.
    fn removals(&self, watch: &StatusWatch, stretch: &Stretch) -> usize {
        let removals = watch.removals();
        let real = [&self.leader.0, &self.follower.0];
        let none = Vec::new();
        let mut by_node: BTreeMap<&str, (usize, usize)> = BTreeMap::new();
        let mut shown = 0;
        for r in &removals {
            let times = stretch.renewals.get(&r.node).unwrap_or(&none);
            let false_one =
                real.contains(&&r.node) || !audit::explains(times, r.at, LEASE_BOUND, SETTLE);
            let e = by_node.entry(&r.node).or_default();
            e.0 += 1;
            if false_one {
                e.1 += 1;
                if shown < 10 {
                    shown += 1;
                    let near: Vec<String> = times
                        .iter()
                        .filter(|t| (**t - r.at).abs() < 60.0)
                        .map(|t| format!("{:+.1}", t - r.at))
                        .collect();
                    println!(
                        "kwok: FALSE removal: {} dropped {} (renewals at {near:?} s from it)",
                        r.service, r.node
                    );
                }
            }
        }
        for (node, (n, f)) in &by_node {
            println!("kwok: removals of {node}: {n}, of which false {f}");
        }
        let false_total = by_node.values().map(|(_, f)| f).sum();
        println!(
            "kwok: {} removals in all, {false_total} false ({} nodes ever dropped)",
            removals.len(),
            by_node.len()
        );
        false_total
    }

    fn goals(&self, r: &Report, churned: &churn::Outcome, lost: &Lost, dead_since: Option<f64>) {
        let rounds: Vec<String> = churned
            .rounds
            .iter()
            .map(|r| {
                format!(
                    "{:.1}{}",
                    r.took.as_secs_f64(),
                    if r.pending > 0 { "+" } else { "" }
                )
            })
            .collect();
        println!("kwok: rounds (s): {}", rounds.join(" "));
        if let Some(t) = dead_since {
            println!(
                "kwok: {}'s last renewal was {:.1} s before it was taken out of kwok's hands: \
                 it left every status {:.1} s after that renewal",
                lost.stopped,
                lost.at - t,
                lost.at - t + lost.took.as_secs_f64()
            );
        }
        println!(
            "kwok: Node {} deleted: left every status after {:.1} s",
            lost.deleted,
            lost.deleted_took.as_secs_f64()
        );
        println!(
            "kwok: goal false_removals == 0: {}",
            goal(r.false_removals == 0)
        );
        println!(
            "kwok: goal requests_per_node_min <= 1: {}",
            goal(r.requests_per_node_min <= 1.0)
        );
        println!(
            "kwok: goal node_loss_s <= {NODE_LOSS_GOAL}: {}",
            goal(r.node_loss_s <= NODE_LOSS_GOAL)
        );
        println!(
            "kwok: goal leader_rss_mib < {LEADER_RSS_GOAL_MIB}: {}",
            goal(r.leader_rss_mib < LEADER_RSS_GOAL_MIB)
        );
    }

    /// Removes what the run made, whatever happened; the first error.
    fn cleanup(&mut self) -> Result<(), String> {
        let mut errors = Vec::new();
        let deleted = self.block_on(services::delete_all(
            &self.client,
            NAMESPACE,
            self.s.concurrency,
        ));
        match deleted {
            Ok(n) => println!("kwok: cleanup: {n} Services deleted"),
            Err(e) => errors.push(e),
        }
        if let Err(e) = self.c.kubectl(&[
            "delete",
            "namespace",
            NAMESPACE,
            "--ignore-not-found",
            "--wait=false",
        ]) {
            errors.push(e);
        }
        if let Err(e) = fleet::cluster_sh_kwok(&["down"], self.s.pool_size) {
            errors.push(e);
        }
        for (node, _) in [self.leader.clone(), self.follower.clone()] {
            let patch = json!({"metadata": {"labels": {POOL_LABEL: null},
                                            "annotations": {PUBLISHED_ANNOTATION: null}}});
            if let Err(e) = self.block_on(patch_node(&self.client, &node, patch)) {
                errors.push(e);
            }
        }
        match errors.into_iter().next() {
            None => Ok(()),
            Some(e) => Err(format!("cleanup: {e}")),
        }
    }
}
