"""What the operator tests share: examples, and a view of one test namespace on the real
control plane (objects as the API server stores them, the operator's requests from the audit
log)."""

from __future__ import annotations

import contextlib
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator, Mapping

import yaml

from harness import REPO
from harness.kube.audit import WRITE_VERBS, AuditLog, Write
from harness.kube.client import Client, wait_for
from harness.kube.install import Installation
from tailguard.spec import resource, schema

NAMESPACE = "default"
CHILD_PLURALS = ("configmaps", "services", "deployments", "horizontalpodautoscalers",
                 "poddisruptionbudgets")
EXAMPLES = REPO / "examples"
#: An HPA v2 ``behavior`` using every field the CRD allows.
BEHAVIOR = {
    "scaleUp": {"stabilizationWindowSeconds": 0, "selectPolicy": "Max",
                "policies": [{"type": "Pods", "value": 4, "periodSeconds": 15},
                             {"type": "Percent", "value": 100, "periodSeconds": 15}]},
    "scaleDown": {"stabilizationWindowSeconds": 300,
                  "policies": [{"type": "Pods", "value": 1, "periodSeconds": 60}]},
}
RESYNC_SECONDS = 1.5
"""The operator's resync period in the tests of the resync itself. Every other test runs with
the chart's default (120 s), so that only the watches can make it pass: a resync must never
hide a dead watch."""
CHILD_SELECTOR = "app.kubernetes.io/managed-by=tailguard-operator"


strict = schema.forbid_unknown


def example(name: str = "iris", namespace: str = NAMESPACE, **spec_changes: Any) -> dict[str, Any]:
    """An InferenceService from ``examples/NAME.yaml`` in ``namespace``, with top-level spec
    fields replaced."""
    body = yaml.safe_load((EXAMPLES / f"{name}.yaml").read_text())
    body["metadata"]["namespace"] = namespace
    body["spec"].update(spec_changes)
    return body  # type: ignore[no-any-return]


