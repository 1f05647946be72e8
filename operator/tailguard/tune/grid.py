"""The pure half of ``tailguard tune``: the grid drawn from the raw model table, and the choice.

The working rule of online serving: fix the latency SLO first, then take the batch policy that
gives the most throughput inside it. Larger batches pay less and less (rows/s flattens while a
call keeps getting slower), and waiting for batch-mates costs the first request of a batch its
latency. :func:`build_grid` turns the raw table (:mod:`tailguard.tune.rawtable`) into the ``maxBatchSize`` x
``maxWaitMs`` points worth serving; :func:`choose` takes every point's measurement and picks the
policy, with a one-line reason, or says plainly that none met the SLO and which came closest.

Pure: no clock, no I/O, no logging. ``tailguard tune`` (:mod:`tailguard.tune.search`) serves and measures.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

from tailguard.tune.rawtable import RawRow

PAYS = 0.10
"""A larger batch still pays when its rows/s beats the next smaller size's by more than this
share; the first size that does not is the table's knee (kept in the grid, nothing beyond)."""
CALLS_PER_SLO = 2.0
"""A batch size is usable only if this many calls of it (p90) fit in the SLO: a request that
arrives just after a call starts waits for it, then runs in the next one (the same rule the SLO
guard uses to tell a slow model from queueing, see :mod:`tailguard.guard.policy`)."""
TIE_SHARE = 0.02
"""Points whose throughput is within this share of the best are equal on throughput (one run's
noise on a shared machine); among them the lowest p99 wins, then the smaller batch and wait."""


@dataclass(frozen=True)
class Policy:
    """One batch policy: ``spec.batching.maxBatchSize`` (rows) and ``maxWaitMs`` (ms)."""

    max_batch_size: int
    max_wait_ms: int

    def label(self) -> str:
        """``maxBatchSize=32 maxWaitMs=2``."""
        return f"maxBatchSize={self.max_batch_size} maxWaitMs={self.max_wait_ms}"


@dataclass(frozen=True)
class Grid:
    """The points to serve: every ``batches`` x ``waits`` pair, and why these (``reason``)."""

    batches: tuple[int, ...]
    waits: tuple[int, ...]
    reason: str

    @property
    def policies(self) -> list[Policy]:
        """Batch-major order: ``[(b0, w0), (b0, w1), ..., (b1, w0), ...]``."""
        return [Policy(b, w) for b in self.batches for w in self.waits]


