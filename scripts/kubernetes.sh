#!/usr/bin/env bash
# Builds the Kubernetes components nodelb's tests run against, all from the pinned
# k8s.io/kubernetes Go module in integration/kubernetes/, in one `go build`, into a cache outside
# the repository:
#   ${XDG_CACHE_HOME:-$HOME/.cache}/nodelb/kubernetes-<version>/
#     kube-apiserver, kubectl            the end-to-end tests, the benchmarks
#     kube-controller-manager, kube-scheduler, kubelet, kube-proxy
#                                        the real cluster of scripts/cluster.sh
# The first build on a machine takes several minutes (module download and compile; see
# docs/benchmarks.md); later runs find the binaries there and return at once. Prints the
# directory on stdout. Needs Go >= 1.26 (k8s.io/kubernetes 1.36 says `go 1.26.0`); if the machine's Go is
# older, run with GOTOOLCHAIN=go1.27.3, which the go command fetches through the module proxy.
set -euo pipefail
module="$(cd "$(dirname "$0")/../integration/kubernetes" && pwd)"
version="$(awk '$1 == "k8s.io/kubernetes" && $2 ~ /^v1\./ {print $2; exit}' "$module/go.mod")"
[ -n "$version" ] || { echo "kubernetes: no k8s.io/kubernetes version in $module/go.mod" >&2; exit 1; }
dir="${NODELB_KUBERNETES_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/nodelb/kubernetes-$version}"
binaries=(kube-apiserver kube-controller-manager kube-scheduler kubelet kube-proxy kubectl)
built() {
  local b
  for b in "${binaries[@]}"; do [ -x "$dir/$b" ] || return 1; done
  "$dir/kube-apiserver" --version 2>/dev/null | grep -qx "Kubernetes $version"
}
if built; then
  echo "$dir"
  exit 0
fi
command -v go >/dev/null || {
  echo "kubernetes: go not found; install Go >= 1.26 (the tests build the real Kubernetes components with it)" >&2
  exit 1
}
minor="${version#v1.}"
minor="${minor%%.*}"
# What upstream's build stamps (hack/lib/version.sh): without it the components report
# v0.0.0-master, the agent would take the server for one older than 1.30, and the kubelet's
# version skew against the server would look absurd.
ldflags="-s -w"
for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
  ldflags+=" -X $pkg.gitVersion=$version -X $pkg.gitMajor=1 -X $pkg.gitMinor=$minor -X $pkg.gitTreeState=clean"
done
echo "kubernetes: building ${binaries[*]} $version into $dir (first build on this machine: several minutes)" >&2
start=$(date +%s)
mkdir -p "$dir"
# One builder at a time (CI starts this in the background while the demo or a test may ask too).
exec 9>"$dir/.lock"
flock 9
if built; then
  echo "$dir"
  exit 0
fi
tmp="$(mktemp -d "$dir/.build.XXXXXX")"
trap 'rm -rf "$tmp"' EXIT
(
  cd "$module"
  export GOFLAGS=-mod=readonly CGO_ENABLED=0
  go build -trimpath -ldflags "$ldflags" -o "$tmp/" "${binaries[@]/#/k8s.io/kubernetes/cmd/}"
)
for b in "${binaries[@]}"; do mv "$tmp/$b" "$dir/"; done
echo "kubernetes: built $("$dir/kube-apiserver" --version) in $(($(date +%s) - start)) s" >&2
echo "$dir"
