"""The SLO guard of ``tailguard up``: every window, read the totals, decide, apply.

A thin shell around :mod:`tailguard.guard.observe` and :mod:`tailguard.guard.policy` (which hold every rule). Every
``slo.windowSeconds`` it reads the runtime's cumulative totals per role, turns the active role's
increments into a window, asks :func:`~tailguard.guard.policy.decide`, and applies the answer: an automatic
rollback moves traffic through the runtime's switch (requests already admitted finish on the
model that admitted them), prints one line a person can read, and counts
``tailguard_rollbacks_total{reason}``. It keeps what the cluster keeps in ``status`` (the window
it saw, the guard's state, the ``SLOMet`` and ``RolledBack`` conditions) for the status route and
the status line.

A person's switch (``tailguard rollback``/``rollforward`` through the loopback route) is seen at
the next window: rolling forward clears an automatic rollback and re-arms the guard; rolling back
by hand makes the fallback the intent (the guard reports, and has nothing to roll back to). The
guard never changes the spec.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from datetime import datetime, timezone
from typing import Any, Callable, Protocol

from tailguard.guard.observe import Counts, Observation, difference, observe, status_observed
from tailguard.guard.policy import (
    Action,
    Decision,
    GuardSpec,
    History,
    applied,
    decide,
    effective_traffic,
    remember,
    rolled_forward,
)
from tailguard.guard.record import GuardRecord, format_time, guard_status, parse_time
from tailguard.guard.rollbacks import bind_rollbacks
from tailguard.spec.conditions import set_condition
from tailguard.spec.resource import InferenceService
from tailguard_runtime.service import Runtime
from tailguard_runtime.stats import TotalsSnapshot

logger = logging.getLogger(__name__)


class Lines(Protocol):
    """Where the guard's one-line messages go: a text file, or ``tailguard up``'s status
    line (:class:`tailguard.up.statusline.StatusLine`), which shows them above itself."""

    def write(self, text: str, /) -> int: ...

    def flush(self) -> None: ...


class LocalGuard:
    """The guard of one ``tailguard up`` process.

    ``clock`` is monotonic seconds (``time.perf_counter``, the runtime's clock) and ``wall``
    Unix seconds for the timestamps status shows; both are parameters so tests can drive
    :meth:`tick` by hand.
    """

    def __init__(self, runtime: Runtime, isvc: InferenceService, out: Lines, *,
                 clock: Callable[[], float] = time.perf_counter,
                 wall: Callable[[], float] = time.time) -> None:
        self.runtime = runtime
        self.spec = GuardSpec.from_service(isvc, local=True)
        self.out = out
        self._clock = clock
        self._wall = wall
        self.history = History()
        self.decision: Decision | None = None
        self.observation: Observation | None = None
        self._observed_at = ""
        self._previous: dict[str, TotalsSnapshot] = {}
        self._last_s: float | None = None
        self._seen_role = runtime.active_role
        self._count_rollback = bind_rollbacks(runtime.name)
        self._events: dict[str, str] = {}  # wall times of the guard's own actions, RFC 3339
        self._conditions: list[dict[str, Any]] = []

    def start(self) -> None:
        """Take the first read: the first window starts now."""
        now = self._clock()
        self._read(now)
        self._last_s = now

    def tick(self) -> Decision:
        """Close the current window, decide and apply. Returns the decision."""
        now = self._clock()
        self._notice_switch(now)
        totals = self._read(now)
        role = self.runtime.active_role
        window_s = now - (self._last_s if self._last_s is not None else now)
        self._last_s = now
        obs = observe(totals[role], role=role, end_s=now, window_s=max(window_s, 1e-9),
                      slo_ms=self.spec.p99_latency_ms)
        self.observation, self._observed_at = obs, self._iso()
        self.history = remember(self.spec, self.history, obs)
        decision = decide(self.spec, self.history, now)
        if decision.action is Action.ROLL_BACK:
            self._roll_back(decision, now)
        self.decision = decision
        self._set_conditions(decision)
        return decision

    async def run(self) -> None:
        """Tick every ``windowSeconds`` on a fixed schedule until cancelled or draining."""
        self.start()
        period_s = self.spec.window_seconds
        next_s = self._clock() + period_s
        while not self.runtime.draining:
            await asyncio.sleep(max(next_s - self._clock(), 0.0))
            next_s += period_s
            if self.runtime.draining:
                break
            try:
                self.tick()
            except Exception:  # a bug of ours must not stop serving; say so once per window
                logger.exception("SLO guard window failed service=%s", self.runtime.name)

    def status(self) -> dict[str, Any]:
        """What the cluster keeps in ``status`` (the CRD's shape): ``activeModel``,
        ``observed``, ``guard`` (built as the cluster's guard builds it,
        :func:`~tailguard.guard.record.guard_status`) and the ``SLOMet``/``RolledBack``
        conditions."""
        doc: dict[str, Any] = {"activeModel": self.runtime.active_role,
                               "conditions": list(self._conditions)}
        if self.observation is not None:
            doc["observed"] = status_observed(self.observation, self._observed_at)
        rollback = self.history.rollback
        record = GuardRecord(
            rolled_back_at=None if rollback is None else parse_time(
                self._events.get("rolledBackAt")),
            reason="" if rollback is None else rollback.reason,
            model="" if rollback is None else rollback.primary,
            last_action_at=parse_time(self._events.get("lastActionTime")))
        doc["guard"] = guard_status(self.decision, record, self._observed_at)
        return doc

    def label(self) -> str:
        """The guard's state for the status line (``ok``, ``breach 1/3``, ``overload``,
        ``rolled back``, ``idle``, ``manual``; ``off`` when ``rollback.automatic`` is false and
        nothing is breached)."""
        if self.decision is None:
            return "idle"
        if not self.spec.automatic and self.decision.state in ("ok", "idle"):
            return f"{self.decision.label} (automatic rollback off)"
        return self.decision.label

    def _read(self, now: float) -> dict[str, Counts]:
        """Read the totals of every role; return each role's window since the last read."""
        windows: dict[str, Counts] = {}
        for role, doc in self.runtime.totals(now).items():
            current = TotalsSnapshot.from_json(doc)
            windows[role] = difference(self._previous.get(role), current)
            self._previous[role] = current
        return windows

    def _notice_switch(self, now: float) -> None:
        role = self.runtime.active_role
        if role == self._seen_role:
            return
        self._seen_role = role
        if role == "primary":
            rolled_back = self.history.rollback is not None
            self.history = rolled_forward(self.history, now)
            self.spec = dataclasses.replace(self.spec, traffic="primary")
            if rolled_back:
                self._say("rolled forward by hand: traffic on the primary, the SLO guard is "
                          "re-armed")
        else:
            self.spec = dataclasses.replace(self.spec, traffic="fallback")
            self._say("rolled back by hand: traffic on the fallback (the guard reports; roll "
                      "forward with tailguard rollforward)")

    def _roll_back(self, decision: Decision, now: float) -> None:
        self.runtime.switch("fallback", by="guard")
        self._seen_role = self.runtime.active_role
        self.history = applied(self.spec, self.history, decision, now)
        stamp = self._iso()
        self._events.update(rolledBackAt=stamp, lastActionTime=stamp)
        self._count_rollback(decision.breach or "latency")
        assert effective_traffic(self.spec, self.history) == "fallback"
        self._say(f"automatic rollback to the fallback: {decision.reason} "
                  f"(windows of {self.spec.window_seconds:g}s; roll forward with "
                  f"`tailguard rollforward {self.runtime.name}`)")

    def _set_conditions(self, d: Decision) -> None:
        rolled = self.history.rollback is not None
        wanted = {
            "SLOMet": (d.slo_status, d.slo_reason, d.reason),
            "RolledBack": ("True" if rolled else "False",
                           "AutomaticRollback" if rolled else
                           ("ManualRollback" if self.runtime.active_role == "fallback"
                            else "OnPrimary"),
                           self.history.rollback.reason if self.history.rollback else
                           f"traffic on the {self.runtime.active_role}"),
        }
        now = datetime.fromtimestamp(self._wall(), timezone.utc)
        for kind, (status, reason, message) in wanted.items():
            self._conditions = set_condition(self._conditions, kind, status, reason, message,
                                             generation=None, now=now)

    def _say(self, text: str) -> None:
        line = f"{self.runtime.name}: {text}"
        logger.info("slo guard service=%s %s", self.runtime.name, text)
        self.out.write(line + "\n")
        self.out.flush()

    def _iso(self) -> str:
        """The wall time as RFC 3339 UTC with milliseconds (:func:`format_time`)."""
        return format_time(datetime.fromtimestamp(self._wall(), timezone.utc))
