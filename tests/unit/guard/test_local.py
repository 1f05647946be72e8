"""The `tailguard up` guard shell on a fake clock, against a real in-process Runtime (models
loaded, no HTTP), and the CRD fields it relies on: every status field it writes is declared,
`slo.maxErrorRate` is defaulted and bounded, `delayMs` is accepted and applied."""

from __future__ import annotations

import io
import time
from typing import Any

import jsonschema
import pytest

from tailguard.guard.local import LocalGuard
from tailguard.spec import resource, schema
from tailguard.up.serve import not_applicable
from tailguard_runtime.errors import ModelLoadError
from tailguard_runtime.models import load_dataset, load_model
from tailguard_runtime.service import Runtime, load_runtime


def service(**slo: Any) -> resource.InferenceService:
    return resource.parse({
        "apiVersion": "tailguard.dev/v1alpha1", "kind": "InferenceService",
        "metadata": {"name": "unit"},
        "spec": {"model": {"uri": "builtin://iris/random-forest?trees=5&delayMs=1"},
                 "fallback": {"uri": "builtin://iris/logistic-regression"},
                 "slo": {"p99LatencyMs": 50, "windowSeconds": 1, "breachWindows": 2,
                         "recoverWindows": 2, "minSamples": 10, **slo}}})


class Clock:
    def __init__(self) -> None:
        self.now_s = 100.0

    def __call__(self) -> float:
        return self.now_s


def guarded(isvc: resource.InferenceService) -> tuple[Runtime, LocalGuard, Clock, io.StringIO]:
    runtime = load_runtime(isvc.runtime_settings())
    clock, out = Clock(), io.StringIO()
    guard = LocalGuard(runtime, isvc, out, clock=clock, wall=lambda: 1_800_000_000 + clock())
    guard.start()
    return runtime, guard, clock, out


def traffic(runtime: Runtime, n: int, latency_s: float) -> None:
    served = runtime.active
    for _ in range(n):
        served.stats.admitted(0.0, latency_s, True)


def status_schema() -> dict[str, Any]:
    status = schema.object_schema()["properties"]["status"]
    return schema.forbid_unknown(status)  # type: ignore[no-any-return]


def test_the_guard_rolls_back_a_slow_primary_and_its_status_fits_the_crd() -> None:
    runtime, guard, clock, out = guarded(service())
    labels = []
    for latency_s in (0.010, 0.120, 0.120, 0.120):
        clock.now_s += 1.0
        traffic(runtime, 40, latency_s)
        guard.tick()
        labels.append(guard.label())
    assert labels == ["ok", "breach 1/2", "rolled back", "rolled back"]
    assert runtime.active_role == "fallback" and runtime.last_switch is not None
    assert runtime.last_switch.by == "guard"
    assert "unit: automatic rollback to the fallback: the primary breaks the SLO (p99=150ms > " \
           "50ms: 100.0% of 40 requests slower than the SLO, 2 windows in a row)" in out.getvalue()
    status = guard.status()
    jsonschema.validate(status, status_schema())
    assert status["guard"]["state"] == "rolledBack"
    assert status["guard"]["rolledBackModel"] == "builtin://iris/random-forest?trees=5&delayMs=1@1"
    assert status["observed"]["role"] == "fallback"

    runtime.switch("primary", by="cli")  # tailguard rollforward
    clock.now_s += 1.0
    traffic(runtime, 40, 0.010)
    guard.tick()
    assert guard.label() == "ok" and "the SLO guard is re-armed" in out.getvalue()
    jsonschema.validate(guard.status(), status_schema())
    assert "rolledBackAt" not in guard.status()["guard"]


def test_a_manual_rollback_is_the_intent_and_the_guard_only_reports() -> None:
    runtime, guard, clock, out = guarded(service())
    runtime.switch("fallback", by="cli")
    for _ in range(4):
        clock.now_s += 1.0
        traffic(runtime, 40, 0.200)
        guard.tick()
    assert guard.label() == "manual" and runtime.active_role == "fallback"
    assert "rolled back by hand" in out.getvalue()
    conditions = {c["type"]: c for c in guard.status()["conditions"]}
    assert conditions["RolledBack"]["reason"] == "ManualRollback"
    assert conditions["SLOMet"]["status"] == "False"


