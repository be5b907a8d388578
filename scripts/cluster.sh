#!/usr/bin/env bash
# A real two-node Kubernetes cluster on one machine, for nodelb's real-cluster tests and demo.
#
#   scripts/cluster.sh up                     start it (idempotent), print KUBECONFIG=, NODES=, CLIENT_NETNS=
#   scripts/cluster.sh down                   remove every process, namespace, mount, cgroup and file it made
#   scripts/cluster.sh env                    print the three lines of a running cluster
#   scripts/cluster.sh status                 exit 0 when every process of the cluster runs
#   scripts/cluster.sh kubelet stop|start N   stop or start node N's kubelet (its containers keep running)
#   scripts/cluster.sh kube-proxy-mode M      restart every node's kube-proxy in mode M (nftables, iptables)
#   scripts/cluster.sh partition N on|off     drop, silently, every packet node N sends to the API server's
#                                             in-cluster address (pods' and agents' API connections; the
#                                             kubelet's and kube-proxy's keep theirs)
#   scripts/cluster.sh kwok up N              N simulated nodes (kwok), Ready, beside the real two; print
#                                             KWOK_NODES=, KWOK_SELECTOR= (see "Simulated nodes" below)
#   scripts/cluster.sh kwok down              remove the simulated nodes, their pods and Leases, and kwok
#   scripts/cluster.sh restart etcd|kube-apiserver
#                                             stop one control-plane process (SIGTERM) and start it again
#   scripts/cluster.sh restart containerd N   the same for node N's containerd (its containers keep
#                                             running, as with a node's `systemctl restart containerd`)
#   scripts/cluster.sh link N down|up         take node N's network link down, or up with its routes
#   scripts/cluster.sh peers up|down|env      MetalLB (L2, its own manifests) beside nodelb, answering to
#                                             Services of class nodelb.test/metallb, with a pool on the
#                                             nodes' network, and the client's routes to it and to the
#                                             pods (scripts/peers.sh compares them); prints
#                                             METALLB_CLASS=, METALLB_POOL=
#   scripts/cluster.sh import ARCHIVE         `ctr -n k8s.io images import` an OCI archive (as
#                                             scripts/images.sh and scripts/release.sh write them)
#                                             into every node's containerd, as an operator without
#                                             a registry loads an image onto each node
#
# What runs (all built from the pinned k8s.io/kubernetes module by scripts/kubernetes.sh, etcd,
# containerd, runc and the CNI plugins from Debian):
#   nodelb-cp      etcd, kube-apiserver (192.0.2.2:6443, and 192.0.2.3:6443 for in-cluster
#                  clients), kube-controller-manager, kube-scheduler
#   nodelb-node-a  containerd, kubelet and kube-proxy of node-a (192.0.2.11, zone-a)
#   nodelb-node-b  the same for node-b (192.0.2.12, zone-b)
#   nodelb-client  a client (203.0.113.10) that reaches the two node addresses and nothing else
#   nodelb-lan     the switch (bridge lan0, 192.0.2.1/24) and the client's router (203.0.113.1)
# Each is a network namespace of its own; nothing is added to the machine's own network
# namespace or firewall. The one thing in the machine's namespace is a relay (socat) listening
# on 127.0.0.1:<port> (the first free port from 16443) that passes the admin's TLS connections
# through a unix socket to the API server, so kubectl and the tests reach it.
#
# Each node's containerd and kubelet share a mount namespace of their own (made with unshare)
# holding a private /run (containerd's state, runc's root, the shims' sockets, the pods' network
# namespaces), a private /var/lib (libcni's cache in /var/lib/cni and the kubelet's device
# plugins in /var/lib/kubelet are fixed paths; the cluster's own directory is bound back into
# it), a private /var/log (pod logs), the node's own /sys, and read-only copies of the
# kernel settings the kubelet would otherwise set on the whole machine (vm.overcommit_memory,
# kernel.panic, kernel.panic_on_oops, ...): the kubelet sees the values it wants and writes
# nothing. Each node has its own cgroup root (/nodelb-cluster-<node> in every hierarchy), its own
# containerd root, socket and CNI configuration, and its own kubelet root directory.
#
# Addresses (documentation ranges only; no namespace has a default route):
#   192.0.2.0/24       the nodes' network: lan .1, control plane .2 and .3, node-a .11, node-b .12
#                      (.3 is the API server's advertised address, the endpoint of the `kubernetes`
#                      Service that pods reach at its ClusterIP; the kubelets, kube-proxy and the
#                      controllers use .2, so `partition` can cut one path and not the other)
#   198.51.100.0/25    node-a's pods (bridge cni0, hairpin mode on, as flannel configures it)
#   198.51.100.128/25  node-b's pods; each node routes the other's pods via the other node
#   203.0.113.0/24     the client's network: lan .1, client .10
#   198.18.0.0/16      Service ClusterIPs (198.18.0.0/15 is reserved for benchmarks): only
#                      kube-proxy's DNAT inside the nodes ever sees them
# Pods get routes to these ranges through their node, not a default route. The kubelet writes
# pods an empty resolv.conf: no name lookup leaves the machine.
#
# Images: scripts/images.sh builds the pause, backend and nodelb-agent images offline (no
# registry is reachable) and `up` imports them into each node's containerd with
# `ctr images import`. Set NODELB_IMAGE_AGENT_BIN to choose the agent binary the image carries
# (by default target/release/nodelb-agent, built when missing).
#
# Simulated nodes (`kwok up N`): kwok (scripts/kwok.sh builds it from the pinned module in
# integration/kwok/) runs in the control plane's namespace against the real kube-apiserver,
# with a client certificate of its own (user nodelb-kwok, group system:masters), and plays
# the kubelet of the Nodes labelled kwok.x-k8s.io/node=fake: it makes them Ready, renews their
# Leases in kube-node-lease every 10 s (a 40 s Lease, as the kubelet's), and makes the pods
# the real scheduler binds to them Running and Ready, with the stages of its module (plus one
# of ours: a Running pod marked not ready, by the node lifecycle controller when a renewal was
# late, is ready again 2 s later, as a live kubelet's next status sync makes it). The nodes
# are kwok-00000, kwok-00001, ..., labelled nodelb.io/kwok=true and nodelb.io/pool=p<i / 10>
# (NODELB_KWOK_POOL_SIZE nodes a pool), tainted kwok.x-k8s.io/node=fake:NoSchedule (only
# pods that tolerate every taint, as nodelb's DaemonSet does, land there), with an InternalIP
# from 198.19.1.0 up (198.19.0.0/16, reserved for benchmarks and routed nowhere: no packet
# ever goes to a simulated node; their pods' addresses, for pods without the host's network,
# come from 198.19.255.0/24). Removing a node's kwok.x-k8s.io/node label takes it out of
# kwok's hands: its Lease stops being renewed, as a dead node's.
#
# State lives in $NODELB_CLUSTER_DIR (default /var/lib/nodelb-cluster): certificates,
# kubeconfigs, logs, each node's containerd root and kubelet root. `down` deletes it.
set -euo pipefail
repo="$(cd "$(dirname "$0")/.." && pwd)"
dir="${NODELB_CLUSTER_DIR:-/var/lib/nodelb-cluster}"
nodes=(node-a node-b)
declare -A node_ip=([node-a]=192.0.2.11 [node-b]=192.0.2.12)
declare -A node_zone=([node-a]=zone-a [node-b]=zone-b)
declare -A pod_cidr=([node-a]=198.51.100.0/25 [node-b]=198.51.100.128/25)
declare -A pod_gw=([node-a]=198.51.100.1 [node-b]=198.51.100.129)
cp_ip=192.0.2.2
# The address kube-apiserver advertises: the `kubernetes` Service's endpoint, what in-cluster
# clients (nodelb's agents among them) reach through the ClusterIP.
cp_service_ip=192.0.2.3
lan_ip=192.0.2.1
client_ip=203.0.113.10
client_gw=203.0.113.1
cluster_cidr=198.51.100.0/24
service_cidr=198.18.0.0/16
kubernetes_service_ip=198.18.0.1
api_port=6443
# How long a node's kubelet may be silent before the node lifecycle controller marks it and its
# pods not ready (upstream's default is 50 s; shorter here so the tests wait less).
node_monitor_grace=20s
ns_lan=nodelb-lan
ns_cp=nodelb-cp
ns_client=nodelb-client
packages=(etcd-server containerd runc containernetworking-plugins iptables nftables iproute2 socat openssl curl
  mmdebstrap busybox-static gcc libc6-dev)

