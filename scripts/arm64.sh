#!/usr/bin/env bash
# scripts/arm64.sh: the agent for arm64 (aarch64-unknown-linux-gnu), built on this x86_64
# machine and run on an arm64 kernel, as root. Groundwork for issue 41; CI does not run it yet.
#
#   1. Builds the release agent for aarch64, linking Debian's arm64 libnftnl and libmnl from a
#      sysroot: their packages are fetched with apt-get download into the cache with an apt
#      state of its own (the machine's apt lists and architectures are left as they are).
#   2. Under qemu-aarch64-static, called directly (no binfmt registration): `--version`, and
#      `render` of a 1,000-Service file, which must print the same script as the x86_64 agent.
#      qemu's user mode opens NETLINK_ROUTE sockets only: NETLINK_NETFILTER and
#      NETLINK_SOCK_DIAG fail with EPROTONOSUPPORT (qemu 7.2), so `check` and `apply` cannot
#      reach the host kernel's nf_tables from there; this prints what `check` says under it.
#   3. So `check`, `apply` of that file and `cleanup` run on a real arm64 kernel instead:
#      Debian's linux-image-arm64 booted by qemu-system-aarch64 (software emulation, one CPU)
#      from an initramfs of busybox, the agent, its libraries and the netfilter modules.
#
# Prints `arm64 <step> seconds=S ...` lines and exits non-zero when a step fails.
# Cache: ${XDG_CACHE_HOME:-$HOME/.cache}/nodelb/arm64/.
set -euo pipefail
repo="$(cd "$(dirname "$0")/.." && pwd)"
cd "$repo"
[ "$(id -u)" -eq 0 ] || { echo "arm64: run it as root (apt-get, and the VM's initramfs)" >&2; exit 2; }
cache="${XDG_CACHE_HOME:-$HOME/.cache}/nodelb/arm64"
target=aarch64-unknown-linux-gnu
services=1000
endpoints=5
mkdir -p "$cache"
step() { echo "arm64 $1 seconds=$(($(date +%s) - $2))${3:+ $3}"; }

# Host tools: the cross linker, both qemus, cpio for the initramfs, depmod for its modules.
# Without recommends: binfmt-support would register qemu with the kernel for foreign binaries,
# which changes the machine; qemu is called by name here instead.
host_tools=(gcc-aarch64-linux-gnu qemu-user-static qemu-system-arm cpio kmod)
missing=()
for p in "${host_tools[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ "${#missing[@]}" -gt 0 ]; then
  apt-get update >&2
  DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends "${missing[@]}" >&2
fi
[ ! -e /proc/sys/fs/binfmt_misc/qemu-aarch64 ] ||
  echo "arm64: note: qemu-aarch64 is registered with binfmt_misc on this machine (not by this script)" >&2
rustup target list --installed | grep -qx "$target" || rustup target add "$target"

# The arm64 packages, with an apt state of their own.
apt_dir="$cache/apt"
mkdir -p "$apt_dir/state/lists/partial" "$apt_dir/cache/archives/partial" "$cache/debs"
apt_opts=(-o "Dir::State=$apt_dir/state" -o "Dir::State::status=/dev/null"
  -o "Dir::Cache=$apt_dir/cache" -o APT::Architecture=arm64 -o APT::Architectures::=arm64)
packages=(libnftnl-dev libnftnl11 libmnl-dev libmnl0 libc6 libgcc-s1 busybox-static)
if [ ! -e "$cache/debs/.complete" ]; then
  began=$(date +%s)
  apt-get "${apt_opts[@]}" update >/dev/null
  kernel_pkg="$(apt-cache "${apt_opts[@]}" depends linux-image-arm64 |
    awk '/Depends: linux-image-[0-9]/ {print $2; exit}')"
  [ -n "$kernel_pkg" ] || { echo "arm64: no linux-image-arm64 dependency found" >&2; exit 1; }
  chmod 777 "$cache/debs" # apt-get download runs as _apt
  (cd "$cache/debs" && apt-get "${apt_opts[@]}" download "${packages[@]}" "$kernel_pkg" >/dev/null)
  touch "$cache/debs/.complete"
  step fetch "$began" "kernel=$kernel_pkg"
