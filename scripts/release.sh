#!/usr/bin/env bash
# scripts/release.sh: the release directory, from this checkout, as root. Fills
# ${NODELB_DIST_DIR:-dist}/ (emptied first) with, for the version in agent/Cargo.toml (V):
#   nodelb-agent-V-linux-amd64      the release agent for x86_64 (scripts/build-release.sh)
#   nodelb-agent-V-linux-arm64      the same for aarch64 (scripts/arm64.sh --build-only); both
#                                   stripped of debug info as the image's copy is
#   nodelb-agent-V.oci.tar          the image for linux/amd64 and linux/arm64/v8, one image
#                                   index, as an OCI image layout in a tar archive
#                                   (scripts/images.sh): `skopeo copy --all
#                                   oci-archive:nodelb-agent-V.oci.tar docker://REGISTRY/nodelb-agent:V`;
#                                   `crane push --index DIR REGISTRY/nodelb-agent:V` takes the
#                                   layout unpacked into DIR. Named docker.io/nodelb/nodelb-agent:V
#                                   (what the manifests and the chart name by default), so `ctr
#                                   -n k8s.io images import` on a node serves them without a registry
#   nodelb-V.tgz                    `helm package charts/nodelb` (version and appVersion: V)
#   nodelb-V.yaml, nodelb-V-hardened.yaml
#                                   `kubectl kustomize manifests/` and `manifests/hardened/`, for
#                                   `kubectl apply -f` (the image: nodelb/nodelb-agent:V)
#   nodelb-V-cleanup.yaml           `kubectl kustomize manifests/cleanup/`: the uninstall of either
#                                   (apply it, wait, delete it: the README's Uninstall)
#   nodelb-agent-V-linux-amd64.cdx.json, nodelb-agent-V-linux-arm64.cdx.json
#                                   each binary's Rust crates (the agent's dependency graph for
#                                   its target, build-time dependencies left out) as a CycloneDX
#                                   1.5 SBOM (cargo-cyclonedx, built once into the cache)
#   SHA256SUMS                      of all of the above: `sha256sum -c SHA256SUMS`
# Then it checks what it made (scripts/release.sh --verify DIR checks a directory made before;
# scripts/release.sh --tools only installs and builds what it needs):
# every file carries V, the image index names both platforms and carries the two binaries, the
# arm64 binary is an AArch64 ELF file, the checksums verify. Prints a summary line per file.
#
# The binaries: NODELB_RELEASE_AGENT_BIN and NODELB_RELEASE_AGENT_BIN_ARM64 when set (built
# elsewhere, in the background), else built here (minutes each: docs/benchmarks.md). Both must say
# the same version and commit.
set -euo pipefail
repo="$(cd "$(dirname "$0")/.." && pwd)"
. "$repo/scripts/elf.sh"
cd "$repo"
log() { echo "release: $*" >&2; }
die() { echo "release: $*" >&2; exit 1; }
version="$(awk -F'"' '$1 ~ /^version[[:space:]]*=[[:space:]]*$/ {print $2; exit}' agent/Cargo.toml)"
[ -n "$version" ] || die "no version in agent/Cargo.toml"
image="docker.io/nodelb/nodelb-agent:$version"
cyclonedx_version=0.5.9
tools="${XDG_CACHE_HOME:-$HOME/.cache}/nodelb/tools"

