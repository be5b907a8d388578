//! Netfilter benchmark: nodelb's netlink batch against `nft -f` of the same ruleset, in the
//! same run, in network namespaces of its own (never the host's netfilter).
//!
//! 1. Full install of `bench_table(N, E)` into a fresh namespace per iteration:
//!    - nodelb: encode (building the operations + `Batch::encode`) and commit (send + every
//!      ACK) timed separately;
//!    - each install starts once the machine is quiet (`bench::wait_quiet`): the kernel frees
//!      a dropped namespace's tables in workers afterwards, which would otherwise run during
//!      the next timed commit;
//!    - `nft -f -` of `render_replace` of the same table, end to end (process spawn included),
//!      spawned directly from a thread inside the namespace, and for reference once more
//!      through `ip netns exec` (the `nft_f` helper), which adds that wrapper's cost.
//!
//!    Plus a replace over an existing table in one namespace, both ways (`Committer::commit`
//!    of a whole replace for nodelb). Every install is checked against the kernel.
//! 2. One endpoint change with a `Committer` holding the N-Service table, alternating between
//!    two variants so each sync is a real change; the same at 100 Services.
//! 3. Goals next to the results, PASS/MISS; a MISS does not fail the run, a kernel state
//!    mismatch or any error does.
//!
//! 4. Endpoints at Kubernetes' limits: 10,000 Services × 15 endpoints, and one Service with
//!    5,000 endpoints in 50 slices (see `integration/benches/netfilter/limits.rs`).
//!
//! Env: `NODELB_BENCH_SERVICES` (10000), `NODELB_BENCH_ENDPOINTS` (5),
//! `NODELB_BENCH_ITERATIONS` (7), `NODELB_BENCH_LIMITS` (1; 0 skips part 4, `big` runs only
//! its 5,000-endpoint Service). Needs root; without it prints SKIP and exits 0, or 1 when
//! `CI=true`. Run: `cargo bench -p nodelb-integration --bench netfilter`.

#[path = "./netfilter/limits.rs"]
mod limits;

use nodelb_integration::bench::{env_usize, goal, wait_quiet};
use nodelb_integration::commit::{edit_between, replace, sync};
use nodelb_integration::models::{bench_table, move_bench_endpoint};
use nodelb_integration::netns::Netns;
use nodelb_integration::nft::{nft_f, nft_file};
use nodelb_netfilter::validate::validate;
use nodelb_netfilter::*;
use std::process::ExitCode;
use std::time::{Duration, Instant};

const GOAL_INSTALL_MS: f64 = 300.0;
const GOAL_CHANGE_MS: f64 = 5.0;
/// The Service whose endpoint the incremental benchmark moves, and the two ports it alternates
/// between (the model's endpoint ports are 8000..8000+E).
const MOVED_SERVICE: usize = 42;
const VARIANT_PORTS: [u16; 2] = [9001, 9002];

type Res<T> = Result<T, String>;

struct Config {
    services: usize,
    endpoints: usize,
    iterations: usize,
}

/// min / median / max of a series of durations, in milliseconds.
#[derive(Clone, Copy)]
struct Summary {
    min: f64,
    median: f64,
    max: f64,
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

fn summarize(samples: &[Duration]) -> Summary {
    assert!(!samples.is_empty(), "no samples");
    let mut v: Vec<f64> = samples.iter().map(|d| ms(*d)).collect();
    v.sort_by(|a, b| a.total_cmp(b));
    let n = v.len();
    let median = if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    };
    Summary {
        min: v[0],
        median,
        max: v[n - 1],
    }
}

/// Rows of the results table, in print order, with the name used in the `bench` lines.
#[derive(Default)]
struct Report {
    rows: Vec<(String, String, Summary)>,
}

impl Report {
    fn add(&mut self, name: &str, label: &str, samples: &[Duration]) -> Summary {
        let s = summarize(samples);
        self.rows.push((name.into(), label.into(), s));
        s
    }

