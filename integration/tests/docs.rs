//! README.md keeps up with the agent: every flag of `nodelb-agent run --help` and every metric
//! the agent exports is named in it. The names come from the agent itself (clap's description
//! of `run`, the rendered metrics registry), so a new flag or metric fails here until it is
//! documented.

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
