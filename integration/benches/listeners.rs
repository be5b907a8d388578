//! What reading the host's listeners costs the agent (`nodelb_agent::host::listeners::Reader`),
//! in a fresh network namespace holding many sockets: N TCP listeners and N bound, unconnected
//! UDP sockets on the wildcard address, and C established TCP connections (both ends), held
//! by other processes (small copies of this binary, `NODELB_BENCH_LISTENERS_HOLD`, at most
//! 8,000 sockets each), as a node's daemons would hold them.
//!
//! Printed per size, median of the runs: the sock_diag dumps alone (TCP and UDP, IPv4 and
//! IPv6; the kernel filters by state, so connections cost nothing), a read whose process names
//! are all known already (every read but the first of a socket), and the first read, which
//! walks `/proc/<pid>/fd` once to name the new sockets. The agent reads at the start of every
//! sync and every 2 s; the goal printed (PASS/MISS, a MISS does not fail the run) is a known-
//! names read under 10 ms at 1,000 TCP and 1,000 UDP listeners, a small part of a sync. (The
//! first read, which names, runs on the periodic look's blocking thread, never in a sync.)
//!
//! Env: `NODELB_BENCH_LISTENERS` (sizes, comma-separated: 100,1000,10000),
//! `NODELB_BENCH_CONNECTIONS` (5000), `NODELB_BENCH_ITERATIONS` (20). Needs root; without it
//! prints SKIP and exits 0, or 1 when `CI=true`.
//! Run: `cargo bench -p nodelb-integration --bench listeners`.

use nodelb_agent::host::listeners::Reader;
use nodelb_integration::bench::env_usize;
use nodelb_integration::netns::{bench_main, Netns};
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream, UdpSocket};
use std::process::{Child, Command, ExitCode, Stdio};
use std::time::{Duration, Instant};

/// Set in a copy of this binary that holds sockets: `<first port>,<listeners>,<connections>`.
const HOLD_ENV: &str = "NODELB_BENCH_LISTENERS_HOLD";
const GOAL: Duration = Duration::from_millis(10);
const GOAL_AT: usize = 1000;
/// Sockets per holder: a process may not open more than its hard `RLIMIT_NOFILE` (often
/// 20,000 in containers), so the sockets are spread over several holders.
const PER_HOLDER: usize = 4000;
/// The first port of the listeners; connection holders listen from `CONN_PORT` up.
const FIRST_PORT: usize = 10000;
const CONN_PORT: usize = 60000;

type Res<T> = Result<T, String>;

/// A holder: `listeners` TCP listeners and as many bound UDP sockets from `first` up (UDP
/// 20,000 ports higher), and `connections` TCP connections to its first listener; says
/// `ready` and holds them until stdin closes.
fn hold(spec: &str) -> Res<()> {
    let f: Vec<usize> = spec
        .split(',')
        .map(|x| x.parse().map_err(|e| format!("{spec}: {e}")))
        .collect::<Res<_>>()?;
    let [first, n, c] = f[..] else {
        return Err(format!("bad hold spec {spec:?}"));
    };
    let need = (2 * n + 2 * c + 256) as libc::rlim_t;
    let mut rl = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: plain system calls with valid pointers.
    unsafe {
        libc::getrlimit(libc::RLIMIT_NOFILE, &mut rl);
        if rl.rlim_cur < need {
            rl.rlim_cur = need.min(rl.rlim_max);
            libc::setrlimit(libc::RLIMIT_NOFILE, &rl);
        }
    }
    let port = |p: usize| u16::try_from(p).map_err(|_| format!("port {p}"));
    let mut tcp = Vec::new();
    let mut udp = Vec::new();
    for i in 0..n {
        let p = port(first + i)?;
        tcp.push(TcpListener::bind(("0.0.0.0", p)).map_err(|e| format!("tcp {p}: {e}"))?);
        if first < CONN_PORT {
            let p = port(first + 20000 + i)?;
            udp.push(UdpSocket::bind(("0.0.0.0", p)).map_err(|e| format!("udp {p}: {e}"))?);
        }
    }
    let mut conns = Vec::new();
    for i in 0..c {
        let client = TcpStream::connect(("127.0.0.1", port(first)?))
            .map_err(|e| format!("connect {i}: {e}"))?;
        let (server, _) = tcp[0].accept().map_err(|e| format!("accept {i}: {e}"))?;
        conns.push((client, server));
    }
    println!("ready");
    std::io::stdout().flush().map_err(|e| e.to_string())?;
    let mut rest = Vec::new();
    let _ = std::io::stdin().read_to_end(&mut rest);
    Ok(())
}

