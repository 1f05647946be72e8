"""The metrics pipeline an HPA reads, run from upstream inside a test cluster's namespace.

:class:`MetricsPipeline` starts the three programs ``hack/metrics/build.py`` builds, each as a
process in the cluster's namespace (as the control plane's own are) under a ServiceAccount of
its own with the RBAC its upstream manifests grant, and registers the two extension APIs with
the aggregation layer, as ``kubectl apply`` of their upstream manifests would:

- **metrics-server** reads the real node's kubelet (``/metrics/resource``) and serves
  ``metrics.k8s.io`` (the HPA's CPU metric; ``kubectl top``);
- **Prometheus** finds runtime pods through the API server (``kubernetes_sd_configs``, role
  ``pod``) and scrapes them on their pod IPs, with the scrape configs the Prometheus Operator
  generates from the chart's rendered PodMonitors (:func:`scrape_configs`);
- **prometheus-adapter** serves ``custom.metrics.k8s.io`` from Prometheus with the chart's own
  rules (its ConfigMap's ``config.yaml``): ``tailguard_queue_depth`` per pod.

Each APIService names a Service without a selector whose EndpointSlice points at the program's
address in the namespace (:data:`~.holder.NODE_IP`); the API server routes to endpoints
(``--enable-aggregator-routing``), verifies the serving certificate against the Service's name
with the APIService's ``caBundle``, and presents its front-proxy client certificate. Only the
real node is scraped by metrics-server (``--node-selector``): kwok's nodes have no kubelet.
Every process is ended by its PID in :meth:`MetricsPipeline.stop`.
"""

from __future__ import annotations

import base64
import functools
import json
import re
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

import yaml

from harness.hack import built

from .controlplane import INNER_URL, ControlPlane
from .holder import NODE_IP
from .node import LABELS
from .procs import end

MONITORING = "monitoring"
"""The namespace of Prometheus and prometheus-adapter (metrics-server's is ``kube-system``)."""
METRICS_SERVER_PORT, ADAPTER_PORT, PROMETHEUS_PORT = 4443, 4444, 9090
"""Ports in the namespace (a fresh namespace has every port free, so they are fixed)."""
METRIC_RESOLUTION_S = 10
"""metrics-server's scrape interval of the kubelets (its default is 60 s; 10 s is the
shortest its docs allow)."""
ADAPTER_RELIST_S = 5
"""How often prometheus-adapter lists Prometheus' series to learn new ones (its default is
10 min: a pod that appears after the last list has no custom metric until the next)."""
START_TIMEOUT_S = 90.0


def bindir() -> Path:
    """The folder of the pipeline's binaries: ``$TAILGUARD_METRICS_BIN`` when set, else what
    ``hack/metrics/build.py`` builds or finds cached (:func:`~harness.hack.built`).

    Raises:
        PipelineError: the build failed or Go is missing.
    """
    return built("TAILGUARD_METRICS_BIN", "metrics", PipelineError)


def _label_name(name: str) -> str:
    """A Kubernetes label name as Prometheus' service discovery spells it in meta labels."""
    return re.sub(r"[^a-zA-Z0-9_]", "_", name)


