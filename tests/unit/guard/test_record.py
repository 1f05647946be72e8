"""The guard's state as a cluster stores it: the rollback in status.guard, the roll-forward
annotation, and the traffic intent both the reconcile pass and the guard read from them."""

from __future__ import annotations

import datetime

from tailguard.guard.policy import Action, Decision, History
from tailguard.guard.record import (
    ROLL_FORWARD_ANNOTATION,
    GuardRecord,
    format_time,
    guard_status,
    history_from,
    parse_time,
    roll_forward_request,
    rollback_in_effect,
    status_guard_patch,
    traffic_intent,
)

PRIMARY = "builtin://digits/random-forest@v1"
T0 = datetime.datetime(2026, 12, 5, 17, 0, 0, 250000, tzinfo=datetime.timezone.utc)
ROLLED = {"guard": {"rolledBackAt": "2026-12-05T17:00:00.250Z", "rollbackReason": "p99 high",
                    "rolledBackModel": PRIMARY, "lastActionTime": "2026-12-05T17:00:00.250Z"}}


def annotated(value: str) -> dict[str, str]:
    return {ROLL_FORWARD_ANNOTATION: value}


def test_times_round_trip_in_rfc_3339_with_milliseconds() -> None:
    assert format_time(T0) == "2026-12-05T17:00:00.250Z"
    assert parse_time(format_time(T0)) == T0
    assert parse_time("2026-12-05T17:00:00") == T0.replace(microsecond=0)  # no zone: UTC
    assert parse_time("yesterday") is None and parse_time(None) is None and parse_time(5) is None


def test_a_recorded_rollback_holds_traffic_on_the_fallback_for_its_primary_only() -> None:
    record = GuardRecord.from_status(ROLLED)
    assert record.rolled_back_at == T0 and record.model == PRIMARY
    assert rollback_in_effect(record, PRIMARY, None)
    assert traffic_intent("primary", record, PRIMARY, None) == "fallback"
    # a new primary model re-arms the guard: the rollback no longer applies
    assert not rollback_in_effect(record, "builtin://digits/random-forest@v2", None)
    assert traffic_intent("primary", record, "builtin://x/y@v2", None) == "primary"
    # the person's own intent stands whatever the guard recorded
    assert traffic_intent("fallback", GuardRecord(), PRIMARY, None) == "fallback"
    assert traffic_intent("primary", GuardRecord.from_status({}), PRIMARY, None) == "primary"


def test_a_roll_forward_request_counts_once_and_only_when_newer_than_the_rollback() -> None:
    record = GuardRecord.from_status(ROLLED)
    newer, older = "2026-12-05T17:00:05Z", "2026-12-05T16:59:00Z"
    assert roll_forward_request(annotated(newer), record) == newer
    assert not rollback_in_effect(record, PRIMARY, annotated(newer))
    assert roll_forward_request(annotated(older), record) is None  # older than the rollback
    assert rollback_in_effect(record, PRIMARY, annotated(older))
    assert roll_forward_request(annotated("soon"), record) is None  # not a time
    assert roll_forward_request({}, record) is None
    done = GuardRecord(roll_forward_observed=newer)
    assert roll_forward_request(annotated(newer), done) is None  # already acted on
    # a later rollback is not undone by the request acted on before it
    again = GuardRecord(T0 + datetime.timedelta(minutes=5), "p99", PRIMARY,
                        roll_forward_observed=newer)
    assert rollback_in_effect(again, PRIMARY, annotated(newer))


def test_the_history_places_stored_wall_times_on_the_monotonic_clock() -> None:
    record = GuardRecord.from_status(ROLLED)
    now = T0 + datetime.timedelta(seconds=30)
    history = history_from(record, History(armed_s=3.0), now=now, now_s=1000.0)
    assert history.rollback is not None
    assert history.rollback.at_s == 970.0 and history.rollback.primary == PRIMARY
    assert history.last_action_s == 970.0 and history.armed_s == 3.0
    assert history_from(GuardRecord(), History(), now=now, now_s=5.0).rollback is None


def test_status_guard_drops_a_cleared_rollback_with_nulls() -> None:
    decision = Decision(Action.NOTHING, "ok over 200 requests", "ok", 0, 3, "True", "SLOMet")
    cleared = GuardRecord(last_action_at=T0, roll_forward_observed="2026-12-05T17:00:05Z")
    guard = guard_status(decision, cleared, "2026-12-05T17:01:00.000Z")
    assert guard == {"state": "ok", "breaches": 0, "lastDecision": "Nothing",
                     "lastDecisionReason": "ok over 200 requests",
                     "lastDecisionTime": "2026-12-05T17:01:00.000Z",
                     "lastActionTime": "2026-12-05T17:00:00.250Z",
                     "rollForwardObserved": "2026-12-05T17:00:05Z"}
    patch = status_guard_patch(ROLLED["guard"], guard)
    assert patch["rolledBackAt"] is None and patch["rollbackReason"] is None
    assert patch["rolledBackModel"] is None and patch["state"] == "ok"
    assert status_guard_patch(guard, guard) == guard
