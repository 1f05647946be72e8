"""``pool``: the state the connection bounds share. ``EventTally``: connections closed by the
bounds are logged as one tally line at most every ``every_s`` seconds, the first at once.
``ConnectionPool``: which idle connection the cap evicts, and what is counted, once."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pytest
from prometheus_client import REGISTRY

from tailguard_runtime import errors
from tailguard_runtime.http.pool import ConnectionPool, EventTally
from tailguard_runtime.settings import ConnectionSettings


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


@dataclass(eq=False)
class Transport:
    closing: bool = False

    def is_closing(self) -> bool:
        return self.closing


@dataclass(eq=False)
class Conn:
    """What the pool reads of a connection (a stand-in for the protocol instance)."""

    _served: bool = False
    busy: bool = False
    transport: Transport = field(default_factory=Transport)
    _closed_for: str | None = None
    _address: str | None = None

    def _idle(self) -> bool:
        return not self.busy


def test_the_cap_evicts_the_longest_idle_that_never_served_first() -> None:
    pool = ConnectionPool(ConnectionSettings(max_connections=4), model="pool-test")
    served_long_ago, fresh_busy, fresh_later, newcomer = (Conn(_served=True), Conn(busy=True),
                                                          Conn(), Conn())
    for conn in (served_long_ago, fresh_busy, fresh_later, newcomer):
        pool.mark_idle(conn)  # type: ignore[arg-type]
    assert pool.victim(newcomer) is fresh_later  # type: ignore[arg-type]
    assert pool.victim(newcomer) is served_long_ago  # type: ignore[arg-type]
    assert pool.victim(newcomer) is None  # type: ignore[arg-type]


def test_a_connection_marked_idle_again_goes_to_the_back() -> None:
    pool = ConnectionPool(ConnectionSettings(), model="pool-test")
    first, second = Conn(), Conn()
    pool.mark_idle(first)  # type: ignore[arg-type]
    pool.mark_idle(second)  # type: ignore[arg-type]
    pool.mark_idle(first)  # type: ignore[arg-type]
    assert list(pool.fresh) == [second, first]
    first._served = True
    pool.mark_idle(first)  # type: ignore[arg-type]
    assert list(pool.fresh) == [second] and list(pool.served) == [first]
    pool.unmark_idle(first)  # type: ignore[arg-type]
    assert not pool.served


def closed_count(model: str, reason: str) -> float:
    return REGISTRY.get_sample_value("tailguard_connections_closed_total",
                                     {"model": model, "reason": reason}) or 0.0


def test_a_connection_is_counted_once_under_its_first_reason() -> None:
    pool = ConnectionPool(ConnectionSettings(), model="pool-count")
    conn = Conn()
    pool.closed(conn, "head_timeout", 1.0)  # type: ignore[arg-type]
    pool.closed(conn, "send_stall", 2.0)  # type: ignore[arg-type]
    assert conn._closed_for == "head_timeout"
    assert closed_count("pool-count", "head_timeout") == 1
    assert closed_count("pool-count", "send_stall") == 0


def test_refusals_are_counted_but_a_body_past_its_deadline_is_the_apps() -> None:
    counted: list[Any] = []
    pool = ConnectionPool(ConnectionSettings(request_head_timeout_s=3), model="pool-refusals",
                          count_refusal=counted.append)
    for exc in (pool.head_late, pool.body_late, pool.full, errors.MalformedHttp("bad")):
        pool.refused(exc)
    assert [exc.reason for exc in counted] == ["slow_head", "connection_limit", "malformed_http"]
    assert pool.head_late.message == "request head not complete within 3 s"
    ConnectionPool(ConnectionSettings(), model="pool-refusals").refused(pool.full)  # no counter


def test_an_address_past_its_share_makes_room_among_its_own_idle_connections() -> None:
    pool = ConnectionPool(ConnectionSettings(max_connections=40, max_connections_per_address=2),
                          model="pool-test")
    assert pool.max_per_address == 2
    theirs_idle, theirs_busy, mine = (Conn(_address="10.0.0.2"), Conn(_address="10.0.0.2"),
                                      Conn(_address="10.0.0.1"))
    for conn in (theirs_idle, theirs_busy, mine):
        assert pool.joined(conn._address)  # type: ignore[arg-type]
        pool.mark_idle(conn)
    theirs_busy.busy = True
    pool.unmark_idle(theirs_busy)
    newcomer = Conn(_address="10.0.0.2")
    assert not pool.joined("10.0.0.2")  # a third from 10.0.0.2: past its share of 2
    assert pool.victim_from("10.0.0.2", newcomer) is theirs_idle  # never another address's
    assert pool.victim_from("10.0.0.2", newcomer) is None  # the busy one stays
    for conn in (theirs_idle, theirs_busy, newcomer):
        pool.left("10.0.0.2")
    assert pool.by_address == {"10.0.0.1": 1}
    assert ConnectionPool(ConnectionSettings(max_connections=400), model="p").max_per_address == 100