log() { echo "cluster: $*" >&2; }
die() {
  echo "cluster: $*" >&2
  exit 1
}
node_ns() { echo "nodelb-$1"; }
cgroup_root() { echo "nodelb-cluster-$1"; }

deps() { "$repo/scripts/packages.sh" "${packages[@]}"; }

# put FILE: writes stdin to FILE only when it differs, by renaming a new file over it. kube-proxy
# exits when its configuration file changes, and a running cluster's `up` writes the same files
# again.
put() {
  local tmp="$1.new"
  cat >"$tmp"
  if cmp -s "$tmp" "$1"; then
    rm -f "$tmp"
  else
    mv "$tmp" "$1"
  fi
}

# --- processes -------------------------------------------------------------------------------
alive() { [ -f "$dir/pids/$1" ] && kill -0 "$(cat "$dir/pids/$1")" 2>/dev/null; }

# start NAME COMMAND...: runs COMMAND in a session of its own with its output in logs/NAME.log
# and its pid in pids/NAME. COMMAND must exec the process in place (ip netns exec, nsenter and
# unshare do), so the recorded pid is the process's own.
start() {
  local name="$1"
  shift
  alive "$name" && return 0
  mkdir -p "$dir/pids" "$dir/logs"
  setsid "$@" </dev/null >>"$dir/logs/$name.log" 2>&1 &
  echo $! >"$dir/pids/$name"
}

# stop NAME: SIGTERM, then SIGKILL after 10 s.
stop() {
  local name="$1" pid i
  [ -f "$dir/pids/$name" ] || return 0
  pid="$(cat "$dir/pids/$name")"
  if kill -0 "$pid" 2>/dev/null; then
    kill -TERM "$pid" 2>/dev/null || true
    for i in $(seq 100); do
      kill -0 "$pid" 2>/dev/null || break
      sleep 0.1
    done
    kill -KILL "$pid" 2>/dev/null || true
  fi
  rm -f "$dir/pids/$name"
}

# wait_for WHAT SECONDS COMMAND...: until COMMAND succeeds.
wait_for() {
  local what="$1" seconds="$2" i
  shift 2
  for i in $(seq $((seconds * 5))); do
    "$@" >/dev/null 2>&1 && return 0
    sleep 0.2
  done
  die "$what: not ready after ${seconds} s"
}

# --- network ---------------------------------------------------------------------------------
have_ns() { ip netns list | awk '{print $1}' | grep -qx "$1"; }

netns_add() {
  have_ns "$1" && return 0
  ip netns add "$1"
  ip -n "$1" link set lo up
  # New namespaces inherit the machine's IPv4 settings; set what each needs here.
  ip netns exec "$1" sysctl -qw net.ipv4.ip_forward="$2"
}

# lan_port NS IFNAME ADDRESS: a veth from NS into the lan bridge.
lan_port() {
  local ns="$1" ifname="$2" addr="$3" peer="l-${1#nodelb-}"
  ip -n "$ns" link show "$ifname" >/dev/null 2>&1 && return 0
  ip -n "$ns" link add "$ifname" type veth peer name "$peer" netns "$ns_lan"
  ip -n "$ns_lan" link set "$peer" master lan0 up
  ip -n "$ns" addr add "$addr/24" dev "$ifname"
  ip -n "$ns" link set "$ifname" up
}

network() {
  netns_add "$ns_lan" 1
  if ! ip -n "$ns_lan" link show lan0 >/dev/null 2>&1; then
    ip -n "$ns_lan" link add lan0 type bridge
    ip -n "$ns_lan" addr add "$lan_ip/24" dev lan0
    ip -n "$ns_lan" link set lan0 up
  fi
  netns_add "$ns_cp" 0
  lan_port "$ns_cp" eth0 "$cp_ip"
  ip -n "$ns_cp" addr replace "$cp_service_ip/24" dev eth0
  local n other
  for n in "${nodes[@]}"; do
    netns_add "$(node_ns "$n")" 1
    lan_port "$(node_ns "$n")" eth0 "${node_ip[$n]}"
    ip -n "$ns_cp" route replace "${pod_cidr[$n]}" via "${node_ip[$n]}"
    ip -n "$(node_ns "$n")" route replace 203.0.113.0/24 via "$lan_ip"
    # Connections to a ClusterIP need a route before kube-proxy's DNAT rewrites them (a real
    # node has its default route); nothing there answers if kube-proxy does not.
    ip -n "$(node_ns "$n")" route replace "$service_cidr" via "$lan_ip"
    for other in "${nodes[@]}"; do
      [ "$other" = "$n" ] && continue
      ip -n "$(node_ns "$n")" route replace "${pod_cidr[$other]}" via "${node_ip[$other]}"
    done
  done
  netns_add "$ns_client" 0
  if ! ip -n "$ns_client" link show eth0 >/dev/null 2>&1; then
    ip -n "$ns_client" link add eth0 type veth peer name client0 netns "$ns_lan"
    ip -n "$ns_lan" addr add "$client_gw/24" dev client0
    ip -n "$ns_lan" link set client0 up
    ip -n "$ns_client" addr add "$client_ip/24" dev eth0
    ip -n "$ns_client" link set eth0 up
  fi
  # The client reaches the nodes' addresses and nothing else.
  for n in "${nodes[@]}"; do
    ip -n "$ns_client" route replace "${node_ip[$n]}/32" via "$client_gw"
  done
}

