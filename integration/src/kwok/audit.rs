//! What kube-apiserver's audit log says about a stretch of the simulation: every renewal of a
//! Lease in `kube-node-lease` (the real kubelets' and kwok's), and every request of nodelb's
//! ServiceAccount by node and verb. `scripts/cluster.sh`'s audit policy logs every write and
//! every verb of `nodelb-system`'s ServiceAccounts, at Metadata level, to one file that is
//! never rotated: a stretch is a byte range of it, from the file's length at its start to its
//! length at its end. The file grows by hundreds of megabytes in a run at 1,000 nodes, so it is
//! read line by line, and only the lines that can matter are parsed.

use std::collections::BTreeMap;
use std::io::{BufRead, Read, Seek, SeekFrom};
use std::path::Path;

use serde_json::Value;

/// The user nodelb's agents act as.
pub const NODELB_USER: &str = "system:serviceaccount:nodelb-system:nodelb";
/// The namespace of the kubelets' node Leases.
const NODE_LEASES: &str = "kube-node-lease";

/// The audit log's length now: where the next stretch begins.
pub fn offset(path: &Path) -> Result<u64, String> {
    std::fs::metadata(path)
        .map(|m| m.len())
        .map_err(|e| format!("reading {}: {e}", path.display()))
}

/// What one stretch of the log holds.
#[derive(Debug, Default, Clone)]
pub struct Stretch {
    /// Lease name in `kube-node-lease` → when each successful `update` of it reached the
    /// server (seconds since the epoch), in order.
    pub renewals: BTreeMap<String, Vec<f64>>,
    /// Node → verb → how many requests nodelb's agent on that node made.
    pub requests: BTreeMap<String, BTreeMap<String, usize>>,
    /// Node → `verb resource[/subresource] namespace/name` → how many.
    pub objects: BTreeMap<String, BTreeMap<String, usize>>,
}

impl Stretch {
    /// Both stretches' records, as one.
    pub fn merge(&mut self, other: Stretch) {
        for (lease, mut times) in other.renewals {
            let mine = self.renewals.entry(lease).or_default();
            mine.append(&mut times);
            mine.sort_by(f64::total_cmp);
        }
        for (mine, theirs) in [
            (&mut self.requests, other.requests),
            (&mut self.objects, other.objects),
        ] {
            for (node, counts) in theirs {
                let mine = mine.entry(node).or_default();
                for (key, n) in counts {
                    *mine.entry(key).or_default() += n;
                }
            }
        }
    }
}

/// Reads bytes `from..to` of the audit log at `path`. A request of nodelb's is counted for the
/// node its token was bound to (`authentication.kubernetes.io/node-name`), else for the node
/// `node_of_source` names for its source address, else for `?`.
pub fn read(
    path: &Path,
    from: u64,
    to: u64,
    node_of_source: &BTreeMap<String, String>,
) -> Result<Stretch, String> {
    let mut file =
        std::fs::File::open(path).map_err(|e| format!("opening {}: {e}", path.display()))?;
    file.seek(SeekFrom::Start(from))
        .map_err(|e| format!("seeking {}: {e}", path.display()))?;
    let reader = std::io::BufReader::with_capacity(1 << 20, file.take(to.saturating_sub(from)));
    let mut out = Stretch::default();
    for line in reader.split(b'\n') {
        let line = line.map_err(|e| format!("reading {}: {e}", path.display()))?;
        let text = String::from_utf8_lossy(&line);
        if !(text.contains(NODE_LEASES) || text.contains(NODELB_USER)) {
            continue;
        }
        let Ok(e) = serde_json::from_str::<Value>(&text) else {
            continue;
        };
        record(&e, node_of_source, &mut out);
    }
    for times in out.renewals.values_mut() {
        times.sort_by(f64::total_cmp);
    }
    Ok(out)
}

