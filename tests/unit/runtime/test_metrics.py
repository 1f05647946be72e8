"""Metric children bound per served model."""

from __future__ import annotations

from prometheus_client import REGISTRY

from tailguard_runtime import metrics
from tailguard_runtime.settings import RuntimeSettings


def test_the_declared_slo_is_exported_in_seconds() -> None:
    settings = RuntimeSettings.from_config({
        "name": "slo-gauge", "models": [{"role": "primary", "uri": "builtin://iris/random-forest"}],
        "slo": {"windowSeconds": 10, "p99LatencyMs": 40}})
    assert settings.slo_p99_ms == 40.0
    metrics.bind(settings.name, "1", "primary", slo_p99_s=settings.slo_p99_ms / 1000.0)
    labels = {"model": "slo-gauge", "version": "1", "role": "primary"}
    assert REGISTRY.get_sample_value("tailguard_slo_p99_latency_seconds", labels) == 0.04
    # counters exist at 0 before any request
    assert REGISTRY.get_sample_value("tailguard_requests_total", {**labels, "code": "429"}) == 0.0
    assert REGISTRY.get_sample_value("tailguard_rejections_total",
                                     {**labels, "reason": "queue_full"}) == 0.0


def test_no_slo_no_gauge() -> None:
    metrics.bind("no-slo", "1", "primary")
    assert REGISTRY.get_sample_value("tailguard_slo_p99_latency_seconds",
                                     {"model": "no-slo", "version": "1", "role": "primary"}) is None
