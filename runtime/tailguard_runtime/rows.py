"""Row bookkeeping for batches: stack requests' rows, run the model with fault isolation, tell
a model that rejects its input from a model that is broken, and split the outputs back by row
range. Functions over numpy arrays; no asyncio, no clock (times are passed in).

A *segment* is ``(request, start, stop)``: rows ``[start, stop)`` of ``request.x``, an array of
shape ``(n_rows, n_features)`` float64.
"""

from __future__ import annotations

import math
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


class Unisolated(Exception):
    """The model raised on a group of ``n_requests`` requests, and the bisection budget ran out
    before it could tell which of them the model cannot take; ``cause`` is its exception. Not
    an answer: the batcher runs each of those requests again in a batch of its own."""

    def __init__(self, cause: BaseException, n_requests: int, budget: int) -> None:
        super().__init__(f"{type(cause).__name__}: {cause}")
        self.cause = cause
        self.n_requests = n_requests
        self.budget = budget


def isolation_budget(max_batch_size: int) -> int:
    """Extra model calls one failing batch may spend on bisection: enough to single out one
    failing request among ``max_batch_size`` (two calls per halving, ``ceil(log2 n)`` halvings),
    plus one. 13 for a batch of 64. Past it, the groups still failing get :class:`Unisolated`
    and the batcher runs each of their requests once more, alone. With the one call of
    :class:`ReferenceRow` that a batch rejecting rows may cost, a failing batch of ``n``
    requests costs the model at most ``2 + budget + n`` calls, and a sound request takes part
    in its batch's calls and at most one call of its own, whatever its batch-mates hold."""
    return 2 * max(1, math.ceil(math.log2(max(max_batch_size, 2)))) + 1


def predict_isolating(run: Callable[[np.ndarray], Outputs], x: np.ndarray,
                      cuts: Sequence[int] | None = None,
                      max_extra_calls: int | None = None,
                      ) -> list[tuple[int, int, Outputs | BaseException]]:
    """Run the model on ``x``; if it raises, bisect so only the offending pieces fail.

    ``cuts``: the row offsets where one request's rows end and the next one's begin
    (ascending, inside ``(0, n_rows)``); bisection splits only there, since a request fails
    whole if any of its rows fails. ``None``: every row is a piece. ``max_extra_calls``: the
    most model calls spent after the first one fails (``None``: no limit); a group still
    failing when it is spent is returned with :class:`Unisolated`.

    Returns pieces ``(start, stop, outputs-or-exception)`` that cover ``[0, n_rows)`` in order.
    A single piece that raises carries its exception. Costs at most ``2 k log2(p)`` extra
    model calls for ``k`` failing pieces out of ``p``.
    """
    try:
        return [(0, x.shape[0], run(x))]
    except Exception as exc:
        first = exc
    bounds = [0, *cuts, x.shape[0]] if cuts is not None else list(range(x.shape[0] + 1))
    budget = len(bounds) * 2 if max_extra_calls is None else max_extra_calls
    pieces: list[tuple[int, int, Outputs | BaseException]] = []
    spent = 0

    def bisect(lo: int, hi: int, exc: BaseException) -> None:
        nonlocal spent
        if hi - lo == 1:
            pieces.append((bounds[lo], bounds[hi], exc))
            return
        mid = (lo + hi) // 2
        for a, b in ((lo, mid), (mid, hi)):
            if spent >= budget:
                pieces.append((bounds[a], bounds[b], Unisolated(exc, b - a, budget)))
                continue
            spent += 1
            try:
                pieces.append((bounds[a], bounds[b], run(x[bounds[a]:bounds[b]])))
            except Exception as inner:
                bisect(a, b, inner)

    bisect(0, len(bounds) - 1, first)
    return pieces


REJECTIONS = (ValueError, TypeError)
"""What a model raises on input it cannot take (scikit-learn's convention): the request's own
rows failed, a 422, unless :class:`ReferenceRow` finds the model broken."""


def rejected_rows(pieces: Sequence[tuple[int, int, Outputs | BaseException]]) -> bool:
    """Whether the model rejected rows in these pieces (:data:`REJECTIONS`, isolated or not)."""
    for _, _, out in pieces:
        cause = out.cause if isinstance(out, Unisolated) else out
        if isinstance(cause, REJECTIONS):
            return True
    return False


class ReferenceRow:
    """Tells a model that rejects a client's rows from a model that rejects everything.

    A ``ValueError`` on a request's rows is the client's failure (422, never held against the
    model by the SLO guard) only while the model still answers a row it is known to take: the
    first row of the last batch it answered, or, before it answered any, a row of zeros. When
    the model raises on that row too, it is broken, and the rows it rejected are the model's
    failure (500, judged). So a client cannot make a sound model look broken by sending only
    rows it rejects, on a quiet service or a busy one, and a model that raises on every row is
    still rolled back.

    The check costs one model call of one row, at most once per batch that rejected rows and
    never within ``min_interval_s`` (seconds) of the last: a model loaded in a process does not
    change between two batches. Used by the batcher's one model thread only (not thread-safe).
    """

    def __init__(self, run: Callable[[np.ndarray], Outputs], min_interval_s: float = 0.25) -> None:
        self._run = run
        self._row: np.ndarray | None = None
        self._checked_at = -math.inf
        self._sound = True
        self.min_interval_s = min_interval_s

    def answered(self, x: np.ndarray,
                 pieces: Sequence[tuple[int, int, Outputs | BaseException]]) -> None:
        """Keep the first row of the first piece of ``x`` the model answered, if any."""
        for start, _, out in pieces:
            if not isinstance(out, BaseException):
                self._row = x[start:start + 1].copy()
                return

    def sound(self, n_features: int, now: float, *, check: bool = True) -> bool:
        """Whether the model still answers its reference row (``now``: monotonic seconds).
        ``check=False``, or within ``min_interval_s`` of the last check: the last verdict."""
        if not check or now - self._checked_at < self.min_interval_s:
            return self._sound
        row = self._row if self._row is not None else np.zeros((1, n_features))
        try:
            self._run(row)
            self._sound = True
        except Exception:
            self._sound = False
        self._checked_at = now
        return self._sound


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
