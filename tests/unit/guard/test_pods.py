"""One window summed over pods: each pod differenced against its own previous read."""

from __future__ import annotations

import pytest

from tailguard.guard.observe import observe
from tailguard.guard.pods import PodWindows, totals_of
from tailguard_runtime.stats import Totals, TotalsSnapshot, latency_bounds_s

BOUNDS = latency_bounds_s(0.05)


def served(fast: int, slow: int = 0) -> TotalsSnapshot:
    """The totals of a pod that answered ``fast`` requests in 10 ms and ``slow`` in 200 ms."""
    totals = Totals(BOUNDS)
    for _ in range(fast):
        totals.admit(0.010, None)
    for _ in range(slow):
        totals.admit(0.200, None)
    return TotalsSnapshot.from_json(totals.snapshot(0.0))


def test_a_first_read_is_a_baseline_and_pods_add_up() -> None:
    windows = PodWindows()
    counts, pods = windows.window({"a": served(500), "b": served(100)}, ["a", "b"])
    assert pods == 0 and counts.admitted == 0  # an hour of history is not one window
    counts, pods = windows.window({"a": served(600, 2), "b": served(150, 1)}, ["a", "b"])
    assert pods == 2 and counts.admitted == 153
    obs = observe(counts, role="primary", end_s=2.0, window_s=2.0, slo_ms=50, replicas=pods)
    assert obs.slow == 3 and obs.replicas == 2


def test_an_unread_pod_keeps_its_previous_read_and_a_gone_pod_is_forgotten() -> None:
    windows = PodWindows()
    windows.window({"a": served(10), "b": served(10)}, ["a", "b"])
    counts, pods = windows.window({"a": served(20)}, ["a", "b"])  # b did not answer
    assert (pods, counts.admitted) == (1, 10)
    counts, pods = windows.window({"a": served(30), "b": served(40)}, ["a", "b"])
    assert (pods, counts.admitted) == (2, 40)  # b's two intervals, counted once
    windows.window({"a": served(40)}, ["a"])  # b's pod is gone
    counts, pods = windows.window({"a": served(50), "b": served(99)}, ["a", "b"])
    assert (pods, counts.admitted) == (1, 10)  # a new b starts from a baseline again


def test_a_restarted_container_counts_from_its_restart() -> None:
    windows = PodWindows()
    windows.window({"a": served(1000)}, ["a"])
    counts, pods = windows.window({"a": served(7)}, ["a"])  # counters went down
    assert (pods, counts.admitted) == (1, 7)


def test_totals_of_names_a_missing_role() -> None:
    doc = {"totals": {"primary": Totals(BOUNDS).snapshot(0.0)}}
    assert totals_of(doc, "primary").admitted == 0
    with pytest.raises(ValueError, match="fallback"):
        totals_of(doc, "fallback")
    with pytest.raises(ValueError):
        totals_of({}, "primary")
