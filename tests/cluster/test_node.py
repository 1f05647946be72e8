"""InferenceServices served for real: the chart's operator runs in its own pod on the real node,
runtime pods run the project's image there under the kubelet and containerd, and clients inside
the cluster's namespace reach them through the Service's ClusterIP (kube-proxy's rules).

One namespace for the module, watched by the operator pod of a second release of the chart; each
test starts from what the previous one left, and re-applies what it needs.
"""

from __future__ import annotations

import time
from typing import Any

import pytest

from harness import REPO
from harness.kube.audit import AuditLog
from harness.kube.client import wait_for
from harness.kube.images import node_images
from harness.onnode import (
    LONG_MS,
    OnNode,
    failures,
    is_ready,
    on_node,
    primary_readiness_wrote,
    ready_since,
    upgrade_runtime_tag,
)
from tailguard.operator.manifests import CHECKSUM_ANNOTATION

pytestmark = pytest.mark.cluster

EXAMPLES = sorted((REPO / "examples").glob("*.yaml"))
IRIS_ROW = [5.1, 3.5, 1.4, 0.2]


def iris(node: OnNode, primaries: int = 1) -> None:
    """``examples/iris.yaml`` applied with traffic on the primary, serving from ``primaries``
    Ready primary pods (scaled as the HPA would scale it) and one fallback pod."""
    node.apply(REPO / "examples" / "iris.yaml")
    # The SLO guard judges iris but does not act: these tests move traffic themselves, and a
    # random forest under load on a busy 2-core machine may well break a 25 ms p99. Deadlines
    # of LONG_MS, not the default 1 s. A scale-down window of 0 s: a move of traffic holds no
    # HPA minimum (status.minReplicasHold), so each test scales the roles as it needs.
    node.patch("iris", {"traffic": "primary", "scaling": {
        "minReplicas": 1, "maxReplicas": 5,
        "behavior": {"scaleDown": {"stabilizationWindowSeconds": 0}}},
        "rollback": {"automatic": False}, "batching": {"timeoutMs": LONG_MS}})
    node.wait_serving("iris")
    node.cluster.kubectl("scale", "-n", node.namespace, "deployment/iris-primary",
                         f"--replicas={primaries}")
    node.cluster.kubectl("scale", "-n", node.namespace, "deployment/iris-fallback",
                         "--replicas=1")
    wait_for(lambda: len(node.pods("iris", "primary")) == primaries
             and len(node.pods("iris", "fallback")) == 1, timeout=120,
             what=f"{primaries} primary pods and one fallback pod")
    node.wait_serving("iris")


def test_each_example_serves_v1_and_v2_through_its_cluster_ip(node: OnNode) -> None:
    """``kubectl apply`` of every example: its pods start on the real node, pass their
    readiness probes on the v2 health routes, and answer through the ClusterIP, over REST
    (v1 and v2) and gRPC."""
    for path in EXAMPLES:
        node.apply(path)
    names = [p.stem for p in EXAMPLES]
    for name in names:
        node.wait_serving(name)
        pods = node.pods(name)
        assert on_node(pods) and {p["metadata"]["labels"]["tailguard.dev/role"]
                                  for p in pods} == {"primary", "fallback"}
        probe = pods[0]["spec"]["containers"][0]["readinessProbe"]["httpGet"]
        assert probe["path"] == "/v2/health/ready"
        metadata = node.get("services", name)
        assert metadata and metadata["spec"]["type"] == "ClusterIP"
        logs = node.cluster.kubectl("logs", "-n", node.namespace, f"deployment/{name}-primary")
        assert f"serving service={name}" in logs.stdout + logs.stderr

    width = {"iris": 4, "digits": 64, "slow-digits": 64}
    for name in names:
        row = IRIS_ROW if name == "iris" else [0.0] * width[name]
        status, headers, body = node.request(name, f"/v2/models/{name}/infer", {
            "inputs": [{"name": "input-0", "shape": [1, len(row)], "datatype": "FP64",
                        "data": row}]})
        assert status == 200, body
        assert headers["x-tailguard-role"] == "primary"
        assert body["model_name"] == name and len(body["outputs"][0]["data"]) == 1
        status, headers, body = node.request(name, f"/v1/models/{name}:predict",
                                             {"instances": [row]})
        assert status == 200, body
        assert len(body["predictions"]) == 1
    iris_answer = node.request("iris", "/v1/models/iris:predict", {"instances": [IRIS_ROW]})
    assert iris_answer[2]["predictions"] == [0]  # a setosa, as the dataset labels it
    # the same through the Service's gRPC port (appProtocol grpc), with tritonclient.grpc
    labels, parameters = node.grpc_infer("iris", IRIS_ROW)
    assert labels == [0] and parameters["role"] == "primary"
    (grpc_port,) = [p for p in node.get("services", "iris")["spec"]["ports"]  # type: ignore[index]
                    if p["name"] == "grpc"]
    assert grpc_port["appProtocol"] == "grpc" and grpc_port["targetPort"] == "grpc"
    for name in names:
        if name != "iris":
            node.admin.delete("inferenceservices", node.namespace, name)


