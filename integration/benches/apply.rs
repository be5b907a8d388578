//! `nodelb-agent apply` against `nft -f` of its own rendered script, as whole processes, each in
//! a fresh network namespace (never the host's netfilter).
//!
//! The objects are `models::bench_objects(N, E)`: N LoadBalancer Services with E endpoints
//! each, written to a file twice: as multi-document YAML (as the fixtures are), and as one
//! JSON `List` with `items` before `kind` (as `kubectl get -o json` prints it). The built
//! `nodelb-agent render -f` gives the script; then, per iteration and each in a new namespace,
//! `nodelb-agent apply -f FILE` of each file and `nft -f SCRIPT` are spawned from a thread
//! inside the namespace, and timed from spawn to exit, with the child's peak RSS from
//! `wait4`. The first iteration checks that both ways leave the same table.
//!
//! A child's peak RSS counts its parent's at the time of the spawn (a forked or vforked
//! process starts from its parent's memory), and this process holds the objects and the
//! script: so each command is spawned and waited for by a small copy of this binary
//! (`NODELB_BENCH_APPLY_MEASURE`), which prints the two figures.
//!
//! Goals, printed PASS/MISS (a MISS does not fail the run; an error does): apply under 1 s and
//! under 100 MiB peak RSS, and not slower than `nft -f`.
//!
//! Env: `NODELB_BENCH_SERVICES` (10000), `NODELB_BENCH_ENDPOINTS` (5),
//! `NODELB_BENCH_ITERATIONS` (5), `NODELB_AGENT_BIN` (else `target/<profile>/nodelb-agent`,
//! built when missing). Needs root; without it prints SKIP and exits 0, or 1 when `CI=true`.
//! Run: `cargo bench -p nodelb-integration --bench apply`.

use nodelb_integration::bench::{env_usize, goal};
use nodelb_integration::e2e::agent_binary;
use nodelb_integration::models::{bench_objects, BENCH_NODE_ADDRESS};
use nodelb_integration::netns::{bench_main, Netns};
use nodelb_integration::nft::list_table;
use std::ffi::OsString;
use std::fs::File;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode, Stdio};
use std::time::Instant;

const GOAL_MS: f64 = 1000.0;
const GOAL_PEAK_RSS_MIB: f64 = 100.0;
/// Set in the small copy of this binary that spawns and measures one command.
const MEASURE_ENV: &str = "NODELB_BENCH_APPLY_MEASURE";

type Res<T> = Result<T, String>;

/// One finished process: wall time from spawn to exit, and its peak RSS.
#[derive(Clone, Copy)]
struct Run {
    ms: f64,
    peak_rss_mib: f64,
}

/// Runs `program args...` through a small copy of this binary, spawned from the calling thread
/// (so in its network namespace), and reads what it measured.
fn measured(program: &Path, args: &[OsString], dir: &Path) -> Res<Run> {
    let exe = std::env::current_exe().map_err(|e| format!("this binary: {e}"))?;
    let out = Command::new(exe)
        .env(MEASURE_ENV, dir)
        .arg(program)
        .args(args)
        .output()
        .map_err(|e| format!("spawning the measuring copy: {e}"))?;
    let text = String::from_utf8_lossy(&out.stdout);
    let figures: Vec<f64> = text
        .split_whitespace()
        .filter_map(|w| w.parse().ok())
        .collect();
    match figures[..] {
        [ms, peak_rss_mib] if out.status.success() => Ok(Run { ms, peak_rss_mib }),
        _ => Err(format!(
            "{} {args:?}: {}",
            program.display(),
            String::from_utf8_lossy(&out.stderr).trim()
        )),
    }
}

/// The measuring copy: spawn the command of our arguments, wait for it, print wall
/// milliseconds and peak RSS in MiB.
fn measure_main(dir: &Path) -> ExitCode {
    let mut args = std::env::args_os().skip(1);
    let Some(program) = args.next() else {
        eprintln!("{MEASURE_ENV}: no command");
        return ExitCode::FAILURE;
    };
    let mut cmd = Command::new(program);
    cmd.args(args);
    match run_process(cmd, dir) {
        Ok(r) => {
            println!("{:.3} {:.3}", r.ms, r.peak_rss_mib);
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("{e}");
            ExitCode::FAILURE
        }
    }
}

