"""Bisection of failing batches (``rows.predict_isolating``) with a real counting model."""

from __future__ import annotations

import numpy as np

from tailguard_runtime.rows import Unisolated, isolation_budget, predict_isolating


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
