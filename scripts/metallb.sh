#!/usr/bin/env bash
# Builds MetalLB's controller and speaker, the peer nodelb is compared with on the test cluster
# (scripts/cluster.sh peers up, scripts/peers.sh), from the pinned go.universe.tf/metallb Go
# module in integration/metallb/ (`tool` directives; a module of its own: with Kubernetes' or
# kwok's, version selection breaks its cert-controller), into a cache outside the repository:
#   ${XDG_CACHE_HOME:-$HOME/.cache}/nodelb/metallb-<version>/controller
#   ${XDG_CACHE_HOME:-$HOME/.cache}/nodelb/metallb-<version>/speaker
#   ${XDG_CACHE_HOME:-$HOME/.cache}/nodelb/metallb-<version>/metallb-native.yaml
#   ${XDG_CACHE_HOME:-$HOME/.cache}/nodelb/metallb-<version>/version
# metallb-native.yaml is the module's own config/manifests/metallb-native.yaml (L2 mode, no
# FRR), as MetalLB's releases publish it. The first build on a machine takes minutes (219 s on
# 2 cores beside a release build); later runs find it there and return at once. Prints the
# directory on stdout.
set -euo pipefail
. "$(dirname "$0")/go-tool.sh"
built() {
  [ -x "$1/controller" ] && [ -x "$1/speaker" ] && [ -s "$1/metallb-native.yaml" ] &&
    [ "$(cat "$1/version" 2>/dev/null)" = "$2" ]
}
extra() {
  local src
  src="$(GOFLAGS=-mod=readonly go list -m -f '{{.Dir}}' go.universe.tf/metallb)"
  cp "$src/config/manifests/metallb-native.yaml" "$1/metallb-native.yaml"
  echo "$version" >"$1/version"
}
# MetalLB's Dockerfiles stamp only the git commit and branch; its version is in the source
# (v0.15.2's says 0.15.2), which this stamp restates, with the module's leading v.
bin="$(go_tool metallb go.universe.tf/metallb \
  "go.universe.tf/metallb/controller go.universe.tf/metallb/speaker" \
  go.universe.tf/metallb/internal/version.version)"
dirname "$bin"
