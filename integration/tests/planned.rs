//! The planner's tables, rung 2 of the test ladder: every fixture in `integration/fixtures/` is
//! planned for one fixed node, rendered, and
//! - compared with its golden files (`golden/<fixture>.nft`, the text `nodelb-agent render`
//!   prints, and `golden/<fixture>.outcomes`, what happened to each Service and every warning);
//!   `NODELB_BLESS=1` rewrites them;
//! - checked by `nft -c -f` in a fresh namespace;
//! - applied through nodelb's netlink batch in one namespace and through `nft -f` of the render
//!   in another: `nft list table` must read the same.
//!
//! The node is what `fixtures/README.md` gives as `render` flags (`nodelb_integration::planning`
//! plans for it): `node-a`, 203.0.113.10 and
//! 2001:db8:1::10 (also its only host addresses), both families, default config.
//!
//! Run: `cargo test -p nodelb-integration --test planned` (the kernel tests need root).

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use nodelb_agent::object_files::{ObjectFiles, Skipped};
use nodelb_core::plan::Plan;
use nodelb_integration::netns::{require_root, Netns};
use nodelb_integration::nft::{list_table, nft_check, nft_f, nodelb_replace};
use nodelb_integration::planning::{fixtures_dir, plan_for_fixture_node, read_fixture};

/// Every `fixtures/*.yaml`, by stem, sorted.
fn fixtures() -> Vec<(String, PathBuf)> {
    let mut out: Vec<(String, PathBuf)> = std::fs::read_dir(fixtures_dir())
        .expect("integration/fixtures exists")
        .map(|e| e.expect("readable fixtures dir").path())
        .filter(|p| p.extension().is_some_and(|e| e == "yaml"))
        .map(|p| (p.file_stem().unwrap().to_string_lossy().into_owned(), p))
        .collect();
    out.sort();
    assert!(
        out.len() >= 5,
        "expected the fixture set, found {out:?} in {}",
        fixtures_dir().display()
    );
    out
}

/// One fixture, planned.
struct Planned {
    name: String,
    objects: ObjectFiles,
    plan: Plan,
}

impl Planned {
    fn load(name: &str, path: &Path) -> Planned {
        let objects = read_fixture(path);
        let plan = plan_for_fixture_node(&objects);
        Planned {
            name: name.to_string(),
            objects,
            plan,
        }
    }

    /// What `nodelb-agent render` prints: each table's replace script, IPv4 first.
    /// What `nodelb-agent render` prints for this plan (the same function).
    fn script(&self) -> String {
        nodelb_agent::oneshot::render(&self.plan)
    }

    /// Skipped documents, each handled Service's outcome, and every warning, one per line.
    fn outcomes(&self) -> String {
        let mut out = String::new();
        for s in &self.objects.skipped {
            let _ = writeln!(out, "skipped {}", skipped_line(s));
        }
        for (key, outcome) in &self.plan.services {
            let _ = writeln!(out, "service {key}: {outcome}");
        }
        for w in &self.plan.warnings {
            let _ = writeln!(out, "warning {w}");
        }
        out
    }
}

/// A skipped document as the golden files name it: `document N: Kind ns/name unreadable: why`
/// or `document N: kind "Kind" (ns/name) ignored`.
fn skipped_line(s: &Skipped) -> String {
    let object = format!(
        "{}/{}",
        s.namespace.as_deref().unwrap_or(""),
        s.name.as_deref().unwrap_or("")
    );
    match &s.error {
        Some(e) => format!(
            "document {}: {} {object} unreadable: {e}",
            s.document, s.kind
        ),
        None => format!(
            "document {}: kind {:?} ({object}) ignored",
            s.document, s.kind
        ),
    }
}

fn all_planned() -> Vec<Planned> {
    fixtures()
        .iter()
        .map(|(name, path)| Planned::load(name, path))
        .collect()
}

// ---- golden --------------------------------------------------------------------------------

fn blessing() -> bool {
    std::env::var("NODELB_BLESS").is_ok_and(|v| v == "1")
}

