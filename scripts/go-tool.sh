# Sourced by scripts/helm.sh and scripts/kwok.sh: build one Go tool, pinned by a module of its
# own in integration/<name>/ (a `tool` directive), into a cache outside the repository, once:
#   ${XDG_CACHE_HOME:-$HOME/.cache}/nodelb/<name>-<version>/<name>
# and print the binary's path on stdout. The caller defines, before `go_tool`:
#   built DIR VERSION   exit 0 when DIR holds the tool at VERSION (and anything else it needs)
#   extra DIR           optional: run in the module's directory after the build, to add files
#                       to DIR (the build's temporary directory)
# go_tool NAME MODULE PACKAGE VERSION_VAR: NAME's module path in its go.mod (MODULE), the
# package of its command (or several, separated by spaces: a binary each, as MetalLB's
# controller and speaker), and the variable the upstream release stamps the version into.
go_tool() {
  local name="$1" module_path="$2" package="$3" version_var="$4"
  local module version dir start f
  module="$(cd "$(dirname "${BASH_SOURCE[0]}")/../integration/$name" && pwd)"
  version="$(awk -v m="$module_path" '$1 == m {print $2; exit}' "$module/go.mod")"
  [ -n "$version" ] || { echo "$name: no $module_path version in $module/go.mod" >&2; exit 1; }
  dir="${XDG_CACHE_HOME:-$HOME/.cache}/nodelb/$name-$version"
  if built "$dir" "$version"; then
    echo "$dir/$name"
    return 0
  fi
  command -v go >/dev/null || { echo "$name: go not found; install Go >= 1.26" >&2; exit 1; }
  mkdir -p "$dir"
  # One builder at a time (CI builds in the background while a test may ask too).
  exec 9>"$dir/.lock"
  flock 9
  if built "$dir" "$version"; then
    echo "$dir/$name"
    return 0
  fi
  echo "$name: building $name $version into $dir" >&2
  start=$(date +%s)
  # Global: the trap runs after this function has returned.
  go_tool_tmp="$(mktemp -d "$dir/.build.XXXXXX")"
  trap 'rm -rf "$go_tool_tmp"' EXIT
  (
    cd "$module"
    GOFLAGS=-mod=readonly CGO_ENABLED=0 go build -trimpath \
      -ldflags "-s -w -X $version_var=$version" -o "$go_tool_tmp/" $package
    if declare -F extra >/dev/null; then extra "$go_tool_tmp"; fi
  )
  for f in "$go_tool_tmp"/*; do mv "$f" "$dir/"; done
  echo "$name: built $name $version in $(($(date +%s) - start)) s" >&2
  echo "$dir/$name"
}
