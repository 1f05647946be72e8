"""Runtime settings built from the runtime config JSON: the ``connections`` block."""

from __future__ import annotations

import pytest

from tailguard_runtime.settings import ConnectionSettings, RuntimeSettings

MODELS = [{"role": "primary", "uri": "builtin://iris/logistic-regression"}]


def test_connection_bounds_default_when_the_block_is_absent() -> None:
    settings = RuntimeSettings.from_config({"name": "iris", "models": MODELS})
    assert settings.connections == ConnectionSettings()
    assert settings.connections.max_connections is None  # from the open-file limit


def test_connection_bounds_are_read_in_their_units() -> None:
    settings = RuntimeSettings.from_config({"name": "iris", "models": MODELS, "connections": {
        "maxConnections": 48, "keepAliveSeconds": 2, "maxConnectionAgeSeconds": 5,
        "requestHeadTimeoutSeconds": 1.5,
        "requestBodyTimeoutSeconds": 3, "sendStallTimeoutSeconds": 4,
        "maxPipelinedRequests": 8, "refusalsPerSecond": 5, "refusalDelaySeconds": 0.5}})
    assert settings.connections == ConnectionSettings(
        max_connections=48, keep_alive_s=2.0, max_connection_age_s=5.0,
        request_head_timeout_s=1.5,
        request_body_timeout_s=3.0, send_stall_timeout_s=4.0, max_pipelined=8,
        refusals_per_s=5.0, refusal_delay_s=0.5)


@pytest.mark.parametrize("key", ["maxConnections", "maxConnectionAgeSeconds",
                                 "requestHeadTimeoutSeconds",
                                 "maxPipelinedRequests", "refusalsPerSecond",
                                 "refusalDelaySeconds"])
def test_a_bound_that_is_not_positive_is_refused_naming_it(key: str) -> None:
    with pytest.raises(ValueError, match=f"connections.{key} must be positive"):
        RuntimeSettings.from_config({"name": "iris", "models": MODELS,
                                     "connections": {key: 0}})


def test_the_config_written_is_the_config_read() -> None:
    """``to_config`` (the operator's side) and ``from_config`` (the runtime's) are one format:
    a round trip keeps every setting the file carries, whole numbers stay integers."""
    from tailguard_runtime.settings import BatchingSettings, ModelSettings

    settings = RuntimeSettings(
        name="iris",
        models=(ModelSettings("builtin://iris/random-forest", "primary", None, "3"),
                ModelSettings("file:///m/lr.joblib", "fallback", "a" * 64, "1")),
        batching=BatchingSettings(max_batch_size=8, max_wait_ms=2.5, max_queue_size=64,
                                  timeout_ms=750.0),
        stats_window_seconds=15.0, slo_p99_ms=40.0, drain_grace_seconds=12.0,
        connections=ConnectionSettings(max_connections=48, keep_alive_s=2.0, max_pipelined=4))
    config = settings.to_config("fallback")
    assert config["activeModel"] == "fallback"
    assert config["slo"] == {"windowSeconds": 15, "p99LatencyMs": 40}
    assert config["batching"]["maxWaitMs"] == 2.5 and config["batching"]["timeoutMs"] == 750
    assert RuntimeSettings.from_config(config) == settings
    plain = RuntimeSettings(name="iris", models=settings.models[:1])
    assert "connections" not in plain.to_config("primary")
    assert RuntimeSettings.from_config(plain.to_config("primary")) == plain


def test_a_pod_of_one_role_reads_its_model_and_the_active_role_from_the_same_file() -> None:
    both = RuntimeSettings.from_config({"name": "iris", "models": [
        *MODELS, {"role": "fallback", "uri": "builtin://iris/random-forest"}]})
    config = both.to_config("fallback")
    assert [m.role for m in both.for_role("fallback").models] == ["fallback"]
    assert RuntimeSettings.active_model_of(config, "primary") == "fallback"
    assert RuntimeSettings.active_model_of({"name": "iris"}, "primary") == "primary"
    with pytest.raises(ValueError, match="distinct roles"):
        RuntimeSettings.from_config({"name": "iris", "models": MODELS}).for_role("fallback")
