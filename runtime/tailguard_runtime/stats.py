"""Sliding-window statistics for the JSON stats endpoint and the SLO guard.

Admitted requests (answered 200, 504 or a model error) contribute their latency; refusals
(429, 413, 4xx input errors, 503) are counted apart, so shedding load never looks like meeting the
SLO. Percentiles are exact over the window's samples; the latency histogram uses the Prometheus
buckets so several replicas' windows can be merged by adding counts.
"""

from __future__ import annotations

from collections import deque
from typing import Any

import numpy as np

from .metrics import LATENCY_BUCKETS_S

CAPACITY = 1 << 18
"""Admitted requests remembered (a ring buffer): 262,144, so a 10 s window is exact up to
about 26,000 requests per second; beyond that the window holds the most recent samples."""


class WindowStats:
    """Latencies and outcomes of the last ``window_s`` seconds, for one served model.

    Times are monotonic seconds passed in by the caller; latencies are seconds. Recording is
    O(1) (a write into preallocated arrays); :meth:`snapshot` is vectorised over the window.
    """

    def __init__(self, window_s: float, capacity: int = CAPACITY) -> None:
        self.window_s = window_s
        self._times = np.full(capacity, -np.inf)
        self._latencies = np.zeros(capacity)
        self._ok = np.zeros(capacity, dtype=bool)
        self._next = 0
        self._capacity = capacity
        self._refused: deque[tuple[float, str]] = deque(maxlen=capacity)

    def admitted(self, now: float, latency_s: float, ok: bool) -> None:
        """Record an admitted request answered at ``now``; ``ok`` is False for 504/model errors."""
        i = self._next
        self._times[i] = now
        self._latencies[i] = latency_s
        self._ok[i] = ok
        self._next = (i + 1) % self._capacity

    def refused(self, now: float, reason: str) -> None:
        """Record a request refused without reaching the model."""
        self._refused.append((now, reason))

    def snapshot(self, now: float, queue_depth: int) -> dict[str, Any]:
        """The window ending at ``now`` as a JSON-ready dict.

        Keys: ``windowSeconds``, ``samples`` (admitted requests), ``p50Ms``/``p95Ms``/``p99Ms``
        (``None`` with no samples), ``requestsPerSecond`` (admitted), ``errors`` (admitted but
        failed), ``errorRate``, ``rejected`` (by reason) and ``rejectedTotal``, ``queueDepth``
        (rows, now), and ``latencyHistogram`` with ``bucketsSeconds`` (upper bounds) and
        ``counts`` (cumulative, the last being ``+Inf``).
        """
        start = now - self.window_s
        in_window = self._times >= start
        latencies = np.sort(self._latencies[in_window])
        errors = int(np.count_nonzero(~self._ok[in_window]))
        while self._refused and self._refused[0][0] < start:
            self._refused.popleft()
        rejected: dict[str, int] = {}
        for _, reason in self._refused:
            rejected[reason] = rejected.get(reason, 0) + 1
        n = int(latencies.size)
        if n:
            p50, p95, p99 = (float(v) * 1000.0 for v in np.percentile(latencies, (50, 95, 99)))
        cumulative = np.searchsorted(latencies, _BOUNDS, side="right").tolist() + [n]
        return {
            "windowSeconds": self.window_s,
            "samples": n,
            "p50Ms": round(p50, 3) if n else None,
            "p95Ms": round(p95, 3) if n else None,
            "p99Ms": round(p99, 3) if n else None,
            "requestsPerSecond": round(n / self.window_s, 3),
            "errors": errors,
            "errorRate": round(errors / n, 6) if n else 0.0,
            "rejected": rejected,
            "rejectedTotal": sum(rejected.values()),
            "queueDepth": queue_depth,
            "latencyHistogram": {"bucketsSeconds": list(LATENCY_BUCKETS_S), "counts": cumulative},
        }


_BOUNDS = np.asarray(LATENCY_BUCKETS_S)
