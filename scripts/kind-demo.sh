#!/usr/bin/env bash
# tailguard on a local kind cluster, end to end. Needs docker, kind (0.22 or newer: Kubernetes
# 1.29+ for the CRD's CEL rules), kubectl, helm (3 or 4; scripts/install-helm.sh installs one)
# and curl. See docs/kind.md.
#
#   scripts/kind-demo.sh all          # every step below, then tear down (KEEP=1 keeps the cluster)
#   scripts/kind-demo.sh up           # cluster, images, metrics-server, Prometheus, adapter, chart
#   scripts/kind-demo.sh deploy       # kubectl apply -f examples/digits.yaml and wait until Ready
#   scripts/kind-demo.sh traffic      # port-forward the Service, send REQUESTS v2 infer requests
#   scripts/kind-demo.sh load         # DURATION seconds of parallel load from a pod in the cluster
#   scripts/kind-demo.sh rollback     # spec.traffic=fallback, wait for the switch, send traffic
#   scripts/kind-demo.sh rollforward  # spec.traffic=primary, wait, send traffic
#   scripts/kind-demo.sh status       # the InferenceService, its pods and HPAs
#   scripts/kind-demo.sh down         # delete the cluster
#
# DRY_RUN=1 prints the commands instead of running them (the chart tests use it to check that the
# script, the Dockerfiles, the chart and the examples agree).
set -euo pipefail

VERSION=0.1.0
CLUSTER=tailguard
RUNTIME_IMAGE=tailguard/runtime:$VERSION
OPERATOR_IMAGE=tailguard/operator:$VERSION
OPERATOR_NAMESPACE=tailguard-system
MONITORING_NAMESPACE=monitoring
PROMETHEUS_RELEASE=kps # kube-prometheus-stack, fullnameOverride=kps: Service kps-prometheus
ADAPTER_RULES=tailguard-adapter-rules
EXAMPLE=examples/digits.yaml
NAME=digits
NAMESPACE=default
LOCAL_PORT=${LOCAL_PORT:-8080}
REQUESTS=${REQUESTS:-200}
DURATION=${DURATION:-60}
TIMEOUT=${TIMEOUT:-600s}
# One 8x8 handwritten "0" from scikit-learn's digits set: a [1, 64] FP64 tensor.
REQUEST='{"inputs":[{"name":"input-0","shape":[1,64],"datatype":"FP64","data":[0,0,5,13,9,1,0,0,0,0,13,15,10,15,5,0,0,3,15,2,0,11,8,0,0,4,12,0,0,8,8,0,0,5,8,0,0,9,8,0,0,4,11,0,1,12,7,0,0,2,14,5,10,12,0,0,0,0,6,13,10,0,0,0]}]}'

cd "$(dirname "$0")/.."
DRY_RUN=${DRY_RUN:-}
PF_PID=

say() { printf '\n==> %s\n' "$*"; }

# Print a command, shell-quoted.
show() {
  printf '+'
  printf ' %q' "$@"
  printf '\n'
}

# Run a command, or only print it under DRY_RUN.
run() {
  show "$@"
  if [[ -z "$DRY_RUN" ]]; then "$@"; fi
}

# Print a command's output; under DRY_RUN print the command and answer with $1 instead.
capture() {
  local fake=$1
  shift
  if [[ -n "$DRY_RUN" ]]; then
    show "$@" >&2
    printf '%s\n' "$fake"
  else
    "$@"
  fi
}

stop_forward() {
  if [[ -n "$PF_PID" ]]; then
    kill "$PF_PID" 2>/dev/null || true
    wait "$PF_PID" 2>/dev/null || true
    PF_PID=
  fi
}
trap stop_forward EXIT

