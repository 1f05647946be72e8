"""The SLO guard's decision over scripted window sequences, on a fake clock.

Each script feeds one window per step to :func:`decide` the way ``tailguard up`` does (remember
the window, decide, apply the decision), with the clock advanced by ``windowSeconds`` per
window; no real time passes.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from tailguard.guard.observe import Observation
from tailguard.guard.policy import (
    Action,
    Decision,
    GuardSpec,
    History,
    applied,
    decide,
    effective_traffic,
    remember,
    rolled_forward,
)

SPEC = GuardSpec(p99_latency_ms=50, window_seconds=10, breach_windows=3, recover_windows=6,
                 min_samples=50, max_error_rate=0.01, target_queue_depth=8, automatic=True,
                 traffic="primary", primary="builtin://digits/random-forest@1", max_replicas=1)


def window(role: str, end_s: float, *, admitted: int = 500, slow: int = 0, errors: int = 0,
           timeouts: int = 0, deadline_refused: int = 0, queue_full: int = 0,
           queue_depth: float = 0.5, replicas: int = 1, calls: int = 0, slow_calls: int = 0,
           model_ms: float | None = None, excluded: dict[str, int] | None = None,
           small_calls: int = 0, small_calls_over_slo: int = 0) -> Observation:
    p99 = None if not admitted else (80.0 if slow > admitted * 0.01 else 20.0)
    return Observation(role=role, end_s=end_s, window_s=10.0, admitted=admitted, slow=slow,
                       errors=errors, timeouts=timeouts, deadline_refused=deadline_refused,
                       queue_full=queue_full, refused_total=deadline_refused + queue_full,
                       queue_depth=queue_depth, p99_ms=p99, replicas=replicas, calls=calls,
                       slow_calls=slow_calls, model_ms=model_ms, excluded=excluded or {},
                       small_calls=small_calls, small_calls_over_slo=small_calls_over_slo)


GOOD: dict[str, Any] = {"admitted": 500, "slow": 2}                 # 0.4% slower than the SLO
SLOW: dict[str, Any] = {"admitted": 300, "slow": 290, "queue_depth": 2.0}   # a slow model, low queue
IDLE: dict[str, Any] = {"admitted": 3}
OVERLOAD: dict[str, Any] = {"admitted": 4000, "slow": 3000, "queue_depth": 60.0,
                            "deadline_refused": 500, "queue_full": 2000}
ERRORS: dict[str, Any] = {"admitted": 400, "errors": 40}
DEADLINE: dict[str, Any] = {"admitted": 10, "slow": 10, "timeouts": 10, "errors": 10,
                            "deadline_refused": 190, "queue_depth": 0.1}


class Script:
    """Feeds windows to the guard on a fake clock and applies its decisions."""

    def __init__(self, spec: GuardSpec = SPEC) -> None:
        self.spec = spec
        self.history = History()
        self.now_s = 1000.0
        self.decisions: list[Decision] = []

    def step(self, **kw: Any) -> Decision:
        self.now_s += self.spec.window_seconds
        role = effective_traffic(self.spec, self.history)
        self.history = remember(self.spec, self.history, window(role, self.now_s, **kw))
        decision = decide(self.spec, self.history, self.now_s)
        self.history = applied(self.spec, self.history, decision, self.now_s)
        self.decisions.append(decision)
        return decision

    def steps(self, n: int, **kw: Any) -> list[Decision]:
        return [self.step(**kw) for _ in range(n)]

    def roll_forward(self) -> None:
        self.history = rolled_forward(self.history, self.now_s)

    @property
    def actions(self) -> list[Action]:
        return [d.action for d in self.decisions]


def test_steady_good_traffic_is_ok_and_met() -> None:
    run = Script()
    decisions = run.steps(20, **GOOD)
    assert all(d.action is Action.NOTHING and d.state == "ok" for d in decisions)
    assert decisions[-1].slo_status == "True" and decisions[-1].slo_reason == "SLOMet"
    assert decisions[-1].label == "ok" and "p99=20ms <= 50ms" in decisions[-1].reason


def test_idle_is_unknown_never_a_breach() -> None:
    run = Script()
    for d in run.steps(10, **IDLE) + run.steps(5, admitted=0):
        assert d.action is Action.NOTHING and d.state == "idle" and d.label == "idle"
        assert (d.slo_status, d.slo_reason) == ("Unknown", "InsufficientData")


def test_idle_windows_between_breaches_end_the_streak() -> None:
    run = Script()
    run.steps(2, **SLOW)
    run.step(**IDLE)
    assert [d.label for d in run.steps(2, **SLOW)] == ["breach 1/3", "breach 2/3"]
    assert Action.ROLL_BACK not in run.actions


def test_stalled_windows_between_breaches_neither_count_nor_end_the_streak() -> None:
    """A slow primary busy with a client's large admitted request finishes nothing for a
    window or two while its queue stays deep: that is not idleness, and must not save it."""
    run = Script()
    run.step(**SLOW)
    stalled = run.step(admitted=2, queue_depth=40.0)
    assert stalled.action is Action.NOTHING and stalled.label == "breach 1/3", stalled.reason
    assert (stalled.slo_status, stalled.slo_reason) == ("Unknown", "InsufficientData")
    assert "stalled" in stalled.reason and "40.0 rows/replica waited" in stalled.reason
    run.step(admitted=0, queue_depth=40.0)
    assert run.step(**SLOW).label == "breach 2/3"
    assert run.step(**SLOW).action is Action.ROLL_BACK


def test_a_stall_with_no_breach_before_it_is_unknown_and_no_breach() -> None:
    run = Script()
    run.step(**GOOD)
    d = run.step(admitted=1, queue_depth=12.0)
    assert d.action is Action.NOTHING and d.state == "idle" and "stalled" in d.reason
    assert [x.label for x in run.steps(2, **SLOW)] == ["breach 1/3", "breach 2/3"]


def test_a_stall_longer_than_the_kept_history_hides_the_breaches_before_it() -> None:
    """History keeps ``2 x breachWindows`` windows: a longer stall pushes the earlier breaches
    out, and the streak starts again (the guard errs toward no rollback)."""
    run = Script()
    run.steps(2, **SLOW)
    stalls = run.steps(2 * SPEC.breach_windows, admitted=0, queue_depth=20.0)
    assert [d.label for d in stalls[:-2]] == ["breach 2/3"] * (len(stalls) - 2)
    assert stalls[-2].label == "breach 1/3"  # the first breach is out of the history
    assert stalls[-1].label == "idle", stalls[-1].reason  # and the second
    assert [d.label for d in run.steps(2, **SLOW)] == ["breach 1/3", "breach 2/3"]
    assert Action.ROLL_BACK not in run.actions


@pytest.mark.parametrize("queue_depth, stalled", [(0.99, False), (1.0, True)])
def test_a_window_is_stalled_from_one_waiting_row_per_replica(queue_depth: float,
                                                             stalled: bool) -> None:
    run = Script()
    run.step(**SLOW)
    d = run.step(admitted=2, queue_depth=queue_depth)
    assert ("stalled" in d.reason) is stalled, d.reason
    assert d.label == ("breach 1/3" if stalled else "idle")
    assert run.step(**SLOW).label == ("breach 2/3" if stalled else "breach 1/3")


def test_an_overload_window_before_a_stall_still_ends_the_streak() -> None:
    """Only stalled windows are passed over: an overload window before one ends the streak."""
    run = Script()
    run.steps(2, **SLOW)
    assert run.step(**OVERLOAD).state == "overload"
    run.step(admitted=0, queue_depth=30.0)
    assert [d.label for d in run.steps(2, **SLOW)] == ["breach 1/3", "breach 2/3"]
    assert Action.ROLL_BACK not in run.actions


@pytest.mark.parametrize("max_replicas, replicas, wording", [
    (5, 2, "scaling's job"), (1, 1, "shedding with 429 is the answer on one machine"),
    (5, 5, "at maxReplicas=5")])
def test_overload_is_not_a_broken_model(max_replicas: int, replicas: int, wording: str) -> None:
    run = Script(replace(SPEC, max_replicas=max_replicas))
    decisions = run.steps(12, **OVERLOAD, replicas=replicas)
    assert all(d.action is Action.OVERLOAD and d.state == "overload" for d in decisions)
    last = decisions[-1]
    assert (last.slo_status, last.slo_reason) == ("False", "Overloaded")
    assert wording in last.reason and "queue 60.0 rows/replica > targetQueueDepth 8" in last.reason


def test_refusals_never_make_a_window_overload() -> None:
    """A client sending requests of maxQueueSize rows is refused (429 queue_full) whenever
    anything is queued; those refusals must neither explain away a slow model's breach nor
    make a healthy window look overloaded. Overload is judged from the admitted work."""
    run = Script()
    d = run.step(admitted=300, slow=100, queue_depth=3.0, queue_full=5000)
    assert d.action is Action.NOTHING and d.label == "breach 1/3", d.reason
    healthy = Script().step(**GOOD, queue_full=5000)
    assert healthy.action is Action.NOTHING and healthy.state == "ok", healthy.reason


def test_a_broken_model_is_rolled_back_beside_refused_oversized_requests() -> None:
    run = Script()
    decisions = run.steps(3, **SLOW, queue_full=4000)
    assert [d.label for d in decisions] == ["breach 1/3", "breach 2/3", "rolled back"]


def test_rows_the_model_rejected_are_never_judged_however_many() -> None:
    """422s for rows the model rejected are the clients' own, alone on a quiet service or
    beside good traffic: a model that rejects everything reaches the guard as 500s (the
    runtime's reference row, tests/unit/runtime/test_rows.py), judged as errors."""
    attacked = Script()
    decisions = attacked.steps(10, **GOOD, excluded={"input_rejected": 25})
    assert all(d.action is Action.NOTHING and d.state == "ok" for d in decisions)
    quiet = Script()
    decisions = quiet.steps(10, admitted=5, excluded={"input_rejected": 495})
    assert all(d.action is Action.NOTHING and d.slo_status == "Unknown" for d in decisions)
    broken = Script()
    decisions = broken.steps(3, admitted=500, errors=495)
    assert [d.label for d in decisions] == ["breach 1/3", "breach 2/3", "rolled back"]
    assert decisions[-1].breach == "errors"


def test_a_slow_model_at_a_low_queue_is_rolled_back_after_exactly_breach_windows() -> None:
    run = Script()
    run.steps(3, **GOOD)
    decisions = run.steps(3, **SLOW)
    assert [d.label for d in decisions] == ["breach 1/3", "breach 2/3", "rolled back"]
    assert decisions[-1].breaches == 3
    assert [d.action for d in decisions] == [Action.NOTHING, Action.NOTHING, Action.ROLL_BACK]
    last = decisions[-1]
    assert last.breach == "latency" and (last.slo_status, last.slo_reason) == ("False", "LatencyBreached")
    assert "p99=80ms > 50ms: 96.7% of 300 requests slower than the SLO, 3 windows in a row" in last.reason
    assert effective_traffic(SPEC, run.history) == "fallback"


def test_one_spike_does_nothing() -> None:
    run = Script()
    run.steps(3, **GOOD)
    assert run.step(**SLOW).label == "breach 1/3"
    run.steps(10, **GOOD)
    run.step(**SLOW)
    run.step(**GOOD)
    assert Action.ROLL_BACK not in run.actions and run.decisions[-1].state == "ok"


def test_exactly_one_percent_slower_is_still_met() -> None:
    run = Script()
    assert run.step(admitted=1000, slow=10).state == "ok"
    assert run.step(admitted=1000, slow=11).state == "breach"


def test_errors_roll_back() -> None:
    run = Script()
    decisions = run.steps(3, **ERRORS)
    assert decisions[-1].action is Action.ROLL_BACK and decisions[-1].breach == "errors"
    assert decisions[-1].slo_reason == "ErrorsBreached"
    assert "error rate 10.0% > maxErrorRate 0.01 (40 of 400)" in decisions[-1].reason


def test_nearly_everything_refused_for_its_deadline_is_a_breach_not_unknown() -> None:
    """Only 10 admitted requests (fewer than minSamples) because 190 more were refused for
    their deadline: a model that answers nothing in time must not look idle."""
    run = Script()
    first = run.step(**DEADLINE)
    assert first.state == "breach" and first.breach == "deadline"
    assert (first.slo_status, first.slo_reason) == ("False", "DeadlineBreached")
    assert "200 of 200 requests refused for their deadline or timed out" in first.reason
    run.steps(2, **DEADLINE)
    assert run.actions[-1] is Action.ROLL_BACK


def test_after_a_rollback_continued_breach_takes_no_second_action() -> None:
    run = Script()
    run.steps(3, **SLOW)
    assert run.actions == [Action.NOTHING, Action.NOTHING, Action.ROLL_BACK]
    later = run.steps(30, **SLOW)  # now the fallback's windows, and they breach too
    assert all(d.action is Action.NOTHING and d.state == "rolledBack" for d in later)
    assert later[-1].label == "rolled back" and "until a person rolls forward" in later[-1].reason
    assert effective_traffic(SPEC, run.history) == "fallback"


def test_roll_forward_re_arms_and_a_new_breach_acts_again() -> None:
    run = Script()
    run.steps(3, **SLOW)
    run.steps(10, **GOOD)  # on the fallback, longer than the cooldown (6 windows)
    run.roll_forward()
    assert effective_traffic(SPEC, run.history) == "primary"
    again = run.steps(3, **SLOW)
    assert [d.action for d in again] == [Action.NOTHING, Action.NOTHING, Action.ROLL_BACK]
    assert run.actions.count(Action.ROLL_BACK) == 2


def test_one_action_per_cooldown_even_after_a_roll_forward() -> None:
    run = Script()
    run.steps(3, **SLOW)
    run.roll_forward()  # at once: the cooldown (6 windows from the rollback) still holds
    decisions = run.steps(6, **SLOW)
    assert [d.action for d in decisions].index(Action.ROLL_BACK) == 5
    assert "cooldown" in decisions[2].reason


def test_windows_before_a_roll_forward_never_count() -> None:
    run = Script(replace(SPEC, recover_windows=3))
    run.steps(2, **SLOW)
    run.roll_forward()  # a person acted while the primary was breaching
    assert [d.label for d in run.steps(2, **SLOW)] == ["breach 1/3", "breach 2/3"]


def test_a_new_primary_model_re_arms_the_guard() -> None:
    run = Script()
    run.steps(3, **SLOW)
    assert effective_traffic(SPEC, run.history) == "fallback"
    run.spec = replace(SPEC, primary="builtin://digits/random-forest?trees=20@2")
    assert effective_traffic(run.spec, run.history) == "primary"
    assert run.step(**GOOD).state == "ok"


def test_automatic_false_reports_and_never_acts() -> None:
    run = Script(replace(SPEC, automatic=False))
    decisions = run.steps(10, **SLOW) + run.steps(5, **ERRORS)
    assert Action.ROLL_BACK not in run.actions
    assert "rollback.automatic is false: reporting only" in decisions[-1].reason
    assert decisions[-1].slo_status == "False" and decisions[-1].label == "breach 3/3"


def test_spec_traffic_fallback_is_manual_and_never_acts() -> None:
    run = Script(replace(SPEC, traffic="fallback"))
    decisions = run.steps(5, **SLOW)
    assert all(d.state == "manual" and d.action is Action.NOTHING for d in decisions)


def test_a_stale_window_is_not_judged() -> None:
    history = History((window("primary", 100.0, **SLOW),) * 3)
    assert decide(SPEC, history, now_s=100.0).action is Action.ROLL_BACK
    stale = decide(SPEC, history, now_s=100.0 + 2 * 10 + 1)
    assert stale.action is Action.NOTHING and stale.state == "idle"
    assert stale.slo_status == "Unknown"


def test_no_windows_at_all_is_idle() -> None:
    d = decide(SPEC, History(), 0.0)
    assert d.state == "idle" and d.action is Action.NOTHING and d.slo_reason == "InsufficientData"


def test_a_fast_model_at_capacity_is_overload_by_queueing() -> None:
    """At capacity (or with the process itself saturated) requests wait before the batcher's
    queue: the queue depth stays under target while p99 breaks. Every model call took less
    than half the SLO, so the slow requests waited: more capacity, not another model."""
    run = Script()
    decisions = run.steps(10, admitted=600, slow=60, queue_depth=1.5, calls=300, slow_calls=7,
                          model_ms=17.0)  # 2.3% of calls slow (a busy host), 10% of requests
    assert all(d.action is Action.OVERLOAD for d in decisions)
    assert "queueing: 7 of 300 model calls took over 25ms (half the SLO; mean 17ms)" in \
        decisions[-1].reason
    # slow calls as common as slow requests: the model's
    assert Script().steps(3, admitted=600, slow=60, calls=300, slow_calls=30)[-1].action \
        is Action.ROLL_BACK
    # the same breach with slow calls is the model's
    slow = Script().steps(3, admitted=300, slow=290, queue_depth=2.0, calls=30, slow_calls=30,
                          model_ms=120.0)
    assert slow[-1].action is Action.ROLL_BACK


def test_errors_are_never_explained_by_fast_calls() -> None:
    run = Script()
    run.steps(3, admitted=400, errors=40, calls=200, slow_calls=0, model_ms=5.0)
    assert run.actions[-1] is Action.ROLL_BACK


def test_a_deep_queue_does_not_excuse_a_model_slow_on_half_full_batches() -> None:
    """A client's admitted requests of ``maxQueueSize`` rows keep a broken primary's queue
    deep; its half-full batches are slow too, so the queue explains nothing."""
    broken = Script().steps(3, admitted=120, slow=120, queue_depth=90.0, calls=10,
                            slow_calls=10, small_calls=4, small_calls_over_slo=4, model_ms=300.0)
    assert [d.label for d in broken] == ["breach 1/3", "breach 2/3", "rolled back"]
    # overloaded but sound: the slow calls are the full ones, the half-full ones are fast
    loaded = Script().steps(10, admitted=4000, slow=3000, queue_depth=60.0, calls=200,
                            slow_calls=150, small_calls=10, small_calls_over_slo=1, model_ms=30.0)
    assert all(d.action is Action.OVERLOAD for d in loaded)
    # no half-full batches at all: the queue explains the breach
    full = Script().steps(10, admitted=4000, slow=3000, queue_depth=60.0, calls=200,
                          slow_calls=200, model_ms=30.0)
    assert all(d.action is Action.OVERLOAD for d in full)
    # no half-full batches, but the mean call alone takes longer than the SLO: no queue
    # explains that (a client's large requests keep a broken primary's batches full)
    stuck = Script().steps(3, admitted=120, slow=120, queue_depth=90.0, calls=10,
                           slow_calls=10, model_ms=300.0)
    assert [d.label for d in stuck] == ["breach 1/3", "breach 2/3", "rolled back"]
    # but where half-full calls are there to tell, they decide: fast ones mean overload, even
    # when the full batches take longer than the SLO
    spike = Script().steps(10, admitted=4000, slow=3000, queue_depth=60.0, calls=200,
                           slow_calls=150, small_calls=10, small_calls_over_slo=1, model_ms=60.0)
    assert all(d.action is Action.OVERLOAD for d in spike)
