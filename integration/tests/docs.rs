//! README.md keeps up with the agent: every flag of `nodelb-agent run --help` and every metric
//! the agent exports is named in it. The names come from the agent itself (clap's description
//! of `run`, the rendered metrics registry), so a new flag or metric fails here until it is
//! documented.
//!
//! And the documents refer only to what the repository holds: every relative link in a
//! Markdown file resolves (with its `#anchor`, to a heading), every path a file names from the
//! repository's top (`core/src/plan/settled.rs`, `docs/sizing.md`) exists, every `*.md` a
//! document names exists, every file a document names in backticks (`committer.rs`) is one of
//! the repository's, and no file points at a design document outside the repository: the
//! design is `docs/design.md`.

use clap::CommandFactory;
use nodelb_agent::cli::Cli;
use nodelb_integration::exported::metric_names;
use std::path::PathBuf;

fn readme() -> String {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../README.md");
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("reading {}: {e}", path.display()))
}

/// Whether `name` occurs in `text` as a whole token: not followed by a character that would
/// make it a longer flag or metric name (`--ipv6` is not found in `--ipv6-only`).
fn mentions(text: &str, name: &str) -> bool {
    text.match_indices(name).any(|(i, _)| {
        let before = text[..i].chars().next_back();
        let after = text[i + name.len()..].chars().next();
        let word = |c: char| c.is_ascii_alphanumeric() || c == '_' || c == '-';
        !before.is_some_and(|c| word(c) && !name.starts_with('-')) && !after.is_some_and(word)
    })
}

/// The long flags of `nodelb-agent run`, as `--help` prints them.
fn run_flags() -> Vec<String> {
    let mut cmd = Cli::command();
    let help = cmd
        .find_subcommand_mut("run")
        .expect("a run subcommand")
        .render_long_help()
        .to_string();
    let run = Cli::command();
    let run = run.find_subcommand("run").unwrap();
    let flags: Vec<String> = run
        .get_arguments()
        .filter_map(|a| a.get_long())
        .filter(|l| *l != "help")
        .map(|l| format!("--{l}"))
        .collect();
    for f in &flags {
        assert!(mentions(&help, f), "{f} is not in `run --help`:\n{help}");
    }
    assert!(flags.len() >= 20, "{flags:?}");
    flags
}

#[test]
fn mentions_is_whole_token() {
    assert!(mentions("use `--ipv6=true`", "--ipv6"));
    assert!(mentions("--ipv6, --ipv4", "--ipv4"));
    assert!(!mentions("--ipv6-only", "--ipv6"));
    assert!(mentions("| `nodelb_syncs_total` |", "nodelb_syncs_total"));
    assert!(!mentions("nodelb_syncs_total", "nodelb_syncs"));
    assert!(!mentions("xnodelb_syncs", "nodelb_syncs"));
}

#[test]
fn readme_documents_every_run_flag() {
    let readme = readme();
    let missing: Vec<String> = run_flags()
        .into_iter()
        .filter(|f| !mentions(&readme, f))
        .collect();
    assert!(
        missing.is_empty(),
        "README.md does not document these `nodelb-agent run` flags: {}",
        missing.join(" ")
    );
}

#[test]
fn readme_documents_every_metric() {
    let readme = readme();
    let missing: Vec<String> = metric_names()
        .into_iter()
        .filter(|m| !mentions(&readme, m))
        .collect();
    assert!(
        missing.is_empty(),
        "README.md does not document these metrics: {}",
        missing.join(" ")
    );
}

