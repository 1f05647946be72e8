"""The batch queue (fake clock) and the batcher (a gated model in its model thread)."""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from typing import AsyncIterator, Callable

import numpy as np
import pytest

from tailguard_runtime.batcher import (
    WINDOW_SLACK_S,
    WINDOW_SLACK_SHARE,
    Batcher,
    BatchQueue,
    Request,
)
from tailguard_runtime.errors import (
    DeadlineExceeded,
    Draining,
    ModelFailed,
    Overloaded,
    PayloadTooLarge,
    TailguardError,
)
from tailguard_runtime.rows import predict_isolating


class _Done:
    """Stands in for a future in the pure queue tests."""

    def __init__(self) -> None:
        self.finished = False

    def done(self) -> bool:
        return self.finished


def _req(rows: int, arrival: float, deadline: float = 100.0, start: float = 0.0) -> Request:
    x = np.arange(rows * 2, dtype=np.float64).reshape(rows, 2) + start
    return Request(x, arrival, deadline, _Done())


# ---- BatchQueue: pure, time passed in -------------------------------------------------------

def test_window_is_measured_from_the_first_arrival_not_the_last() -> None:
    queue = BatchQueue(max_batch_size=8, max_wait_s=0.005)
    queue.push(_req(1, arrival=10.000))
    queue.push(_req(1, arrival=10.003))
    queue.push(_req(1, arrival=10.004))
    assert queue.dispatch_at() == pytest.approx(10.005)


def test_zero_wait_dispatches_at_once_and_full_batch_closes_the_window_early() -> None:
    eager = BatchQueue(max_batch_size=8, max_wait_s=0.0)
    eager.push(_req(1, arrival=1.0))
    assert eager.dispatch_at() == float("-inf")

    waiting = BatchQueue(max_batch_size=4, max_wait_s=1.0)
    waiting.push(_req(3, arrival=1.0))
    assert waiting.dispatch_at() == pytest.approx(2.0)
    waiting.push(_req(1, arrival=1.1))
    assert waiting.dispatch_at() == float("-inf")


def test_the_window_closes_in_time_for_the_earliest_deadline() -> None:
    queue = BatchQueue(max_batch_size=8, max_wait_s=0.300)
    queue.push(_req(1, arrival=10.0, deadline=12.0))
    queue.push(_req(1, arrival=10.1, deadline=10.2))
    assert queue.dispatch_at(batch_s=0.05) == pytest.approx(10.2 - 0.1 - WINDOW_SLACK_S)
    assert queue.dispatch_at() == pytest.approx(10.2 - WINDOW_SLACK_S)


def test_a_long_deadline_keeps_a_share_of_its_time_in_hand() -> None:
    """A request that allows 2 s is held for batch-mates until 5% of its time (100 ms) before
    its deadline, not 10 ms: a stall of a busy machine does not cost it its answer."""
    queue = BatchQueue(max_batch_size=8, max_wait_s=3.0)
    queue.push(_req(1, arrival=10.0, deadline=12.0))
    assert queue.dispatch_at() == pytest.approx(12.0 - WINDOW_SLACK_SHARE * 2.0)
    assert queue.dispatch_at(batch_s=0.05) == pytest.approx(12.0 - 0.1 - 0.1)
    # the earliest of the requests' own limits closes the window, not the earliest deadline:
    # this one is due first (11.95) but may wait until 11.94
    queue.push(_req(1, arrival=11.85, deadline=11.95))
    assert queue.dispatch_at() == pytest.approx(11.9)


def test_empty_queue_has_nothing_to_dispatch() -> None:
    assert BatchQueue(4, 0.0).dispatch_at() is None


