//! What each candidate shape of the full install costs the kernel, at N Services × E endpoints
//! (issue 16 part 4: the install under 300 ms with the per-Service counters kept). Each shape
//! is the agent planner's table (`bench_table`) transformed:
//!
//! - `agent`: the planner's shape. A plain Service port's dispatch element goes straight to
//!   the shared chain `endpoints-N`.
//! - `chain-per-port`: the shape before, each dispatch element going to a chain of the Service
//!   port's own that counts new connections and goes to `endpoints-N`.
//! - `chain-per-port-no-counter`: the same chains without their counter.
//! - `agent-no-counters`: no per-Service counting at all (no counter objects, no
//!   `svc-counters` map, no counting rules): what keeping the counters costs.
//! - `agent-no-counter-map`: the counter objects without the map and the rules that use it.
//! - `agent-no-comments`: no element, rule or counter comments.
//!
//! Every iteration installs each shape once, in turn, into a fresh namespace (never the host's
//! netfilter): encode (`full_replace` + `Batch::encode`) and commit (send + every ACK) timed,
//! with the committing thread's system CPU time during the commit (the kernel's own work,
//! less sensitive to other load than the wall time). Between installs it waits (up to 5 s) for
//! the machine to go quiet, since a dropped namespace's tables are freed by kernel workers.
//! Prints figures only; a failed install fails the run.
//!
//! Env: `NODELB_BENCH_SERVICES` (10000), `NODELB_BENCH_ENDPOINTS` (5),
//! `NODELB_BENCH_ITERATIONS` (5), `NODELB_SHAPES` (comma-separated names; default all).
//! Needs root; without it prints SKIP and exits 0, or 1 when `CI=true`.
//! Run: `cargo bench -p nodelb-integration --bench install_shapes`.

use nodelb_integration::bench::{env_usize, loadavg, ms, wait_quiet};
use nodelb_integration::models::bench_table;
use nodelb_integration::netns::Netns;
use nodelb_netfilter::readback::{compare, Drift, TableSummary};
use nodelb_netfilter::validate::validate;
use nodelb_netfilter::*;
use std::collections::BTreeMap;
use std::time::{Duration, Instant};

type Res<T> = Result<T, String>;

/// System CPU time of the calling thread.
fn thread_sys() -> Duration {
    // SAFETY: getrusage only writes the struct it is given.
    let ru = unsafe {
        let mut ru: libc::rusage = std::mem::zeroed();
        libc::getrusage(libc::RUSAGE_THREAD, &mut ru);
        ru
    };
    Duration::from_secs(ru.ru_stime.tv_sec as u64)
        + Duration::from_micros(ru.ru_stime.tv_usec as u64)
}

/// Each dispatch element that goes to an `endpoints-N` chain goes to a chain of its Service
/// port's own instead, which (with `counter`) counts and goes to `endpoints-N`.
fn chain_per_port(t: &mut Table, counter: bool) {
    let mut chains = BTreeMap::new();
    let map = t.set_mut("services").expect("the services map");
    for (i, e) in map.elements.values_mut().enumerate() {
        let Some(ElemData::Verdict(Verdict::Goto(to))) = &mut e.data else {
            continue;
        };
        if !to.starts_with("endpoints-") {
            continue;
        }
        let name = format!("svc-{i}");
        let mut stmts = Vec::with_capacity(2);
        if counter {
            stmts.push(Stmt::counter());
        }
        stmts.push(Stmt::Verdict(Verdict::Goto(std::mem::replace(
            to,
            name.clone(),
        ))));
        let mut rule = Rule::new(stmts);
        rule.comment = e.comment.as_deref().map(str::to_string);
        chains.insert(name.clone(), Chain::regular(&name).rule(rule));
    }
    for c in chains.into_values() {
        t.add_chain(c);
    }
}

/// No per-Service counting: no counter objects, no svc-counters map, no counting rules.
fn no_counters(t: &mut Table) {
    t.counters.clear();
    no_counter_map(t);
}

/// The counter objects kept; the svc-counters map and the rules using it gone.
fn no_counter_map(t: &mut Table) {
    t.sets.remove("svc-counters");
    for c in t.chains.values_mut() {
        c.rules
            .retain(|r| !r.stmts.iter().any(|s| matches!(s, Stmt::CounterMap { .. })));
    }
}

fn no_comments(t: &mut Table) {
    for s in t.sets.values_mut() {
        for e in s.elements.values_mut() {
            e.comment = None;
        }
    }
    for c in t.chains.values_mut() {
        for r in &mut c.rules {
            r.comment = None;
        }
    }
    for c in t.counters.values_mut() {
        c.comment = None;
    }
}

