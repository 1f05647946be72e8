"""When the cluster guard writes status: at once on a transition, else rarely, never idle."""

from __future__ import annotations

from tailguard.operator.guarding import MIN_WRITE_INTERVAL_S, write_due


def test_a_transition_is_written_at_once() -> None:
    assert write_due(transition=True, changed=False, last_write_s=99.0, window_s=2, now_s=100.0)


def test_nothing_changed_means_no_write_however_long_ago() -> None:
    assert not write_due(transition=False, changed=False, last_write_s=0.0, window_s=2,
                         now_s=10_000.0)


def test_changing_values_are_written_at_most_once_per_interval() -> None:
    due = [t for t in range(0, 121, 2)
           if write_due(transition=False, changed=True, last_write_s=0.0, window_s=2,
                        now_s=float(t))]
    assert due[0] == MIN_WRITE_INTERVAL_S == 30.0
    # windows longer than 30 s: one write per window at most
    assert not write_due(transition=False, changed=True, last_write_s=0.0, window_s=60,
                         now_s=45.0)
    assert write_due(transition=False, changed=True, last_write_s=0.0, window_s=60, now_s=60.0)
    assert write_due(transition=False, changed=True, last_write_s=None, window_s=2, now_s=1.0)
