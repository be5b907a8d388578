#!/usr/bin/env bash
# The whole test suite: unit, golden and differential tests, kernel tests in network
# namespaces with real traffic, end-to-end tests of the real agent binary against a real
# kube-apiserver with etcd (built once per machine by scripts/deps.sh). Run as root; without
# root the namespace tests skip with a message, and with CI=true they fail instead.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/deps.sh
# promtool, unpacked by deps.sh.
export PATH="${XDG_CACHE_HOME:-$HOME/.cache}/nodelb/promtool/usr/bin:$PATH"
cargo build --workspace --locked --all-targets
# The end-to-end tests run this agent binary (built above with the workspace's features), so
# they do not rebuild it with the agent crate's own feature set.
export NODELB_AGENT_BIN="${NODELB_AGENT_BIN:-$PWD/target/debug/nodelb-agent}"
# --show-output: every end-to-end test's log names the kube-apiserver it ran against, and
# the figures tests print as `measured:` stay in the CI log.
cargo test --workspace --locked -- --test-threads=2 --show-output
