"""The queue, batch formation, and the thread that runs one model.

Two layers:

* :class:`BatchQueue` -- plain state with no clock and no asyncio: FIFO requests measured in
  rows, when the forming batch should close, and which row ranges make the next batch. Every
  method that needs the time takes a monotonic ``now`` in seconds.
* :class:`Batcher` -- the shell: admission, one future per request and a deadline timer per
  request on the event loop, and one model thread that forms the batches and runs the model
  while the event loop keeps accepting and refusing.

Batch policy (``spec.batching``): when the model is free (the last batch's answers handed
out), take up to ``max_batch_size`` queued rows. With ``max_wait_ms > 0`` the forming batch
may wait for batch-mates until ``max_wait_ms`` after its FIRST request arrived; with 0 it goes
at once, so requests arriving during a model call form the next batch and batches grow with
load, never with waiting. A request larger than ``max_batch_size`` is taken in chunks, in
order, and reassembled.

Clock: ``time.perf_counter`` (sub-microsecond). uvloop's ``loop.time()`` advances in whole
milliseconds, so the loop is used only for relative timers (``call_later``).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import threading
from collections import deque
from itertools import accumulate
from time import perf_counter
from typing import Any, Callable, Sequence

import numpy as np

from tailguard_runtime.admission import DrainEstimate, admit
from tailguard_runtime.errors import (
    DeadlineExceeded,
    Draining,
    GraceEnded,
    ModelFailed,
    TailguardError,
)
from tailguard_runtime.rows import (
    REJECTIONS,
    Outputs,
    ReferenceRow,
    Unisolated,
    concat_outputs,
    gather_rows,
    isolation_budget,
    predict_isolating,
    rejected_rows,
    split_outputs,
)

logger = logging.getLogger(__name__)

class Request:
    """One admitted request: ``x`` of shape ``(n_rows, n_features)`` float64.

    ``future`` resolves to the request's own :data:`Outputs` or raises a
    :class:`~tailguard_runtime.errors.TailguardError`. ``taken`` counts rows handed to the model;
    a request whose future is done (answered, expired, cancelled) is skipped by the queue.
    ``alone``: the request runs in a batch of its own from now on (the model raised on a batch
    holding it, and the bisection budget ran out before it could tell whose rows it cannot
    take; see :meth:`BatchQueue.send_back`).
    """

    __slots__ = ("x", "n_rows", "arrival", "deadline", "wait_until", "future", "taken", "parts",
                 "timer", "alone")

    def __init__(self, x: np.ndarray, arrival: float, deadline: float, future: Any) -> None:
        self.x = x
        self.n_rows = x.shape[0]
        self.arrival = arrival
        self.deadline = deadline
        self.wait_until = wait_until(arrival, deadline)
        self.future = future
        self.taken = 0
        self.parts: list[Outputs] = []
        self.timer: asyncio.TimerHandle | None = None
        self.alone = False


WINDOW_SLACK_S = 0.010
"""Seconds a forming batch keeps in hand before the earliest deadline, at the least: the model
thread's wake-up, which may wait for the GIL up to CPython's switch interval
(``sys.getswitchinterval()``, 5 ms) while the event loop runs, and the answers' hand-out, which
waits for a turn of the event loop. Much less than that is too little on a machine whose cores
are busy with other work: a request's deadline passes on an otherwise idle server."""

WINDOW_SLACK_SHARE = 0.05
"""The share of a request's own time (its deadline less its arrival) a forming batch keeps in
hand, when that is more than :data:`WINDOW_SLACK_S`. A stall of a busy machine is not known
in advance: a lone request that allowed 2 s, held for batch-mates until 10 ms before its
deadline, got a 504 when another suite shared the machine. The last 5% costs a batch little
of its window."""


def wait_until(arrival: float, deadline: float) -> float:
    """The latest time (``perf_counter`` s) a forming batch may hold a request that arrived at
    ``arrival`` and is due at ``deadline``, before its model time: ``deadline`` less
    :data:`WINDOW_SLACK_SHARE` of its time, or :data:`WINDOW_SLACK_S` if more."""
    return deadline - max(WINDOW_SLACK_S, WINDOW_SLACK_SHARE * (deadline - arrival))


def latest_dispatch(wait_until: float, batch_s: float) -> float:
    """The latest time (``perf_counter`` s) a batch may go that holds a request it may hold
    until ``wait_until`` (:func:`wait_until`): twice the expected model time ``batch_s``
    before it."""
    return wait_until - 2 * batch_s


Segment = tuple[Request, int, int]
"""Rows ``[start, stop)`` of one request that go into a batch (see :mod:`tailguard_runtime.rows`)."""


