#!/usr/bin/env bash
# Builds the three container images the test cluster of scripts/cluster.sh runs, as OCI image
# archives that `ctr -n k8s.io images import <archive>` takes (it names each image from the
# index's io.containerd.image.name annotation), without a registry or a Docker engine, into a
# cache outside the repository:
#   ${XDG_CACHE_HOME:-$HOME/.cache}/nodelb/images/
#     pause-<tag>.tar       nodelb.test/pause:<tag>, the CRI sandbox image: build/pause/linux/
#                           pause.c of the pinned k8s.io/kubernetes module (integration/kubernetes/
#                           go.mod) compiled static with its Makefile's CFLAGS; <tag>: its TAG
#     backend-<tag>.tar     nodelb.test/backend:<busybox version>[-<12 hex>]: Debian's
#                           busybox-static with a /bin link per applet (its nc and httpd work; its
#                           wget crashes in a container), and /nodelb-test-backend:
#                           integration/src/bin/nodelb-test-backend.rs compiled static with rustc,
#                           when that file exists (the hex is of its inputs)
#     nodelb-agent-dev-<12 hex>.tar
#                           nodelb.test/nodelb-agent:dev-<first 12 hex of the binary's sha256>: the
#                           runtime stage of Dockerfile.agent, reproduced. Its FROM
#                           debian:<suite>-slim is an mmdebstrap minbase root file system without
#                           the docs, man pages and locales the slim image leaves out; its apt
#                           packages, COPY destination, ENTRYPOINT and CMD are read from the
#                           Dockerfile; the binary, stripped with `strip --strip-debug` as there, is
#                           a layer of its own
#                           With NODELB_IMAGE_AGENT_BIN_ARM64 (an aarch64 agent, scripts/arm64.sh
#                           builds one), one image for linux/amd64 and linux/arm64/v8: an image
#                           index with a manifest per platform, each on its own architecture's
#                           Debian packages (the arm64 ones installed by mmdebstrap's chrootless
#                           mode, which runs no arm64 program: no binfmt_misc); the tag is dev-<12
#                           hex of both binaries'>. The amd64 manifest is the same, digest for
#                           digest, as the amd64-only image of the same binary's. The agent's
#                           layers are gzip-compressed, as a registry serves them.
#                           NODELB_IMAGE_AGENT_NAME=<name>:<tag> names the image otherwise
#                           (scripts/release.sh: docker.io/nodelb/nodelb-agent:<version>).
#     base/rootfs-<key>.tar that root file system, per platform, keyed by suite, architecture and
#                           package list (delete it to take Debian's newer packages)
#     metallb-{controller,speaker}-<version>.tar
#                           nodelb.test/metallb-<name>:<version>, only with
#                           NODELB_IMAGE_METALLB_DIR (scripts/metallb.sh's directory): MetalLB's
#                           binary at /<name> as its Dockerfiles put it, for `cluster.sh peers up`
# The binary is $NODELB_IMAGE_AGENT_BIN (not NODELB_AGENT_BIN, the binary the end-to-end tests
# run as processes), else target/release/nodelb-agent (built with
# scripts/build-release.sh when missing). A first run spends most of its time in mmdebstrap
# fetching and installing Debian packages; an archive whose inputs did not change is not
# rebuilt, so a new agent binary costs one layer and nothing new costs almost nothing (times:
# docs/benchmarks.md, "Build, demo and test times"). The newest three archives of each image
# are kept. Needs root (mmdebstrap), Debian's package mirror and Go (the pause source is in its module cache, or
# fetched through its proxy); installs mmdebstrap, gcc, libc6-dev and binutils when missing; takes
# busybox-static from the installed package or, without installing it (it conflicts with
# busybox), from `apt-get download`.
# stdout, per image (PAUSE, BACKEND, AGENT, METALLB_CONTROLLER, METALLB_SPEAKER): `<name> <archive> <uncompressed size in MiB>`,
# <KIND>_IMAGE=<name> and <KIND>_ARCHIVE=<archive>; AGENT_PLATFORMS=<os/arch[/variant]>=
# <uncompressed MiB>/<compressed MiB>/<manifest digest>,... ; then IMAGES_DIR=<dir>. Progress:
# stderr.
#   scripts/images.sh                  build what changed, print the lines above
#   scripts/images.sh --verify         then import the archives into a throwaway containerd (its
#                                      own root, state, socket and cgroups; needs Debian's
#                                      containerd for ctr) and run each image once
#   scripts/images.sh --runtime-stage  print what is read from Dockerfile.agent's runtime stage
#                                      and exit (no root, nothing built)
set -euo pipefail
repo="$(cd "$(dirname "$0")/.." && pwd)"
. "$repo/scripts/elf.sh"
self="$repo/scripts/$(basename "$0")"
dockerfile="${NODELB_DOCKERFILE:-$repo/Dockerfile.agent}"
dir="${NODELB_IMAGES_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/nodelb/images}"
mode=build
case "${1:-}" in
  "") ;;
  --verify) mode=verify ;;
  --runtime-stage) mode=runtime-stage ;;
  -h | --help) sed -n '2,/^set -euo/{/^set -euo/d;s/^# \{0,1\}//;p}' "$0"; exit 0 ;;
  *) echo "usage: $0 [--verify | --runtime-stage]" >&2; exit 2 ;;
esac
log() { echo "images: $*" >&2; }
die() { echo "images: $*" >&2; exit 1; }
sha() { sha256sum "$@" | cut -d' ' -f1; }
path="/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

