#!/usr/bin/env bash
# Installs what nodelb builds and tests with on Debian/Ubuntu: libnftnl and libmnl headers for
# the netlink encoder, nftables (`nft`, the reference the tests compare against), iproute2
# (`ip netns`), etcd (the store of the real kube-apiserver the end-to-end tests run against),
# libfaketime (agents whose clock is off, for the liveness test) and socat (a host process
# listening on a node's port, for the host-listener tests). Runs apt-get only when
# something is missing. promtool (the monitoring test checks the alert rules with it) is
# unpacked from Debian's prometheus package into the cache, not installed: installing would
# start a Prometheus server on the machine. The kube-apiserver and the other Kubernetes
# components are scripts/kubernetes.sh's (needs Go): scripts/test.sh and scripts/demo.sh build
# them beside their Rust builds.
set -euo pipefail
packages=(libnftnl-dev libmnl-dev pkg-config nftables iproute2 gcc etcd-server faketime socat)
"$(dirname "$0")/packages.sh" "${packages[@]}"
cache="${XDG_CACHE_HOME:-$HOME/.cache}/nodelb"
if [ ! -x "$cache/promtool/usr/bin/promtool" ]; then
  echo "deps: unpacking promtool from Debian's prometheus package into $cache/promtool"
  tmp=$(mktemp -d)
  chmod 755 "$tmp" # apt-get download runs as _apt
  (cd "$tmp" && { apt-get download prometheus || { apt-get update && apt-get download prometheus; }; })
  rm -rf "$cache/promtool"
  mkdir -p "$cache"
  dpkg-deb -x "$tmp"/prometheus_*.deb "$cache/promtool"
  rm -rf "$tmp"
fi
command -v cargo >/dev/null || { echo "deps: cargo not found; install a Rust toolchain (rustup) first" >&2; exit 1; }