type Shape = (&'static str, fn(&mut Table));

const SHAPES: &[Shape] = &[
    ("agent", |_| {}),
    ("chain-per-port", |t| chain_per_port(t, true)),
    ("chain-per-port-no-counter", |t| chain_per_port(t, false)),
    ("agent-no-counters", no_counters),
    ("agent-no-counter-map", no_counter_map),
    ("agent-no-comments", no_comments),
];

/// One shape's table and its samples (ms).
struct Candidate {
    name: &'static str,
    table: Table,
    encode: Vec<f64>,
    commit: Vec<f64>,
    sys: Vec<f64>,
}

fn median(v: &[f64]) -> f64 {
    let mut v = v.to_vec();
    v.sort_by(f64::total_cmp);
    let n = v.len();
    if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}

fn main() -> std::process::ExitCode {
    nodelb_integration::netns::bench_main("install_shapes", run)
}

fn candidates(n: usize, eps: usize) -> Res<Vec<Candidate>> {
    let only: Option<Vec<String>> = std::env::var("NODELB_SHAPES")
        .ok()
        .map(|s| s.split(',').map(str::to_string).collect());
    let base = bench_table(n, eps);
    let mut out = Vec::new();
    for (name, f) in SHAPES {
        if only.as_ref().is_some_and(|o| !o.iter().any(|x| x == name)) {
            continue;
        }
        let mut table = base.clone();
        f(&mut table);
        validate(&table).map_err(|e| format!("{name}: {e}"))?;
        let b = Batch::encode(1, &full_replace(&table)).map_err(|e| e.to_string())?;
        println!(
            "  {name:<28} chains {:>6} counters {:>6} batch {:>9} bytes {:>6} messages",
            table.chains.len(),
            table.counters.len(),
            b.len(),
            b.message_count()
        );
        out.push(Candidate {
            name,
            table,
            encode: Vec::new(),
            commit: Vec::new(),
            sys: Vec::new(),
        });
    }
    if out.is_empty() {
        return Err("NODELB_SHAPES names no shape".into());
    }
    Ok(out)
}

/// Install `c`'s table into a fresh namespace once, recording its times.
fn install(c: &mut Candidate) -> Res<()> {
    let ns = Netns::new("shapes");
    let (e, k, s) = ns.run(|| -> Res<_> {
        let mut nft = Nft::open().map_err(|e| e.to_string())?;
        let t0 = Instant::now();
        let ops = full_replace(&c.table);
        let batch = Batch::encode(1, &ops).map_err(|e| e.to_string())?;
        let e = t0.elapsed();
        let s0 = thread_sys();
        let k = nft
            .commit(&batch)
            .map_err(|e| format!("{}: {e}", c.name))?
            .commit;
        Ok((e, k, thread_sys() - s0))
    })?;
    let got = ns
        .run(|| Nft::open().and_then(|mut nft| nft.read_table(&TableRef::of(&c.table))))
        .map_err(|e| format!("{}: reading back: {e}", c.name))?;
    let drift = compare(&TableSummary::expected(&c.table), got.as_ref(), &[]);
    if drift != Drift::None {
        return Err(format!(
            "{}: the kernel holds another table: {drift:?}",
            c.name
        ));
    }
    drop(ns);
    c.encode.push(ms(e));
    c.commit.push(ms(k));
    c.sys.push(ms(s));
    Ok(())
}

fn run() -> Res<()> {
    let n = env_usize("NODELB_BENCH_SERVICES", 10_000, 1)?;
    let eps = env_usize("NODELB_BENCH_ENDPOINTS", 5, 1)?;
    let iterations = env_usize("NODELB_BENCH_ITERATIONS", 5, 1)?;
    println!("nodelb install shapes: {n} Services x {eps} endpoints, {iterations} iterations");
    let mut shapes = candidates(n, eps)?;
    println!("  load before: {}", loadavg());
    for i in 0..iterations {
        for c in shapes.iter_mut() {
            install(c)?;
            wait_quiet()?;
            println!(
                "  #{i} {:<28} encode {:7.2} commit {:7.2} (sys {:7.2}) ms",
                c.name, c.encode[i], c.commit[i], c.sys[i]
            );
        }
    }
    println!("  load after: {}", loadavg());
    println!();
    println!(
        "{:<30} {:>8} {:>8} {:>8} {:>8} {:>8} {:>10}",
        "shape (ms)", "encode", "commit", "min", "max", "total", "commit sys"
    );
    for c in &shapes {
        let min = c.commit.iter().copied().fold(f64::MAX, f64::min);
        let max = c.commit.iter().copied().fold(0.0, f64::max);
        println!(
            "{:<30} {:>8.1} {:>8.1} {:>8.1} {:>8.1} {:>8.1} {:>10.1}",
            c.name,
            median(&c.encode),
            median(&c.commit),
            min,
            max,
            median(&c.encode) + median(&c.commit),
            median(&c.sys)
        );
    }
    println!("(medians over iterations; total = encode + commit medians)");
    Ok(())
}
