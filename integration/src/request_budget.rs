//! nodelb's requests at steady state, counted from kube-apiserver's audit log against the
//! request budget (issue 38): nodelb's requests of every verb total at most one per node per
//! minute at 5,000 nodes.
//!
//! A watch is one request when it starts and then lasts as long as it asked
//! (`timeoutSeconds`), so a window of a few minutes says little about how often it starts: a
//! watched target counts at the rate its requested lifetime implies (60 / `timeoutSeconds` a
//! minute), and every start in the window that replaced a stream which ended before its
//! requested timeout counts as it happened (an error, not a scheduled restart). Every other
//! request counts as it happened in the window.

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::jiff::{SignedDuration, Timestamp};

use crate::control_plane::{query_param, AuditRecord};

/// The cluster size the budget is stated for.
pub const BUDGET_NODES: f64 = 5000.0;
/// Requests a node a minute the budget allows, at [`BUDGET_NODES`].
pub const BUDGET_PER_NODE_MINUTE: f64 = 1.0;
/// The lifetime of a watch that asks for none: at least kube-apiserver's
/// `--min-request-timeout` (1800 s by default).
const SERVER_WATCH_TIMEOUT: u64 = 1800;
/// A stream that ended more than this before its requested timeout ended early.
const EARLY: SignedDuration = SignedDuration::from_secs(2);

/// One agent's requests in a window.
#[derive(Debug, Default, Clone, PartialEq)]
pub struct AgentRequests {
    /// Requests other than watches, by verb.
    pub by_verb: BTreeMap<String, usize>,
    /// Watch streams started in the window.
    pub watch_starts: usize,
    /// Of those, the starts that replaced a stream of the same target that ended before its
    /// requested timeout.
    pub early_restarts: usize,
    /// Each target watched during the window, with the lifetime (seconds) its latest stream
    /// asked for.
    pub watches: BTreeMap<String, u64>,
}

impl AgentRequests {
    /// Requests other than watches.
    pub fn others(&self) -> usize {
        self.by_verb.values().sum()
    }

    /// Watch starts a minute, as the watches' requested lifetimes imply.
    pub fn watch_rate(&self) -> f64 {
        self.watches
            .values()
            .map(|t| 60.0 / (*t).max(1) as f64)
            .sum()
    }

    /// Requests a minute: the window's other requests and early watch restarts, plus the
    /// watches' implied rate.
    pub fn rate(&self, window: Duration) -> f64 {
        (self.others() + self.early_restarts) as f64 * 60.0 / window.as_secs_f64()
            + self.watch_rate()
    }
}

/// Requests a node a minute in a cluster of `nodes` with one leader (`leader` a minute) and
/// `nodes - 1` followers (`follower` a minute each).
pub fn per_node(nodes: f64, leader: f64, follower: f64) -> f64 {
    follower + (leader - follower) / nodes
}

/// What a watch watches: its path and selectors, without what changes from one stream to the
/// next (`resourceVersion`, `timeoutSeconds`, bookmarks).
pub fn watch_target(uri: &str) -> String {
    let path = uri.split('?').next().unwrap_or_default();
    let mut target = path.to_string();
    for key in ["fieldSelector", "labelSelector"] {
        if let Some(v) = query_param(uri, key) {
            target.push_str(&format!(" {key}={v}"));
        }
    }
    target
}

/// One watch stream.
struct Stream {
    started: Timestamp,
    ended: Option<Timestamp>,
    timeout: u64,
}