# Dockerfile.agent's runtime stage (the last FROM): its base, apt packages, the path the agent
# is copied to, ENTRYPOINT, CMD and LABELs (`key="value"`; `$NODELB_GIT_COMMIT`, its one ARG,
# becomes the commit the binary names). Anything else in that stage (ENV, USER, another RUN,
# ...) is an error rather than silently left out of the image.
json_array='^\[[[:space:]]*("([^"\\]|\\.)*"[[:space:]]*(,[[:space:]]*"([^"\\]|\\.)*"[[:space:]]*)*)?\]$'
read_runtime_stage() {
  local -a lines
  local line kw rest i start=-1 part word
  local -a w
  [ -f "$dockerfile" ] || die "no $dockerfile"
  # Docker drops comment lines before it joins `\` continuations.
  mapfile -t lines < <(awk '
    /^[[:space:]]*#/ || /^[[:space:]]*$/ { next }
    { sub(/[[:space:]]+$/, "") }
    /\\$/ { sub(/\\$/, ""); cur = cur $0 " "; next }
    { print cur $0; cur = "" }' "$dockerfile")
  for i in "${!lines[@]}"; do
    [[ "${lines[i]}" =~ ^[Ff][Rr][Oo][Mm][[:space:]] ]] && start=$i
  done
  [ "$start" -ge 0 ] || die "$dockerfile has no FROM"
  base="" suite="" packages=() agent_path="" entrypoint="" cmd="" labels=()
  for line in "${lines[@]:start}"; do
    kw="${line%%[[:space:]]*}"
    rest="$(sed 's/^[^[:space:]]*[[:space:]]*//; s/[[:space:]]*$//' <<<"$line")"
    case "${kw^^}" in
      FROM)
        base="$rest"
        [[ "$base" =~ ^debian:([a-z]+)-slim$ ]] ||
          die "the runtime stage is FROM $base; this script stands in for debian:<suite>-slim only"
        suite="${BASH_REMATCH[1]}"
        ;;
      RUN)
        # Only `apt-get update && apt-get install ... && rm -rf /var/lib/apt/lists/*`.
        while IFS= read -r part; do
          read -ra w <<<"$part"
          case "${w[*]}" in
            "apt-get update" | "rm -rf /var/lib/apt/lists/*") ;;
            "apt-get install "*)
              for word in "${w[@]:2}"; do [[ "$word" == -* ]] || packages+=("$word"); done
              ;;
            *) die "the runtime stage runs \`${part# }\`, which this script does not reproduce" ;;
          esac
        done < <(sed 's/&&/\n/g' <<<"$rest")
        ;;
      COPY)
        read -ra w <<<"$rest"
        [ "${#w[@]}" -eq 3 ] && [[ "${w[0]}" == --from=* ]] ||
          die "the runtime stage has COPY $rest; expected COPY --from=<stage> <binary> <path>"
        agent_path="${w[2]}"
        [[ "$agent_path" == */ ]] && agent_path+="$(basename "${w[1]}")"
        ;;
      ARG)
        [[ "$rest" =~ ^NODELB_GIT_COMMIT(=.*)?$ ]] ||
          die "the runtime stage has ARG $rest; only NODELB_GIT_COMMIT is reproduced"
        ;;
      LABEL)
        while [[ "$rest" =~ ^([A-Za-z0-9._-]+)=\"([^\"\\]*)\"[[:space:]]*(.*)$ ]]; do
          labels+=("${BASH_REMATCH[1]}=${BASH_REMATCH[2]}")
          rest="${BASH_REMATCH[3]}"
        done
        [ -z "$rest" ] || die "LABEL ... $rest: only key=\"value\" pairs are reproduced"
        ;;
      ENTRYPOINT | CMD)
        [[ "$rest" =~ $json_array ]] || die "$kw $rest: only the exec (JSON) form is reproduced"
        if [ "${kw^^}" = ENTRYPOINT ]; then entrypoint="$rest"; else cmd="$rest"; fi
        ;;
      *) die "the runtime stage has $kw, which this script does not reproduce: $line" ;;
    esac
  done
  [ "${#packages[@]}" -gt 0 ] && [ -n "$agent_path" ] && [ -n "$entrypoint" ] ||
    die "$dockerfile's runtime stage: no apt-get install, COPY of the agent or ENTRYPOINT"
}
read_runtime_stage
if [ "$mode" = runtime-stage ]; then
  echo "FROM $base"
  echo "PACKAGES ${packages[*]}"
  echo "COPY $agent_path"
  for l in "${labels[@]}"; do echo "LABEL $l"; done
  echo "ENTRYPOINT $entrypoint"
  echo "CMD $cmd"
  exit 0
fi

[ "$(id -u)" = 0 ] || die "needs root (mmdebstrap builds the agent's root file system as root)"
needed=(mmdebstrap gcc libc6-dev binutils)
[ "$mode" = verify ] && needed+=(containerd)
# The arm64 agent's strip.
[ -z "${NODELB_IMAGE_AGENT_BIN_ARM64:-}" ] || needed+=(binutils-aarch64-linux-gnu)
"$repo/scripts/packages.sh" "${needed[@]}"

mkdir -p "$dir/base"
# One builder at a time: the archives and the base are replaced in place.
exec 9>"$dir/.lock"
flock 9
tmp="$(mktemp -d "$dir/.tmp.XXXXXX")"
cleanup() {
  # Never recurse into a mount left under the temporary directory (an interrupted mmdebstrap).
  awk -v t="$tmp/" 'index($2, t) == 1 {print $2}' /proc/mounts | sort -r |
    while read -r m; do umount -l "$m" || true; done
  rm -rf --one-file-system "$tmp"
}
trap cleanup EXIT
script_sha="$(sha "$self")"
start=$(date +%s)