# An image index's platforms, as os/architecture[/variant],...
platforms_jq='[.manifests[].platform | .os + "/" + .architecture + (if .variant then "/" + .variant else "" end)] | join(",")'
# verify DIR: what --verify checks, and what a build ends with.
verify() {
  local d="$1" f n arch
  [ -f "$d/SHA256SUMS" ] || die "$d has no SHA256SUMS"
  (cd "$d" && sha256sum --quiet -c SHA256SUMS) || die "$d: the checksums do not verify"
  local want=(nodelb-agent-$version-linux-amd64 nodelb-agent-$version-linux-arm64
    nodelb-agent-$version.oci.tar nodelb-$version.tgz nodelb-$version.yaml
    nodelb-$version-hardened.yaml nodelb-$version-cleanup.yaml
    nodelb-agent-$version-linux-amd64.cdx.json nodelb-agent-$version-linux-arm64.cdx.json)
  for f in "${want[@]}"; do
    grep -q "  $f\$" "$d/SHA256SUMS" || die "$d/SHA256SUMS does not cover $f"
  done
  n="$(wc -l <"$d/SHA256SUMS")"
  [ "$n" -eq "${#want[@]}" ] || die "$d/SHA256SUMS has $n lines, not ${#want[@]}"
  # The binaries: their ELF machines, and the version (and commit) each carries.
  for arch in amd64 arm64; do
    f="$d/nodelb-agent-$version-linux-$arch"
    [ "$(elf_machine "$f")" = "$(elf_machine_of "$arch")" ] ||
      die "$f is not an $(elf_machine_of "$arch") ELF file: $(elf_machine "$f")"
  done
  local says
  says="$("$d/nodelb-agent-$version-linux-amd64" --version)"
  [[ "$says" =~ ^nodelb-agent\ $version\ \(commit\ [0-9a-f]{12}\)$ ]] ||
    die "the amd64 agent says \"$says\", not version $version with a commit"
  grep -qaF "${says#nodelb-agent }" "$d/nodelb-agent-$version-linux-arm64" ||
    die "the arm64 agent does not carry \"${says#nodelb-agent }\""
  # The image: an index of linux/amd64 and linux/arm64/v8, named for V, each manifest's agent
  # layer holding the binary of its platform, byte for byte.
  local x="$work/image" top index m platform config layer label
  rm -rf "$x" && mkdir -p "$x"
  tar -xf "$d/nodelb-agent-$version.oci.tar" -C "$x"
  top="$(jq -r '.manifests | length' "$x/index.json")"
  [ "$top" = 1 ] || die "the image archive's index.json names $top images, not 1"
  [ "$(jq -r '.manifests[0].annotations["io.containerd.image.name"]' "$x/index.json")" = "$image" ] ||
    die "the image archive is not named $image"
  [ "$(jq -r '.manifests[0].annotations["org.opencontainers.image.ref.name"]' "$x/index.json")" = "$version" ] ||
    die "the image archive's tag is not $version"
  index="$x/blobs/sha256/$(jq -r '.manifests[0].digest | ltrimstr("sha256:")' "$x/index.json")"
  platform="$(jq -r "$platforms_jq" "$index")"
  [ "$platform" = "linux/amd64,linux/arm64/v8" ] || die "the image index names $platform"
  for arch in amd64 arm64; do
    m="$x/blobs/sha256/$(jq -r --arg a "$arch" '.manifests[] | select(.platform.architecture == $a) | .digest | ltrimstr("sha256:")' "$index")"
    config="$x/blobs/sha256/$(jq -r '.config.digest | ltrimstr("sha256:")' "$m")"
    [ "$(jq -r .architecture "$config")" = "$arch" ] || die "the $arch manifest's config says $(jq -r .architecture "$config")"
    label="$(jq -r '.config.Labels["org.opencontainers.image.version"]' "$config")"
    [ "$label" = "$version" ] || die "the $arch image is labelled version $label"
    layer="$x/blobs/sha256/$(jq -r '.layers[-1].digest | ltrimstr("sha256:")' "$m")"
    mkdir -p "$x/$arch"
    tar -xzf "$layer" -C "$x/$arch"
    cmp -s "$x/$arch/usr/local/bin/nodelb-agent" "$d/nodelb-agent-$version-linux-$arch" ||
      die "the $arch image's agent is not nodelb-agent-$version-linux-$arch"
    # Its base's libraries are of the same architecture.
    layer="$x/blobs/sha256/$(jq -r '.layers[0].digest | ltrimstr("sha256:")' "$m")"
    tar -xzf "$layer" -C "$x/$arch" usr/lib
    f="$(find "$x/$arch/usr/lib" -name 'libnftnl.so.*' -type f | head -1)"
    [ -n "$f" ] || die "the $arch image has no libnftnl"
    [ "$(elf_machine "$f")" = "$(elf_machine_of "$arch")" ] ||
      die "the $arch image's $f is $(elf_machine "$f")"
  done
  # skopeo (Debian's) copies it whole, every platform, as a copy to a registry reads it.
  skopeo copy --quiet --all "oci-archive:$d/nodelb-agent-$version.oci.tar:$version" \
    "oci:$x/skopeo:$version" >&2 || die "skopeo cannot copy the image archive"
  [ "$(skopeo inspect --raw "oci:$x/skopeo:$version" | jq -r "$platforms_jq")" = "$platform" ] ||
    die "skopeo's copy of the image does not name $platform"
  # The chart, the manifests and the SBOM.
  tar -xzf "$d/nodelb-$version.tgz" -C "$x" nodelb/Chart.yaml
  for field in version appVersion; do
    [ "$(awk -v f="$field:" '$1 == f {gsub(/"/, "", $2); print $2; exit}' "$x/nodelb/Chart.yaml")" = "$version" ] ||
      die "the packaged chart's $field is not $version"
  done
  for f in "$d/nodelb-$version.yaml" "$d/nodelb-$version-hardened.yaml" "$d/nodelb-$version-cleanup.yaml"; do
    n="$(grep -c "image: nodelb/nodelb-agent:$version\$" "$f")" || true
    [ "$n" -ge 1 ] && ! grep "image: .*nodelb-agent" "$f" | grep -vq "nodelb/nodelb-agent:$version\$" ||
      die "$f does not name nodelb/nodelb-agent:$version throughout"
  done
  for arch in amd64 arm64; do
    f="$d/nodelb-agent-$version-linux-$arch.cdx.json"
    [ "$(jq -r .bomFormat "$f")" = CycloneDX ] || die "$f is not a CycloneDX document"
    [ "$(jq -r .metadata.component.name "$f")" = nodelb-agent ] &&
      [ "$(jq -r .metadata.component.version "$f")" = "$version" ] ||
      die "$f describes $(jq -r '.metadata.component.name + " " + .metadata.component.version' "$f")"
    n="$(jq '[.components[] | select(.purl | startswith("pkg:cargo/nftnl@"))] | length' "$f")"
    [ "$n" = 1 ] || die "$f does not list the nftnl crate once ($n)"
  done
  log "verified $d: checksums, version $version throughout, $platform, ELF machines"
}

