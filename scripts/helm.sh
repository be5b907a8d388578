#!/usr/bin/env bash
# Builds the `helm` the chart's tests use, from the pinned helm.sh/helm/v3 Go module in
# integration/helm/ (a `tool` directive), into a cache outside the repository:
#   ${XDG_CACHE_HOME:-$HOME/.cache}/nodelb/helm-<version>/helm
# The first build on a machine takes a few minutes; later runs find it there and return at
# once. Prints the binary's path on stdout.
set -euo pipefail
. "$(dirname "$0")/go-tool.sh"
built() { [ -x "$1/helm" ] && "$1/helm" version --template '{{.Version}}' 2>/dev/null | grep -qx "$2"; }
# What upstream's Makefile stamps, so `helm version` names the release.
go_tool helm helm.sh/helm/v3 helm.sh/helm/v3/cmd/helm helm.sh/helm/v3/internal/version.version
