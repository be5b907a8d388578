//! `Dockerfile.agent` builds the agent the way CI does: both run `scripts/build-release.sh`,
//! and nothing else in the image compiles, so the image cannot drift from what CI built and
//! tested (same package, same features, `--locked`). Docker itself is not run here.

use std::path::PathBuf;

fn read(path: &str) -> String {
    let p = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("..")
        .join(path);
    std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("reading {}: {e}", p.display()))
}

/// Lines that run something: comments and blank lines out, `\` continuations joined.
fn commands(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut cur = String::new();
    for line in text.lines() {
        let t = line.trim();
        if t.is_empty() || t.starts_with('#') {
            continue;
        }
        match t.strip_suffix('\\') {
            Some(head) => {
                cur.push_str(head);
                cur.push(' ');
            }
            None => {
                cur.push_str(t);
                out.push(std::mem::take(&mut cur));
            }
        }
    }
    out
}

#[test]
fn the_release_build_is_one_locked_cargo_command() {
    let builds: Vec<String> = commands(&read("scripts/build-release.sh"))
        .into_iter()
        .filter(|c| c.contains("cargo"))
        .collect();
    assert_eq!(
        builds,
        vec!["cargo build --release --locked -p nodelb-agent".to_string()]
    );
}

#[test]
fn dockerfile_and_ci_run_the_same_release_build() {
    let docker = commands(&read("Dockerfile.agent"));
    let runs: Vec<&String> = docker.iter().filter(|c| c.starts_with("RUN ")).collect();
    assert!(
        runs.iter().any(|c| c.contains("scripts/build-release.sh")),
        "the image builds with scripts/build-release.sh: {runs:?}"
    );
    assert!(
        !docker.iter().any(|c| c.contains("cargo ")),
        "no cargo command of the Dockerfile's own: {docker:?}"
    );
    assert!(
        commands(&read(".ci/run"))
            .iter()
            .any(|c| c == "scripts/build-release.sh"),
        "CI runs the release build"
    );
}

#[test]
fn dockerfile_runs_the_agent() {
    let docker = commands(&read("Dockerfile.agent"));
    let from: Vec<&String> = docker.iter().filter(|c| c.starts_with("FROM ")).collect();
    assert_eq!(from.len(), 2, "a builder and a runtime stage: {from:?}");
    assert!(from[0].starts_with("FROM rust:1-bookworm "));
    assert_eq!(from[1], "FROM debian:bookworm-slim");
    assert!(docker.contains(&r#"ENTRYPOINT ["nodelb-agent"]"#.to_string()));
    assert!(docker.contains(&r#"CMD ["run"]"#.to_string()));
    // The runtime stage installs the two libraries the binary links beyond libc, and nothing
    // else.
    let runtime = docker
        .iter()
        .skip_while(|c| !c.starts_with("FROM debian"))
        .collect::<Vec<_>>();
    let installs: Vec<&&String> = runtime
        .iter()
        .filter(|c| c.contains("apt-get install"))
        .collect();
    assert_eq!(installs.len(), 1);
    let packages: Vec<&str> = installs[0]
        .split("apt-get install")
        .nth(1)
        .unwrap()
        .split("&&")
        .next()
        .unwrap()
        .split_whitespace()
        .filter(|w| !w.starts_with('-'))
        .collect();
    assert_eq!(packages, ["libnftnl11", "libmnl0"]);
}
