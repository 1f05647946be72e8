"""The event-loop lag probe, on asyncio's loop and on uvloop (the runtime's)."""

from __future__ import annotations

import asyncio
import time
from typing import Callable

import pytest
import uvloop

from tailguard_runtime.looplag import LoopLagProbe, lateness_samples

LOOPS: dict[str, Callable[[], asyncio.AbstractEventLoop]] = {
    "asyncio": asyncio.new_event_loop, "uvloop": uvloop.new_event_loop}


def run_on(kind: str, body: Callable[[asyncio.AbstractEventLoop], object]) -> object:
    loop = LOOPS[kind]()
    try:
        return loop.run_until_complete(body(loop))  # type: ignore[arg-type]
    finally:
        loop.close()


@pytest.mark.parametrize("kind", sorted(LOOPS))
def test_a_callback_that_holds_the_loop_shows_with_the_samples_it_missed(kind: str) -> None:
    samples: list[float] = []

    async def body(loop: asyncio.AbstractEventLoop) -> None:
        probe = LoopLagProbe(loop, samples.append, interval_s=0.01)
        probe.start()
        await asyncio.sleep(0.2)
        loop.call_soon(time.sleep, 0.3)  # holds the loop as a slow callback would
        await asyncio.sleep(0.2)  # begins after the stall
        probe.stop()

    run_on(kind, body)
    # the timer fell due within the first 10 ms of the 300 ms stall and ran at its end; the
    # samples it missed meanwhile follow it, one per 10 ms, down to its start (a busy machine
    # adds stalls of its own elsewhere in the list, so their count is not a bound)
    top = samples.index(max(samples))
    assert 0.28 <= samples[top] <= 0.6, samples
    assert min(samples) >= 0.0
    run = 1
    while top + run < len(samples) and abs(samples[top + run - 1] - samples[top + run] - 0.01) < 1e-9:
        run += 1
    # down to its start: the run's last sample is within one interval of 0 (the probe stops
    # above 0; float steps can leave a last one of 1e-12 where 0.3 s is 30 intervals exactly)
    assert 0 < samples[top + run - 1] <= 0.01 + 1e-9, (run, samples[top:top + run + 1])
    assert run >= 28, (run, samples[top:top + run + 1])
    assert len(samples) >= 45  # 0.7 s of wall time at one sample per 10 ms, busy or not


@pytest.mark.parametrize("kind", sorted(LOOPS))
def test_stop_ends_the_samples_and_start_resumes_them(kind: str) -> None:
    samples: list[float] = []

    async def body(loop: asyncio.AbstractEventLoop) -> tuple[int, int, bool, float]:
        probe = LoopLagProbe(loop, samples.append, interval_s=0.01)
        started = time.monotonic()
        probe.start()
        probe.start()  # a second start does not double the sampling
        await asyncio.sleep(0.1)
        probe.stop()
        stopped_at = len(samples)
        elapsed = time.monotonic() - started
        await asyncio.sleep(0.1)
        after_stop = len(samples)
        probe.start()
        await asyncio.sleep(0.1)
        probe.stop()
        return stopped_at, after_stop, probe.running, elapsed

    stopped_at, after_stop, running, elapsed = run_on(kind, body)  # type: ignore[misc]
    assert after_stop == stopped_at
    assert len(samples) > after_stop
    assert 1 <= stopped_at <= elapsed / 0.01 + 1  # one timer, not two: one sample per 10 ms
    assert not running


def test_the_interval_must_be_positive() -> None:
    loop = asyncio.new_event_loop()
    try:
        with pytest.raises(ValueError, match="interval_s must be positive, got 0"):
            LoopLagProbe(loop, print, interval_s=0)
    finally:
        loop.close()


def test_a_late_sample_stands_for_the_samples_its_stall_missed() -> None:
    assert lateness_samples(0.005, 0.02) == [0.005]
    assert lateness_samples(0.02, 0.02) == [0.02]
    values = lateness_samples(0.065, 0.02)
    assert values == pytest.approx([0.065, 0.045, 0.025, 0.005])
    assert lateness_samples(0.0, 0.02) == [0.0]


def test_an_observer_that_raises_does_not_end_the_sampling() -> None:
    calls: list[float] = []

    def observe(value: float) -> None:
        calls.append(value)
        raise RuntimeError("observer failed")

    async def body(loop: asyncio.AbstractEventLoop) -> bool:
        loop.set_exception_handler(lambda _loop, _context: None)
        probe = LoopLagProbe(loop, observe, interval_s=0.01)
        probe.start()
        deadline = loop.time() + 10.0  # three samples take 30 ms; a busy machine, longer
        while len(calls) < 3 and loop.time() < deadline:
            await asyncio.sleep(0.01)
        running = probe.running
        probe.stop()
        return running

    assert run_on("uvloop", body)
    assert len(calls) >= 3, "the probe stopped sampling after its observer raised"