# The OCI image layout, by hand. oci_begin starts one; oci_manifest adds an image for one
# platform (its config, its layers: uncompressed, digest = diff_id, or gzip-compressed with -n,
# so the same input gives the same blob); oci_write archives it with an index naming the image
# for containerd (io.containerd.image.name: ctr takes the name from there;
# org.opencontainers.image.ref.name, the tag, is what skopeo and other OCI tools read). One
# platform: index.json names its manifest. More: index.json names an image index (its own
# blob) that lists a manifest per platform, as `docker buildx` and `skopeo copy --all` lay out
# a multi-platform image.
oci_begin() {
  oci="$tmp/oci"
  rm -rf "$oci"
  mkdir -p "$oci/blobs/sha256"
  oci_manifests=() oci_sizes=()
}
# oci_blob <json>: stores it, prints "<digest> <size>"
oci_blob() {
  printf '%s' "$1" >"$oci/blob"
  oci_blob_file "$oci/blob"
}
# oci_blob_file <file>: moves it into the layout, prints "<digest> <size>"
oci_blob_file() {
  local d s
  d="$(sha "$1")"
  s="$(stat -c %s "$1")"
  mv "$1" "$oci/blobs/sha256/$d"
  echo "$d $s"
}
oci_t=application/vnd.oci.image
# oci_manifest <arch> <gzip|tar> <config: the "config" object> <layer tar>...
oci_manifest() {
  local arch="$1" compress="$2" config="$3" l d s diff_ids="" layers="" total=0 packed=0 json
  local platform="\"architecture\":\"$arch\",\"os\":\"linux\"" media=$oci_t.layer.v1.tar
  local os_arch="linux/$arch" config_digest config_size manifest_digest manifest_size
  shift 3
  # arm64 images are ARMv8 (the variant every registry and runtime expects for arm64).
  if [ "$arch" = arm64 ]; then platform+=',"variant":"v8"' os_arch+=/v8; fi
  [ "$compress" = tar ] || media+="+gzip"
  for l in "$@"; do
    d="$(sha "$l")"
    total=$((total + $(stat -c %s "$l")))
    diff_ids+="${diff_ids:+,}\"sha256:$d\""
    if [ "$compress" = gzip ]; then
      # A layer used before (the base, in a later run) is compressed once.
      [ -f "$l.gz" ] && [ "$(cat "$l.gz.of" 2>/dev/null)" = "$d" ] ||
        { gzip -n -6 -c "$l" >"$l.gz.new" && mv "$l.gz.new" "$l.gz" && echo "$d" >"$l.gz.of"; }
      cp "$l.gz" "$oci/layer"
      read -r d s < <(oci_blob_file "$oci/layer")
    else
      s="$(stat -c %s "$l")"
      ln -f "$l" "$oci/blobs/sha256/$d" 2>/dev/null || cp "$l" "$oci/blobs/sha256/$d"
    fi
    packed=$((packed + s))
    layers+="${layers:+,}{\"mediaType\":\"$media\",\"digest\":\"sha256:$d\",\"size\":$s}"
  done
  json="{\"created\":\"1970-01-01T00:00:00Z\",$platform,"
  json+="\"config\":$config,\"rootfs\":{\"type\":\"layers\",\"diff_ids\":[$diff_ids]}}"
  read -r config_digest config_size < <(oci_blob "$json")
  json="{\"schemaVersion\":2,\"mediaType\":\"$oci_t.manifest.v1+json\","
  json+="\"config\":{\"mediaType\":\"$oci_t.config.v1+json\","
  json+="\"digest\":\"sha256:$config_digest\",\"size\":$config_size},\"layers\":[$layers]}"
  read -r manifest_digest manifest_size < <(oci_blob "$json")
  oci_manifests+=("\"mediaType\":\"$oci_t.manifest.v1+json\",\"digest\":\"sha256:$manifest_digest\",\"size\":$manifest_size,\"platform\":{$platform}")
  oci_sizes+=("$os_arch=$total/$packed/sha256:$manifest_digest")
}
# oci_write <archive> <name>
oci_write() {
  local archive="$1" name="$2" json m top d s
  local annotations="\"annotations\":{\"io.containerd.image.name\":\"$name\",\"org.opencontainers.image.ref.name\":\"${name##*:}\"}"
  if [ "${#oci_manifests[@]}" -eq 1 ]; then
    top="{${oci_manifests[0]},$annotations}"
  else
    json="{\"schemaVersion\":2,\"mediaType\":\"$oci_t.index.v1+json\",\"manifests\":["
    for m in "${oci_manifests[@]}"; do json+="{$m},"; done
    json="${json%,}]}"
    read -r d s < <(oci_blob "$json")
    top="{\"mediaType\":\"$oci_t.index.v1+json\",\"digest\":\"sha256:$d\",\"size\":$s,$annotations}"
  fi
  printf '%s' "{\"schemaVersion\":2,\"mediaType\":\"$oci_t.index.v1+json\",\"manifests\":[$top]}" >"$oci/index.json"
  printf '%s' '{"imageLayoutVersion":"1.0.0"}' >"$oci/oci-layout"
  tar --sort=name --mtime=@0 --owner=0 --group=0 --numeric-owner -C "$oci" -cf "$archive.new" \
    oci-layout index.json blobs
  mv "$archive.new" "$archive"
  # <platform>=<uncompressed bytes>/<bytes as stored>/<manifest digest>, a line each; the
  # first platform's uncompressed size is the one `report` prints.
  printf '%s\n' "${oci_sizes[@]}" >"$archive.platforms"
  echo "${oci_sizes[0]}" | sed 's/^[^=]*=//; s/\/.*//' >"$archive.size"
  rm -rf "$oci"
}

