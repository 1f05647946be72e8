"""The pure reconcile rules: minimal merge patches, and when traffic may move."""

from __future__ import annotations

import copy
import dataclasses
import datetime
from typing import Any

import pytest
from json_merge_patch import merge as apply_merge_patch

from harness.scene import BEHAVIOR, example
from tailguard.operator import manifests, reconcile
from tailguard.operator.settings import OperatorSettings
from tailguard.spec import resource

OWNER = manifests.Owner(name="iris", uid="uid-1")


def desired(kind: str, **spec_changes: Any) -> dict[str, Any]:
    isvc = resource.parse(example("iris", **spec_changes))
    for child in manifests.children(isvc, OWNER, OperatorSettings(), active_role="primary"):
        if child["kind"] == kind:
            return dict(child)
    raise KeyError(kind)


def stored(obj: dict[str, Any]) -> dict[str, Any]:
    """``obj`` as an API server returns it: server metadata, defaults and a status added."""
    live = copy.deepcopy(obj)
    live["metadata"].update(uid="child-uid", resourceVersion="7", generation=3,
                            creationTimestamp="2025-01-01T00:00:00Z",
                            managedFields=[{"manager": "tailguard"}])
    live["status"] = {"observedGeneration": 3}
    spec_ = live.get("spec") or {}
    if obj["kind"] == "Deployment":
        spec_["progressDeadlineSeconds"] = 600
        for container in spec_["template"]["spec"]["containers"]:
            container["terminationMessagePath"] = "/dev/termination-log"
            container["readinessProbe"]["successThreshold"] = 1
    if obj["kind"] == "Service":
        spec_.update(clusterIP="10.0.0.1", sessionAffinity="None")
    return live


@pytest.mark.parametrize("kind", manifests.KIND_ORDER)
def test_an_object_as_stored_needs_no_patch(kind: str) -> None:
    assert reconcile.merge_patch(desired(kind), stored(desired(kind))) is None


def test_a_changed_field_gives_a_patch_of_just_that_field() -> None:
    live = stored(desired("HorizontalPodAutoscaler"))
    want = desired("HorizontalPodAutoscaler", scaling={"maxReplicas": 9})
    assert reconcile.merge_patch(want, live) == {"spec": {"maxReplicas": 9}}


def test_deployment_replicas_are_never_patched() -> None:
    live = stored(desired("Deployment"))
    live["spec"]["replicas"] = 6  # the HPA scaled it
    assert reconcile.merge_patch(desired("Deployment", scaling={"minReplicas": 2}), live) is None
    want = desired("Deployment", batching={"maxBatchSize": 4})
    patch = reconcile.merge_patch(want, live)
    assert patch is not None and "replicas" not in patch["spec"]
    assert apply_merge_patch(live, patch)["spec"]["replicas"] == 6


def test_foreign_labels_and_annotations_are_left_alone() -> None:
    live = stored(desired("Service"))
    live["metadata"]["labels"]["team"] = "search"
    live["metadata"]["annotations"] = {"example.com/x": "1"}
    assert reconcile.merge_patch(desired("Service"), live) is None
    live["metadata"]["labels"]["app.kubernetes.io/part-of"] = "someone-else"
    assert reconcile.merge_patch(desired("Service"), live) == {
        "metadata": {"labels": {"app.kubernetes.io/part-of": "tailguard"}}}


def test_a_list_is_rewritten_whole_when_it_differs() -> None:
    live = stored(desired("Deployment"))
    container = live["spec"]["template"]["spec"]["containers"][0]
    container["env"].append({"name": "DEBUG", "value": "1"})
    patch = reconcile.merge_patch(desired("Deployment"), live)
    assert patch is not None
    (patched,) = patch["spec"]["template"]["spec"]["containers"]
    assert patched == desired("Deployment")["spec"]["template"]["spec"]["containers"][0]
    assert set(patch) == {"spec"} and set(patch["spec"]) == {"template"}


def test_the_selector_follows_the_active_role() -> None:
    isvc = resource.parse(example("iris"))
    live = stored(manifests.service(isvc, OWNER, "primary"))
    assert reconcile.merge_patch(manifests.service(isvc, OWNER, "fallback"), live) == {
        "spec": {"selector": {"tailguard.dev/role": "fallback"}}}