/// One audit event into `out`: a Lease renewal in `kube-node-lease`, or a request of
/// nodelb's (once per request: a watch when its response starts, others when complete).
fn record(e: &Value, node_of_source: &BTreeMap<String, String>, out: &mut Stretch) {
    let s = |v: &Value| v.as_str().unwrap_or_default().to_string();
    let (verb, stage) = (s(&e["verb"]), s(&e["stage"]));
    let o = &e["objectRef"];
    if verb == "update"
        && stage == "ResponseComplete"
        && o["namespace"] == NODE_LEASES
        && o["resource"] == "leases"
        && e["responseStatus"]["code"].as_u64() == Some(200)
    {
        if let Some(t) = seconds(&s(&e["requestReceivedTimestamp"])) {
            out.renewals.entry(s(&o["name"])).or_default().push(t);
        }
        return;
    }
    if e["user"]["username"] != NODELB_USER {
        return;
    }
    let once = if verb == "watch" {
        "ResponseStarted"
    } else {
        "ResponseComplete"
    };
    if stage != once {
        return;
    }
    let node = e["user"]["extra"]["authentication.kubernetes.io/node-name"][0]
        .as_str()
        .map(str::to_string)
        .or_else(|| {
            e["sourceIPs"][0]
                .as_str()
                .and_then(|ip| node_of_source.get(ip).cloned())
        })
        .unwrap_or_else(|| "?".to_string());
    let resource = match s(&o["subresource"]).as_str() {
        "" => s(&o["resource"]),
        sub => format!("{}/{sub}", s(&o["resource"])),
    };
    let object = format!("{verb} {resource} {}/{}", s(&o["namespace"]), s(&o["name"]));
    *out.objects
        .entry(node.clone())
        .or_default()
        .entry(object)
        .or_default() += 1;
    *out.requests
        .entry(node)
        .or_default()
        .entry(verb)
        .or_default() += 1;
}

/// An RFC 3339 timestamp as seconds since the epoch.
pub fn seconds(text: &str) -> Option<f64> {
    let t: k8s_openapi::jiff::Timestamp = text.parse().ok()?;
    Some(t.as_microsecond() as f64 / 1e6)
}

/// The gaps between one Lease's renewals `times` (in order), and from the last one to `end`:
/// how long the Lease went without one.
pub fn gaps(times: &[f64], end: f64) -> Vec<f64> {
    let mut out: Vec<f64> = times.windows(2).map(|w| w[1] - w[0]).collect();
    if let Some(last) = times.last() {
        out.push((end - last).max(0.0));
    }
    out
}

/// How late the renewals of a class of Leases were.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Lateness {
    pub leases: usize,
    pub renewals: usize,
    /// Every gap, in order.
    pub gaps: Vec<f64>,
}

impl Lateness {
    /// The renewals of the Leases `which` selects, over a stretch that ended at `end`.
    pub fn of(
        renewals: &BTreeMap<String, Vec<f64>>,
        which: impl Fn(&str) -> bool,
        end: f64,
    ) -> Lateness {
        let mut out = Lateness::default();
        for times in renewals.iter().filter(|(l, _)| which(l)).map(|(_, t)| t) {
            out.leases += 1;
            out.renewals += times.len();
            out.gaps.extend(gaps(times, end));
        }
        out.gaps.sort_by(f64::total_cmp);
        out
    }

    pub fn max(&self) -> f64 {
        self.gaps.last().copied().unwrap_or(0.0)
    }

    pub fn p99(&self) -> f64 {
        if self.gaps.is_empty() {
            0.0
        } else {
            crate::bench::pct(&self.gaps, 99.0)
        }
    }

    /// How many gaps exceeded `s` seconds.
    pub fn over(&self, s: f64) -> usize {
        self.gaps.iter().filter(|g| **g > s).count()
    }
}

