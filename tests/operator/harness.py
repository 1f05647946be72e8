"""Helpers shared by the operator tests: examples, polling, and reading the fake's state."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any, Callable

import yaml
from fakeapi import FakeApiServer, Record

from tailguard_operator import spec

NAMESPACE = "default"
CHILD_PLURALS = ("configmaps", "services", "deployments", "horizontalpodautoscalers",
                 "poddisruptionbudgets")
EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
#: An HPA v2 ``behavior`` using every field the CRD allows.
BEHAVIOR = {
    "scaleUp": {"stabilizationWindowSeconds": 0, "selectPolicy": "Max",
                "policies": [{"type": "Pods", "value": 4, "periodSeconds": 15},
                             {"type": "Percent", "value": 100, "periodSeconds": 15}]},
    "scaleDown": {"stabilizationWindowSeconds": 300,
                  "policies": [{"type": "Pods", "value": 1, "periodSeconds": 60}]},
}

OPERATOR_ARGS = ["run", "--standalone", "--namespace", NAMESPACE,
                 "-m", "tailguard_operator.handlers"]


def example(name: str = "iris", **spec_changes: Any) -> dict[str, Any]:
    """An InferenceService from ``examples/NAME.yaml`` in the test namespace, with top-level
    spec fields replaced."""
    body = yaml.safe_load((EXAMPLES / f"{name}.yaml").read_text())
    body["metadata"]["namespace"] = NAMESPACE
    body["spec"].update(spec_changes)
    return body  # type: ignore[no-any-return]


def wait_for(predicate: Callable[[], Any], timeout: float = 15.0, what: str = "") -> Any:
    """Poll ``predicate`` every 20 ms until it returns something truthy; return that.

    Raises:
        AssertionError: still falsy after ``timeout`` seconds.
    """
    deadline = time.monotonic() + timeout
    while True:
        result = predicate()
        if result:
            return result
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what or predicate}")
        time.sleep(0.02)


def settle(fake: FakeApiServer, quiet: float = 0.7, timeout: float = 15.0) -> None:
    """Wait until the fake has received no request (watches aside) for ``quiet`` seconds."""
    deadline = time.monotonic() + timeout
    seen, since = -1, time.monotonic()
    while time.monotonic() < deadline:
        count = len([r for r in fake.requests if r.query.get("watch") not in ("true", "1")])
        if count != seen:
            seen, since = count, time.monotonic()
        elif time.monotonic() - since >= quiet:
            return
        time.sleep(0.02)
    raise AssertionError("the operator never went quiet")


def child_writes(fake: FakeApiServer, start: int = 0) -> list[Record]:
    """Write requests (POST/PUT/PATCH/DELETE) to the children's kinds since ``start``."""
    return [r for r in fake.requests[start:]
            if r.method in ("POST", "PUT", "PATCH", "DELETE")
            and any(f"/{plural}" in r.path for plural in CHILD_PLURALS)]


def must_get(fake: FakeApiServer, plural: str, name: str,
             namespace: str = NAMESPACE) -> dict[str, Any]:
    """A stored object that must exist."""
    obj = fake.get(plural, namespace, name)
    assert obj is not None, f"{plural}/{name} is not stored"
    return obj


def status_of(fake: FakeApiServer, name: str = "iris") -> dict[str, Any]:
    """The stored InferenceService's status (empty when it has none)."""
    obj = fake.get(spec.PLURAL, NAMESPACE, name) or {}
    return obj.get("status") or {}


def condition(fake: FakeApiServer, type_: str, name: str = "iris") -> dict[str, Any]:
    """A stored status condition (empty when absent)."""
    for cond in status_of(fake, name).get("conditions") or []:
        if cond["type"] == type_:
            return cond  # type: ignore[no-any-return]
    return {}


def make_ready(fake: FakeApiServer, deployment: str, ready: int) -> None:
    """Play the Deployment controller: report ``ready`` Ready replicas for ``deployment``."""
    fake.patch("deployments", NAMESPACE, deployment,
               {"status": {"replicas": ready, "readyReplicas": ready,
                           "availableReplicas": ready, "updatedReplicas": ready}},
               subresource="status")


strict = spec.forbid_unknown


def events(fake: FakeApiServer, reason: str | None = None) -> list[dict[str, Any]]:
    """Stored core/v1 Events (of ``reason``, if given), oldest first."""
    found = sorted(fake.list("events", NAMESPACE),
                   key=lambda e: int(e["metadata"]["resourceVersion"]))
    return [e for e in found if reason is None or e["reason"] == reason]


def assert_contracts(fake: FakeApiServer) -> None:
    """What the fake cannot enforce but a cluster would: every InferenceService status ever
    stored validates against the CRD's status schema (nothing would be pruned), and no object
    ever carried a finalizer."""
    import jsonschema

    schema = strict(spec.object_schema()["properties"]["status"])
    validator = jsonschema.Draft202012Validator(
        schema, format_checker=jsonschema.Draft202012Validator.FORMAT_CHECKER)
    versions = fake.history(spec.PLURAL)
    assert versions, "no InferenceService was ever stored"
    for _, obj in versions:
        errors = [f"{'.'.join(map(str, e.absolute_path))}: {e.message}"
                  for e in validator.iter_errors(obj.get("status") or {})]
        assert not errors, errors
    for plural in (spec.PLURAL, *CHILD_PLURALS):
        for _, obj in fake.history(plural):
            assert not obj["metadata"].get("finalizers"), obj["metadata"]
    for record in fake.requests:
        assert "finalizers" not in json.dumps(record.body or {}), record
