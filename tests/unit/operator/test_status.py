"""The status helpers: metav1.Condition semantics, owned keys, and schema validity."""

from __future__ import annotations

import datetime
from typing import Any

import jsonschema
import pytest

from harness.scene import example, strict
from tailguard.operator import reconcile
from tailguard.operator.status import build_status, invalid_status, status_patch
from tailguard.spec import conditions, resource, schema

T0 = datetime.datetime(2025, 1, 1, 12, 0, 0, tzinfo=datetime.timezone.utc)
T1 = T0 + datetime.timedelta(minutes=5)
ISVC = resource.parse(example("iris"))
STATUS_VALIDATOR = jsonschema.Draft202012Validator(
    strict(schema.object_schema()["properties"]["status"]),
    format_checker=jsonschema.Draft202012Validator.FORMAT_CHECKER)


def deployments(primary: int, fallback: int) -> dict[str, Any]:
    """Two Deployments whose rollouts are done: every pod is of the current template."""
    def deployment(ready: int) -> dict[str, Any]:
        replicas = max(ready, 1)
        return {"metadata": {"generation": 1}, "spec": {"replicas": replicas},
                "status": {"observedGeneration": 1, "replicas": replicas,
                           "updatedReplicas": replicas, "readyReplicas": ready}}
    return {"primary": deployment(primary), "fallback": deployment(fallback)}


def build(previous: dict[str, Any], primary: int = 1, fallback: int = 1, *,
          intent: str = "primary", current: str = "primary", now: datetime.datetime = T0,
          conflicts: tuple[str, ...] = (),
          not_starting: dict[str, list[str]] | None = None,
          hold: dict[str, Any] | None = None) -> dict[str, Any]:
    plan = reconcile.plan_traffic(intent=intent, current=current,
                                  ready={"primary": primary, "fallback": fallback},
                                  min_replicas=1, max_replicas=5)
    status: dict[str, Any] = build_status(
        previous, ISVC, generation=4, plan=plan, deployments=deployments(primary, fallback),
        conflicts=conflicts, now=now, not_starting=not_starting, hold=hold)
    return status