/// Spawns `cmd` with stdout and stderr to files in `dir`, and waits for it with `wait4` for
/// its resource usage.
fn run_process(mut cmd: Command, dir: &Path) -> Res<Run> {
    let out = dir.join("child.out");
    let err = dir.join("child.err");
    let file = |p: &Path| File::create(p).map_err(|e| format!("{}: {e}", p.display()));
    cmd.stdin(Stdio::null())
        .stdout(file(&out)?)
        .stderr(file(&err)?);
    let t0 = Instant::now();
    let child = cmd.spawn().map_err(|e| format!("spawning {cmd:?}: {e}"))?;
    let mut status = 0;
    // SAFETY: an all-zero rusage is a valid value for wait4 to overwrite.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: waits for our own child, which std has not reaped (it is only reaped by `wait`).
    let pid = unsafe { libc::wait4(child.id() as libc::pid_t, &mut status, 0, &mut usage) };
    let ms = t0.elapsed().as_secs_f64() * 1e3;
    if pid < 0 {
        return Err(format!("wait4: {}", std::io::Error::last_os_error()));
    }
    if !libc::WIFEXITED(status) || libc::WEXITSTATUS(status) != 0 {
        let stderr = std::fs::read_to_string(&err).unwrap_or_default();
        return Err(format!(
            "{cmd:?} failed (status {status}): {}",
            stderr.trim()
        ));
    }
    Ok(Run {
        ms,
        // Linux reports ru_maxrss in KiB.
        peak_rss_mib: usage.ru_maxrss as f64 / 1024.0,
    })
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    let n = v.len();
    if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}

fn summarize(runs: &[Run]) -> Run {
    Run {
        ms: median(runs.iter().map(|r| r.ms).collect()),
        peak_rss_mib: median(runs.iter().map(|r| r.peak_rss_mib).collect()),
    }
}

/// The two files of the same objects: multi-document YAML, and a kubectl-style JSON List.
fn write_files(dir: &Path, services: usize, endpoints: usize) -> Res<[(&'static str, PathBuf); 2]> {
    let objects = bench_objects(services, endpoints);
    let mut yaml = String::new();
    for (service, slice) in &objects {
        yaml += "---\n";
        yaml += &service.yaml();
        yaml += "---\n";
        yaml += &slice.yaml();
    }
    let items: Vec<serde_json::Value> = objects
        .iter()
        .flat_map(|(s, e)| [s.json(), e.json()])
        .collect();
    // Keys in kubectl's order: `items` before `kind`.
    let list = format!(
        "{{\n  \"apiVersion\": \"v1\",\n  \"items\": {},\n  \"kind\": \"List\",\n  \"metadata\": {{\"resourceVersion\": \"\"}}\n}}\n",
        serde_json::to_string_pretty(&items).map_err(|e| e.to_string())?
    );
    let files = [
        ("yaml", dir.join("objects.yaml")),
        ("json-list", dir.join("objects.json")),
    ];
    for ((_, path), text) in files.iter().zip([yaml, list]) {
        std::fs::write(path, text).map_err(|e| format!("{}: {e}", path.display()))?;
    }
    Ok(files)
}

/// The agent's arguments: this node, every port allowed (Service ports are 1024..).
fn agent_args(subcommand: &str, file: &Path) -> Vec<OsString> {
    let node_address = BENCH_NODE_ADDRESS.to_string();
    [subcommand, "-f"]
        .iter()
        .map(OsString::from)
        .chain([file.as_os_str().to_owned()])
        .chain(
            [
                "--node-name",
                "bench-node",
                "--node-address",
                &node_address,
                "--reserved-ports=",
            ]
            .iter()
            .map(OsString::from),
        )
        .collect()
}

fn render(bin: &Path, file: &Path) -> Res<String> {
    let out = Command::new(bin)
        .args(agent_args("render", file))
        .stderr(Stdio::null())
        .output()
        .map_err(|e| format!("render: {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "render -f {} failed: {}",
            file.display(),
            out.status
        ));
    }
    String::from_utf8(out.stdout).map_err(|e| e.to_string())
}

fn main() -> ExitCode {
    if let Some(dir) = std::env::var_os(MEASURE_ENV) {
        return measure_main(Path::new(&dir));
    }
    bench_main("apply", run)
}

