#!/usr/bin/env bash
# Builds `kwok` (simulated nodes for scripts/cluster.sh's `kwok up`), from the pinned
# sigs.k8s.io/kwok Go module in integration/kwok/ (a `tool` directive), into a cache outside
# the repository:
#   ${XDG_CACHE_HOME:-$HOME/.cache}/nodelb/kwok-<version>/kwok
#   ${XDG_CACHE_HOME:-$HOME/.cache}/nodelb/kwok-<version>/stages.yaml
# stages.yaml is the module's own stages, as kwok's releases ship them: node/fast (a new node
# turns Ready with the addresses it was created with), node/heartbeat-with-lease (its status is
# refreshed now and then; its Lease in kube-node-lease is renewed by kwok itself) and pod/fast
# (a pod bound to a fake node turns Running and Ready; a deleted one goes at once).
# The first build on a machine takes a few minutes; later runs find it there and return at
# once. Prints the binary's path on stdout.
set -euo pipefail
. "$(dirname "$0")/go-tool.sh"
stages=(node/fast/node-initialize.yaml node/heartbeat-with-lease/node-heartbeat-with-lease.yaml
  pod/fast/pod-ready.yaml pod/fast/pod-complete.yaml pod/fast/pod-delete.yaml)
built() {
  [ -x "$1/kwok" ] && [ -s "$1/stages.yaml" ] &&
    "$1/kwok" --version 2>/dev/null | grep -q "kwok version $2 "
}
extra() {
  local src s
  src="$(GOFLAGS=-mod=readonly go list -m -f '{{.Dir}}' sigs.k8s.io/kwok)"
  for s in "${stages[@]}"; do
    echo "---"
    cat "$src/kustomize/stage/$s"
  done >"$1/stages.yaml"
}
# What upstream's hack/releases.sh stamps, so `kwok --version` names the release.
go_tool kwok sigs.k8s.io/kwok sigs.k8s.io/kwok/cmd/kwok sigs.k8s.io/kwok/pkg/consts.Version