def test_take_caps_rows_and_chunks_a_large_request_in_order() -> None:
    queue = BatchQueue(max_batch_size=4, max_wait_s=0.0)
    small, big = _req(3, 0.0), _req(10, 0.1)
    queue.push(small)
    queue.push(big)
    assert queue.queued_rows == 13
    batches = []
    while queue.queued_rows:
        segments, expired = queue.take(now=1.0)
        assert not expired
        batches.append([(seg[0] is big, seg[1], seg[2]) for seg in segments])
        assert sum(stop - start for _, start, stop in segments) <= 4
    assert batches == [[(False, 0, 3), (True, 0, 1)], [(True, 1, 5)], [(True, 5, 9)],
                       [(True, 9, 10)]]
    assert len(queue) == 0


def test_expired_requests_are_dropped_before_the_model() -> None:
    queue = BatchQueue(max_batch_size=4, max_wait_s=0.0)
    late, on_time = _req(2, 0.0, deadline=1.0), _req(1, 0.0, deadline=5.0)
    queue.push(late)
    queue.push(on_time)
    segments, expired = queue.take(now=1.0)
    assert expired == [late]
    assert [(s[0], s[1], s[2]) for s in segments] == [(on_time, 0, 1)]
    assert queue.queued_rows == 0


def test_answered_or_cancelled_requests_are_skipped_and_uncounted() -> None:
    queue = BatchQueue(max_batch_size=4, max_wait_s=0.0)
    gone, kept = _req(2, 0.0), _req(1, 0.0)
    queue.push(gone)
    queue.push(kept)
    gone.future.finished = True
    assert queue.dispatch_at() == float("-inf")
    assert queue.queued_rows == 1
    segments, _ = queue.take(now=0.5)
    assert [s[0] for s in segments] == [kept]


def test_predict_isolating_fails_only_the_offending_rows() -> None:
    def run(x: np.ndarray) -> tuple[np.ndarray, ...]:
        if (x[:, 0] < 0).any():
            raise ValueError("negative feature")
        return (x.sum(axis=1),)

    x = np.arange(16, dtype=np.float64).reshape(8, 2)
    x[5, 0] = -1
    pieces = predict_isolating(run, x)
    assert [p[0] for p in pieces] == sorted(p[0] for p in pieces)
    assert pieces[0][0] == 0 and pieces[-1][1] == 8
    bad = [(a, b) for a, b, out in pieces if isinstance(out, BaseException)]
    assert bad == [(5, 6)]
    for a, b, out in pieces:
        if not isinstance(out, BaseException):
            np.testing.assert_array_equal(out[0], x[a:b].sum(axis=1))


# ---- Batcher: real event loop, gated model in its model thread ------------------------------

class GatedModel:
    """Sums each row; blocks on ``gate`` while it is closed; records the batches it saw."""

    def __init__(self) -> None:
        self.gate = threading.Event()
        self.gate.set()
        self.entered = threading.Event()
        self.batches: list[np.ndarray] = []

    def __call__(self, x: np.ndarray) -> tuple[np.ndarray, ...]:
        self.entered.set()
        self.gate.wait(10)
        self.batches.append(x.copy())
        if (x[:, 0] < 0).any():
            raise ValueError("negative first feature")
        return (x.sum(axis=1), x * 2)


@contextlib.asynccontextmanager
async def started(run: Callable[[np.ndarray], tuple[np.ndarray, ...]],
                  **limits: float) -> AsyncIterator[Batcher]:
    """A running batcher over ``run``; closed even when the test fails (its model thread ends
    once its model call, if any, returns)."""
    batcher = Batcher(run, **limits)  # type: ignore[arg-type]
    batcher.start()
    try:
        yield batcher
    finally:
        await batcher.close()


async def _wait_for(predicate, timeout: float = 5.0) -> None:  # type: ignore[no-untyped-def]
    loop = asyncio.get_running_loop()
    end = loop.time() + timeout
    while not predicate():
        assert loop.time() < end, "condition not reached"
        await asyncio.sleep(0.005)


async def _busy(model: GatedModel, batcher: Batcher) -> asyncio.Task:  # type: ignore[type-arg]
    """Close the gate and put one request into the model so it is computing."""
    model.gate.clear()
    model.entered.clear()
    task = asyncio.create_task(batcher.submit(np.ones((1, 2)), 30.0))
    await _wait_for(model.entered.is_set)
    return task


