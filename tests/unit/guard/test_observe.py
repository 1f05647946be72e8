"""Windows as differences of cumulative totals: exact at the SLO edge, reset-aware, summable."""

from __future__ import annotations

import pytest

from tailguard.guard.observe import Counts, difference, observe, status_observed
from tailguard.guard.policy import Action, GuardSpec, History, decide
from tailguard_runtime.stats import Totals, TotalsSnapshot, WindowStats, latency_bounds_s


def read(runtime: Totals, queue_row_s: float = 0.0) -> TotalsSnapshot:
    return TotalsSnapshot.from_json(runtime.snapshot(queue_row_s))


@pytest.mark.parametrize("slo_ms", [1, 17, 50, 123, 999, 600000])
def test_the_slo_is_an_exact_bucket_edge(slo_ms: int) -> None:
    bounds = latency_bounds_s(slo_ms / 1000.0)
    assert slo_ms / 1000.0 in bounds and list(bounds) == sorted(set(bounds))


def test_slower_than_the_slo_is_counted_exactly_at_the_edge() -> None:
    """17 ms is no Prometheus bucket edge; 16.9 ms and exactly 17 ms meet the SLO, 17.1 does not."""
    totals = Totals(latency_bounds_s(0.017))
    for latency_ms in (1, 16.9, 17, 17, 17.1, 18, 40):
        totals.admit(latency_ms / 1000.0, None)
    obs = observe(difference(None, read(totals)), role="primary", end_s=1.0, window_s=1.0,
                  slo_ms=17)
    assert (obs.admitted, obs.slow) == (7, 3)
    assert obs.p99_ms == 40.0  # the upper edge of the bucket holding the 99th percentile


def test_a_window_is_the_difference_of_two_reads() -> None:
    stats = WindowStats(10.0, capacity=64, slo_s=0.05)
    for _ in range(100):
        stats.admitted(0.0, 0.010, True)
    first = read(stats.totals, queue_row_s=5.0)
    for _ in range(190):
        stats.admitted(1.0, 0.010, True)
    for _ in range(10):
        stats.admitted(1.0, 0.200, False, "deadline_exceeded")
    for _ in range(7):
        stats.refused(1.0, "deadline")
    stats.refused(1.0, "queue_full")
    second = read(stats.totals, queue_row_s=25.0)
    obs = observe(difference(first, second), role="primary", end_s=2.0, window_s=2.0, slo_ms=50)
    assert (obs.admitted, obs.slow, obs.errors, obs.timeouts) == (200, 10, 10, 10)
    assert (obs.deadline_refused, obs.queue_full, obs.refused_total) == (7, 1, 8)
    assert obs.queue_depth == pytest.approx(10.0)  # 20 row-seconds over 2 s
    assert obs.requests_per_second == pytest.approx(100.0)
    assert obs.slow_fraction == pytest.approx(17 / 207)
    assert obs.error_rate == pytest.approx(0.05)
    observed = status_observed(obs, "2026-01-01T00:00:00Z")
    assert observed["p99Ms"] == 200.0 and observed["samples"] == 200
    assert observed["deadlineRejected"] == 7 and observed["role"] == "primary"


def test_a_restart_starts_the_window_at_zero() -> None:
    before = Totals(latency_bounds_s(0.05))
    for _ in range(1000):
        before.admit(0.001, None)
    after = Totals(latency_bounds_s(0.05))  # the process restarted
    for _ in range(30):
        after.admit(0.1, None)
    counts = difference(read(before, 100.0), read(after, 2.0))
    assert counts.admitted == 30 and counts.queue_row_seconds == 2.0
    assert observe(counts, role="primary", end_s=1, window_s=1, slo_ms=50).slow == 30