/// Compares `actual` with the golden file, or rewrites it under `NODELB_BLESS=1`. On a
/// mismatch, writes `actual` next to the test's scratch dir and returns a message with a
/// `diff -u` command line and the differing lines.
fn check_golden(file: &str, actual: &str) -> Option<String> {
    let golden = fixtures_dir().join("golden").join(file);
    if blessing() {
        std::fs::create_dir_all(golden.parent().unwrap()).unwrap();
        std::fs::write(&golden, actual)
            .unwrap_or_else(|e| panic!("writing {}: {e}", golden.display()));
        return None;
    }
    let expected = std::fs::read_to_string(&golden).unwrap_or_default();
    if expected == actual {
        return None;
    }
    let scratch = Path::new(env!("CARGO_TARGET_TMPDIR")).join("planned");
    std::fs::create_dir_all(&scratch).unwrap();
    let actual_path = scratch.join(file);
    std::fs::write(&actual_path, actual).unwrap();
    Some(format!(
        "{file} differs from its golden file (NODELB_BLESS=1 rewrites it if the change is intended)\n  diff -u {} {}\n{}",
        golden.display(),
        actual_path.display(),
        line_diff(&expected, actual)
    ))
}

/// A minimal line diff (longest common subsequence): `-` golden, `+` actual, 2 lines of context.
fn line_diff(expected: &str, actual: &str) -> String {
    let a: Vec<&str> = expected.lines().collect();
    let b: Vec<&str> = actual.lines().collect();
    let mut lcs = vec![vec![0u32; b.len() + 1]; a.len() + 1];
    for i in (0..a.len()).rev() {
        for j in (0..b.len()).rev() {
            lcs[i][j] = if a[i] == b[j] {
                lcs[i + 1][j + 1] + 1
            } else {
                lcs[i + 1][j].max(lcs[i][j + 1])
            };
        }
    }
    let mut ops: Vec<(char, &str)> = Vec::new();
    let (mut i, mut j) = (0, 0);
    while i < a.len() || j < b.len() {
        if i < a.len() && j < b.len() && a[i] == b[j] {
            ops.push((' ', a[i]));
            i += 1;
            j += 1;
        } else if i < a.len() && (j == b.len() || lcs[i + 1][j] >= lcs[i][j + 1]) {
            ops.push(('-', a[i]));
            i += 1;
        } else {
            ops.push(('+', b[j]));
            j += 1;
        }
    }
    let near = |k: usize| {
        ops[k.saturating_sub(2)..(k + 3).min(ops.len())]
            .iter()
            .any(|(c, _)| *c != ' ')
    };
    let mut out = String::new();
    let mut gap = false;
    for (k, (c, line)) in ops.iter().enumerate() {
        if near(k) {
            let _ = writeln!(out, "{c}{line}");
            gap = false;
        } else if !gap {
            out.push_str("...\n");
            gap = true;
        }
    }
    out
}

#[test]
fn every_fixture_renders_as_its_golden_file() {
    let mut failures = Vec::new();
    let mut expected_files = BTreeSet::new();
    for p in all_planned() {
        let script = p.script();
        // Pure: the same input plans to the same text.
        assert_eq!(
            script,
            Planned::load(&p.name, &fixtures_dir().join(format!("{}.yaml", p.name))).script(),
            "{}: planning twice gave different tables",
            p.name
        );
        for (file, text) in [
            (format!("{}.nft", p.name), script),
            (format!("{}.outcomes", p.name), p.outcomes()),
        ] {
            failures.extend(check_golden(&file, &text));
            expected_files.insert(file);
        }
    }
    // A golden file without its fixture is a fixture deleted or renamed by mistake.
    let golden_dir = fixtures_dir().join("golden");
    for e in std::fs::read_dir(&golden_dir).expect("fixtures/golden exists") {
        let file = e.unwrap().file_name().to_string_lossy().into_owned();
        if !expected_files.contains(&file) {
            if blessing() {
                std::fs::remove_file(golden_dir.join(&file)).unwrap();
            } else {
                failures.push(format!("golden/{file} has no fixture"));
            }
        }
    }
    assert!(failures.is_empty(), "\n{}", failures.join("\n\n"));
}