# layer <dir> <tar>: the tree under dir, its top-level entries without a leading ./
layer() {
  local -a top
  mapfile -t top < <(cd "$1" && LC_ALL=C ls -A)
  tar --sort=name --mtime=@0 --owner=0 --group=0 --numeric-owner -C "$1" -cf "$2" "${top[@]}"
}

# fresh <archive> <key>: built before from the same inputs
fresh() { [ -f "$1" ] && [ -f "$1.size" ] && [ "$(cat "$1.key" 2>/dev/null)" = "$2" ]; }

# keep <archive> <kind>: it and the two <kind>-*.tar archives used most recently before it
# stay, older ones go (a test may roll the agent from one binary to the next).
keep() {
  local old
  touch "$1"
  ls -t "$dir/$2"-*.tar | tail -n +4 | while IFS= read -r old; do rm -f "$old" "$old.key" "$old.size"; done
}

report() { # <VAR prefix> <name> <archive>
  echo "$2 $3 $(awk '{printf "%.1f", $1 / 1048576}' "$3.size")"
  echo "$1_IMAGE=$2"
  echo "$1_ARCHIVE=$3"
}

# --- pause ---------------------------------------------------------------------------------
module="$repo/integration/kubernetes"
version="$(awk '$1 == "k8s.io/kubernetes" && $2 ~ /^v1\./ {print $2; exit}' "$module/go.mod")"
[ -n "$version" ] || die "no k8s.io/kubernetes version in $module/go.mod"
command -v go >/dev/null || die "go not found (the pause source comes from the Go module cache)"
pausedir="$(go env GOMODCACHE)/k8s.io/kubernetes@$version/build/pause"
if [ ! -f "$pausedir/linux/pause.c" ]; then
  log "fetching k8s.io/kubernetes $version into the Go module cache"
  (cd "$module" && go mod download k8s.io/kubernetes) >&2
