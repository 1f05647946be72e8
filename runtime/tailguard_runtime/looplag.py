"""How late the event loop runs what is due: ``tailguard_event_loop_lag_seconds``.

Every step of every request (reading its head, handing its rows to the batch, writing its
answer) is a callback on the runtime's one event loop, so a callback that holds the loop (a
large body parsed, a burst of connections accepted or closed, a garbage collection) delays the
next step of every other client. The request histograms show that delay only mixed into
whole requests; this probe shows it alone. A timer due every :data:`SAMPLE_INTERVAL_S`
records how long after its due time it ran, measured on the loop's own clock.

A stall of ``S`` seconds delays an event that arrives during it by anything from ``S`` down to
0. One late timer shows only the longest of those waits, so a sample ``L`` later than the
interval is recorded together with ``L - interval``, ``L - 2 * interval``, ... down to the
last positive one: the samples a timer would have given had the loop been free to run it
every interval (HdrHistogram's ``recordValueWithExpectedInterval`` corrects a load
generator's missed sends the same way). So the histogram holds one sample per interval of
wall time, busy or not, and its quantiles are those of the wait a new event meets at a random
moment: one 500 ms stall every 10 s is 5% of the time, and puts the p99 near 400 ms.

The probe's own cost is one short callback per interval: 50 a second by default.
"""

from __future__ import annotations

import asyncio
from typing import Callable

SAMPLE_INTERVAL_S = 0.02
"""Seconds between two samples of the loop's lateness."""


class LoopLagProbe:
    """Samples the lateness of a timer on ``loop`` every ``interval_s`` seconds and passes each
    sample (seconds, never negative; see the module for the samples a long stall adds) to
    ``observe``, from :meth:`start` until :meth:`stop`.

    Lateness is ``loop.time()`` when the timer runs less the time it was due, on the clock the
    timer was set by. uvloop's ``loop.time()`` is in whole ms, so an idle uvloop reads 0, 1
    or 2 ms; asyncio's own loop reads tenths of a ms.

    Raises:
        ValueError: ``interval_s`` is not positive.
    """

    def __init__(self, loop: asyncio.AbstractEventLoop, observe: Callable[[float], None],
                 interval_s: float = SAMPLE_INTERVAL_S) -> None:
        if interval_s <= 0:
            raise ValueError(f"interval_s must be positive, got {interval_s}")
        self._loop = loop
        self._observe = observe
        self._interval_s = interval_s
        self._due = 0.0
        self._handle: asyncio.TimerHandle | None = None

    @property
    def running(self) -> bool:
        """A sample is scheduled."""
        return self._handle is not None

    def start(self) -> None:
        """Schedule the first sample (again after :meth:`stop`); no-op while running."""
        if self._handle is None:
            self._schedule()

    def stop(self) -> None:
        """Cancel the pending sample."""
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None

    def _schedule(self) -> None:
        self._due = self._loop.time() + self._interval_s
        self._handle = self._loop.call_at(self._due, self._sample)

    def _sample(self) -> None:
        late = max(0.0, self._loop.time() - self._due)
        self._schedule()  # first: an observer that raises must not end the sampling
        for value in lateness_samples(late, self._interval_s):
            self._observe(value)


def lateness_samples(late_s: float, interval_s: float) -> list[float]:
    """The samples one timer run ``late_s`` seconds late stands for, when it is due every
    ``interval_s`` seconds: ``late_s`` itself, then ``late_s - interval_s``,
    ``late_s - 2 * interval_s``, ... while above 0 (the waits of the events a free loop would
    have sampled during the stall). ``[late_s]`` when it is not later than the interval."""
    samples = [late_s]
    value = late_s - interval_s
    while value > 0:
        samples.append(value)
        value -= interval_s
    return samples