def test_windows_of_several_pods_add_up_exactly() -> None:
    pods = [Totals(latency_bounds_s(0.05)) for _ in range(3)]
    previous = [read(p) for p in pods]
    for i, pod in enumerate(pods):
        for k in range(100 * (i + 1)):
            pod.admit(0.06 if k % 50 == 0 else 0.002, None)
    total = Counts()
    for pod, prev in zip(pods, previous):
        total = total + difference(prev, read(pod, 30.0))
    obs = observe(total, role="primary", end_s=1.0, window_s=10.0, slo_ms=50, replicas=3)
    assert (obs.admitted, obs.slow) == (600, 12)
    assert obs.queue_depth == pytest.approx(3.0)  # 90 row-seconds / 10 s / 3 pods


def test_an_slo_that_is_not_an_edge_is_refused() -> None:
    totals = Totals(latency_bounds_s(0.05))
    with pytest.raises(ValueError, match="not a bucket edge"):
        observe(difference(None, read(totals)), role="primary", end_s=1, window_s=1, slo_ms=17)
    with pytest.raises(ValueError, match="not a totals document"):
        TotalsSnapshot.from_json({"admitted": 1})


def test_decide_on_observed_windows() -> None:
    """The same arithmetic end to end: three windows of a slow model's totals roll back."""
    spec = GuardSpec(p99_latency_ms=50, window_seconds=1, breach_windows=3, min_samples=10)
    stats = WindowStats(1.0, capacity=64, slo_s=0.05)
    previous = read(stats.totals)
    windows = []
    for second in range(1, 4):
        for _ in range(20):
            stats.admitted(float(second), 0.120, True)
        current = read(stats.totals)
        windows.append(observe(difference(previous, current), role="primary", end_s=second,
                               window_s=1.0, slo_ms=50))
        previous = current
    decision = decide(spec, History(tuple(windows)), now_s=3.0)
    assert decision.action is Action.ROLL_BACK and decision.breach == "latency"


def test_excluded_requests_are_a_window_of_their_own_and_never_judged() -> None:
    """A short deadline's 504 and rows the model rejected are counted apart from the admitted
    requests, the errors and the refusals, differenced like every other count, and shown in
    the window's status."""
    stats = WindowStats(10.0, slo_s=0.05)
    stats.admitted(0.5, 0.004, True)
    stats.excluded(0.6, "short_deadline")
    before = read(stats.totals)
    for _ in range(3):
        stats.excluded(1.0, "short_deadline")
    stats.excluded(1.0, "input_rejected")
    stats.admitted(1.0, 0.004, True)
    after = read(stats.totals)
    obs = observe(difference(before, after), role="primary", end_s=2.0, window_s=1.0, slo_ms=50)
    assert obs.excluded == {"short_deadline": 3, "input_rejected": 1}
    assert (obs.admitted, obs.errors, obs.refused_total, obs.judged) == (1, 0, 0, 1)
    shown = status_observed(obs, "2026-12-03T12:00:00Z")
    assert shown["excluded"] == {"short_deadline": 3, "input_rejected": 1}
    assert shown["judged"] == 1
    assert stats.snapshot(1.0, 0)["excluded"] == {"short_deadline": 4, "input_rejected": 1}


def test_small_calls_are_counted_apart_with_the_slow_ones_among_them() -> None:
    """Half of ``maxBatchSize`` rows or fewer is a small call; slow is over half the SLO, and
    small calls over the whole SLO are counted apart."""
    stats = WindowStats(10.0, capacity=8, slo_s=0.05, max_batch_size=32)
    for rows, seconds in ((32, 0.060), (16, 0.030), (16, 0.060), (1, 0.001), (17, 0.040)):
        stats.totals.call(seconds, rows)
    obs = observe(difference(None, read(stats.totals)), role="primary", end_s=1.0,
                  window_s=1.0, slo_ms=50)
    assert (obs.calls, obs.slow_calls, obs.small_calls, obs.small_calls_over_slo) == (5, 4, 3, 1)
    again = read(stats.totals)
    stats.totals.call(0.051, 2)
    later = observe(difference(again, read(stats.totals)), role="primary", end_s=2.0,
                    window_s=1.0, slo_ms=50)
    assert (later.small_calls, later.small_calls_over_slo) == (1, 1)
