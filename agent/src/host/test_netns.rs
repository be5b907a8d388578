//! What the host modules' kernel tests share: they run as root, each in a network namespace
//! of its own (unshared on its thread), and set it up with `ip`.

use std::process::Command;

/// Whether the test can run: as root. Without root it is skipped with a message, or fails
/// under `CI=true`.
pub fn root_or_skip(test: &str) -> bool {
    if nix::unistd::geteuid().is_root() {
        return true;
    }
    if std::env::var("CI").as_deref() == Ok("true") {
        panic!("{test}: needs root for a network namespace; CI=true makes this a failure");
    }
    eprintln!("SKIP {test}: needs root");
    false
}

/// `ip <args>` in the calling thread's namespace, panicking with its stderr on failure.
pub fn ip(args: &str) {
    let out = Command::new("ip")
        .args(args.split_whitespace())
        .output()
        .expect("run ip");
    assert!(
        out.status.success(),
        "ip {args}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}
