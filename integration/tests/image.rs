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

/// The packages of a `RUN apt-get ... install ... && ...` line (options left out).
fn apt_packages(run: &str) -> Vec<&str> {
    run.split("apt-get install")
        .nth(1)
        .expect("an apt-get install")
        .split("&&")
        .next()
        .unwrap_or_default()
        .split_whitespace()
        .filter(|w| !w.starts_with('-'))
        .collect()
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
            .any(|c| c.trim_start().starts_with("scripts/build-release.sh")),
        "CI runs the release build"
    );
}

#[test]
fn dockerfile_runs_the_agent() {
    let docker = commands(&read("Dockerfile.agent"));
    let from: Vec<&String> = docker.iter().filter(|c| c.starts_with("FROM ")).collect();
    assert_eq!(from.len(), 2, "a builder and a runtime stage: {from:?}");
    // The builder runs on the builder's own platform and cross-compiles for the target's
    // (`docker buildx build --platform linux/amd64,linux/arm64`).
    assert!(
        from[0].starts_with("FROM --platform=$BUILDPLATFORM rust:1-bookworm "),
        "{}",
        from[0]
    );
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
    let packages = apt_packages(installs[0]);
    assert_eq!(packages, ["libnftnl11", "libmnl0"]);
}

// scripts/images.sh builds the test cluster's agent image without Docker: it reproduces the
// runtime stage of Dockerfile.agent, reading the stage's base, packages, COPY destination,
// ENTRYPOINT and CMD from the Dockerfile, so the image the tests run cannot drift from the one
// users build. `--runtime-stage` prints what it read (no root, nothing built).

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// `scripts/images.sh --runtime-stage`, on `dockerfile` (NODELB_DOCKERFILE) or the real one.
fn images_runtime_stage(dockerfile: Option<&std::path::Path>) -> std::process::Output {
    let mut cmd = std::process::Command::new("bash");
    cmd.arg(repo().join("scripts/images.sh"))
        .arg("--runtime-stage");
    match dockerfile {
        Some(p) => cmd.env("NODELB_DOCKERFILE", p),
        None => cmd.env_remove("NODELB_DOCKERFILE"),
    };
    cmd.output()
        .expect("running bash scripts/images.sh --runtime-stage")
}

fn stdout_lines(out: &std::process::Output) -> Vec<String> {
    assert!(
        out.status.success(),
        "scripts/images.sh --runtime-stage failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(str::to_string)
        .collect()
}

/// A Dockerfile of the test's own in a fresh temporary directory.
fn temp_dockerfile(name: &str, text: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("nodelb-image-{}-{name}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("Dockerfile.agent");
    std::fs::write(&path, text).unwrap();
    path
}

#[test]
fn images_sh_takes_the_runtime_stage_from_the_dockerfile() {
    let docker = commands(&read("Dockerfile.agent"));
    let start = docker.iter().rposition(|c| c.starts_with("FROM ")).unwrap();
    let runtime = &docker[start..];
    let line = |kw: &str| -> String {
        let found: Vec<&String> = runtime.iter().filter(|c| c.starts_with(kw)).collect();
        assert_eq!(found.len(), 1, "one {kw}in the runtime stage: {runtime:?}");
        found[0].clone()
    };
    let install = line("RUN ");
    let packages = apt_packages(&install);
    let copy = line("COPY ");
    let (entrypoint, cmd) = (line("ENTRYPOINT "), line("CMD "));
    // `LABEL k="v" k="v" ...`, each pair as `LABEL k=v`.
    let labels: Vec<String> = line("LABEL ")["LABEL ".len()..]
        .split_whitespace()
        .map(|pair| format!("LABEL {}", pair.replace('"', "")))
        .collect();
    assert!(
        labels.contains(&format!(
            "LABEL org.opencontainers.image.version={}",
            nodelb_agent::PACKAGE_VERSION
        )),
        "the image says which version it carries: {labels:?}"
    );
    let mut want = vec![
        runtime[0].clone(),
        format!("PACKAGES {}", packages.join(" ")),
        format!("COPY {}", copy.split_whitespace().last().unwrap()),
    ];
    want.extend(labels);
    want.extend([entrypoint.clone(), cmd.clone()]);
    assert_eq!(stdout_lines(&images_runtime_stage(None)), want);
    // ... and has no copy of them: the script names none of the packages, nor the JSON arrays.
    let script = read("scripts/images.sh");
    for own in packages
        .iter()
        .copied()
        .chain([&entrypoint["ENTRYPOINT ".len()..], &cmd["CMD ".len()..]])
    {
        assert!(!script.contains(own), "scripts/images.sh has its own {own}");
    }
    // The binary is stripped the same way.
    assert!(read("Dockerfile.agent").contains(" --strip-debug -o /nodelb-agent"));
    assert!(script.contains(" --strip-debug -o"));
}

#[test]
fn images_sh_follows_a_changed_dockerfile() {
    let path = temp_dockerfile(
        "changed",
        r#"# syntax=docker/dockerfile:1
FROM rust:1-bookworm AS build
RUN scripts/build-release.sh \
 && strip --strip-debug -o /nodelb-agent target/release/nodelb-agent
FROM debian:trixie-slim
# a comment inside the stage
RUN apt-get update \
 && apt-get install -y --no-install-recommends libnftnl11 \
    libmnl0 \
    # a comment inside the command, which Docker drops
    iproute2 \
 && rm -rf /var/lib/apt/lists/*
COPY --from=build /nodelb-agent /opt/nodelb/
ENTRYPOINT ["/opt/nodelb/nodelb-agent", "--log-format=json"]
CMD ["run", "--node-name=a"]
"#,
    );
    let out = images_runtime_stage(Some(&path));
    std::fs::remove_dir_all(path.parent().unwrap()).unwrap();
    assert_eq!(
        stdout_lines(&out),
        [
            "FROM debian:trixie-slim",
            "PACKAGES libnftnl11 libmnl0 iproute2",
            "COPY /opt/nodelb/nodelb-agent",
            r#"ENTRYPOINT ["/opt/nodelb/nodelb-agent", "--log-format=json"]"#,
            r#"CMD ["run", "--node-name=a"]"#,
        ]
    );
}

#[test]
fn images_sh_refuses_a_runtime_stage_it_would_not_reproduce() {
    let base = read("Dockerfile.agent");
    let cmd_line = base
        .lines()
        .find(|l| l.starts_with("CMD "))
        .expect("a CMD line")
        .to_string();
    let cases = [
        ("env", cmd_line.clone() + "\nENV RUST_LOG=debug", "ENV"),
        ("user", cmd_line.clone() + "\nUSER 65534", "USER"),
        (
            "run",
            cmd_line.clone() + "\nRUN useradd nodelb",
            "useradd nodelb",
        ),
        ("shell-form", "CMD run".to_string(), "exec (JSON) form"),
        ("not-slim", cmd_line.clone(), "FROM debian:bookworm;"),
    ];
    for (name, replacement, complaint) in cases {
        let mut text = base.replace(&cmd_line, &replacement);
        if name == "not-slim" {
            text = text.replace("FROM debian:bookworm-slim", "FROM debian:bookworm");
        }
        assert_ne!(text, base, "{name}: the case changes the Dockerfile");
        let path = temp_dockerfile(name, &text);
        let out = images_runtime_stage(Some(&path));
        std::fs::remove_dir_all(path.parent().unwrap()).unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(
            !out.status.success() && stderr.contains(complaint),
            "{name}: expected a failure naming {complaint:?}; status {}, stdout {}, stderr {stderr}",
            out.status,
            String::from_utf8_lossy(&out.stdout)
        );
    }
}