/// The README's reserved-port table lists the default reservations, each with its protocol,
/// in the order of `DEFAULT_RESERVATIONS`, and nothing else but the agent's own ports.
#[test]
fn readme_tables_the_default_reserved_ports() {
    use nodelb_core::plan::reserved::{DEFAULT_OWN_PORTS, DEFAULT_RESERVATIONS};
    let text = readme();
    let section = text
        .split("## Reserved ports")
        .nth(1)
        .and_then(|s| s.split("\n## ").next())
        .expect("the README has a Reserved ports section");
    let rows: Vec<(String, String, String)> = section
        .lines()
        .filter(|l| l.starts_with("| ") && !l.starts_with("| ports"))
        .map(|l| {
            let cells: Vec<&str> = l.trim_matches('|').split('|').map(str::trim).collect();
            (
                cells[0].to_string(),
                cells[1].to_string(),
                cells[2].to_string(),
            )
        })
        .collect();
    let mut want: Vec<(String, String, String)> = DEFAULT_RESERVATIONS
        .iter()
        .map(|(ports, owner)| {
            let (ports, proto) = match ports.split_once('/') {
                Some((p, proto)) => (p.to_string(), proto.to_uppercase()),
                None => (ports.to_string(), "all".to_string()),
            };
            (ports, proto, owner.to_string())
        })
        .collect();
    let own: Vec<String> = DEFAULT_OWN_PORTS.iter().map(u16::to_string).collect();
    want.push((
        own.join(", "),
        "TCP".into(),
        "the agent's own health and metrics ports (those of `--health-addr` and `--metrics-addr`)"
            .into(),
    ));
    assert_eq!(rows, want);
}

// ---- references -----------------------------------------------------------------------------

/// The repository's top directories a path may start from.
const TOPS: [&str; 7] = [
    "agent/",
    "core/",
    "netfilter/",
    "integration/",
    "manifests/",
    "scripts/",
    "docs/",
];

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// Every text file of the repository, by its path from the top, with its text (build output
/// (target/, dist/) and git's own files left out, and files that are not UTF-8).
fn repository() -> Vec<(String, String)> {
    fn walk(dir: &std::path::Path, rel: &str, out: &mut Vec<(String, String)>) {
        let mut entries: Vec<_> = std::fs::read_dir(dir)
            .unwrap_or_else(|e| panic!("reading {}: {e}", dir.display()))
            .map(|e| e.unwrap())
            .collect();
        entries.sort_by_key(|e| e.file_name());
        for e in entries {
            let name = e.file_name().to_string_lossy().into_owned();
            let path = if rel.is_empty() {
                name.clone()
            } else {
                format!("{rel}/{name}")
            };
            let kind = e.file_type().unwrap();
            if kind.is_dir() {
                // Build output: cargo's, and scripts/release.sh's dist/.
                if name != "target" && name != ".git" && path != "dist" {
                    walk(&e.path(), &path, out);
                }
            } else if kind.is_file() {
                if let Ok(text) = std::fs::read_to_string(e.path()) {
                    out.push((path, text));
                }
            }
        }
    }
    let mut out = Vec::new();
    walk(&root(), "", &mut out);
    assert!(
        out.iter().any(|(p, _)| p == "README.md") && out.len() > 100,
        "the walk did not find the repository: {} files",
        out.len()
    );
    out
}

fn is_path_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '/' | '-')
}

/// Whether a reference may start after `before`: at the start, or after a space or an opening
/// quote, bracket or backtick (`<path-to-nodelb>/manifests` names no path of the repository).
fn starts_token(before: Option<char>) -> bool {
    before.is_none_or(|c| c.is_whitespace() || matches!(c, '`' | '(' | '[' | '"' | '\''))
}

/// The paths `text` names from the repository's top, trailing dots left off.
fn top_paths(text: &str) -> Vec<&str> {
    let mut out = Vec::new();
    for (i, _) in text.char_indices() {
        if !starts_token(text[..i].chars().next_back()) {
            continue;
        }
        let rest = &text[i..];
        if TOPS.iter().any(|t| rest.starts_with(t)) {
            let end = rest.find(|c| !is_path_char(c)).unwrap_or(rest.len());
            out.push(rest[..end].trim_end_matches('.'));
        }
    }
    out
}

/// The `*.md` files `text` names (relative or from the top; never an absolute path or a URL).
fn md_names(text: &str) -> Vec<&str> {
    let mut out = Vec::new();
    for (i, _) in text.match_indices(".md") {
        let end = i + 3;
        if text[end..]
            .chars()
            .next()
            .is_some_and(|c| c.is_ascii_alphanumeric() || c == '_')
        {
            continue;
        }
        let start = text[..i]
            .char_indices()
            .rev()
            .take_while(|(_, c)| is_path_char(*c))
            .last()
            .map_or(i, |(j, _)| j);
        let name = &text[start..end];
        if start < i && !name.starts_with('/') && starts_token(text[..start].chars().next_back()) {
            out.push(name);
        }
    }
    out
}

