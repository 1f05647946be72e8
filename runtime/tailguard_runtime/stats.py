"""Request statistics of one served model: a sliding window for people, cumulative totals for
the SLO guard.

Admitted requests (answered 200, 504 or a model error) contribute their latency; refusals
(429, 413, 4xx input errors, 503) are counted apart, so shedding load never looks like meeting the
SLO. :class:`WindowStats` gives exact percentiles over a sliding window (the status line, the
JSON stats endpoint). :class:`Totals` only ever grows: the guard differences two reads to get one
window, so windows never overlap and several replicas sum exactly; its latency histogram has the
SLO itself as a bucket edge, so "slower than the SLO" is an exact count, not an interpolation.
"""

from __future__ import annotations

import bisect
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

import numpy as np

from tailguard_runtime.metrics import LATENCY_BUCKETS_S

EXCLUDED_REASONS = ("short_deadline", "input_rejected")
"""Why an answered request is left out of what the SLO guard judges, which is the model and
never its clients:

* ``short_deadline``: any answer (200, 504, or a 429 for its deadline) to a request whose
  client shortened its deadline (``X-Request-Timeout-Ms`` or v2 ``parameters.timeout``) below
  the SLO: it asked for less than the SLO promises, so missing it cannot witness a breach, and
  its fast answers must not dilute the slow ones either;
* ``input_rejected``: the model raised ``ValueError``/``TypeError`` on this request's own rows,
  run alone or isolated by bisection (a 422): the client's input, not the model, failed. A
  model that raises on every row is not excused: it also raises on its reference row
  (:class:`tailguard_runtime.rows.ReferenceRow`), and its rejections are then 500s, judged."""

CAPACITY = 1 << 18
"""Admitted requests remembered (a ring buffer): 262,144, so a 10 s window is exact up to
about 26,000 requests per second; beyond that the window holds the most recent samples."""


