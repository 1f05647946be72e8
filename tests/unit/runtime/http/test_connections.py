"""``connections.EventTally``: connections closed by the bounds are logged as one tally line
at most every ``every_s`` seconds, the first at once."""

from __future__ import annotations

import pytest

from tailguard_runtime.http.connections import EventTally


def test_the_first_event_is_reported_at_once_and_the_rest_in_one_line_per_interval() -> None:
    tally = EventTally(every_s=10.0)
    assert tally.add("evicted", 100.0) == ({"evicted": 1}, 0.0)
    for i in range(500):
        assert tally.add("evicted" if i % 5 else "head_timeout", 100.5 + i * 0.01) is None
    report = tally.add("refused", 110.0)
    assert report is not None
    counts, seconds = report
    assert counts == {"evicted": 400, "head_timeout": 100, "refused": 1}
    assert seconds == 9.5  # from the first event after the last report
    assert tally.add("evicted", 119.9) is None
    assert tally.add("evicted", 120.0) == ({"evicted": 2}, pytest.approx(0.1))


def test_a_quiet_spell_reports_the_next_event_at_once() -> None:
    tally = EventTally(every_s=10.0)
    tally.add("send_stall", 0.0)
    assert tally.add("send_stall", 3600.0) == ({"send_stall": 1}, 0.0)


def test_a_tally_left_open_when_events_stop_is_reported_when_due() -> None:
    tally = EventTally(every_s=10.0)
    assert tally.due(0.0) is None  # nothing counted yet
    tally.add("evicted", 1.0)
    tally.add("evicted", 2.0)
    tally.add("refused", 3.0)
    assert tally.due(10.9) is None
    assert tally.due(11.0) == ({"evicted": 1, "refused": 1}, 9.0)
    assert tally.due(30.0) is None