fi
sysroot="$cache/sysroot"
if [ ! -d "$sysroot" ]; then
  mkdir -p "$sysroot.new"
  for d in "$cache"/debs/*.deb; do dpkg-deb -x "$d" "$sysroot.new"; done
  mv "$sysroot.new" "$sysroot"
fi
libdir="$sysroot/usr/lib/aarch64-linux-gnu"

# 1. The build.
began=$(date +%s)
env LIBNFTNL_LIB_DIR="$libdir" LIBMNL_LIB_DIR="$libdir" \
  CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_LINKER=aarch64-linux-gnu-gcc \
  CC_aarch64_unknown_linux_gnu=aarch64-linux-gnu-gcc AR_aarch64_unknown_linux_gnu=aarch64-linux-gnu-ar \
  cargo build --release --locked -p nodelb-agent --target "$target"
bin="${CARGO_TARGET_DIR:-$repo/target}/$target/release/nodelb-agent"
machine="$(readelf -h "$bin" | awk -F: '/Machine:/ {gsub(/^ +/, "", $2); print $2}')"
[ "$machine" = "AArch64" ] || { echo "arm64: $bin is for $machine, not AArch64" >&2; exit 1; }
step build "$began" "elf=$machine bytes=$(stat -c %s "$bin")"

# The objects: n LoadBalancer Services with their EndpointSlices, as the apply bench makes them.
objects="$cache/objects.yaml"
for ((i = 0; i < services; i++)); do
  printf -- '---\napiVersion: v1\nkind: Service\nmetadata: {name: svc-%d, namespace: bench, uid: u-%d, creationTimestamp: "2024-01-01T00:00:00Z"}\nspec:\n  type: LoadBalancer\n  ports: [{name: http, port: %d, protocol: TCP, targetPort: 8080}]\n' "$i" "$i" $((1024 + i))
  printf -- '---\napiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata:\n  name: svc-%d-1\n  namespace: bench\n  labels: {kubernetes.io/service-name: svc-%d}\naddressType: IPv4\nports: [{name: http, port: 8080, protocol: TCP}]\nendpoints:\n' "$i" "$i"
  for ((e = 0; e < endpoints; e++)); do
    printf -- '- addresses: [198.51.100.%d]\n  conditions: {ready: true, serving: true, terminating: false}\n' $(((i * endpoints + e) % 250 + 2))
  done
done >"$objects"
node_args=(--node-name bench-node --node-address 203.0.113.1 --reserved-ports=)

# 2. Under qemu's user mode.
qemu=(qemu-aarch64-static -L "$sysroot")
began=$(date +%s)
"${qemu[@]}" "$bin" --version
"${qemu[@]}" "$bin" render -f "$objects" "${node_args[@]}" >"$cache/render.arm64.nft" 2>"$cache/render.arm64.log"
host_bin="${NODELB_HOST_AGENT_BIN:-$repo/target/release/nodelb-agent}"
[ -x "$host_bin" ] || scripts/build-release.sh
"$host_bin" render -f "$objects" "${node_args[@]}" >"$cache/render.x86_64.nft" 2>"$cache/render.x86_64.log"
cmp "$cache/render.arm64.nft" "$cache/render.x86_64.nft" ||
  { echo "arm64: the arm64 and x86_64 agents render different scripts" >&2; exit 1; }
step qemu-user-render "$began" "services=$services lines=$(wc -l <"$cache/render.arm64.nft") same-as-x86_64=yes"
# In a network namespace of its own, so nothing here could touch the machine's tables.
check_user="$(unshare --net -- "${qemu[@]}" "$bin" check 2>&1 || true)"
echo "$check_user" | sed 's/^/  qemu-user check: /'

# 3. On an arm64 kernel, in a VM.
root="$(mktemp -d)"
trap 'rm -rf "$root"' EXIT
kernel="$(ls "$sysroot"/boot/vmlinuz-* | head -1)"
kver="${kernel##*/vmlinuz-}"
mkdir -p "$root"/{bin,sbin,usr/bin,usr/sbin,proc,sys,dev,tmp,lib/aarch64-linux-gnu,lib/modules/"$kver"/kernel}
cp "$sysroot/bin/busybox" "$root/bin/"
cp -a "$sysroot"/lib/aarch64-linux-gnu/. "$sysroot"/usr/lib/aarch64-linux-gnu/. "$root/lib/aarch64-linux-gnu/"
ln -s aarch64-linux-gnu/ld-linux-aarch64.so.1 "$root/lib/ld-linux-aarch64.so.1"
for d in net/netfilter net/ipv4/netfilter net/ipv6/netfilter lib crypto arch; do
  mkdir -p "$root/lib/modules/$kver/kernel/$d"
  cp -r "$sysroot/lib/modules/$kver/kernel/$d/." "$root/lib/modules/$kver/kernel/$d/"
done
cp "$sysroot/lib/modules/$kver"/modules.{builtin,builtin.modinfo,order} "$root/lib/modules/$kver/"
depmod -b "$root" "$kver"
cp "$bin" "$root/nodelb-agent"
cp "$objects" "$root/objects.yaml"
cat >"$root/init" <<EOF
#!/bin/busybox sh
/bin/busybox --install -s
mount -t proc proc /proc; mount -t sysfs sys /sys; mount -t devtmpfs dev /dev
echo "vm: kernel \$(uname -r) \$(uname -m)"
for m in crc32c_generic nf_tables nft_chain_nat nft_nat nft_ct nft_numgen nft_masq nft_reject_inet \
    nft_hash nft_objref nft_limit nf_conntrack_netlink nft_fib_ipv4; do
  modprobe \$m || echo "vm: modprobe \$m failed"
done
ip link set lo up
sysctl -w net.ipv4.ip_forward=1 >/dev/null
s=\$(date +%s)
/nodelb-agent check; echo "vm: check exit \$?"
/nodelb-agent apply -f /objects.yaml ${node_args[*]}; echo "vm: apply exit \$?"
/nodelb-agent apply -f /objects.yaml ${node_args[*]}; echo "vm: apply-again exit \$?"
/nodelb-agent cleanup; echo "vm: cleanup exit \$?"
echo "vm: agent steps took \$((\$(date +%s) - s)) s"
poweroff -f
EOF
chmod +x "$root/init"
(cd "$root" && find . | cpio -o -H newc 2>/dev/null | gzip -1) >"$cache/initrd.gz"
began=$(date +%s)
timeout 900 qemu-system-aarch64 -M virt -cpu cortex-a57 -smp 1 -m 1024 -nographic -no-reboot \
  -kernel "$kernel" -initrd "$cache/initrd.gz" -append "console=ttyAMA0 rdinit=/init quiet panic=-1" \
  </dev/null >"$cache/vm.log" 2>&1 || true
grep -v '^\[' "$cache/vm.log" | grep -v '^$' | sed 's/^/  /'
for s in check apply apply-again cleanup; do
  grep -q "^vm: $s exit 0" "$cache/vm.log" || { echo "arm64: $s failed in the VM ($cache/vm.log)" >&2; exit 1; }
done
step vm "$began" "kernel=$kver services=$services"