@dataclass
class Scene:
    """One test's namespace, the admin acting in it as a person would, and the operator run
    as the chart deploys it (``with scene.operator(): ...``)."""

    admin: Client
    namespace: str
    installation: Installation
    audit: AuditLog
    logs: Path
    start: int = 0
    """Where this test's part of the audit log begins (earlier tests' lines are not read)."""

    # --- acting ----------------------------------------------------------------------------

    @contextlib.contextmanager
    def operator(self, resync: bool = False) -> Iterator[subprocess.Popen[bytes]]:
        """Run the operator as the chart deploys it (every namespace) for a block; assert it
        stopped cleanly on SIGTERM. ``resync``: every :data:`RESYNC_SECONDS` instead of the
        chart's 120 s. Its log has a line per reconcile pass (:meth:`passes`)."""
        env = {"TAILGUARD_RETRY_DELAY_SECONDS": "0.5", "TAILGUARD_LOG_LEVEL": "DEBUG"}
        if resync:
            env["TAILGUARD_RESYNC_SECONDS"] = str(RESYNC_SECONDS)
        proc = self.installation.start_operator(self.logs, env)
        try:
            yield proc
        finally:
            code = self.installation.stop_operator(proc)
        assert code == 0, f"the operator exited with {code}:\n{self.log_tail()}"

    def log_tail(self, chars: int = 4000) -> str:
        """The end of the operator's log (for assertion messages)."""
        try:
            return self.logs.read_text(errors="replace")[-chars:]
        except OSError:
            return ""

    def create(self, body: Mapping[str, Any]) -> dict[str, Any]:
        return self.admin.create(body, self.namespace)

    def patch(self, plural: str, name: str, patch: Mapping[str, Any]) -> dict[str, Any]:
        return self.admin.patch(plural, self.namespace, name, patch)

    def delete(self, plural: str, name: str) -> None:
        self.admin.delete(plural, self.namespace, name)

    # --- looking ---------------------------------------------------------------------------

    def get(self, plural: str, name: str) -> dict[str, Any] | None:
        return self.admin.get(plural, self.namespace, name)

    def must_get(self, plural: str, name: str) -> dict[str, Any]:
        obj = self.get(plural, name)
        assert obj is not None, f"{plural}/{name} is not stored"
        return obj

    def list(self, plural: str) -> list[dict[str, Any]]:
        return self.admin.list(plural, self.namespace)

    def children(self, plural: str) -> list[dict[str, Any]]:
        """The objects of ``plural`` the operator made (the namespace also holds the cluster's
        own, such as the ``kube-root-ca.crt`` ConfigMap)."""
        return self.admin.list(plural, self.namespace, labels=CHILD_SELECTOR)

    def names(self, plural: str) -> list[str]:
        """Names of the operator's children of ``plural``."""
        return [o["metadata"]["name"] for o in self.children(plural)]

    def status(self, name: str = "iris") -> dict[str, Any]:
        """The stored InferenceService's status (empty when it has none)."""
        return (self.get(resource.PLURAL, name) or {}).get("status") or {}

    def condition(self, type_: str, name: str = "iris") -> dict[str, Any]:
        """A stored status condition (empty when absent)."""
        for cond in self.status(name).get("conditions") or []:
            if cond["type"] == type_:
                return cond  # type: ignore[no-any-return]
        return {}

    def selected_role(self, name: str = "iris") -> str:
        return self.must_get("services", name)["spec"]["selector"][  # type: ignore[no-any-return]
            "tailguard.dev/role"]

    def events(self, reason: str | None = None) -> list[dict[str, Any]]:
        """core/v1 Events in the namespace (of ``reason``, if given), oldest first."""
        found = sorted(self.list("events"), key=lambda e: e["metadata"]["creationTimestamp"])
        return [e for e in found if reason is None or e["reason"] == reason]

    def requests(self, since: int | None = None, everywhere: bool = False) -> list[Write]:
        """The operator's requests in this namespace (``everywhere``: in any namespace and
        cluster-scoped) since the audit offset ``since`` (default: the test's start)."""
        return self.audit.requests(self.start if since is None else since,
                                   user=self.installation.user,
                                   namespace=None if everywhere else self.namespace)

    def writes(self, since: int | None = None, everywhere: bool = False) -> list[Write]:
        """The operator's writes, as :meth:`requests`."""
        return [r for r in self.requests(since, everywhere) if r.verb in WRITE_VERBS]

    def child_writes(self, since: int | None = None) -> list[Write]:
        return [w for w in self.writes(since) if w.resource in CHILD_PLURALS]

    def log_mark(self) -> int:
        """Where the operator's log ends now, for :meth:`passes`."""
        try:
            return self.logs.stat().st_size
        except OSError:
            return 0

    def passes(self, since: int = 0, name: str = "iris") -> int:
        """Reconcile passes over ``name`` in this namespace logged since the log offset
        ``since`` (:meth:`log_mark`). The passes read the watch cache, so the audit log shows
        only those that write."""
        try:
            with open(self.logs, "rb") as fh:
                fh.seek(since)
                text = fh.read().decode(errors="replace")
        except OSError:
            return 0
        return text.count(f"pass service={self.namespace}/{name}\n")

    def settle(self, quiet: float = 1.5, timeout: float = 30.0) -> None:
        """Wait until the operator has written nothing in this namespace for ``quiet``
        seconds (its reads never go quiet when it resyncs often)."""
        deadline = time.monotonic() + timeout
        seen, since = -1, time.monotonic()
        while time.monotonic() < deadline:
            count = len(self.writes())
            if count != seen:
                seen, since = count, time.monotonic()
            elif time.monotonic() - since >= quiet:
                return
            time.sleep(0.05)
        raise AssertionError("the operator never went quiet")

    def wait(self, predicate: Any, what: str, timeout: float = 30.0) -> Any:
        """:func:`wait_for`, with the operator's log in the failure message."""
        try:
            return wait_for(predicate, timeout=timeout, what=what)
        except AssertionError as exc:
            raise AssertionError(f"{exc}\n--- operator log ---\n{self.log_tail()}") from None

    def first_status(self, name: str = "iris", generation: int = 1) -> None:
        """Wait until the operator has written the status of ``generation``, then settle."""
        self.wait(lambda: self.status(name).get("observedGeneration") == generation,
                  what=f"status of generation {generation}")
        self.settle()

    def ready_deployment(self, name: str, replicas: int) -> None:
        """Wait until a Deployment reports ``replicas`` Ready replicas (kwok's pods)."""
        self.wait(lambda: ((self.get("deployments", name) or {}).get("status") or {}).get(
            "readyReplicas") == replicas, what=f"{name} with {replicas} Ready replicas")


