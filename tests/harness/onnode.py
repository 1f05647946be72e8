"""InferenceServices served on the real node: the chart's operator in its own pod, runtime pods
running the project's image, and clients inside the cluster's namespace that reach them
through their Service's ClusterIP (kube-proxy's rules).

:func:`installed_on_node` installs the chart as a second release whose operator pod and runtime
pods run on the real node and which watches one namespace; :class:`OnNode` acts in that
namespace and runs the project's load generator (``tailguard bench``) inside the namespace.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any, Mapping

import yaml

from harness.kube.audit import AuditLog
from harness.kube.client import ApiError, Client, wait_for
from harness.kube.controlplane import ControlPlane
from harness.kube.holder import Holder
from harness.kube.images import Image
from harness.kube.install import CHART, Installation, helm, install
from harness.kube.node import LABELS, TAINT
from harness.kube.node import NAME as NODE_NAME
from tailguard.operator.manifests import PORT
from tailguard.spec import resource

RELEASE = "tailguard-node"
RELEASE_NAMESPACE = "tailguard-node-system"
TOLERATION = {"key": TAINT["key"], "operator": "Equal", "value": TAINT["value"],
              "effect": TAINT["effect"]}
TAILGUARD = Path(sys.executable).with_name("tailguard")
LONG_MS = 5000
"""``batching.timeoutMs`` of the InferenceServices that the real node's tests load: the tests
count requests lost to pods that move, start or die, and under the default deadline (1 s) a
stall of the shared 2-core machine would add 504s that say nothing of those."""


def chart_values(namespace: str, images: Mapping[str, Image]) -> dict[str, Any]:
    """The chart's values for the real node: the imported images (never pulled), the operator
    and the runtime pods placed on the real node, one watched namespace, the CRD left to the
    first release. Runtime pods request 100m CPU so the examples fit the node's two cores."""
    placement = {"nodeSelector": dict(LABELS), "tolerations": [TOLERATION]}
    return {
        "crds": {"install": False},
        "watchNamespaces": [namespace],
        "operator": {"image": {"repository": images["operator"].repository,
                               "tag": images["operator"].tag, "pullPolicy": "Never"},
                     "logLevel": "DEBUG", **placement},
        "runtime": {"image": {"repository": images["runtime"].repository,
                              "tag": images["runtime"].tag, "pullPolicy": "Never"},
                    "resources": {"requests": {"cpu": "100m", "memory": "128Mi"},
                                  "limits": {"memory": "1Gi"}},
                    **placement},
    }


def installed_on_node(cluster: ControlPlane, admin: Client, namespace: str,
                      images: Mapping[str, Image]) -> Installation:
    """Install the chart for the real node and wait until its operator pod is Ready.

    Raises:
        AssertionError: helm refused, or the operator pod was not Ready in 120 s.
    """
    installation = install(cluster, admin, chart_values(namespace, images), release=RELEASE,
                           namespace=RELEASE_NAMESPACE)
    name = installation.deployment["metadata"]["name"]
    wait_for(lambda: (admin.get("deployments", RELEASE_NAMESPACE, name) or {}).get(
        "status", {}).get("readyReplicas") == 1, timeout=120,
        what=f"the operator pod of {RELEASE} to be Ready")
    return installation


def upgrade_runtime_tag(cluster: ControlPlane, tag: str) -> None:
    """``helm upgrade`` the real node's release with another runtime image tag (the rest of
    its values kept) and wait until its operator pod is Ready again: the new operator rolls
    every runtime Deployment to that image.

    Raises:
        AssertionError: helm refused, or the operator was not Ready in 170 s (helm's
            ``--wait``).
    """
    helm(cluster, "upgrade", RELEASE, str(CHART), "--namespace", RELEASE_NAMESPACE,
         "--reuse-values", "--set", f"runtime.image.tag={tag}", "--wait", "--timeout", "170s")