def test_behavior_is_replaced_whole_and_removed_when_dropped() -> None:
    live = stored(desired("HorizontalPodAutoscaler", scaling={"behavior": BEHAVIOR}))
    live["spec"]["behavior"]["scaleDown"]["selectPolicy"] = "Max"  # a server default: no change
    assert reconcile.merge_patch(
        desired("HorizontalPodAutoscaler", scaling={"behavior": BEHAVIOR}), live) is None

    only_down = {"scaleDown": {"stabilizationWindowSeconds": 60}}
    patch = reconcile.merge_patch(
        desired("HorizontalPodAutoscaler", scaling={"behavior": only_down}), live)
    assert patch is not None
    assert apply_merge_patch(live, patch)["spec"]["behavior"] == only_down

    patch = reconcile.merge_patch(desired("HorizontalPodAutoscaler"), live)
    assert patch == {"spec": {"behavior": None}}
    assert "behavior" not in apply_merge_patch(live, patch)["spec"]


def test_an_orphan_is_adopted_beside_other_owners() -> None:
    live = stored(desired("ConfigMap"))
    other = {"apiVersion": "v1", "kind": "Secret", "name": "s", "uid": "u-2"}
    live["metadata"]["ownerReferences"] = [other]
    patch = reconcile.merge_patch(desired("ConfigMap"), live)
    assert patch == {"metadata": {"ownerReferences": [other, manifests.owner_reference(OWNER)]}}
    assert reconcile.controller_uid(live) is None
    assert reconcile.controller_uid(apply_merge_patch(live, patch)) == "uid-1"


def test_a_patch_applied_converges() -> None:
    """Whatever was edited, applying the patch leaves nothing more to patch."""
    live = stored(desired("Deployment"))
    live["spec"]["template"]["spec"]["containers"][0]["image"] = "someone/else:1"
    live["spec"]["template"]["metadata"]["annotations"]["tailguard.dev/config-checksum"] = "x"
    live["metadata"]["labels"].pop("tailguard.dev/role")
    patch = reconcile.merge_patch(desired("Deployment"), live)
    assert patch is not None
    assert reconcile.merge_patch(desired("Deployment"), apply_merge_patch(live, patch)) is None


def _deployment(generation: int, observed: int, replicas: int, updated: int,
                ready: int) -> dict[str, object]:
    return {"metadata": {"generation": generation},
            "status": {"observedGeneration": observed, "replicas": replicas,
                       "updatedReplicas": updated, "readyReplicas": ready}}


def test_replica_counts_of_live_deployments() -> None:
    assert reconcile.ready_replicas(None) == 0
    assert reconcile.ready_replicas({"status": {}}) == 0
    assert reconcile.ready_replicas(_deployment(1, 1, 3, 3, 3)) == 3
    assert reconcile.desired_replicas({"spec": {"replicas": 2}}) == 2
    assert reconcile.desired_replicas(None) == 0


def test_only_ready_pods_of_the_current_template_count() -> None:
    """A new model's pods that cannot start leave 0 Ready however many old pods serve."""
    # the template was just patched: the controller has not seen it yet
    assert reconcile.ready_replicas(_deployment(2, 1, 3, 3, 3)) == 0
    # it has: 3 old pods Ready, 1 new pod not yet (it cannot schedule)
    assert reconcile.ready_replicas(_deployment(2, 2, 4, 1, 3)) == 0
    # mid-rollout: 2 new pods, 2 old ones, 3 Ready in all: at least 1 new one is Ready
    assert reconcile.ready_replicas(_deployment(2, 2, 4, 2, 3)) == 1
    # done: the old pods are gone
    assert reconcile.ready_replicas(_deployment(2, 2, 3, 3, 3)) == 3
    assert reconcile.ready_replicas(_deployment(2, 2, 3, 3, 2)) == 2


class TestPlanTraffic:
    def plan(self, intent: str, current: str, primary: int, fallback: int,
             minimum: int = 1, maximum: int = 5) -> reconcile.TrafficPlan:
        return reconcile.plan_traffic(intent=intent, current=current,
                                      ready={"primary": primary, "fallback": fallback},
                                      min_replicas=minimum, max_replicas=maximum)

    def test_no_move_wanted(self) -> None:
        plan = self.plan("primary", "primary", 0, 0)
        assert plan.active == "primary" and not plan.pending and not plan.switched
        assert plan.min_replicas == {}

    def test_a_rollback_waits_for_as_many_ready_replicas_as_serve_now(self) -> None:
        plan = self.plan("fallback", "primary", 3, 2)
        assert plan.pending and plan.active == "primary" and plan.needed == 3
        assert plan.min_replicas == {"fallback": 3}
        assert "2/3" in plan.message
        plan = self.plan("fallback", "primary", 3, 3)
        assert plan.switched and plan.active == "fallback" and not plan.pending
        assert plan.min_replicas == {}

    def test_the_need_is_bounded_by_the_scaling_spec(self) -> None:
        assert self.plan("fallback", "primary", 9, 0, maximum=4).needed == 4
        assert self.plan("fallback", "primary", 0, 0, minimum=2).needed == 2
        broken_primary = self.plan("fallback", "primary", 0, 1)
        assert broken_primary.switched  # one Ready fallback pod beats none

    def test_rolling_forward_is_symmetric(self) -> None:
        plan = self.plan("primary", "fallback", 1, 2)
        assert plan.pending and plan.min_replicas == {"primary": 2}
        assert self.plan("primary", "fallback", 2, 2).active == "primary"


