"""The one percentile definition of the tools (bench, tune, report).

Nearest rank: the q-th percentile of n values is the smallest value with at least q% of the
values at or below it, the value at rank ``ceil(q / 100 * n)`` (1-based) in sorted order
(the definition in NIST's Engineering Statistics Handbook, 7.2.6.2, without interpolation). It
never interpolates, so each percentile is a value that was really measured, and percentiles of
one sample are ordered. The runtime's own sliding-window percentiles (``/tailguard/stats``) are
numpy's and stay in the runtime, which imports nothing from here.
"""

from __future__ import annotations

import math
from typing import Sequence

import numpy as np


def nearest_rank(sorted_values: Sequence[float] | np.ndarray, q: float) -> float:
    """The ``q``-th percentile (0 < ``q`` <= 100) of ``sorted_values`` (ascending, any unit;
    the result is in the same unit) by nearest rank.

    Raises:
        ValueError: no values, or ``q`` outside (0, 100].
    """
    n = len(sorted_values)
    if n == 0:
        raise ValueError("no values")
    if not 0 < q <= 100:
        raise ValueError(f"q must be in (0, 100], got {q}")
    rank = max(1, math.ceil(q / 100.0 * n - 1e-9))
    return float(sorted_values[rank - 1])
