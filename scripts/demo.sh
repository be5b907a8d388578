#!/usr/bin/env bash
# The demo: the real nodelb-agent binary programs a node namespace against the in-repo API
# double; a client's requests go through the node to two backends; shows the Service's status,
# its Events and `nft list table ip nodelb`. Run as root.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/deps.sh
cargo build --locked --release -p nodelb-agent
cargo run --locked --release -p nodelb-integration --example demo
