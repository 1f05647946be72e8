"""Row bookkeeping for batches: stack requests' rows, run the model with fault isolation, and
split the outputs back by row range. Pure functions over numpy arrays; no asyncio, no clock.

A *segment* is ``(request, start, stop)``: rows ``[start, stop)`` of ``request.x``, an array of
shape ``(n_rows, n_features)`` float64.
"""

from __future__ import annotations

from typing import Callable, Protocol, Sequence

import numpy as np

Outputs = tuple[np.ndarray, ...]
"""One array per model output, each with the row axis first."""


class HasRows(Protocol):
    """Anything holding rows: ``x`` of shape ``(n_rows, n_features)`` float64."""

    x: np.ndarray
    n_rows: int


def gather_rows(segments: Sequence[tuple[HasRows, int, int]]) -> np.ndarray:
    """Stack the segments' rows into one ``(n_rows, n_features)`` array (no copy for one whole
    request)."""
    if len(segments) == 1:
        request, start, stop = segments[0]
        return request.x if start == 0 and stop == request.n_rows else request.x[start:stop]
    return np.concatenate([r.x[a:b] for r, a, b in segments])


def predict_isolating(run: Callable[[np.ndarray], Outputs],
                      x: np.ndarray) -> list[tuple[int, int, Outputs | BaseException]]:
    """Run the model on ``x``; if it raises, bisect so only the offending rows fail.

    Returns pieces ``(start, stop, outputs-or-exception)`` that cover ``[0, n_rows)`` in order.
    A single row that still raises carries its exception. Costs ``O(k log n)`` extra model calls
    for ``k`` bad rows.
    """
    try:
        return [(0, x.shape[0], run(x))]
    except Exception as exc:
        if x.shape[0] == 1:
            return [(0, 1, exc)]
    mid = x.shape[0] // 2
    left = predict_isolating(run, x[:mid])
    right = predict_isolating(run, x[mid:])
    return left + [(a + mid, b + mid, out) for a, b, out in right]


def split_outputs(pieces: Sequence[tuple[int, int, Outputs | BaseException]],
                  start: int, stop: int) -> Outputs | BaseException:
    """The outputs for batch rows ``[start, stop)``, or the first exception among them."""
    if len(pieces) == 1:
        out = pieces[0][2]
        return out if isinstance(out, BaseException) else tuple(o[start:stop] for o in out)
    parts: list[Outputs] = []
    for a, b, out in pieces:
        if b <= start or a >= stop:
            continue
        if isinstance(out, BaseException):
            return out
        lo, hi = max(a, start) - a, min(b, stop) - a
        parts.append(tuple(o[lo:hi] for o in out))
    return concat_outputs(parts)


def concat_outputs(parts: Sequence[Outputs]) -> Outputs:
    """Join per-chunk outputs along the row axis."""
    if len(parts) == 1:
        return parts[0]
    return tuple(np.concatenate(cols) for cols in zip(*parts))
