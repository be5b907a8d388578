#!/usr/bin/env bash
# The demo: programs a node namespace through nodelb's netlink batch and sends real client
# requests through it to backend namespaces, then shows the table. Run as root.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/deps.sh
cargo run --locked --release -p nodelb-integration --example demo
