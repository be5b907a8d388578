//! Every version of every Service's status in one namespace, as a watch on the server delivers
//! them, read as the nodes each version lists: how many Services list exactly the nodes they
//! should (convergence), every node a version dropped that the one before listed (removals,
//! judged later against the nodes' Lease renewals), how long a change of node-a's published
//! address took to reach every Service (a round), and how long a lost node took to leave every
//! Service that listed it.

use std::collections::{BTreeSet, HashMap, HashSet};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use futures::TryStreamExt;
use k8s_openapi::api::core::v1::Service;
use kube::api::Api;
use kube::runtime::watcher::{self, Event};
use kube::runtime::WatchStreamExt;
use kube::Client;

/// Where the addresses and the Services' nodes come from.
#[derive(Debug, Clone, Default)]
pub struct Layout {
    /// Address → the node it stands for (a node's own, or one it publishes instead).
    pub node_of: HashMap<String, String>,
    /// Service name → the nodes it should list.
    pub want: HashMap<String, BTreeSet<String>>,
}

/// A node that one version of a Service's status dropped.
#[derive(Debug, Clone, PartialEq)]
pub struct Removal {
    /// When the watch delivered that version (seconds since the epoch).
    pub at: f64,
    pub service: String,
    pub node: String,
}

/// The Services still to reach something, and when the last one did.
#[derive(Debug, Clone)]
struct Progress {
    began: Instant,
    pending: HashSet<String>,
    last: Option<Instant>,
}

impl Progress {
    fn new(pending: HashSet<String>) -> Progress {
        Progress {
            began: Instant::now(),
            pending,
            last: None,
        }
    }

    fn reached(&mut self, service: &str, now: Instant) {
        if self.pending.remove(service) {
            self.last = Some(now);
        }
    }

    /// (Services pending, time from the start to the last one that reached it).
    fn read(&self) -> (usize, Duration) {
        let took = self.last.map_or(Duration::ZERO, |l| l - self.began);
        (self.pending.len(), took)
    }
}

#[derive(Debug, Default)]
struct State {
    layout: Layout,
    /// Service → the addresses its status lists now.
    ips: HashMap<String, BTreeSet<String>>,
    counting: bool,
    /// Nodes the scenario took down: their leaving is no removal.
    dead: HashSet<String>,
    removals: Vec<Removal>,
    versions: u64,
    /// The address node-a should show, and the Services still to show it.
    round: Option<(String, Progress)>,
    /// Lost node → the Services still listing it.
    losses: HashMap<String, Progress>,
}

fn epoch_now() -> f64 {
    SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64())
}

impl State {
    fn nodes(&self, ips: &BTreeSet<String>) -> BTreeSet<String> {
        ips.iter()
            .map(|ip| {
                self.layout
                    .node_of
                    .get(ip)
                    .cloned()
                    .unwrap_or_else(|| format!("?{ip}"))
            })
            .collect()
    }

    fn update(&mut self, service: &str, ips: BTreeSet<String>, now: Instant) {
        let before = self.ips.get(service).cloned().unwrap_or_default();
        if before == ips && self.ips.contains_key(service) {
            return;
        }
        self.versions += 1;
        let (old, new) = (self.nodes(&before), self.nodes(&ips));
        if self.counting {
            let at = epoch_now();
            for node in old.difference(&new).filter(|n| !self.dead.contains(*n)) {
                self.removals.push(Removal {
                    at,
                    service: service.to_string(),
                    node: node.clone(),
                });
            }
        }
        if let Some((target, p)) = &mut self.round {
            if ips.contains(target) {
                p.reached(service, now);
            }
        }
        for (node, p) in &mut self.losses {
            if !new.contains(node) {
                p.reached(service, now);
            }
        }
        self.ips.insert(service.to_string(), ips);
    }
}