class BatchQueue:
    """FIFO of requests, counted in rows. No clock, no asyncio, no I/O.

    ``queued_rows`` is the number of rows waiting (not yet handed to the model) of live requests;
    it is the unit of ``maxQueueSize`` and of the queue-depth gauge. Not thread-safe:
    :class:`Batcher` changes it only under its lock, from the event loop and the model thread
    (which reads the requests' futures' ``done()`` and nothing else of them); it reads
    ``queued_rows`` without the lock for admission and the gauge, a snapshot of an int.
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

    def send_back(self, requests: Sequence[tuple[Request, int]]) -> None:
        """Queue again, at the head and in the given order, requests whose rows from ``start``
        on (each ``(request, start)``) went to a batch the model raised on without the failure
        being pinned on them; each will run in a batch of its own (``alone``), so whatever the
        model says next is about its own rows. Requests already answered are left out."""
        items = self._items
        for request, start in reversed(requests):
            if request.future.done():
                continue
            self.queued_rows += request.taken - start
            request.taken = start
            request.alone = True
            if not items or items[0] is not request:
                items.appendleft(request)

    def discard(self, request: Request) -> None:
        """Forget a request's untaken rows (it expired or was cancelled); idempotent."""
        self.queued_rows -= request.n_rows - request.taken
        request.taken = request.n_rows

    def dispatch_at(self, batch_s: float = 0.0) -> float | None:
        """When the next batch should go if the model is free (monotonic seconds).

        ``None`` when nothing is queued; ``-inf`` (at once) when the batch is already full, when
        ``max_wait_s`` is 0, or when flushing; otherwise the first queued request's arrival plus
        ``max_wait_s``, but no later than the earliest queued :func:`wait_until` (a deadline
        less its slack) minus twice ``batch_s`` (the expected model time, in seconds): waiting
        for batch-mates never costs a request its deadline, even when the model call runs
        slower than usual.
        """
        self._drop_dead_head()
        if not self._items:
            return None
        if (self.flush or self.max_wait_s <= 0 or self.queued_rows >= self.max_batch_size
                or self._items[0].alone):
            return float("-inf")
        # a future may finish at any time (the event loop cancels without the batcher's lock)
        earliest = min((r.wait_until for r in self._items if not r.future.done()), default=None)
        if earliest is None:
            return float("-inf")  # all finished since the head was dropped: take() drops them
        return min(self._items[0].arrival + self.max_wait_s, latest_dispatch(earliest, batch_s))

    def take(self, now: float) -> tuple[list[Segment], list[Request]]:
        """Form the next batch of at most ``max_batch_size`` rows.

        Returns ``(segments, expired)``: the row ranges for the model, in queue order, and the
        requests whose deadline is at or before ``now`` (their rows are dropped here, before
        they reach the model; :class:`Batcher` leaves their 504 to their deadline timers). A
        request marked ``alone`` goes in a batch without batch-mates.
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
            if request.alone and segments:
                break  # it runs next, on its own
            start = request.taken
            stop = min(request.n_rows, start + room)
            segments.append((request, start, stop))
            request.taken = stop
            self.queued_rows -= stop - start
            room -= stop - start
            if stop == request.n_rows:
                items.popleft()
            if request.alone:
                break
        return segments, expired

    def pending(self) -> list[Request]:
        """The live requests still holding untaken rows, in order."""
        return [r for r in self._items if not r.future.done() and r.taken < r.n_rows]

    def _drop_dead_head(self) -> None:
        items = self._items
        while items and (items[0].future.done() or items[0].taken >= items[0].n_rows):
            self.discard(items.popleft())


def _failed(exc: BaseException, sound: bool) -> ModelFailed:
    """The answer for a request the model raised ``exc`` on (see :meth:`Batcher._deliver`)."""
    said = f"{type(exc).__name__}: {exc}"
    if not isinstance(exc, REJECTIONS):
        return ModelFailed(f"model raised on this request's rows: {said}", 500)
    if sound:
        return ModelFailed(f"model raised on this request's rows: {said}", 422)
    return ModelFailed(f"model raised on this request's rows ({said}) and on a row it answered "
                       "before: the model, not this input, fails", 500)


class Batcher:
    """Queue, admission and the model thread for one model.

    ``run`` is the model call (:attr:`Predictor.run`); it is only ever called from this
    batcher's one model thread. ``observe_batch(rows, seconds, own_s)`` (``seconds``: all the
    model time the batch cost; ``own_s``: its first call's, the model's own time for those rows,
    without the calls that isolated failing requests or checked the reference row) and
    ``observe_queue_wait(seconds)`` are metric hooks, called on the event loop.

    Two threads share the queue, under one lock. The event loop admits and queues requests,
    expires and cancels them, and hands each finished batch's answers out. The model thread
    forms each batch as soon as the policy allows, runs the model, and passes the batch back to
    the event loop with ``call_soon_threadsafe``; it forms the next batch only once the event
    loop has handed out the last one's answers (:meth:`_finish`).

    Why the model thread forms the batches: when the event loop did it (awaiting
    ``run_in_executor``), each batch waited for the event loop's turn twice between two model
    calls (the executor's result, then the batch loop's step), and a request reaching an idle
    model waited for a turn too. Beside a busy event loop those turns made most of the slowest
    answers (a trace beside the hostile mix of ``benchmarks/soak.py``). Why it waits for the
    answers to go out
    first: the model thread and the event loop share one GIL, so a batch started at once holds
    the GIL while the event loop waits for it to hand the last answers out, up to
    ``sys.getswitchinterval()`` (5 ms) at each hand-over. The measurements are in
    ``benchmarks/README.md`` ("The model thread forms the batches").
    """

    def __init__(self, run: Callable[[np.ndarray], Outputs], *, max_batch_size: int,
                 max_wait_ms: float, max_queue_size: int, name: str = "model",
                 observe_batch: Callable[[int, float, float], None] | None = None,
                 observe_queue_wait: Callable[[float], None] | None = None) -> None:
        self._run = run
        self.name = name
        self.max_queue_size = max_queue_size
        self.queue = BatchQueue(max_batch_size, max_wait_ms / 1000.0)
        self.estimate = DrainEstimate()
        self.busy = False
        """A batch is with the model or its answers are not yet handed out."""
        self.draining = False
        self.in_flight: set[Request] = set()
        self._observe_batch = observe_batch or (lambda rows, seconds, own_s: None)
        self._observe_queue_wait = observe_queue_wait or (lambda seconds: None)
        self._isolation_budget = isolation_budget(max_batch_size)
        self._reference = ReferenceRow(run)
        self._lock = threading.Condition(threading.Lock())
        """Guards :attr:`queue` and the queue-depth integral; the model thread waits on it."""
        self._idle = False  # the model thread waits on _lock for work ...
        self._wake_at = float("inf")  # ... until this perf_counter time at the latest
        self._closed = False
        self._failure: str | None = None  # why the model thread ended, if it crashed
        self._handed_out = threading.Event()
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._depth_row_s = 0.0
        self._depth_at: float | None = None

    def _account(self, now: float) -> None:
        """Add the queue depth since the last change to the row-seconds integral; call with
        the lock held, just before ``queued_rows`` changes, with ``now`` in ``perf_counter``
        seconds."""
        if self._depth_at is not None:
            self._depth_row_s += self.queue.queued_rows * (now - self._depth_at)
        self._depth_at = now

    def queue_row_seconds(self, now: float) -> float:
        """Cumulative integral of the queue depth over time since :meth:`start`, in row-seconds
        (``now`` in ``perf_counter`` seconds). Its difference between two reads divided by the
        seconds between them is the exact mean queue depth (rows) of that window, and sums over
        replicas, which a sampled gauge is not."""
        with self._lock:
            if self._depth_at is None:
                return self._depth_row_s
            return self._depth_row_s + self.queue.queued_rows * (now - self._depth_at)

    def start(self) -> None:
        """Start the model thread; answers are handed out on the running event loop."""
        self._loop = asyncio.get_running_loop()
        self._depth_at = perf_counter()
        self._thread = threading.Thread(target=self._model_thread, name=f"tailguard-{self.name}",
                                        daemon=True)
        self._thread.start()

    async def submit(self, x: np.ndarray, timeout_s: float) -> Outputs:
        """Admit ``x`` (``(n_rows, n_features)`` float64) and wait for its outputs: the
        awaiting form of :meth:`enqueue`, whose errors it raises (admission's at once, the
        rest from the wait). Cancelling the wait withdraws the request."""
        return await self.enqueue(x, timeout_s)

    def enqueue(self, x: np.ndarray, timeout_s: float) -> asyncio.Future[Outputs]:
        """Admit ``x`` (``(n_rows, n_features)`` float64) and return the future of its
        outputs, for a caller that awaits it or adds a done callback (the HTTP inference
        path's answers are written from one, without a task per request). Cancelling the
        future withdraws the request's rows not yet taken.

        ``timeout_s`` is the request's deadline in seconds from now.

        Raises:
            Draining: the runtime is shutting down.
            PayloadTooLarge, Overloaded: refused by :func:`~tailguard_runtime.admission.admit`.
            TailguardError: (500) the model thread has crashed.

        The future's own errors: :class:`Draining` (the grace period ended first),
        :class:`DeadlineExceeded` (the deadline passed before the answer was ready),
        :class:`ModelFailed` (the model raised on this request's own rows), and
        ``TailguardError`` (500: the model thread crashed on this batch, or handing out the
        answers failed).
        """
        if self.draining:
            raise Draining("runtime is draining: not accepting new requests")
        if self._failure is not None:
            raise TailguardError(self._failure)
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
        self.in_flight.add(request)
        with self._lock:
            self._account(now)
            queue.push(request)
            if self._idle and self._dispatch_sooner(request):
                self._lock.notify()
        future.add_done_callback(functools.partial(self._settled, request))
        return future

    def _settled(self, request: Request, future: asyncio.Future[Outputs]) -> None:
        """``request``'s future is done (answered, failed or cancelled): its timer and its
        place among the requests in flight go; a cancelled one's rows not yet taken too."""
        if request.timer is not None:
            request.timer.cancel()
        self.in_flight.discard(request)
        if future.cancelled():
            self._discard(request)

    @property
    def failure(self) -> str | None:
        """Why the model thread ended, if it crashed; ``None`` while it serves."""
        return self._failure

    @property
    def queue_depth(self) -> int:
        """Rows waiting for the model (the batch being computed not counted)."""
        return self.queue.queued_rows

    async def drain(self, grace_s: float) -> int:
        """Stop admitting, flush the forming batch, and wait up to ``grace_s`` seconds for every
        admitted request to be answered. Whatever is still unanswered then gets
        :class:`GraceEnded` (503). Returns how many requests got that 503."""
        self.draining = True
        with self._lock:
            self.queue.flush = True
            self._lock.notify()
        loop = asyncio.get_running_loop()
        end = loop.time() + grace_s
        while self.in_flight and loop.time() < end:
            await asyncio.sleep(0.01)
        unanswered = [r for r in self.in_flight if not r.future.done()]
        for request in unanswered:
            self._discard(request)
            request.future.set_exception(GraceEnded("grace period ended before the model answered"))
        await asyncio.sleep(0)  # let the handlers render their 503s
        return len(unanswered)

    async def close(self) -> None:
        """Stop the model thread once its current model call, if any, returns (not waited for:
        a model call cannot be interrupted)."""
        with self._lock:
            self._closed = True
            self._lock.notify()
        self._handed_out.set()

    def _dispatch_sooner(self, request: Request) -> bool:
        """Whether the just-queued ``request`` can bring the next batch before the time the
        idle model thread waits for (call with the lock held). Within a ``max_wait_ms`` window
        most arrivals do not, and waking the thread for each would make it take the GIL for
        nothing."""
        queue = self.queue
        if (self._wake_at == float("inf") or queue.flush or queue.max_wait_s <= 0
                or queue.queued_rows >= queue.max_batch_size):
            return True
        return latest_dispatch(request.wait_until, self.estimate.batch_seconds or 0.0
                               ) < self._wake_at

    def _discard(self, request: Request) -> None:
        """Drop ``request``'s rows not yet taken (on the event loop)."""
        with self._lock:
            self._account(perf_counter())
            self.queue.discard(request)

    def _expire(self, request: Request) -> None:
        if not request.future.done():
            self._discard(request)
            request.future.set_exception(DeadlineExceeded(
                f"deadline of {(request.deadline - request.arrival) * 1000:.0f} ms passed "
                "before the model answered"))

    # -- the model thread ---------------------------------------------------------------------

    def _next_batch(self) -> tuple[list[Segment], float] | None:
        """Wait until the policy dispatches a batch and take it: its segments and the time it
        was taken (``perf_counter`` s); ``None`` once closed. Requests past their deadline are
        dropped here; their own timers answer them 504 on the event loop."""
        queue = self.queue
        with self._lock:
            while True:
                if self._closed:
                    return None
                now = perf_counter()
                self._account(now)  # dispatch_at drops finished requests from the depth
                at = queue.dispatch_at(self.estimate.batch_seconds or 0.0)
                if at is not None and at <= now:
                    segments, _ = queue.take(now)
                    if segments:
                        self.busy = True
                        return segments, now
                    continue
                self._idle, self._wake_at = True, float("inf") if at is None else at
                self._lock.wait(None if at is None else at - now)
                self._idle = False

    def _model_thread(self) -> None:
        loop = self._loop
        assert loop is not None
        try:
            while (batch := self._next_batch()) is not None:
                segments, taken_at = batch
                x = gather_rows(segments)
                cuts = list(accumulate(stop - start for _, start, stop in segments[:-1]))
                started = perf_counter()
                first: list[float] = []  # when the first call ended (perf_counter s)

                def run(rows: np.ndarray) -> Outputs:
                    try:
                        return self._run(rows)
                    finally:
                        if not first:
                            first.append(perf_counter())

                pieces = predict_isolating(run, x, cuts, self._isolation_budget)
                own_s = first[0] - started
                sound = True
                if rejected_rows(pieces):  # the client's rows, or a broken model?
                    sound = self._reference.sound(x.shape[1], perf_counter(), check=not all(
                        request.alone for request, _, _ in segments))
                self._reference.answered(x, pieces)
                seconds = perf_counter() - started
                self._handed_out.clear()
                try:
                    loop.call_soon_threadsafe(self._finish, segments, pieces, taken_at, seconds,
                                              own_s, sound)
                except RuntimeError:  # the event loop is closed: nobody waits for the answers
                    return
                if not self._closed:  # close() sets _closed before _handed_out
                    self._handed_out.wait()
        except BaseException as exc:
            logger.exception("model thread crashed; failing what it held")
            with contextlib.suppress(RuntimeError):  # a closed event loop: nobody waits
                loop.call_soon_threadsafe(self._crashed, f"model thread crashed: {exc!r}")

    def _crashed(self, why: str) -> None:
        """The model thread has ended: fail what it held, and refuse from now on (500)."""
        self._failure = why
        self.busy = False
        for request in list(self.in_flight):
            if not request.future.done():
                self._discard(request)
                request.future.set_exception(TailguardError(why))

    # -- back on the event loop ---------------------------------------------------------------

    def _finish(self, segments: list[Segment],
                pieces: list[tuple[int, int, Outputs | BaseException]], taken_at: float,
                seconds: float, own_s: float, sound: bool = True) -> None:
        """Hand out a batch's answers, record it, and let the model thread go on (``sound``:
        see :meth:`_deliver`). The drain estimate admission reads gets the time from the
        batch's take to this hand-out, not only the model's: when the event loop is slow to
        hand answers out (a busy or starved machine), the queue drains that much slower, and
        requests admitted on the model's time alone reached their deadlines in the queue (504s
        under load, in the HPA's scale-out test on a slow machine). Should that fail (a bug of ours), the batch's requests still
        waiting get a 500 at once rather than their deadlines' 504."""
        try:
            # what the batch held the queue up for: the model's time and the wait for this
            # turn of the event loop (the next batch starts only once these answers are out)
            self.estimate.record(max(seconds, perf_counter() - taken_at))
            for request, start, _ in segments:
                if start == 0 and not request.alone:  # its first rows' wait, once
                    self._observe_queue_wait(taken_at - request.arrival)
            self._deliver(segments, pieces, sound)
            self._observe_batch(sum(stop - start for _, start, stop in segments), seconds, own_s)
        except Exception as exc:
            logger.exception("handing out a batch's answers failed")
            for request, _, _ in segments:
                if not request.future.done():
                    self._discard(request)
                    request.future.set_exception(TailguardError(
                        f"internal error handing out the answers: {type(exc).__name__}"))
        finally:
            self.busy = False
            self._handed_out.set()

    def _deliver(self, segments: list[Segment],
                 pieces: list[tuple[int, int, Outputs | BaseException]], sound: bool = True,
                 ) -> None:
        """Hand each request its outputs or its own failure. A request the model raised on
        together with others, past the bisection budget, is not failed: it goes back to the head
        of the queue to run alone (:meth:`BatchQueue.send_back`), so a request is told the model
        raised on it only after the model ran on it. A ``ValueError``/``TypeError`` on a
        request's own rows is a 422 while the model is ``sound`` (it answers its
        :class:`~tailguard_runtime.rows.ReferenceRow`), else a 500: the model is broken."""
        offset = 0
        unsettled: list[tuple[Request, int]] = []
        for request, start, stop in segments:
            rows = stop - start
            result = split_outputs(pieces, offset, offset + rows)
            offset += rows
            future = request.future
            if future.done():
                continue
            if isinstance(result, Unisolated) and not request.alone:
                unsettled.append((request, start))
            elif isinstance(result, BaseException):
                self._discard(request)
                future.set_exception(_failed(result, sound))
            elif rows == request.n_rows:
                future.set_result(result)
            else:
                request.parts.append(result)
                if stop == request.n_rows:
                    future.set_result(concat_outputs(request.parts))
        if unsettled:
            with self._lock:
                self._account(perf_counter())
                self.queue.send_back(unsettled)
