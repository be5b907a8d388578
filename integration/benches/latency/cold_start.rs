//! Phase 7 of the latency bench: cold start, from the agent's exec to the kernel programmed and
//! `/readyz` answering 200, and where the time goes (see the module docs of `latency.rs`).
//!
//! On a fresh cluster of one node, N Services and their slices are loaded while the Lease
//! `nodelb-status` is held by another identity (renewed by the bench), so the agent starts as a
//! follower and no status round shares the machine with the starts measured. First the bench
//! lists both kinds itself, page by page as the agent's watches do (`limit=500`, kube-rs's
//! default, then the page size the agent uses), timing the server's answers apart from decoding
//! them into the agent's own wire types. Then the agent is started
//! `NODELB_BENCH_LATENCY_COLD_STARTS` times (default 5) into an empty kernel (nodelb's tables
//! deleted before each start) and as many times over the tables a stopped agent left (a
//! restart, which replaces them whole). Each start is timed from just before the exec to the
//! first `/readyz` 200 (polled every [`POLL`]); the agent's own start-up line
//! ([`nodelb_agent::run::startup::READY`]) says when its client was ready, when each watch got
//! its first and its last listed object, and what the first sync's plan, encode and commit took.
//! Goal, printed PASS/MISS and never asserted: the median start under 1.5 s at 10,000 Services,
//! for both kinds of start.

use super::*;
use kube::core::{DeserializeGuard, ObjectList};
use nodelb_agent::run::startup::READY;
use nodelb_core::objects::wire;

/// The cold start goal at [`GOAL_SERVICES`].
const GOAL_COLD_START_MS: f64 = 1_500.0;
/// How often `/readyz` is asked during a start.
const POLL: Duration = Duration::from_millis(5);
/// The page sizes the bench's own listing tries: kube-rs's default, and the agent's.
const PAGES: [u32; 2] = [500, nodelb_agent::kube::watches::PAGE_SIZE];

/// The fields of the agent's start-up line, in the order printed.
const FIELDS: [&str; 14] = [
    "client_ms",
    "node_listed_ms",
    "services_first_ms",
    "services_listed_ms",
    "slices_first_ms",
    "slices_listed_ms",
    "plan_ms",
    "tables_ms",
    "encode_ms",
    "commit_ms",
    "absent_ms",
    "tidy_ms",
    "sync_ms",
    "ready_ms",
];

/// One start: exec -> `/readyz` 200, and the agent's own timeline.
struct Start {
    empty: bool,
    exec_to_ready: f64,
    fields: Vec<f64>,
}

/// The bench's own listing of one kind at one page size.
struct Listed {
    kind: &'static str,
    limit: u32,
    pages: usize,
    objects: usize,
    bytes: usize,
    /// Request sent -> the page's body read, summed over the pages.
    fetch: Duration,
    /// Decoding the pages into the agent's wire types, summed.
    decode: Duration,
}

pub(crate) struct ColdResult {
    pub services: usize,
    pub version: String,
    listed: Vec<Listed>,
    starts: Vec<Start>,
}