    fn print_table(&self, title: &str, names: &[&str]) {
        println!();
        println!("{title}");
        println!(
            "  {:<58} {:>10} {:>10} {:>10}",
            "metric", "min ms", "median ms", "max ms"
        );
        for (_, label, s) in self.rows.iter().filter(|r| names.contains(&r.0.as_str())) {
            println!(
                "  {:<58} {:>10.3} {:>10.3} {:>10.3}",
                label, s.min, s.median, s.max
            );
        }
    }

    fn print_grep_lines(&self) {
        for (name, _, s) in &self.rows {
            println!(
                "bench {name} median_ms={:.3} min_ms={:.3} max_ms={:.3}",
                s.median, s.min, s.max
            );
        }
    }
}

fn main() -> ExitCode {
    nodelb_integration::netns::bench_main("netfilter", run)
}

fn run() -> Res<()> {
    let cfg = Config {
        services: env_usize("NODELB_BENCH_SERVICES", 10_000, 100)?,
        endpoints: env_usize("NODELB_BENCH_ENDPOINTS", 5, 1)?,
        iterations: env_usize("NODELB_BENCH_ITERATIONS", 7, 1)?,
    };
    if cfg.services > 64_000 {
        return Err("NODELB_BENCH_SERVICES: at most 64000 (Service ports are 1024 + i)".into());
    }
    println!("nodelb netfilter benchmark");
    println!(
        "  NODELB_BENCH_SERVICES={} NODELB_BENCH_ENDPOINTS={} NODELB_BENCH_ITERATIONS={}",
        cfg.services, cfg.endpoints, cfg.iterations
    );
    if cfg.iterations < 5 {
        println!("  note: fewer than 5 iterations; min/median/max are rough");
    }
    println!(
        "  kernel {}, {}, {} CPUs",
        nodelb_integration::bench::command_output("uname", &["-r"]).trim(),
        nodelb_integration::bench::command_output("nft", &["--version"]).trim(),
        std::thread::available_parallelism().map_or(0, |n| n.get())
    );

    let mut report = Report::default();
    let n = cfg.services;
    let eps = cfg.endpoints;

    // ---- the model and its two renderings ----
    let t0 = Instant::now();
    let table = bench_table(n, eps);
    let build = t0.elapsed();
    let t0 = Instant::now();
    validate(&table).map_err(|e| format!("bench_table({n}, {eps}) is invalid: {e}"))?;
    let validate_time = t0.elapsed();
    let t0 = Instant::now();
    let script = render_replace(&table);
    let render = t0.elapsed();
    let ops = full_replace(&table);
    let probe = Batch::encode(1, &ops).map_err(|e| e.to_string())?;
    let (batch_bytes, batch_msgs, op_count) = (probe.len(), probe.message_count(), ops.len());
    drop((probe, ops));
    println!();
    println!(
        "Model: bench_table({n}, {eps}): {} chains, {} sets, {} endpoint elements, {} dispatch elements",
        table.chains.len(),
        table.sets.len(),
        elements(&table, "endpoints"),
        elements(&table, "services"),
    );
    println!(
        "  full-replace batch: {batch_bytes} bytes ({:.2} MiB), {batch_msgs} messages, {op_count} ops",
        batch_bytes as f64 / (1 << 20) as f64
    );
    println!(
        "  rendered nft script (render_replace): {} bytes ({:.2} MiB), {} lines",
        script.len(),
        script.len() as f64 / (1 << 20) as f64,
        script.lines().count()
    );
    println!(
        "  one-off, not in any total: bench_table {:.1} ms, validate {:.1} ms, render_replace {:.1} ms",
        ms(build),
        ms(validate_time),
        ms(render)
    );

    // ---- 1. full install ----
    println!();
    println!(
        "[1] full install, fresh namespace per iteration ({} iterations each)",
        cfg.iterations
    );
    let mut enc = Vec::new();
    let mut com = Vec::new();
    let mut tot = Vec::new();
    let mut nft_direct = Vec::new();
    let mut nft_exec = Vec::new();
    for i in 0..cfg.iterations {
        // nodelb, once the kernel is done freeing the previous iteration's namespaces
        wait_quiet()?;
        let ns = Netns::new("bench-nlb");
        let (e, c, bytes, msgs) = ns.run(|| -> Res<_> {
            let mut nft = Nft::open().map_err(|e| format!("Nft::open: {e}"))?;
            let t0 = Instant::now();
            let ops = full_replace(&table);
            let batch = Batch::encode(1, &ops).map_err(|e| format!("encode: {e}"))?;
            let encode = t0.elapsed();
            let stats = nft
                .commit(&batch)
                .map_err(|e| format!("nodelb commit: {}", error_chain(&e)))?;
            Ok((encode, stats.commit, batch.len(), batch.message_count()))
        })?;
        if (bytes, msgs) != (batch_bytes, batch_msgs) {
            return Err(format!(
                "batch changed between iterations: {bytes}/{msgs} vs {batch_bytes}/{batch_msgs}"
            ));
        }
        check_kernel(&ns, &table, "nodelb install", i == 0)?;
        drop(ns);
        println!(
            "  #{i} nodelb: encode {:8.2} ms  commit {:8.2} ms  total {:8.2} ms",
            ms(e),
            ms(c),
            ms(e + c)
        );
        enc.push(e);
        com.push(c);
        tot.push(e + c);

        // nft -f, spawned inside the namespace, likewise
        wait_quiet()?;
        let ns = Netns::new("bench-nft");
        let d = ns.run(|| nft_file(&script))?;
        check_kernel(&ns, &table, "nft -f install", i == 0)?;
        drop(ns);
        nft_direct.push(d);

        // nft -f through `ip netns exec` (the test helper)
        wait_quiet()?;
        let ns = Netns::new("bench-nftx");
        let t0 = Instant::now();
        nft_f(&ns, &script).map_err(|e| format!("ip netns exec nft -f: {e}"))?;
        let dx = t0.elapsed();
        check_kernel(&ns, &table, "ip netns exec nft -f install", false)?;
        drop(ns);
        nft_exec.push(dx);
        println!(
            "  #{i} nft -f: {:8.2} ms   (via ip netns exec: {:8.2} ms)",
            ms(d),
            ms(dx)
        );
    }
    let install_total = report.add("nodelb_install_total", "nodelb total (encode+commit)", &tot);
    report.add(
        "nodelb_install_encode",
        "nodelb encode (full_replace + Batch::encode)",
        &enc,
    );
    report.add(
        "nodelb_install_commit",
        "nodelb commit (send + all ACKs)",
        &com,
    );
    let nft_install = report.add(
        "nft_f_install_total",
        "nft -f total (spawn + parse + commit)",
        &nft_direct,
    );
    report.add(
        "nft_f_netns_exec_install_total",
        "nft -f via `ip netns exec` (reference)",
        &nft_exec,
    );
    report.print_table(
        &format!(
            "Full install of {n} Services x {eps} endpoints into an empty namespace \
             (batch {batch_bytes} bytes / {batch_msgs} messages; script {} bytes)",
            script.len()
        ),
        &[
            "nodelb_install_encode",
            "nodelb_install_commit",
            "nodelb_install_total",
            "nft_f_install_total",
            "nft_f_netns_exec_install_total",
        ],
    );

    // ---- 1'. replace over an existing table, same namespace ----
    println!();
    println!(
        "[1'] replace over the existing table, one namespace each way ({} iterations after one untimed install)",
        cfg.iterations
    );
    let ns = Netns::new("bench-repl");
    let (r_enc, r_com, r_wall) = ns.run(|| -> Res<_> {
        let mut c = Committer::new(Nft::open().map_err(|e| format!("Nft::open: {e}"))?);
        replace(&mut c, vec![table.clone()])
            .map_err(|e| format!("initial replace: {}", error_chain(&e)))?;
        let (mut e, mut k, mut w) = (Vec::new(), Vec::new(), Vec::new());
        for _ in 0..cfg.iterations {
            // The copy is made before the clock starts; the committer keeps no model of it
            // (the next iteration replaces it whole again).
            let mut t = Some(vec![table.clone()]);
            let mut build = || t.take().unwrap_or_default();
            let t0 = Instant::now();
            let s = c
                .commit(Commit::replace(&mut build).reset_counters())
                .map_err(|e| format!("replace: {}", error_chain(&e)))?
                .stats;
            w.push(t0.elapsed());
            e.push(s.encode);
            k.push(s.commit);
        }
        Ok((e, k, w))
    })?;
    check_kernel(&ns, &table, "nodelb replace over existing", false)?;
    drop(ns);
    let ns = Netns::new("bench-nftrepl");
    ns.run(|| nft_file(&script))?;
    let mut nft_repl = Vec::new();
    for _ in 0..cfg.iterations {
        nft_repl.push(ns.run(|| nft_file(&script))?);
    }
    check_kernel(&ns, &table, "nft -f replace over existing", false)?;
    drop(ns);
    report.add(
        "nodelb_replace_existing_wall",
        "nodelb Committer::commit replace wall (validate+encode+commit)",
        &r_wall,
    );
    report.add(
        "nodelb_replace_existing_encode",
        "nodelb Batch::encode only",
        &r_enc,
    );
    report.add(
        "nodelb_replace_existing_commit",
        "nodelb commit (send + all ACKs)",
        &r_com,
    );
    report.add("nft_f_replace_existing_total", "nft -f total", &nft_repl);
    report.print_table(
        "Replace over an existing identical table (delete + re-add in one transaction)",
        &[
            "nodelb_replace_existing_wall",
            "nodelb_replace_existing_encode",
            "nodelb_replace_existing_commit",
            "nft_f_replace_existing_total",
        ],
    );

    // ---- 2. one endpoint change ----
    let mut change_sizes = Vec::new();
    let mut sync_at_n = None;
    for services in [n, 100] {
        let r = one_endpoint_change(&mut report, services, eps, cfg.iterations)?;
        change_sizes.push((services, r.bytes, r.messages));
        if services == n {
            sync_at_n = Some((r.wall, r.encode_commit));
        }
        if n == 100 {
            break;
        }
    }
    println!();
    for (s, b, m) in &change_sizes {
        println!("  one-endpoint diff batch at {s:>6} Services: {b} bytes, {m} messages");
    }
    let sizes_equal = change_sizes
        .windows(2)
        .all(|w| (w[0].1, w[0].2) == (w[1].1, w[1].2));
    println!(
        "  batch size independent of the number of Services: {}",
        if sizes_equal {
            "yes"
        } else {
            "NO (unexpected)"
        }
    );

    // ---- 3. goals ----
    let (sync_wall, sync_ec) = sync_at_n.expect("measured");
    println!();
    println!("Goals (medians; a MISS is reported, not failed)");
    println!(
        "  {} full install {n}x{eps}, nodelb encode+commit < {GOAL_INSTALL_MS:.0} ms: {:.1} ms",
        goal(install_total.median < GOAL_INSTALL_MS),
        install_total.median
    );
    println!(
        "  {} full install {n}x{eps}, nodelb not slower than nft -f: {:.1} ms vs {:.1} ms ({:.2}x)",
        goal(install_total.median <= nft_install.median),
        install_total.median,
        nft_install.median,
        nft_install.median / install_total.median
    );
    println!(
        "  {} one-endpoint change at {n} Services, encode+commit (as for the install) < {GOAL_CHANGE_MS:.0} ms: {:.3} ms",
        goal(sync_ec.median < GOAL_CHANGE_MS),
        sync_ec.median
    );
    println!(
        "  {} stricter reading, whole sync including the O(elements) edit between the models: {:.3} ms",
        goal(sync_wall.median < GOAL_CHANGE_MS),
        sync_wall.median
    );

    let limits = match std::env::var("NODELB_BENCH_LIMITS").as_deref() {
        Err(_) | Ok("") | Ok("1") => Some(true),
        Ok("big") => Some(false),
        Ok("0") => None,
        Ok(v) => return Err(format!("NODELB_BENCH_LIMITS={v:?}: expected 0, 1 or big")),
    };
    if let Some(wide_too) = limits {
        let goals = limits::run(&mut report, cfg.iterations, wide_too)?;
        println!();
        println!("Goals at the limits (medians; a MISS is reported, not failed)");
        for line in goals {
            println!("{line}");
        }
    }

    println!();
    report.print_grep_lines();
    Ok(())
}