/// The fixtures cover what they claim: every outcome kind and protocol, both families, bad
/// input. Keeps the fixture set from silently losing a case when it is edited and re-blessed.
#[test]
fn fixtures_cover_every_outcome_protocol_and_family() {
    let planned = all_planned();
    let outcomes: String = planned.iter().map(Planned::outcomes).collect();
    let scripts: String = planned.iter().map(Planned::script).collect();
    for needle in [
        "forwards to 3 endpoints",
        "forwards to 1 terminating endpoints",
        "drops: Local policy",
        "rejects: no endpoints",
        "port conflict, held by team-a/web",
        "port conflict, held by team-c/alpha",
        "reserved ports: 22/TCP",
        "reserved ports: 6443/TCP",
        "reserved ports: 30080/UDP",
        "not served: node does not match selector",
        "not served: invalid node selector",
        "no valid port",
        "is not TCP, UDP or SCTP",
        "is not a CIDR",
        "timeoutSeconds 0 is not 1-86400",
        "sessionAffinity \"Sticky\" is not None or ClientIP",
        "is not an IP address",
        "unreadable",
        "ignored",
    ] {
        assert!(
            outcomes.contains(needle),
            "no fixture shows {needle:?}:\n{outcomes}"
        );
    }
    for needle in [
        "table ip nodelb",
        "table ip6 nodelb",
        "sctp . 2905",
        "udp . 53",
        "tcp . 80",
        "src-prod/frontend",
        "flags dynamic,timeout",
        "ip6 saddr . numgen random mod 1 offset 1 @aff-",
        "numgen random mod 2 0 update @aff-",
        "{ ip saddr . numgen random mod 1 } goto slot-0",
        "dnat ip to meta l4proto . th dport . numgen random mod 1 offset 1 map @endpoints",
        "goto endpoints-2",
        "2001:db8:c0::/48",
        "192.0.2.0/24",
    ] {
        assert!(scripts.contains(needle), "no fixture renders {needle:?}");
    }
    // Services nodelb must leave alone do not appear at all.
    for ignored in ["shop/web-internal", "shop/web-cloud"] {
        assert!(!outcomes.contains(ignored), "{ignored} was handled");
        assert!(!scripts.contains(ignored), "{ignored} got rules");
    }
}

// ---- the kernel ----------------------------------------------------------------------------

#[test]
fn nft_accepts_every_fixture() {
    if !require_root("nft_accepts_every_fixture") {
        return;
    }
    for p in all_planned() {
        let ns = Netns::new("planned-check");
        let script = p.script();
        nft_check(&ns, &script)
            .unwrap_or_else(|e| panic!("{}: nft -c rejects the render:\n{e}\n{script}", p.name));
    }
}

#[test]
fn nodelb_batch_and_nft_list_every_fixture_identically() {
    if !require_root("nodelb_batch_and_nft_list_every_fixture_identically") {
        return;
    }
    for p in all_planned() {
        let ours = Netns::new("planned-ours");
        let theirs = Netns::new("planned-nft");
        nodelb_replace(&ours, &p.plan.tables)
            .unwrap_or_else(|e| panic!("{}: nodelb batch failed: {e} ({e:?})", p.name));
        let script = p.script();
        nft_f(&theirs, &script)
            .unwrap_or_else(|e| panic!("{}: nft -f failed:\n{e}\n{script}", p.name));
        let mut listings = BTreeMap::new();
        for t in &p.plan.tables {
            let fam = t.family.keyword();
            let a = list_table(&ours, fam, &t.name).expect("list nodelb's table");
            let b = list_table(&theirs, fam, &t.name).expect("list nft's table");
            assert!(
                a == b,
                "{}: {fam} {} lists differently (- nodelb batch, + nft -f):\n{}",
                p.name,
                t.name,
                line_diff(&a, &b)
            );
            // Both listings hold the planned table, not two empty ones.
            assert!(
                a.contains("map services") && a.contains("chain postrouting"),
                "{}: suspicious listing:\n{a}",
                p.name
            );
            listings.insert(fam, a);
        }
        assert!(!listings.is_empty(), "{}: no table planned", p.name);
    }
}
