"""The raw model table: the timing arithmetic on a fake clock, and a real model's table."""

from __future__ import annotations

import numpy as np
import pytest

from tailguard.tune.rawtable import BATCH_SIZES, RawRow, batch_of, markdown, raw_table, time_calls
from tailguard_runtime.models import load_dataset, load_model


class FakeClock:
    """A clock that each model call advances by the next of ``durations`` seconds."""

    def __init__(self, durations: list[float]) -> None:
        self.now = 100.0
        self.durations = durations
        self.calls = 0

    def __call__(self) -> float:
        return self.now

    def call(self, x: np.ndarray) -> None:
        self.now += self.durations[self.calls % len(self.durations)]
        self.calls += 1


def test_median_p90_and_rows_per_second_come_from_the_timed_calls_only() -> None:
    # two warm-up calls of 1 s each are not timed; then 1, 2, ..., 10 ms
    clock = FakeClock([1.0, 1.0] + [k / 1000 for k in range(1, 11)])
    row = time_calls(clock.call, np.zeros((8, 3)), seconds=0.0, min_calls=10, clock=clock)
    assert row.calls == 10
    assert row.median_ms == pytest.approx(5.5)
    assert row.p90_ms == pytest.approx(9.0)  # nearest rank: the 9th of 10
    assert row.rows_per_s == pytest.approx(8 / 0.0055)
    assert clock.calls == 12


def test_calls_stop_when_the_time_is_spent() -> None:
    clock = FakeClock([0.25])
    row = time_calls(clock.call, np.zeros((1, 3)), seconds=1.0, min_calls=1, warmup_calls=0,
                     clock=clock)
    assert row.calls == 4


def test_batch_of_wraps_around_the_rows_it_is_given() -> None:
    rows = np.arange(6, dtype=np.float64).reshape(3, 2)
    x = batch_of(rows, 5)
    assert x.shape == (5, 2) and x.flags["C_CONTIGUOUS"]
    assert x[:, 0].tolist() == [0, 2, 4, 0, 2]
    with pytest.raises(ValueError, match="n_rows, n_features"):
        batch_of(np.zeros((0, 2)), 4)


def test_a_real_model_pays_less_per_row_in_larger_batches() -> None:
    predictor = load_model("builtin://iris/logistic-regression")
    rows, _ = load_dataset("iris")
    table = raw_table(predictor.run, rows, seconds=0.05)
    assert [r.batch for r in table] == list(BATCH_SIZES)
    assert all(r.calls >= 5 and 0 < r.median_ms <= r.p90_ms for r in table)
    # a vectorised model: 512 rows in one call cost far less than 512 calls of one row
    assert table[-1].rows_per_s > 20 * table[0].rows_per_s
    text = markdown(table)
    assert text.splitlines()[0].startswith("| batch (rows) |")
    assert len(text.splitlines()) == 2 + len(BATCH_SIZES)


def test_rows_round_trip_as_dicts() -> None:
    row = RawRow(8, 5, 1.5, 2.0, 5333.3)
    assert row.as_dict() == {"batch": 8, "calls": 5, "median_ms": 1.5, "p90_ms": 2.0,
                             "rows_per_s": 5333.3}