work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
"$repo/scripts/packages.sh" jq binutils binutils-aarch64-linux-gnu skopeo
# The SBOM tool, built once into the cache.
cyclonedx="$tools/cargo-cyclonedx-$cyclonedx_version/bin/cargo-cyclonedx"
cyclonedx_build() {
  [ ! -x "$cyclonedx" ] || return 0
  log "building cargo-cyclonedx $cyclonedx_version into $tools (about 4 minutes on 2 cores)"
  cargo install --locked --quiet cargo-cyclonedx --version "$cyclonedx_version" \
    --root "$tools/cargo-cyclonedx-$cyclonedx_version" >&2
}
case "${1:-}" in
  "") ;;
  --verify) verify "${2:?--verify DIR}"; exit 0 ;;
  --tools) cyclonedx_build; "$(dirname "$0")/helm.sh" >/dev/null; exit 0 ;;
  -h | --help) sed -n '2,/^set -euo/{/^set -euo/d;s/^# \{0,1\}//;p}' "$0"; exit 0 ;;
  *) echo "usage: $0 [--verify DIR | --tools]" >&2; exit 2 ;;
esac
[ "$(id -u)" -eq 0 ] || die "run it as root (scripts/images.sh builds the image's root file systems)"
dist="${NODELB_DIST_DIR:-$repo/dist}"
start=$(date +%s)

# The binaries.
amd64="${NODELB_RELEASE_AGENT_BIN:-}"
if [ -z "$amd64" ]; then
  scripts/build-release.sh >&2
  amd64="${CARGO_TARGET_DIR:-$repo/target}/release/nodelb-agent"
fi
arm64="${NODELB_RELEASE_AGENT_BIN_ARM64:-}"
if [ -z "$arm64" ]; then
  arm64="$(scripts/arm64.sh --build-only | sed -n 's/^ARM64_AGENT=//p')"
