"""How late the event loop runs what is due: ``tailguard_event_loop_lag_seconds``.

Every step of every request (reading its head, handing its rows to the batch, writing its
answer) is a callback on the runtime's one event loop, so a callback that holds the loop (a
large body parsed, a burst of connections accepted or closed, a garbage collection) delays the
next step of every other client. The request histograms show that delay only mixed into
whole requests; this probe shows it alone. A timer set every :data:`SAMPLE_INTERVAL_S`
records how long after its due time it ran:

* a stall longer than the interval always shows, since a timer falls due inside it, with
  about the stall's length;
* a shorter one shows in proportion to its length, so the histogram's quantiles are those of
  the wait a new event would see at a random moment (Node.js's ``perf_hooks`` event-loop delay
  monitor samples the same way, with a timer).

The probe's own cost is one short callback per interval: 50 a second by default.
"""

from __future__ import annotations

import asyncio
import time
from typing import Callable

SAMPLE_INTERVAL_S = 0.02
"""Seconds between two samples of the loop's lateness."""


class LoopLagProbe:
    """Samples the lateness of a timer on ``loop`` every ``interval_s`` seconds and passes it
    (seconds, never negative) to ``observe``, from :meth:`start` until :meth:`stop`.

    Lateness is measured against ``time.monotonic()``, the clock of asyncio's loop and of
    uvloop's (whose ``loop.time()`` is the same clock read coarsely, in ms steps, so an idle
    loop shows 0.4-1.5 ms).

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
        self._observe(max(0.0, time.monotonic() - self._due))
        self._schedule()
