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

MAX_SAMPLES = 500_000
"""Hard cap on remembered samples (memory bound at very high rates)."""


class WindowStats:
    """Latencies and outcomes of the last ``window_s`` seconds, for one served model.

    Times are monotonic seconds passed in by the caller; latencies are seconds.
    """

    def __init__(self, window_s: float) -> None:
        self.window_s = window_s
        self._admitted: deque[tuple[float, float, bool]] = deque(maxlen=MAX_SAMPLES)
        self._refused: deque[tuple[float, str]] = deque(maxlen=MAX_SAMPLES)

    def admitted(self, now: float, latency_s: float, ok: bool) -> None:
        """Record an admitted request answered at ``now``; ``ok`` is False for 504/model errors."""
        self._admitted.append((now, latency_s, ok))

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
        while self._admitted and self._admitted[0][0] < start:
            self._admitted.popleft()
        while self._refused and self._refused[0][0] < start:
            self._refused.popleft()
        latencies = np.fromiter((s[1] for s in self._admitted), dtype=np.float64,
                                count=len(self._admitted))
        errors = sum(1 for s in self._admitted if not s[2])
        rejected: dict[str, int] = {}
        for _, reason in self._refused:
            rejected[reason] = rejected.get(reason, 0) + 1
        n = latencies.size
        if n:
            p50, p95, p99 = (float(v) * 1000.0 for v in np.percentile(latencies, (50, 95, 99)))
        bounds = np.asarray(LATENCY_BUCKETS_S)
        cumulative = np.searchsorted(np.sort(latencies), bounds, side="right").tolist() + [n]
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
