//! What the benchmarks share: their knobs, read from the environment; the statistics and
//! process memory they print.

/// `name` from the environment as an integer of at least `min`; `default` when it is unset.
pub fn env_usize(name: &str, default: usize, min: usize) -> Result<usize, String> {
    match std::env::var(name) {
        Err(_) => Ok(default),
        Ok(v) => match v.trim().parse::<usize>() {
            Ok(n) if n >= min => Ok(n),
            _ => Err(format!("{name}={v:?}: expected an integer >= {min}")),
        },
    }
}

/// Milliseconds, as the benches print them.
pub fn ms(d: std::time::Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

/// How a bench prints a result against its goal: `PASS`, or `MISS` (reported, never failed).
pub fn goal(ok: bool) -> &'static str {
    if ok {
        "PASS"
    } else {
        "MISS"
    }
}

/// KiB as MiB.
pub fn mib(kib: u64) -> f64 {
    kib as f64 / 1024.0
}

/// Nearest-rank percentile of sorted values.
pub fn pct(sorted: &[f64], p: f64) -> f64 {
    let rank = ((p / 100.0) * sorted.len() as f64).ceil().max(1.0) as usize;
    sorted[rank.min(sorted.len()) - 1]
}

/// Order statistics of a sample.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Stats {
    pub n: usize,
    pub min: f64,
    pub p50: f64,
    pub p99: f64,
    pub max: f64,
    pub mean: f64,
}

/// The statistics of `v`; `None` when it is empty.
pub fn stats(v: &[f64]) -> Option<Stats> {
    if v.is_empty() {
        return None;
    }
    let mut s = v.to_vec();
    s.sort_by(|a, b| a.total_cmp(b));
    Some(Stats {
        n: s.len(),
        min: s[0],
        p50: pct(&s, 50.0),
        p99: pct(&s, 99.0),
        max: s[s.len() - 1],
        mean: s.iter().sum::<f64>() / s.len() as f64,
    })
}

/// A process's memory from `/proc/<pid>/status`, in KiB.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Memory {
    /// `VmRSS`: resident now.
    pub rss: u64,
    /// `VmHWM`: the most it was ever resident.
    pub hwm: u64,
}

/// `VmRSS` and `VmHWM` of process `pid`.
pub fn memory(pid: u32) -> Result<Memory, String> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))
        .map_err(|e| format!("reading /proc/{pid}/status: {e}"))?;
    let field = |name: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
            .ok_or_else(|| format!("no {name} in /proc/{pid}/status"))
    };
    Ok(Memory {
        rss: field("VmRSS:")?,
        hwm: field("VmHWM:")?,
    })
}

/// Process `pid`'s CPU time so far (user + system, from `/proc/<pid>/stat`), in seconds.
pub fn cpu_seconds(pid: u32) -> Option<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // Fields after the command's closing parenthesis: state is field 3, utime 14, stime 15.
    let rest = &stat[stat.rfind(')')? + 2..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    let ticks: f64 = f.get(11)?.parse::<f64>().ok()? + f.get(12)?.parse::<f64>().ok()?;
    // SAFETY: sysconf reads a constant of the system.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    (hz > 0).then(|| ticks / hz as f64)
}

/// Polls `f` every `every` until it returns `Some`, for at most `timeout`.
pub fn wait_until<T>(
    what: &str,
    timeout: std::time::Duration,
    every: std::time::Duration,
    mut f: impl FnMut() -> Result<Option<T>, String>,
) -> Result<T, String> {
    let t0 = std::time::Instant::now();
    loop {
        if let Some(v) = f()? {
            return Ok(v);
        }
        if t0.elapsed() > timeout {
            return Err(format!("{what}: not within {timeout:?}"));
        }
        std::thread::sleep(every);
    }
}

/// The release agent a bench runs: `NODELB_AGENT_BIN`, else this workspace's
/// `target/release/nodelb-agent` (under `CARGO_TARGET_DIR` when set). Sets `NODELB_AGENT_BIN`
/// so the harness starts exactly this file.
pub fn release_agent_binary() -> Result<std::path::PathBuf, String> {
    use std::path::PathBuf;
    let bin = match std::env::var_os("NODELB_AGENT_BIN").filter(|v| !v.is_empty()) {
        Some(b) => PathBuf::from(b),
        None => std::env::var_os("CARGO_TARGET_DIR")
            .map(PathBuf::from)
            .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../target"))
            .join("release/nodelb-agent"),
    };
    if !bin.is_file() {
        return Err(format!(
            "the release agent {} does not exist: run `cargo build --release -p nodelb-agent` \
             (or scripts/build-release.sh), or set NODELB_AGENT_BIN",
            bin.display()
        ));
    }
    std::env::set_var("NODELB_AGENT_BIN", &bin);
    Ok(bin)
}

/// The machine's load averages (1, 5, 15 minutes) as `/proc/loadavg` gives them.
pub fn loadavg() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|s| s.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_else(|e| format!("? ({e})"))
}

/// Busy jiffies of all CPUs so far (user, nice, system, irq, softirq, steal: `/proc/stat`).
fn busy_jiffies() -> Result<u64, String> {
    let stat = std::fs::read_to_string("/proc/stat").map_err(|e| format!("/proc/stat: {e}"))?;
    let line = stat.lines().next().unwrap_or_default();
    let v: Vec<u64> = line
        .split_whitespace()
        .skip(1)
        .filter_map(|x| x.parse().ok())
        .collect();
    if v.len() < 8 {
        return Err(format!("/proc/stat: unexpected first line {line:?}"));
    }
    Ok(v[0] + v[1] + v[2] + v[5] + v[6] + v[7])
}

/// Waits, at most 5 s, until a 200 ms window sees at most 2 busy jiffies on the whole machine;
/// says so when it does not. A network namespace just dropped has its tables freed by kernel
/// workers afterwards (at 10,000 Services, about as long as their install took): a commit
/// timed meanwhile would measure them too.
pub fn wait_quiet() -> Result<(), String> {
    let t0 = std::time::Instant::now();
    std::thread::sleep(std::time::Duration::from_millis(200));
    while t0.elapsed() < std::time::Duration::from_secs(5) {
        let b0 = busy_jiffies()?;
        std::thread::sleep(std::time::Duration::from_millis(200));
        if busy_jiffies()? - b0 <= 2 {
            return Ok(());
        }
    }
    println!("  (not quiet after 5 s)");
    Ok(())
}

/// The standard output of `cmd args`, or a note of why it could not run (for the benches'
/// headers: kernel, tool versions).
pub fn command_output(cmd: &str, args: &[&str]) -> String {
    std::process::Command::new(cmd)
        .args(args)
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
        .unwrap_or_else(|e| format!("({cmd}: {e})"))
}

/// The last `n` lines of `text`.
pub fn tail(text: &str, n: usize) -> String {
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_are_nearest_rank() {
        let v: Vec<f64> = (1..=200).map(f64::from).collect();
        let s = stats(&v).expect("a sample");
        assert_eq!(
            (s.n, s.min, s.p50, s.p99, s.max),
            (200, 1.0, 100.0, 198.0, 200.0)
        );
        assert_eq!(stats(&[]), None);
        assert_eq!(stats(&[7.0]).map(|s| (s.p50, s.p99)), Some((7.0, 7.0)));
    }
}
