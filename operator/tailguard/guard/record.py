"""The SLO guard's state as a cluster keeps it: ``status.guard`` and the roll-forward annotation.

In a cluster the guard's memory is the InferenceService itself, so that a restarted operator
neither loses nor repeats a rollback (docs/guard.md, "No flapping"):

* ``status.guard.rolledBackAt``, ``rollbackReason`` and ``rolledBackModel`` record the
  automatic rollback in effect; ``lastActionTime`` the guard's last action (the cooldown);
  ``rollForwardObserved`` the last roll-forward request acted on.
* A person rolls forward with the annotation :data:`ROLL_FORWARD_ANNOTATION` set to an RFC 3339
  time later than ``rolledBackAt`` (``tailguard rollforward NAME --cluster`` writes it). A
  request not yet recorded in ``rollForwardObserved`` clears the rollback at once for the
  traffic plan (:func:`rollback_in_effect`); the guard records it at its next window.
* A rollback recorded for another primary (``spec.model`` changed) no longer applies.

Both the reconcile pass (where traffic should go) and the guard (what it may do) read the
state through these functions, so they never disagree. Pure: no clock, no I/O; times are
passed in as timezone-aware datetimes.
"""

from __future__ import annotations

import datetime
from dataclasses import dataclass
from typing import Any, Mapping

from tailguard.guard.policy import Decision, History, Rollback

ROLL_FORWARD_ANNOTATION = "tailguard.dev/roll-forward"
"""Set to an RFC 3339 time (``kubectl annotate tgis NAME tailguard.dev/roll-forward=$(date -u
+%Y-%m-%dT%H:%M:%SZ) --overwrite``) to clear an automatic rollback that is older."""

ROLLBACK_KEYS = ("rolledBackAt", "rollbackReason", "rolledBackModel")
"""The ``status.guard`` keys of the rollback in effect (absent when none is)."""


@dataclass(frozen=True)
class GuardRecord:
    """What ``status.guard`` remembers across operator restarts (times are aware datetimes)."""

    rolled_back_at: datetime.datetime | None = None
    reason: str = ""
    model: str = ""
    """The primary (``uri@version``) the rollback was recorded for."""
    last_action_at: datetime.datetime | None = None
    roll_forward_observed: str = ""

    @classmethod
    def from_status(cls, status: Mapping[str, Any] | None) -> "GuardRecord":
        """Read ``status.guard`` (of a whole ``status``); unreadable times count as absent."""
        guard = (status or {}).get("guard") or {}
        return cls(parse_time(guard.get("rolledBackAt")), str(guard.get("rollbackReason", "")),
                   str(guard.get("rolledBackModel", "")),
                   parse_time(guard.get("lastActionTime")),
                   str(guard.get("rollForwardObserved", "")))


def parse_time(value: Any) -> datetime.datetime | None:
    """An RFC 3339 time as an aware datetime (UTC when it names no zone), else ``None``."""
    if not isinstance(value, str) or not value:
        return None
    try:
        stamp = datetime.datetime.fromisoformat(value)
    except ValueError:
        return None
    return stamp if stamp.tzinfo is not None else stamp.replace(tzinfo=datetime.timezone.utc)


def format_time(stamp: datetime.datetime) -> str:
    """RFC 3339 UTC with milliseconds (windows can be 1 s long), e.g.
    ``2026-12-05T17:30:00.125Z``."""
    utc = stamp.astimezone(datetime.timezone.utc)
    return utc.strftime("%Y-%m-%dT%H:%M:%S.") + f"{utc.microsecond // 1000:03d}Z"


def roll_forward_request(annotations: Mapping[str, str] | None,
                         record: GuardRecord) -> str | None:
    """The roll-forward annotation's value when it asks for something not yet done: a valid
    RFC 3339 time, not the one recorded in ``rollForwardObserved``, and later than the
    rollback in effect (a request older than the rollback does not undo it). ``None``
    otherwise."""
    value = (annotations or {}).get(ROLL_FORWARD_ANNOTATION)
    stamp = parse_time(value)
    if stamp is None or value == record.roll_forward_observed:
        return None
    if record.rolled_back_at is not None and stamp <= record.rolled_back_at:
        return None
    return value


def rollback_in_effect(record: GuardRecord, primary: str,
                       annotations: Mapping[str, str] | None) -> bool:
    """Whether an automatic rollback holds traffic on the fallback: one is recorded, for
    ``primary`` (``uri@version`` of ``spec.model``), and no roll-forward request newer than it
    is pending."""
    if record.rolled_back_at is None or record.model != primary:
        return False
    return roll_forward_request(annotations, record) is None


def traffic_intent(spec_traffic: str, record: GuardRecord, primary: str,
                   annotations: Mapping[str, str] | None) -> str:
    """Where traffic should go: ``fallback`` when ``spec.traffic`` says so or while an
    automatic rollback is in effect (:func:`rollback_in_effect`); else ``primary``. The same
    rule as :func:`tailguard.guard.policy.effective_traffic`, on what a cluster stores."""
    if spec_traffic == "fallback" or rollback_in_effect(record, primary, annotations):
        return "fallback"
    return "primary"


def history_from(record: GuardRecord, windows: History, *, now: datetime.datetime,
                 now_s: float) -> History:
    """The decision's :class:`History`: the windows (and re-arm time) the guard holds in memory
    from ``windows``, and the rollback and cooldown from ``record`` (their wall times placed on
    the caller's monotonic clock: ``now`` and ``now_s`` are the same instant)."""
    def monotonic(stamp: datetime.datetime | None) -> float | None:
        return None if stamp is None else now_s - (now - stamp).total_seconds()

    at = monotonic(record.rolled_back_at)
    rollback = None if at is None else Rollback(at, record.reason, record.model)
    return History(windows.windows, rollback, monotonic(record.last_action_at), windows.armed_s)


def guard_status(decision: Decision | None, record: GuardRecord,
                 decided_at: str) -> dict[str, Any]:
    """``status.guard`` after a window: the decision (``state``, ``breaches``,
    ``lastDecision``, ``lastDecisionReason``, ``lastDecisionTime`` = ``decided_at``) and the
    record. Keys of a rollback no longer in effect are absent, so a merge patch writes them as
    ``null`` (:func:`status_guard_patch`)."""
    guard: dict[str, Any] = {}
    if decision is not None:
        guard.update(state=decision.state, breaches=decision.breaches,
                     lastDecision=decision.action.value,
                     lastDecisionReason=decision.reason[:1024], lastDecisionTime=decided_at)
    if record.rolled_back_at is not None:
        guard.update(rolledBackAt=format_time(record.rolled_back_at),
                     rollbackReason=record.reason[:1024], rolledBackModel=record.model)
    if record.last_action_at is not None:
        guard["lastActionTime"] = format_time(record.last_action_at)
    if record.roll_forward_observed:
        guard["rollForwardObserved"] = record.roll_forward_observed
    return guard


def status_guard_patch(stored: Mapping[str, Any] | None,
                       new: Mapping[str, Any]) -> dict[str, Any]:
    """The merge patch of ``status.guard`` from ``stored`` to ``new``: keys ``new`` lacks are
    set to ``null`` (a merge patch removes them)."""
    patch: dict[str, Any] = {key: None for key in (stored or {}) if key not in new}
    patch.update(new)
    return patch
