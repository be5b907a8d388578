#!/usr/bin/env bash
# Builds the real kube-apiserver (and the kubectl of the same release) that the end-to-end tests,
# the latency benchmark and the demo run against, from the pinned k8s.io/kubernetes Go module in
# integration/kube-apiserver/, into a cache outside the repository:
#   ${XDG_CACHE_HOME:-$HOME/.cache}/nodelb/kube-apiserver-<version>/{kube-apiserver,kubectl}
# The first build on a machine takes a few minutes (module download and compile); later runs find
# both binaries there and return at once. Prints the directory on stdout.
# Needs Go >= 1.26 (k8s.io/kubernetes 1.36 says `go 1.26.0`); if the machine's Go is older, run
# with GOTOOLCHAIN=go1.27.3, which the go command fetches through the module proxy.
set -euo pipefail
module="$(cd "$(dirname "$0")/../integration/kube-apiserver" && pwd)"
version="$(awk '$1 == "k8s.io/kubernetes" && $2 ~ /^v1\./ {print $2; exit}' "$module/go.mod")"
[ -n "$version" ] || { echo "kube-apiserver: no k8s.io/kubernetes version in $module/go.mod" >&2; exit 1; }
dir="${NODELB_KUBE_APISERVER_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/nodelb/kube-apiserver-$version}"
if [ -x "$dir/kube-apiserver" ] && [ -x "$dir/kubectl" ] &&
  "$dir/kube-apiserver" --version 2>/dev/null | grep -qx "Kubernetes $version"; then
  echo "$dir"
  exit 0
fi
command -v go >/dev/null || {
  echo "kube-apiserver: go not found; install Go >= 1.26 (the tests build the real kube-apiserver with it)" >&2
  exit 1
}
minor="${version#v1.}"
minor="${minor%%.*}"
# What upstream's build stamps (hack/lib/version.sh): without it the server reports
# v0.0.0-master, and the agent would take it for a server older than 1.30.
ldflags="-s -w"
for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
  ldflags+=" -X $pkg.gitVersion=$version -X $pkg.gitMajor=1 -X $pkg.gitMinor=$minor -X $pkg.gitTreeState=clean"
done
echo "kube-apiserver: building $version into $dir (first build on this machine: a few minutes)" >&2
start=$(date +%s)
mkdir -p "$dir"
tmp="$(mktemp -d "$dir/.build.XXXXXX")"
trap 'rm -rf "$tmp"' EXIT
(
  cd "$module"
  export GOFLAGS=-mod=readonly CGO_ENABLED=0
  go build -trimpath -ldflags "$ldflags" -o "$tmp/kube-apiserver" .
  go build -trimpath -ldflags "$ldflags" -o "$tmp/kubectl" k8s.io/kubernetes/cmd/kubectl
)
mv "$tmp/kube-apiserver" "$tmp/kubectl" "$dir/"
echo "kube-apiserver: built $("$dir/kube-apiserver" --version) in $(($(date +%s) - start)) s" >&2
echo "$dir"
