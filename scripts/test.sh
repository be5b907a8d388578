#!/usr/bin/env bash
# The whole test suite: unit, golden and differential tests, kernel tests in network
# namespaces with real traffic, end-to-end tests of the real agent binary against a real
# kube-apiserver with etcd, then the real-cluster tests: nodelb's image (with the release agent)
# installed with `kubectl apply -k` on scripts/cluster.sh's two nodes. Run as root; without root
# the namespace tests skip with a message, and with CI=true they fail instead.
#
# The real cluster is brought up by its tests and taken down at the end, unless it was already
# up when this started. Its image carries $NODELB_IMAGE_AGENT_BIN when set (CI builds the
# release agent in the background and names it here; this waits for it to appear), else
# target/release/nodelb-agent, built here (minutes the first time: docs/benchmarks.md).
set -euo pipefail
cd "$(dirname "$0")/.."
# Each phase's end, on stdout and (CI sets NODELB_CI_TIMES) in CI's log of its times.
mark() { echo "test: $* after $SECONDS s" | tee -a "${NODELB_CI_TIMES:-/dev/null}"; }
scripts/deps.sh
mark "dependencies ready"
# promtool, unpacked by deps.sh.
export PATH="${XDG_CACHE_HOME:-$HOME/.cache}/nodelb/promtool/usr/bin:$PATH"
# The Kubernetes components (minutes the first time on a machine) build beside the workspace:
# the end-to-end tests run them.
scripts/kubernetes.sh >/dev/null &
kubernetes=$!
cargo build --workspace --locked --all-targets
mark "workspace built"
wait "$kubernetes" || { echo "test: scripts/kubernetes.sh failed (its error is above)" >&2; exit 1; }
mark "Kubernetes components built"
# The end-to-end tests run this agent binary (built above with the workspace's features), so
# they do not rebuild it with the agent crate's own feature set.
export NODELB_AGENT_BIN="${NODELB_AGENT_BIN:-$PWD/target/debug/nodelb-agent}"
# --show-output: every end-to-end test's log names the kube-apiserver it ran against, and
# the figures tests print as `measured:` stay in the log. The real-cluster tests run last, on
# their own (below).
cargo test --workspace --locked -- --test-threads=2 --show-output --skip on_real_cluster::
mark "suite done but the real cluster"

if [ -n "${NODELB_IMAGE_AGENT_BIN:-}" ]; then
  waited=$SECONDS
  until [ -x "$NODELB_IMAGE_AGENT_BIN" ]; do
    [ ! -e "$NODELB_IMAGE_AGENT_BIN.failed" ] || {
      echo "test: the build of $NODELB_IMAGE_AGENT_BIN failed" >&2
      exit 1
    }
    [ $((SECONDS - waited)) -lt 3600 ] || {
      echo "test: $NODELB_IMAGE_AGENT_BIN did not appear within an hour" >&2
      exit 1
    }
    sleep 5
  done
  mark "waited $((SECONDS - waited)) s for $NODELB_IMAGE_AGENT_BIN"
else
  scripts/build-release.sh
  export NODELB_IMAGE_AGENT_BIN="$PWD/target/release/nodelb-agent"
fi
was_up=false
if scripts/cluster.sh status 2>/dev/null; then was_up=true; fi
status=0
cargo test --locked -p nodelb-integration --test cluster -- --show-output || status=$?
mark "real-cluster tests done (exit $status)"
if ! $was_up; then scripts/cluster.sh down; fi
exit "$status"