pub(crate) fn cold_start(n: usize, cfg: &Config) -> Res<ColdResult> {
    println!();
    println!(
        "== cold start: {n} Services x {} endpoints, agent a follower ==",
        endpoints()
    );
    let (mut c, version) = cluster(1, AGENT_RESYNC)?;
    let ns = c.namespace().to_string();
    let leases: Api<Lease> = Api::namespaced(c.admin().clone(), AGENT_NAMESPACE);
    c.block_on(leases.create(&PostParams::default(), &other_lease()))
        .map_err(|e| format!("creating the nodelb-status Lease: {e}"))?;
    let runtime = c.block_on(async { tokio::runtime::Handle::current() });
    let renewer = runtime.spawn(renew_other(leases));
    load_on_node0(&c, &ns, &ports(n), cfg)?;
    let mut listed = Vec::new();
    for limit in PAGES {
        listed.push(list::<wire::Service>(
            &c,
            "services",
            "/api/v1/services",
            limit,
        )?);
        listed.push(list::<wire::EndpointSlice>(
            &c,
            "endpointslices",
            "/apis/discovery.k8s.io/v1/endpointslices",
            limit,
        )?);
    }
    for l in &listed {
        println!(
            "  the bench's list of {} (limit={}): {} objects, {} pages, {:.1} MB; server and transfer {:.0} ms, decode into the agent's wire types {:.0} ms",
            l.kind,
            l.limit,
            l.objects,
            l.pages,
            l.bytes as f64 / 1e6,
            ms(l.fetch),
            ms(l.decode)
        );
    }
    let runs = env_usize("NODELB_BENCH_LATENCY_COLD_STARTS", 5, 1)?;
    let mut starts = Vec::new();
    for k in 0..2 * runs {
        let empty = k % 2 == 0;
        if empty {
            for family in ["ip", "ip6"] {
                let _ = c
                    .node_ns(0)
                    .sh_ok(&format!("nft delete table {family} nodelb"));
            }
        }
        let s = one_start(&mut c, n, empty)?;
        print_start(&s);
        starts.push(s);
    }
    renewer.abort();
    Ok(ColdResult {
        services: n,
        version,
        listed,
        starts,
    })
}

/// Start node 0's agent, time it to `/readyz` 200 and until it programs `n` Services, read its
/// start-up line, and stop it (SIGTERM: its rules stay).
fn one_start(c: &mut Cluster, n: usize, empty: bool) -> Res<Start> {
    let before = c.agent_log(0).len();
    let t = Instant::now();
    c.start_agent(0);
    loop {
        if !c.agent_running(0) {
            return Err(format!(
                "the agent exited during start-up; log:\n{}",
                tail(&c.agent_log(0), 40)
            ));
        }
        if matches!(c.readyz(0), Ok((200, _))) {
            break;
        }
        if t.elapsed() > READY_TIMEOUT {
            return Err(format!("the agent is not ready after {READY_TIMEOUT:?}"));
        }
        std::thread::sleep(POLL);
    }
    let exec_to_ready = ms(t.elapsed());
    let programmed = metric_sum(&c.try_metrics(0)?, "nodelb_services_programmed") as usize;
    if programmed != n {
        return Err(format!(
            "ready with {programmed} Services programmed, not {n}"
        ));
    }
    // The agent logs the line just after it publishes readiness (an agent older than the
    // line: none, its fields printed as NaN).
    let fields = wait_until(
        &format!("the agent's {READY:?} line"),
        Duration::from_secs(2),
        Duration::from_millis(20),
        || {
            let log = c.agent_log(0);
            Ok(startup_fields(&log[before.min(log.len())..]))
        },
    )
    .unwrap_or_else(|_| vec![f64::NAN; FIELDS.len()]);
    c.stop_agent(0, Signal::SIGTERM);
    Ok(Start {
        empty,
        exec_to_ready,
        fields,
    })
}

/// The [`FIELDS`] of the agent's start-up line in `log`.
fn startup_fields(log: &str) -> Option<Vec<f64>> {
    let line = log.lines().find(|l| l.contains(READY))?;
    FIELDS
        .iter()
        .map(|f| {
            let at = line.find(&format!(" {f}="))? + f.len() + 2;
            let value = line[at..].split_whitespace().next()?;
            value.parse().ok()
        })
        .collect()
}

/// The agent's start-up line in `log`, as phase 1 prints it.
pub(crate) fn print_timeline(log: &str) {
    if let Some(fields) = startup_fields(log) {
        println!("  the agent's start-up: {}", named(&fields, 0));
    }
}

fn print_start(s: &Start) {
    println!(
        "  start {}: exec -> /readyz 200 {:.0} ms; agent: {}",
        kind(s.empty),
        s.exec_to_ready,
        named(&s.fields, 0)
    );
}

/// `field=value ...` of the agent's start-up line, to `precision` decimals.
fn named(fields: &[f64], precision: usize) -> String {
    FIELDS
        .iter()
        .zip(fields)
        .map(|(f, v)| format!("{f}={v:.precision$}"))
        .collect::<Vec<_>>()
        .join(" ")
}