cmd_up() {
  say "kind cluster $CLUSTER"
  if [[ -z "$DRY_RUN" ]] && kind get clusters 2>/dev/null | grep -qx "$CLUSTER"; then
    echo "cluster $CLUSTER exists"
  else
    run kind create cluster --name "$CLUSTER" --config kind-config.yaml ${KIND_NODE_IMAGE:+--image "$KIND_NODE_IMAGE"}
  fi

  say "images (build context: the repository root)"
  run docker build -t "$RUNTIME_IMAGE" -f runtime/Dockerfile .
  run docker build -t "$OPERATOR_IMAGE" -f operator/Dockerfile .
  run kind load docker-image "$RUNTIME_IMAGE" --name "$CLUSTER"
  run kind load docker-image "$OPERATOR_IMAGE" --name "$CLUSTER"

  say "metrics-server (CPU metrics for the HPAs; kind's kubelets have self-signed certificates)"
  run helm repo add metrics-server https://kubernetes-sigs.github.io/metrics-server/ --force-update
  run helm repo add prometheus-community https://prometheus-community.github.io/helm-charts --force-update
  run helm upgrade --install metrics-server metrics-server/metrics-server --namespace kube-system \
    --set 'args={--kubelet-insecure-tls}' --wait --timeout "$TIMEOUT"

  say "Prometheus Operator, Prometheus and Grafana (kube-prometheus-stack)"
  # Select PodMonitors without the release label; let Grafana's sidecar read dashboards from
  # every namespace.
  run helm upgrade --install "$PROMETHEUS_RELEASE" prometheus-community/kube-prometheus-stack \
    --namespace "$MONITORING_NAMESPACE" --create-namespace \
    --set fullnameOverride="$PROMETHEUS_RELEASE" \
    --set alertmanager.enabled=false \
    --set prometheus.prometheusSpec.podMonitorSelectorNilUsesHelmValues=false \
    --set grafana.sidecar.dashboards.searchNamespace=ALL \
    --wait --timeout "$TIMEOUT"

  say "tailguard operator (its adapter rules go to $MONITORING_NAMESPACE, where the adapter runs)"
  run helm upgrade --install tailguard charts/tailguard \
    --namespace "$OPERATOR_NAMESPACE" --create-namespace \
    --set operator.image.repository="${OPERATOR_IMAGE%:*}" --set operator.image.tag="$VERSION" \
    --set runtime.image.repository="${RUNTIME_IMAGE%:*}" --set runtime.image.tag="$VERSION" \
    --set prometheusAdapter.rules.enabled=true \
    --set prometheusAdapter.rules.namespace="$MONITORING_NAMESPACE" \
    --set prometheusAdapter.rules.configMapName="$ADAPTER_RULES" \
    --set podMonitor.enabled=true \
    --set dashboard.enabled=true \
    --set dashboard.namespace="$MONITORING_NAMESPACE" \
    --wait --timeout "$TIMEOUT"

  say "prometheus-adapter with tailguard's rules (custom metric tailguard_queue_depth for the HPAs)"
  run helm upgrade --install prometheus-adapter prometheus-community/prometheus-adapter \
    --namespace "$MONITORING_NAMESPACE" \
    --set prometheus.url="http://$PROMETHEUS_RELEASE-prometheus.$MONITORING_NAMESPACE.svc" \
    --set prometheus.port=9090 \
    --set rules.existing="$ADAPTER_RULES" \
    --wait --timeout "$TIMEOUT"
}

cmd_deploy() {
  say "InferenceService $NAME"
  run kubectl apply -n "$NAMESPACE" -f "$EXAMPLE"
  run kubectl wait -n "$NAMESPACE" --for=condition=Ready "inferenceservice/$NAME" --timeout "$TIMEOUT"
  run kubectl get -n "$NAMESPACE" inferenceservice "$NAME"
}