def uninstall(cluster: ControlPlane) -> None:
    """``helm uninstall`` the real node's release (its namespace stays)."""
    helm(cluster, "uninstall", RELEASE, "--namespace", RELEASE_NAMESPACE, "--wait",
         "--timeout", "60s", check=False)


@dataclass
class OnNode:
    """The namespace the real node's operator watches, acted on as a person would."""

    cluster: ControlPlane
    admin: Client
    namespace: str
    workdir: Path

    @property
    def holder(self) -> Holder:
        """The cluster's namespace (clients run inside it)."""
        assert self.cluster.holder is not None, "the cluster is not started"
        return self.cluster.holder

    # --- objects ---------------------------------------------------------------------------

    def apply(self, path: Path) -> None:
        """``kubectl apply`` a manifest into the namespace."""
        self.cluster.kubectl("apply", "-n", self.namespace, "-f", str(path))

    def patch(self, name: str, spec: Mapping[str, Any]) -> None:
        self.admin.patch(resource.PLURAL, self.namespace, name, {"spec": dict(spec)})

    def get(self, plural: str, name: str) -> dict[str, Any] | None:
        return self.admin.get(plural, self.namespace, name)

    def condition(self, name: str, type_: str) -> dict[str, Any]:
        isvc = self.get(resource.PLURAL, name) or {}
        for cond in (isvc.get("status") or {}).get("conditions") or []:
            if cond["type"] == type_:
                return cond  # type: ignore[no-any-return]
        return {}

    def selected_role(self, name: str) -> str | None:
        service = self.get("services", name)
        return service["spec"]["selector"]["tailguard.dev/role"] if service else None

    def pods(self, name: str, role: str | None = None) -> list[dict[str, Any]]:
        """The runtime pods of ``name`` (of ``role``), terminating ones included."""
        labels = f"app.kubernetes.io/instance={name}" + (
            f",tailguard.dev/role={role}" if role else "")
        return self.admin.list("pods", self.namespace, labels=labels)

    def ready_pods(self, name: str, role: str) -> list[dict[str, Any]]:
        return [p for p in self.pods(name, role) if is_ready(p)
                and not p["metadata"].get("deletionTimestamp")]

    def wait_serving(self, name: str, timeout: float = 240) -> None:
        """Until ``name`` is Ready (its active role has Ready pods), every runtime pod of its
        current templates is Ready, and its ClusterIP answers ``/v2/health/ready`` with 200.

        The last step is needed because a pod's readiness reaches kube-proxy's rules
        asynchronously (the EndpointSlice controller, then kube-proxy's next sync, at most
        once a second by default): until then a connection to the ClusterIP is refused.

        Raises:
            AssertionError: not in ``timeout`` seconds (pod states in the message).
        """
        def serving() -> bool:
            pods = self.pods(name)
            return (self.condition(name, "Ready").get("status") == "True" and bool(pods)
                    and all(is_ready(p) for p in pods))
        try:
            wait_for(serving, timeout=timeout, what=f"{name} to serve")
        except AssertionError as exc:
            states = {p["metadata"]["name"]: p["status"].get("containerStatuses")
                      for p in self.pods(name)}
            raise AssertionError(f"{exc}; pods: {json.dumps(states)[:3000]}") from None
        url = f"http://{self.cluster_ip(name)}/v2/health/ready"

        def answers() -> bool:
            try:
                self.fetch(url)
            except subprocess.CalledProcessError:
                return False
            return True
        wait_for(answers, timeout=60, what=f"{name}'s ClusterIP to answer (kube-proxy's rules)")

    def cluster_ip(self, name: str) -> str:
        service = self.get("services", name)
        assert service, f"no Service {name}"
        return str(service["spec"]["clusterIP"])

    def names(self) -> list[str]:
        """The InferenceServices in the namespace."""
        return sorted(i["metadata"]["name"] for i in self.admin.list(resource.PLURAL,
                                                                     self.namespace))

    def delete_all(self) -> None:
        """Delete every InferenceService in the namespace and wait until their pods are gone.

        The Deployments, ReplicaSets and pods are deleted too, the pods with no grace period:
        nothing serves any more, so none need their preStop wait and drain (10 s and more)."""
        for plural, options in ((resource.PLURAL, {}), ("deployments", {}), ("replicasets", {}),
                                ("pods", {"gracePeriodSeconds": 0})):
            try:
                self.admin.request("DELETE", self.admin.path(plural, self.namespace), {
                    "kind": "DeleteOptions", "apiVersion": "v1", **options})
            except ApiError:
                pass
        wait_for(lambda: not self.admin.list("pods", self.namespace), timeout=120,
                 what="the runtime pods to be gone")

    # --- traffic ---------------------------------------------------------------------------

    def request(self, name: str, path: str, body: Mapping[str, Any]
                ) -> tuple[int, dict[str, str], Any]:
        """POST ``body`` to ``http://CLUSTER-IP/path`` from inside the namespace; the status,
        the answer's headers (lower-case names) and its JSON body."""
        script = (
            "import json, sys, urllib.request, urllib.error\n"
            "url, body = sys.argv[1], sys.argv[2].encode()\n"
            "req = urllib.request.Request(url, body, {'Content-Type': 'application/json'})\n"
            "try:\n"
            "    r = urllib.request.urlopen(req, timeout=20)\n"
            "except urllib.error.HTTPError as e:\n"
            "    r = e\n"
            "print(json.dumps([r.status, {k.lower(): v for k, v in r.headers.items()},"
            " r.read().decode()]))\n")
        done = self.holder.run([sys.executable, "-c", script,
                                f"http://{self.cluster_ip(name)}{path}", json.dumps(body)],
                               check=False)
        assert done.returncode == 0, f"POST {path} to {name}'s ClusterIP: {done.stderr[-2000:]}"
        status, headers, text = json.loads(done.stdout)
        return status, headers, json.loads(text)

    def grpc_infer(self, name: str, row: list[float]) -> tuple[list[int], dict[str, str]]:
        """One ``ModelInfer`` call with ``tritonclient.grpc`` to the Service's port named
        ``grpc`` on ``name``'s ClusterIP, from inside the namespace; the ``predict`` labels and
        the response's string parameters (``role``, ``model_uri``)."""
        service = self.get("services", name)
        assert service is not None, f"no Service {name}"
        (port,) = [p["port"] for p in service["spec"]["ports"] if p["name"] == "grpc"]
        script = (
            "import json, sys\n"
            "import numpy as np\n"
            "import tritonclient.grpc as g\n"
            "target, name, row = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])\n"
            "client = g.InferenceServerClient(target)\n"
            "x = g.InferInput('input-0', [1, len(row)], 'FP64')\n"
            "x.set_data_from_numpy(np.array([row], dtype=np.float64))\n"
            "answer = client.infer(name, [x], client_timeout=20)\n"
            "params = {k: v.string_param for k, v in answer.get_response().parameters.items()}\n"
            "print(json.dumps([answer.as_numpy('predict').tolist(), params]))\n")
        done = self.holder.run([sys.executable, "-c", script, f"{self.cluster_ip(name)}:{port}",
                                name, json.dumps(row)], check=False)
        assert done.returncode == 0, f"gRPC to {name}'s ClusterIP: {done.stderr[-2000:]}"
        labels, parameters = json.loads(done.stdout)
        return labels, parameters

    def fetch(self, url: str) -> str:
        """GET ``url`` from inside the namespace (a pod IP, a ClusterIP); the body as text.

        Raises:
            subprocess.CalledProcessError: no 200 answer.
        """
        script = ("import sys, urllib.request\n"
                  "print(urllib.request.urlopen(sys.argv[1], timeout=10).read().decode())\n")
        return str(self.holder.run([sys.executable, "-c", script, url]).stdout)

    def counter(self, ip: str, port: int, sample: str, label: str = "") -> float:
        """The sum of ``sample``'s series whose labels contain ``label``, on the /metrics of
        ``ip:port`` (a pod), read from inside the namespace.

        Raises:
            subprocess.CalledProcessError: no 200 answer.
        """
        text = self.fetch(f"http://{ip}:{port}/metrics")
        return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
                   if line.startswith(sample + "{") and label in line)

    def answered(self, pod: dict[str, Any]) -> float:
        """Inference requests ``pod``'s runtime has answered (``tailguard_requests_total``,
        every status), read on its pod IP; 0 while it cannot be read."""
        try:
            return self.counter(pod["status"]["podIP"], PORT, "tailguard_requests_total")
        except (KeyError, subprocess.CalledProcessError):
            return 0.0

    def operator_pods(self) -> list[dict[str, Any]]:
        """The Ready operator pods of the real node's release (not terminating)."""
        return [p for p in self.admin.list("pods", RELEASE_NAMESPACE,
                                           labels="app.kubernetes.io/component=operator")
                if is_ready(p) and not p["metadata"].get("deletionTimestamp")]

    def operator_pod(self) -> dict[str, Any]:
        """The one Ready operator pod of the real node's release.

        Raises:
            AssertionError: there is none, or more than one.
        """
        pods = self.operator_pods()
        assert len(pods) == 1, f"expected one Ready operator pod, found {len(pods)}"
        return pods[0]

    def events(self, name: str, reason: str) -> list[dict[str, Any]]:
        """The Events of the InferenceService ``name`` with ``reason``."""
        return [e for e in self.admin.list("events", self.namespace)
                if e["involvedObject"].get("name") == name and e.get("reason") == reason]

    def load(self, name: str, *, rate: float, seconds: float, label: str) -> "Load":
        """Start ``tailguard bench`` inside the namespace: open-loop Poisson ``rate``
        requests/s for ``seconds`` against ``name``'s ClusterIP, one record per request."""
        ip = self.cluster_ip(name)
        records = self.workdir / f"{label}.records.jsonl"
        out = self.workdir / f"{label}.bench.json"
        argv = [str(TAILGUARD), "bench", f"http://{ip}/v2/models/{name}", "--rate", str(rate),
                "--duration", str(seconds), "--warmup", "1", "--timeout", "15",
                "--slo-ms", "1000", "--max-lag-ms", "1000", "--allow-host", ip,
                "--records", str(records), "--json"]
        with open(out, "wb") as stdout:
            proc = subprocess.Popen(self.holder.command(argv), stdout=stdout,
                                    stderr=subprocess.PIPE)
        return Load(proc, records, out, time.time())