def _rows(n: int, start: float) -> np.ndarray:
    return np.arange(n * 2, dtype=np.float64).reshape(n, 2) + start


async def test_results_match_each_requests_own_rows_with_chunking() -> None:
    model = GatedModel()
    async with started(model, max_batch_size=4, max_wait_ms=0, max_queue_size=64) as batcher:
        blocker = await _busy(model, batcher)
        inputs = [_rows(n, 100 * i) for i, n in enumerate((1, 3, 9, 2))]
        tasks = [asyncio.create_task(batcher.submit(x, 30.0)) for x in inputs]
        await _wait_for(lambda: batcher.queue_depth == 15)
        model.gate.set()
        results = await asyncio.gather(*tasks)
        await blocker
        for x, (sums, doubled) in zip(inputs, results):
            np.testing.assert_array_equal(sums, x.sum(axis=1))
            np.testing.assert_array_equal(doubled, x * 2)
        assert max(len(b) for b in model.batches) == 4
        assert batcher.queue_depth == 0 and not batcher.in_flight


async def test_queue_capacity_is_exact_under_a_burst() -> None:
    """While one batch computes, exactly maxQueueSize rows are admitted; the rest get 429 at
    once, with an integer Retry-After of at least one second."""
    model = GatedModel()
    async with started(model, max_batch_size=1, max_wait_ms=0, max_queue_size=4) as batcher:
        await batcher.submit(np.zeros((1, 2)), 30.0)  # one finished batch gives a drain estimate
        blocker = await _busy(model, batcher)
        tasks = [asyncio.create_task(batcher.submit(_rows(1, i), 30.0)) for i in range(10)]
        await asyncio.sleep(0.05)
        refused = [t for t in tasks if t.done()]
        assert len(refused) == 6
        for task in refused:
            exc = task.exception()
            assert isinstance(exc, Overloaded) and exc.status_code == 429
            assert exc.reason == "queue_full" and exc.retry_after_s >= 1
        assert batcher.queue_depth == 4
        model.gate.set()
        admitted = [t for t in tasks if t not in refused]
        for task in admitted:
            (sums, _) = await task
            assert sums.shape == (1,)
        await blocker


async def test_request_larger_than_the_queue_is_413() -> None:
    async with started(GatedModel(), max_batch_size=2, max_wait_ms=0, max_queue_size=4) as batcher:
        with pytest.raises(PayloadTooLarge):
            await batcher.submit(_rows(5, 0), 30.0)


async def test_deadline_passing_in_the_queue_gives_504_and_the_rows_never_reach_the_model() -> None:
    model = GatedModel()
    async with started(model, max_batch_size=8, max_wait_ms=0, max_queue_size=64) as batcher:
        blocker = await _busy(model, batcher)
        marker = np.full((1, 2), 7777.0)
        with pytest.raises(DeadlineExceeded) as info:
            await batcher.submit(marker, 0.05)
        assert info.value.status_code == 504
        assert batcher.queue_depth == 0
        model.gate.set()
        await blocker
        await batcher.submit(np.ones((1, 2)), 30.0)  # the loop goes on
        assert not any((b == 7777.0).any() for b in model.batches)


async def test_a_failing_row_fails_only_its_own_request() -> None:
    model = GatedModel()
    async with started(model, max_batch_size=16, max_wait_ms=0, max_queue_size=64) as batcher:
        blocker = await _busy(model, batcher)
        good = [_rows(2, 10 * i) for i in range(5)]
        poisoned = np.array([[-1.0, 0.0]])
        tasks = [asyncio.create_task(batcher.submit(x, 30.0)) for x in good[:3]]
        bad_task = asyncio.create_task(batcher.submit(poisoned, 30.0))
        tasks += [asyncio.create_task(batcher.submit(x, 30.0)) for x in good[3:]]
        await _wait_for(lambda: batcher.queue_depth == 11)
        model.gate.set()
        await blocker
        for x, task in zip(good, tasks):
            sums, _ = await task
            np.testing.assert_array_equal(sums, x.sum(axis=1))
        with pytest.raises(ModelFailed) as info:
            await bad_task
        assert info.value.status_code == 422 and "negative first feature" in info.value.message