# Port-forward the Service. A forward binds to one pod when it starts, so it is restarted after
# every traffic switch.
forward() {
  stop_forward
  local port
  port=$(capture 80 kubectl get -n "$NAMESPACE" service "$NAME" -o 'jsonpath={.spec.ports[0].port}')
  printf '+ %s\n' "kubectl port-forward -n $NAMESPACE service/$NAME $LOCAL_PORT:$port &"
  if [[ -n "$DRY_RUN" ]]; then return; fi
  kubectl port-forward -n "$NAMESPACE" "service/$NAME" "$LOCAL_PORT:$port" >/dev/null &
  PF_PID=$!
  local i
  for ((i = 0; i < 50; i++)); do
    if curl -fsS "http://127.0.0.1:$LOCAL_PORT/v2/health/ready" >/dev/null 2>&1; then return; fi
    sleep 0.2
  done
  echo "port-forward to service/$NAME did not become ready" >&2
  return 1
}

cmd_traffic() {
  forward
  local url="http://127.0.0.1:$LOCAL_PORT/v2/models/$NAME/infer"
  say "one request to $url"
  run curl -fsS -H 'Content-Type: application/json' --data "$REQUEST" "$url"
  echo
  say "$REQUESTS requests, count by HTTP status"
  printf '+ %s\n' "$REQUESTS x curl $url | sort | uniq -c"
  if [[ -z "$DRY_RUN" ]]; then
    local i
    for ((i = 0; i < REQUESTS; i++)); do
      curl -s -o /dev/null -w '%{http_code}\n' -H 'Content-Type: application/json' \
        --data "$REQUEST" "$url" || true
    done | sort | uniq -c
  fi
  stop_forward
}

cmd_load() {
  # Load from inside the cluster (a port-forward is too narrow to build a queue): 32 parallel
  # curl loops for DURATION seconds; watch the HPAs react on tailguard_queue_depth.
  local port
  port=$(capture 80 kubectl get -n "$NAMESPACE" service "$NAME" -o 'jsonpath={.spec.ports[0].port}')
  local url="http://$NAME.$NAMESPACE.svc:$port/v2/models/$NAME/infer"
  say "$DURATION s of load on $url"
  run kubectl run tailguard-load -n "$NAMESPACE" --rm -i --restart=Never --image=curlimages/curl \
    --command -- sh -c "end=\$((\$(date +%s) + $DURATION)); for w in \$(seq 32); do (while [ \$(date +%s) -lt \$end ]; do curl -s -o /dev/null -H 'Content-Type: application/json' --data '$REQUEST' $url; done) & done; wait"
  run kubectl get -n "$NAMESPACE" hpa -l "tailguard.dev/inferenceservice=$NAME"
}

switch_traffic() {
  local role=$1
  say "traffic -> $role"
  run kubectl patch -n "$NAMESPACE" inferenceservice "$NAME" --type merge -p "{\"spec\":{\"traffic\":\"$role\"}}"
  run kubectl wait -n "$NAMESPACE" --for="jsonpath={.status.activeModel}=$role" "inferenceservice/$NAME" --timeout "$TIMEOUT"
  run kubectl get -n "$NAMESPACE" inferenceservice "$NAME"
  cmd_traffic
}

cmd_rollback() { switch_traffic fallback; }
cmd_rollforward() { switch_traffic primary; }

cmd_status() {
  run kubectl get -n "$NAMESPACE" inferenceservice "$NAME" -o wide
  run kubectl get -n "$NAMESPACE" pods,hpa,pdb -l "tailguard.dev/inferenceservice=$NAME"
}

cmd_down() {
  say "delete cluster $CLUSTER"
  run kind delete cluster --name "$CLUSTER"
}

cmd_all() {
  cmd_up
  cmd_deploy
  cmd_traffic
  cmd_rollback
  cmd_rollforward
  cmd_status
  if [[ -n "${KEEP:-}" ]]; then
    echo "KEEP is set: the cluster stays; scripts/kind-demo.sh down removes it"
  else
    cmd_down
  fi
}

usage() { sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; }

case "${1:-help}" in
  up | deploy | traffic | load | rollback | rollforward | status | down | all) "cmd_$1" ;;
  help | -h | --help) usage ;;
  *)
    usage >&2
    exit 2
    ;;
esac