def scrape_configs(pod_monitor: Mapping[str, Any], *, api_server: str, ca_file: str,
                   token_file: str) -> list[dict[str, Any]]:
    """The Prometheus scrape configs of one PodMonitor (``monitoring.coreos.com/v1``), one per
    ``podMetricsEndpoints`` entry, as the Prometheus Operator generates them: pods found by
    ``kubernetes_sd_configs`` (role ``pod``) in the monitor's namespaces, kept when every
    ``selector.matchLabels`` label matches and the container port has the endpoint's name,
    Failed and Succeeded pods dropped, and the target labelled ``namespace``, ``pod``,
    ``container``, ``endpoint`` and ``job`` (``NAMESPACE/NAME``). Pure.

    ``api_server``, ``ca_file`` and ``token_file``: how Prometheus reaches the API server.

    Raises:
        ValueError: the monitor uses what this does not translate (``matchExpressions``, a
            numeric ``targetPort``, its own relabelings).
    """
    meta, spec = pod_monitor["metadata"], pod_monitor["spec"]
    selector = spec.get("selector", {})
    if selector.get("matchExpressions"):
        raise ValueError("selector.matchExpressions is not translated")
    ns_selector = spec.get("namespaceSelector", {})
    namespaces = None if ns_selector.get("any") else (ns_selector.get("matchNames")
                                                      or [meta["namespace"]])
    discovery: dict[str, Any] = {
        "role": "pod", "api_server": api_server,
        "tls_config": {"ca_file": ca_file},
        "authorization": {"credentials_file": token_file},
    }
    if namespaces is not None:
        discovery["namespaces"] = {"names": list(namespaces)}
    keep_labels = [
        {"action": "keep",
         "source_labels": [f"__meta_kubernetes_pod_label_{_label_name(k)}",
                           f"__meta_kubernetes_pod_labelpresent_{_label_name(k)}"],
         "regex": f"({re.escape(str(v))});true"}
        for k, v in sorted(selector.get("matchLabels", {}).items())]
    configs = []
    for index, endpoint in enumerate(spec["podMetricsEndpoints"]):
        if "port" not in endpoint or endpoint.get("relabelings") or endpoint.get("targetPort"):
            raise ValueError(f"podMetricsEndpoints[{index}] needs a port name and no "
                             "relabelings or targetPort here")
        job = f"{meta['namespace']}/{meta['name']}"
        config: dict[str, Any] = {
            "job_name": f"podMonitor/{job}/{index}",
            "metrics_path": endpoint.get("path", "/metrics"),
            "kubernetes_sd_configs": [discovery],
            "relabel_configs": [
                *keep_labels,
                {"action": "keep", "source_labels": ["__meta_kubernetes_pod_container_port_name"],
                 "regex": endpoint["port"]},
                {"action": "drop", "source_labels": ["__meta_kubernetes_pod_phase"],
                 "regex": "(Failed|Succeeded)"},
                {"source_labels": ["__meta_kubernetes_namespace"], "target_label": "namespace"},
                {"source_labels": ["__meta_kubernetes_pod_container_name"],
                 "target_label": "container"},
                {"source_labels": ["__meta_kubernetes_pod_name"], "target_label": "pod"},
                {"target_label": "job", "replacement": job},
                {"target_label": "endpoint", "replacement": endpoint["port"]},
            ],
        }
        if "interval" in endpoint:
            config["scrape_interval"] = endpoint["interval"]
        configs.append(config)
    return configs


def access_objects(ca_pem: bytes) -> list[dict[str, Any]]:
    """The API objects the three programs need, from their upstream manifests' RBAC: their
    ServiceAccounts, roles and bindings (``system:auth-delegator`` and
    ``extension-apiserver-authentication-reader`` for both extension servers), the Services and
    EndpointSlices that lead to them, and the two APIServices with ``ca_pem`` as their CA
    bundle. Pure."""
    bundle = base64.b64encode(ca_pem).decode()
    objects: list[dict[str, Any]] = [
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": MONITORING}}]
    accounts = {"metrics-server": "kube-system", "prometheus": MONITORING,
                "prometheus-adapter": MONITORING}
    for name, namespace in accounts.items():
        objects.append({"apiVersion": "v1", "kind": "ServiceAccount",
                        "metadata": {"name": name, "namespace": namespace}})
    rules = {
        "metrics-server": [
            {"apiGroups": [""], "resources": ["nodes/metrics"], "verbs": ["get"]},
            {"apiGroups": [""], "resources": ["pods", "nodes"],
             "verbs": ["get", "list", "watch"]}],
        "prometheus": [
            {"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list", "watch"]}],
        "prometheus-adapter": [
            {"apiGroups": [""], "resources": ["namespaces", "pods", "services"],
             "verbs": ["get", "list", "watch"]}],
    }
    for name, namespace in accounts.items():
        subject = [{"kind": "ServiceAccount", "name": name, "namespace": namespace}]
        role = f"tailguard-test:{name}"
        objects.append({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
                        "metadata": {"name": role}, "rules": rules[name]})
        objects.append(_cluster_binding(role, role, subject))
        if name == "prometheus":
            continue
        objects.append(_cluster_binding(f"tailguard-test:{name}:auth-delegator",
                                        "system:auth-delegator", subject))
        objects.append({
            "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
            "metadata": {"name": f"tailguard-test:{name}:auth-reader",
                         "namespace": "kube-system"},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role",
                        "name": "extension-apiserver-authentication-reader"},
            "subjects": subject})
    for service, namespace, port, group, versions in (
            ("metrics-server", "kube-system", METRICS_SERVER_PORT, "metrics.k8s.io",
             ("v1beta1",)),
            ("prometheus-adapter", MONITORING, ADAPTER_PORT, "custom.metrics.k8s.io",
             ("v1beta1", "v1beta2"))):
        objects.append({"apiVersion": "v1", "kind": "Service",
                        "metadata": {"name": service, "namespace": namespace},
                        "spec": {"ports": [{"name": "https", "port": 443,
                                            "targetPort": port}]}})
        objects.append({
            "apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
            "metadata": {"name": service, "namespace": namespace,
                         "labels": {"kubernetes.io/service-name": service}},
            "addressType": "IPv4",
            "endpoints": [{"addresses": [NODE_IP], "conditions": {"ready": True}}],
            "ports": [{"name": "https", "port": port, "protocol": "TCP"}]})
        for version in versions:
            objects.append({
                "apiVersion": "apiregistration.k8s.io/v1", "kind": "APIService",
                "metadata": {"name": f"{version}.{group}"},
                "spec": {"group": group, "version": version, "caBundle": bundle,
                         "service": {"name": service, "namespace": namespace, "port": 443},
                         "groupPriorityMinimum": 100, "versionPriority": 100}})
    return objects


