"""Whether this operator replica may write, by kopf's peering rule, for the work kopf does not
pause itself.

With peering on (``peering.enabled`` in the chart), kopf pauses a replica's watches and
handlers while another live replica has a higher priority (or the same one: then every replica
pauses). Our periodic resync is a task of our own, which kopf does not pause: a standby
replica ran it and re-created a Service while the active replica was frozen. So before each
resync round the operator reads the same peering object kopf reads and applies the same rule
(:func:`active_peer`): one writer at a time.

kopf keeps one status key per replica in a ``ClusterKopfPeering`` (an operator watching every
namespace) or in a ``KopfPeering`` in each namespace it serves, each holding ``priority``,
``lifetime`` (seconds) and ``lastseen`` (ISO 8601); a replica whose ``lastseen + lifetime`` has
passed is dead (``kopf/_core/engines/peering.py``, kopf 1.45).
"""

from __future__ import annotations

import datetime
from dataclasses import dataclass
from typing import Any, Mapping

DEFAULT_PEERING = "default"
"""kopf's peering object name when peering is on and no name is given."""
DEFAULT_LIFETIME_S = 60
"""kopf's ``settings.peering.lifetime`` default, for a record that does not say (seconds)."""


@dataclass(frozen=True)
class Peering:
    """This replica's place in kopf peering: the peering object's ``name`` and the
    ``priority`` the replica drew (:func:`tailguard.operator.handlers.run_operator`)."""

    name: str
    priority: int


def active_peer(status: Mapping[str, Any] | None, priority: int, now: datetime.datetime) -> bool:
    """Whether a replica of ``priority`` is the one kopf lets work, given the peering object's
    ``status`` (``None``: no such object; kopf then pauses a replica that must peer).

    Active when no live record has a higher priority and at most one live record has this one
    (its own: priorities are drawn at random from 2**31, so a second means a conflict, on which
    kopf pauses every replica). A record without a readable ``lastseen`` counts as live, as kopf
    counts it. ``now`` must be timezone-aware.
    """
    if status is None:
        return False
    same = 0
    for record in status.values():
        if not isinstance(record, Mapping) or not _live(record, now):
            continue
        theirs = int(record.get("priority", 0))
        if theirs > priority:
            return False
        same += theirs == priority
    return same <= 1


def _live(record: Mapping[str, Any], now: datetime.datetime) -> bool:
    try:
        seen = datetime.datetime.fromisoformat(str(record["lastseen"]))
        lifetime = float(record.get("lifetime", DEFAULT_LIFETIME_S))
    except (KeyError, TypeError, ValueError):
        return True
    if seen.tzinfo is None:
        seen = seen.replace(tzinfo=datetime.timezone.utc)
    return seen + datetime.timedelta(seconds=lifetime) > now
