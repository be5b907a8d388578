#!/usr/bin/env bash
# Installs what nodelb builds and tests with on Debian/Ubuntu: libnftnl and libmnl headers for
# the netlink encoder, nftables (`nft`, the reference the tests compare against), iproute2
# (`ip netns`) and etcd (the store of the real kube-apiserver the end-to-end tests run
# against). Runs apt-get only when something is missing. Then builds that kube-apiserver once
# per machine (scripts/kube-apiserver.sh; needs Go).
set -euo pipefail
packages=(libnftnl-dev libmnl-dev pkg-config nftables iproute2 gcc etcd-server)
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ "${#missing[@]}" -gt 0 ]; then
  echo "deps: installing ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update
  apt-get install -y "${missing[@]}"
fi
command -v cargo >/dev/null || { echo "deps: cargo not found; install a Rust toolchain (rustup) first" >&2; exit 1; }
"$(dirname "$0")/kube-apiserver.sh" >/dev/null