async def test_cancelled_request_is_dropped_and_neighbours_are_unaffected() -> None:
    model = GatedModel()
    async with started(model, max_batch_size=8, max_wait_ms=0, max_queue_size=64) as batcher:
        blocker = await _busy(model, batcher)
        before = asyncio.create_task(batcher.submit(_rows(1, 0), 30.0))
        leaving = asyncio.create_task(batcher.submit(np.full((3, 2), 5555.0), 30.0))
        after = asyncio.create_task(batcher.submit(_rows(1, 50), 30.0))
        await _wait_for(lambda: batcher.queue_depth == 5)
        leaving.cancel()
        await asyncio.gather(leaving, return_exceptions=True)
        assert batcher.queue_depth == 2
        model.gate.set()
        await blocker
        np.testing.assert_array_equal((await before)[0], _rows(1, 0).sum(axis=1))
        np.testing.assert_array_equal((await after)[0], _rows(1, 50).sum(axis=1))
        assert not any((b == 5555.0).any() for b in model.batches)


async def test_drain_flushes_the_forming_batch_and_finishes_admitted_requests() -> None:
    model = GatedModel()
    async with started(model, max_batch_size=8, max_wait_ms=60_000, max_queue_size=64) as batcher:
        waiting = [asyncio.create_task(batcher.submit(_rows(1, i), 30.0)) for i in range(3)]
        await _wait_for(lambda: batcher.queue_depth == 3)
        await asyncio.sleep(0.05)
        assert not model.batches, "a 60 s window holds the batch"
        failed = await batcher.drain(grace_s=10.0)
        assert failed == 0
        for i, task in enumerate(waiting):
            np.testing.assert_array_equal((await task)[0], _rows(1, i).sum(axis=1))
        with pytest.raises(Draining):
            await batcher.submit(_rows(1, 0), 30.0)


async def test_drain_answers_503_for_what_is_unanswered_when_the_grace_period_ends() -> None:
    model = GatedModel()
    async with started(model, max_batch_size=1, max_wait_ms=0, max_queue_size=64) as batcher:
        blocker = await _busy(model, batcher)
        queued = asyncio.create_task(batcher.submit(_rows(1, 0), 30.0))
        await _wait_for(lambda: batcher.queue_depth == 1)
        failed = await batcher.drain(grace_s=0.1)
        assert failed == 2
        for task in (blocker, queued):
            with pytest.raises(Draining) as info:
                await task
            assert info.value.status_code == 503
        model.gate.set()


async def test_a_request_reaches_an_idle_model_while_the_event_loop_is_busy() -> None:
    """The model thread takes the batch itself: a request queued just before the event loop
    blocks (as under a burst of other work) is in the model before the loop runs again."""
    model = GatedModel()
    async with started(model, max_batch_size=8, max_wait_ms=0, max_queue_size=64) as batcher:
        task = asyncio.create_task(batcher.submit(_rows(2, 0), 30.0))
        await asyncio.sleep(0)  # the submit runs up to its wait for the answer
        assert batcher.in_flight
        time.sleep(0.3)  # the event loop is held; only the model thread can start the batch
        assert model.entered.is_set()
        np.testing.assert_array_equal((await task)[0], _rows(2, 0).sum(axis=1))


async def test_the_drain_estimate_counts_the_wait_for_the_answers_hand_out() -> None:
    """Admission's estimate of a batch is what the batch held the queue up for: a model call
    of a few ms whose answers wait 0.3 s for a held event loop counts 0.3 s (the model's time
    alone let requests in that then expired in the queue)."""
    model = GatedModel()
    async with started(model, max_batch_size=8, max_wait_ms=0, max_queue_size=64) as batcher:
        first = await _busy(model, batcher)
        model.gate.set()
        time.sleep(0.3)  # the event loop is held: the batch's answers wait for it
        await first
        assert batcher.estimate.batch_seconds is not None
        assert batcher.estimate.batch_seconds >= 0.3


