"""The chart installed on a test control plane with the real ``helm``, and the operator run as
that installation deploys it.

Nothing runs the operator's pod here (no kubelet, no images): :class:`Installation` runs
``tailguard operator`` as a local process with exactly what the chart gives the pod, its
environment and its ServiceAccount (a bound token from the TokenRequest API), so every request
the operator makes is authorized by the chart's RBAC, never as an admin.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

import yaml

from harness import REPO
from tailguard._util.net import free_port

from .client import ApiError, Client, wait_for
from .controlplane import ControlPlane, Identity
from .procs import end_with_parent

CHART = REPO / "charts" / "tailguard"
RELEASE = "tailguard"
RELEASE_NAMESPACE = "tailguard-system"
CRD_NAME = "inferenceservices.tailguard.dev"


def helm_binary() -> str:
    """The Helm 4 binary: ``$HELM``, else ``helm`` on PATH.

    Raises:
        RuntimeError: neither exists (``scripts/install-helm.sh`` installs one).
    """
    return _binary("HELM", "helm")


def helm3_binary() -> str:
    """The Helm 3 binary: ``$HELM3``, else ``helm3`` on PATH.

    Raises:
        RuntimeError: neither exists (``scripts/install-helm.sh`` installs one).
    """
    return _binary("HELM3", "helm3")


def _binary(variable: str, name: str) -> str:
    path = os.environ.get(variable) or shutil.which(name)
    if not path:
        raise RuntimeError(f"no {name} binary: run `bash scripts/install-helm.sh .ci/bin` and put "
                           ".ci/bin on PATH (make test does both)")
    return path


def helm(cluster: ControlPlane, *args: str, check: bool = True,
         scratch: Path | None = None, binary: str | None = None
         ) -> subprocess.CompletedProcess[str]:
    """Run ``helm ARGS`` (``binary``: another Helm than :func:`helm_binary`'s) against the
    control plane as its admin.

    Raises:
        AssertionError: ``check`` and a non-zero exit (with helm's stderr).
        subprocess.TimeoutExpired: helm ran past 180 s.
    """
    home = scratch or cluster.workdir / "helm"
    env = {**os.environ, "KUBECONFIG": str(cluster.admin.kubeconfig),
           "HELM_CACHE_HOME": str(home / "cache"), "HELM_CONFIG_HOME": str(home / "config"),
           "HELM_DATA_HOME": str(home / "data")}
    done = subprocess.run([binary or helm_binary(), *args], capture_output=True, text=True,
                          env=env,
                          timeout=180)
    if check and done.returncode != 0:
        raise AssertionError(f"helm {' '.join(args)} exited {done.returncode}:\n{done.stderr}")
    return done


@dataclass
class Installation:
    """The chart installed as release ``tailguard`` in ``tailguard-system``."""

    cluster: ControlPlane
    admin: Client
    deployment: dict[str, Any]
    """The operator Deployment the chart installed (as stored)."""
    identity: Identity
    """The operator's ServiceAccount, as a kubeconfig with a bound token."""
    processes: list[subprocess.Popen[bytes]] = field(default_factory=list)
    release: str = RELEASE
    namespace: str = RELEASE_NAMESPACE

    def refresh(self) -> None:
        """Read the operator Deployment again and get a new token for its ServiceAccount
        (after an uninstall and install, the old token's ServiceAccount is gone)."""
        selector = f"app.kubernetes.io/instance={self.release},app.kubernetes.io/component=operator"
        (self.deployment,) = wait_for(lambda: self.admin.list(
            "deployments", self.namespace, labels=selector), what="the operator Deployment")
        account = self.deployment["spec"]["template"]["spec"]["serviceAccountName"]
        self.identity = self.cluster.token_identity(
            f"operator-{self.release}", namespace=self.namespace, service_account=account)

    @property
    def user(self) -> str:
        """The operator's user name in audit events and RBAC."""
        return self.identity.user

    def environment(self) -> dict[str, str]:
        """The container's environment as the chart wrote it (literal values only; ``POD_ID``
        comes from the downward API and is set to a name of our own)."""
        (container,) = self.deployment["spec"]["template"]["spec"]["containers"]
        env = {e["name"]: e["value"] for e in container.get("env", []) if "value" in e}
        env["POD_ID"] = f"{RELEASE}-operator-test-{os.getpid()}"
        return env

    def start_operator(self, log: Path, extra_env: Mapping[str, str] | None = None
                       ) -> subprocess.Popen[bytes]:
        """Start ``tailguard operator`` as the chart's pod would run it (the chart's default
        watches every namespace); wait until its health endpoint answers.

        ``extra_env`` overrides chart values for test speed (``TAILGUARD_RESYNC_SECONDS``...).

        Raises:
            AssertionError: it exited, or its health endpoint did not answer in 60 s.
        """
        env = {key: value for key, value in os.environ.items()
               if not key.startswith("TAILGUARD_") and key != "KUBERNETES_SERVICE_HOST"}
        env.update(self.environment())
        port = free_port()
        # This process runs on the host, outside the cluster's network namespace: no pod IP
        # is reachable from here (and nothing may be sent toward one), so the SLO guard is
        # off; several run at once, so neither do they serve /metrics on a fixed port. The
        # operator the chart deploys on the real node runs both (tests/cluster/test_guard.py).
        env.update({"KUBECONFIG": str(self.identity.kubeconfig),
                    "TAILGUARD_LIVENESS_ENDPOINT": f"http://127.0.0.1:{port}/healthz",
                    "TAILGUARD_GUARD": "false", "TAILGUARD_METRICS_PORT": "0",
                    **(extra_env or {})})
        tailguard = Path(sys.executable).with_name("tailguard")
        with open(log, "ab") as out:
            proc = subprocess.Popen([str(tailguard), "operator"], env=env,
                                    stdout=out, stderr=subprocess.STDOUT,
                                    stdin=subprocess.DEVNULL, preexec_fn=end_with_parent)
        self.processes.append(proc)
        wait_for(lambda: proc.poll() is not None or _healthy(port), timeout=60,
                 what="the operator's health endpoint")
        if proc.poll() is not None:
            raise AssertionError(f"the operator exited with {proc.returncode}:\n"
                                 f"{log.read_text()[-3000:]}")
        return proc

    def stop_operator(self, proc: subprocess.Popen[bytes], timeout: float = 20) -> int:
        """SIGTERM the operator (as the kubelet would) and wait; returns its exit code."""
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=5)
        return proc.returncode


def install(cluster: ControlPlane, admin: Client, values: Mapping[str, Any] | None = None, *,
            release: str = RELEASE, namespace: str = RELEASE_NAMESPACE) -> Installation:
    """``helm install`` the chart (CRD included, as a template, unless ``values`` say
    otherwise) and wait until the CRD is Established; a token for the operator's
    ServiceAccount.

    Raises:
        AssertionError: helm refused (its stderr attached).
    """
    args = ["install", release, str(CHART), "--namespace", namespace, "--create-namespace"]
    if values:
        path = cluster.workdir / f"values-{release}.yaml"
        path.write_text(yaml.safe_dump(dict(values)))
        args += ["-f", str(path)]
    helm(cluster, *args)
    wait_for(lambda: established(admin) and _listable(admin), timeout=30,
             what="the CRD to be Established and its storage ready")
    installation = Installation(cluster, admin, {}, cluster.admin, release=release,
                                namespace=namespace)
    installation.refresh()
    return installation


def apply_peering_crds(cluster: ControlPlane) -> list[dict[str, Any]]:
    """Apply kopf's peering CRDs as the chart renders them (``peering.enabled``), as the admin,
    outside any release (kopf operators share them), and wait until they are Established;
    return everything else that rendering holds.

    Raises:
        subprocess.CalledProcessError: kubectl refused, or the CRDs were not Established in 30 s.
    """
    rendered = helm(cluster, "template", "tailguard", str(CHART), "-n", RELEASE_NAMESPACE,
                    "--set", "peering.enabled=true").stdout
    docs = [d for d in yaml.safe_load_all(rendered) if d]
    crds = [d for d in docs if d["kind"] == "CustomResourceDefinition"
            and d["spec"]["group"] == "kopf.dev"]
    cluster.kubectl("apply", "-f", "-", input=yaml.safe_dump_all(crds))
    cluster.kubectl("wait", "--for=condition=Established", "--timeout=30s",
                    *(f"crd/{d['metadata']['name']}" for d in crds))
    return [d for d in docs if d not in crds]


def established(admin: Client) -> bool:
    """The InferenceService CRD exists and is Established (its API is served)."""
    crd = admin.get("customresourcedefinitions", None, CRD_NAME) or {}
    return any(c["type"] == "Established" and c["status"] == "True"
               for c in (crd.get("status") or {}).get("conditions", []))


def _listable(admin: Client) -> bool:
    """A list of InferenceServices succeeds: for a moment after a CRD is Established the API
    server answers 429 "storage is (re)initializing", and a watch opened then can stay silent
    until it times out (seen with kopf 1.45 on v1.37)."""
    try:  # resourceVersion=0: served from the watch cache, which is what is initializing
        admin.request("GET", admin.path("inferenceservices"), query={"resourceVersion": "0"})
    except ApiError:
        return False
    return True


def _healthy(port: int) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=1) as r:
            return bool(r.status == 200)
    except OSError:
        return False