def test_manual_rollback_under_load_moves_traffic_once_the_fallback_is_ready(
        node: OnNode) -> None:
    """Two primary pods and one fallback pod serve; a person sets ``spec.traffic: fallback``
    under open-loop load through the ClusterIP. The fallback is raised to two Ready pods (its
    HPA minimum) before the Service moves,
    clients on kept-alive connections move too (the primary pods answer ``Connection: close``),
    and every request is answered 200."""
    iris(node, primaries=2)
    assert len(node.ready_pods("iris", "fallback")) == 1
    primary_pods = node.ready_pods("iris", "primary")
    primaries = [p["metadata"]["name"] for p in primary_pods]
    load = node.load("iris", rate=40, seconds=120, label="rollback")
    time.sleep(6)
    audit = AuditLog(node.cluster.audit_log)
    mark = audit.mark()
    node.patch("iris", {"traffic": "fallback"})
    wait_for(lambda: node.selected_role("iris") == "fallback", timeout=90,
             what="the Service to select the fallback")
    switched = time.time()
    fallback = node.ready_pods("iris", "fallback")

    def told(pod: str) -> bool:
        """The pod's runtime read that traffic left its role: it answers Connection: close."""
        logs = node.cluster.kubectl("logs", "-n", node.namespace, pod)
        time.sleep(0.2)
        return "role=primary active=fallback keep_alive=False" in logs.stdout

    # the kubelet refreshes the mounted config on its pod sync (syncFrequency, 5 s on this
    # node, with jitter; a minute by default), the runtime reads it every 2 s
    wait_for(lambda: all(told(pod) for pod in primaries), timeout=90,
             what="the primary pods to read that traffic left them")
    told_at = time.time()
    # then the clients leave them: their answers close each connection, and kube-proxy sends
    # the next one to the fallback (its rules follow the Service: seconds on a busy machine)
    answered = [sum(node.answered(p) for p in primary_pods)]
    while len(answered) < 2 or answered[-1] != answered[-2]:  # 3 s without a primary answer
        assert time.time() < told_at + 90, f"the primary pods still answer: {answered}"
        time.sleep(3)
        answered.append(sum(node.answered(p) for p in primary_pods))
    records = load.stop(at=time.time() + 5)

    assert failures(records) == []
    # Two fallback pods, as the primary had, unless a primary pod's readiness changed just
    # before the Service moved (primary_readiness_wrote says why)
    writes = audit.writes(mark, namespace=node.namespace)
    moved = min(w.received for w in writes if w.resource == "services" and w.name == "iris")
    changed = primary_readiness_wrote(audit, mark, node.namespace, "iris", moved)
    needed = 1 if changed else 2
    assert len(fallback) >= needed, (
        f"the Service moved before {needed} fallback pods were Ready", changed)
    assert max(ready_since(p) for p in fallback) <= switched
    roles = [(r["done"], r["role"]) for r in records]
    assert roles[0][1] == "primary"
    last_primary = max(done for done, role in roles if role == "primary")
    tail = [role for done, role in roles if done > last_primary]
    assert tail and set(tail) == {"fallback"}
    assert records[-1]["done"] - last_primary >= 5, (
        "kept-alive clients were still on the primary near the end of the run (last primary "
        f"answer {last_primary - told_at:.1f} s after its pods read that traffic left them)")
    print(f"the primary's pods read that traffic left them {told_at - switched:.1f} s after "
          f"the Service moved; keep-alive clients left {last_primary - told_at:.1f} s later")