async def test_the_next_batch_waits_until_the_last_ones_answers_are_handed_out() -> None:
    """Answers first: the model thread does not start a batch while the event loop still has
    the previous one's answers to hand out (they would wait for the GIL behind it)."""
    model = GatedModel()
    async with started(model, max_batch_size=1, max_wait_ms=0, max_queue_size=64) as batcher:
        first = await _busy(model, batcher)
        second = asyncio.create_task(batcher.submit(_rows(1, 1), 30.0))
        await _wait_for(lambda: batcher.queue_depth == 1)
        model.entered.clear()
        model.gate.set()
        time.sleep(0.3)  # the event loop is held: the first batch's answers cannot go out
        assert not model.entered.is_set(), "the second batch started before the first's answers"
        await asyncio.gather(first, second)
        assert model.entered.is_set() and len(model.batches) == 2


async def test_an_arrival_with_an_earlier_deadline_closes_a_waiting_window_early() -> None:
    """The model thread sleeps until the window closes; a request whose deadline comes first
    wakes it, so the batch still goes in time for that deadline. The batcher is told that a
    batch takes 0.2 s, so the window closes 0.4 s before the urgent deadline: room enough for
    a slow thread wake-up on a busy machine (with no estimate it would close
    :data:`WINDOW_SLACK_S` before)."""
    model = GatedModel()
    async with started(model, max_batch_size=8, max_wait_ms=60_000, max_queue_size=64) as batcher:
        batcher.estimate.record(0.2)
        patient = asyncio.create_task(batcher.submit(_rows(1, 0), 30.0))
        await _wait_for(lambda: batcher.queue_depth == 1)
        await asyncio.sleep(0.05)  # the thread now sleeps until about 30 s from now
        urgent = await batcher.submit(_rows(1, 5), 1.0)
        np.testing.assert_array_equal(urgent[0], _rows(1, 5).sum(axis=1))
        np.testing.assert_array_equal((await patient)[0], _rows(1, 0).sum(axis=1))


async def test_a_request_expiring_in_the_model_gets_504_and_the_model_goes_on() -> None:
    model = GatedModel()
    async with started(model, max_batch_size=8, max_wait_ms=0, max_queue_size=64) as batcher:
        model.gate.clear()
        task = asyncio.create_task(batcher.submit(_rows(1, 0), 0.5))
        await _wait_for(model.entered.is_set)
        with pytest.raises(DeadlineExceeded):
            await task
        model.gate.set()
        np.testing.assert_array_equal((await batcher.submit(_rows(1, 3), 30.0))[0],
                                      _rows(1, 3).sum(axis=1))


async def test_close_ends_the_model_thread() -> None:
    batcher = Batcher(GatedModel(), max_batch_size=4, max_wait_ms=0, max_queue_size=8)
    batcher.start()
    await batcher.submit(_rows(1, 0), 30.0)
    thread = batcher._thread
    assert thread is not None and thread.is_alive()
    await batcher.close()
    await asyncio.to_thread(thread.join, 5.0)
    assert not thread.is_alive()


def test_a_request_finishing_while_the_window_is_computed_is_not_an_error() -> None:
    """The event loop cancels a request without the batcher's lock, so its future may finish
    while the model thread computes when the next batch goes."""
    class FinishesWhenLooked(_Done):
        def __init__(self) -> None:
            super().__init__()
            self.looks = 0

        def done(self) -> bool:
            self.looks += 1
            return self.looks > 1  # live for the dead-head check, finished for the next look

    queue = BatchQueue(max_batch_size=8, max_wait_s=0.05)
    request = _req(1, arrival=1.0)
    request.future = FinishesWhenLooked()
    queue.push(request)
    assert queue.dispatch_at() == float("-inf")
    assert queue.take(now=1.0) == ([], [])
    assert queue.queued_rows == 0 and queue.dispatch_at() is None


