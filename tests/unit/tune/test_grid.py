"""The grid drawn from the raw table, and the choice of a batch policy inside the SLO."""

from __future__ import annotations

from tailguard.tune.grid import Grid, PointResult, Policy, build_grid, choose
from tailguard.tune.rawtable import RawRow


def table(*rows: tuple[int, float, float]) -> list[RawRow]:
    """Rows of (batch, p90 ms, rows/s); the median is taken equal to the p90."""
    return [RawRow(b, 10, p90, p90, rps) for b, p90, rps in rows]


def point(batch: int, wait: int, rps: float, p99: float | None, meets: bool,
          note: str = "") -> PointResult:
    return PointResult(Policy(batch, wait), rps, None, None, p99, meets, note)


FOREST = table((1, 1.0, 1_000), (8, 1.5, 5_300), (32, 2.5, 12_800), (128, 8.0, 16_000),
               (512, 30.0, 17_000))


def test_the_grid_stops_at_the_knee_where_batching_stops_paying() -> None:
    grid = build_grid(FOREST, slo_ms=100, max_queue_size=1024, n_batches=3, n_waits=2)
    # 128 gives 25% more rows/s than 32, 512 only 6% more than 128: 512 is the knee, the last
    assert grid.batches == (32, 128, 512)
    assert "batch 512 gives 17,000 rows/s" in grid.reason and "stops paying" in grid.reason
    # two calls of batch 512 take 60 ms at p90: the waits go up to half the 40 ms left
    assert grid.waits == (0, 20)


def test_the_grid_respects_the_slo_and_max_queue_size() -> None:
    by_slo = build_grid(FOREST, slo_ms=12, max_queue_size=1024, n_batches=2)
    assert by_slo.batches == (8, 32)
    assert "do not fit in the 12 ms SLO" in by_slo.reason
    by_queue = build_grid(FOREST, slo_ms=200, max_queue_size=64, n_batches=5)
    assert by_queue.batches == (1, 8, 32)
    assert "over maxQueueSize 64" in by_queue.reason


def test_waits_are_whole_ms_from_zero_to_half_the_headroom() -> None:
    cut = build_grid(FOREST, slo_ms=50, max_queue_size=1024, n_batches=1, n_waits=3)
    assert cut.batches == (128,) and cut.waits == (0, 8, 17)  # (50 - 16) / 2 = 17
    small = build_grid(table((1, 1.0, 1_000), (8, 2.0, 1_050)), slo_ms=50,
                       max_queue_size=100, n_batches=2, n_waits=3)
    # largest batch 8 at 2 ms: (50 - 4) / 2 = 23 ms, waits 0, 12 (11.5 rounded), 23
    assert small.batches == (1, 8)
    assert small.waits == (0, 12, 23)
    assert all(w < 50 for w in small.waits)
    assert Grid((1, 8), (0, 12), "").policies == [Policy(1, 0), Policy(1, 12), Policy(8, 0),
                                                   Policy(8, 12)]


def test_a_batch_of_one_that_already_misses_the_slo_is_still_the_grid() -> None:
    grid = build_grid(table((1, 40.0, 25), (8, 300.0, 26)), slo_ms=50, max_queue_size=256)
    assert grid.batches == (1,) and grid.waits == (0,)


def test_the_highest_throughput_inside_the_slo_wins_and_the_reason_says_so() -> None:
    points = [point(8, 0, 900, 10, True), point(32, 0, 2_000, 30, True),
              point(128, 0, 3_000, 80, False, "p99 80.0 ms over the SLO"),
              point(32, 5, 1_500, 35, True)]
    choice = choose(points, 50)
    assert choice.ok and choice.chosen is points[1] and choice.closest is None
    assert choice.reason.startswith("maxBatchSize=32 maxWaitMs=0: 2,000 req/s at p99 30.0 ms")
    assert "3 of 4 points that met it" in choice.reason


def test_equal_throughputs_go_to_the_lowest_p99() -> None:
    points = [point(32, 0, 1_000, 20, True), point(8, 0, 990, 9, True),
              point(128, 5, 1_001, 40, True)]
    choice = choose(points, 50)
    assert choice.chosen is points[1]
    assert "3 points were within 2%" in choice.reason and "lowest p99" in choice.reason


def test_no_point_inside_the_slo_names_the_closest_plainly() -> None:
    points = [point(8, 0, 100, 70, False, "p99 over the SLO"), point(32, 0, 0, None, False),
              point(32, 5, 150, 60, False, "p99 over the SLO")]
    choice = choose(points, 50)
    assert not choice.ok and choice.chosen is None and choice.closest is points[2]
    assert choice.reason == ("no point meets the SLO (p99 <= 50 ms); the closest is "
                             "maxBatchSize=32 maxWaitMs=5: 150 req/s at p99 60.0 ms "
                             "(p99 over the SLO)")
    assert not choose([], 50).ok and choose([], 50).closest is None


def test_the_reason_says_why_there_is_a_single_wait() -> None:
    asked = build_grid(FOREST, slo_ms=100, max_queue_size=1024, n_waits=1)
    assert asked.waits == (0,) and asked.reason.endswith("wait 0 ms only (one wait asked for)")
    tight = build_grid(FOREST, slo_ms=62, max_queue_size=1024, n_waits=2)
    assert tight.waits == (0,) and "wait 0 ms only (under 2 ms of headroom" in tight.reason
