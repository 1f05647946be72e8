"""The queue, batch formation, and the loop that feeds one model thread.

Two layers:

* :class:`BatchQueue` -- plain state with no clock and no asyncio: FIFO requests measured in
  rows, when the forming batch should close, and which row ranges make the next batch. Every
  method that needs the time takes a monotonic ``now`` in seconds.
* :class:`Batcher` -- the async shell: admission, one future per request, a deadline timer per
  request, and one loop that awaits the model in a single worker thread while the event loop
  keeps accepting and refusing.

Batch policy (``spec.batching``): when the model is free, take up to ``max_batch_size`` queued
rows. With ``max_wait_ms > 0`` the forming batch may wait for batch-mates until ``max_wait_ms``
after its FIRST request arrived; with 0 it goes at once, so requests arriving during a model call
form the next batch and batches grow with load, never with waiting. A request larger than
``max_batch_size`` is taken in chunks, in order, and reassembled.

Clock: ``time.perf_counter`` (sub-microsecond). uvloop's ``loop.time()`` advances in whole
milliseconds, so the loop is used only for relative timers (``call_later``).
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from itertools import accumulate
from time import perf_counter
from typing import Any, Callable

import numpy as np

from .admission import DrainEstimate, admit
from .errors import DeadlineExceeded, Draining, GraceEnded, ModelFailed, TailguardError
from .rows import (Outputs, Unisolated, concat_outputs, gather_rows, isolation_budget,
                   predict_isolating, split_outputs)

logger = logging.getLogger(__name__)

class Request:
    """One admitted request: ``x`` of shape ``(n_rows, n_features)`` float64.

    ``future`` resolves to the request's own :data:`Outputs` or raises a
    :class:`~tailguard_runtime.errors.TailguardError`. ``taken`` counts rows handed to the model;
    a request whose future is done (answered, expired, cancelled) is skipped by the queue.
    """

    __slots__ = ("x", "n_rows", "arrival", "deadline", "future", "taken", "parts", "timer")

    def __init__(self, x: np.ndarray, arrival: float, deadline: float, future: Any) -> None:
        self.x = x
        self.n_rows = x.shape[0]
        self.arrival = arrival
        self.deadline = deadline
        self.future = future
        self.taken = 0
        self.parts: list[Outputs] = []
        self.timer: asyncio.TimerHandle | None = None


WINDOW_SLACK_S = 0.002
"""Seconds a forming batch keeps in hand before the earliest deadline (event-loop latency)."""

Segment = tuple[Request, int, int]
"""Rows ``[start, stop)`` of one request that go into a batch (see :mod:`.rows`)."""


class BatchQueue:
    """FIFO of requests, counted in rows. No clock, no asyncio, no I/O.

    ``queued_rows`` is the number of rows waiting (not yet handed to the model) of live requests;
    it is the unit of ``maxQueueSize`` and of the queue-depth gauge.
    """

    def __init__(self, max_batch_size: int, max_wait_s: float) -> None:
        self.max_batch_size = max_batch_size
        self.max_wait_s = max_wait_s
        self.flush = False
        """Dispatch without waiting for batch-mates (set while draining)."""
        self.queued_rows = 0
        self._items: deque[Request] = deque()

    def __len__(self) -> int:
        return len(self._items)

    def push(self, request: Request) -> None:
        """Append an admitted request."""
        self._items.append(request)
        self.queued_rows += request.n_rows - request.taken

    def discard(self, request: Request) -> None:
        """Forget a request's untaken rows (it expired or was cancelled); idempotent."""
        self.queued_rows -= request.n_rows - request.taken
        request.taken = request.n_rows

    def dispatch_at(self, batch_s: float = 0.0) -> float | None:
        """When the next batch should go if the model is free (monotonic seconds).

        ``None`` when nothing is queued; ``-inf`` (at once) when the batch is already full, when
        ``max_wait_s`` is 0, or when flushing; otherwise the first queued request's arrival plus
        ``max_wait_s``, but no later than the earliest queued deadline minus twice ``batch_s``
        (the expected model time, in seconds) and 2 ms of slack: waiting for batch-mates never
        costs a request its deadline, even when the model call runs slower than usual.
        """
        self._drop_dead_head()
        if not self._items:
            return None
        if self.flush or self.max_wait_s <= 0 or self.queued_rows >= self.max_batch_size:
            return float("-inf")
        earliest = min(r.deadline for r in self._items if not r.future.done())
        return min(self._items[0].arrival + self.max_wait_s,
                   earliest - 2 * batch_s - WINDOW_SLACK_S)

    def take(self, now: float) -> tuple[list[Segment], list[Request]]:
        """Form the next batch of at most ``max_batch_size`` rows.

        Returns ``(segments, expired)``: the row ranges for the model, in queue order, and the
        requests whose deadline is at or before ``now`` (their rows are dropped here, before
        they reach the model; the caller answers them 504).
        """
        segments: list[Segment] = []
        expired: list[Request] = []
        room = self.max_batch_size
        items = self._items
        while items and room:
            request = items[0]
            if request.future.done() or request.taken >= request.n_rows:
                self.discard(request)
                items.popleft()
                continue
            if request.deadline <= now:
                self.discard(request)
                items.popleft()
                expired.append(request)
                continue
            start = request.taken
            stop = min(request.n_rows, start + room)
            segments.append((request, start, stop))
            request.taken = stop
            self.queued_rows -= stop - start
            room -= stop - start
            if stop == request.n_rows:
                items.popleft()
        return segments, expired

    def pending(self) -> list[Request]:
        """The live requests still holding untaken rows, in order."""
        return [r for r in self._items if not r.future.done() and r.taken < r.n_rows]

    def _drop_dead_head(self) -> None:
        items = self._items
        while items and (items[0].future.done() or items[0].taken >= items[0].n_rows):
            self.discard(items.popleft())