class WindowStats:
    """Latencies and outcomes of the last ``window_s`` seconds, for one served model.

    Times are monotonic seconds passed in by the caller; latencies are seconds. Recording is
    O(1) (a write into preallocated arrays); :meth:`snapshot` is vectorised over the window.
    """

    def __init__(self, window_s: float, capacity: int = CAPACITY,
                 slo_s: float | None = None, max_batch_size: int = 1) -> None:
        self.window_s = window_s
        self.totals = Totals(latency_bounds_s(slo_s),
                             slow_call_s=None if slo_s is None else slo_s / 2.0,
                             small_call_rows=max(1, max_batch_size // 2), slo_s=slo_s)
        """Cumulative counts since start, for the SLO guard (``slo_s``: the SLO in seconds,
        made a bucket edge; a batch whose model time is longer than half of it is a slow call;
        one of at most half of ``max_batch_size`` rows is a small call)."""
        self._times = np.full(capacity, -np.inf)
        self._latencies = np.zeros(capacity)
        self._ok = np.zeros(capacity, dtype=bool)
        self._next = 0
        self._capacity = capacity
        self._refused: deque[tuple[float, str]] = deque(maxlen=capacity)
        self._excluded: deque[tuple[float, str]] = deque(maxlen=capacity)

    def admitted(self, now: float, latency_s: float, ok: bool, reason: str | None = None) -> None:
        """Record an admitted request answered at ``now``; ``ok`` is False for 504/model errors,
        ``reason`` then the failure's slug (``deadline_exceeded``, ``model_error``, ...)."""
        self.totals.admit(latency_s, None if ok else (reason or "internal"))
        i = self._next
        self._times[i] = now
        self._latencies[i] = latency_s
        self._ok[i] = ok
        self._next = (i + 1) % self._capacity

    def refused(self, now: float, reason: str) -> None:
        """Record a request refused without reaching the model."""
        self.totals.refuse(reason)
        self._refused.append((now, reason))

    def excluded(self, now: float, reason: str) -> None:
        """Record a request whose outcome cannot judge the model (one of
        :data:`EXCLUDED_REASONS`): answered, but left out of the latency, the errors and the
        refusals the SLO guard judges."""
        self.totals.exclude(reason)
        self._excluded.append((now, reason))

    def snapshot(self, now: float, queue_depth: int) -> dict[str, Any]:
        """The window ending at ``now`` as a JSON-ready dict.

        Keys: ``windowSeconds``, ``samples`` (admitted requests), ``p50Ms``/``p95Ms``/``p99Ms``
        (``None`` with no samples), ``requestsPerSecond`` (admitted), ``errors`` (admitted but
        failed), ``errorRate``, ``rejected`` (by reason) and ``rejectedTotal``, ``judged`` (what
        the SLO guard judges: the samples plus those refused for their deadline), ``excluded``
        (answered but left out of judgement, by reason), ``queueDepth``
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
        while self._excluded and self._excluded[0][0] < start:
            self._excluded.popleft()
        excluded: dict[str, int] = {}
        for _, reason in self._excluded:
            excluded[reason] = excluded.get(reason, 0) + 1
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
            "judged": n + rejected.get("deadline", 0),
            "excluded": excluded,
            "queueDepth": queue_depth,
            "latencyHistogram": {"bucketsSeconds": list(LATENCY_BUCKETS_S), "counts": cumulative},
        }


_BOUNDS = np.asarray(LATENCY_BUCKETS_S)


def latency_bounds_s(slo_s: float | None) -> tuple[float, ...]:
    """The latency histogram's upper bounds in seconds: the Prometheus buckets
    (:data:`~tailguard_runtime.metrics.LATENCY_BUCKETS_S`) plus ``slo_s`` when given, sorted, so
    that the SLO is an exact bucket edge."""
    bounds = set(LATENCY_BUCKETS_S)
    if slo_s is not None:
        bounds.add(slo_s)
    return tuple(sorted(bounds))


class Totals:
    """Cumulative counts of one served model since the process started. Never decreases.

    ``bounds_s`` are the latency histogram's upper bounds in seconds (inclusive, as Prometheus'
    ``le``), sorted. Failures of admitted requests and refusals are counted by reason slug.
    Batches are counted with the model's own time for their rows in seconds (the first call;
    calls isolating a client's failing rows left out, so a client's poisoned rows never make a
    fast model look slow, and a slow model is slow on that first call), and apart those longer than ``slow_call_s`` (half the SLO: a request that waits
    for one such batch and then runs in the next can miss the SLO with no queue at all; shorter
    batches miss it only by queueing). Small calls, of at most ``small_call_rows`` rows (half of
    ``maxBatchSize``), are counted apart too, with how many took longer than ``slo_s`` (the SLO
    in seconds): every request in such a call misses the SLO with no queue ahead of it, and an
    overloaded model runs full batches, so a model slow on half-full ones is slow whatever its
    queue.
    """

    def __init__(self, bounds_s: Sequence[float], slow_call_s: float | None = None,
                 small_call_rows: int = 0, slo_s: float | None = None) -> None:
        self.bounds_s = tuple(bounds_s)
        self.slow_call_s = slow_call_s
        self.small_call_rows = small_call_rows
        self.slo_s = slo_s
        self.calls = 0
        self.slow_calls = 0
        self.call_seconds = 0.0
        self.small_calls = 0
        self.small_calls_over_slo = 0
        self._buckets = [0] * (len(self.bounds_s) + 1)  # the last is +Inf
        self.admitted = 0
        self.failed: dict[str, int] = {}
        self.refused: dict[str, int] = {}
        self.excluded: dict[str, int] = {}

    def admit(self, latency_s: float, failure: str | None) -> None:
        """Count one admitted request of ``latency_s`` seconds; ``failure`` is its reason slug
        when it failed (504, model error), else ``None``."""
        self._buckets[bisect.bisect_left(self.bounds_s, latency_s)] += 1
        self.admitted += 1
        if failure is not None:
            self.failed[failure] = self.failed.get(failure, 0) + 1

    def call(self, seconds: float, rows: int) -> None:
        """Count one batch of ``rows`` rows whose model time was ``seconds`` (its first call's:
        see the class docstring)."""
        self.calls += 1
        self.call_seconds += seconds
        if self.slow_call_s is not None and seconds > self.slow_call_s:
            self.slow_calls += 1
        if rows <= self.small_call_rows:
            self.small_calls += 1
            if self.slo_s is not None and seconds > self.slo_s:
                self.small_calls_over_slo += 1

    def refuse(self, reason: str) -> None:
        """Count one request refused before it reached the queue, by reason slug."""
        self.refused[reason] = self.refused.get(reason, 0) + 1

    def exclude(self, reason: str) -> None:
        """Count one request left out of judgement, by reason (:data:`EXCLUDED_REASONS`)."""
        self.excluded[reason] = self.excluded.get(reason, 0) + 1

    def snapshot(self, queue_row_seconds: float) -> dict[str, Any]:
        """The totals as a JSON-ready dict (the shape :mod:`tailguard.guard.observe` reads).

        Keys: ``admitted``, ``failed``, ``refused`` and ``excluded`` (by reason),
        ``queueRowSeconds`` (the
        queue depth's integral over time, passed in, in row-seconds), ``calls``,
        ``callSeconds`` and ``slowCalls`` (batches whose model time was longer than
        ``slowCallSeconds``), ``smallCalls`` and ``smallCallsOverSlo`` (batches of at most
        ``smallCallRows`` rows, and those of them longer than the SLO), and ``latencyHistogram`` with ``boundsSeconds`` and cumulative
        ``counts`` (one per bound, then ``+Inf``).
        """
        counts: list[int] = []
        running = 0
        for n in self._buckets:
            running += n
            counts.append(running)
        return {
            "admitted": self.admitted,
            "failed": dict(self.failed),
            "refused": dict(self.refused),
            "excluded": dict(self.excluded),
            "queueRowSeconds": queue_row_seconds,
            "calls": self.calls,
            "callSeconds": self.call_seconds,
            "slowCalls": self.slow_calls,
            "slowCallSeconds": self.slow_call_s,
            "smallCalls": self.small_calls,
            "smallCallsOverSlo": self.small_calls_over_slo,
            "smallCallRows": self.small_call_rows,
            "latencyHistogram": {"boundsSeconds": list(self.bounds_s), "counts": counts},
        }


@dataclass(frozen=True)
class TotalsSnapshot:
    """One read of a role's cumulative counts: :meth:`Totals.snapshot`'s JSON, parsed (by the
    SLO guard, which reads it over HTTP; :mod:`tailguard.guard.observe` takes differences).

    ``counts`` is the cumulative latency histogram: one count per upper bound in ``bounds_s``
    (seconds, inclusive) then the ``+Inf`` count, which equals ``admitted``.
    """

    admitted: int
    failed: Mapping[str, int]
    refused: Mapping[str, int]
    queue_row_seconds: float
    bounds_s: tuple[float, ...]
    counts: tuple[int, ...]
    calls: int = 0
    slow_calls: int = 0
    call_seconds: float = 0.0
    excluded: Mapping[str, int] = field(default_factory=dict)
    small_calls: int = 0
    small_calls_over_slo: int = 0

    @classmethod
    def from_json(cls, doc: Mapping[str, Any]) -> "TotalsSnapshot":
        """Build from the JSON shape :meth:`Totals.snapshot` returns.

        Raises:
            ValueError: a missing key, a wrong type, or counts that do not match the bounds.
        """
        try:
            hist = doc["latencyHistogram"]
            totals = cls(int(doc["admitted"]), {str(k): int(v) for k, v in doc["failed"].items()},
                         {str(k): int(v) for k, v in doc["refused"].items()},
                         float(doc["queueRowSeconds"]),
                         tuple(float(b) for b in hist["boundsSeconds"]),
                         tuple(int(c) for c in hist["counts"]), int(doc.get("calls", 0)),
                         int(doc.get("slowCalls", 0)), float(doc.get("callSeconds", 0.0)),
                         {str(k): int(v) for k, v in doc.get("excluded", {}).items()},
                         int(doc.get("smallCalls", 0)), int(doc.get("smallCallsOverSlo", 0)))
        except (KeyError, TypeError, AttributeError) as exc:
            raise ValueError(f"not a totals document: {type(exc).__name__}: {exc}") from None
        if len(totals.counts) != len(totals.bounds_s) + 1:
            raise ValueError(f"{len(totals.counts)} histogram counts for "
                             f"{len(totals.bounds_s)} bounds (expected one more, for +Inf)")
        return totals
