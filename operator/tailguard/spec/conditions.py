"""``metav1.Condition`` helpers for the InferenceService status, as pure functions.

A condition is a dict with ``type``, ``status`` (``"True"``, ``"False"`` or ``"Unknown"``),
``reason``, ``message``, ``observedGeneration`` and ``lastTransitionTime``;
``lastTransitionTime`` changes only when a condition's ``status`` does. Every writer of the
status uses these: the operator (:mod:`tailguard.operator.status`) and the SLO guard. Which
writer owns which condition type is the writers' business, not this module's. The clock is an
argument.
"""

from __future__ import annotations

import datetime
from typing import Any, Mapping, Sequence

CONDITION_TYPES = ("Ready", "PrimaryReady", "FallbackReady", "SLOMet", "RolledBack")
"""Every condition type the operator sets, in the order it lists them."""


MAX_MESSAGE = 4096
"""Condition messages are cut to this many characters (the CRD allows 32768)."""

def timestamp(now: datetime.datetime) -> str:
    """RFC 3339 UTC timestamp with second precision (``2025-01-31T12:00:00Z``).

    Raises:
        ValueError: ``now`` is naive (has no timezone).
    """
    if now.tzinfo is None:
        raise ValueError("now must be timezone-aware")
    return now.astimezone(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def set_condition(conditions: Sequence[Mapping[str, Any]], type_: str, status: str, reason: str,
                  message: str, *, generation: int | None, now: datetime.datetime
                  ) -> list[dict[str, Any]]:
    """A copy of ``conditions`` with ``type_`` set (appended if absent, in place otherwise).

    ``lastTransitionTime`` is kept from the existing condition when ``status`` is unchanged,
    and is ``now`` otherwise. ``status`` is ``"True"``, ``"False"`` or ``"Unknown"``.
    """
    out = [dict(c) for c in conditions]
    previous = next((c for c in out if c.get("type") == type_), None)
    since = timestamp(now)
    if previous is not None and previous.get("status") == status:
        since = previous.get("lastTransitionTime") or since
    new: dict[str, Any] = {"type": type_, "status": status, "reason": reason,
                           "message": message[:MAX_MESSAGE], "lastTransitionTime": since}
    if generation is not None:
        new["observedGeneration"] = generation
    if previous is None:
        out.append(new)
    else:
        out[out.index(previous)] = new
    return out


def find_condition(status: Mapping[str, Any], type_: str) -> dict[str, Any] | None:
    """The condition of type ``type_`` in a status, or ``None``."""
    for condition in status.get("conditions") or []:
        if condition.get("type") == type_:
            return dict(condition)
    return None


def ordered(conditions: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Known types first in :data:`CONDITION_TYPES` order, then others as found."""
    rank = {t: i for i, t in enumerate(CONDITION_TYPES)}
    return sorted((dict(c) for c in conditions),
                  key=lambda c: rank.get(c.get("type", ""), len(rank)))