@dataclass
class Load:
    """A running ``tailguard bench`` and where it writes."""

    proc: subprocess.Popen[bytes]
    records_path: Path
    out: Path
    started: float
    interrupted: bool = False

    def interrupt(self) -> None:
        """End the run now as Ctrl-C does (SIGINT): ``tailguard bench`` ends its measured
        window there, waits for the answers in flight and writes its records. Call it once
        the measured window runs (after the process's start, the metadata read and the 1 s
        warm-up: the tests wait for a change under load first); nothing once the run has
        ended, or a second time."""
        if self.proc.poll() is None and not self.interrupted:  # a second one stops at once
            self.proc.send_signal(signal.SIGINT)
            self.interrupted = True

    def abandon(self) -> None:
        """End the run if it still runs and reap it, its records unread: a test that failed
        before its load's end leaves no process and no open pipe."""
        if self.proc.returncode is None:
            self.interrupt()
            try:
                self.proc.communicate(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.communicate()

    def stop(self, at: float, timeout: float = 120) -> list[dict[str, Any]]:
        """:meth:`interrupt` at the Unix time ``at`` (at once when it has passed), then
        :meth:`finish`: a test ends the load once it has seen what it needs."""
        time.sleep(max(0.0, at - time.time()))
        self.interrupt()
        return self.finish(timeout)

    def finish(self, timeout: float = 120) -> list[dict[str, Any]]:
        """Wait for the run; its records (one dict per request of the measured window).

        Raises:
            AssertionError: the bench failed (exit 130 is its answer to :meth:`interrupt`).
        """
        _, err = self.proc.communicate(timeout=timeout)
        expected = (0, 130) if self.interrupted else (0,)  # 0: it ended on its own first
        assert self.proc.returncode in expected, (
            f"tailguard bench exited {self.proc.returncode}: {err.decode()[-2000:]}")
        assert self.records_path.exists(), (
            f"tailguard bench wrote no records (interrupted in its warm-up?): "
            f"{err.decode()[-2000:]}")
        return [json.loads(line) for line in self.records_path.read_text().splitlines()
                if line.strip()]


def is_ready(pod: Mapping[str, Any]) -> bool:
    return any(c["type"] == "Ready" and c["status"] == "True"
               for c in (pod.get("status") or {}).get("conditions") or [])


def ready_since(pod: Mapping[str, Any]) -> float:
    """When ``pod`` last became Ready (Unix s; the API keeps whole seconds, rounded down)."""
    for cond in pod["status"].get("conditions") or []:
        if cond["type"] == "Ready" and cond["status"] == "True":
            return datetime.fromisoformat(cond["lastTransitionTime"].replace(
                "Z", "+00:00")).timestamp()
    raise AssertionError(f"pod {pod['metadata']['name']} is not Ready")


def primary_readiness_wrote(audit: AuditLog, since: int, namespace: str, name: str,
                            moved: float) -> list[float]:
    """When (Unix s) the kubelet wrote the status of one of ``name``'s primary pods from 2.5 s
    before to 0.5 s after ``moved``, the time the Service moved to the fallback.

    The operator moves once the fallback has as many Ready pods as the primary has at that
    moment. A primary pod's readiness can change and change back between two polls of a test
    (CI runs saw a pod's status written twice 125 ms and 0.7 s before the move, and the move
    with one fallback pod Ready), so a test that counts fallback pods at the move asks for
    one, not the primary's usual count, when this list is not empty. Both times are the API
    server's (the audit log's ``requestReceivedTimestamp``); the 0.5 s after is a margin.
    """
    return [w.received for w in audit.writes(since, user=f"system:node:{NODE_NAME}",
                                             namespace=namespace)
            if w.resource == "pods" and w.subresource == "status"
            and w.name.startswith(f"{name}-primary-") and moved - 2.5 <= w.received <= moved + 0.5]


def failures(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The records that are not a 200 answer."""
    return [r for r in records if r["status"] != 200]


def on_node(pods: list[dict[str, Any]]) -> bool:
    return all(p["spec"].get("nodeName") == NODE_NAME for p in pods)


def monitoring_from_chart(cluster: ControlPlane, namespace: str, images: Mapping[str, Image],
                          interval: str) -> tuple[list[dict[str, Any]], str]:
    """What the real node's release would give a Prometheus stack: its PodMonitors and its
    prometheus-adapter rules (``config.yaml``), rendered by ``helm template`` with the same
    values as :func:`installed_on_node` plus ``podMonitor`` (scrape ``interval``) and
    ``prometheusAdapter.rules`` enabled (the release itself has neither: the test cluster has
    no Prometheus Operator CRDs)."""
    values = {**chart_values(namespace, images),
              "podMonitor": {"enabled": True, "interval": interval},
              "prometheusAdapter": {"rules": {"enabled": True}}}
    path = cluster.workdir / f"values-{RELEASE}-monitoring.yaml"
    path.write_text(yaml.safe_dump(values))
    rendered = [doc for doc in yaml.safe_load_all(helm(
        cluster, "template", RELEASE, str(CHART), "-n", RELEASE_NAMESPACE, "-f", str(path)
    ).stdout) if doc]
    monitors = [doc for doc in rendered if doc["kind"] == "PodMonitor"]
    rules = [doc["data"]["config.yaml"] for doc in rendered if doc["kind"] == "ConfigMap"
             and "config.yaml" in doc.get("data", {})]
    assert monitors and len(rules) == 1, "the chart rendered no PodMonitor or adapter rules"
    return monitors, rules[0]
