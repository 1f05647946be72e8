"""The tools' one percentile definition: nearest rank, never interpolated."""

from __future__ import annotations

import numpy as np
import pytest

from tailguard._util.stats import nearest_rank


def test_each_percentile_is_a_value_that_was_measured() -> None:
    values = list(range(1, 11))  # 1..10
    assert nearest_rank(values, 50) == 5  # rank ceil(5.0) = 5
    assert nearest_rank(values, 90) == 9
    assert nearest_rank(values, 99) == 10
    assert nearest_rank(values, 100) == 10
    assert nearest_rank(values, 0.1) == 1
    five = np.array([1.0, 1.5, 2.0, 2.0, 7.0])
    assert nearest_rank(five, 90) == 7.0  # rank ceil(4.5) = 5: the slowest of five
    assert nearest_rank(five, 80) == 2.0  # rank 4 exactly, no rounding up past it


def test_no_values_or_a_q_outside_the_range_is_refused() -> None:
    with pytest.raises(ValueError, match="no values"):
        nearest_rank([], 50)
    for q in (0, -1, 100.5):
        with pytest.raises(ValueError, match="q must be"):
            nearest_rank([1.0], q)