@dataclass(frozen=True)
class PointResult:
    """What serving one policy measured.

    ``throughput_rps``: sustained requests per second (answered 200 per second at the target
    rate, or the point's rate at SLO); latencies in ms over the 200 answers (None: no answer);
    ``meets_slo``: the measurement held the SLO (p99 within it, few enough failures);
    ``invalid``: it did not, and the run that decided it was one the generator limited, so it
    says nothing about the policy (neither met nor missed; never chosen); ``note``: why not,
    or anything worth saying (empty otherwise); ``detail``: the raw measurement for ``--json``.
    """

    policy: Policy
    throughput_rps: float
    p50_ms: float | None
    p95_ms: float | None
    p99_ms: float | None
    meets_slo: bool
    note: str = ""
    detail: dict[str, Any] | None = None
    invalid: bool = False

    @property
    def verdict(self) -> str:
        """``meets the SLO``, ``invalid`` or ``misses``, as the tables say it."""
        return "meets the SLO" if self.meets_slo else "invalid" if self.invalid else "misses"

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready: ``maxBatchSize``, ``maxWaitMs``, ``throughputRps``, ``p50Ms``, ``p95Ms``,
        ``p99Ms``, ``meetsSlo``, ``invalid``, ``note`` and ``detail``."""
        return {"maxBatchSize": self.policy.max_batch_size, "maxWaitMs": self.policy.max_wait_ms,
                "throughputRps": round(self.throughput_rps, 1), "p50Ms": self.p50_ms,
                "p95Ms": self.p95_ms, "p99Ms": self.p99_ms, "meetsSlo": self.meets_slo,
                "invalid": self.invalid, "note": self.note, "detail": self.detail}


@dataclass(frozen=True)
class Choice:
    """The outcome: ``chosen`` (None when no point met the SLO), ``closest`` (the point nearest
    the SLO when none met it, else None) and ``reason``, one line saying why."""

    chosen: PointResult | None
    closest: PointResult | None
    reason: str

    @property
    def ok(self) -> bool:
        """True when a point met the SLO."""
        return self.chosen is not None


def build_grid(table: Sequence[RawRow], slo_ms: float, max_queue_size: int, *,
               n_batches: int = 3, n_waits: int = 2) -> Grid:
    """The grid worth serving, from the raw table (rows in increasing batch order).

    Batch sizes: walk the table upward while a size is usable (``CALLS_PER_SLO`` calls at its
    p90 fit in ``slo_ms``; at most ``max_queue_size`` rows, the CRD's rule) and keep going while
    it pays (rows/s up by more than :data:`PAYS`); the first size that does not pay is the knee
    and the last one kept. The grid takes the ``n_batches`` largest of those (at least batch 1).
    Waits (integer ms, the CRD's type): 0, then evenly up to half the headroom left after two
    calls of the largest batch (``(slo - 2 * p90) / 2``), ``n_waits`` values in all, always
    below ``slo_ms``; only 0 when that headroom is under 2 ms.

    Raises:
        ValueError: an empty table, or ``n_batches``/``n_waits`` below 1.
    """
    if not table or n_batches < 1 or n_waits < 1:
        raise ValueError("build_grid needs a non-empty raw table and n_batches, n_waits >= 1")
    kept: list[RawRow] = []
    why = "the table ended"
    for row in table:
        if row.batch > max_queue_size:
            why = f"batch {row.batch} is over maxQueueSize {max_queue_size}"
            break
        if kept and CALLS_PER_SLO * row.p90_ms > slo_ms:
            why = (f"two calls of batch {row.batch} ({row.p90_ms:.1f} ms at p90 each) do not "
                   f"fit in the {slo_ms:g} ms SLO")
            break
        kept.append(row)
        if len(kept) > 1 and row.rows_per_s <= (1 + PAYS) * kept[-2].rows_per_s:
            why = (f"batch {row.batch} gives {row.rows_per_s:,.0f} rows/s, under "
                   f"{100 * PAYS:.0f}% more than batch {kept[-2].batch}: batching stops paying")
            break
    chosen = kept[-n_batches:] or [table[0]]
    largest = chosen[-1]
    headroom_ms = (slo_ms - CALLS_PER_SLO * largest.p90_ms) / 2
    waits = [0]
    if headroom_ms >= 2 and n_waits > 1:
        top = min(headroom_ms, slo_ms - 1)
        waits += [max(1, round(top * i / (n_waits - 1))) for i in range(1, n_waits)]
    waits = sorted(set(waits))
    left = (f"{max(slo_ms - CALLS_PER_SLO * largest.p90_ms, 0):.0f} ms the SLO leaves after "
            f"two calls of batch {largest.batch}")
    waited = (f"waits {', '.join(map(str, waits))} ms (0, then up to half the {left})"
              if len(waits) > 1 else
              "wait 0 ms only (" + ("one wait asked for" if n_waits == 1 else
                                    f"under 2 ms of headroom: half the {left}") + ")")
    reason = f"batch sizes {', '.join(str(r.batch) for r in chosen)} ({why}); {waited}"
    return Grid(tuple(r.batch for r in chosen), tuple(waits), reason)


def choose(points: Sequence[PointResult], slo_ms: float) -> Choice:
    """Pick the policy with the highest sustained throughput among the points that met the SLO.

    Throughputs within :data:`TIE_SHARE` of the best count as equal; among those the lowest
    p99 wins, then the smaller ``maxBatchSize`` and ``maxWaitMs``. When no point met the SLO,
    ``closest`` is the one with the lowest p99 (points with no answers last) and the reason
    names it and why it missed. An empty ``points`` gives no choice and no closest point.
    """
    if not points:
        return Choice(None, None, "no point was measured")
    meeting = [p for p in points if p.meets_slo]
    if not meeting:
        closest = min(points, key=_closeness)
        return Choice(None, closest, (
            f"no point meets the SLO (p99 <= {slo_ms:g} ms); the closest is "
            f"{closest.policy.label()}: {_numbers(closest)}"
            + (f" ({closest.note})" if closest.note else "")))
    best = max(p.throughput_rps for p in meeting)
    tied = [p for p in meeting if p.throughput_rps >= (1 - TIE_SHARE) * best]
    chosen = min(tied, key=lambda p: (p.p99_ms if p.p99_ms is not None else float("inf"),
                                      p.policy.max_batch_size, p.policy.max_wait_ms))
    tie = (f"; {len(tied)} points were within {100 * TIE_SHARE:.0f}% of the best throughput "
           f"({best:,.0f} req/s), and this one has the lowest p99" if len(tied) > 1 else "")
    return Choice(chosen, None, (
        f"{chosen.policy.label()}: {_numbers(chosen)}, within the {slo_ms:g} ms SLO; the "
        f"highest throughput of the {len(meeting)} of {len(points)} points that met it{tie}"))


def _closeness(p: PointResult) -> tuple[int, float]:
    return (0, p.p99_ms) if p.p99_ms is not None else (1, -p.throughput_rps)


def _numbers(p: PointResult) -> str:
    p99 = "no answers" if p.p99_ms is None else f"p99 {p.p99_ms:.1f} ms"
    return f"{p.throughput_rps:,.0f} req/s at {p99}"