class TestHoldMinimum:
    """After traffic moves, the new role's HPA minimum stays at the replicas it moved with for
    the HPA's scale-down window, across passes (the hold is read back from the status)."""

    T0 = datetime.datetime(2026, 1, 1, 12, 0, tzinfo=datetime.timezone.utc)

    def moved(self) -> reconcile.TrafficPlan:
        return reconcile.plan_traffic(intent="fallback", current="primary",
                                      ready={"primary": 3, "fallback": 3}, min_replicas=1,
                                      max_replicas=5)

    def test_a_move_holds_the_minimum_for_the_window(self) -> None:
        plan, hold = reconcile.hold_minimum(self.moved(), None, self.T0, 300)
        assert plan.active == "fallback" and plan.min_replicas == {"fallback": 3}
        assert hold == {"role": "fallback", "replicas": 3, "until": "2026-01-01T12:05:00Z"}
        # the next passes: traffic stays, the hold is read back until it ends
        steady = reconcile.plan_traffic(intent="fallback", current="fallback",
                                        ready={"primary": 3, "fallback": 3}, min_replicas=1,
                                        max_replicas=5)
        later = self.T0 + datetime.timedelta(seconds=299)
        assert reconcile.hold_minimum(steady, hold, later, 300) == (
            dataclasses.replace(steady, min_replicas={"fallback": 3}), hold)
        ended = self.T0 + datetime.timedelta(seconds=300)
        assert reconcile.hold_minimum(steady, hold, ended, 300) == (steady, None)

    def test_a_hold_ends_when_traffic_moves_on_or_is_unreadable(self) -> None:
        _, hold = reconcile.hold_minimum(self.moved(), None, self.T0, 300)
        back = reconcile.plan_traffic(intent="primary", current="fallback",
                                      ready={"primary": 3, "fallback": 3}, min_replicas=1,
                                      max_replicas=5)
        plan, new = reconcile.hold_minimum(back, hold, self.T0, 300)
        assert new is not None and new["role"] == "primary"  # the move back holds the primary
        assert plan.min_replicas == {"primary": 3}
        waiting = reconcile.plan_traffic(intent="primary", current="fallback",
                                         ready={"primary": 1, "fallback": 3}, min_replicas=1,
                                         max_replicas=5)
        assert waiting.active == "fallback" and waiting.min_replicas == {"primary": 3}
        plan, kept = reconcile.hold_minimum(waiting, hold, self.T0, 300)
        assert kept == hold and plan.min_replicas == {"primary": 3, "fallback": 3}
        assert reconcile.hold_minimum(waiting, {"role": "fallback", "until": "soon"},
                                      self.T0, 300) == (waiting, None)
        assert reconcile.hold_minimum(self.moved(), None, self.T0, 0) == (self.moved(), None)

    def test_the_window_is_the_hpas_scale_down_stabilization(self) -> None:
        assert reconcile.scale_down_window_s(None) == 300
        assert reconcile.scale_down_window_s({"scaleUp": {}}) == 300
        assert reconcile.scale_down_window_s(
            {"scaleDown": {"stabilizationWindowSeconds": 30}}) == 30


