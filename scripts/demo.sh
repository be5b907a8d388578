#!/usr/bin/env bash
# The demo: nodelb on a real two-node cluster. Brings up scripts/cluster.sh's cluster (building
# what is missing: the Kubernetes components, the release agent, the images), installs nodelb
# from its image with `kubectl apply -k` the way users do, creates a two-replica Deployment and a
# LoadBalancer Service, and shows:
#   kubectl get svc              the node addresses nodelb publishes as EXTERNAL-IP
#   kubectl describe svc         nodelb's Serving condition and Events
#   nft list table ip nodelb     what the agent programmed on a node
#   a client request             answered by a pod, through each node's address
# The cluster stays up; the last line says how to take it down. Run as root. The first run on a
# machine builds everything and takes a while, later runs are quick (how long each takes:
# docs/benchmarks.md, "Build, demo and test times").
set -euo pipefail
cd "$(dirname "$0")/.."
began=$SECONDS
scripts/deps.sh
# The Kubernetes components (minutes the first time on a machine) build beside the agent.
scripts/kubernetes.sh >/dev/null &
kubernetes=$!
if [ -z "${NODELB_IMAGE_AGENT_BIN:-}" ]; then
  scripts/build-release.sh
fi
wait "$kubernetes" || { echo "demo: scripts/kubernetes.sh failed (its error is above)" >&2; exit 1; }
env_lines="$(scripts/cluster.sh up)"
kubeconfig="$(sed -n 's/^KUBECONFIG=//p' <<<"$env_lines")"
nodes="$(sed -n 's/^NODES=//p' <<<"$env_lines")"
client="$(sed -n 's/^CLIENT_NETNS=//p' <<<"$env_lines")"
images="$(scripts/images.sh)"
agent_image="$(sed -n 's/^AGENT_IMAGE=//p' <<<"$images")"
backend_image="$(sed -n 's/^BACKEND_IMAGE=//p' <<<"$images")"
kubectl() { "$(scripts/kubernetes.sh)/kubectl" --kubeconfig="$kubeconfig" "$@"; }
show() {
  echo
  echo "\$ $*"
}

# nodelb from its image: a kustomization of our own over manifests/, naming the image.
demo="$(dirname "$kubeconfig")/demo"
mkdir -p "$demo"
cat >"$demo/kustomization.yaml" <<EOF
resources: [$(realpath --relative-to="$demo" manifests)]
images:
  - {name: nodelb/nodelb-agent, newName: ${agent_image%:*}, newTag: ${agent_image##*:}}
EOF
show kubectl apply -k "$demo"
kubectl apply -k "$demo"
kubectl -n nodelb-system rollout status ds/nodelb-agent --timeout=180s

kubectl apply -f - >/dev/null <<EOF
apiVersion: v1
kind: Namespace
metadata: {name: demo}
---
apiVersion: apps/v1
kind: Deployment
metadata: {name: web, namespace: demo}
spec:
  replicas: 2
  selector: {matchLabels: {app: web}}
  template:
    metadata: {labels: {app: web}}
    spec:
      containers:
        - name: backend
          image: $backend_image
          imagePullPolicy: IfNotPresent
          command: ["/nodelb-test-backend"]
          env: [{name: POD_NAME, valueFrom: {fieldRef: {fieldPath: metadata.name}}}]
          readinessProbe: {tcpSocket: {port: 8080}, periodSeconds: 1}
---
apiVersion: v1
kind: Service
metadata: {name: web, namespace: demo}
spec:
  type: LoadBalancer
  selector: {app: web}
  ports: [{name: http, port: 80, targetPort: 8080}]
EOF
kubectl -n demo rollout status deploy/web --timeout=120s >/dev/null
want="$(tr ',' '\n' <<<"$nodes" | cut -d= -f2 | sort | paste -sd,)"
for _ in $(seq 300); do
  got="$(kubectl -n demo get svc web -o jsonpath='{.status.loadBalancer.ingress[*].ip}' | tr ' ' '\n' | sort | paste -sd,)"
  [ "$got" = "$want" ] && break
  sleep 0.2
done

show kubectl -n demo get svc web
kubectl -n demo get svc web
show kubectl -n demo describe svc web
kubectl -n demo describe svc web
first_node="${nodes%%=*}"
show ip netns exec "nodelb-$first_node" nft list table ip nodelb
ip netns exec "nodelb-$first_node" nft list table ip nodelb
for pair in ${nodes//,/ }; do
  addr="${pair#*=}"
  show ip netns exec "$client" socat -T 3 - "TCP:$addr:80" "  # a client request through ${pair%%=*}"
  ip netns exec "$client" socat -T 3 - "TCP:$addr:80" </dev/null
done
echo
echo "demo: done in $((SECONDS - began)) s. The cluster stays up: KUBECONFIG=$kubeconfig kubectl get svc -A;"
echo "demo: take it down with: scripts/cluster.sh down"
