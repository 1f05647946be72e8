#!/usr/bin/env bash
# tailguard on a local kind cluster, end to end. Needs docker, kind (0.22 or newer: Kubernetes
# 1.29+ for the CRD's CEL rules), kubectl, helm (3 or 4; scripts/install-helm.sh installs one)
# and curl. See docs/kind.md.
#
#   scripts/kind-demo.sh all          # every step below, then tear down (KEEP=1 keeps the cluster)
#   scripts/kind-demo.sh up           # cluster, images, metrics-server, Prometheus, adapter, chart
#   scripts/kind-demo.sh deploy       # kubectl apply -f examples/digits.yaml and wait until Ready
#   scripts/kind-demo.sh traffic      # port-forward the Service to LOCAL_PORT, check which model
#                                     # answers, send REQUESTS v2 infer requests
#   scripts/kind-demo.sh load         # load from a pod in the cluster until the HPA adds replicas
#                                     # (at most DURATION seconds)
#   scripts/kind-demo.sh rollback     # spec.traffic=fallback, wait for the switch, send traffic
#   scripts/kind-demo.sh rollforward  # spec.traffic=primary, wait, send traffic
#   scripts/kind-demo.sh status       # the InferenceService, its pods and HPAs
#   scripts/kind-demo.sh down         # delete the cluster
#
# DRY_RUN=1 prints the commands instead of running them (the chart tests use it to check that the
# script, the Dockerfile, the chart and the examples agree).
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
# Charts the demo installs, pinned: their default resource requests count toward the node size
# docs/kind.md states (tests/process/chart/test_kind_demo.py adds them up).
METRICS_SERVER_CHART=3.13.1
KUBE_PROMETHEUS_STACK_CHART=88.5.3
PROMETHEUS_ADAPTER_CHART=5.3.0
# Requests of one runtime pod. With the example's maxReplicas (3) for each role, the demo's pods
# fit the node size docs/kind.md states; the chart's defaults (500m) suit real nodes.
RUNTIME_CPU_REQUEST=200m
RUNTIME_MEMORY_REQUEST=256Mi
# Not 8080: that is where `make up` serves the same InferenceService on this machine.
LOCAL_PORT=${LOCAL_PORT:-18080}
REQUESTS=${REQUESTS:-200}
DURATION=${DURATION:-300}
LOAD_WORKERS=${LOAD_WORKERS:-32}
LOAD_POD=tailguard-load
LOAD_PROGRAM=scripts/kind-load.py
LOAD_OVERRIDES='{"spec":{"containers":[{"name":"tailguard-load","resources":{"requests":{"cpu":"200m","memory":"128Mi"}}}]}}'
TIMEOUT=${TIMEOUT:-600s}
# One 8x8 handwritten "0" from scikit-learn's digits set: a [1, 64] FP64 tensor.
REQUEST='{"inputs":[{"name":"input-0","shape":[1,64],"datatype":"FP64","data":[0,0,5,13,9,1,0,0,0,0,13,15,10,15,5,0,0,3,15,2,0,11,8,0,0,4,12,0,0,8,8,0,0,5,8,0,0,9,8,0,0,4,11,0,1,12,7,0,0,2,14,5,10,12,0,0,0,0,6,13,10,0,0,0]}]}'

cd "$(dirname "$0")/.."
DRY_RUN=${DRY_RUN:-}
PF_PID=
SCRATCH=$(mktemp -d)

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
cleanup() {
  stop_forward
  rm -rf "$SCRATCH"
}
trap cleanup EXIT

die() {
  echo "kind-demo: $*" >&2
  exit 1
}

