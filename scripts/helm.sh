#!/usr/bin/env bash
# Builds the `helm` the chart's tests use, from the pinned helm.sh/helm/v3 Go module in
# integration/helm/ (a `tool` directive), into a cache outside the repository:
#   ${XDG_CACHE_HOME:-$HOME/.cache}/nodelb/helm-<version>/helm
# The first build on a machine takes a few minutes; later runs find it there and return at
# once. Prints the binary's path on stdout.
set -euo pipefail
module="$(cd "$(dirname "$0")/../integration/helm" && pwd)"
version="$(awk '$1 == "helm.sh/helm/v3" {print $2; exit}' "$module/go.mod")"
[ -n "$version" ] || { echo "helm: no helm.sh/helm/v3 version in $module/go.mod" >&2; exit 1; }
dir="${XDG_CACHE_HOME:-$HOME/.cache}/nodelb/helm-$version"
built() { [ -x "$dir/helm" ] && "$dir/helm" version --template '{{.Version}}' 2>/dev/null | grep -qx "$version"; }
if built; then
  echo "$dir/helm"
  exit 0
fi
command -v go >/dev/null || { echo "helm: go not found; install Go >= 1.26" >&2; exit 1; }
mkdir -p "$dir"
exec 9>"$dir/.lock"
flock 9
if built; then
  echo "$dir/helm"
  exit 0
fi
echo "helm: building helm $version into $dir" >&2
start=$(date +%s)
tmp="$(mktemp -d "$dir/.build.XXXXXX")"
trap 'rm -rf "$tmp"' EXIT
(
  cd "$module"
  # What upstream's Makefile stamps, so `helm version` names the release.
  GOFLAGS=-mod=readonly CGO_ENABLED=0 go build -trimpath \
    -ldflags "-s -w -X helm.sh/helm/v3/internal/version.version=$version" \
    -o "$tmp/" helm.sh/helm/v3/cmd/helm
)
mv "$tmp/helm" "$dir/helm"
echo "helm: built $("$dir/helm" version --short) in $(($(date +%s) - start)) s" >&2
echo "$dir/helm"
