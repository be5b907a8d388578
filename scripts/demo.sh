#!/usr/bin/env bash
# The demo: the real nodelb-agent binary programs a node namespace against a real kube-apiserver
# (etcd and the pinned release, started in a control-plane namespace, with manifests/ installed);
# a client's requests go through the node to two backends; shows the Service, its Events and
# `nft list table ip nodelb`. Run as root. scripts/deps.sh installs etcd and builds the pinned
# kube-apiserver and kubectl (minutes the first time on a machine, then cached).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/deps.sh
cargo build --locked --release -p nodelb-agent
cargo run --locked --release -p nodelb-integration --example demo
