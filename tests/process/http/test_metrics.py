"""``/metrics`` (Prometheus text) and ``/tailguard/stats`` (JSON) tell the truth.

Each test gets a fresh server (primary and fallback probe models) so counters start from zero.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path
from types import ModuleType
from typing import Any, Iterator

import httpx
import numpy as np
import pytest

from harness.runtime import (
    Labels,
    RuntimeServer,
    batching,
    gated_row,
    labels,
    metric_families,
    new_gate,
    open_gate,
    probe_rows,
    probe_runtime,
    scrape,
    v1_body,
    v2_body,
)

NAME = "metered"
V1 = f"/v1/models/{NAME}:predict"
V2 = f"/v2/models/{NAME}/infer"
MAX_QUEUE = 16
HOLD_S = 0.8
"""How long the held batch of the traffic test runs at least, in seconds: past the 0.75 s bucket."""

FAMILIES = {
    "tailguard_request_duration_seconds": "histogram",
    "tailguard_queue_wait_seconds": "histogram",
    "tailguard_batch_size_rows": "histogram",
    "tailguard_batch_duration_seconds": "histogram",
    "tailguard_queue_depth": "gauge",
    "tailguard_in_flight_requests": "gauge",
    "tailguard_requests": "counter",      # exposed as tailguard_requests_total
    "tailguard_rejections": "counter",    # exposed as tailguard_rejections_total
    "tailguard_active_model": "gauge",
}


@pytest.fixture
def metered(tmp_path: Path,
            probe_module: tuple[ModuleType, Path]) -> Iterator[tuple[RuntimeServer, Any]]:
    with probe_runtime(probe_module, tmp_path, name=NAME, fallback=True,
                       batching=batching(max_batch_size=8, max_queue_size=MAX_QUEUE)) as served:
        yield served


def _key(role: str = "primary", **more: str) -> Labels:
    return labels(NAME, role=role, **more)


def test_fresh_server_exports_every_metric_at_zero(metered: tuple[RuntimeServer, Any]) -> None:
    server, _ = metered
    with server.client() as client:
        families = metric_families(client)
        samples = scrape(client)
        text = client.get("/metrics")
    assert text.headers["content-type"].startswith("text/plain")
    for name, kind in FAMILIES.items():
        assert name in families, f"{name} missing from /metrics"
        assert families[name].type == kind, (name, families[name].type)
        for sample in families[name].samples:
            assert {"model", "version", "role"} <= set(sample.labels), sample
            assert sample.labels["model"] == NAME and sample.labels["version"] == "1"
        assert {s.labels["role"] for s in families[name].samples} == {"primary", "fallback"}, name

    for role in ("primary", "fallback"):
        # gauges are present and read 0 when idle, not missing
        assert samples[("tailguard_queue_depth", _key(role))] == 0
        assert samples[("tailguard_in_flight_requests", _key(role))] == 0
        assert samples[("tailguard_request_duration_seconds_count", _key(role))] == 0
        assert samples[("tailguard_queue_wait_seconds_count", _key(role))] == 0
        assert samples[("tailguard_batch_size_rows_count", _key(role))] == 0
        assert samples[("tailguard_requests_total", _key(role, code="200"))] == 0
        assert samples[("tailguard_rejections_total", _key(role, reason="queue_full"))] == 0
    assert samples[("tailguard_active_model", _key("primary"))] == 1
    assert samples[("tailguard_active_model", _key("fallback"))] == 0
    # latency buckets resolve milliseconds
    bounds = sorted(float(s.labels["le"]) for s in families["tailguard_request_duration_seconds"]
                    .samples if s.name.endswith("_bucket") and s.labels["role"] == "primary")
    assert bounds[0] <= 0.001 and sum(b <= 0.005 for b in bounds) >= 4


def _poll(client: httpx.Client, want: dict[str, float], timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        samples = scrape(client)
        seen = {name: samples.get((name, _key())) for name in want}
        if seen == want:
            return
        assert time.monotonic() < deadline, f"wanted {want}, last saw {seen}"
        time.sleep(0.02)


def test_counters_gauges_and_stats_follow_traffic(metered: tuple[RuntimeServer, Any],
                                                  probe_module: tuple[ModuleType, Path]) -> None:
    server, model = metered
    goods = [probe_rows(n, seed=n * 10 + i) for i, n in enumerate((1, 2, 3, 1, 2))]
    with server.client(limits=httpx.Limits(max_connections=8)) as client:
        before = scrape(client)
        for i, x in enumerate(goods):
            r = client.post(V2, json=v2_body(x)) if i % 2 else client.post(V1, json=v1_body(x))
            assert r.status_code == 200, r.text
        assert client.post(V1, json={"instances": [[1.0, 2.0]]}).status_code == 422
        assert client.post(V1, json=v1_body(probe_rows(MAX_QUEUE + 1, seed=0))).status_code == 413
        assert client.post(V1, json=v1_body(goods[0]),
                           headers={"X-Request-Timeout-Ms": "soon"}).status_code == 400

        # while a held batch computes, a 3-row request waits: both gauges see it, in their
        # units. The batch is held by a gate, not a sleep, so the gauges are read while it
        # computes however slowly the machine runs; it is held at least HOLD_S once it runs.
        box: dict[str, httpx.Response] = {}
        gate = new_gate()
        slow = threading.Thread(target=lambda: box.__setitem__(
            "slow", client.post(V1, json=v1_body(gated_row(gate)))))
        slow.start()
        _poll(client, {"tailguard_in_flight_requests": 1, "tailguard_queue_depth": 0})
        waiting = probe_rows(3, seed=77)
        queued = threading.Thread(target=lambda: box.__setitem__(
            "queued", client.post(V1, json=v1_body(waiting))))
        queued.start()
        _poll(client, {"tailguard_in_flight_requests": 2, "tailguard_queue_depth": 3})
        time.sleep(HOLD_S)  # rows wait in the queue, so the held batch runs: hold it HOLD_S more
        open_gate(probe_module, gate)
        slow.join(timeout=30)
        queued.join(timeout=30)
        assert box["slow"].status_code == 200 and box["queued"].status_code == 200
        np.testing.assert_array_equal(box["queued"].json()["predictions"], model.predict(waiting))

        after = scrape(client)
        stats = client.get("/tailguard/stats").json()

    def delta(name: str, key: Labels) -> float:
        return after.get((name, key), 0.0) - before.get((name, key), 0.0)

    answered = len(goods) + 2
    assert delta("tailguard_requests_total", _key(code="200")) == answered
    assert delta("tailguard_requests_total", _key(code="422")) == 1
    assert delta("tailguard_requests_total", _key(code="413")) == 1
    assert delta("tailguard_requests_total", _key(code="400")) == 1
    assert delta("tailguard_rejections_total", _key(reason="invalid_input")) == 2
    assert delta("tailguard_rejections_total", _key(reason="too_large")) == 1
    assert delta("tailguard_rejections_total", _key(reason="queue_full")) == 0
    assert delta("tailguard_request_duration_seconds_count", _key()) == answered
    assert delta("tailguard_queue_wait_seconds_count", _key()) == answered
    rows = sum(len(x) for x in goods) + 1 + 3
    assert delta("tailguard_batch_size_rows_sum", _key()) == rows
    assert delta("tailguard_batch_duration_seconds_count", _key()) == \
        delta("tailguard_batch_size_rows_count", _key())
    # the held batch alone took HOLD_S
    assert delta("tailguard_batch_duration_seconds_sum", _key()) >= HOLD_S
    assert after[("tailguard_queue_depth", _key())] == 0
    assert after[("tailguard_in_flight_requests", _key())] == 0
    # the fallback took no traffic
    assert after[("tailguard_request_duration_seconds_count", _key("fallback"))] == 0
    assert after[("tailguard_requests_total", _key("fallback", code="200"))] == 0

    assert stats["name"] == NAME and stats["activeModel"] == "primary" and stats["ready"] is True
    primary = stats["models"]["primary"]
    assert primary["samples"] == answered
    for p in ("p50Ms", "p95Ms", "p99Ms"):
        assert isinstance(primary[p], (int, float))
    assert primary["p50Ms"] <= primary["p95Ms"] <= primary["p99Ms"]
    # the held request is among the samples: above the 0.75 s bucket. (Not "p99Ms >= 800": over
    # 7 samples np.percentile interpolates 0.94 * slowest + 0.06 * next, under 800 ms whenever
    # the queued request arrived late in the held batch.)
    histogram = primary["latencyHistogram"]
    above = histogram["bucketsSeconds"].index(0.75)
    assert histogram["counts"][above] < primary["samples"]
    assert primary["p99Ms"] >= 0.94 * HOLD_S * 1000
    assert primary["rejected"] == {"invalid_input": 2, "too_large": 1}
    assert primary["rejectedTotal"] == 3
    assert primary["errors"] == 0 and primary["errorRate"] == 0
    assert primary["queueDepth"] == 0
    assert primary["latencyHistogram"]["counts"][-1] == answered
    fallback = stats["models"]["fallback"]
    assert fallback["samples"] == 0 and fallback["p99Ms"] is None


def test_latencies_are_measured_finer_than_the_event_loop_tick(
        metered: tuple[RuntimeServer, Any]) -> None:
    """Request duration and queue wait must resolve well below a millisecond (the buckets go
    down to 0.5 ms, and a p99 SLO is judged from them). uvloop's ``loop.time()`` ticks in whole
    milliseconds (libuv's ``uv_now``): durations read from it are whole milliseconds, and a fast
    request reads 0 s. Twenty real durations never sum to a whole number of milliseconds."""
    server, _ = metered
    with server.client() as client:
        for i in range(20):
            assert client.post(V1, json=v1_body(probe_rows(1, seed=i))).status_code == 200
        samples = scrape(client)
        stats = client.get("/tailguard/stats").json()["models"]["primary"]
    assert samples[("tailguard_request_duration_seconds_count", _key())] == 20
    for name in ("tailguard_request_duration_seconds_sum", "tailguard_queue_wait_seconds_sum"):
        total_ms = samples[(name, _key())] * 1000.0
        assert abs(total_ms - round(total_ms)) > 1e-6, (
            f"{name} = {total_ms} ms: every duration is a whole number of milliseconds")
    assert stats["samples"] == 20
    assert stats["p50Ms"] > 0, "a request that went through the model took no time at all"