cmd_up() {
  say "kind cluster $CLUSTER"
  if [[ -z "$DRY_RUN" ]] && kind get clusters 2>/dev/null | grep -qx "$CLUSTER"; then
    echo "cluster $CLUSTER exists"
  else
    run kind create cluster --name "$CLUSTER" --config kind-config.yaml ${KIND_NODE_IMAGE:+--image "$KIND_NODE_IMAGE"}
  fi

  say "images (build context: the repository root)"
  run docker build --target runtime -t "$RUNTIME_IMAGE" .
  run docker build --target operator -t "$OPERATOR_IMAGE" .
  run kind load docker-image "$RUNTIME_IMAGE" --name "$CLUSTER"
  run kind load docker-image "$OPERATOR_IMAGE" --name "$CLUSTER"

  say "metrics-server (CPU metrics for the HPAs; kind's kubelets have self-signed certificates)"
  run helm repo add metrics-server https://kubernetes-sigs.github.io/metrics-server/ --force-update
  run helm repo add prometheus-community https://prometheus-community.github.io/helm-charts --force-update
  run helm upgrade --install metrics-server metrics-server/metrics-server --namespace kube-system \
    --version "$METRICS_SERVER_CHART" \
    --set 'args={--kubelet-insecure-tls}' --wait --timeout "$TIMEOUT"

  say "Prometheus Operator, Prometheus and Grafana (kube-prometheus-stack)"
  # Select PodMonitors without the release label; let Grafana's sidecar read dashboards from
  # every namespace.
  run helm upgrade --install "$PROMETHEUS_RELEASE" prometheus-community/kube-prometheus-stack \
    --namespace "$MONITORING_NAMESPACE" --create-namespace --version "$KUBE_PROMETHEUS_STACK_CHART" \
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
    --set runtime.resources.requests.cpu="$RUNTIME_CPU_REQUEST" \
    --set runtime.resources.requests.memory="$RUNTIME_MEMORY_REQUEST" \
    --set prometheusAdapter.rules.enabled=true \
    --set prometheusAdapter.rules.namespace="$MONITORING_NAMESPACE" \
    --set prometheusAdapter.rules.configMapName="$ADAPTER_RULES" \
    --set podMonitor.enabled=true \
    --set dashboard.enabled=true \
    --set dashboard.namespace="$MONITORING_NAMESPACE" \
    --wait --timeout "$TIMEOUT"

  say "prometheus-adapter with tailguard's rules (custom metric tailguard_queue_depth for the HPAs)"
  run helm upgrade --install prometheus-adapter prometheus-community/prometheus-adapter \
    --namespace "$MONITORING_NAMESPACE" --version "$PROMETHEUS_ADAPTER_CHART" \
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

# Port-forward the Service to 127.0.0.1:LOCAL_PORT. A forward binds to one pod when it starts,
# so it is restarted after every traffic switch. It fails, rather than test something else, when
# the port is taken (`make up` on 8080 serves the same model) or kubectl cannot bind it.
forward() {
  stop_forward
  local port log="$SCRATCH/port-forward.log"
  if [[ -z "$DRY_RUN" ]] && curl -s -o /dev/null --max-time 5 "http://127.0.0.1:$LOCAL_PORT/"; then
    die "something already answers on 127.0.0.1:$LOCAL_PORT (make up?); stop it or set LOCAL_PORT"
  fi
  port=$(capture 80 kubectl get -n "$NAMESPACE" service "$NAME" -o 'jsonpath={.spec.ports[0].port}')
  printf '+ %s\n' "kubectl port-forward -n $NAMESPACE --address 127.0.0.1 service/$NAME $LOCAL_PORT:$port &"
  if [[ -n "$DRY_RUN" ]]; then return; fi
  kubectl port-forward -n "$NAMESPACE" --address 127.0.0.1 "service/$NAME" "$LOCAL_PORT:$port" \
    >"$log" 2>&1 &
  PF_PID=$!
  local i
  for ((i = 0; i < 100; i++)); do
    if ! kill -0 "$PF_PID" 2>/dev/null; then
      cat "$log" >&2
      PF_PID=
      die "kubectl port-forward to service/$NAME on 127.0.0.1:$LOCAL_PORT exited"
    fi
    if grep -q "Forwarding from 127.0.0.1:$LOCAL_PORT " "$log" &&
      curl -fsS -o /dev/null --max-time 5 "http://127.0.0.1:$LOCAL_PORT/v2/health/ready" 2>/dev/null; then
      return
    fi
    sleep 0.2
  done
  cat "$log" >&2
  die "port-forward to service/$NAME did not become ready"
}

# The value of header $1 in the HTTP reply headers saved in file $2 (names are case-insensitive).
header() {
  tr -d '\r' <"$2" | awk -v name="$1" 'index(tolower($0), tolower(name) ": ") == 1 { sub(/^[^:]*: /, ""); print }'
}

# Send traffic through a port-forward. $1 (optional) is the role a switch just made active; it
# only stands in for the cluster's answer under DRY_RUN.
cmd_traffic() {
  forward
  local url="http://127.0.0.1:$LOCAL_PORT/v2/models/$NAME/infer" role field uri got
  # The role the cluster serves, and its model URI: the reply's X-Tailguard-* headers must
  # name them, or the answer did not come from this InferenceService's pods.
  role=$(capture "${1:-primary}" kubectl get -n "$NAMESPACE" inferenceservice "$NAME" -o 'jsonpath={.status.activeModel}')
  field=model
  if [[ "$role" == fallback ]]; then field=fallback; fi
  uri=$(capture "" kubectl get -n "$NAMESPACE" inferenceservice "$NAME" -o "jsonpath={.spec.$field.uri}")
  say "one request to $url (expect X-Tailguard-Role: $role)"
  run curl -fsS -D "$SCRATCH/headers" -H 'Content-Type: application/json' --data "$REQUEST" "$url"
  echo
  if [[ -z "$DRY_RUN" ]]; then
    grep -i '^x-tailguard-' "$SCRATCH/headers" | tr -d '\r' || true
    got=$(header X-Tailguard-Role "$SCRATCH/headers")
    [[ "$got" == "$role" ]] || die "X-Tailguard-Role is '$got', the cluster serves '$role': not the cluster's pods"
    got=$(header X-Tailguard-Model "$SCRATCH/headers")
    [[ "$got" == "$uri" ]] || die "X-Tailguard-Model is '$got', the cluster's $role model is '$uri'"
  fi
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
  # Load from inside the cluster (a port-forward is one connection to one pod, too narrow to
  # build a queue): scripts/kind-load.py in a pod of the runtime image, LOAD_WORKERS closed
  # loops, until the active role's HPA asks for a second replica (on CPU from metrics-server or
  # tailguard_queue_depth from prometheus-adapter) and the new pods are Ready.
  local port role child url replicas deadline=$((SECONDS + DURATION))
  port=$(capture 80 kubectl get -n "$NAMESPACE" service "$NAME" -o 'jsonpath={.spec.ports[0].port}')
  role=$(capture primary kubectl get -n "$NAMESPACE" inferenceservice "$NAME" -o 'jsonpath={.status.activeModel}')
  child="$NAME-$role" # the role's HPA and Deployment
  url="http://$NAME.$NAMESPACE.svc:$port/v2/models/$NAME/infer"
  say "load on $url until horizontalpodautoscaler/$child scales (at most $DURATION s)"
  run kubectl delete pod -n "$NAMESPACE" "$LOAD_POD" --ignore-not-found --now
  # The program goes in as `python -c` text: the image holds the Python packages only.
  show kubectl run "$LOAD_POD" -n "$NAMESPACE" --image="$RUNTIME_IMAGE" --image-pull-policy=IfNotPresent \
    --restart=Never --override-type=strategic --overrides="$LOAD_OVERRIDES" \
    --command -- python -c "\$(cat $LOAD_PROGRAM)" "$url" "$DURATION" "$LOAD_WORKERS" "$REQUEST"
  if [[ -z "$DRY_RUN" ]]; then
    kubectl run "$LOAD_POD" -n "$NAMESPACE" --image="$RUNTIME_IMAGE" --image-pull-policy=IfNotPresent \
      --restart=Never --override-type=strategic --overrides="$LOAD_OVERRIDES" \
      --command -- python -c "$(<"$LOAD_PROGRAM")" "$url" "$DURATION" "$LOAD_WORKERS" "$REQUEST"
  fi
  run kubectl wait -n "$NAMESPACE" --for=condition=Ready "pod/$LOAD_POD" --timeout "$TIMEOUT"
  while :; do
    replicas=$(capture 2 kubectl get -n "$NAMESPACE" hpa "$child" -o 'jsonpath={.status.desiredReplicas}')
    if ((${replicas:-0} >= 2)); then break; fi
    if ((SECONDS >= deadline)); then
      run kubectl describe -n "$NAMESPACE" hpa "$child"
      die "horizontalpodautoscaler/$child did not scale within $DURATION s"
    fi
    run kubectl get -n "$NAMESPACE" hpa "$child" --no-headers
    sleep 15
  done
  say "horizontalpodautoscaler/$child wants $replicas replicas; waiting for them"
  run kubectl rollout status -n "$NAMESPACE" "deployment/$child" --timeout "$TIMEOUT"
  run kubectl logs -n "$NAMESPACE" "pod/$LOAD_POD"
  run kubectl get -n "$NAMESPACE" hpa,deployment -l "tailguard.dev/inferenceservice=$NAME"
  run kubectl delete pod -n "$NAMESPACE" "$LOAD_POD" --now
}

switch_traffic() {
  local role=$1
  say "traffic -> $role"
  run kubectl patch -n "$NAMESPACE" inferenceservice "$NAME" --type merge -p "{\"spec\":{\"traffic\":\"$role\"}}"
  run kubectl wait -n "$NAMESPACE" --for="jsonpath={.status.activeModel}=$role" "inferenceservice/$NAME" --timeout "$TIMEOUT"
  run kubectl get -n "$NAMESPACE" inferenceservice "$NAME"
  cmd_traffic "$role"
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
  cmd_load
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
  up | deploy | load | rollback | rollforward | status | down | all) "cmd_$1" ;;
  traffic) cmd_traffic ;;
  help | -h | --help) usage ;;
  *)
    usage >&2
    exit 2
    ;;
esac
