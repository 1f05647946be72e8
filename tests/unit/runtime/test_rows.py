"""Bisection of failing batches (``rows.predict_isolating``) with a real counting model."""

from __future__ import annotations

import numpy as np

from tailguard_runtime.rows import (
    ReferenceRow,
    Unisolated,
    isolation_budget,
    predict_isolating,
    rejected_rows,
)


class CountingModel:
    """Sums each row; raises ``ValueError`` on any row whose first feature is negative."""

    def __init__(self) -> None:
        self.calls = 0

    def __call__(self, x: np.ndarray) -> tuple[np.ndarray, ...]:
        self.calls += 1
        if (x[:, 0] < 0).any():
            raise ValueError("negative feature")
        return (x.sum(axis=1),)


def test_bisection_splits_only_between_requests() -> None:
    """A request fails whole, so bisecting inside it is wasted model time: a 64-row batch of
    two 32-row requests with one bad row costs 3 calls, not the 13 a row-wise search takes."""
    model = CountingModel()
    x = np.ones((64, 2))
    x[40, 0] = -1
    pieces = predict_isolating(model, x, cuts=[32], max_extra_calls=100)
    assert [(a, b, isinstance(out, ValueError)) for a, b, out in pieces] == [
        (0, 32, False), (32, 64, True)]
    assert model.calls == 3


def test_one_failing_request_among_a_full_batch_is_found_within_the_budget() -> None:
    model = CountingModel()
    x = np.ones((64, 2))
    x[17, 0] = -1
    budget = isolation_budget(64)
    pieces = predict_isolating(model, x, cuts=list(range(1, 64)), max_extra_calls=budget)
    failed = [(a, b) for a, b, out in pieces if isinstance(out, BaseException)]
    assert failed == [(17, 18)] and not isinstance(pieces[0][2], Unisolated)
    assert model.calls <= 1 + budget
    assert pieces[0][0] == 0 and pieces[-1][1] == 64
    assert all(p[1] == q[0] for p, q in zip(pieces, pieces[1:]))


def test_a_batch_of_failing_requests_costs_at_most_the_budget() -> None:
    """Every other request failing once cost 2n-1 model calls per batch (127 for 64
    requests); past the budget the groups still failing are reported unisolated."""
    model = CountingModel()
    x = np.ones((64, 2))
    x[::2, 0] = -1
    budget = isolation_budget(64)
    pieces = predict_isolating(model, x, cuts=list(range(1, 64)), max_extra_calls=budget)
    assert model.calls <= 1 + budget
    assert any(isinstance(out, Unisolated) for _, _, out in pieces)
    good = [(a, b) for a, b, out in pieces if not isinstance(out, BaseException)]
    assert all((x[a:b, 0] >= 0).all() for a, b in good)  # nothing sound was reported failing
    assert pieces[0][0] == 0 and pieces[-1][1] == 64
    assert all(p[1] == q[0] for p, q in zip(pieces, pieces[1:]))


class _Model:
    """Rejects (``ValueError``) rows whose first value is negative; ``broken``: every row.
    Counts its calls."""

    def __init__(self) -> None:
        self.broken = False
        self.calls: list[np.ndarray] = []

    def __call__(self, x: np.ndarray) -> tuple[np.ndarray, ...]:
        self.calls.append(x.copy())
        if self.broken or (x[:, 0] < 0).any():
            raise ValueError("cannot take this row")
        return (x.sum(axis=1),)


def test_a_model_that_rejects_some_rows_is_sound_and_one_that_rejects_all_is_not() -> None:
    model = _Model()
    reference = ReferenceRow(model, min_interval_s=0.25)
    assert reference.sound(3, now=10.0)  # nothing answered yet: a row of zeros
    np.testing.assert_array_equal(model.calls[-1], np.zeros((1, 3)))
    x = np.array([[-1.0, 0, 0], [5.0, 6, 7], [8.0, 9, 10]])
    reference.answered(x, predict_isolating(model, x))
    model.broken = True
    assert reference.sound(3, now=10.1)  # within the interval: the last verdict, no call
    calls = len(model.calls)
    assert not reference.sound(3, now=10.5)
    assert len(model.calls) == calls + 1
    np.testing.assert_array_equal(model.calls[-1], [[5.0, 6, 7]])  # the first row it answered
    assert not reference.sound(3, now=20.0, check=False)  # the last verdict, no call
    assert len(model.calls) == calls + 1
    model.broken = False
    assert reference.sound(3, now=20.0)


def test_rejected_rows_are_told_from_other_failures() -> None:
    model = _Model()
    x = np.array([[1.0, 0, 0], [-1.0, 0, 0]])
    assert rejected_rows(predict_isolating(model, x))
    assert not rejected_rows(predict_isolating(model, x[:1]))

    def crash(_: np.ndarray) -> tuple[np.ndarray, ...]:
        raise RuntimeError("a bug")

    assert not rejected_rows(predict_isolating(crash, x))
    unisolated = [(0, 2, Unisolated(ValueError("x"), 2, 0))]
    assert rejected_rows(unisolated)