class Batcher:
    """Queue, admission and the batch loop for one model.

    ``run`` is the model call (:attr:`Predictor.run`); it is only ever called from this
    batcher's single worker thread. ``observe_batch(rows, seconds)`` and
    ``observe_queue_wait(seconds)`` are metric hooks.
    """

    def __init__(self, run: Callable[[np.ndarray], Outputs], *, max_batch_size: int,
                 max_wait_ms: float, max_queue_size: int, name: str = "model",
                 observe_batch: Callable[[int, float], None] | None = None,
                 observe_queue_wait: Callable[[float], None] | None = None) -> None:
        self._run = run
        self.max_queue_size = max_queue_size
        self.queue = BatchQueue(max_batch_size, max_wait_ms / 1000.0)
        self.estimate = DrainEstimate()
        self.busy = False
        self.draining = False
        self.in_flight: set[Request] = set()
        self._observe_batch = observe_batch or (lambda rows, seconds: None)
        self._observe_queue_wait = observe_queue_wait or (lambda seconds: None)
        self._isolation_budget = isolation_budget(max_batch_size)
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"tailguard-{name}")
        self._wakeup: asyncio.Future[None] | None = None
        self._task: asyncio.Task[None] | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._depth_row_s = 0.0
        self._depth_at: float | None = None

    def _account(self, now: float) -> None:
        """Add the queue depth since the last change to the row-seconds integral; call just
        before ``queued_rows`` changes, with ``now`` in ``perf_counter`` seconds."""
        if self._depth_at is not None:
            self._depth_row_s += self.queue.queued_rows * (now - self._depth_at)
        self._depth_at = now

    def queue_row_seconds(self, now: float) -> float:
        """Cumulative integral of the queue depth over time since :meth:`start`, in row-seconds
        (``now`` in ``perf_counter`` seconds). Its difference between two reads divided by the
        seconds between them is the exact mean queue depth (rows) of that window, and sums over
        replicas, which a sampled gauge is not."""
        if self._depth_at is None:
            return self._depth_row_s
        return self._depth_row_s + self.queue.queued_rows * (now - self._depth_at)

    def start(self) -> None:
        """Start the batch loop on the running event loop."""
        self._loop = asyncio.get_running_loop()
        self._depth_at = perf_counter()
        self._task = self._loop.create_task(self._guarded_loop(), name="tailguard-batch-loop")

    async def submit(self, x: np.ndarray, timeout_s: float) -> Outputs:
        """Admit ``x`` (``(n_rows, n_features)`` float64) and wait for its outputs.

        ``timeout_s`` is the request's deadline in seconds from now.

        Raises:
            Draining: the runtime is shutting down, or the grace period ended first.
            PayloadTooLarge, Overloaded: refused by :func:`~tailguard_runtime.admission.admit`.
            DeadlineExceeded: the deadline passed before the answer was ready.
            ModelFailed: the model raised on this request's own rows.
        """
        if self.draining:
            raise Draining("runtime is draining: not accepting new requests")
        loop = self._loop
        assert loop is not None, "Batcher.start() was not called"
        queue = self.queue
        admit(n_rows=x.shape[0], queued_rows=queue.queued_rows, max_queue_size=self.max_queue_size,
              max_batch_size=queue.max_batch_size, time_left_s=timeout_s, estimate=self.estimate,
              busy=self.busy)
        now = perf_counter()
        future: asyncio.Future[Outputs] = loop.create_future()
        request = Request(x, now, now + timeout_s, future)
        request.timer = loop.call_later(timeout_s, self._expire, request)
        self._account(now)
        queue.push(request)
        self.in_flight.add(request)
        wakeup = self._wakeup
        if wakeup is not None and not wakeup.done():
            wakeup.set_result(None)
        try:
            return await future
        except asyncio.CancelledError:
            self._account(perf_counter())
            queue.discard(request)
            raise
        finally:
            request.timer.cancel()
            self.in_flight.discard(request)

    @property
    def queue_depth(self) -> int:
        """Rows waiting for the model (the batch being computed not counted)."""
        return self.queue.queued_rows

    async def drain(self, grace_s: float) -> int:
        """Stop admitting, flush the forming batch, and wait up to ``grace_s`` seconds for every
        admitted request to be answered. Whatever is still unanswered then gets
        :class:`GraceEnded` (503). Returns how many requests got that 503."""
        self.draining = True
        self.queue.flush = True
        self._wake()
        loop = asyncio.get_running_loop()
        end = loop.time() + grace_s
        while self.in_flight and loop.time() < end:
            await asyncio.sleep(0.01)
        unanswered = [r for r in self.in_flight if not r.future.done()]
        for request in unanswered:
            self.queue.discard(request)
            request.future.set_exception(GraceEnded("grace period ended before the model answered"))
        await asyncio.sleep(0)  # let the handlers render their 503s
        return len(unanswered)

    async def close(self) -> None:
        """Stop the batch loop and the worker thread."""
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        self._executor.shutdown(wait=False, cancel_futures=True)

    def _wake(self) -> None:
        if self._wakeup is not None and not self._wakeup.done():
            self._wakeup.set_result(None)

    def _expire(self, request: Request) -> None:
        if not request.future.done():
            self._account(perf_counter())
            self.queue.discard(request)
            request.future.set_exception(DeadlineExceeded(
                f"deadline of {(request.deadline - request.arrival) * 1000:.0f} ms passed "
                "before the model answered"))

    async def _guarded_loop(self) -> None:
        try:
            await self._batch_loop()
        except asyncio.CancelledError:
            raise
        except BaseException:
            logger.exception("batch loop crashed; failing what it held")
            for request in list(self.in_flight):
                if not request.future.done():
                    request.future.set_exception(TailguardError("batch loop crashed"))
            raise

    async def _batch_loop(self) -> None:
        loop = asyncio.get_running_loop()
        queue = self.queue
        while True:
            at = queue.dispatch_at(self.estimate.batch_seconds or 0.0)
            now = perf_counter()
            if at is None or at > now:
                self._wakeup = loop.create_future()
                timer = None if at is None else loop.call_later(at - now, _resolve, self._wakeup)
                await self._wakeup
                self._wakeup = None
                if timer is not None:
                    timer.cancel()
                continue
            now = perf_counter()
            self._account(now)
            segments, expired = queue.take(now)
            for request in expired:
                self._expire(request)
            if not segments:
                continue
            for request, start, _ in segments:
                if start == 0:
                    self._observe_queue_wait(now - request.arrival)
            x = gather_rows(segments)
            cuts = list(accumulate(stop - start for _, start, stop in segments[:-1]))
            self.busy = True
            started = perf_counter()
            try:
                pieces = await loop.run_in_executor(self._executor, predict_isolating, self._run,
                                                    x, cuts, self._isolation_budget)
            finally:
                self.busy = False
            seconds = perf_counter() - started
            self.estimate.record(seconds)
            self._observe_batch(x.shape[0], seconds)
            self._deliver(segments, pieces)

    def _deliver(self, segments: list[Segment],
                 pieces: list[tuple[int, int, Outputs | BaseException]]) -> None:
        offset = 0
        for request, start, stop in segments:
            rows = stop - start
            result = split_outputs(pieces, offset, offset + rows)
            offset += rows
            future = request.future
            if future.done():
                continue
            if isinstance(result, Unisolated):
                self.queue.discard(request)
                future.set_exception(ModelFailed(
                    f"model raised on a batch of {result.n_requests} requests holding this one "
                    f"({result}); not isolated within {result.budget} model calls, so this "
                    "request may be sound: retry it", 500))
            elif isinstance(result, BaseException):
                self.queue.discard(request)
                status = 422 if isinstance(result, (ValueError, TypeError)) else 500
                future.set_exception(ModelFailed(
                    f"model raised on this request's rows: {type(result).__name__}: {result}", status))
            elif rows == request.n_rows:
                future.set_result(result)
            else:
                request.parts.append(result)
                if stop == request.n_rows:
                    future.set_result(concat_outputs(request.parts))


def _resolve(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)
