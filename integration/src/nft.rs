//! Applying models in a namespace two ways — nodelb's netlink batch and `nft -f` of the
//! rendered text — and listing what the kernel holds, for tests that compare them.

use crate::netns::Netns;
use nodelb_netfilter::{render_replace, CommitStats, Committer, Nft, Op, Table};
use std::io::Write;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// `nft list table <family> <name>` inside the namespace, or the error text.
pub fn list_table(ns: &Netns, family: &str, name: &str) -> Result<String, String> {
    ns.sh_ok(&format!("nft list table {family} {name}"))
}

/// `nft list ruleset` inside the namespace.
pub fn list_ruleset(ns: &Netns) -> String {
    ns.sh("nft list ruleset")
}

/// Feed a script to `nft -f -` inside the namespace.
pub fn nft_f(ns: &Netns, script: &str) -> Result<(), String> {
    run_nft(ns, &["-f", "-"], script)
}

/// `nft -c -f -`: check a script against the namespace's kernel without applying it.
pub fn nft_check(ns: &Netns, script: &str) -> Result<(), String> {
    run_nft(ns, &["-c", "-f", "-"], script)
}

fn run_nft(ns: &Netns, args: &[&str], script: &str) -> Result<(), String> {
    let mut child = Command::new("ip")
        .args(["netns", "exec", ns.name(), "nft"])
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| format!("spawning nft: {e}"))?;
    child
        .stdin
        .take()
        .expect("piped stdin")
        .write_all(script.as_bytes())
        .map_err(|e| format!("writing to nft: {e}"))?;
    let out = child
        .wait_with_output()
        .map_err(|e| format!("waiting for nft: {e}"))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(String::from_utf8_lossy(&out.stderr).into_owned())
    }
}

/// Replace the tables through nodelb's netlink batch, inside the namespace.
pub fn nodelb_replace(
    ns: &Netns,
    tables: &[Table],
) -> Result<CommitStats, nodelb_netfilter::Error> {
    ns.run(|| crate::commit::replace(&mut Committer::new(Nft::open()?), tables.to_vec()))
}

/// Apply raw operations through nodelb's netlink batch, inside the namespace.
pub fn nodelb_apply(ns: &Netns, ops: &[Op]) -> Result<CommitStats, nodelb_netfilter::Error> {
    ns.run(|| Nft::open()?.apply(ops))
}

/// Replace a table through `nft -f` of its rendered text, inside the namespace.
pub fn nft_replace(ns: &Netns, t: &Table) -> Result<(), String> {
    nft_f(ns, &render_replace(t))
}

/// `nft -f -` fed `script`, spawned from the calling thread (which must be inside the target
/// namespace: a child inherits its thread's network namespace). Timed from spawn to exit, for
/// the benchmarks' peer figures.
pub fn nft_file(script: &str) -> Result<Duration, String> {
    let t0 = Instant::now();
    let mut child = Command::new("nft")
        .args(["-f", "-"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| format!("spawning nft: {e}"))?;
    let mut stdin = child.stdin.take().expect("piped stdin");
    // Write from another thread so a chatty nft cannot deadlock us on a full stderr pipe.
    let out = std::thread::scope(|s| {
        let writer = s.spawn(move || stdin.write_all(script.as_bytes()));
        let out = child.wait_with_output();
        (writer.join(), out)
    });
    let elapsed = t0.elapsed();
    match out {
        (Ok(Ok(())), Ok(o)) if o.status.success() => Ok(elapsed),
        (_, Ok(o)) if !o.status.success() => Err(format!(
            "nft -f failed ({}): {}",
            o.status,
            String::from_utf8_lossy(&o.stderr).trim()
        )),
        (w, o) => Err(format!(
            "nft -f: writer {w:?}, wait {:?}",
            o.map(|o| o.status)
        )),
    }
}