async def test_a_crashed_model_thread_fails_what_it_held() -> None:
    """Something the model thread cannot isolate (not an ``Exception``) ends it; the requests
    it held are answered with an error rather than left waiting for their deadlines."""
    class Crash(BaseException):
        pass

    def run(x: np.ndarray) -> tuple[np.ndarray, ...]:
        raise Crash()

    async with started(run, max_batch_size=4, max_wait_ms=0, max_queue_size=64) as batcher:
        with pytest.raises(TailguardError, match="model thread crashed") as info:
            await batcher.submit(_rows(1, 0), 30.0)
        assert info.value.status_code == 500 and not batcher.in_flight
        with pytest.raises(TailguardError, match="model thread crashed"):  # no one serves it
            await batcher.submit(_rows(1, 1), 30.0)


async def test_requests_the_budget_left_unisolated_run_alone_and_sound_ones_never_fail() -> None:
    """Three scattered poisoned rows among eight one-row requests need more bisection than the
    budget (7 calls for a batch of 8) allows. The groups still failing are not answered 500:
    each of their requests runs again in a batch of its own, so every sound request gets its
    own outputs, each poisoned one its own 422, and the model is called at most 1 + budget + 8
    times for the batch."""
    model = GatedModel()
    async with started(model, max_batch_size=8, max_wait_ms=0, max_queue_size=64) as batcher:
        blocker = await _busy(model, batcher)
        rows = [_rows(1, 10 * i) for i in range(8)]
        for i in (0, 3, 6):
            rows[i][0, 0] = -1.0
        tasks = [asyncio.create_task(batcher.submit(x, 30.0)) for x in rows]
        await _wait_for(lambda: batcher.queue_depth == 8)
        model.gate.set()
        await blocker
        results = await asyncio.gather(*tasks, return_exceptions=True)
        for i, (x, result) in enumerate(zip(rows, results)):
            if i in (0, 3, 6):
                assert isinstance(result, ModelFailed) and result.status_code == 422, (i, result)
            else:
                assert not isinstance(result, BaseException), (i, result)
                np.testing.assert_array_equal(result[0], x.sum(axis=1))
        calls = model.batches[1:]  # after the blocker's
        assert len(calls[0]) == 8 and len(calls) <= 1 + 7 + 8
        assert len(calls) > 1 + 7, "the budget should have run out and sent requests back"
        assert batcher.queue_depth == 0 and not batcher.in_flight


async def test_the_guard_sees_the_models_own_time_not_the_isolation_of_a_clients_rows() -> None:
    """Every call sleeps 20 ms; one poisoned request among five makes the batch bisect over
    several calls. The metrics hook gets all the model time the batch cost, the SLO guard's
    hook the first call's alone: a client's failing rows never make a fast model look slow."""
    model = GatedModel()
    seen: list[tuple[int, float, float]] = []

    def slow(x: np.ndarray) -> tuple[np.ndarray, ...]:
        time.sleep(0.020)
        return model(x)

    async with started(slow, max_batch_size=16, max_wait_ms=0, max_queue_size=64,
                       observe_batch=lambda rows, s, own: seen.append((rows, s, own))) as batcher:
        blocker = await _busy(model, batcher)
        rows = [_rows(1, 10 * i) for i in range(4)] + [np.array([[-1.0, 0.0]])]
        tasks = [asyncio.create_task(batcher.submit(x, 30.0)) for x in rows]
        await _wait_for(lambda: batcher.queue_depth == 5)
        model.gate.set()
        await blocker
        results = await asyncio.gather(*tasks, return_exceptions=True)
    assert [isinstance(r, ModelFailed) for r in results] == [False] * 4 + [True]
    rows_seen, total_s, own_s = seen[-1]
    assert rows_seen == 5
    assert total_s >= 3 * 0.020  # the first call, then bisection's (and the reference row's)
    assert own_s < total_s / 2
