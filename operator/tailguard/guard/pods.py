"""One window of the cluster guard, summed over the pods of a role.

Every window the cluster guard (:mod:`tailguard.operator.guarding`) reads the cumulative
totals of each Ready pod of the role traffic goes to (``/tailguard/stats`` on the pod's IP), differences each pod against its previous read
(:func:`tailguard.guard.observe.difference`, reset-aware), and sums the pods
(:class:`tailguard.guard.observe.Counts` add exactly: the SLO is a bucket edge of every pod's
histogram). A pod's first read is only its baseline: it may have served for an hour before the
operator started, and that hour is not one window. Pure: no I/O, no clock.
"""

from __future__ import annotations

from typing import Any, Iterable, Mapping

from tailguard.guard.observe import Counts, difference
from tailguard_runtime.stats import TotalsSnapshot


def totals_of(stats: Mapping[str, Any], role: str) -> TotalsSnapshot:
    """The totals of ``role`` in a runtime's ``/tailguard/stats`` answer.

    Raises:
        ValueError: the answer has no totals for ``role`` (another program, or a runtime
            started for another role).
    """
    doc = (stats.get("totals") or {}).get(role)
    if not isinstance(doc, Mapping):
        raise ValueError(f"no totals for the {role} role in /tailguard/stats")
    return TotalsSnapshot.from_json(doc)


class PodWindows:
    """The previous read of each pod of one InferenceService, by pod ``uid``."""

    def __init__(self) -> None:
        self._previous: dict[str, TotalsSnapshot] = {}

    def window(self, reads: Mapping[str, TotalsSnapshot],
               live: Iterable[str]) -> tuple[Counts, int]:
        """Sum the windows of the pods read this time (``reads``: uid to totals) since their
        previous read, and forget pods no longer in ``live`` (uids). A pod read for the first
        time contributes nothing (its baseline). A pod not read this time (it did not answer)
        keeps its previous read, so its next window covers both intervals: counts are never
        lost or counted twice. Returns the sum and how many pods it holds (the replicas a
        queue depth is divided by)."""
        keep = set(live)
        for uid in [uid for uid in self._previous if uid not in keep]:
            del self._previous[uid]
        total, pods = Counts(), 0
        for uid, current in reads.items():
            previous = self._previous.get(uid)
            self._previous[uid] = current
            if previous is None:
                continue
            total, pods = total + difference(previous, current), pods + 1
        return total, pods