fn run() -> Res<()> {
    let services = env_usize("NODELB_BENCH_SERVICES", 10_000, 1)?;
    let endpoints = env_usize("NODELB_BENCH_ENDPOINTS", 5, 1)?;
    let iterations = env_usize("NODELB_BENCH_ITERATIONS", 5, 1)?;
    if services > 64_000 {
        return Err("NODELB_BENCH_SERVICES: at most 64000 (Service ports are 1024 + i)".into());
    }
    let bin = agent_binary();
    let dir = std::env::temp_dir().join(format!("nodelb-bench-apply-{}", std::process::id()));
    std::fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    let result = measure(&bin, &dir, services, endpoints, iterations);
    let _ = std::fs::remove_dir_all(&dir);
    result
}

fn measure(
    bin: &Path,
    dir: &Path,
    services: usize,
    endpoints: usize,
    iterations: usize,
) -> Res<()> {
    println!(
        "nodelb apply benchmark: {} ({iterations} iterations)",
        bin.display()
    );
    let files = write_files(dir, services, endpoints)?;
    let script = render(bin, &files[0].1)?;
    if render(bin, &files[1].1)? != script {
        return Err("the YAML and the JSON List render different scripts".into());
    }
    let script_path = dir.join("script.nft");
    std::fs::write(&script_path, &script).map_err(|e| e.to_string())?;
    for (label, path) in &files {
        let size = std::fs::metadata(path).map_or(0, |m| m.len());
        println!(
            "  {label}: {} ({:.1} MiB)",
            path.display(),
            size as f64 / (1 << 20) as f64
        );
    }
    println!(
        "  script: {:.1} MiB",
        script.len() as f64 / (1 << 20) as f64
    );
    let mut nodelb: [Vec<Run>; 2] = Default::default();
    let mut nft = Vec::new();
    for i in 0..iterations {
        let mut tables = Vec::new();
        for (k, (label, path)) in files.iter().enumerate() {
            let ns = Netns::new("bench-apply");
            let r = ns.run(|| measured(bin, &agent_args("apply", path), dir))?;
            println!(
                "  #{i} nodelb apply ({label}): {:8.1} ms {:6.1} MiB",
                r.ms, r.peak_rss_mib
            );
            nodelb[k].push(r);
            if i == 0 {
                tables.push(list_table(&ns, "ip", "nodelb")?);
            }
        }
        let ns = Netns::new("bench-applynft");
        let args = ["-f".into(), script_path.clone().into_os_string()];
        let r = ns.run(|| measured(Path::new("nft"), &args, dir))?;
        println!(
            "  #{i} nft -f:                {:8.1} ms {:6.1} MiB",
            r.ms, r.peak_rss_mib
        );
        nft.push(r);
        if i == 0 {
            tables.push(list_table(&ns, "ip", "nodelb")?);
            if tables.iter().any(|t| *t != tables[0]) {
                return Err("apply and nft -f left different tables".into());
            }
        }
    }
    let nft = summarize(&nft);
    for ((label, _), runs) in files.iter().zip(&nodelb) {
        report(label, services, endpoints, summarize(runs), nft);
    }
    Ok(())
}

fn report(file: &str, services: usize, endpoints: usize, nodelb: Run, nft: Run) {
    println!(
        "bench apply services={services} endpoints={endpoints} file={file} nodelb_ms={:.0} nodelb_peak_rss_mib={:.1} nft_ms={:.0} nft_peak_rss_mib={:.1}",
        nodelb.ms, nodelb.peak_rss_mib, nft.ms, nft.peak_rss_mib
    );
    println!(
        "  {} apply ({file}) under {GOAL_MS:.0} ms: {:.0} ms",
        goal(nodelb.ms < GOAL_MS),
        nodelb.ms
    );
    println!(
        "  {} apply ({file}) under {GOAL_PEAK_RSS_MIB:.0} MiB peak RSS: {:.1} MiB",
        goal(nodelb.peak_rss_mib < GOAL_PEAK_RSS_MIB),
        nodelb.peak_rss_mib
    );
    println!(
        "  {} apply ({file}) not slower than nft -f: {:.0} ms against {:.0} ms",
        goal(nodelb.ms <= nft.ms),
        nodelb.ms,
        nft.ms
    );
}
