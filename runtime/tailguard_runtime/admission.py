"""Admission: take a request into the queue, or refuse it at once with a reason.

Pure arithmetic over numbers the batcher passes in (rows queued, the drain estimate, the
request's deadline and a monotonic ``now`` in seconds); no clock reads and no I/O. The queue is
measured in rows, the unit of ``maxQueueSize``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from tailguard_runtime.errors import Overloaded, PayloadTooLarge

EWMA_ALPHA = 0.2
"""Weight of the newest batch in the batch-duration average (a common smoothing choice: the
last ~5 batches dominate, so the estimate follows load changes within a few batches)."""


@dataclass
class DrainEstimate:
    """A running estimate of how long one batch takes, in seconds: how long it holds the
    queue up, from being taken to its answers handed out (the batcher records that).

    ``batch_seconds`` is ``None`` until the first batch completes; until then nothing is refused
    for its deadline (there is no evidence it cannot be met).
    """

    batch_seconds: float | None = None

    def record(self, seconds: float) -> None:
        """Fold in the duration of a finished batch, in seconds."""
        if self.batch_seconds is None:
            self.batch_seconds = seconds
        else:
            self.batch_seconds += EWMA_ALPHA * (seconds - self.batch_seconds)

    def wait_seconds(self, rows_ahead: int, max_batch_size: int, busy: bool) -> float:
        """Estimated seconds until ``rows_ahead`` queued rows have been through the model.

        ``busy``: a batch is computing now, or its answers are being handed out; its remainder
        is counted as one whole batch (an upper bound: the batcher does not know how far along
        the model is).
        """
        if self.batch_seconds is None:
            return 0.0
        batches = math.ceil(rows_ahead / max_batch_size) + (1 if busy else 0)
        return batches * self.batch_seconds


def check_fits(n_rows: int, max_queue_size: int) -> None:
    """Refuse a request that could never be queued, whatever the load.

    Raises:
        PayloadTooLarge: ``n_rows`` exceeds ``max_queue_size``.
    """
    if n_rows > max_queue_size:
        raise PayloadTooLarge(f"request has {n_rows} rows but the queue holds at most "
                              f"{max_queue_size} rows (maxQueueSize); split it into smaller requests")


def admit(*, n_rows: int, queued_rows: int, max_queue_size: int, max_batch_size: int,
          time_left_s: float, estimate: DrainEstimate, busy: bool) -> None:
    """Decide whether a request of ``n_rows`` rows may join the queue.

    ``time_left_s`` is the seconds from now to the request's deadline.

    Raises:
        PayloadTooLarge: ``n_rows`` exceeds ``max_queue_size``; it could never fit.
        Overloaded: reason ``queue_full`` when the rows do not fit in the free queue space;
            reason ``deadline`` when work is ahead (rows queued or a batch computing) and the
            estimated wait for it plus this request's own rows exceeds ``time_left_s``. With
            nothing ahead a request is always admitted, so an estimate made stale by one slow
            batch cannot lock the server out: the next batch refreshes it. ``retry_after_s`` is the estimated time for the
            current queue to drain, rounded up to whole seconds (at least 1).
    """
    check_fits(n_rows, max_queue_size)
    drain_s = estimate.wait_seconds(queued_rows, max_batch_size, busy)
    if queued_rows + n_rows > max_queue_size:
        raise Overloaded(f"queue full: {queued_rows} of {max_queue_size} rows waiting, request "
                         f"has {n_rows}", math.ceil(drain_s), "queue_full")
    if not queued_rows and not busy:
        return  # nothing ahead: run it, whatever a possibly stale estimate says
    needed_s = estimate.wait_seconds(queued_rows + n_rows, max_batch_size, busy)
    if needed_s > time_left_s:
        raise Overloaded(f"deadline cannot be met: about {needed_s * 1000:.0f} ms of queued work "
                         f"ahead, {max(time_left_s, 0) * 1000:.0f} ms left", math.ceil(drain_s),
                         "deadline")


REFUSAL_BURST_S = 5.0
"""A connection's refusal bucket holds this many seconds of its refill rate: 10 refusals at
the default 2 a second, enough for a client's burst of mistakes to be answered at once."""


@dataclass
class RefusalPacer:
    """How long to hold a refusal (a 4xx for the client's own request) before answering it.

    Refusing is cheap but not free: reading a request, parsing what it holds and answering
    costs the event loop about as much as serving a small one (0.3-0.4 ms on the reference
    machine). A client that sends refused requests back to back (a compressed body over the
    limit, rows the model cannot take) is answered as fast as the loop can, so two such clients
    took a third of the core. A token bucket of ``burst`` refusals, refilled at ``rate_per_s``,
    lets refusals within it through at once; past it, each waits ``delay_s`` before its answer.
    A client sending refused requests in a loop then gets about one answer per ``delay_s`` per
    connection, while a client's occasional mistake is answered at once. The idea is HAProxy's
    ``tarpit`` for abusive requests, applied only past a budget.

    ``now`` is a monotonic clock in seconds; nothing here reads a clock.
    """

    rate_per_s: float
    burst: float
    delay_s: float
    tokens: float = -1.0
    """Refusals left in the bucket; -1: not started (the bucket starts full)."""
    stamp: float = 0.0
    """``now`` of the last refusal, s."""

    def delay(self, now: float) -> float:
        """Seconds to wait before answering a refusal made at ``now`` (0 or ``delay_s``)."""
        if self.tokens < 0:
            self.tokens = self.burst
        else:
            self.tokens = min(self.burst, self.tokens + (now - self.stamp) * self.rate_per_s)
        self.stamp = now
        if self.tokens >= 1.0:
            self.tokens -= 1.0
            return 0.0
        return self.delay_s