fn kind(empty: bool) -> &'static str {
    if empty {
        "into an empty kernel"
    } else {
        "over the tables left (restart)"
    }
}

/// List `path` page by page with `limit`, as a watch's initial list does, timing the server's
/// answer and the decode into `K` apart.
fn list<K: serde::de::DeserializeOwned + Clone + kube::Resource<DynamicType = ()>>(
    c: &Cluster,
    kind: &'static str,
    path: &str,
    limit: u32,
) -> Res<Listed> {
    let mut l = Listed {
        kind,
        limit,
        pages: 0,
        objects: 0,
        bytes: 0,
        fetch: Duration::ZERO,
        decode: Duration::ZERO,
    };
    let mut token = String::new();
    loop {
        let mut url = format!("{path}?limit={limit}");
        if !token.is_empty() {
            url.push_str(&format!("&continue={token}"));
        }
        let req = http::Request::get(url)
            .body(Vec::new())
            .map_err(|e| e.to_string())?;
        let t = Instant::now();
        let text = c
            .block_on(c.admin().request_text(req))
            .map_err(|e| format!("listing {kind}: {e}"))?;
        l.fetch += t.elapsed();
        let t = Instant::now();
        let page: ObjectList<DeserializeGuard<K>> =
            serde_json::from_str(&text).map_err(|e| format!("decoding {kind}: {e}"))?;
        l.decode += t.elapsed();
        l.pages += 1;
        l.objects += page.items.len();
        l.bytes += text.len();
        match page.metadata.continue_.filter(|t| !t.is_empty()) {
            Some(t) => token = t,
            None => return Ok(l),
        }
    }
}

impl ColdResult {
    /// Medians of one kind of start: exec -> ready, and each field.
    fn medians(&self, empty: bool) -> Option<(f64, Vec<f64>)> {
        let of = |v: Vec<f64>| stats(&v).p50;
        let runs: Vec<&Start> = self.starts.iter().filter(|s| s.empty == empty).collect();
        if runs.is_empty() {
            return None;
        }
        let total = of(runs.iter().map(|s| s.exec_to_ready).collect());
        let fields = (0..FIELDS.len())
            .map(|i| of(runs.iter().map(|s| s.fields[i]).collect()))
            .collect();
        Some((total, fields))
    }

    pub fn print_summary(&self) {
        for empty in [true, false] {
            let Some((total, fields)) = self.medians(empty) else {
                continue;
            };
            println!(
                "  cold start at {} Services, {} (medians of {}): exec -> /readyz 200 {total:.0} ms; agent: {}",
                self.services,
                kind(empty),
                self.starts.iter().filter(|s| s.empty == empty).count(),
                named(&fields, 0)
            );
        }
    }

    pub fn print_goals(&self, goal: impl Fn(bool) -> &'static str) {
        if !at_goal_size("cold start", self.services) {
            return;
        }
        for empty in [true, false] {
            if let Some((total, _)) = self.medians(empty) {
                println!(
                    "  {} cold start at {GOAL_SERVICES} Services, {}, exec -> kernel programmed and /readyz 200 < {GOAL_COLD_START_MS:.0} ms: median {total:.0} ms",
                    goal(total < GOAL_COLD_START_MS),
                    kind(empty)
                );
            }
        }
    }

    pub fn print_bench_lines(&self) {
        for l in &self.listed {
            println!(
                "bench cold_start_list_{}_{} kind={} limit={} pages={} objects={} bytes={} fetch_ms={:.1} decode_ms={:.1}",
                l.kind, l.limit, l.kind, l.limit, l.pages, l.objects, l.bytes, ms(l.fetch), ms(l.decode)
            );
        }
        for empty in [true, false] {
            if let Some((total, fields)) = self.medians(empty) {
                println!(
                    "bench cold_start_{}_{} services={} total_ms={total:.1} {} goal={GOAL_COLD_START_MS:.0} {}",
                    self.services,
                    if empty { "empty" } else { "restart" },
                    self.services,
                    named(&fields, 1),
                    goal(total < GOAL_COLD_START_MS)
                );
            }
        }
    }
}
