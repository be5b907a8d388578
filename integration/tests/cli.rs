//! The `nodelb-agent render` and `apply` commands on the repository's fixtures, through the
//! real binary: `render` prints exactly the golden file, `nft -c -f` accepts it, and `apply` in
//! a fresh namespace leaves the kernel listing exactly what `nft -f` of the render leaves in
//! another. (`planned.rs` proves the same for the library; this proves the commands.)
//!
//! Run as root: `cargo test -p nodelb-integration --test cli`.

use std::path::{Path, PathBuf};
use std::process::Command;

use nodelb_integration::e2e::agent_binary;
use nodelb_integration::netns::{require_root, Netns};
use nodelb_integration::nft::{list_table, nft_check, nft_f};

/// The node every golden file was planned for (see `integration/fixtures/README.md`).
const NODE_ARGS: [&str; 12] = [
    "--node-name",
    "node-a",
    "--node-address",
    "203.0.113.10",
    "--node-address",
    "2001:db8:1::10",
    "--node-labels",
    "kubernetes.io/hostname=node-a,nodelb.io/pool=edge,topology.kubernetes.io/zone=zone-a",
    "--ipv4=true",
    "--ipv6=true",
    // (two placeholders so the array has a fixed size)
    "--lb-class",
    "nodelb.io/nodelb",
];

fn fixtures() -> Vec<(String, PathBuf)> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures");
    let mut out: Vec<(String, PathBuf)> = std::fs::read_dir(&dir)
        .expect("integration/fixtures exists")
        .map(|e| e.expect("readable").path())
        .filter(|p| p.extension().is_some_and(|e| e == "yaml"))
        .map(|p| (p.file_stem().unwrap().to_string_lossy().into_owned(), p))
        .collect();
    out.sort();
    assert!(out.len() >= 5, "the fixture set: {out:?}");
    out
}

/// Runs the agent binary with `args` (inside `ns` when given); stdout, or a panic with stderr.
fn agent(ns: Option<&Netns>, args: &[&str]) -> String {
    let bin = agent_binary();
    let mut cmd = match ns {
        Some(ns) => {
            let mut c = Command::new("ip");
            c.args(["netns", "exec", ns.name()]).arg(&bin);
            c
        }
        None => Command::new(&bin),
    };
    let out = cmd.args(args).output().expect("run nodelb-agent");
    assert!(
        out.status.success(),
        "nodelb-agent {args:?} failed ({}):\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).expect("utf-8 output")
}

fn render(fixture: &Path) -> String {
    let f = fixture.to_str().unwrap();
    let mut args = vec!["render", "-f", f];
    args.extend(NODE_ARGS);
    agent(None, &args)
}

#[test]
fn render_prints_the_golden_file_and_nft_accepts_it() {
    if !require_root("render_prints_the_golden_file_and_nft_accepts_it") {
        return;
    }
    for (name, path) in fixtures() {
        let script = render(&path);
        let golden_path = path.with_file_name(format!("golden/{name}.nft"));
        let golden = std::fs::read_to_string(&golden_path).expect("golden file");
        assert!(
            script == golden,
            "{name}: `nodelb-agent render` differs from {} (regenerate the goldens with \
             NODELB_BLESS=1 cargo test -p nodelb-integration --test planned if the change is \
             intended)",
            golden_path.display()
        );
        let ns = Netns::new("cli-check");
        nft_check(&ns, &script).unwrap_or_else(|e| panic!("{name}: nft -c rejects it: {e}"));
    }
}

#[test]
fn apply_lists_exactly_what_nft_f_of_the_render_lists() {
    if !require_root("apply_lists_exactly_what_nft_f_of_the_render_lists") {
        return;
    }
    for (name, path) in fixtures() {
        let script = render(&path);
        let ours = Netns::new("cli-apply");
        let theirs = Netns::new("cli-nft");
        let f = path.to_str().unwrap();
        let mut args = vec!["apply", "-f", f];
        args.extend(NODE_ARGS);
        let line = agent(Some(&ours), &args);
        assert!(
            line.lines().count() == 1 && line.contains("objects") && line.contains("commit"),
            "{name}: apply prints one line of stats, got {line:?}"
        );
        nft_f(&theirs, &script).unwrap_or_else(|e| panic!("{name}: nft -f failed: {e}"));
        for fam in ["ip", "ip6"] {
            let a = list_table(&ours, fam, "nodelb");
            let b = list_table(&theirs, fam, "nodelb");
            match (a, b) {
                (Ok(a), Ok(b)) => {
                    assert!(
                        a == b,
                        "{name}: {fam} nodelb differs between apply and nft -f"
                    );
                    assert!(a.contains("map services"), "{name}: empty listing {a}");
                }
                (a, b) => panic!("{name}: {fam} nodelb: apply {a:?}, nft -f {b:?}"),
            }
        }
        // cleanup removes nodelb's tables and nothing else.
        ours.sh("nft add table inet foreign");
        agent(Some(&ours), &["cleanup"]);
        let left = ours.sh("nft list tables");
        assert_eq!(
            left.trim(),
            "table inet foreign",
            "{name}: after cleanup: {left}"
        );
    }
}