def test_automatic_false_never_switches() -> None:
    isvc = resource.parse({
        "apiVersion": "tailguard.dev/v1alpha1", "kind": "InferenceService",
        "metadata": {"name": "unit"},
        "spec": {**service().spec, "rollback": {"automatic": False}}})
    runtime, guard, clock, _ = guarded(isvc)
    for _ in range(5):
        clock.now_s += 1.0
        traffic(runtime, 40, 0.200)
        guard.tick()
    assert runtime.active_role == "primary" and guard.label() == "breach 2/2"


def test_max_error_rate_is_defaulted_and_bounded() -> None:
    assert service().slo.max_error_rate == 0.01
    assert service(maxErrorRate=0.2).slo.max_error_rate == 0.2
    for bad in (-0.1, 1.5):
        with pytest.raises(schema.SpecError, match="spec.slo.maxErrorRate"):
            service(maxErrorRate=bad)


@pytest.mark.parametrize("uri, ok", [
    ("builtin://iris/random-forest?trees=5&delayMs=10", True),
    ("builtin://iris/logistic-regression?delayMs=0", True),
    ("builtin://iris/random-forest?delayMs=10000", False),
    ("builtin://iris/random-forest?delayMs=1.5", False),
    ("builtin://iris/random-forest?delayMs=10&trees=5", False),
])
def test_delay_ms_is_validated_by_the_crd_pattern(uri: str, ok: bool) -> None:
    obj = {"apiVersion": "tailguard.dev/v1alpha1", "kind": "InferenceService",
           "metadata": {"name": "d"},
           "spec": {"model": {"uri": uri}, "fallback": {"uri": "builtin://iris/logistic-regression?delayMs=1"},
                    "slo": {"p99LatencyMs": 50}}}
    if ok:
        resource.parse(obj)
    else:
        with pytest.raises(schema.SpecError, match="spec.model.uri"):
            resource.parse(obj)


def test_delay_ms_sleeps_in_every_model_call_and_keeps_the_answers() -> None:
    x, _ = load_dataset("iris")
    plain = load_model("builtin://iris/logistic-regression")
    slow = load_model("builtin://iris/logistic-regression?delayMs=30")
    started = time.perf_counter()
    labels, proba = slow.run(x[:5])
    assert time.perf_counter() - started >= 0.030  # a sleep lasts at least what it asks for
    assert labels.tolist() == plain.run(x[:5])[0].tolist()
    with pytest.raises(ModelLoadError, match="delayMs must be an integer"):
        load_model("builtin://iris/logistic-regression?delayMs=abc")


def test_guard_fields_are_no_longer_named_as_not_applied() -> None:
    lines = not_applicable({"slo": {"breachWindows": 2}, "rollback": {"automatic": True},
                            "scaling": {"targetQueueDepth": 4}})
    assert lines == []
    assert not_applicable({"scaling": {"maxReplicas": 3}}) == [
        "spec.scaling.maxReplicas: not applicable locally (autoscaling needs a cluster; "
        "tailguard up runs one process)"]
    assert not_applicable({"scaling": {"minReplicas": 2}, "model": {"caConfigMap": "ca"},
                           "fallback": {"caConfigMap": "ca"}}) == [
        "spec.scaling.minReplicas: not applicable locally (autoscaling needs a cluster; "
        "tailguard up runs one process)",
        "spec.model.caConfigMap, spec.fallback.caConfigMap: not applicable locally (a ConfigMap "
        "is read in a cluster; tailguard up trusts $TAILGUARD_MODEL_CA_FILE)"]


def test_an_idle_window_fits_the_crd_too() -> None:
    runtime, guard, clock, _ = guarded(service())
    clock.now_s += 1.0
    guard.tick()
    status = guard.status()
    jsonschema.validate(status, status_schema())
    assert "p99Ms" not in status["observed"] and status["guard"]["state"] == "idle"
