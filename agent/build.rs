//! Link the agent with packed relative relocations (`DT_RELR`, glibc 2.36 and binutils 2.38 or
//! later, as in Debian bookworm): the dynamic loader otherwise reads a table of relocations
//! at every start (its size: docs/benchmarks.md), and those pages stay resident for the
//! process's life.
//!
//! Name the git commit the agent is built from (`NODELB_GIT_COMMIT` for `--version` and
//! `nodelb_build_info`): `$NODELB_GIT_COMMIT` when the build sets it (an image build, whose
//! context has no `.git`), else the checkout's `HEAD`, else `unknown`.

use std::process::Command;

fn main() {
    let os = std::env::var("CARGO_CFG_TARGET_OS").unwrap_or_default();
    let env = std::env::var("CARGO_CFG_TARGET_ENV").unwrap_or_default();
    if os == "linux" && env == "gnu" {
        println!("cargo:rustc-link-arg-bins=-Wl,-z,pack-relative-relocs");
    }
    println!("cargo:rerun-if-changed=build.rs");
    println!("cargo:rerun-if-env-changed=NODELB_GIT_COMMIT");
    let commit = std::env::var("NODELB_GIT_COMMIT")
        .ok()
        .filter(|c| !c.trim().is_empty())
        .or_else(|| {
            // A new commit moves the branch's ref (or packed-refs), not HEAD.
            if let Some(dir) = git(&["rev-parse", "--absolute-git-dir"]) {
                for f in ["HEAD", "refs", "packed-refs"] {
                    println!("cargo:rerun-if-changed={dir}/{f}");
                }
            }
            git(&["rev-parse", "--short=12", "HEAD"])
        })
        .unwrap_or_else(|| "unknown".to_string());
    println!("cargo:rustc-env=NODELB_GIT_COMMIT={}", commit.trim());
}

/// `git args` in the crate's directory: its output, trimmed, when it succeeds.
fn git(args: &[&str]) -> Option<String> {
    let out = Command::new("git").args(args).output().ok()?;
    let text = String::from_utf8(out.stdout).ok()?;
    let text = text.trim();
    (out.status.success() && !text.is_empty()).then(|| text.to_string())
}