/// The lines of a Markdown text outside fenced code blocks.
fn prose(text: &str) -> impl Iterator<Item = &str> {
    let mut fenced = false;
    text.lines().filter(move |l| {
        if l.trim_start().starts_with("```") {
            fenced = !fenced;
            return false;
        }
        !fenced
    })
}

/// The targets of the Markdown links `[text](target)` outside code blocks.
fn link_targets(text: &str) -> Vec<&str> {
    let mut out = Vec::new();
    for line in prose(text) {
        for (i, _) in line.match_indices("](") {
            let rest = &line[i + 2..];
            if let Some(end) = rest.find(')') {
                out.push(&rest[..end]);
            }
        }
    }
    out
}

/// The anchors of a Markdown text's headings, as GitHub makes them.
fn anchors(text: &str) -> Vec<String> {
    prose(text)
        .filter(|l| l.starts_with('#'))
        .map(|l| {
            l.trim_start_matches('#')
                .trim()
                .to_lowercase()
                .chars()
                .filter_map(|c| match c {
                    ' ' => Some('-'),
                    c if c.is_alphanumeric() || c == '-' || c == '_' => Some(c),
                    _ => None,
                })
                .collect()
        })
        .collect()
}

/// `path` from the repository's top, with `.` and `..` resolved; `None` above the top.
fn normalize(path: &str) -> Option<String> {
    let mut parts: Vec<&str> = Vec::new();
    for p in path.split('/') {
        match p {
            "" | "." => {}
            ".." => {
                parts.pop()?;
            }
            p => parts.push(p),
        }
    }
    Some(parts.join("/"))
}

fn dir_of(file: &str) -> &str {
    file.rsplit_once('/').map_or("", |(d, _)| d)
}

#[test]
fn reference_readers_parse_what_the_documents_write() {
    assert_eq!(
        top_paths("see `core/src/plan/settled.rs`, and docs/sizing.md. Not <x>/manifests"),
        vec!["core/src/plan/settled.rs", "docs/sizing.md"]
    );
    assert_eq!(
        md_names("[docs/sizing.md](sizing.md#a) and README.md; not x.mdx or /tmp/a.md"),
        vec!["docs/sizing.md", "sizing.md", "README.md"]
    );
    assert_eq!(
        link_targets("[a](b.md#c) and [d](https://e)\n```\n[f](g)\n```"),
        vec!["b.md#c", "https://e"]
    );
    assert_eq!(
        anchors("# nodelb\n## Who serves, and the status\n### `nodelb-core`\n```\n# no\n```"),
        vec!["nodelb", "who-serves-and-the-status", "nodelb-core"]
    );
    assert_eq!(normalize("docs/../README.md").as_deref(), Some("README.md"));
    assert_eq!(normalize("../x"), None);
}

/// Every relative link of every Markdown file resolves to a file or directory of the
/// repository, and a link with an anchor to a heading of the Markdown file it names.
#[test]
fn every_link_in_the_documents_resolves() {
    let files = repository();
    let text_of = |path: &str| files.iter().find(|(p, _)| p == path).map(|(_, t)| t);
    let mut broken = Vec::new();
    for (doc, text) in files.iter().filter(|(p, _)| p.ends_with(".md")) {
        for target in link_targets(text) {
            if target.contains("://") || target.starts_with("mailto:") {
                continue;
            }
            let (path, anchor) = target.split_once('#').unwrap_or((target, ""));
            let resolved = if path.is_empty() {
                Some(doc.clone())
            } else {
                normalize(&format!("{}/{path}", dir_of(doc)))
            };
            let Some(resolved) = resolved.filter(|r| root().join(r).exists()) else {
                broken.push(format!("{doc}: ({target}): no such file"));
                continue;
            };
            if !anchor.is_empty() {
                let found =
                    text_of(&resolved).is_some_and(|t| anchors(t).iter().any(|a| a == anchor));
                if !found {
                    broken.push(format!(
                        "{doc}: ({target}): no heading #{anchor} in {resolved}"
                    ));
                }
            }
        }
    }
    assert!(broken.is_empty(), "broken links:\n{}", broken.join("\n"));
}

