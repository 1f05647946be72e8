"""The raw model table: what one in-process model call costs at each batch size.

The classic table of online serving: per-call latency and rows per second at batch 1, 8, 32,
128 and 512, with no server, no queue and no HTTP in the way. It shows where batching stops
paying (rows/s flattens while the call keeps getting slower), which is where ``tailguard tune``
draws its grid, and it is the "latency and cost" baseline of ``tailguard report``. The
project's own benchmark (``benchmarks/predict_table.py``) times its reference model with the same
:func:`time_calls`.

Calls run in the calling thread; the caller limits BLAS/OpenMP threads as the runtime does
(:func:`tailguard_runtime.server.limit_threads`) so the table measures what serving runs.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import asdict, dataclass
from typing import Any, Callable, Sequence

import numpy as np

from tailguard._util.markdown import table as markdown_table
from tailguard._util.stats import nearest_rank

BATCH_SIZES = (1, 8, 32, 128, 512)
"""Rows per call of the table: the sizes that show where batching stops paying."""


@dataclass(frozen=True)
class RawRow:
    """One batch size of the table. ``median_ms`` and ``p90_ms``: one call's wall time (ms);
    ``rows_per_s``: ``batch / median`` (rows per second of one busy model thread)."""

    batch: int
    calls: int
    median_ms: float
    p90_ms: float
    rows_per_s: float

    def as_dict(self) -> dict[str, Any]:
        """``{"batch", "calls", "median_ms", "p90_ms", "rows_per_s"}``."""
        return asdict(self)


def time_calls(call: Callable[[np.ndarray], Any], x: np.ndarray, *, seconds: float = 3.0,
               min_calls: int = 5, max_calls: int = 5000, warmup_calls: int = 2,
               clock: Callable[[], float] = time.perf_counter) -> RawRow:
    """Time ``call(x)`` for ``x`` of shape ``(batch, n_features)``.

    Runs ``warmup_calls`` untimed calls, then calls until ``seconds`` have passed (at least
    ``min_calls``, at most ``max_calls`` calls). The 90th percentile is the nearest-rank value
    (:func:`tailguard._util.stats.nearest_rank`). Raises whatever ``call`` raises.
    """
    for _ in range(warmup_calls):
        call(x)
    times: list[float] = []
    end = clock() + seconds
    while len(times) < max_calls and (len(times) < min_calls or clock() < end):
        t0 = clock()
        call(x)
        times.append(clock() - t0)
    times.sort()
    median = statistics.median(times)
    batch = int(x.shape[0])
    return RawRow(batch, len(times), median * 1e3, nearest_rank(times, 90) * 1e3,
                  batch / median if median > 0 else float("inf"))


def batch_of(rows: np.ndarray, batch: int) -> np.ndarray:
    """``batch`` rows taken from ``rows`` (``(n, n_features)``) in order, wrapping around:
    float64 ``(batch, n_features)``, C-contiguous (what the batcher hands the model)."""
    if rows.ndim != 2 or rows.shape[0] < 1:
        raise ValueError(f"rows must be a non-empty (n_rows, n_features) array, got shape "
                         f"{list(rows.shape)}")
    index = np.arange(batch) % rows.shape[0]
    return np.ascontiguousarray(rows[index], dtype=np.float64)


def raw_table(call: Callable[[np.ndarray], Any], rows: np.ndarray,
              batches: Sequence[int] = BATCH_SIZES, *, seconds: float = 1.0) -> list[RawRow]:
    """Time ``call`` at every batch size (rows from :func:`batch_of`), about ``seconds`` each
    (at least 5 calls, so a slow model may take longer). Returns one :class:`RawRow` per
    batch, in order."""
    return [time_calls(call, batch_of(rows, b), seconds=seconds) for b in batches]


def markdown(table: Sequence[RawRow]) -> str:
    """The table as Markdown: batch, median and p90 ms per call, rows/s, calls."""
    return markdown_table(
        ["batch (rows)", "ms per call (median)", "ms per call (p90)", "rows/s", "calls"],
        ([r.batch, f"{r.median_ms:.2f}", f"{r.p90_ms:.2f}", f"{r.rows_per_s:,.0f}", r.calls]
         for r in table), align="rrrrr")