/// Whether the renewals `times` of a node's Lease explain that the node left a status at `at`
/// (seconds since the epoch): it went more than `bound` seconds without one, at least `bound`
/// seconds before `at`, and the removal landed at most `settle` seconds after the renewal
/// that ended the gap (the time a status round and the node lifecycle controller may take).
/// A Lease with no renewal in the stretch explains any removal.
pub fn explains(times: &[f64], at: f64, bound: f64, settle: f64) -> bool {
    let Some(last) = times.last() else {
        return true;
    };
    if last + bound <= at {
        return true;
    }
    times
        .windows(2)
        .any(|w| w[1] - w[0] > bound && w[0] + bound <= at && at <= w[1] + settle)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renewals_and_requests_are_read_once_each_from_their_lines() {
        let lines = [
            r#"{"kind":"Event","stage":"ResponseComplete","verb":"update","requestReceivedTimestamp":"2026-01-01T00:00:10.000000Z","objectRef":{"resource":"leases","namespace":"kube-node-lease","name":"kwok-00001"},"responseStatus":{"code":200},"user":{"username":"nodelb-kwok"}}"#,
            r#"{"kind":"Event","stage":"ResponseComplete","verb":"update","requestReceivedTimestamp":"2026-01-01T00:00:00.500000Z","objectRef":{"resource":"leases","namespace":"kube-node-lease","name":"kwok-00001"},"responseStatus":{"code":200},"user":{"username":"nodelb-kwok"}}"#,
            r#"{"kind":"Event","stage":"ResponseComplete","verb":"update","requestReceivedTimestamp":"2026-01-01T00:00:20.000000Z","objectRef":{"resource":"leases","namespace":"kube-node-lease","name":"kwok-00001"},"responseStatus":{"code":409},"user":{"username":"nodelb-kwok"}}"#,
            r#"{"kind":"Event","stage":"ResponseStarted","verb":"watch","objectRef":{"resource":"services"},"user":{"username":"system:serviceaccount:nodelb-system:nodelb","extra":{"authentication.kubernetes.io/node-name":["node-a"]}},"sourceIPs":["192.0.2.11"]}"#,
            r#"{"kind":"Event","stage":"ResponseComplete","verb":"watch","objectRef":{"resource":"services"},"user":{"username":"system:serviceaccount:nodelb-system:nodelb","extra":{"authentication.kubernetes.io/node-name":["node-a"]}},"sourceIPs":["192.0.2.11"]}"#,
            r#"{"kind":"Event","stage":"ResponseComplete","verb":"get","objectRef":{"resource":"leases","namespace":"nodelb-system","name":"nodelb-status"},"user":{"username":"system:serviceaccount:nodelb-system:nodelb"},"sourceIPs":["192.0.2.12"]}"#,
            r#"{"kind":"Event","stage":"ResponseComplete","verb":"create","objectRef":{"resource":"pods","namespace":"x"},"user":{"username":"someone"}}"#,
        ];
        let text = lines.join("\n") + "\n";
        let path = std::env::temp_dir().join(format!("kwok-audit-{}.log", std::process::id()));
        std::fs::write(&path, &text).unwrap();
        let sources = BTreeMap::from([("192.0.2.12".to_string(), "node-b".to_string())]);
        let s = read(&path, 0, text.len() as u64, &sources).unwrap();
        let _ = std::fs::remove_file(&path);
        let t0 = seconds("2026-01-01T00:00:00Z").unwrap();
        assert_eq!(s.renewals["kwok-00001"], vec![t0 + 0.5, t0 + 10.0]);
        assert_eq!(s.requests["node-a"]["watch"], 1);
        assert_eq!(s.requests["node-b"]["get"], 1);
        assert_eq!(s.requests.len(), 2);
        assert_eq!(
            s.objects["node-b"]["get leases nodelb-system/nodelb-status"],
            1
        );
    }

    #[test]
    fn a_removal_is_explained_only_by_a_gap_before_it() {
        let times = [0.0, 10.0, 30.0, 40.0];
        assert!(!explains(&times, 12.0, 15.0, 60.0), "no gap yet");
        assert!(
            explains(&times, 26.0, 15.0, 60.0),
            "10 -> 30 is 20 s without"
        );
        assert!(!explains(&times, 24.0, 15.0, 60.0), "only 14 s since 10");
        assert!(
            explains(&times, 89.0, 15.0, 60.0),
            "within 60 s of the late renewal"
        );
        assert!(explains(&times, 56.0, 15.0, 60.0), "none since 40");
        assert!(explains(&[], 5.0, 15.0, 60.0));
        let l = Lateness::of(
            &BTreeMap::from([("a".to_string(), times.to_vec())]),
            |_| true,
            45.0,
        );
        assert_eq!(l.gaps, vec![5.0, 10.0, 10.0, 20.0]);
        assert_eq!((l.over(15.0), l.over(20.0), l.max()), (1, 0, 20.0));
    }
}
