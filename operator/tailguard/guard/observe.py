"""Windows from cumulative totals: what the SLO guard judges.

A runtime reports, per role, counts that only ever grow (``/tailguard/stats`` ``totals``; see
:class:`tailguard_runtime.stats.Totals`). One window is the difference of two reads of them:
windows never overlap, nothing is sampled, and the windows of several pods add up exactly (the
cluster part of the guard differences each pod, then sums). A counter that went down means the
process restarted (as Prometheus' ``increase`` assumes): the window then holds the counts since
the restart.

The latency histogram carries ``slo.p99LatencyMs`` as an exact bucket edge, so the number of
admitted requests slower than the SLO is a count, never an interpolation, and ``p99Ms`` is the
upper edge of the bucket that holds the 99th percentile (at most the SLO exactly when at most 1%
are slower). Pure: no clock, no I/O, no logging; times are passed in. :mod:`tailguard.guard.policy` judges the
result.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Mapping

from tailguard_runtime.stats import TotalsSnapshot

DEADLINE_REASONS = ("deadline",)
"""Refusal reasons that mean "refused for its deadline" (429 ``deadline``); 504s are admitted
requests that failed with ``deadline_exceeded`` and are counted from the failures."""


@dataclass(frozen=True)
class Counts:
    """What happened in one window: increments of :class:`TotalsSnapshot`. Add windows of several pods
    with ``+``. ``buckets`` holds per-bucket (not cumulative) increments, ``+Inf`` last."""

    admitted: int = 0
    failed: Mapping[str, int] = field(default_factory=dict)
    refused: Mapping[str, int] = field(default_factory=dict)
    queue_row_seconds: float = 0.0
    bounds_s: tuple[float, ...] = ()
    buckets: tuple[int, ...] = ()
    calls: int = 0
    slow_calls: int = 0
    call_seconds: float = 0.0
    excluded: Mapping[str, int] = field(default_factory=dict)
    """Answered requests left out of judgement, by reason
    (:data:`tailguard_runtime.stats.EXCLUDED_REASONS`)."""
    small_calls: int = 0
    small_calls_over_slo: int = 0

    def __add__(self, other: "Counts") -> "Counts":
        """The two windows together (several pods over the same interval).

        Raises:
            ValueError: the histograms have different bounds (pods with different SLOs).
        """
        if not self.bounds_s:
            return other
        if not other.bounds_s:
            return self
        if self.bounds_s != other.bounds_s:
            raise ValueError("cannot add windows whose latency histograms have different bounds")
        return Counts(self.admitted + other.admitted, _add(self.failed, other.failed),
                      _add(self.refused, other.refused),
                      self.queue_row_seconds + other.queue_row_seconds, self.bounds_s,
                      tuple(a + b for a, b in zip(self.buckets, other.buckets)),
                      self.calls + other.calls, self.slow_calls + other.slow_calls,
                      self.call_seconds + other.call_seconds, _add(self.excluded, other.excluded),
                      self.small_calls + other.small_calls,
                      self.small_calls_over_slo + other.small_calls_over_slo)


def difference(previous: TotalsSnapshot | None, current: TotalsSnapshot) -> Counts:
    """The window between two reads of one process's totals, reset-aware.

    With no previous read, a histogram with other bounds, or any count lower than before (the
    process restarted), the window is everything ``current`` holds (counted since the restart).
    """
    if previous is None or _reset(previous, current):
        return Counts(current.admitted, dict(current.failed), dict(current.refused),
                      current.queue_row_seconds, current.bounds_s, _per_bucket(current.counts),
                      current.calls, current.slow_calls, current.call_seconds,
                      dict(current.excluded), current.small_calls, current.small_calls_over_slo)
    return Counts(current.admitted - previous.admitted, _sub(current.failed, previous.failed),
                  _sub(current.refused, previous.refused),
                  current.queue_row_seconds - previous.queue_row_seconds, current.bounds_s,
                  tuple(c - p for c, p in zip(_per_bucket(current.counts),
                                              _per_bucket(previous.counts))),
                  current.calls - previous.calls, current.slow_calls - previous.slow_calls,
                  current.call_seconds - previous.call_seconds,
                  _sub(current.excluded, previous.excluded),
                  current.small_calls - previous.small_calls,
                  current.small_calls_over_slo - previous.small_calls_over_slo)


@dataclass(frozen=True)
class Observation:
    """One judged window of one role.

    Times are the caller's monotonic seconds; ``window_s`` is the window's length in seconds.
    ``slow``: admitted requests slower than the SLO (exact, at the SLO bucket edge).
    ``errors``: admitted requests that failed (504, model errors, 5xx); ``timeouts`` of them 504.
    ``deadline_refused``: refused for their deadline (429 ``deadline``). ``queue_depth``: mean
    rows waiting per replica over the window. ``p99_ms``: the upper edge (ms) of the bucket
    holding the 99th percentile of admitted latencies (capped at the last finite bound), ``None``
    without admitted requests. ``calls``: batches finished in the window, ``slow_calls`` of them
    with a model time longer than half the SLO; ``model_ms``: their mean model time (ms, the model's
    own time for each batch's rows, without the calls isolating failing requests), ``None``
    without calls. ``small_calls``: calls of at
    most half of ``maxBatchSize`` rows, ``small_calls_over_slo`` of them longer than the SLO.
    """

    role: str
    end_s: float
    window_s: float
    admitted: int
    slow: int
    errors: int
    timeouts: int
    deadline_refused: int
    queue_full: int
    refused_total: int
    queue_depth: float
    p99_ms: float | None
    replicas: int = 1
    calls: int = 0
    slow_calls: int = 0
    model_ms: float | None = None
    small_calls: int = 0
    small_calls_over_slo: int = 0
    excluded: Mapping[str, int] = field(default_factory=dict)
    """Answered requests left out of judgement, by reason: ``short_deadline`` (the client's
    own deadline was shorter than the SLO) and ``input_rejected`` (the model raised on the
    client's own rows while it still answered its reference row)."""

    @property
    def judged(self) -> int:
        """Requests the SLO is judged on: admitted ones, plus those refused for their deadline
        (a refused request never counts as meeting the SLO)."""
        return self.admitted + self.deadline_refused

    @property
    def slow_fraction(self) -> float:
        """Share of judged requests that did not meet the SLO (slower, or refused for their
        deadline); 0 with none judged."""
        return (self.slow + self.deadline_refused) / self.judged if self.judged else 0.0

    @property
    def error_rate(self) -> float:
        """Share of admitted requests that failed; 0 with none admitted."""
        return self.errors / self.admitted if self.admitted else 0.0

    @property
    def requests_per_second(self) -> float:
        """Admitted requests per second over the window."""
        return self.admitted / self.window_s if self.window_s > 0 else 0.0


def observe(counts: Counts, *, role: str, end_s: float, window_s: float, slo_ms: float,
            replicas: int = 1) -> Observation:
    """Turn a window's counts into an :class:`Observation` of ``role``.

    ``end_s`` (monotonic s) and ``window_s`` (s) place the window; ``slo_ms`` is
    ``spec.slo.p99LatencyMs``; ``replicas`` the pods summed into ``counts`` (queue depth is
    per replica, the unit of ``scaling.targetQueueDepth``).

    Raises:
        ValueError: ``slo_ms`` is not a bucket edge of the histogram (the runtime was started
            with another SLO), or ``replicas`` < 1.
    """
    if replicas < 1:
        raise ValueError(f"replicas must be at least 1, got {replicas}")
    edge = _edge_index(counts.bounds_s, slo_ms / 1000.0)
    within = sum(counts.buckets[:edge + 1])
    failed = counts.failed
    return Observation(
        role=role, end_s=end_s, window_s=window_s, admitted=counts.admitted,
        slow=counts.admitted - within,
        errors=sum(failed.values()),
        timeouts=failed.get("deadline_exceeded", 0),
        deadline_refused=sum(counts.refused.get(r, 0) for r in DEADLINE_REASONS),
        queue_full=counts.refused.get("queue_full", 0),
        refused_total=sum(counts.refused.values()),
        queue_depth=(counts.queue_row_seconds / window_s / replicas) if window_s > 0 else 0.0,
        p99_ms=_p99_ms(counts),
        replicas=replicas,
        calls=counts.calls,
        slow_calls=counts.slow_calls,
        model_ms=round(counts.call_seconds / counts.calls * 1000.0, 3) if counts.calls else None,
        small_calls=counts.small_calls,
        small_calls_over_slo=counts.small_calls_over_slo,
        excluded={k: v for k, v in counts.excluded.items() if v},
    )


def status_observed(obs: Observation, window_end: str) -> dict[str, Any]:
    """The CRD's ``status.observed`` for one window (``window_end``: RFC 3339 wall time).
    Values that do not exist (``p99Ms`` without samples, ``modelMs`` without calls) are left
    out: the schema declares numbers, not nulls."""
    observed = {
        "role": obs.role,
        "p99Ms": obs.p99_ms,
        "queueDepth": round(obs.queue_depth, 3),
        "requestsPerSecond": round(obs.requests_per_second, 3),
        "errorRate": round(obs.error_rate, 6),
        "rejectedPerSecond": round(obs.refused_total / obs.window_s, 3) if obs.window_s else 0.0,
        "deadlineRejected": obs.deadline_refused,
        "slowFraction": round(obs.slow_fraction, 6),
        "samples": obs.admitted,
        "judged": obs.judged,
        "excluded": dict(obs.excluded),
        "modelMs": obs.model_ms,
        "slowCalls": obs.slow_calls,
        "windowSeconds": round(obs.window_s, 3),
        "windowEnd": window_end,
    }
    return {key: value for key, value in observed.items() if value is not None}


def _edge_index(bounds_s: tuple[float, ...], edge_s: float) -> int:
    for i, bound in enumerate(bounds_s):
        if math.isclose(bound, edge_s, rel_tol=1e-9, abs_tol=1e-12):
            return i
    raise ValueError(f"the SLO of {edge_s * 1000:g} ms is not a bucket edge of the latency "
                     f"histogram (bounds in ms: {[round(b * 1000, 3) for b in bounds_s]})")


def _p99_ms(counts: Counts) -> float | None:
    if counts.admitted <= 0 or not counts.bounds_s:
        return None
    needed = math.ceil(0.99 * counts.admitted)
    running = 0
    for bound, n in zip(counts.bounds_s, counts.buckets):
        running += n
        if running >= needed:
            return round(bound * 1000.0, 3)
    return round(counts.bounds_s[-1] * 1000.0, 3)


def _per_bucket(cumulative: tuple[int, ...]) -> tuple[int, ...]:
    return tuple(c - p for c, p in zip(cumulative, (0, *cumulative[:-1])))


def _reset(previous: TotalsSnapshot, current: TotalsSnapshot) -> bool:
    if previous.bounds_s != current.bounds_s or current.admitted < previous.admitted:
        return True
    if (current.queue_row_seconds < previous.queue_row_seconds or current.calls < previous.calls
            or current.slow_calls < previous.slow_calls
            or current.small_calls < previous.small_calls
            or current.small_calls_over_slo < previous.small_calls_over_slo):
        return True
    if any(c < p for c, p in zip(current.counts, previous.counts)):
        return True
    return any(current.failed.get(k, 0) < v for k, v in previous.failed.items()) or any(
        current.refused.get(k, 0) < v for k, v in previous.refused.items()) or any(
        current.excluded.get(k, 0) < v for k, v in previous.excluded.items())


def _add(a: Mapping[str, int], b: Mapping[str, int]) -> dict[str, int]:
    out = dict(a)
    for key, value in b.items():
        out[key] = out.get(key, 0) + value
    return out


def _sub(a: Mapping[str, int], b: Mapping[str, int]) -> dict[str, int]:
    return {key: value - b.get(key, 0) for key, value in a.items() if value - b.get(key, 0)}