def test_quantities_the_server_rewrote_are_not_differences() -> None:
    """The API server stores ``1000`` as ``1k``, ``0.5`` as ``500m`` and ``1024Mi`` as
    ``1Gi``; comparing strings would patch the HPA and the Deployment on every pass."""
    desired = {"kind": "Deployment", "metadata": {"name": "d"}, "spec": {"template": {"spec": {
        "containers": [{"name": "c", "resources": {"requests": {"cpu": "0.5", "memory": "1024Mi"},
                                                   "limits": {"memory": "1024Mi"}}}],
        "volumes": [{"name": "tmp", "emptyDir": {"sizeLimit": "1024Mi"}}]}}}}
    live = {"kind": "Deployment", "metadata": {"name": "d"}, "spec": {"template": {"spec": {
        "containers": [{"name": "c", "resources": {"requests": {"cpu": "500m", "memory": "1Gi"},
                                                   "limits": {"memory": "1Gi"}}}],
        "volumes": [{"name": "tmp", "emptyDir": {"sizeLimit": "1Gi"}}]}}}}
    assert reconcile.merge_patch(desired, live) is None
    hpa = {"kind": "HorizontalPodAutoscaler", "metadata": {"name": "h"}, "spec": {"metrics": [
        {"type": "Pods", "pods": {"target": {"type": "AverageValue", "averageValue": "1000"}}}]}}
    stored = {"kind": "HorizontalPodAutoscaler", "metadata": {"name": "h"}, "spec": {"metrics": [
        {"type": "Pods", "pods": {"target": {"type": "AverageValue", "averageValue": "1k"}}}]}}
    assert reconcile.merge_patch(hpa, stored) is None
    stored["spec"]["metrics"][0]["pods"]["target"]["averageValue"] = "2k"
    assert reconcile.merge_patch(hpa, stored) == {"spec": {"metrics": hpa["spec"]["metrics"]}}
    # A string that only looks like a quantity elsewhere is compared as a string.
    assert reconcile.merge_patch({"kind": "ConfigMap", "metadata": {"name": "c"},
                                  "data": {"x": "1000"}},
                                 {"kind": "ConfigMap", "metadata": {"name": "c"},
                                  "data": {"x": "1k"}}) == {"data": {"x": "1000"}}


def test_a_status_write_nobody_reads_leaves_the_fingerprint_alone() -> None:
    hpa = stored(desired("HorizontalPodAutoscaler"))
    before = reconcile.fingerprint(hpa)
    rewritten = copy.deepcopy(hpa)
    rewritten["metadata"]["resourceVersion"] = "999"
    rewritten["status"] = {"currentReplicas": 1, "conditions": [{"type": "AbleToScale"}]}
    assert reconcile.fingerprint(rewritten) == before
    edited = copy.deepcopy(hpa)
    edited["spec"]["maxReplicas"] = 50
    assert reconcile.fingerprint(edited) != before
    labelled = copy.deepcopy(hpa)
    labelled["metadata"]["labels"]["team"] = "x"
    assert reconcile.fingerprint(labelled) != before
    deployment = stored(desired("Deployment"))
    ready = copy.deepcopy(deployment)
    ready["status"] = {"replicas": 1, "readyReplicas": 1, "observedGeneration": 1}
    assert reconcile.fingerprint(ready) != reconcile.fingerprint(deployment)
    seen = copy.deepcopy(ready)  # the controller saw a new template: readiness is recounted
    seen["status"]["observedGeneration"] = 2
    assert reconcile.fingerprint(seen) != reconcile.fingerprint(ready)
    conditions = copy.deepcopy(ready)
    conditions["status"]["conditions"] = [{"type": "Available", "status": "True"}]
    assert reconcile.fingerprint(conditions) == reconcile.fingerprint(ready)


def test_a_revision_config_map_goes_once_nothing_mounts_it() -> None:
    def revision(**spec_changes: Any) -> tuple[dict[str, Any], dict[str, Any]]:
        isvc = resource.parse(example("iris", **spec_changes))
        template = manifests.deployment(isvc, OWNER, "primary", OperatorSettings())
        replica_set = {"kind": "ReplicaSet", "metadata": {"name": "rs"},
                       "spec": {"template": template["spec"]["template"]}}
        return stored(manifests.config_map(isvc, OWNER, "primary")), replica_set

    (now, now_rs), (old, old_rs), (older, _) = (
        revision(model={"uri": f"builtin://iris/random-forest?trees={trees}"})
        for trees in (30, 20, 10))
    for cm in (now, old, older):
        cm["metadata"]["ownerReferences"] = [manifests.owner_reference(OWNER)]
    theirs = stored(old)
    theirs["metadata"].update(name="iris-primary-theirs", ownerReferences=[])
    maps = [now, old, older, theirs]
    names = [cm["metadata"]["name"] for cm in maps]
    assert len(set(names)) == 4
    # the old revision's ReplicaSet still mounts it; nothing mounts the older one
    assert reconcile.unused_config_maps(maps, [now_rs, old_rs], [names[0]], "uid-1") == [
        names[2]]
    # what the pass does not want goes, unless a ReplicaSet mounts it
    assert reconcile.unused_config_maps(maps, [old_rs], [], "uid-1") == sorted(
        [names[0], names[2]])
    # another owner's (or nobody's) ConfigMap is never chosen
    assert reconcile.unused_config_maps(maps, [], [], "uid-2") == []
