"""Admission arithmetic: capacity in rows, deadlines against the drain estimate."""

from __future__ import annotations

import pytest

from tailguard_runtime.admission import DrainEstimate, RefusalPacer, admit
from tailguard_runtime.errors import Overloaded, PayloadTooLarge


def _admit(**overrides: object) -> None:
    args: dict[str, object] = dict(n_rows=1, queued_rows=0, max_queue_size=8, max_batch_size=4,
                                   time_left_s=1.0, estimate=DrainEstimate(), busy=False)
    args.update(overrides)
    admit(**args)  # type: ignore[arg-type]


def test_rows_beyond_the_queue_can_never_fit() -> None:
    with pytest.raises(PayloadTooLarge, match="at most 8 rows"):
        _admit(n_rows=9)


def test_queue_full_is_measured_in_rows() -> None:
    _admit(n_rows=3, queued_rows=5)
    with pytest.raises(Overloaded) as info:
        _admit(n_rows=4, queued_rows=5)
    assert info.value.reason == "queue_full" and info.value.retry_after_s == 1


def test_no_deadline_refusal_without_evidence() -> None:
    _admit(queued_rows=7, time_left_s=1e-6)


def test_deadline_that_the_queue_cannot_meet_is_refused_with_its_drain_time() -> None:
    estimate = DrainEstimate()
    estimate.record(0.5)  # one batch takes 0.5 s
    # 7 queued + 1 = 2 batches of 4, plus the one computing: 1.5 s > 1.0 s left
    with pytest.raises(Overloaded) as info:
        _admit(queued_rows=7, estimate=estimate, busy=True, time_left_s=1.0)
    assert info.value.reason == "deadline"
    assert info.value.retry_after_s == 2  # ceil(2 batches * 0.5 s) for the queue to drain
    _admit(queued_rows=7, estimate=estimate, busy=True, time_left_s=2.0)


def test_estimate_follows_recent_batches() -> None:
    estimate = DrainEstimate()
    estimate.record(1.0)
    for _ in range(40):
        estimate.record(0.01)
    assert estimate.batch_seconds == pytest.approx(0.01, rel=0.1)


def test_an_idle_model_admits_whatever_a_stale_estimate_says() -> None:
    """One slow batch (a cold start, a GC pause) once made the estimate exceed the deadline;
    with nothing queued and the model idle no batch ran to correct it, and every request was
    refused for good. With nothing ahead, the request must run."""
    estimate = DrainEstimate()
    estimate.record(1.2)
    _admit(queued_rows=0, estimate=estimate, busy=False, time_left_s=0.5)
    with pytest.raises(Overloaded):
        _admit(queued_rows=0, estimate=estimate, busy=True, time_left_s=0.5)


def test_refusals_within_the_budget_are_answered_at_once_and_the_rest_late() -> None:
    pacer = RefusalPacer(rate_per_s=10.0, burst=3.0, delay_s=0.25)
    assert [pacer.delay(100.0) for _ in range(4)] == [0.0, 0.0, 0.0, 0.25]
    assert pacer.delay(100.05) == 0.25  # half a token refilled: not enough
    # 1.5 tokens more since the last refusal: two in the bucket, then none
    assert [pacer.delay(100.2) for _ in range(3)] == [0.0, 0.0, 0.25]


def test_an_idle_bucket_refills_to_its_burst_and_no_further() -> None:
    pacer = RefusalPacer(rate_per_s=10.0, burst=3.0, delay_s=0.25)
    for _ in range(3):
        pacer.delay(0.0)
    later = [pacer.delay(3600.0) for _ in range(4)]
    assert later == [0.0, 0.0, 0.0, 0.25]


def test_a_client_refused_in_a_loop_gets_about_one_answer_per_delay_past_the_budget() -> None:
    """Simulated back-to-back refusals on one connection: answers come no faster than the
    budget plus one per delay."""
    pacer = RefusalPacer(rate_per_s=50.0, burst=50.0, delay_s=0.25)
    now, answers = 0.0, 0
    while now < 10.0:
        now += 0.0004 + pacer.delay(now)  # 0.4 ms to refuse, then the pacer's wait
        answers += 1
    assert answers <= 50 + 50 * 10 + 10 / 0.25