/// Every path a file of the repository names from the top exists; every `*.md` a Markdown
/// file names exists (from the top or beside it); every file a Markdown file names in
/// backticks is one of the repository's.
#[test]
fn every_file_the_repository_names_exists() {
    let files = repository();
    let mut missing = Vec::new();
    for (file, text) in &files {
        for path in top_paths(text) {
            if !root().join(path).exists() {
                missing.push(format!("{file}: {path}"));
            }
        }
    }
    for (doc, text) in files.iter().filter(|(p, _)| p.ends_with(".md")) {
        for name in md_names(text) {
            let beside = normalize(&format!("{}/{name}", dir_of(doc)));
            let found =
                root().join(name).exists() || beside.is_some_and(|b| root().join(b).exists());
            if !found {
                missing.push(format!("{doc}: {name}"));
            }
        }
        let prose: Vec<&str> = prose(text).collect();
        for quoted in prose.join("\n").split('`').skip(1).step_by(2) {
            let named = quoted.rsplit_once('.').is_some_and(|(stem, ext)| {
                !stem.is_empty()
                    && stem.chars().all(is_path_char)
                    && ["rs", "sh", "md", "yaml", "toml", "json", "nft"].contains(&ext)
            });
            // A link (the chart's files/) is not in `files`, and exists. The files of a
            // release (scripts/release.sh's directory) are named for the version.
            let release = quoted.starts_with(&format!("nodelb-{}", nodelb_agent::PACKAGE_VERSION));
            let known = release
                || files
                    .iter()
                    .any(|(p, _)| p == quoted || p.ends_with(&format!("/{quoted}")))
                || root().join(quoted).exists();
            if named && !known {
                missing.push(format!("{doc}: `{quoted}`"));
            }
        }
    }
    assert!(
        missing.is_empty(),
        "named but not in the repository:\n{}",
        missing.join("\n")
    );
}

/// The design is `docs/design.md`: no file names a design document elsewhere, or a directory
/// beside the repository. In `docs/` a link may name it relative to its directory.
#[test]
fn the_design_is_docs_design_md() {
    let design = ["design", "md"].join(".");
    let beside = ["..", "shared"].join("/");
    let mut wrong = Vec::new();
    for (file, text) in repository() {
        if text.contains(&beside) {
            wrong.push(format!("{file}: {beside}"));
        }
        let lower = text.to_ascii_lowercase();
        for (i, _) in lower.match_indices(&design) {
            let named = &text[i..i + design.len()];
            let before = &text[..i];
            let ok = named == design
                && (before.ends_with("docs/")
                    || (file.starts_with("docs/") && before.ends_with("](")));
            if !ok {
                let from = before.len().saturating_sub(20);
                let from = (0..=from)
                    .rev()
                    .find(|j| text.is_char_boundary(*j))
                    .unwrap_or(0);
                wrong.push(format!("{file}: ...{}", &text[from..i + design.len()]));
            }
        }
    }
    assert!(
        wrong.is_empty(),
        "design document named otherwise:\n{}",
        wrong.join("\n")
    );
}