fi
[ -x "$amd64" ] && [ -f "$arm64" ] || die "no agent binaries ($amd64, $arm64)"
says="$("$amd64" --version)"
[[ "$says" =~ ^nodelb-agent\ $version\ \(commit\ [0-9a-f]{12}\)$ ]] ||
  die "$amd64 says \"$says\": a release is built from a git checkout at version $version"

rm -rf "$dist"
mkdir -p "$dist"
strip --strip-debug -o "$dist/nodelb-agent-$version-linux-amd64" "$amd64"
aarch64-linux-gnu-strip --strip-debug -o "$dist/nodelb-agent-$version-linux-arm64" "$arm64"
log "binaries: $(stat -c %s "$dist/nodelb-agent-$version-linux-amd64") and $(stat -c %s "$dist/nodelb-agent-$version-linux-arm64") bytes"

# The image.
images="$(NODELB_IMAGE_AGENT_BIN="$amd64" NODELB_IMAGE_AGENT_BIN_ARM64="$arm64" \
  NODELB_IMAGE_AGENT_NAME="$image" scripts/images.sh)"
archive="$(sed -n 's/^AGENT_ARCHIVE=//p' <<<"$images")"
platforms="$(sed -n 's/^AGENT_PLATFORMS=//p' <<<"$images")"
[ -f "$archive" ] || die "scripts/images.sh made no agent archive: $images"
cp "$archive" "$dist/nodelb-agent-$version.oci.tar"
log "image $image: $platforms (uncompressed/compressed MiB/manifest)"

# The chart: its Chart.yaml says the version (a test keeps it the crate's).
helm="$(scripts/helm.sh)"
"$helm" package charts/nodelb --destination "$dist" >&2
[ -f "$dist/nodelb-$version.tgz" ] || die "helm package made no nodelb-$version.tgz: $(ls "$dist")"

# The manifests, rendered.
kubectl="$(scripts/kubernetes.sh)/kubectl"
"$kubectl" kustomize manifests >"$dist/nodelb-$version.yaml"
"$kubectl" kustomize manifests/hardened >"$dist/nodelb-$version-hardened.yaml"
"$kubectl" kustomize manifests/cleanup >"$dist/nodelb-$version-cleanup.yaml"

# The SBOMs: the agent's dependency graph for each target it ships for, from a copy of the
# workspace (cargo-cyclonedx writes next to every member's Cargo.toml).
cyclonedx_build
sbom_dir="$work/sbom"
mkdir -p "$sbom_dir"
cp -r Cargo.toml Cargo.lock agent core netfilter integration "$sbom_dir/"
for arch in amd64:x86_64-unknown-linux-gnu arm64:aarch64-unknown-linux-gnu; do
  rm -f "$sbom_dir/agent/sbom.json"
  (cd "$sbom_dir" && "$cyclonedx" cyclonedx --manifest-path agent/Cargo.toml --format json \
    --spec-version 1.5 --target "${arch#*:}" --no-build-deps --override-filename sbom >&2)
  [ -f "$sbom_dir/agent/sbom.json" ] || die "cargo-cyclonedx wrote no sbom.json for the agent"
  cp "$sbom_dir/agent/sbom.json" "$dist/nodelb-agent-$version-linux-${arch%%:*}.cdx.json"
done
cmp -s "$sbom_dir/Cargo.lock" Cargo.lock || die "cargo-cyclonedx changed Cargo.lock: it is not what the binaries were built from"

(cd "$dist" && sha256sum -- * >SHA256SUMS.new && mv SHA256SUMS.new SHA256SUMS)
verify "$dist"
crates="$(for arch in amd64 arm64; do
  echo "$arch $(jq '[.components[] | select(.purl | startswith("pkg:cargo/"))] | length' \
    "$dist/nodelb-agent-$version-linux-$arch.cdx.json")"
done | paste -sd, -)"
echo "release $version in $dist ($(($(date +%s) - start)) s): platforms $platforms; SBOM crates: $crates"
(cd "$dist" && ls -l --time-style=+ | awk 'NR > 1 {printf "  %-40s %12d bytes\n", $NF, $5}')
