"""kopf's peering rule, as the resync applies it: one writer at a time."""

from __future__ import annotations

import datetime

from tailguard.operator.peering import active_peer

NOW = datetime.datetime(2026, 12, 3, 12, 0, 0, tzinfo=datetime.timezone.utc)


def record(priority: int, seconds_ago: float, lifetime: int = 60) -> dict[str, object]:
    seen = NOW - datetime.timedelta(seconds=seconds_ago)
    return {"priority": priority, "lifetime": lifetime, "lastseen": seen.isoformat()}


def test_the_highest_live_priority_is_the_one_writer() -> None:
    status = {"op-a": record(500, 5), "op-b": record(100, 5)}
    assert active_peer(status, 500, NOW)
    assert not active_peer(status, 100, NOW)


def test_a_dead_peer_no_longer_holds_the_others_back() -> None:
    status = {"op-a": record(500, 61), "op-b": record(100, 5)}  # op-a's lifetime has passed
    assert active_peer(status, 100, NOW)
    frozen = {"op-a": record(500, 59), "op-b": record(100, 5)}  # not yet
    assert not active_peer(frozen, 100, NOW)


def test_two_live_peers_of_one_priority_both_pause_as_kopf_does() -> None:
    status = {"op-a": record(300, 5), "op-b": record(300, 5)}
    assert not active_peer(status, 300, NOW)


def test_alone_or_not_yet_listed_is_active_and_no_peering_object_is_not() -> None:
    assert active_peer({"op-a": record(300, 5)}, 300, NOW)
    assert active_peer({}, 300, NOW)  # kopf has not written its first keep-alive yet
    assert not active_peer(None, 300, NOW)  # peering is mandatory: kopf pauses


def test_a_record_without_a_readable_lastseen_counts_as_live() -> None:
    assert not active_peer({"op-a": {"priority": 900, "lastseen": "garbage"}}, 300, NOW)
    assert not active_peer({"op-a": {"priority": 900}}, 300, NOW)
