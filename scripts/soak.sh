#!/usr/bin/env bash
# scripts/soak.sh [--duration D] [--slot S]: nodelb under faults on the real cluster, as root.
#
# Brings up scripts/cluster.sh's two-node cluster when it is not running, installs nodelb from
# its image, and runs integration/benches/cluster_soak.rs for D (seconds, or with a unit: 90s,
# 10m, 2h; default 10m): TCP and UDP clients through both nodes while it kills an agent,
# restarts a kubelet, containerd, kube-apiserver and etcd, takes a node's link down, flushes a
# node's whole ruleset, fills a node's conntrack table and rolls the backends, in turn, S apart
# (default 60 s, at least 40 s; the same units). It prints, for each fault, the connections
# that failed (over 0.9 s counts as failed) and the time to full recovery, and each agent's
# RSS and descriptor growth per hour; it fails when a fault is not recovered from within 180 s.
#
# The agent image carries NODELB_IMAGE_AGENT_BIN (default target/release/nodelb-agent, built
# when missing). The cluster is left running (scripts/cluster.sh down removes it).
set -euo pipefail
cd "$(dirname "$0")/.."
usage() { sed -n '2,15p' "$0" >&2; exit 2; }
duration=10m
slot=60s
while [ $# -gt 0 ]; do
  case "$1" in
    --duration) duration="${2:?--duration needs a value}"; shift 2 ;;
    --duration=*) duration="${1#--duration=}"; shift ;;
    --slot) slot="${2:?--slot needs a value}"; shift 2 ;;
    --slot=*) slot="${1#--slot=}"; shift ;;
    -h | --help) usage ;;
    *) echo "soak: unknown argument $1" >&2; usage ;;
  esac
done
# seconds_of D: D (90s, 10m, 2h or plain seconds) in seconds, or nothing when it is no duration.
seconds_of() {
  local n=$1 unit=1
  case "$1" in
    *h) n=${1%h} unit=3600 ;;
    *m) n=${1%m} unit=60 ;;
    *s) n=${1%s} ;;
  esac
  [[ "$n" =~ ^[0-9]+$ ]] || return 0
  echo $((n * unit))
}
seconds="$(seconds_of "$duration")"
[ -n "$seconds" ] && [ "$seconds" -ge 60 ] ||
  { echo "soak: --duration $duration is not 60 s or more" >&2; exit 2; }
# The bench says when a slot is too short.
slot_seconds="$(seconds_of "$slot")"
[ -n "$slot_seconds" ] || { echo "soak: --slot $slot is not a duration" >&2; exit 2; }
[ "$(id -u)" -eq 0 ] || { echo "soak: run it as root (it starts a cluster of network namespaces)" >&2; exit 2; }
began=$SECONDS
NODELB_SOAK_SECONDS="$seconds" NODELB_SOAK_SLOT_SECONDS="$slot_seconds" cargo bench --locked -p nodelb-integration --bench cluster_soak
echo "soak: $((SECONDS - began)) s in all"