def test_a_new_primary_model_rolls_out_under_load_without_a_failed_request(
        node: OnNode) -> None:
    """The primary's model changes under load: the new model's pod answers only once it is
    Ready, the old model's pods answer until they leave, and nothing fails."""
    iris(node)
    node.wait_serving("iris")
    old_uri = node.request("iris", "/v1/models/iris:predict",
                           {"instances": [IRIS_ROW]})[1]["x-tailguard-model"]
    new_uri = "builtin://iris/random-forest?trees=50"
    assert new_uri != old_uri
    old = _template_checksum(node)
    load = node.load("iris", rate=40, seconds=60, label="rollout")
    time.sleep(5)
    node.patch("iris", {"model": {"uri": new_uri}})
    new = wait_for(lambda: _template_checksum(node) != old and _template_checksum(node),
                   what="the primary's new pod template")
    wait_for(lambda: [p for p in node.ready_pods("iris", "primary") if _checksum(p) == new],
             timeout=120, what="a Ready pod of the new model")
    new_pods = [p for p in node.ready_pods("iris", "primary") if _checksum(p) == new]
    # kept-alive clients reach the new pod once the old one leaves (preStop: Connection:
    # close) or their connection retires (maxConnectionAgeSeconds): seconds on a busy machine
    wait_for(lambda: any(node.answered(p) > 0 for p in new_pods), timeout=90,
             what="an answer from the new model's pod")
    records = load.stop(at=time.time() + 2)

    assert failures(records) == []
    models = [(r["sent"], r["model"]) for r in records]
    first_new = min(sent for sent, model in models if model == new_uri)
    assert first_new >= min(ready_since(p) for p in new_pods)
    assert {model for _, model in models} == {old_uri, new_uri}
    assert models[-1][1] == new_uri


def test_a_rollout_whose_pods_cannot_start_keeps_traffic_and_says_why(node: OnNode) -> None:
    """The chart is upgraded to a runtime image the node does not have: the new operator rolls
    every runtime Deployment to pods that cannot start (``ErrImageNeverPull``). Under load
    through the ClusterIP nothing fails and only the old pods serve; ``PrimaryReady`` (no
    Ready pod of the current template) and ``Ready`` say ``PodsNotStarting``, name the pod and
    the kubelet's reason, and that the previous template's pod still serves. The image put
    back, the rollout ends and the condition says ``ReplicasReady`` again."""
    iris(node)
    serving = {p["metadata"]["name"] for p in node.ready_pods("iris", "primary")}
    upgrade_runtime_tag(node.cluster, "absent")
    try:
        wait_for(lambda: node.condition("iris", "PrimaryReady").get("reason")
                 == "PodsNotStarting", timeout=120, what="PrimaryReady to say PodsNotStarting")
        records = node.load("iris", rate=20, seconds=6, label="stuck-rollout").finish()
        condition = node.condition("iris", "PrimaryReady")
        stuck = [p["metadata"]["name"] for p in node.pods("iris", "primary")
                 if p["metadata"]["name"] not in serving]
        assert failures(records) == []
        assert {r["role"] for r in records} == {"primary"}
        assert {p["metadata"]["name"] for p in node.ready_pods("iris", "primary")} == serving
        assert condition["status"] == "False", condition
        assert stuck and any(name in condition["message"] for name in stuck), (condition, stuck)
        assert "ErrImageNeverPull" in condition["message"]
        assert "absent" in condition["message"]  # the kubelet's message names the image
        assert "1 Ready pod(s) of the previous template still serve" in condition["message"]
        ready = node.condition("iris", "Ready")
        assert (ready["status"], ready["reason"]) == ("False", "PodsNotStarting"), ready
    finally:
        upgrade_runtime_tag(node.cluster, node_images()["runtime"].tag)
    wait_for(lambda: node.condition("iris", "PrimaryReady").get("reason") == "ReplicasReady"
             and node.condition("iris", "FallbackReady").get("reason") == "ReplicasReady",
             timeout=120, what="the conditions to say ReplicasReady again")
    for name in node.names():
        node.wait_serving(name)
    assert all(is_ready(p) for p in node.pods("iris"))