/// A watch on every Service of a namespace, until dropped.
pub struct StatusWatch {
    state: Arc<Mutex<State>>,
    errors: Arc<AtomicUsize>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for StatusWatch {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl StatusWatch {
    /// Starts watching the Services of `ns` on `rt`.
    pub fn start(rt: &tokio::runtime::Handle, client: Client, ns: &str) -> StatusWatch {
        let api: Api<Service> = Api::namespaced(client, ns);
        let state = Arc::new(Mutex::new(State::default()));
        let errors = Arc::new(AtomicUsize::new(0));
        let (s, e) = (state.clone(), errors.clone());
        let task = rt.spawn(async move {
            let stream = watcher::watcher(api, watcher::Config::default()).default_backoff();
            let mut stream = std::pin::pin!(stream);
            loop {
                match stream.try_next().await {
                    Ok(Some(Event::Apply(svc) | Event::InitApply(svc))) => {
                        let name = svc.metadata.name.clone().unwrap_or_default();
                        let ips = crate::e2e::ingress_ips(&svc).into_iter().collect();
                        let now = Instant::now();
                        s.lock().expect("status state").update(&name, ips, now);
                    }
                    Ok(Some(Event::Delete(svc))) => {
                        let name = svc.metadata.name.unwrap_or_default();
                        s.lock().expect("status state").ips.remove(&name);
                    }
                    Ok(Some(Event::Init | Event::InitDone)) => {}
                    Ok(None) => break,
                    Err(_) => {
                        e.fetch_add(1, Ordering::Relaxed);
                    }
                }
            }
        });
        StatusWatch {
            state,
            errors,
            task,
        }
    }

    fn with<T>(&self, f: impl FnOnce(&mut State) -> T) -> T {
        f(&mut self.state.lock().expect("status state"))
    }

    /// Which node each address stands for and which nodes each Service should list.
    pub fn set_layout(&self, layout: Layout) {
        self.with(|s| s.layout = layout);
    }

    /// (Services listing exactly their nodes, Services, one that does not with what it lists).
    pub fn converged(&self) -> (usize, usize, Option<(String, BTreeSet<String>)>) {
        self.with(|s| {
            let mut ok = 0;
            let mut other = None;
            for (svc, want) in &s.layout.want {
                let got = s.nodes(s.ips.get(svc).unwrap_or(&BTreeSet::new()));
                if &got == want {
                    ok += 1;
                } else if other.is_none() {
                    other = Some((svc.clone(), got));
                }
            }
            (ok, s.layout.want.len(), other)
        })
    }

    /// From now on, every node a version drops is recorded.
    pub fn count_removals(&self) {
        self.with(|s| s.counting = true);
    }

    /// A round begins: every Service should come to list `target` (node-a's address now).
    pub fn begin_round(&self, target: &str) {
        self.with(|s| {
            let pending = s
                .layout
                .want
                .keys()
                .filter(|svc| !s.ips.get(*svc).is_some_and(|ips| ips.contains(target)))
                .cloned()
                .collect();
            s.round = Some((target.to_string(), Progress::new(pending)));
        });
    }

    /// (Services that do not list the round's target yet, time from its start to the last one
    /// that came to list it).
    pub fn round(&self) -> (usize, Duration) {
        self.with(|s| {
            s.round
                .as_ref()
                .map_or((0, Duration::ZERO), |(_, p)| p.read())
        })
    }

    /// `node` is lost on purpose: its leaving is no removal, and from now on the time it takes
    /// to leave every Service that lists it is measured.
    pub fn lose(&self, node: &str) {
        self.with(|s| {
            s.dead.insert(node.to_string());
            let pending = s
                .ips
                .iter()
                .filter(|(_, ips)| s.nodes(ips).contains(node))
                .map(|(svc, _)| svc.clone())
                .collect();
            s.losses.insert(node.to_string(), Progress::new(pending));
        });
    }

    /// (Services still listing lost `node`, time from its loss to the last one that dropped it).
    pub fn loss(&self, node: &str) -> (usize, Duration) {
        self.with(|s| {
            s.losses
                .get(node)
                .map_or((0, Duration::ZERO), Progress::read)
        })
    }

    pub fn removals(&self) -> Vec<Removal> {
        self.with(|s| s.removals.clone())
    }

    /// (Status versions seen, errors the watch recovered from).
    pub fn counts(&self) -> (u64, usize) {
        (
            self.with(|s| s.versions),
            self.errors.load(Ordering::Relaxed),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn set(items: &[&str]) -> BTreeSet<String> {
        items.iter().map(|s| s.to_string()).collect()
    }

    fn state() -> State {
        let node_of = [
            ("192.0.2.11", "node-a"),
            ("203.0.113.200", "node-a"),
            ("192.0.2.12", "node-b"),
            ("198.19.1.0", "kwok-00000"),
        ]
        .into_iter()
        .map(|(a, n)| (a.to_string(), n.to_string()))
        .collect();
        let want = [("s", set(&["node-a", "node-b", "kwok-00000"]))]
            .into_iter()
            .map(|(s, w)| (s.to_string(), w))
            .collect();
        State {
            layout: Layout { node_of, want },
            ..State::default()
        }
    }

    #[test]
    fn a_published_address_swap_is_no_removal_and_completes_the_round() {
        let mut s = state();
        let t = Instant::now();
        s.update("s", set(&["192.0.2.11", "192.0.2.12", "198.19.1.0"]), t);
        s.counting = true;
        s.round = Some((
            "203.0.113.200".into(),
            Progress::new(set(&["s"]).into_iter().collect()),
        ));
        s.update("s", set(&["203.0.113.200", "192.0.2.12", "198.19.1.0"]), t);
        assert!(s.removals.is_empty(), "{:?}", s.removals);
        assert_eq!(s.round.as_ref().unwrap().1.read().0, 0);
        s.update("s", set(&["203.0.113.200", "198.19.1.0"]), t);
        assert_eq!(s.removals.len(), 1);
        assert_eq!(s.removals[0].node, "node-b");
    }

    #[test]
    fn a_lost_node_leaving_is_measured_not_counted() {
        let mut s = state();
        let t = Instant::now();
        s.update("s", set(&["192.0.2.11", "192.0.2.12", "198.19.1.0"]), t);
        s.counting = true;
        s.dead.insert("kwok-00000".into());
        s.losses.insert(
            "kwok-00000".into(),
            Progress::new(set(&["s"]).into_iter().collect()),
        );
        s.update("s", set(&["192.0.2.11", "192.0.2.12"]), t);
        assert!(s.removals.is_empty());
        assert_eq!(s.losses["kwok-00000"].read().0, 0);
    }
}