/// Starts a holder in `ns` and waits until it holds its sockets.
fn holder(ns: &Netns, spec: String) -> Res<Child> {
    let exe = std::env::current_exe().map_err(|e| e.to_string())?;
    let mut child = Command::new("ip")
        .args(["netns", "exec", ns.name()])
        .arg(exe)
        .env(HOLD_ENV, spec)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .map_err(|e| format!("spawning a holder: {e}"))?;
    let mut line = String::new();
    BufReader::new(child.stdout.take().ok_or("holder stdout")?)
        .read_line(&mut line)
        .map_err(|e| e.to_string())?;
    if line.trim() != "ready" {
        let _ = child.kill();
        let _ = child.wait();
        return Err(format!("a holder did not get ready: {line:?}"));
    }
    Ok(child)
}

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

fn ms(d: Duration) -> String {
    format!("{:.2} ms", d.as_secs_f64() * 1000.0)
}

/// One size: the holders in a fresh namespace, then the three figures.
fn size(n: usize, connections: usize, iterations: usize) -> Res<()> {
    let ns = Netns::new("listeners");
    let mut holders = Vec::new();
    let stop = |holders: Vec<Child>| {
        for mut h in holders {
            drop(h.stdin.take());
            let _ = h.wait();
        }
    };
    let mut started = || -> Res<usize> {
        for from in (0..n).step_by(PER_HOLDER) {
            let k = PER_HOLDER.min(n - from);
            holders.push(holder(&ns, format!("{},{k},0", FIRST_PORT + from))?);
        }
        // Each connection holder listens on a port of its own, and connects to it.
        let mut extra = 0;
        for from in (0..connections).step_by(PER_HOLDER) {
            let k = PER_HOLDER.min(connections - from);
            holders.push(holder(&ns, format!("{},1,{k}", CONN_PORT + extra))?);
            extra += 1;
        }
        Ok(2 * n + extra)
    };
    let expected = match started() {
        Ok(e) => e,
        Err(e) => {
            stop(holders);
            return Err(e);
        }
    };
    let r = ns.run(|| -> Res<(usize, Duration, Duration, Duration)> {
        let reader = Reader::new();
        let t0 = Instant::now();
        let first = reader.read(true).map_err(|e| e.to_string())?;
        let cold = t0.elapsed();
        let mut dumps = Vec::new();
        let mut warm = Vec::new();
        for _ in 0..iterations {
            let t0 = Instant::now();
            reader.sockets().map_err(|e| e.to_string())?;
            dumps.push(t0.elapsed());
            let t0 = Instant::now();
            reader.read(true).map_err(|e| e.to_string())?;
            warm.push(t0.elapsed());
        }
        let named = first.iter().filter(|l| l.process.is_some()).count();
        if first.len() != expected || named != first.len() {
            return Err(format!(
                "read {} listeners ({named} named), expected {expected}",
                first.len(),
            ));
        }
        Ok((first.len(), median(dumps), median(warm), cold))
    });
    let processes = holders.len();
    stop(holders);
    let (found, dumps, warm, cold) = r?;
    let verdict = if n == GOAL_AT {
        if warm < GOAL {
            " PASS"
        } else {
            " MISS"
        }
    } else {
        ""
    };
    println!(
        "listeners {found:>6} (+{} connected sockets, {processes} processes): dumps {}, read with known names {}{verdict}, first read naming them {}",
        2 * connections,
        ms(dumps),
        ms(warm),
        ms(cold)
    );
    Ok(())
}

fn main() -> ExitCode {
    if let Ok(spec) = std::env::var(HOLD_ENV) {
        return match hold(&spec) {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                println!("holder failed: {e}");
                ExitCode::FAILURE
            }
        };
    }
    bench_main("listeners", || {
        let sizes: Vec<usize> = std::env::var("NODELB_BENCH_LISTENERS")
            .unwrap_or_else(|_| "100,1000,10000".into())
            .split(',')
            .map(|s| s.trim().parse().map_err(|e| format!("{s}: {e}")))
            .collect::<Res<_>>()?;
        let connections = env_usize("NODELB_BENCH_CONNECTIONS", 5000, 0)?;
        let iterations = env_usize("NODELB_BENCH_ITERATIONS", 20, 1)?;
        println!(
            "goal: a read with known names under {} at {GOAL_AT} TCP and {GOAL_AT} UDP listeners",
            ms(GOAL)
        );
        for n in sizes {
            if n > 20000 {
                return Err(format!(
                    "{n}: at most 20000 (ports 10000-29999, 30000-49999)"
                ));
            }
            size(n, connections, iterations)?;
        }
        Ok(())
    })
}