def _cluster_binding(name: str, role: str, subjects: list[dict[str, str]]) -> dict[str, Any]:
    return {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
            "metadata": {"name": name},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                        "name": role},
            "subjects": subjects}


class PipelineError(RuntimeError):
    """A program of the pipeline exited or its API did not answer in time (its log's tail
    attached)."""


@dataclass
class MetricsPipeline:
    """metrics-server, Prometheus and prometheus-adapter for ``cluster``, from ``bindir``
    (``hack/metrics/build.py``), their files in ``workdir``."""

    cluster: ControlPlane
    bindir: Path
    workdir: Path
    _procs: list[tuple[str, subprocess.Popen[bytes]]] = field(default_factory=list)
    _created: list[dict[str, Any]] = field(default_factory=list)

    def start(self, pod_monitors: Sequence[Mapping[str, Any]], adapter_config: str) -> None:
        """Create the pipeline's API objects, start the three programs and wait until both
        metrics APIs are Available.

        ``pod_monitors``: the chart's rendered PodMonitors; ``adapter_config``: its
        prometheus-adapter ConfigMap's ``config.yaml``.

        Raises:
            PipelineError: a program exited, or an API was not Available in time.
        """
        self.workdir.mkdir(parents=True, exist_ok=True)
        (self.workdir / "logs").mkdir(exist_ok=True)
        ca = self.cluster.ca
        authority = self.cluster.authority
        deadline = time.monotonic() + START_TIMEOUT_S
        try:
            objects = access_objects(ca.read_bytes())
            self._created = [o for o in objects if o["kind"] != "Namespace"]
            self.cluster.kubectl("apply", "-f", "-", input=json.dumps(
                {"apiVersion": "v1", "kind": "List", "items": objects}))
            kubeconfigs = {
                name: self.cluster.token_identity(f"{name}.inner", namespace=namespace,
                                                  service_account=name, inner=True).kubeconfig
                for name, namespace in (("metrics-server", "kube-system"),
                                        ("prometheus", MONITORING),
                                        ("prometheus-adapter", MONITORING))}
            serving = authority.serving("metrics-server-serving",
                                        dns=["metrics-server.kube-system.svc"], ips=[NODE_IP])
            self._spawn("metrics-server", [
                f"--secure-port={METRICS_SERVER_PORT}", f"--bind-address={NODE_IP}",
                f"--tls-cert-file={serving.cert}", f"--tls-private-key-file={serving.key}",
                f"--kubeconfig={kubeconfigs['metrics-server']}",
                *self._delegation_flags(kubeconfigs["metrics-server"]),
                f"--kubelet-certificate-authority={ca}",
                "--kubelet-preferred-address-types=InternalIP",
                f"--metric-resolution={METRIC_RESOLUTION_S}s",
                # It must be shorter than the resolution (its default is 10 s).
                f"--kubelet-request-timeout={METRIC_RESOLUTION_S // 2}s",
                "--node-selector=" + ",".join(f"{k}={v}" for k, v in LABELS.items()),
                "--v=1"])
            self._start_prometheus(pod_monitors, kubeconfigs["prometheus"])
            rules = self.workdir / "adapter-rules.yaml"
            rules.write_text(adapter_config)
            serving = authority.serving("prometheus-adapter-serving",
                                        dns=[f"prometheus-adapter.{MONITORING}.svc"],
                                        ips=[NODE_IP])
            self._spawn("prometheus-adapter", [
                f"--secure-port={ADAPTER_PORT}", f"--bind-address={NODE_IP}",
                f"--tls-cert-file={serving.cert}", f"--tls-private-key-file={serving.key}",
                f"--lister-kubeconfig={kubeconfigs['prometheus-adapter']}",
                *self._delegation_flags(kubeconfigs["prometheus-adapter"]),
                f"--prometheus-url=http://127.0.0.1:{PROMETHEUS_PORT}/",
                f"--metrics-relist-interval={ADAPTER_RELIST_S}s",
                f"--config={rules}", "--v=1"])
            for api in ("v1beta1.metrics.k8s.io", "v1beta1.custom.metrics.k8s.io"):
                self._wait(deadline, f"the APIService {api} Available",
                           functools.partial(self._available, api))
        except BaseException:
            self.stop()
            raise

    def stop(self) -> None:
        """Unregister the two APIs and delete the rest of the pipeline's objects (an
        APIService left without its server stalls discovery, and with it every namespace's
        deletion), then end every process started here, newest first, by PID."""
        if self._created:
            self.cluster.kubectl("delete", "--ignore-not-found", "--wait=false", "-f", "-",
                                 input=json.dumps({"apiVersion": "v1", "kind": "List",
                                                   "items": self._created}), check=False)
            self._created = []
        for _, proc in reversed(self._procs):
            end(proc)
        self._procs.clear()

    # --- internals -----------------------------------------------------------------------

    @staticmethod
    def _delegation_flags(kubeconfig: Path) -> list[str]:
        """An extension server asks the API server who a caller is (TokenReview) and what
        it may do (SubjectAccessReview) as its own ServiceAccount."""
        return [f"--authentication-kubeconfig={kubeconfig}",
                f"--authorization-kubeconfig={kubeconfig}"]

    def _start_prometheus(self, pod_monitors: Sequence[Mapping[str, Any]],
                          kubeconfig: Path) -> None:
        token = self.workdir / "prometheus.token"
        token.write_text(yaml.safe_load(kubeconfig.read_text())["users"][0]["user"]["token"])
        token.chmod(0o600)
        configs = [c for monitor in pod_monitors
                   for c in scrape_configs(monitor, api_server=INNER_URL,
                                           ca_file=str(self.cluster.ca), token_file=str(token))]
        path = self.workdir / "prometheus.yaml"
        path.write_text(yaml.safe_dump({"global": {"scrape_interval": "15s"},
                                        "scrape_configs": configs}, sort_keys=False))
        self._spawn("prometheus", [
            f"--config.file={path}", f"--storage.tsdb.path={self.workdir / 'tsdb'}",
            "--storage.tsdb.retention.time=2h",
            f"--web.listen-address=127.0.0.1:{PROMETHEUS_PORT}", "--log.level=warn"])

    def _spawn(self, name: str, args: list[str]) -> None:
        holder = self.cluster.holder
        assert holder is not None
        proc = holder.spawn([str(self.bindir / name), *args],
                            log=self.workdir / "logs" / f"{name}.log", cwd=self.workdir)
        self._procs.append((name, proc))

    def _available(self, api: str) -> bool:
        done = self.cluster.kubectl("get", "apiservice", api, "-o", "json", check=False)
        if done.returncode != 0:
            return False
        conditions = json.loads(done.stdout).get("status", {}).get("conditions", [])
        return any(c["type"] == "Available" and c["status"] == "True" for c in conditions)

    def _wait(self, deadline: float, what: str, ready: Callable[[], bool]) -> None:
        while not ready():
            for name, proc in self._procs:
                if proc.poll() is not None:
                    raise PipelineError(f"{name} exited {proc.returncode}:\n{self._tail(name)}")
            if time.monotonic() > deadline:
                raise PipelineError(f"no {what} in {START_TIMEOUT_S:.0f} s:\n"
                                    + "\n".join(self._tail(n) for n, _ in self._procs))
            time.sleep(0.5)

    def _tail(self, name: str, lines: int = 15) -> str:
        path = self.workdir / "logs" / f"{name}.log"
        text = path.read_text(errors="replace").splitlines() if path.exists() else []
        return f"--- {name} ---\n" + "\n".join(text[-lines:])