def by_type(status: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {c["type"]: c for c in status["conditions"]}


def test_a_first_status_is_complete_and_valid() -> None:
    status = build({})
    assert not list(STATUS_VALIDATOR.iter_errors(status))
    assert [c["type"] for c in status["conditions"]] == list(conditions.CONDITION_TYPES)
    found = by_type(status)
    assert found["Ready"]["status"] == "True"
    assert found["SLOMet"] == {"type": "SLOMet", "status": "Unknown", "reason": "NoData",
                               "message": found["SLOMet"]["message"],
                               "lastTransitionTime": "2025-01-01T12:00:00Z",
                               "observedGeneration": 4}
    assert found["RolledBack"]["reason"] == "OnPrimary"
    assert status["observedGeneration"] == 4
    assert status["activeModel"] == "primary"
    assert status["replicas"] == {"primary": {"desired": 1, "ready": 1},
                                  "fallback": {"desired": 1, "ready": 1}}


def test_transition_times_move_only_when_the_status_does() -> None:
    first = build({}, primary=1)
    same = build(first, primary=2, now=T1)
    assert by_type(same)["Ready"]["lastTransitionTime"] == "2025-01-01T12:00:00Z"
    assert by_type(same)["Ready"]["message"] != by_type(first)["Ready"]["message"]
    down = build(same, primary=0, now=T1)
    assert by_type(down)["Ready"]["status"] == "False"
    assert by_type(down)["Ready"]["lastTransitionTime"] == "2025-01-01T12:05:00Z"
    assert by_type(down)["FallbackReady"]["lastTransitionTime"] == "2025-01-01T12:00:00Z"


def test_an_unchanged_status_is_not_written() -> None:
    first = build({})
    assert status_patch({}, first) == {"status": first}
    stored = {**first, "observed": {"p99Ms": 3.0}, "kopf": {"progress": {}}}
    assert status_patch(stored, build(stored, now=T1)) is None
    assert status_patch(stored, build(stored, primary=3, now=T1)) is not None


def test_the_slo_condition_is_kept_as_the_guard_wrote_it() -> None:
    judged = conditions.set_condition([], "SLOMet", "False", "SLOBreached", "p99 80 ms > 25 ms",
                                      generation=4, now=T0)
    status = build({"conditions": judged + [{"type": "example.com/Audited", "status": "True",
                                             "reason": "Ok", "message": "",
                                             "lastTransitionTime": "2024-01-01T00:00:00Z"}]})
    assert by_type(status)["SLOMet"]["reason"] == "SLOBreached"
    assert status["conditions"][-1]["type"] == "example.com/Audited"
    assert not list(STATUS_VALIDATOR.iter_errors(status))


def test_rollback_conditions() -> None:
    waiting = by_type(build({}, primary=2, fallback=1, intent="fallback"))["RolledBack"]
    assert (waiting["status"], waiting["reason"]) == ("False", "WaitingForFallback")
    done = build({}, primary=2, fallback=2, intent="fallback")
    assert done["activeModel"] == "fallback"
    assert (by_type(done)["RolledBack"]["status"], by_type(done)["RolledBack"]["reason"]) == \
        ("True", "ManualRollback")
    assert done["replicaSummary"] == "2/2"
    back = by_type(build(done, primary=1, fallback=2, intent="primary", current="fallback"))
    assert (back["RolledBack"]["status"], back["RolledBack"]["reason"]) == \
        ("True", "WaitingForPrimary")


def test_pods_that_cannot_start_are_named_in_their_role_condition() -> None:
    line = "iris-primary-7f9-x2: ErrImageNeverPull: image is not present"
    scaling = by_type(build({}, primary=1, not_starting={"primary": [line]}))
    assert (scaling["PrimaryReady"]["status"], scaling["PrimaryReady"]["reason"]) == \
        ("True", "PodsNotStarting")  # a new pod of the same template: the others serve
    assert scaling["PrimaryReady"]["message"] == (
        f"1/1 replicas ready; 1 pod(s) cannot start: {line}")
    assert scaling["Ready"]["reason"] == "Serving"
    assert scaling["FallbackReady"]["reason"] == "ReplicasReady"
    # a rollout: the new template's pod cannot start, the old one is Ready and serves
    plan = reconcile.plan_traffic(intent="primary", current="primary",
                                  ready={"primary": 0, "fallback": 1}, min_replicas=1,
                                  max_replicas=5)
    rolling_out = deployments(0, 1)
    rolling_out["primary"]["status"].update(replicas=2, updatedReplicas=1, readyReplicas=1)
    rolling = by_type(build_status({}, ISVC, generation=4, plan=plan, deployments=rolling_out,
                                   conflicts=(), now=T0, not_starting={"primary": [line]}))
    assert (rolling["PrimaryReady"]["status"], rolling["PrimaryReady"]["reason"]) == \
        ("False", "PodsNotStarting")
    assert rolling["PrimaryReady"]["message"].endswith(
        f"{line} (1 Ready pod(s) of the previous template still serve)")
    assert (rolling["Ready"]["status"], rolling["Ready"]["reason"]) == \
        ("False", "PodsNotStarting")
    lines = [f"iris-primary-{i}: ErrImagePull: no route" for i in range(5)]
    fresh = by_type(build({}, primary=0, not_starting={"primary": lines}))
    assert (fresh["PrimaryReady"]["status"], fresh["Ready"]["status"]) == ("False", "False")
    assert fresh["Ready"]["reason"] == "PodsNotStarting"
    assert fresh["Ready"]["message"].endswith("iris-primary-2: ErrImagePull: no route; 2 more")
    assert not list(STATUS_VALIDATOR.iter_errors(build({}, primary=0,
                                                       not_starting={"primary": lines})))
    # once they start, the reason goes back
    assert by_type(build({}, primary=1, not_starting={}))["PrimaryReady"]["reason"] == \
        "ReplicasReady"


def test_conflicts_and_invalid_specs_make_ready_false() -> None:
    conflicted = by_type(build({}, conflicts=("Service/iris",)))["Ready"]
    assert (conflicted["status"], conflicted["reason"]) == ("False", "ChildConflict")
    assert "Service/iris" in conflicted["message"]
    previous = build({})
    invalid = invalid_status(previous, generation=5, message="spec.x: bad", now=T1)
    assert invalid["observedGeneration"] == 5
    assert invalid["activeModel"] == "primary"
    ready = by_type(invalid)["Ready"]
    assert (ready["status"], ready["reason"]) == ("False", "InvalidSpec")
    assert ready["message"].startswith("spec.x: bad")
    assert not list(STATUS_VALIDATOR.iter_errors(invalid))
    assert not list(STATUS_VALIDATOR.iter_errors(
        invalid_status({}, generation=1, message="x" * 40000, now=T0)))


def test_timestamps_need_a_timezone() -> None:
    assert conditions.timestamp(T0) == "2025-01-01T12:00:00Z"
    with pytest.raises(ValueError, match="timezone"):
        conditions.timestamp(datetime.datetime(2025, 1, 1))


def test_a_held_minimum_is_written_and_removed_once_it_ends() -> None:
    hold = {"role": "fallback", "replicas": 3, "until": "2025-01-01T12:05:00Z"}
    held = build({}, hold=hold)
    assert held["minReplicasHold"] == hold
    assert not list(STATUS_VALIDATOR.iter_errors(held))
    ended = build(held, now=T1)
    assert "minReplicasHold" not in ended
    assert status_patch(held, ended) == {"status": {**ended, "minReplicasHold": None}}
    assert status_patch(ended, build(ended, now=T1)) is None  # nothing held, nothing removed