def test_deleted_and_scaled_in_pods_lose_no_admitted_request(node: OnNode) -> None:
    """Under load, one of two primary pods is deleted (preStop, then drain), and then the
    primary is scaled in to one pod, as its HPA would: every request is answered 200. The
    pod that replaces the deleted one gets traffic from the clients' kept-alive connections
    too: those the deleted pod closed went to the pod that stayed, and they retire at their
    age (``maxConnectionAgeSeconds``, 10 s), so the next ones spread over both."""
    iris(node, primaries=2)
    load = node.load("iris", rate=40, seconds=60, label="scale-in")
    time.sleep(5)
    victim, stayed = (p["metadata"]["name"] for p in node.ready_pods("iris", "primary"))
    node.admin.delete("pods", node.namespace, victim)
    wait_for(lambda: len(node.ready_pods("iris", "primary")) == 2
             and victim not in {p["metadata"]["name"] for p in node.pods("iris", "primary")},
             timeout=60, what="the deleted pod replaced and gone")
    (replacement,) = (p for p in node.ready_pods("iris", "primary")
                      if p["metadata"]["name"] != stayed)
    wait_for(lambda: node.answered(replacement) > 0, timeout=60,
             what="kept-alive clients to reach the replacement pod")
    node.cluster.kubectl("scale", "-n", node.namespace, "deployment/iris-primary",
                         "--replicas=1")
    wait_for(lambda: len(node.pods("iris", "primary")) == 1, timeout=60,
             what="the primary scaled in to one pod")
    records = load.stop(at=time.time() + 3)
    assert failures(records) == []
    assert len(records) > 200  # 40/s through the deletion and the scale-in


def test_a_killed_runtime_container_is_restarted_and_the_other_pod_keeps_serving(
        node: OnNode) -> None:
    """The runtime process of one of two primary pods is killed: the kubelet restarts the
    container, its readiness drops and returns, and requests through the Service that are not
    caught on the killed process are answered 200."""
    iris(node, primaries=2)
    pod = node.ready_pods("iris", "primary")[0]
    name = pod["metadata"]["name"]
    container_id = pod["status"]["containerStatuses"][0]["containerID"].split("//")[1]
    load = node.load("iris", rate=40, seconds=60, label="kill")
    time.sleep(5)
    killed = time.time()
    assert node.cluster.node is not None
    node.cluster.node.ctr("tasks", "kill", "--signal", "SIGKILL", container_id)
    wait_for(lambda: not is_ready(node.get("pods", name) or {}), timeout=30,
             what="the killed pod to turn unready")
    wait_for(lambda: is_ready(node.get("pods", name) or {}), timeout=90,
             what="the restarted container to be Ready again")
    back = time.time()
    records = load.stop(at=back + 3)
    restarted = node.get("pods", name)
    assert restarted and restarted["status"]["containerStatuses"][0]["restartCount"] == 1
    lost = failures(records)
    assert all(r["status"] == 0 for r in lost), lost  # never an HTTP error answer
    assert all(killed - 1 <= r["sent"] <= back for r in lost), lost
    print(f"{len(lost)} of {len(records)} requests were caught on the killed process")


def _checksum(obj: dict[str, Any]) -> str:
    """The config checksum a pod (or pod template) carries: what its runtime serves."""
    return str(obj["metadata"].get("annotations", {}).get(CHECKSUM_ANNOTATION))


def _template_checksum(node: OnNode) -> str:
    deployment = node.get("deployments", "iris-primary")
    assert deployment
    return _checksum(deployment["spec"]["template"])