# --- certificates and kubeconfigs ------------------------------------------------------------
pki() {
  local p="$dir/pki"
  [ -f "$p/done" ] && return 0
  mkdir -p "$p"
  (
    cd "$p"
    openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -days 3650 \
      -subj "/CN=nodelb test cluster CA" -keyout ca.key -out ca.crt 2>/dev/null
    cert() { # cert NAME SUBJECT [SAN]
      openssl req -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -subj "$2" \
        -keyout "$1.key" -out "$1.csr" 2>/dev/null
      openssl x509 -req -in "$1.csr" -CA ca.crt -CAkey ca.key -CAcreateserial -days 3650 \
        ${3:+-extfile <(printf 'subjectAltName=%s\n' "$3")} -out "$1.crt" 2>/dev/null
      rm "$1.csr"
    }
    cert apiserver "/CN=kube-apiserver" \
      "DNS:kubernetes,DNS:kubernetes.default,DNS:kubernetes.default.svc,DNS:localhost,IP:127.0.0.1,IP:$cp_ip,IP:$cp_service_ip,IP:$kubernetes_service_ip"
    # The API server's client certificate toward the kubelets (logs, exec, port-forward).
    cert kubelet-client "/O=system:masters/CN=kube-apiserver-kubelet-client"
    openssl ecparam -name prime256v1 -genkey -noout -out sa.key 2>/dev/null
    openssl ec -in sa.key -pubout -out sa.pub 2>/dev/null
    # Static tokens: token,user,uid,"groups".
    {
      echo "$(openssl rand -hex 16),nodelb-cluster-admin,nodelb-cluster-admin,\"system:masters\""
      echo "$(openssl rand -hex 16),system:kube-controller-manager,system:kube-controller-manager"
      echo "$(openssl rand -hex 16),system:kube-scheduler,system:kube-scheduler"
      echo "$(openssl rand -hex 16),system:kube-proxy,system:kube-proxy"
      for n in "${nodes[@]}"; do
        echo "$(openssl rand -hex 16),system:node:$n,system:node:$n,\"system:nodes\""
      done
    } >tokens.csv
    chmod 600 ./*.key tokens.csv
  )
  touch "$p/done"
}

token_of() { awk -F, -v u="$1" '$2 == u {print $1}' "$dir/pki/tokens.csv"; }

# kubeconfig FILE SERVER USER
kubeconfig() {
  put "$1" <<EOF
apiVersion: v1
kind: Config
clusters:
- name: nodelb-cluster
  cluster:
    server: $2
    certificate-authority-data: $(base64 -w0 "$dir/pki/ca.crt")
users:
- name: $3
  user:
    token: $(token_of "$3")
contexts:
- name: nodelb-cluster
  context: {cluster: nodelb-cluster, user: $3}
current-context: nodelb-cluster
EOF
  chmod 600 "$1"
}

# --- control plane ---------------------------------------------------------------------------
relay_port() {
  if [ -f "$dir/relay-port" ] && alive relay; then
    cat "$dir/relay-port"
    return
  fi
  local p
  for p in $(seq 16443 16543); do
    if [ -z "$(ss -Hltn "sport = :$p")" ]; then
      echo "$p" >"$dir/relay-port"
      echo "$p"
      return
    fi
  done
  die "no free port in 16443-16543 on 127.0.0.1 for the API relay"
}

control_plane() {
  local k="$bins" p="$dir/pki" api="https://$cp_ip:$api_port"
  mkdir -p "$dir/etcd"
  start etcd ip netns exec "$ns_cp" etcd --name=nodelb-cluster --data-dir="$dir/etcd" \
    --listen-client-urls=http://127.0.0.1:2379 --advertise-client-urls=http://127.0.0.1:2379 \
    --listen-peer-urls=http://127.0.0.1:2380 --initial-advertise-peer-urls=http://127.0.0.1:2380 \
    --initial-cluster=nodelb-cluster=http://127.0.0.1:2380 --listen-metrics-urls= \
    --log-level=warn --logger=zap
  # Every request of nodelb's ServiceAccounts, whatever its verb (get, list and watch too)
  # (and of MetalLB's and kube-proxy's, which scripts/peers.sh compares), and every write of
  # anyone else, at Metadata (who asked for what, when), nothing else: the
  # real-cluster tests count nodelb's requests at steady state from it (issue 38's request
  # budget) and read the kubelets' node Lease renewals.
  put "$dir/audit-policy.yaml" <<EOF
apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: [RequestReceived]
rules:
  - level: Metadata
    userGroups: [system:serviceaccounts:nodelb-system]
  # MetalLB's and kube-proxy's every request too, for scripts/peers.sh's cost rows.
  - level: Metadata
    userGroups: [system:serviceaccounts:metallb-system]
  - level: Metadata
    users: [system:kube-proxy]
  - level: Metadata
    verbs: [create, update, patch, delete, deletecollection]
  - level: None
EOF
  # WatchList=false: Debian's etcd 3.4.23 lacks the progress notifications (RequestWatchProgress)
  # a watch-list stream needs, and with WatchList on (Beta, default true in 1.36) the server
  # turns every watch from resourceVersion "" or "0" that asks for bookmarks into one and
  # answers it with an error at once. client-go's reflectors that watch from "0" (kwok's)
  # then never hold a watch: their caches move only by relists, tens of seconds apart, and
  # kwok's Lease renewals, written over its cache, fail with 409 half the time. The
  # Kubernetes components and nodelb's agents watch from a list's resourceVersion and see
  # no difference.
  # --enable-aggregator-routing: the server calls admission webhooks (MetalLB's, `peers up`) at
  # their pods' addresses, which this namespace routes to the nodes, rather than at their
  # ClusterIP, which only a kube-proxy would translate and none runs here.
  start kube-apiserver ip netns exec "$ns_cp" "$k/kube-apiserver" \
    --enable-aggregator-routing=true \
    --etcd-servers=http://127.0.0.1:2379 --bind-address=0.0.0.0 --secure-port="$api_port" \
    --advertise-address="$cp_service_ip" --tls-cert-file="$p/apiserver.crt" \
    --tls-private-key-file="$p/apiserver.key" --client-ca-file="$p/ca.crt" \
    --token-auth-file="$p/tokens.csv" --authorization-mode=Node,RBAC \
    --enable-admission-plugins=NodeRestriction --allow-privileged=true \
    --service-account-issuer=https://kubernetes.default.svc \
    --service-account-key-file="$p/sa.pub" --service-account-signing-key-file="$p/sa.key" \
    --service-cluster-ip-range="$service_cidr" \
    --kubelet-client-certificate="$p/kubelet-client.crt" \
    --kubelet-client-key="$p/kubelet-client.key" \
    --kubelet-preferred-address-types=InternalIP \
    --profiling=false --cert-dir="$dir/apiserver-certs" --v=1 \
    --feature-gates=WatchList=false \
    --audit-policy-file="$dir/audit-policy.yaml" --audit-log-path="$dir/audit.log" \
    --audit-log-mode=blocking --audit-log-maxsize=0 --audit-log-maxbackup=0
  # The admin's way in from the machine's own namespace: TCP on loopback -> unix socket ->
  # the API server, bytes only (TLS end to end).
  local port
  port="$(relay_port)"
  start relay-cp ip netns exec "$ns_cp" socat "UNIX-LISTEN:$dir/api.sock,fork,unlink-early" \
    "TCP:$cp_ip:$api_port"
  start relay socat "TCP-LISTEN:$port,bind=127.0.0.1,fork,reuseaddr" "UNIX-CONNECT:$dir/api.sock"
  kubeconfig "$dir/admin.kubeconfig" "https://127.0.0.1:$port" nodelb-cluster-admin
  kubeconfig "$dir/controller-manager.kubeconfig" "$api" system:kube-controller-manager
  kubeconfig "$dir/scheduler.kubeconfig" "$api" system:kube-scheduler
  kubeconfig "$dir/kube-proxy.kubeconfig" "$api" system:kube-proxy
  wait_for kube-apiserver 120 kubectl get --raw /readyz
  local cm="$dir/controller-manager.kubeconfig" sc="$dir/scheduler.kubeconfig"
  start kube-controller-manager ip netns exec "$ns_cp" "$k/kube-controller-manager" \
    --kubeconfig="$cm" --authentication-kubeconfig="$cm" --authorization-kubeconfig="$cm" \
    --use-service-account-credentials=true --service-account-private-key-file="$p/sa.key" \
    --root-ca-file="$p/ca.crt" --leader-elect=false --bind-address=127.0.0.1 \
    --node-monitor-grace-period="$node_monitor_grace" --profiling=false --v=1
  start kube-scheduler ip netns exec "$ns_cp" "$k/kube-scheduler" \
    --kubeconfig="$sc" --authentication-kubeconfig="$sc" --authorization-kubeconfig="$sc" \
    --leader-elect=false --bind-address=127.0.0.1 --profiling=false --v=1
}

kubectl() { "$bins/kubectl" --kubeconfig="$dir/admin.kubeconfig" "$@"; }

# --- nodes -----------------------------------------------------------------------------------
# Kernel settings the kubelet checks and, unless they already hold, writes machine-wide
# (pkg/kubelet/cm/container_manager_linux.go, setupKernelTunables). The node's mount namespace
# shows it these values instead of the machine's.
kubelet_sysctls=(vm/overcommit_memory=1 vm/panic_on_oom=0 kernel/panic=10 kernel/panic_on_oops=1
  kernel/keys/root_maxkeys=1000000 kernel/keys/root_maxbytes=25000000)

node_files() {
  local n="$1" nd="$dir/$1"
  mkdir -p "$nd/containerd" "$nd/cni/net.d" "$nd/cni/ipam" "$nd/kubelet" "$nd/var-log" \
    "$nd/sysctl" "$nd/mnt"
  : >"$dir/resolv.conf"
  put "$nd/containerd/config.toml" <<EOF
version = 2
root = "$nd/containerd/root"
state = "/run/containerd"
oom_score = 0
# /opt/containerd would be made on the machine; the snapshotters other than overlayfs are
# not used.
disabled_plugins = ["io.containerd.internal.v1.opt", "io.containerd.snapshotter.v1.aufs",
  "io.containerd.snapshotter.v1.btrfs", "io.containerd.snapshotter.v1.devmapper",
  "io.containerd.snapshotter.v1.zfs"]
[grpc]
  address = "$nd/containerd.sock"
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "$pause_image"
  # No CAP_SYS_RESOURCE here: without this runc fails with "can't get final child's PID
  # from pipe" when it lowers a container's oom_score_adj.
  restrict_oom_score_adj = true
  netns_mounts_under_state_dir = true
  stream_server_address = "127.0.0.1"
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "/usr/lib/cni"
    conf_dir = "$nd/cni/net.d"
  [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
    runtime_type = "io.containerd.runc.v2"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
      SystemdCgroup = false
EOF
  put "$nd/cni/net.d/10-pods.conflist" <<EOF
{
  "cniVersion": "0.4.0",
  "name": "nodelb-pods",
  "plugins": [
    {
      "type": "bridge",
      "bridge": "cni0",
      "isGateway": true,
      "hairpinMode": true,
      "ipMasq": false,
      "ipam": {
        "type": "host-local",
        "dataDir": "$nd/cni/ipam",
        "ranges": [[{"subnet": "${pod_cidr[$n]}", "gateway": "${pod_gw[$n]}"}]],
        "routes": [{"dst": "192.0.2.0/24"}, {"dst": "203.0.113.0/24"},
                   {"dst": "$cluster_cidr"}, {"dst": "$service_cidr"}]
      }
    },
    {"type": "portmap", "capabilities": {"portMappings": true}}
  ]
}
EOF
  put "$nd/kubelet/config.yaml" <<EOF
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
containerRuntimeEndpoint: unix://$nd/containerd.sock
cgroupDriver: cgroupfs
cgroupRoot: /$(cgroup_root "$n")
# The machine mounts cgroup v1, and containerd 1.6 lacks the RuntimeConfig call.
failCgroupV1: false
failSwapOn: false
address: ${node_ip[$n]}
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
authentication:
  anonymous: {enabled: false}
  webhook: {enabled: true}
  x509: {clientCAFile: $dir/pki/ca.crt}
authorization: {mode: Webhook}
resolvConf: $dir/resolv.conf
oomScoreAdj: 0
serializeImagePulls: false
# The disk is the machine's, shared with everything else on it: evict only when it is
# nearly full.
evictionHard: {memory.available: 100Mi, nodefs.available: 1%, imagefs.available: 1%}
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
nodeStatusReportFrequency: 10s
EOF
  kubeconfig "$nd/kubelet.kubeconfig" "https://$cp_ip:$api_port" "system:node:$n"
  kube_proxy_config "$n"
}

kube_proxy_config() {
  local n="$1" nd="$dir/$1"
  put "$nd/kube-proxy.yaml" <<EOF
apiVersion: kubeproxy.config.k8s.io/v1alpha1
kind: KubeProxyConfiguration
mode: ${proxy_mode}
clientConnection: {kubeconfig: $dir/kube-proxy.kubeconfig}
hostnameOverride: $n
clusterCIDR: $cluster_cidr
metricsBindAddress: 127.0.0.1:10249
# Inside a network namespace: nf_conntrack_max is read-only there, and kube-proxy may not
# lower its own oom_score_adj without CAP_SYS_RESOURCE.
oomScoreAdj: 0
conntrack:
  maxPerCore: 0
  min: 0
  tcpEstablishedTimeout: 0s
  tcpCloseWaitTimeout: 0s
EOF
}

# The node's mount namespace, then containerd in it (see the header).
node_mounts_script() {
  local n="$1" nd="$dir/$1" s m=""
  for s in "${kubelet_sysctls[@]}"; do
    local f="${s%%=*}"
    m+="echo ${s#*=} >$nd/sysctl/${f//\//.}; mount --bind -o ro $nd/sysctl/${f//\//.} /proc/sys/$f; "
  done
  cat <<EOF
set -e
mount --make-rprivate /
mount --rbind /sys/fs/cgroup $nd/mnt
umount -l /sys
mount -t sysfs sysfs /sys
mount --rbind $nd/mnt /sys/fs/cgroup
umount -l $nd/mnt
mount -t tmpfs -o mode=755 tmpfs /run
mkdir /run/cluster-dir
mount --rbind $dir /run/cluster-dir
mount -t tmpfs -o mode=755 tmpfs /var/lib
mkdir -p $dir
mount --rbind /run/cluster-dir $dir
umount -l /run/cluster-dir
rmdir /run/cluster-dir
mount --bind $nd/var-log /var/log
$m
echo \$\$ >$dir/pids/containerd-$n
exec containerd --config $nd/containerd/config.toml
EOF
}

cgroups_make() {
  local h
  for h in /sys/fs/cgroup/*/; do
    [ "$(basename "$h")" = unified ] && continue
    mkdir -p "$h$(cgroup_root "$1")"
  done
}

# image_import N ARCHIVE: imports the OCI archive into node N's containerd, unpacked for the
# kubelet.
image_import() {
  ctr --address "$dir/$1/containerd.sock" -n k8s.io images import --no-unpack=false "$2" >/dev/null
}

node_up() {
  local n="$1" nd="$dir/$1" ns
  ns="$(node_ns "$n")"
  node_files "$n"
  cgroups_make "$n"
  if ! alive "containerd-$n"; then
    mkdir -p "$dir/pids" "$dir/logs"
    setsid nsenter --net="/run/netns/$ns" -- unshare --mount --propagation private -- \
      sh -c "$(node_mounts_script "$n")" </dev/null >>"$dir/logs/containerd-$n.log" 2>&1 &
    wait_for "containerd of $n" 30 ctr --address "$nd/containerd.sock" version
  fi
  local img
  for img in "${images[@]}"; do
    local name="${img%%=*}" file="${img#*=}"
    if ! ctr --address "$nd/containerd.sock" -n k8s.io images check "name==$name" 2>/dev/null |
      grep -q "$name"; then
      image_import "$n" "$file"
    fi
  done
  kubelet_start "$n"
  start "kube-proxy-$n" ip netns exec "$ns" "$bins/kube-proxy" --config="$nd/kube-proxy.yaml" --v=1
}

# containerd_restart N: stops node N's containerd and starts it again in the same mount
# namespace (the kubelet's, which it shares).
containerd_restart() {
  local n="$1" nd="$dir/$1" holder
  alive "kubelet-$n" || die "node $n's kubelet is not running: its mount namespace is containerd's"
  holder="$(cat "$dir/pids/kubelet-$n")"
  stop "containerd-$n"
  start "containerd-$n" nsenter --target "$holder" --mount --net -- \
    containerd --config "$nd/containerd/config.toml"
  wait_for "containerd of $n" 30 ctr --address "$nd/containerd.sock" version
}

kubelet_start() {
  local n="$1" nd="$dir/$1"
  alive "kubelet-$n" && return 0
  start "kubelet-$n" nsenter --target "$(cat "$dir/pids/containerd-$n")" --mount --net -- \
    "$bins/kubelet" --config="$nd/kubelet/config.yaml" --kubeconfig="$nd/kubelet.kubeconfig" \
    --hostname-override="$n" --node-ip="${node_ip[$n]}" --root-dir="$nd/kubelet" \
    --cert-dir="$nd/kubelet/pki" --node-labels="topology.kubernetes.io/zone=${node_zone[$n]}" \
    --v=1
}

# images_load: builds (or finds) the images; sets pause_image and images (name=archive ...).
images_load() {
  local out kind name archive
  images=()
  out="$("$repo/scripts/images.sh")"
  for kind in PAUSE BACKEND AGENT; do
    name="$(sed -n "s/^${kind}_IMAGE=//p" <<<"$out")"
    archive="$(sed -n "s/^${kind}_ARCHIVE=//p" <<<"$out")"
    [ -n "$name" ] && [ -f "$archive" ] || die "scripts/images.sh gave no $kind image: $out"
    images+=("$name=$archive")
    if [ "$kind" = PAUSE ]; then pause_image="$name"; fi
  done
}

print_env() {
  local list="" n
  for n in "${nodes[@]}"; do list+="${list:+,}$n=${node_ip[$n]}"; done
  echo "KUBECONFIG=$dir/admin.kubeconfig"
  echo "NODES=$list"
  echo "CLIENT_NETNS=$ns_client"
  echo "AUDIT_LOG=$dir/audit.log"
}

up() {
  local began=$SECONDS
  deps
  bins="$("$repo/scripts/kubernetes.sh")"
  images_load
  mkdir -p "$dir"
  proxy_mode="$(cat "$dir/kube-proxy-mode" 2>/dev/null || echo nftables)"
  network
  pki
  control_plane
  local n
  for n in "${nodes[@]}"; do node_up "$n"; done
  for n in "${nodes[@]}"; do
    wait_for "node $n Ready" 120 sh -c \
      "\"$bins/kubectl\" --kubeconfig=$dir/admin.kubeconfig get node $n \
        -o jsonpath='{.status.conditions[?(@.type==\"Ready\")].status}' | grep -qx True"
  done
  log "up in $((SECONDS - began)) s"
  print_env
}

# --- simulated nodes (kwok) ------------------------------------------------------------------
# Every simulated node carries this label (what `kwok down` removes) ...
kwok_label=nodelb.io/kwok
# ... and, while kwok plays its kubelet, this one (kwok manages the Nodes it selects).
kwok_manage=kwok.x-k8s.io/node

# kwok_node NAME ADDRESS POOL: one Node of a List.
kwok_node() {
  cat <<EOF
- apiVersion: v1
  kind: Node
  metadata:
    name: $1
    labels: {$kwok_label: "true", $kwok_manage: fake, nodelb.io/pool: $3, type: kwok,
      kubernetes.io/hostname: $1, kubernetes.io/os: linux, kubernetes.io/arch: amd64}
    annotations: {node.alpha.kubernetes.io/ttl: "0"}
  spec:
    taints: [{key: $kwok_manage, value: fake, effect: NoSchedule}]
  status:
    addresses: [{type: InternalIP, address: $2}, {type: Hostname, address: $1}]
EOF
}

# kwok_nodes INDEX...: a List of those simulated nodes. Node i is kwok-<i, 5 digits>, in pool
# p<i / pool size>, at 198.19.0.0 + 256 + i.
kwok_nodes() {
  local i k name pool_size="${NODELB_KWOK_POOL_SIZE:-10}"
  printf 'apiVersion: v1\nkind: List\nitems:\n'
  for i in "$@"; do
    printf -v name 'kwok-%05d' "$i"
    k=$((i + 256))
    kwok_node "$name" "198.19.$((k >> 8)).$((k & 255))" "p$((i / pool_size))"
  done
}

# kwok_files STAGES: kwok's client certificate, kubeconfig and configuration.
kwok_files() {
  local p="$dir/pki"
  if [ ! -f "$p/kwok.crt" ]; then
    openssl req -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes \
      -subj "/O=system:masters/CN=nodelb-kwok" -keyout "$p/kwok.key" -out "$p/kwok.csr" 2>/dev/null
    openssl x509 -req -in "$p/kwok.csr" -CA "$p/ca.crt" -CAkey "$p/ca.key" -CAcreateserial \
      -days 3650 -out "$p/kwok.crt" 2>/dev/null
    rm "$p/kwok.csr"
    chmod 600 "$p/kwok.key"
  fi
  put "$dir/kwok.kubeconfig" <<EOF
apiVersion: v1
kind: Config
clusters:
- name: nodelb-cluster
  cluster: {server: "https://$cp_ip:$api_port", certificate-authority: $p/ca.crt}
users:
- name: nodelb-kwok
  user: {client-certificate: $p/kwok.crt, client-key: $p/kwok.key}
contexts:
- name: nodelb-cluster
  context: {cluster: nodelb-cluster, user: nodelb-kwok}
current-context: nodelb-cluster
EOF
  {
    cat <<EOF
apiVersion: config.kwok.x-k8s.io/v1alpha1
kind: KwokConfiguration
options:
  manageNodesWithLabelSelector: $kwok_manage=fake
  cidr: 198.19.255.0/24
  # As the kubelet's: a 40 s Lease, renewed every 10 s (kwok renews every quarter).
  nodeLeaseDurationSeconds: 40
  nodeLeaseParallelism: 16
  # A configuration file gets none of the flags' defaults: kwok's own, but for the Leases.
  podPlayStageParallelism: 4
  nodePlayStageParallelism: 4
  podsOnNodeSyncParallelism: 1
  enablePodsOnNodeSyncListPager: true
  enablePodsOnNodeSyncStreamWatch: false
EOF
    cat "$1"
    cat <<'EOF'
---
# Ours, not the module's: a Running pod that is not ready (the node lifecycle controller marks
# every pod of a node whose Lease renewal came too late not ready) is ready again 2 s later,
# as a live kubelet's next status sync makes it.
apiVersion: kwok.x-k8s.io/v1alpha1
kind: Stage
metadata:
  name: pod-ready-again
spec:
  resourceRef:
    apiGroup: v1
    kind: Pod
  selector:
    matchExpressions:
    - key: '.metadata.deletionTimestamp'
      operator: 'DoesNotExist'
    - key: '.status.phase'
      operator: 'In'
      values:
      - 'Running'
    - key: '.status.conditions.[] | select( .type == "Ready" ) | .status'
      operator: 'NotIn'
      values:
      - 'True'
  delay:
    durationMilliseconds: 2000
  next:
    statusTemplate: |
      {{ $now := Now }}
      conditions:
      - lastTransitionTime: {{ $now | Quote }}
        status: "True"
        type: Ready
      - lastTransitionTime: {{ $now | Quote }}
        status: "True"
        type: ContainersReady
EOF
  } | put "$dir/kwok.yaml"
}

# kwok_count_ready: how many simulated nodes are Ready.
kwok_count_ready() {
  kubectl get nodes -l "$kwok_label" -o \
    jsonpath='{range .items[*]}{.status.conditions[?(@.type=="Ready")].status}{"\n"}{end}' |
    grep -c '^True$' || true
}

# kwok_parallel COMMAND...: runs COMMAND with each chunk of 125 words of stdin appended, six
# at a time; fails when one of them failed.
kwok_parallel() {
  xargs -r -n 125 -P 6 "$@"
}

kwok_up() {
  local n="${1:-}" began=$SECONDS kwok i name ready=0
  [[ "$n" =~ ^[0-9]+$ ]] && [ "$n" -le 65000 ] || die "usage: $0 kwok up N (N <= 65000)"
  alive kube-apiserver || die "the cluster is not up: run $0 up first"
  bins="$("$repo/scripts/kubernetes.sh")"
  kwok="$("$repo/scripts/kwok.sh")"
  kwok_files "$(dirname "$kwok")/stages.yaml"
  # At its default level kwok logs every renewal: 100 lines a second at 1,000 nodes.
  start kwok ip netns exec "$ns_cp" "$kwok" --kubeconfig="$dir/kwok.kubeconfig" \
    --config="$dir/kwok.yaml" --v=WARN
  # The nodes not there yet, 125 a List, six kubectl at a time.
  local -A have=()
  for name in $(kubectl get nodes -l "$kwok_label" -o jsonpath='{.items[*].metadata.name}'); do
    have[$name]=1
  done
  local missing=()
  for ((i = 0; i < n; i++)); do
    printf -v name 'kwok-%05d' "$i"
    [ -n "${have[$name]:-}" ] || missing+=("$i")
  done
  export -f kwok_nodes kwok_node kubectl
  export kwok_label kwok_manage bins dir
  printf '%s\n' "${missing[@]}" | kwok_parallel bash -c \
    'set -euo pipefail; kwok_nodes "$@" | kubectl create -f - >/dev/null' kwok-nodes ||
    die "creating simulated nodes failed"
  log "kwok: ${#missing[@]} nodes created in $((SECONDS - began)) s"
  for i in $(seq $((60 + n / 10))); do
    ready="$(kwok_count_ready)"
    [ "$ready" -ge "$n" ] && break
    alive kwok || die "kwok exited: see $dir/logs/kwok.log"
    sleep 2
  done
  [ "$ready" -ge "$n" ] || die "only $ready of $n simulated nodes Ready after $((SECONDS - began)) s"
  log "kwok: $ready simulated nodes Ready in $((SECONDS - began)) s"
  echo "KWOK_NODES=$ready"
  echo "KWOK_SELECTOR=$kwok_label=true"
}

# kwok_down: kwok stopped, then the simulated Nodes, the pods bound to them (at once: no
# kubelet will confirm their end), their Leases in kube-node-lease and the heartbeat Leases
# nodelb's tests wrote for them (labelled nodelb.io/kwok=true, as the Nodes); then kwok's files.
kwok_down() {
  local began=$SECONDS ns n not_real
  stop kwok
  if alive kube-apiserver; then
    bins="$("$repo/scripts/kubernetes.sh")"
    export -f kubectl
    export bins dir
    kubectl delete --raw "/api/v1/nodes?labelSelector=$kwok_label%3Dtrue" >/dev/null
    log "kwok: down: nodes after $((SECONDS - began)) s"
    # Their pods, in one request a namespace: every pod bound to a node that is not a real one.
    not_real="spec.nodeName!="
    for n in "${nodes[@]}"; do not_real+=",spec.nodeName!=$n"; done
    for ns in $(kubectl get pods -A -o \
      jsonpath='{range .items[*]}{.metadata.namespace} {.spec.nodeName}{"\n"}{end}' |
      awk '$2 ~ /^kwok-/ {print $1}' | sort -u); do
      kubectl delete --raw "/api/v1/namespaces/$ns/pods?gracePeriodSeconds=0&fieldSelector=$not_real" >/dev/null
    done
    log "kwok: down: pods after $((SECONDS - began)) s"
    # Their node Leases, which kwok made owned by the Nodes: deleted now rather than left to
    # the garbage collector, so a later `kwok up` finds none; one by one (there is no label to
    # select them by), 16 kubectl processes of 25 at a time.
    kubectl -n kube-node-lease get leases -o name | { grep '/kwok-' || true; } |
      xargs -r -n 25 -P 16 bash -c 'kubectl -n kube-node-lease delete --wait=false --ignore-not-found "$@" >/dev/null' x
    # The heartbeat Leases nodelb's tests wrote for them carry their label.
    for ns in $(kubectl get leases -A -l "$kwok_label=true" -o \
      jsonpath='{range .items[*]}{.metadata.namespace}{"\n"}{end}' | sort -u); do
      kubectl delete --raw "/apis/coordination.k8s.io/v1/namespaces/$ns/leases?labelSelector=$kwok_label%3Dtrue" >/dev/null
    done
  fi
  rm -f "$dir/kwok.yaml" "$dir/kwok.kubeconfig" "$dir/pki/kwok.crt" "$dir/pki/kwok.key"
  log "kwok: down in $((SECONDS - began)) s"
}

# --- down ------------------------------------------------------------------------------------
kill_netns_processes() {
  local ns="$1" pids
  have_ns "$ns" || return 0
  pids="$(ip netns pids "$ns" 2>/dev/null || true)"
  [ -n "$pids" ] && kill -KILL $pids 2>/dev/null || true
}

kill_cgroup_processes() {
  local root="$1" pids
  pids="$(find "/sys/fs/cgroup/pids/$root" -name cgroup.procs -exec cat {} + 2>/dev/null || true)"
  [ -n "$pids" ] && kill -KILL $pids 2>/dev/null || true
}

down() {
  local n f
  for n in "${nodes[@]}"; do
    stop "kube-proxy-$n"
    stop "kubelet-$n"
  done
  # Containers (in the nodes' cgroups), shims and host-network containers (in the nodes'
  # network namespaces), then containerd.
  for n in "${nodes[@]}"; do
    kill_cgroup_processes "$(cgroup_root "$n")"
    kill_netns_processes "$(node_ns "$n")"
    stop "containerd-$n"
  done
  for f in kwok kube-scheduler kube-controller-manager kube-apiserver etcd relay relay-cp; do stop "$f"; done
  kill_netns_processes "$ns_cp"
  sleep 0.5
  for n in "${nodes[@]}"; do
    kill_cgroup_processes "$(cgroup_root "$n")"
    local h
    for h in /sys/fs/cgroup/*/; do
      [ -d "$h$(cgroup_root "$n")" ] || continue
      find "$h$(cgroup_root "$n")" -depth -type d -exec rmdir {} + 2>/dev/null ||
        find "$h$(cgroup_root "$n")" -depth -type d -exec rmdir {} \;
    done
  done
  for f in "$ns_client" "${nodes[@]/#/nodelb-}" "$ns_cp" "$ns_lan"; do
    have_ns "$f" && ip netns del "$f"
  done
  if [ -d "$dir" ]; then
    # Mounts of the nodes lived in their own mount namespaces; none is left in ours.
    grep -q " $dir" /proc/self/mountinfo && die "mounts under $dir remain: $(grep " $dir" /proc/self/mountinfo)"
    rm -rf "$dir"
  fi
  log "down"
}

# --- peers: MetalLB beside nodelb, for scripts/peers.sh -----------------------------------
# MetalLB v<module> (scripts/metallb.sh builds it) from its own native manifest, in L2 mode:
# its images are scripts/images.sh's builds of its binaries, imported into every node; its
# controller and speaker answer only to Services of class $metallb_class (MetalLB's
# --lb-class), so nodelb (which takes class-less Services by default) and MetalLB never both
# serve one Service. Its pool: $metallb_pool, on the nodes' network, which the LAN namespace
# reaches as a router would (it ARPs for the address and the speaker of the node that holds it
# answers). For the comparison's direct path, the client also gets a route to the pods (the LAN
# namespace routes each node's pod range to that node); `peers down` takes all of it away.
metallb_class=nodelb.test/metallb
metallb_pool=192.0.2.192/28
metallb_manifest() {
  local mdir="$1" controller="$2" speaker="$3"
  # The images, and --lb-class after each component's --port (its first argument).
  sed -e "s#image: quay.io/metallb/controller:.*#image: $controller#" \
    -e "s#image: quay.io/metallb/speaker:.*#image: $speaker#" \
    -e "s#^\(  *\)- --port=7472\$#&\n\1- --lb-class=$metallb_class#" \
    "$mdir/metallb-native.yaml"
}
peers_routes() {
  local verb="$1" n
  ip -n "$ns_client" route "$verb" "$metallb_pool" via "$client_gw"
  ip -n "$ns_client" route "$verb" "$cluster_cidr" via "$client_gw"
  for n in "${nodes[@]}"; do
    ip -n "$ns_lan" route "$verb" "${pod_cidr[$n]}" via "${node_ip[$n]}"
  done
}
peers_up() {
  status || die "the cluster is not running (scripts/cluster.sh up)"
  bins="$("$repo/scripts/kubernetes.sh")"
  local mdir out controller speaker kind archive n began=$SECONDS
  mdir="$("$repo/scripts/metallb.sh")"
  out="$(NODELB_IMAGE_METALLB_DIR="$mdir" "$repo/scripts/images.sh")"
  for kind in CONTROLLER SPEAKER; do
    archive="$(sed -n "s/^METALLB_${kind}_ARCHIVE=//p" <<<"$out")"
    [ -f "$archive" ] || die "scripts/images.sh gave no MetalLB ${kind,,} image: $out"
    for n in "${nodes[@]}"; do image_import "$n" "$archive"; done
  done
  controller="$(sed -n 's/^METALLB_CONTROLLER_IMAGE=//p' <<<"$out")"
  speaker="$(sed -n 's/^METALLB_SPEAKER_IMAGE=//p' <<<"$out")"
  metallb_manifest "$mdir" "$controller" "$speaker" >"$dir/metallb-native.yaml"
  kubectl apply -f "$dir/metallb-native.yaml" >/dev/null
  kubectl -n metallb-system rollout status deploy/controller --timeout=180s >/dev/null
  kubectl -n metallb-system rollout status ds/speaker --timeout=180s >/dev/null
  # Its webhook serves once the controller has made its certificate: until then the pool is
  # refused.
  local pool
  pool="apiVersion: metallb.io/v1beta1
kind: IPAddressPool
metadata: {name: nodelb-peers, namespace: metallb-system}
spec: {addresses: [$metallb_pool]}
---
apiVersion: metallb.io/v1beta1
kind: L2Advertisement
metadata: {name: nodelb-peers, namespace: metallb-system}
spec: {ipAddressPools: [nodelb-peers]}"
  wait_for "MetalLB's webhook taking the address pool" 120 sh -c \
    "printf '%s\n' \"\$1\" | \"$bins/kubectl\" --kubeconfig=$dir/admin.kubeconfig apply -f -" sh "$pool"
  peers_routes replace
  touch "$dir/peers"
  log "MetalLB $(cat "$mdir/version") up in $((SECONDS - began)) s"
  peers_env
}
peers_env() {
  echo "METALLB_CLASS=$metallb_class"
  echo "METALLB_POOL=$metallb_pool"
}
peers_down() {
  bins="$("$repo/scripts/kubernetes.sh")"
  [ -f "$dir/metallb-native.yaml" ] &&
    kubectl delete --ignore-not-found --wait=true -f "$dir/metallb-native.yaml" >/dev/null
  rm -f "$dir/metallb-native.yaml"
  if have_ns "$ns_client"; then peers_routes del 2>/dev/null || true; fi
  rm -f "$dir/peers"
  log "MetalLB down"
}

# status: every process `up` starts is running.
status() {
  local name
  for name in etcd kube-apiserver kube-controller-manager kube-scheduler relay relay-cp \
    "${nodes[@]/#/containerd-}" "${nodes[@]/#/kubelet-}" "${nodes[@]/#/kube-proxy-}"; do
    alive "$name" || return 1
  done
}

case "${1:-}" in
  up) up ;;
  down) down ;;
  env) print_env ;;
  status) status ;;
  kubelet)
    bins="$("$repo/scripts/kubernetes.sh")"
    case "${2:-}" in
      stop) stop "kubelet-${3:?node}" ;;
      start) kubelet_start "${3:?node}" ;;
      *) die "usage: $0 kubelet stop|start NODE" ;;
    esac
    ;;
  partition)
    # A silent black hole (no RST, no ICMP) between node N and the API server's in-cluster
    # address: a routing rule of the control plane's namespace discards whatever the server
    # sends from that address to the node (its SYN-ACKs, data and ACKs), so the node's
    # connections through the `kubernetes` ClusterIP hear nothing back. Routing policy, not
    # netfilter: nothing is added to any table.
    node="${2:?node}"
    [ -n "${node_ip[$node]:-}" ] || die "no node $node"
    rule=(from "$cp_service_ip" to "${node_ip[$node]}" blackhole)
    case "${3:-}" in
      on) ip -n "$ns_cp" rule show | grep -q "from $cp_service_ip to ${node_ip[$node]} blackhole" ||
        ip -n "$ns_cp" rule add "${rule[@]}" ;;
      off) while ip -n "$ns_cp" rule del "${rule[@]}" 2>/dev/null; do :; done ;;
      *) die "usage: $0 partition NODE on|off" ;;
    esac
    ;;
  kwok)
    case "${2:-}" in
      up) kwok_up "${3:-}" ;;
      down) kwok_down ;;
      *) die "usage: $0 kwok up N | kwok down" ;;
    esac
    ;;
  restart)
    bins="$("$repo/scripts/kubernetes.sh")"
    case "${2:-}" in
      etcd | kube-apiserver)
        stop "$2"
        control_plane
        ;;
      containerd) containerd_restart "${3:?node}" ;;
      *) die "usage: $0 restart etcd|kube-apiserver | restart containerd NODE" ;;
    esac
    ;;
  link)
    node="${2:?node}"
    [ -n "${node_ip[$node]:-}" ] || die "no node $node"
    case "${3:-}" in
      down) ip -n "$(node_ns "$node")" link set eth0 down ;;
      # Link down took the routes through it; put them back, as a node's network manager does.
      up)
        ip -n "$(node_ns "$node")" link set eth0 up
        network
        ;;
      *) die "usage: $0 link NODE down|up" ;;
    esac
    ;;
  import)
    archive="${2:?usage: $0 import ARCHIVE}"
    [ -f "$archive" ] || die "no $archive"
    for n in "${nodes[@]}"; do
      image_import "$n" "$archive" || die "importing $archive into $n's containerd failed"
      echo "imported $archive into $n" >&2
    done
    ;;
  peers)
    case "${2:-}" in
      up) peers_up ;;
      down) peers_down ;;
      env) peers_env ;;
      *) die "usage: $0 peers up|down|env" ;;
    esac
    ;;
  kube-proxy-mode)
    bins="$("$repo/scripts/kubernetes.sh")"
    proxy_mode="${2:?mode: nftables or iptables}"
    echo "$proxy_mode" >"$dir/kube-proxy-mode"
    for n in "${nodes[@]}"; do
      stop "kube-proxy-$n"
      kube_proxy_config "$n"
      start "kube-proxy-$n" ip netns exec "$(node_ns "$n")" "$bins/kube-proxy" \
        --config="$dir/$n/kube-proxy.yaml" --v=1
    done
    ;;
  *)
    sed -n '2,29p' "$0" >&2
    exit 2
    ;;
esac
