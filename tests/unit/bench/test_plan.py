"""The load test's arithmetic (tailguard.bench.plan): schedules, percentiles, the verdict
on a run and on a rate sweep. Pure functions, so no server here; the generator's behaviour over
real HTTP is in test_bench_http.py."""

from __future__ import annotations

import numpy as np
import pytest

from tailguard.bench.plan import (
    ISSUE_AHEAD_S,
    TICK_MIN_S,
    Bounds,
    LoadResult,
    OpenLoop,
    arrival_offsets,
    judge,
    next_tick_in,
    outcome,
    parse_rates,
    percentiles_ms,
    sweep_verdict,
)


def test_poisson_arrivals_have_the_asked_mean_rate_and_stay_inside_the_horizon() -> None:
    offsets = arrival_offsets(OpenLoop(2000.0, seed=3), 10.0, 10**6)
    assert offsets[0] == 0.0 and np.all(np.diff(offsets) >= 0) and offsets[-1] < 10.0
    assert 19_000 < offsets.size < 21_000  # 20,000 expected; 7 standard deviations apart
    gaps = np.diff(offsets)
    assert gaps.std() == pytest.approx(gaps.mean(), rel=0.05)  # exponential: std == mean
    # same seed, same schedule; another seed, another one
    assert np.array_equal(offsets, arrival_offsets(OpenLoop(2000.0, seed=3), 10.0, 10**6))
    assert not np.array_equal(offsets[:100], arrival_offsets(OpenLoop(2000.0, seed=4), 10.0,
                                                             10**6)[:100])


def test_uniform_arrivals_and_the_request_cap() -> None:
    offsets = arrival_offsets(OpenLoop(100.0, poisson=False), 1.0, 10**6)
    assert offsets.tolist() == [i / 100.0 for i in range(100)]
    assert arrival_offsets(OpenLoop(100.0, poisson=False), 1.0, 7).size == 7
    with pytest.raises(ValueError, match="rate must be a positive"):
        arrival_offsets(OpenLoop(0.0), 1.0, 10)


def test_rates_parse_as_one_rate_or_a_sweep() -> None:
    assert parse_rates("250") == [250.0]
    assert parse_rates("100:400:100") == [100.0, 200.0, 300.0, 400.0]
    assert parse_rates("100:350:100") == [100.0, 200.0, 300.0]
    assert parse_rates("0.5:1.5:0.5") == [0.5, 1.0, 1.5]
    for bad, why in (("x", "expected R or A:B:STEP"), ("0", "must be > 0"),
                     ("1:2", "expected R or A:B:STEP"), ("5:1:1", "0 < A <= B"),
                     ("1:5:0", "STEP > 0"), ("1:1000:1", "at most 100")):
        with pytest.raises(ValueError, match=why):
            parse_rates(bad)


def test_percentiles_are_nearest_rank_values_in_ms_and_ordered() -> None:
    lat = np.arange(1, 1001, dtype=np.float64) / 1000.0  # 1..1000 ms
    p = percentiles_ms(lat)
    assert p == {"p50": 500.0, "p90": 900.0, "p95": 950.0, "p99": 990.0, "p99.9": 999.0,
                 "max": 1000.0}
    rng = np.random.default_rng(0)
    q = percentiles_ms(rng.lognormal(-5, 1, 777))
    values = [q[k] for k in ("p50", "p90", "p95", "p99", "p99.9", "max")]
    assert values == sorted(values)
    assert percentiles_ms([0.002]) == dict.fromkeys(["p50", "p90", "p95", "p99", "p99.9",
                                                     "max"], 2.0)
    assert set(percentiles_ms([]).values()) == {None}


def test_a_run_is_invalid_when_the_generator_lagged_or_was_saturated() -> None:
    assert judge({"p99": 0.4}, 0.5) == []
    assert judge({}, 0.5) == []  # closed loop: no schedule
    lagged = judge({"p99": 3.0}, 0.2)
    assert len(lagged) == 1 and "schedule lag 3.00 ms > 1 ms" in lagged[0]
    busy = judge({"p99": 0.2}, 0.95)
    assert len(busy) == 1 and "generator CPU 95% > 90%" in busy[0]
    assert len(judge({"p99": 3.0}, 0.95)) == 2
    assert judge({"p99": 3.0}, 0.2, max_lag_p99_ms=5.0) == []


def _result(p99: float, sent: int = 1000, ok: int = 1000, invalid: bool = False) -> LoadResult:
    return LoadResult("open", 100.0, None, 10.0, 1, sent=sent, ok=ok,
                      latency_ms={"p99": p99}, invalid=["lag"] if invalid else [])


def test_a_rate_holds_its_slo_on_p99_and_on_failures_whatever_the_generator_did() -> None:
    assert outcome(_result(40.0), 50) == "held"
    assert outcome(_result(60.0), 50) == "broke"
    assert outcome(_result(40.0, ok=980), 50) == "broke"  # 2% not answered 200 (429s included)
    assert outcome(_result(40.0, ok=995), 50) == "held"
    # latency counts from the scheduled time: a late generator only makes it longer, so a run
    # within the SLO holds all the same, and one over it is inconclusive, not a miss
    assert outcome(_result(40.0, invalid=True), 50) == "held"
    assert outcome(_result(60.0, invalid=True), 50) == "invalid"


def test_a_sweep_reports_the_last_rate_that_held_before_the_first_that_did_not() -> None:
    v = sweep_verdict([100, 200, 300], ["held", "held", "broke"])
    assert (v.rate_at_slo, v.stopped_at) == (200, 300)
    assert v.reason == "300 req/s broke the SLO; 200 req/s was the last rate that held"
    v = sweep_verdict([100], ["broke"])
    assert (v.rate_at_slo, v.stopped_at) == (None, 100)
    v = sweep_verdict([100, 200], ["held", "held"])
    assert (v.rate_at_slo, v.stopped_at) == (200, None)
    v = sweep_verdict([100, 200], ["held", "invalid"])
    assert (v.rate_at_slo, v.stopped_at) == (100, 200) and "invalid run" in v.reason


def test_an_interrupted_sweep_stops_where_ctrl_c_came_and_never_judges_that_rate() -> None:
    v = sweep_verdict([100, 200], ["held", "held"], interrupted_at=300)
    assert (v.rate_at_slo, v.stopped_at) == (200, 300)
    assert v.reason == "interrupted at 300 req/s; 200 req/s was the last rate that held"
    v = sweep_verdict([], [], interrupted_at=100)
    assert (v.rate_at_slo, v.stopped_at, v.reason) == (None, 100, "interrupted at 100 req/s")


def test_bounds_refuse_nonsense_naming_the_field() -> None:
    with pytest.raises(ValueError, match="^duration_s must be > 0, got 0$"):
        Bounds(duration_s=0)
    with pytest.raises(ValueError, match="^max_connections must be >= 1, got 0$"):
        Bounds(max_connections=0)


def test_the_open_loop_timer_never_waits_less_than_a_millisecond_and_is_early_otherwise() -> None:
    # libuv timers count whole ms: a shorter wait would round to 0 and spin the loop
    assert next_tick_in(10.0, 10.0) == TICK_MIN_S == 0.001
    assert next_tick_in(10.0 + ISSUE_AHEAD_S + 0.0002, 10.0) == TICK_MIN_S
    assert next_tick_in(9.0, 10.0) == TICK_MIN_S  # already late: tick again soon, not at once
    assert next_tick_in(10.5, 10.0) == pytest.approx(0.5 - ISSUE_AHEAD_S)