/// Each agent's requests in `[from, to)`. `agent_of` names the agent a record belongs to, or
/// `None` for a record of anyone else.
pub fn count(
    records: &[AuditRecord],
    from: Timestamp,
    to: Timestamp,
    agent_of: impl Fn(&AuditRecord) -> Option<String>,
) -> BTreeMap<String, AgentRequests> {
    let mut out: BTreeMap<String, AgentRequests> = BTreeMap::new();
    let mut streams: BTreeMap<(String, String), Vec<Stream>> = BTreeMap::new();
    for r in records {
        let (Some(agent), Some(at)) = (agent_of(r), r.at()) else {
            continue;
        };
        if r.verb == "watch" {
            streams
                .entry((agent, watch_target(&r.uri)))
                .or_default()
                .push(Stream {
                    started: at,
                    ended: r.ended_at(),
                    timeout: r.timeout_seconds().unwrap_or(SERVER_WATCH_TIMEOUT),
                });
        } else if from <= at && at < to {
            *out.entry(agent)
                .or_default()
                .by_verb
                .entry(r.verb.clone())
                .or_default() += 1;
        }
    }
    for ((agent, target), mut list) in streams {
        list.sort_by_key(|s| s.started);
        let a = out.entry(agent).or_default();
        let mut latest = None;
        for (i, s) in list.iter().enumerate() {
            if s.started >= to {
                break;
            }
            latest = Some(s);
            if s.started < from {
                continue;
            }
            a.watch_starts += 1;
            let early = i > 0 && {
                let p = &list[i - 1];
                let asked = SignedDuration::from_secs(p.timeout as i64);
                p.ended
                    .is_some_and(|e| e.duration_since(p.started) < asked - EARLY)
            };
            if early {
                a.early_restarts += 1;
            }
        }
        if let Some(s) = latest.filter(|s| s.ended.is_none_or(|e| e >= from)) {
            a.watches.insert(target, s.timeout);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(secs: i64) -> String {
        Timestamp::from_second(1_800_000_000 + secs)
            .expect("a time")
            .to_string()
    }

    fn request(verb: &str, uri: &str, pod: &str, time: i64, ended: Option<i64>) -> AuditRecord {
        AuditRecord {
            time: at(time),
            received: at(time),
            ended: ended.map(at),
            verb: verb.into(),
            uri: uri.into(),
            user: "system:serviceaccount:nodelb-system:nodelb".into(),
            source: "192.0.2.11".parse().expect("an address"),
            code: 200,
            object: None,
            pod: pod.into(),
        }
    }

    fn window(records: &[AuditRecord]) -> BTreeMap<String, AgentRequests> {
        let t = |s: i64| Timestamp::from_second(1_800_000_000 + s).expect("a time");
        count(records, t(100), t(280), |r| {
            (!r.pod.is_empty()).then(|| r.pod.clone())
        })
    }

    const LEASE: &str =
        "/apis/coordination.k8s.io/v1/namespaces/nodelb-system/leases/nodelb-status";
    const SERVICES: &str = "/api/v1/services";

    #[test]
    fn requests_count_by_verb_inside_the_window_only() {
        let records = [
            request("get", LEASE, "a", 99, Some(99)),
            request("get", LEASE, "a", 100, Some(100)),
            request("get", LEASE, "a", 102, Some(102)),
            request("update", LEASE, "a", 102, Some(102)),
            request("get", LEASE, "a", 280, Some(280)),
            request("get", LEASE, "", 150, Some(150)),
        ];
        let got = window(&records);
        assert_eq!(got.len(), 1, "{got:?}");
        let a = &got["a"];
        assert_eq!(a.by_verb["get"], 2);
        assert_eq!(a.by_verb["update"], 1);
        assert_eq!(a.rate(Duration::from_secs(180)), 1.0);
    }

    #[test]
    fn a_watch_counts_at_its_requested_lifetime_and_an_early_end_counts_its_restart() {
        let svc = |rv: u32, t: u32| {
            format!("{SERVICES}?resourceVersion={rv}&timeoutSeconds={t}&watch=true")
        };
        let records = [
            // Scheduled: 290 s, then the next; the one open in the window asked for 290 s.
            request("watch", &svc(1, 290), "a", 0, Some(290)),
            request("watch", &svc(2, 290), "a", 290, None),
            // Ended after 10 s of its 600 (an error), restarted in the window, then once more
            // after the window.
            request("watch", &svc(1, 600), "b", 50, Some(120)),
            request("watch", &svc(2, 600), "b", 121, Some(300)),
            request("watch", &svc(3, 600), "b", 301, None),
            // A target whose last stream ended before the window: not watched in it.
            request(
                "watch",
                "/api/v1/nodes?timeoutSeconds=60&watch=true",
                "b",
                0,
                Some(60),
            ),
        ];
        let got = window(&records);
        let a = &got["a"];
        assert_eq!((a.watch_starts, a.early_restarts), (0, 0), "{a:?}");
        assert_eq!(a.watches.len(), 1, "{a:?}");
        assert!((a.watch_rate() - 60.0 / 290.0).abs() < 1e-9);
        let b = &got["b"];
        assert_eq!((b.watch_starts, b.early_restarts), (1, 1), "{b:?}");
        assert_eq!(b.watches.values().collect::<Vec<_>>(), [&600]);
        assert!((b.rate(Duration::from_secs(180)) - (1.0 / 3.0 + 0.1)).abs() < 1e-9);
    }

    #[test]
    fn a_target_is_its_path_and_selectors() {
        assert_eq!(
            watch_target("/api/v1/nodes?fieldSelector=metadata.name%3Dnode-a&resourceVersion=5&timeoutSeconds=290&watch=true"),
            "/api/v1/nodes fieldSelector=metadata.name%3Dnode-a"
        );
        assert_eq!(per_node(5000.0, 30.0, 1.0), 1.0 + 29.0 / 5000.0);
    }
}