/// One version everywhere: the agent crate's, the image tag every manifest, the README and
/// Dockerfile.agent name, the image's version label, the newest CHANGELOG.md entry, and what
/// `nodelb-agent --version` prints; and, given a release directory (`NODELB_RELEASE_DIR`: run
/// this test again with it after `scripts/release.sh`), every file in it.
#[test]
fn one_version_everywhere() {
    let version = nodelb_agent::PACKAGE_VERSION;
    let cargo = std::fs::read_to_string(root().join("agent/Cargo.toml")).unwrap();
    assert!(
        cargo.contains(&format!("\nversion = \"{version}\"\n")),
        "agent/Cargo.toml"
    );
    let mut tags = 0;
    for (path, text) in repository() {
        let named = path == "README.md"
            || path == "Dockerfile.agent"
            || (path.starts_with("manifests/") && path.ends_with(".yaml"));
        if !named {
            continue;
        }
        for (at, _) in text.match_indices("nodelb-agent:") {
            let tag: String = text[at + "nodelb-agent:".len()..]
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric() || ".-".contains(*c))
                .collect();
            assert_eq!(tag, version, "{path} names nodelb-agent:{tag}");
            tags += 1;
        }
    }
    assert!(tags >= 5, "the image tags were not found ({tags})");
    let chart = std::fs::read_to_string(root().join("charts/nodelb/Chart.yaml")).unwrap();
    for field in ["version", "appVersion"] {
        let value = chart
            .lines()
            .find_map(|l| l.strip_prefix(&format!("{field}: ")))
            .unwrap_or_else(|| panic!("charts/nodelb/Chart.yaml has no {field}"));
        assert_eq!(
            value.trim_matches('"'),
            version,
            "charts/nodelb/Chart.yaml {field} (the chart's image tag defaults to appVersion)"
        );
    }
    let dockerfile = std::fs::read_to_string(root().join("Dockerfile.agent")).unwrap();
    assert!(
        dockerfile.contains(&format!("org.opencontainers.image.version=\"{version}\"")),
        "Dockerfile.agent's version label"
    );
    let changelog = std::fs::read_to_string(root().join("CHANGELOG.md")).unwrap();
    let newest = changelog
        .lines()
        .find_map(|l| l.strip_prefix("## "))
        .expect("a CHANGELOG.md entry");
    assert!(
        newest.starts_with(&format!("{version} ")) || newest == version,
        "CHANGELOG.md's newest entry is {newest:?}"
    );
    let out = std::process::Command::new(nodelb_integration::e2e::agent_binary())
        .arg("--version")
        .output()
        .expect("running nodelb-agent --version");
    let printed = String::from_utf8_lossy(&out.stdout);
    assert_eq!(
        printed.trim(),
        format!("nodelb-agent {}", nodelb_agent::VERSION)
    );
    let commit = nodelb_agent::GIT_COMMIT;
    assert!(
        commit == "unknown"
            || (commit.len() == 12 && commit.chars().all(|c| c.is_ascii_hexdigit())),
        "the commit is a short hash or unknown: {commit}"
    );
    // The release: each file named for the version, and `scripts/release.sh --verify` finds
    // that version inside each (the binaries' --version, the image's tag and labels, the
    // packaged chart's version and appVersion, the rendered manifests' image, the SBOMs'
    // component) and checks the checksums.
    let Some(dir) = std::env::var_os("NODELB_RELEASE_DIR") else {
        println!("the release directory is not checked: NODELB_RELEASE_DIR is not set");
        return;
    };
    let mut files = 0;
    for entry in std::fs::read_dir(&dir).expect("NODELB_RELEASE_DIR is a directory") {
        let name = entry.unwrap().file_name().to_string_lossy().into_owned();
        assert!(
            name == "SHA256SUMS"
                || name.starts_with(&format!("nodelb-{version}."))
                || name.starts_with(&format!("nodelb-{version}-"))
                || name.starts_with(&format!("nodelb-agent-{version}."))
                || name.starts_with(&format!("nodelb-agent-{version}-")),
            "the release's {name} is not named for version {version}"
        );
        files += 1;
    }
    let out = std::process::Command::new("bash")
        .arg(root().join("scripts/release.sh"))
        .arg("--verify")
        .arg(&dir)
        .output()
        .expect("running scripts/release.sh --verify");
    assert!(
        out.status.success(),
        "scripts/release.sh --verify {}: {}",
        std::path::Path::new(&dir).display(),
        String::from_utf8_lossy(&out.stderr)
    );
    println!(
        "the release's {files} files carry version {version}: {}",
        String::from_utf8_lossy(&out.stderr).trim()
    );
}
