"""The sliding window behind /tailguard/stats."""

from __future__ import annotations

import numpy as np
import pytest

from tailguard_runtime.stats import WindowStats


def test_percentiles_cover_only_the_window_and_refusals_stay_apart() -> None:
    stats = WindowStats(window_s=10.0, capacity=1024)
    stats.admitted(now=1.0, latency_s=5.0, ok=True)  # falls out of the window below
    for i in range(100):
        stats.admitted(now=20.0 + i * 0.01, latency_s=(i + 1) / 1000.0, ok=i != 0)
    stats.refused(now=2.0, reason="deadline")  # out of the window
    for _ in range(7):
        stats.refused(now=25.0, reason="queue_full")
    snap = stats.snapshot(now=25.0, queue_depth=3)
    assert snap["samples"] == 100
    assert snap["p50Ms"] == pytest.approx(np.percentile(np.arange(1, 101), 50))
    assert snap["p99Ms"] == pytest.approx(np.percentile(np.arange(1, 101), 99))
    assert snap["errors"] == 1 and snap["errorRate"] == pytest.approx(0.01)
    assert snap["rejected"] == {"queue_full": 7} and snap["rejectedTotal"] == 7
    assert snap["queueDepth"] == 3 and snap["requestsPerSecond"] == pytest.approx(10.0)
    buckets = snap["latencyHistogram"]["bucketsSeconds"]
    counts = snap["latencyHistogram"]["counts"]
    assert len(counts) == len(buckets) + 1 and counts[-1] == 100
    assert counts[buckets.index(0.01)] == 10  # 1..10 ms are <= 10 ms


def test_empty_window_has_no_percentiles() -> None:
    snap = WindowStats(window_s=5.0, capacity=8).snapshot(now=100.0, queue_depth=0)
    assert snap["samples"] == 0 and snap["p99Ms"] is None and snap["errorRate"] == 0.0


def test_ring_buffer_keeps_the_most_recent_samples() -> None:
    stats = WindowStats(window_s=100.0, capacity=8)
    for i in range(20):
        stats.admitted(now=float(i), latency_s=float(i), ok=True)
    snap = stats.snapshot(now=20.0, queue_depth=0)
    assert snap["samples"] == 8 and snap["p50Ms"] == pytest.approx(15.5 * 1000)