struct ChangeResult {
    wall: Summary,
    encode_commit: Summary,
    bytes: usize,
    messages: usize,
}

/// Commit `bench_table(services, eps)` with a `Committer`, then sync `iterations` one-endpoint
/// changes alternating between two variants. Returns the whole-sync timing and the batch size.
fn one_endpoint_change(
    report: &mut Report,
    services: usize,
    eps: usize,
    iterations: usize,
) -> Res<ChangeResult> {
    println!();
    println!(
        "[2] one endpoint change at {services} Services ({iterations} syncs alternating two variants)"
    );
    let base = bench_table(services, eps);
    let svc = MOVED_SERVICE.min(services - 1);
    let variants: Vec<Table> = VARIANT_PORTS
        .iter()
        .map(|p| {
            let mut t = base.clone();
            move_bench_endpoint(&mut t, svc, *p);
            t
        })
        .collect();
    // Deriving the edit outside the Committer, for the breakdown (same inputs it sees).
    let mut diff_times = Vec::new();
    for k in 0..iterations {
        let (old, new) = if k == 0 {
            (&base, &variants[0])
        } else {
            (&variants[(k - 1) % 2], &variants[k % 2])
        };
        let t0 = Instant::now();
        let e = edit_between(old, new);
        let n_ops = e
            .as_ref()
            .map(|e| e.ops(old).map(|(ops, _)| ops.len()))
            .transpose()
            .map_err(|e| format!("variant invalid: {e}"))?;
        diff_times.push(t0.elapsed());
        if n_ops != Some(2) {
            return Err(format!(
                "one endpoint change planned as {n_ops:?} ops (None: a whole replace), expected a delete and an add"
            ));
        }
    }

    let ns = Netns::new("bench-sync");
    let (walls, encs, coms, sizes) = ns.run(|| -> Res<_> {
        let mut c = Committer::new(Nft::open().map_err(|e| format!("Nft::open: {e}"))?);
        replace(&mut c, vec![base.clone()]).map_err(|e| format!("install: {}", error_chain(&e)))?;
        let (mut w, mut e, mut k, mut sizes) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
        for i in 0..iterations {
            // The Committer keeps the model it is given; the copy is made before the clock starts.
            let t = variants[i % 2].clone();
            let t0 = Instant::now();
            let s = sync(&mut c, vec![t]).map_err(|e| format!("sync: {}", error_chain(&e)))?;
            w.push(t0.elapsed());
            e.push(s.encode);
            k.push(s.commit);
            sizes.push((s.bytes, s.messages));
        }
        Ok((w, e, k, sizes))
    })?;
    let (bytes, messages) = sizes[0];
    if sizes.iter().any(|s| *s != (bytes, messages)) {
        return Err(format!("diff batch sizes vary between syncs: {sizes:?}"));
    }
    if messages == 0 {
        return Err("a one-endpoint sync sent nothing".into());
    }
    // The kernel holds the last variant's endpoint, and nothing else moved.
    let last = &variants[(iterations - 1) % 2];
    check_kernel(&ns, last, "after the one-endpoint syncs", false)?;
    let want_port = VARIANT_PORTS[(iterations - 1) % 2];
    let other_port = VARIANT_PORTS[iterations % 2];
    let map = ns
        .sh_ok("nft list map ip nodelb endpoints")
        .map_err(|e| format!("listing endpoints: {e}"))?;
    let port_hits = |p: u16| {
        map.lines()
            .filter(|l| {
                l.rsplit_once(" : ").is_some_and(|(_, d)| {
                    d.trim_end_matches([',', ' ', '}'])
                        .ends_with(&format!(" . {p}"))
                })
            })
            .count()
    };
    let want_key = format!("tcp . {} . 0 comment", 1024 + svc);
    let moved_line_ok = map
        .lines()
        .any(|l| l.contains(&want_key) && l.contains(&format!(". {want_port}")));
    if port_hits(want_port) != 1 || port_hits(other_port) != 0 || !moved_line_ok {
        return Err(format!(
            "kernel endpoints after the syncs: {} elements with port {want_port} (want 1, on Service {svc}: {moved_line_ok}), {} with {other_port} (want 0)",
            port_hits(want_port),
            port_hits(other_port)
        ));
    }
    println!(
        "  kernel check: endpoint 0 of Service {svc} is on port {want_port}, nothing else moved"
    );
    drop(ns);

    let p = format!("nodelb_sync_one_endpoint_{services}");
    let wall = report.add(
        &format!("{p}_wall"),
        "sync wall (edit between models+encode+commit)",
        &walls,
    );
    report.add(&format!("{p}_encode"), "  of which Batch::encode", &encs);
    report.add(
        &format!("{p}_commit"),
        "  of which commit (send + ACKs)",
        &coms,
    );
    let ec: Vec<Duration> = encs.iter().zip(&coms).map(|(a, b)| *a + *b).collect();
    let encode_commit = report.add(&format!("{p}_total"), "  encode+commit", &ec);
    report.add(
        &format!("{p}_diff"),
        "  edit_between + Edit::ops alone (measured outside)",
        &diff_times,
    );
    let names: Vec<String> = ["wall", "encode", "commit", "total", "diff"]
        .iter()
        .map(|s| format!("{p}_{s}"))
        .collect();
    report.print_table(
        &format!(
            "One endpoint change at {services} Services x {eps} endpoints (diff batch {bytes} bytes / {messages} messages)"
        ),
        &names.iter().map(String::as_str).collect::<Vec<_>>(),
    );
    Ok(ChangeResult {
        wall,
        encode_commit,
        bytes,
        messages,
    })
}

