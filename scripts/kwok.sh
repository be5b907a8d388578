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
module="$(cd "$(dirname "$0")/../integration/kwok" && pwd)"
version="$(awk '$1 == "sigs.k8s.io/kwok" {print $2; exit}' "$module/go.mod")"
[ -n "$version" ] || { echo "kwok: no sigs.k8s.io/kwok version in $module/go.mod" >&2; exit 1; }
dir="${XDG_CACHE_HOME:-$HOME/.cache}/nodelb/kwok-$version"
stages=(node/fast/node-initialize.yaml node/heartbeat-with-lease/node-heartbeat-with-lease.yaml
  pod/fast/pod-ready.yaml pod/fast/pod-complete.yaml pod/fast/pod-delete.yaml)
built() {
  [ -x "$dir/kwok" ] && [ -s "$dir/stages.yaml" ] &&
    "$dir/kwok" --version 2>/dev/null | grep -q "kwok version $version "
}
if built; then
  echo "$dir/kwok"
  exit 0
fi
command -v go >/dev/null || { echo "kwok: go not found; install Go >= 1.26" >&2; exit 1; }
mkdir -p "$dir"
exec 9>"$dir/.lock"
flock 9
if built; then
  echo "$dir/kwok"
  exit 0
fi
echo "kwok: building kwok $version into $dir" >&2
start=$(date +%s)
tmp="$(mktemp -d "$dir/.build.XXXXXX")"
trap 'rm -rf "$tmp"' EXIT
(
  cd "$module"
  # What upstream's hack/releases.sh stamps, so `kwok --version` names the release.
  GOFLAGS=-mod=readonly CGO_ENABLED=0 go build -trimpath \
    -ldflags "-s -w -X sigs.k8s.io/kwok/pkg/consts.Version=$version" \
    -o "$tmp/" sigs.k8s.io/kwok/cmd/kwok
  src="$(GOFLAGS=-mod=readonly go list -m -f '{{.Dir}}' sigs.k8s.io/kwok)"
  for s in "${stages[@]}"; do
    echo "---"
    cat "$src/kustomize/stage/$s"
  done >"$tmp/stages.yaml"
)
mv "$tmp/stages.yaml" "$dir/stages.yaml"
mv "$tmp/kwok" "$dir/kwok"
echo "kwok: built $("$dir/kwok" --version) in $(($(date +%s) - start)) s" >&2
echo "$dir/kwok"