INVALID: dict[str, tuple[dict[str, Any], str]] = {
    "zero batch": (dict(batching={"maxBatchSize": 0}), "spec.batching.maxBatchSize"),
    "min above max": (dict(scaling={"minReplicas": 4, "maxReplicas": 2}),
                      "spec.scaling.minReplicas"),
    "waiting breaks the SLO": (dict(batching={"maxWaitMs": 25}), "spec.batching.maxWaitMs"),
    "fallback is the primary": (dict(fallback={"uri": "builtin://iris/random-forest"}),
                                "spec.fallback.uri"),
    "unknown traffic": (dict(traffic="canary"), "spec.traffic"),
    "unknown field": (dict(modle={"uri": "builtin://iris/random-forest"}), "'modle'"),
    "batch above the queue (defaults first)": (dict(batching={"maxBatchSize": 300}),
                                               "spec.batching.maxBatchSize"),
    "recovering faster than breaking": (
        dict(slo={"p99LatencyMs": 25, "breachWindows": 5, "recoverWindows": 2}),
        "spec.slo.recoverWindows"),
    "checksum of a builtin": (dict(model={"uri": "builtin://iris/random-forest",
                                          "sha256": "a" * 64}), "spec.model.sha256"),
    "checksum not hex": (dict(model={"uri": "file:///m.joblib", "sha256": "xyz"}),
                         "spec.model.sha256"),
    "http model off the cluster": (dict(model={"uri": "http://example.com/m.joblib",
                                              "sha256": "a" * 64}), "spec.model.uri"),
    "https model without checksum": (dict(model={"uri": "https://example.com/m.joblib"}),
                                     "spec.model.sha256"),
    "https model with a password": (dict(model={"uri": "https://u:p@example.com/m.joblib",
                                                "sha256": "a" * 64}), "spec.model.uri"),
    "download cap of a builtin": (dict(fallback={"uri": "builtin://iris/logistic-regression",
                                                 "maxBytes": 1000}), "spec.fallback.maxBytes"),
    "private CA of a plain-http model": (dict(model={"uri": "http://models.ml.svc/m.joblib",
                                                     "sha256": "a" * 64,
                                                     "caConfigMap": "ca"}),
                                         "spec.model.caConfigMap"),
    "claim path leaving its claim": (dict(model={"uri": "pvc://models/../secrets/m.joblib",
                                                 "sha256": "a" * 64}), "spec.model.uri"),
    "claim name not DNS": (dict(model={"uri": "pvc://Models/m.joblib"}), "spec.model.uri"),
    "zero download cap": (dict(model={"uri": "https://example.com/m.joblib",
                                      "sha256": "a" * 64, "maxBytes": 0}),
                          "spec.model.maxBytes"),
    "unknown dataset": (dict(model={"uri": "builtin://mnist/random-forest"}), "spec.model.uri"),
    "unknown estimator": (dict(fallback={"uri": "builtin://iris/xgboost"}),
                          "spec.fallback.uri"),
    "bad policy type": (dict(scaling={"behavior": {"scaleUp": {"policies": [
        {"type": "Bogus", "value": 1, "periodSeconds": 15}]}}}),
        "spec.scaling.behavior.scaleUp.policies.0.type"),
    "no scaling policies": (dict(scaling={"behavior": {"scaleUp": {"policies": []}}}),
                            "spec.scaling.behavior.scaleUp.policies"),
    "unknown behavior field": (dict(scaling={"behavior": {"scaleSideways": {}}}),
                               "spec.scaling.behavior"),
    "zero CPU target": (dict(scaling={"targetCPUUtilization": 0}),
                        "spec.scaling.targetCPUUtilization"),
    "no SLO": (dict(slo=None), "'slo' is a required property"),
    "wrong type": (dict(rollback={"automatic": "yes"}), "spec.rollback.automatic"),
}
