#!/usr/bin/env bash
# scripts/peers.sh [--short] [--services N[,N...]] [--rounds R] [--seconds S]: nodelb side by
# side with kube-proxy (nftables and iptables NodePorts) and MetalLB (L2) on the real cluster,
# as root, one table per Service count (docs/benchmarks.md, "Against the alternatives").
#
# Brings up scripts/cluster.sh's two-node cluster when it is not running, installs nodelb from
# its image and MetalLB from its own manifests (`scripts/cluster.sh peers up`), and runs
# integration/benches/peers.rs at each Service count (default 10,10000): the same backend pods
# reached directly, through nodelb, through kube-proxy's NodePort in both its modes and through
# MetalLB's VIP, in R interleaved rounds (default 5) of S seconds a measurement (default 3):
# TCP throughput (iperf3), connect-read-close rate with p50/p99, UDP request-reply rate with
# p50/p99; a new Service to its first answer, an endpoint change to the new pods' first
# answer, failed connections during a rolling update. It prints each row's medians, spread
# and ratios, and PASS/MISS against issue 40's goals; it asserts no timing.
#   --short   10 Services, 3 rounds of 2 s, data path and control plane only: what CI runs
#             (157 s once built)
# The full form also cuts a node's network (the node failure: new connections and the status,
# NODELB_PEERS_FAILURE=1) and measures the cost per node (NODELB_PEERS_COST_SECONDS=60 a phase,
# idle and under EndpointSlice churn), both at the last Service count.
# The agent image carries NODELB_IMAGE_AGENT_BIN (default target/release/nodelb-agent, built
# when missing). The cluster and MetalLB are left running (scripts/cluster.sh peers down, or
# scripts/cluster.sh down).
set -euo pipefail
cd "$(dirname "$0")/.."
usage() { sed -n '2,23p' "$0" >&2; exit 2; }
services=10,10000 rounds=5 seconds=3 full=1
while [ $# -gt 0 ]; do
  case "$1" in
    --short) services=10 rounds=3 seconds=2 full=0; shift ;;
    --services) services="${2:?--services needs a value}"; shift 2 ;;
    --rounds) rounds="${2:?--rounds needs a value}"; shift 2 ;;
    --seconds) seconds="${2:?--seconds needs a value}"; shift 2 ;;
    -h | --help) usage ;;
    *) echo "peers: unknown argument $1" >&2; usage ;;
  esac
done
[ "$(id -u)" -eq 0 ] || { echo "peers: run it as root (it starts a cluster of network namespaces)" >&2; exit 2; }
scripts/packages.sh iperf3
began=$SECONDS
counts=(${services//,/ })
for n in "${counts[@]}"; do
  failure=0 cost=0
  if [ "$full" -eq 1 ] && [ "$n" = "${counts[-1]}" ]; then failure=1 cost=60; fi
  NODELB_PEERS_SERVICES="$n" NODELB_PEERS_ROUNDS="$rounds" NODELB_PEERS_SECONDS="$seconds" \
    NODELB_PEERS_FAILURE="$failure" NODELB_PEERS_COST_SECONDS="$cost" \
    cargo bench --locked -p nodelb-integration --bench peers
done
echo "peers: $((SECONDS - began)) s in all"