fi
[ -f "$pausedir/linux/pause.c" ] || die "no $pausedir/linux/pause.c"
# Upstream's Makefile: TAG ?= 3.x.y, CFLAGS = ... -DVERSION=v$(TAG)-$(REV) with REV its git
# describe, here the module version; its Dockerfile: USER, ENTRYPOINT, ADD of the binary.
pause_tag="$(awk '$1 == "TAG" && $2 == "?=" {print $3; exit}' "$pausedir/Makefile")"
cflags="$(awk '$1 == "CFLAGS" && $2 == "=" {$1 = $2 = ""; print; exit}' "$pausedir/Makefile")"
cflags="${cflags//\$(TAG)/$pause_tag}"
cflags="${cflags//\$(REV)/$version}"
pause_user="$(awk '$1 == "USER" {print $2; exit}' "$pausedir/Dockerfile")"
pause_entrypoint="$(awk '$1 == "ENTRYPOINT" {$1 = ""; sub(/^ /, ""); print; exit}' "$pausedir/Dockerfile")"
pause_path="$(awk '$1 == "ADD" {print $3; exit}' "$pausedir/Dockerfile")"
[ -n "$pause_tag" ] && [ -n "$cflags" ] && [[ "$cflags" != *'$('* ]] && [ -n "$pause_user" ] &&
  [[ "$pause_entrypoint" =~ $json_array ]] && [[ "$pause_path" == /* ]] ||
  die "cannot read TAG, CFLAGS, USER, ENTRYPOINT or ADD from $pausedir/{Makefile,Dockerfile}"
pause_image="nodelb.test/pause:$pause_tag"
pause_archive="$dir/pause-$pause_tag.tar"
pause_key="$(printf '%s\n' "$script_sha" "$(sha "$pausedir/linux/pause.c")" "$cflags" "$pause_user" \
  "$pause_entrypoint" "$pause_path" "$(gcc --version | head -1)" | sha256sum)"
if ! fresh "$pause_archive" "$pause_key"; then
  log "building $pause_image: gcc $cflags $pausedir/linux/pause.c"
  mkdir -p "$tmp/pause$(dirname "$pause_path")"
  # shellcheck disable=SC2086 # CFLAGS is a list of words, as in the Makefile
  gcc $cflags -o "$tmp/pause$pause_path" "$pausedir/linux/pause.c"
  strip "$tmp/pause$pause_path"
  layer "$tmp/pause" "$tmp/pause.tar"
  oci_begin
  oci_manifest amd64 tar \
    "{\"User\":\"$pause_user\",\"Env\":[\"PATH=$path\"],\"Entrypoint\":$pause_entrypoint}" "$tmp/pause.tar"
  oci_write "$pause_archive" "$pause_image"
  echo "$pause_key" >"$pause_archive.key"
fi
report PAUSE "$pause_image" "$pause_archive"

# --- backend -------------------------------------------------------------------------------
if dpkg-query -W -f='${Status}' busybox-static 2>/dev/null | grep -q "install ok installed"; then
  busybox="$(dpkg-query -L busybox-static | grep -E '^(/usr)?/bin/busybox$' | head -1)"
  busybox_version="$(dpkg-query -W -f='${Version}' busybox-static)"
else
  # Not installed: busybox-static conflicts with the busybox package some systems rely on.
  busybox="$dir/busybox-static/busybox"
  if [ ! -x "$busybox" ]; then
    log "downloading Debian's busybox-static into $dir/busybox-static"
    mkdir -p "$tmp/deb" "$tmp/busybox-static"
    chmod 755 "$tmp/deb" # apt-get download runs as _apt
    (cd "$tmp/deb" && { apt-get download busybox-static || { apt-get update && apt-get download busybox-static; }; }) >&2
    dpkg-deb -x "$tmp"/deb/busybox-static_*.deb "$tmp/deb/x"
    dpkg-deb -f "$tmp"/deb/busybox-static_*.deb Version >"$tmp/busybox-static/version"
    for f in bin/busybox usr/bin/busybox; do
      [ -f "$tmp/deb/x/$f" ] && cp "$tmp/deb/x/$f" "$tmp/busybox-static/busybox" && break
    done
    "$tmp/busybox-static/busybox" --list >/dev/null || die "no busybox in busybox-static"
    rm -rf "$dir/busybox-static"
    mv "$tmp/busybox-static" "$dir/busybox-static"
  fi
  busybox_version="$(cat "$dir/busybox-static/version")"
fi
[ -x "$busybox" ] || die "no busybox in busybox-static"
# A tag is [A-Za-z0-9_.-]: 1:1.35.0-4+deb12u1+b1 -> 1.35.0-4-deb12u1-b1
backend_tag="$(sed 's/^[0-9]*://; s/[^A-Za-z0-9_.-]/-/g' <<<"$busybox_version")"
# The real-cluster tests' backend server, /nodelb-test-backend, when the source is there: one
# file of std only, compiled alone with rustc, static. Its inputs make the tag's suffix, so a
# changed server is a new image name (the pods say imagePullPolicy: IfNotPresent).
test_backend="$repo/integration/src/bin/nodelb-test-backend.rs"
test_backend_inputs=""
if [ -f "$test_backend" ]; then
  command -v rustc >/dev/null || die "rustc not found (the backend image carries $test_backend)"
  edition="$(awk -F'"' '$1 ~ /^edition[[:space:]]*=[[:space:]]*$/ {print $2; exit}' "$repo/Cargo.toml")"
  test_backend_inputs="$(sha "$test_backend") $(rustc --version) ${edition:=2021}"
  backend_tag+="-$(sha256sum <<<"$test_backend_inputs" | cut -c1-12)"
fi
backend_image="nodelb.test/backend:$backend_tag"
backend_archive="$dir/backend-$backend_tag.tar"
backend_key="$(printf '%s\n' "$script_sha" "$(sha "$busybox")" "$busybox_version" "$test_backend_inputs" | sha256sum)"
if ! fresh "$backend_archive" "$backend_key"; then
  log "building $backend_image from $busybox"
  r="$tmp/backend"
  mkdir -p "$r/bin" "$r/etc" "$r/tmp" "$r/root"
  chmod 1777 "$r/tmp"
  chmod 700 "$r/root"
  cp "$busybox" "$r/bin/busybox"
  chmod 755 "$r/bin/busybox"
  "$busybox" --list | while read -r applet; do
    [ "$applet" = busybox ] || ln -s busybox "$r/bin/$applet"
  done
  printf '%s\n' 'root:x:0:0:root:/root:/bin/sh' 'nobody:x:65534:65534:nobody:/nonexistent:/bin/false' >"$r/etc/passwd"
  printf '%s\n' 'root:x:0:' 'nogroup:x:65534:' >"$r/etc/group"
  if [ -n "$test_backend_inputs" ]; then
    log "compiling $test_backend into it"
    mkdir -p "$tmp/rustc"
    rustc --edition "$edition" -C opt-level=2 -C target-feature=+crt-static -C strip=symbols \
      --remap-path-prefix "$repo=." -o "$tmp/rustc/nodelb-test-backend" "$test_backend" >&2
    install -m 755 "$tmp/rustc/nodelb-test-backend" "$r/nodelb-test-backend"
  fi
  layer "$r" "$tmp/backend.tar"
  oci_begin
  oci_manifest amd64 tar "{\"Env\":[\"PATH=$path\"],\"Cmd\":[\"/bin/sh\"]}" "$tmp/backend.tar"
  oci_write "$backend_archive" "$backend_image"
  echo "$backend_key" >"$backend_archive.key"
fi
keep "$backend_archive" backend
report BACKEND "$backend_image" "$backend_archive"

# --- nodelb-agent --------------------------------------------------------------------------
# The base: what `FROM debian:<suite>-slim` + the apt-get install gives, for each platform the
# image is built for. debuerreotype's slim variant drops these paths and keeps a dpkg config
# that goes on dropping them; so does mmdebstrap's --dpkgopt (left in
# /etc/dpkg/dpkg.cfg.d/99mmdebstrap). amd64, the machine's own, is built in root mode (dpkg in a
# chroot); arm64 in chrootless mode, where dpkg runs the packages' scripts from outside with
# DPKG_ROOT, so no arm64 program runs and no binfmt_misc handler is needed (minbase's
# packages support it since bookworm).
mirror="http://deb.debian.org/debian"
# base_rootfs <arch>: sets base_tar and base_key for that platform, building it when missing.
base_rootfs() {
  local arch="$1" mode=root
  [ "$arch" = amd64 ] || mode=chrootless
  local -a args=(
    --variant=minbase "--mode=$mode" "--arch=$arch" --format=directory
    # merged /usr with the usr-is-merged package, not usrmerge and the perl it pulls in (the way
    # debuerreotype builds the bookworm images)
    --hook-dir=/usr/share/mmdebstrap/hooks/merged-usr
    "--include=$(IFS=,; echo "${packages[*]}")"
    --dpkgopt='path-exclude=/usr/share/doc/*'
    --dpkgopt='path-exclude=/usr/share/groff/*'
    --dpkgopt='path-exclude=/usr/share/info/*'
    --dpkgopt='path-exclude=/usr/share/linda/*'
    --dpkgopt='path-exclude=/usr/share/lintian/overrides/*'
    --dpkgopt='path-exclude=/usr/share/locale/*'
    --dpkgopt='path-exclude=/usr/share/man/*'
    --dpkgopt='path-include=/usr/share/doc/*/copyright'
    --dpkgopt='path-include=/usr/share/doc/kde/HTML/C/*'
    --dpkgopt='path-include=/usr/share/gnome/help/*/C/*'
    --dpkgopt='path-include=/usr/share/locale/all_languages'
    --dpkgopt='path-include=/usr/share/locale/currency/*'
    --dpkgopt='path-include=/usr/share/locale/l10n/*'
    --dpkgopt='path-include=/usr/share/locale/languages'
    --dpkgopt='path-include=/usr/share/locale/locale.alias'
    --dpkgopt='path-include=/usr/share/omf/*/*-C.emf'
    "$suite"
  )
  local -a sources=(
    "deb $mirror $suite main"
    "deb $mirror $suite-updates main"
    "deb ${mirror}-security $suite-security main"
  )
  base_key="$(printf '%s\n' "${args[@]}" "${sources[@]}" | sha | cut -c1-16)"
  base_tar="$dir/base/rootfs-$base_key.tar"
  [ -f "$base_tar" ] && return 0
  log "building the $arch base root file system ($base, ${packages[*]}) with mmdebstrap --mode=$mode (under a minute)"
  local r="$tmp/rootfs-$arch"
  mmdebstrap "${args[@]}" "$r" "${sources[@]}" </dev/null >&2
  # In chrootless mode the host's dpkg unpacks, and it does not read the target's
  # dpkg.cfg.d: the path filters are applied here instead, with dpkg's own rule (the last
  # matching filter wins; `*` matches `/` too).
  if [ "$mode" = chrootless ]; then
    local -a filters=()
    local a f keep
    for a in "${args[@]}"; do
      [[ "$a" == --dpkgopt=path-* ]] && filters+=("${a#--dpkgopt=}")
    done
    while IFS= read -r -d '' f; do
      keep=yes
      for a in "${filters[@]}"; do
        # shellcheck disable=SC2053 # the filter is a glob
        [[ "${f#"$r"}" == ${a#path-*=} ]] || continue
        if [[ "$a" == path-exclude=* ]]; then keep=no; else keep=yes; fi
      done
      [ "$keep" = yes ] || rm -f "$f"
    done < <(find "$r/usr/share" \( -type f -o -type l \) -print0)
    for a in "${filters[@]}"; do
      [[ "$a" == path-exclude=* ]] || continue
      a="$r$(dirname "${a#path-exclude=}")"
      [ ! -d "$a" ] || find "$a" -mindepth 1 -depth -type d -empty -delete
    done
  fi
  # What a container runtime provides, and logs of the build.
  find "$r/dev" "$r/proc" "$r/sys" "$r/run" "$r/tmp" -mindepth 1 -xdev -delete
  rm -f "$r"/var/log/*.log "$r"/var/log/apt/* "$r/var/cache/ldconfig/aux-cache" "$r/etc/machine-id" "$r/etc/hostname" "$r/etc/resolv.conf"
  layer "$r" "$tmp/rootfs-$arch.tar"
  rm -rf --one-file-system "$r"
  # The newest base of each platform stays.
  local old
  for old in "$dir"/base/rootfs-*.tar; do
    [ -f "$old" ] && [ "$(cat "$old.arch" 2>/dev/null || echo amd64)" = "$arch" ] && rm -f "$old" "$old".*
  done
  mv "$tmp/rootfs-$arch.tar" "$base_tar"
  echo "$arch" >"$base_tar.arch"
}

# The binaries: amd64 always; arm64 when NODELB_IMAGE_AGENT_BIN_ARM64 names one (then the
# archive is one image for both platforms, and the amd64 half is the same manifest, layer for
# layer, as the amd64-only image of the same binary).
agent_bin="${NODELB_IMAGE_AGENT_BIN:-$repo/target/release/nodelb-agent}"
if [ ! -x "$agent_bin" ]; then
  [ -z "${NODELB_IMAGE_AGENT_BIN:-}" ] || die "NODELB_IMAGE_AGENT_BIN=$NODELB_IMAGE_AGENT_BIN is not an executable"
  log "no $agent_bin: running scripts/build-release.sh (about 6 minutes on 2 cores)"
  "$repo/scripts/build-release.sh" >&2
fi
agent_arm64_bin="${NODELB_IMAGE_AGENT_BIN_ARM64:-}"
agent_arches=(amd64)
agent_bins=("$agent_bin")
if [ -n "$agent_arm64_bin" ]; then
  [ -f "$agent_arm64_bin" ] || die "NODELB_IMAGE_AGENT_BIN_ARM64=$agent_arm64_bin is not a file"
  [ "$(elf_machine "$agent_arm64_bin")" = AArch64 ] ||
    die "NODELB_IMAGE_AGENT_BIN_ARM64=$agent_arm64_bin is not an AArch64 ELF file"
  agent_arches+=(arm64)
  agent_bins+=("$agent_arm64_bin")
fi
# Each platform's base (built when missing) and binary, once.
agent_bases=() agent_shas="" agent_keys=""
for i in "${!agent_arches[@]}"; do
  base_rootfs "${agent_arches[i]}"
  agent_bases+=("$base_tar")
  s="$(sha "${agent_bins[i]}")"
  agent_shas+="$s"
  agent_keys+="${agent_arches[i]} $base_key $s "
done
agent_tag="dev-${agent_shas:0:12}"
# Two platforms: the tag names both binaries.
[ -z "$agent_arm64_bin" ] || agent_tag="dev-$(sha256sum <<<"$agent_shas" | cut -c1-12)"
agent_image="${NODELB_IMAGE_AGENT_NAME:-nodelb.test/nodelb-agent:$agent_tag}"
[[ "$agent_image" =~ ^[a-z0-9./-]+:[A-Za-z0-9_][A-Za-z0-9_.-]*$ ]] ||
  die "NODELB_IMAGE_AGENT_NAME=$agent_image is not <name>:<tag>"
agent_file="${agent_image##*/}"
agent_archive="$dir/nodelb-agent-${agent_file#*:}.tar"
[ -z "${NODELB_IMAGE_AGENT_NAME:-}" ] || agent_archive="$dir/nodelb-agent-named-$(sha256sum <<<"$agent_image" | cut -c1-8)-${agent_file#*:}.tar"
agent_key="$(printf '%s\n' "$script_sha" "$agent_image" "$agent_keys" "$agent_path" "$entrypoint" "$cmd" "${labels[@]}" | sha256sum)"
if ! fresh "$agent_archive" "$agent_key"; then
  log "building $agent_image (${agent_arches[*]}) from ${agent_bins[*]}"
  # Dockerfile.agent's labels, its $NODELB_GIT_COMMIT the commit the binary names ("nodelb-agent
  # 0.1.0 (commit 0123456789ab)"), whose version must be the one the labels give: what the amd64
  # binary prints (an arm64 one cannot run here), which every binary must carry.
  agent_version="$("$agent_bin" --version)" || die "$agent_bin --version failed"
  [[ "$agent_version" =~ ^nodelb-agent\ ([^ ]+)\ \(commit\ ([^\)]+)\)$ ]] ||
    die "unexpected $agent_bin --version: $agent_version"
  agent_ver="${BASH_REMATCH[1]}" agent_commit="${BASH_REMATCH[2]}"
  [ -z "$agent_arm64_bin" ] || grep -qaF "$agent_ver (commit $agent_commit)" "$agent_arm64_bin" ||
    die "$agent_arm64_bin does not carry \"$agent_ver (commit $agent_commit)\" (built from another commit?)"
  label_json=""
  for l in "${labels[@]}"; do
    value="${l#*=}"
    value="${value//\$NODELB_GIT_COMMIT/$agent_commit}"
    if [ "${l%%=*}" = org.opencontainers.image.version ] && [ "$value" != "$agent_ver" ]; then
      die "Dockerfile.agent labels version $value; $agent_bin is $agent_ver"
    fi
    label_json+="${label_json:+,}\"${l%%=*}\":\"$value\""
  done
  oci_begin
  for i in "${!agent_arches[@]}"; do
    a="${agent_arches[i]}"
    mkdir -p "$tmp/agent-$a$(dirname "$agent_path")"
    strip=strip
    [ "$a" = amd64 ] || strip=aarch64-linux-gnu-strip
    "$strip" --strip-debug -o "$tmp/agent-$a$agent_path" "${agent_bins[i]}"
    chmod 755 "$tmp/agent-$a$agent_path"
    layer "$tmp/agent-$a" "$tmp/agent-$a.tar"
    # Layers gzip-compressed, as a registry serves them (a third the size to pull).
    oci_manifest "$a" gzip \
      "{\"Env\":[\"PATH=$path\"],\"Entrypoint\":$entrypoint,\"Cmd\":${cmd:-null},\"Labels\":{$label_json}}" \
      "${agent_bases[i]}" "$tmp/agent-$a.tar"
  done
  oci_write "$agent_archive" "$agent_image"
  echo "$agent_key" >"$agent_archive.key"
fi
keep "$agent_archive" nodelb-agent
report AGENT "$agent_image" "$agent_archive"
# Per platform: <os/arch[/variant]>=<uncompressed MiB>/<compressed MiB>/<manifest digest>
echo "AGENT_PLATFORMS=$(awk '{ n = split($0, p, "="); split(p[2], v, "/");
  printf "%s%s=%.1f/%.1f/%s", (NR > 1 ? "," : ""), p[1], v[1] / 1048576, v[2] / 1048576, v[3] }' \
  "$agent_archive.platforms")"
# --- MetalLB (only with NODELB_IMAGE_METALLB_DIR) ----------------------------------------------
# The peer scripts/cluster.sh's `peers up` installs: scripts/metallb.sh's controller and
# speaker (static Go binaries), each an image as MetalLB's Dockerfiles make it: the binary at
# /<name>, the ENTRYPOINT, on a base of nothing but what distroless/static gives a static binary
# that reads no file of its own (/etc/passwd and /etc/group with root, nobody and nonroot, /tmp).
if [ -n "${NODELB_IMAGE_METALLB_DIR:-}" ]; then
  metallb_version="$(cat "$NODELB_IMAGE_METALLB_DIR/version")"
  for m in controller speaker; do
    [ -x "$NODELB_IMAGE_METALLB_DIR/$m" ] || die "no $m in $NODELB_IMAGE_METALLB_DIR (scripts/metallb.sh)"
    m_image="nodelb.test/metallb-$m:$metallb_version"
    m_archive="$dir/metallb-$m-$metallb_version.tar"
    m_key="$(printf '%s\n' "$script_sha" "$(sha "$NODELB_IMAGE_METALLB_DIR/$m")" | sha256sum)"
    if ! fresh "$m_archive" "$m_key"; then
      log "building $m_image from $NODELB_IMAGE_METALLB_DIR/$m"
      r="$tmp/metallb-$m"
      mkdir -p "$r/etc" "$r/tmp"
      chmod 1777 "$r/tmp"
      printf '%s\n' 'root:x:0:0:root:/root:/sbin/nologin' 'nobody:x:65534:65534:nobody:/nonexistent:/sbin/nologin' \
        'nonroot:x:65532:65532:nonroot:/home/nonroot:/sbin/nologin' >"$r/etc/passwd"
      printf '%s\n' 'root:x:0:' 'nobody:x:65534:' 'nonroot:x:65532:' >"$r/etc/group"
      install -m 755 "$NODELB_IMAGE_METALLB_DIR/$m" "$r/$m"
      layer "$r" "$tmp/metallb-$m.tar"
      oci_begin
      oci_manifest amd64 tar "{\"Env\":[\"PATH=$path\"],\"Entrypoint\":[\"/$m\"]}" "$tmp/metallb-$m.tar"
      oci_write "$m_archive" "$m_image"
      echo "$m_key" >"$m_archive.key"
    fi
    report "METALLB_${m^^}" "$m_image" "$m_archive"
  done
fi
echo "IMAGES_DIR=$dir"
log "done in $(($(date +%s) - start)) s"

[ "$mode" = verify ] || exit 0
# --- --verify: a containerd of its own imports and runs each image ---------------------------
# Its root, state, socket, FIFOs, runc state and cgroups are its own and go away afterwards; the
# CRI plugin is off (nothing here needs it, and it wants CAP_SYS_RESOURCE for oom_score_adj).
# containerd 1.6 puts every shim's socket in /run/containerd/s whatever the config says: those
# directories are removed afterwards if this run made them.
v="$tmp/containerd"
mkdir -p "$v"
cat >"$v/config.toml" <<TOML
version = 2
root = "$v/root"
state = "$v/state"
disabled_plugins = ["io.containerd.grpc.v1.cri"]
[grpc]
  address = "$v/containerd.sock"
[plugins."io.containerd.internal.v1.opt"]
  path = "$v/opt"
TOML
cgroup="nodelb-images-verify-$$"
containerd_pid=""
made_run_dirs=()
for d in /run/containerd /run/containerd/s; do [ -e "$d" ] || made_run_dirs=("$d" "${made_run_dirs[@]}"); done
verify_cleanup() {
  local p
  if [ -n "$containerd_pid" ]; then
    kill "$containerd_pid" 2>/dev/null || true
    wait "$containerd_pid" 2>/dev/null || true
  fi
  # Shims outlive containerd; ours name our socket.
  for p in $(pgrep -f -- "-address $v/containerd.sock" || true); do kill "$p" 2>/dev/null || true; done
  find /sys/fs/cgroup -maxdepth 3 -depth -type d \( -name "$cgroup" -o -path "*/$cgroup/*" \) \
    -exec rmdir {} \; 2>/dev/null || true
  for p in "${made_run_dirs[@]}"; do rmdir "$p" 2>/dev/null || true; done
  cleanup
}
trap verify_cleanup EXIT
containerd --config "$v/config.toml" >"$v/log" 2>&1 9>&- &
containerd_pid=$!
ctr() { command ctr -a "$v/containerd.sock" -n k8s.io "$@"; }
run() { ctr run --fifo-dir "$v/fifo" --runc-root "$v/runc" "$@"; }
for _ in $(seq 50); do ctr version >/dev/null 2>&1 && break; sleep 0.2; done
ctr version >/dev/null 2>&1 || { cat "$v/log" >&2; die "the throwaway containerd did not start"; }
for a in "$pause_archive" "$backend_archive" "$agent_archive"; do
  log "ctr -n k8s.io images import $a"
  ctr images import "$a" >&2
done
ctr images ls >&2
n=0
check() { # <what> <expected in the output> <image> [command...]
  local what="$1" want="$2" out
  shift 2
  n=$((n + 1))
  out="$(run --rm --cgroup "$cgroup/c$n" "$1" "c$n" "${@:2}" </dev/null 2>&1)" || true
  [[ "$out" == *"$want"* ]] || die "$what: expected \"$want\" in: $out"
  log "$what: ok ($(grep -m1 -F -- "$want" <<<"$out"))"
}
check "pause -v" "pause.c v$pause_tag-$version" "$pause_image" /pause -v
# pause as its image says (ENTRYPOINT, USER): still running after a second, until signalled.
run -d --cgroup "$cgroup/pause" "$pause_image" pause >/dev/null
sleep 1
pid="$(ctr tasks ls | awk '$1 == "pause" && $3 == "RUNNING" {print $2}')"
[ -n "$pid" ] || die "pause is not running: $(ctr tasks ls)"
uid="$(awk '$1 == "Uid:" {print $2}' "/proc/$pid/status")"
ctr tasks kill -s SIGINT pause
for _ in $(seq 50); do ctr tasks ls | grep -q "^pause .*STOPPED" && break; sleep 0.1; done
ctr tasks delete pause >/dev/null
ctr containers delete pause
[ "$uid:" = "${pause_user%%:*}:" ] || die "pause ran as uid $uid, not $pause_user"
log "pause (ENTRYPOINT $pause_entrypoint, USER $pause_user): ran as uid $uid until SIGINT: ok"
check "backend: httpd, then nc asks it" "200 OK" "$backend_image" sh -c '
  mkdir /tmp/www && echo hello >/tmp/www/index.html && httpd -p 127.0.0.1:8080 -h /tmp/www &&
  printf "GET / HTTP/1.0\r\n\r\n" | nc 127.0.0.1 8080'
if [ -n "$test_backend_inputs" ]; then
  check "backend: /nodelb-test-backend answers on :8080" " 127.0.0.1" "$backend_image" sh -c '
    /nodelb-test-backend & sleep 1; nc 127.0.0.1 8080'
fi
check "nodelb-agent --help (libnftnl and libmnl resolve)" "Usage: nodelb-agent" "$agent_image" nodelb-agent --help
# ENTRYPOINT and CMD as the image has them: `nodelb-agent run`, which wants a --node-name.
check "nodelb-agent with the image's ENTRYPOINT and CMD" "Usage: nodelb-agent run" "$agent_image"
log "verified: the three archives import and run"