fn elements(t: &Table, set: &str) -> usize {
    t.sets.get(set).map_or(0, |s| s.elements.len())
}

/// Checks that the kernel holds `model`: chain rule counts and set element counts read back
/// over netlink (cheap, every call), and with `listing` also the endpoint and dispatch map
/// elements counted in `nft list map` output (independent of nodelb's code).
fn check_kernel(ns: &Netns, model: &Table, what: &str, listing: bool) -> Res<()> {
    let drift = ns.run(|| -> Res<Drift> {
        let mut nft = Nft::open().map_err(|e| format!("Nft::open: {e}"))?;
        nft.drift(model, &[])
            .map_err(|e| format!("readback: {}", error_chain(&e)))
    })?;
    if drift != Drift::None {
        return Err(format!("{what}: kernel differs from the model: {drift:?}"));
    }
    if listing {
        let t0 = Instant::now();
        let mut counts = Vec::new();
        for set in ["endpoints", "services"] {
            let text = ns
                .sh_ok(&format!("nft list map ip nodelb {set}"))
                .map_err(|e| format!("{what}: {e}"))?;
            // Every element of the benchmark's maps carries a `bench/svc-<i>:<port>` comment.
            let got = text.matches("comment \"bench/").count();
            let want = elements(model, set);
            if got != want {
                return Err(format!(
                    "{what}: `nft list map ip nodelb {set}` shows {got} elements, expected {want}"
                ));
            }
            counts.push(got);
        }
        println!(
            "  kernel check ({what}): nft lists {} endpoint and {} dispatch elements; readback matches the model ({:.0} ms)",
            counts[0],
            counts[1],
            ms(t0.elapsed())
        );
    }
    Ok(())
}

fn error_chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut src = e.source();
    while let Some(c) = src {
        s.push_str(": ");
        s.push_str(&c.to_string());
        src = c.source();
    }
    s
}
