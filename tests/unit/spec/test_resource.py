"""The CRD schema and the Python types agree: every spec field the CRD declares is read into
`resource.InferenceService`, and the typed view holds nothing the CRD does not declare."""

from __future__ import annotations

from typing import Any, Callable

from tailguard.spec import resource, schema

Getter = Callable[[resource.InferenceService], Any]

FIELDS: dict[str, Getter] = {
    **{f"{role}.{key}": (lambda s, r=role, a=attr: getattr(getattr(s, r), a))
       for role in ("model", "fallback")
       for key, attr in (("uri", "uri"), ("format", "format"), ("sha256", "sha256"),
                         ("version", "version"), ("maxBytes", "max_bytes"),
                         ("caConfigMap", "ca_config_map"))},
    "batching.maxBatchSize": lambda s: s.batching.max_batch_size,
    "batching.maxWaitMs": lambda s: s.batching.max_wait_ms,
    "batching.maxQueueSize": lambda s: s.batching.max_queue_size,
    "batching.timeoutMs": lambda s: s.batching.timeout_ms,
    "slo.p99LatencyMs": lambda s: s.slo.p99_latency_ms,
    "slo.windowSeconds": lambda s: s.slo.window_seconds,
    "slo.breachWindows": lambda s: s.slo.breach_windows,
    "slo.recoverWindows": lambda s: s.slo.recover_windows,
    "slo.minSamples": lambda s: s.slo.min_samples,
    "slo.maxErrorRate": lambda s: s.slo.max_error_rate,
    "scaling.minReplicas": lambda s: s.scaling.min_replicas,
    "scaling.maxReplicas": lambda s: s.scaling.max_replicas,
    "scaling.targetQueueDepth": lambda s: s.scaling.target_queue_depth,
    "scaling.targetCPUUtilization": lambda s: s.scaling.target_cpu_utilization,
    "scaling.behavior": lambda s: s.scaling.behavior,  # HPA v2 behavior, passed through verbatim
    "rollback.automatic": lambda s: s.automatic_rollback,
    "traffic": lambda s: s.traffic,
    "grpcPort": lambda s: s.grpc_port,
}

FULL = {
    "apiVersion": "tailguard.dev/v1alpha1", "kind": "InferenceService",
    "metadata": {"name": "full", "namespace": "ml"},
    "spec": {
        "model": {"uri": "https://models.example.com/forest.joblib", "format": "sklearn",
                  "sha256": "a" * 64, "version": "7", "maxBytes": 9000000,
                  "caConfigMap": "private-ca"},
        "fallback": {"uri": "https://models.example.com/linear.joblib?token=x", "format": "sklearn",
                     "sha256": "b" * 64, "version": "3", "maxBytes": 5000000,
                     "caConfigMap": "kube-root-ca.crt"},
        "batching": {"maxBatchSize": 48, "maxWaitMs": 2, "maxQueueSize": 480, "timeoutMs": 750},
        "slo": {"p99LatencyMs": 40, "windowSeconds": 15, "breachWindows": 2, "recoverWindows": 5,
                "minSamples": 30, "maxErrorRate": 0.05},
        "scaling": {"minReplicas": 2, "maxReplicas": 9, "targetQueueDepth": 12,
                    "targetCPUUtilization": 70,
                    "behavior": {"scaleDown": {"stabilizationWindowSeconds": 120}}},
        "rollback": {"automatic": False},
        "traffic": "fallback",
        "grpcPort": 9000,
    },
}


def _leaves(schema: dict[str, Any], prefix: str = "") -> set[str]:
    """Dotted paths of the spec's leaf fields; `behavior` counts as one (it is verbatim)."""
    out: set[str] = set()
    for key, sub in schema.get("properties", {}).items():
        path = f"{prefix}{key}"
        if "properties" in sub and key != "behavior":
            out |= _leaves(sub, path + ".")
        else:
            out.add(path)
    return out


def _at(doc: dict[str, Any], dotted: str) -> Any:
    for key in dotted.split("."):
        doc = doc[key]
    return doc


def test_every_crd_spec_field_has_a_typed_home_and_nothing_else_does() -> None:
    assert _leaves(schema.object_schema()["properties"]["spec"]) == set(FIELDS)


def test_the_typed_view_carries_every_value_of_the_object() -> None:
    isvc = resource.parse(FULL)
    assert (isvc.name, isvc.namespace) == ("full", "ml")
    for path, getter in FIELDS.items():
        assert getter(isvc) == _at(FULL["spec"], path), path


def _crd_default(path: str) -> Any:
    node = schema.object_schema()["properties"]["spec"]
    for key in path.split("."):
        node = node["properties"][key]
    return node["default"]


def test_crd_defaults_equal_the_dataclass_defaults() -> None:
    """The runtime's and the guard's dataclasses carry defaults of their own (a runtime config
    may omit a key; a test may build one by hand): each must be the CRD's, the one source."""
    from dataclasses import fields

    from tailguard_runtime.settings import BatchingSettings, ModelSettings, RuntimeSettings

    batching = {f.name: f.default for f in fields(BatchingSettings)}
    assert batching == {"max_batch_size": _crd_default("batching.maxBatchSize"),
                        "max_wait_ms": _crd_default("batching.maxWaitMs"),
                        "max_queue_size": _crd_default("batching.maxQueueSize"),
                        "timeout_ms": _crd_default("batching.timeoutMs")}
    assert ModelSettings.version == _crd_default("model.version") == _crd_default("fallback.version")
    assert RuntimeSettings.stats_window_seconds == _crd_default("slo.windowSeconds")
    assert resource.SLO.max_error_rate == _crd_default("slo.maxErrorRate")
    assert RuntimeSettings.grpc_port == resource.InferenceService.grpc_port == _crd_default(
        "grpcPort")


def test_a_yaml_syntax_error_is_one_line_naming_the_file_line_and_column() -> None:
    import pytest

    from tailguard.spec.yamledit import set_batching

    text = "apiVersion: tailguard.dev/v1alpha1\nkind: InferenceService\nspec: {model: {uri: x}\n"
    for parse in (lambda: resource.find_object(text, "svc.yaml"),
                  lambda: set_batching(text, {"maxBatchSize": 8}, "svc.yaml")):
        with pytest.raises(schema.SpecError) as info:
            parse()
        (line,) = info.value.errors
        assert "\n" not in line and "<unicode string>" not in line, line
        assert line.startswith("svc.yaml:4:1: not valid YAML: "), line
