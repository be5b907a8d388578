#!/usr/bin/env bash
# The release build of the agent: the one command both Dockerfile.agent and CI (.ci/run) run,
# so the image is built exactly as CI built it (same package, same features, --locked).
# Output: target/release/nodelb-agent. Takes no arguments on purpose.
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --release --locked -p nodelb-agent
