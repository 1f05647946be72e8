"""The operator on a real control plane, installed by the chart and run under its RBAC.

Each test has a namespace of its own. It acts as a person would (kubectl-like requests as the
admin), lets the cluster's own controllers act (the Deployment controller, the garbage
collector, the HPA controller, kwok's kubelets marking pods Ready), and checks what the API
server stores and, from the audit log, every request the operator made.
"""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
import time
import urllib.parse
from pathlib import Path
from typing import Any

import pytest

from harness.scene import BEHAVIOR, RESYNC_SECONDS, Scene, example
from tailguard.operator import handlers, kube, manifests
from tailguard.operator.settings import OperatorSettings
from tailguard.spec import resource


def revision_maps(body: dict[str, Any] | None = None) -> dict[str, str]:
    """Each role's revision ConfigMap name for ``body`` (default: the iris example)."""
    isvc = resource.parse(body or example())
    return {role: manifests.config_map_name("iris", role, manifests.config_checksum(isvc, role))
            for role in manifests.ROLES}


CHILDREN = {
    "configmaps": sorted([*revision_maps().values(), "iris-traffic"]),
    "deployments": ["iris-fallback", "iris-primary"],
    "services": ["iris"],
    "horizontalpodautoscalers": ["iris-fallback", "iris-primary"],
    "poddisruptionbudgets": ["iris-fallback", "iris-primary"],
}
CHECKSUM = manifests.CHECKSUM_ANNOTATION


def start(scene: Scene, body: dict[str, Any] | None = None) -> dict[str, Any]:
    """Create an InferenceService, wait for its first status and for Ready (kwok runs its
    pods), and let the operator go quiet."""
    created = scene.create(body or example(namespace=scene.namespace))
    name = created["metadata"]["name"]
    scene.first_status(name)
    scene.wait(lambda: scene.condition("Ready", name).get("status") == "True", what="Ready")
    scene.settle()
    return created


def active_in_config(scene: Scene) -> str | None:
    """The active role the traffic ConfigMap names (``None`` while it names none, as after a
    hand edit the operator has not repaired yet)."""
    config = scene.must_get("configmaps", "iris-traffic")
    return json.loads(config["data"]["traffic.json"]).get("activeModel")  # type: ignore[no-any-return]


def served(scene: Scene, holder: dict[str, Any]) -> tuple[str, str]:
    """The model URI in the revision ConfigMap a Deployment's or ReplicaSet's pods mount, and
    the SHA-256 of that ConfigMap's config (what the pod template's checksum must be)."""
    (name,) = manifests.config_maps_named(holder) - {"iris-traffic"}
    config = json.loads(scene.must_get("configmaps", name)["data"]["runtime.json"])
    (model,) = config["models"]
    digest = hashlib.sha256(json.dumps(config, sort_keys=True).encode()).hexdigest()
    return model["uri"], digest


def checksums(scene: Scene) -> dict[str, str]:
    return {d["metadata"]["name"]: d["spec"]["template"]["metadata"]["annotations"][CHECKSUM]
            for d in scene.list("deployments")}


def test_create_makes_every_child_and_reports_ready_replicas(scene: Scene) -> None:
    with scene.operator():
        owner = start(scene)
    uid = owner["metadata"]["uid"]
    for plural, names in CHILDREN.items():
        stored = scene.children(plural)
        assert [o["metadata"]["name"] for o in stored] == names
        for obj in stored:
            assert obj["metadata"]["ownerReferences"] == [{
                "apiVersion": resource.API_VERSION, "kind": resource.KIND, "name": "iris", "uid": uid,
                "controller": True, "blockOwnerDeletion": True}]
            assert obj["metadata"]["labels"][manifests.LABEL_MANAGED_BY] == "tailguard-operator"
            assert not obj["metadata"].get("finalizers")
            managers = {f["manager"] for f in obj["metadata"]["managedFields"]}
            assert "tailguard-operator" in managers and "OpenAPI-Generator" not in managers, \
                managers
    assert not scene.must_get(resource.PLURAL, "iris")["metadata"].get("finalizers")
    assert scene.selected_role() == "primary"
    status = scene.status()
    assert status["activeModel"] == "primary"
    assert status["url"] == f"http://iris.{scene.namespace}.svc/v2/models/iris/infer"
    assert status["replicaSummary"] == "1/1"
    assert status["replicas"] == {"primary": {"desired": 1, "ready": 1},
                                  "fallback": {"desired": 1, "ready": 1}}
    assert scene.condition("PrimaryReady")["status"] == "True"
    assert scene.condition("FallbackReady")["status"] == "True"
    assert scene.condition("SLOMet")["status"] == "Unknown"
    assert [e["involvedObject"]["uid"] for e in scene.events("Created")] == [uid]
    verbs = {w.verb for w in scene.writes()}
    assert verbs <= {"create", "patch"}, verbs  # never a PUT, never a delete
    ours = [w for w in scene.writes() if w.resource in (*CHILDREN, "events")
            or w.subresource == "status"]
    assert ours and not [(w.target, w.user_agent, w.uri) for w in ours
                         if not w.user_agent.startswith("tailguard/")
                         or "fieldManager=tailguard-operator" not in w.uri]
    # none refused, but for a status write whose resourceVersion precondition met a write of
    # kopf's own in between (a 409, read again and written once more)
    assert all(w.code < 400 or (w.code == 409 and w.subresource == "status")
               for w in scene.writes()), [w for w in scene.writes() if w.code >= 400]
    # The API server filters the child watches: every list and watch of a child kind the
    # operator made (cluster-wide, since it started) carries the label selector.
    streams = [r for r in scene.requests(since=0, everywhere=True)
               if r.verb in ("list", "watch") and r.resource in CHILDREN and not r.name]
    assert {r.resource for r in streams} == set(CHILDREN)
    assert all("labelSelector=app.kubernetes.io/managed-by=tailguard-operator"
               in urllib.parse.unquote(r.uri) for r in streams), [r.uri for r in streams]


def test_a_spec_change_patches_exactly_what_changed(scene: Scene) -> None:
    with scene.operator():
        start(scene)
        mark = scene.audit.mark()
        scene.patch(resource.PLURAL, "iris", {"spec": {"scaling": {"maxReplicas": 7}}})
        scene.first_status(generation=2)
        writes = scene.child_writes(mark)
        assert sorted((w.verb, w.resource, w.name) for w in writes) == [
            ("patch", "horizontalpodautoscalers", "iris-fallback"),
            ("patch", "horizontalpodautoscalers", "iris-primary")]
        assert [w.body for w in writes] == [{"spec": {"maxReplicas": 7}}] * 2

        before = checksums(scene)
        mark = scene.audit.mark()
        scene.patch(resource.PLURAL, "iris", {"spec": {"batching": {"maxBatchSize": 8}}})
        scene.first_status(generation=3)
        writes = scene.child_writes(mark)
    after = checksums(scene)
    revisions = revision_maps(example(batching={"maxBatchSize": 8}))
    for role, name in revisions.items():
        config = scene.must_get("configmaps", name)
        assert json.loads(config["data"]["runtime.json"])["batching"]["maxBatchSize"] == 8
    assert sorted((w.verb, w.resource, w.name) for w in writes) == [
        ("create", "configmaps", revisions["fallback"]),
        ("create", "configmaps", revisions["primary"]),
        ("patch", "deployments", "iris-fallback"), ("patch", "deployments", "iris-primary")]
    for write in writes:
        if write.resource == "deployments":
            role = write.name.removeprefix("iris-")
            template = write.body["spec"]["template"]
            assert write.body == {"spec": {"template": {
                "metadata": {"annotations": {CHECKSUM: after[write.name]}},
                "spec": {"volumes": template["spec"]["volumes"]}}}}
            assert manifests.config_maps_named(write.body) == {revisions[role], "iris-traffic"}
            assert after[write.name] != before[write.name]


def test_a_new_primary_model_rolls_only_the_primary_pods(scene: Scene) -> None:
    with scene.operator():
        start(scene)
        before = checksums(scene)
        fallback_pods = {p["metadata"]["uid"] for p in scene.list("pods")
                         if p["metadata"]["labels"][manifests.LABEL_ROLE] == "fallback"}
        mark = scene.audit.mark()
        scene.patch(resource.PLURAL, "iris",
                    {"spec": {"model": {"uri": "builtin://iris/random-forest?trees=50"}}})
        scene.first_status(generation=2)
        deployment_writes = [w.name for w in scene.child_writes(mark)
                             if w.resource == "deployments"]
    after = checksums(scene)
    assert deployment_writes == ["iris-primary"]
    assert after["iris-fallback"] == before["iris-fallback"]
    assert after["iris-primary"] != before["iris-primary"]
    assert scene.must_get("deployments", "iris-fallback")["metadata"]["generation"] == 1
    assert {p["metadata"]["uid"] for p in scene.list("pods")
            if p["metadata"]["labels"][manifests.LABEL_ROLE] == "fallback"} == fallback_pods


def test_each_replica_set_keeps_the_config_of_its_own_revision(scene: Scene) -> None:
    """A revision's ConfigMap lives as long as a ReplicaSet mounts it: an old pod restarting
    mid-rollout, or a ReplicaSet brought back by ``kubectl rollout undo``, loads the model it
    was made for. The Deployment controller keeps ``revisionHistoryLimit`` (3) old ReplicaSets;
    when it prunes one, its ConfigMap goes too (at the next pass: the resync here)."""
    uris = [f"builtin://iris/random-forest?trees={trees}" for trees in (11, 12, 13, 14, 15)]

    def primary_maps() -> set[str]:
        return {n for n in scene.names("configmaps") if n.startswith("iris-primary-")}

    def replica_sets() -> list[dict[str, Any]]:
        return [rs for rs in scene.children("replicasets")
                if rs["metadata"]["labels"][manifests.LABEL_ROLE] == "primary"]

    with scene.operator(resync=True):
        start(scene)
        first = scene.must_get("replicasets", replica_sets()[0]["metadata"]["name"])
        mark = scene.audit.mark()
        for generation, uri in enumerate(uris, start=2):
            scene.patch(resource.PLURAL, "iris", {"spec": {"model": {"uri": uri}}})
            scene.first_status(generation=generation)
            scene.wait(lambda: scene.condition("Ready").get("status") == "True", what="Ready")
            if generation == 2:  # the first revision's ReplicaSet and ConfigMap are still there
                assert served(scene, first)[0] == "builtin://iris/random-forest"
        # five revisions later the first ones' ReplicaSets are pruned, and their ConfigMaps
        scene.wait(lambda: len(replica_sets()) == 4, what="4 primary ReplicaSets")
        scene.wait(lambda: primary_maps() == {
            name for rs in replica_sets() for name in manifests.config_maps_named(rs)
            if name != "iris-traffic"}, what="only the mounted revisions kept",
            timeout=10 * RESYNC_SECONDS)
        scene.settle()
        deletes = [w for w in scene.child_writes(mark) if w.verb == "delete"]
    sets = replica_sets()
    assert sorted(served(scene, rs)[0] for rs in sets) == sorted(uris[1:])
    for rs in sets:  # each ReplicaSet's config is the one its pod template's checksum names
        annotations = rs["spec"]["template"]["metadata"]["annotations"]
        assert served(scene, rs)[1] == annotations[CHECKSUM]
    assert sorted(w.name for w in deletes) == sorted(
        revision_maps(example(model={"uri": uri}))["primary"]
        for uri in ["builtin://iris/random-forest", uris[0]])
    assert all(w.resource == "configmaps" and w.code == 200 for w in deletes)
    assert {n for n in scene.names("configmaps") if n.startswith("iris-fallback-")} == {
        revision_maps()["fallback"]}


SERVICES_AT_ONCE = 6
REQUESTS_PER_SERVICE = 20
"""The bound of issue 28 (100 services Ready with at most 20 API requests each)."""


def test_passes_read_the_watch_cache_and_requests_grow_with_work_not_events(
        scene: Scene) -> None:
    """Several InferenceServices created at once: their children's status changes (kwok
    making pods Ready, the Deployment and HPA controllers) start many passes, and those read
    what the watches brought, not the API: the namespace is listed once (six lists), and a
    status write that meets another writer (kopf's own annotation) reads the object again.
    Read from the API, every pass cost nine GETs (5,781 requests for 100 services)."""
    names = [f"svc-{i}" for i in range(SERVICES_AT_ONCE)]
    with scene.operator():
        mark, log = scene.audit.mark(), scene.log_mark()
        for name in names:
            body = example(namespace=scene.namespace)
            body["metadata"]["name"] = name
            scene.create(body)
        for name in names:
            scene.wait(lambda: scene.condition("Ready", name).get("status") == "True",
                       what=f"{name} Ready")
        scene.settle()
    ours = scene.requests(mark)  # this namespace's: the cluster-wide lists and watches aside
    reads = [f"{r.verb} {r.target}" for r in ours if r.verb in ("get", "list")]
    passes = sum(scene.passes(log, name) for name in names)
    assert passes > 2 * SERVICES_AT_ONCE, passes  # events did start passes
    assert len(ours) <= REQUESTS_PER_SERVICE * SERVICES_AT_ONCE, \
        sorted(f"{r.verb} {r.target}" for r in ours)
    lists = [r for r in reads if r.startswith("list ")]
    assert len(lists) == 6, reads
    assert len(reads) - len(lists) <= 3 * SERVICES_AT_ONCE, reads  # re-reads after 409s only


def test_resyncs_and_a_restart_with_nothing_to_change_write_nothing(scene: Scene) -> None:
    """No exclusions: not a status, an Event, an annotation of kopf's, or a child."""
    body = example(namespace=scene.namespace, scaling={
        "minReplicas": 1, "maxReplicas": 1000, "targetQueueDepth": 1000, "behavior": BEHAVIOR})
    with scene.operator(resync=True):
        start(scene, body)
        mark, log = scene.audit.mark(), scene.log_mark()
        scene.wait(lambda: scene.passes(log) >= 2, what="two resync passes",
                   timeout=10 * RESYNC_SECONDS)
        scene.settle(quiet=2 * RESYNC_SECONDS)
    restart = scene.log_mark()
    with scene.operator(resync=True):
        scene.wait(lambda: scene.passes(restart) >= 2, what="a resume and a resync after a "
                   "restart", timeout=10 * RESYNC_SECONDS)
        scene.settle(quiet=2 * RESYNC_SECONDS)
    assert scene.writes(mark, everywhere=True) == []
    # The server rewrote the quantities (1000 is stored as 1k): compared by value, not text.
    hpa = scene.must_get("horizontalpodautoscalers", "iris-primary")
    assert hpa["spec"]["metrics"][0]["pods"]["target"]["averageValue"] == "1k"
    assert hpa["spec"]["behavior"]["scaleUp"]["policies"] == BEHAVIOR["scaleUp"]["policies"]


def test_replicas_set_by_the_autoscaler_survive(scene: Scene) -> None:
    with scene.operator():
        start(scene)
        scene.admin.patch("deployments", scene.namespace, "iris-primary",
                          {"spec": {"replicas": 4}}, subresource="scale")
        scene.ready_deployment("iris-primary", 4)
        scene.settle()
        mark = scene.audit.mark()
        scene.patch(resource.PLURAL, "iris",
                    {"spec": {"model": {"uri": "builtin://iris/random-forest?trees=50"}}})
        scene.first_status(generation=2)
        patches = [w for w in scene.child_writes(mark) if w.verb == "patch"]
    assert scene.must_get("deployments", "iris-primary")["spec"]["replicas"] == 4
    assert patches and all("replicas" not in (w.body.get("spec") or {}) for w in patches)
    assert served(scene, scene.must_get("deployments", "iris-primary"))[0] == \
        "builtin://iris/random-forest?trees=50"
    assert scene.status()["replicas"]["primary"] == {"desired": 4, "ready": 4}


def test_labels_and_annotations_added_by_others_survive(scene: Scene) -> None:
    foreign = {"metadata": {"labels": {"team": "search"},
                            "annotations": {"example.com/cost-center": "42"}}}
    restarted = {"spec": {"template": {"metadata": {"annotations": {
        "kubectl.kubernetes.io/restartedAt": "2026-01-01T00:00:00Z"}}}}}
    touched = (("services", "iris"), ("deployments", "iris-primary"),
               ("horizontalpodautoscalers", "iris-primary"))
    with scene.operator():
        start(scene)
        mark, log = scene.audit.mark(), scene.log_mark()
        for plural, name in touched:
            scene.patch(plural, name, foreign)
        scene.patch("deployments", "iris-primary", restarted)
        scene.wait(lambda: scene.passes(log) >= 2, what="passes after the edits")
        scene.settle()
        assert scene.child_writes(mark) == []
        scene.patch(resource.PLURAL, "iris", {"spec": {"batching": {"maxBatchSize": 16},
                                                   "scaling": {"maxReplicas": 3}}})
        scene.first_status(generation=2)
    for plural, name in touched:
        meta = scene.must_get(plural, name)["metadata"]
        assert meta["labels"]["team"] == "search"
        assert meta["annotations"]["example.com/cost-center"] == "42"
    template = scene.must_get("deployments", "iris-primary")["spec"]["template"]
    assert template["metadata"]["annotations"]["kubectl.kubernetes.io/restartedAt"]
    assert scene.must_get("horizontalpodautoscalers", "iris-primary")["spec"]["maxReplicas"] == 3


def test_children_deleted_or_edited_by_hand_are_restored(scene: Scene) -> None:
    with scene.operator():
        start(scene)
        uid = scene.must_get("deployments", "iris-fallback")["metadata"]["uid"]
        scene.delete("deployments", "iris-fallback")
        scene.delete("services", "iris")
        scene.wait(lambda: (scene.get("deployments", "iris-fallback") or {}).get(
            "metadata", {}).get("uid") not in (None, uid) and scene.get("services", "iris"),
            what="restored children")
        scene.patch("services", "iris", {"spec": {"selector": {manifests.LABEL_ROLE: "fallback"}}})
        scene.patch("horizontalpodautoscalers", "iris-primary", {"spec": {"maxReplicas": 50}})
        scene.patch("configmaps", "iris-traffic", {"data": {"traffic.json": "{}"}})
        scene.delete("configmaps", revision_maps()["fallback"])
        scene.wait(lambda: scene.selected_role() == "primary", what="selector restored")
        scene.wait(lambda: scene.must_get("horizontalpodautoscalers", "iris-primary")[
            "spec"]["maxReplicas"] == 5, what="HPA restored")
        scene.wait(lambda: active_in_config(scene) == "primary", what="config restored")
        scene.wait(lambda: scene.get("configmaps", revision_maps()["fallback"]),
                   what="revision restored")
        scene.settle()
    assert scene.events("Restored")
    for plural, names in CHILDREN.items():
        assert scene.names(plural) == names


def test_a_child_the_watches_cannot_see_is_repaired_by_the_resync(scene: Scene) -> None:
    """The child watches see only objects with the operator's label (the API server filters
    them). A Service of someone else's blocks ours; when they delete it, no watch tells the
    operator, and only the periodic resync creates ours."""
    theirs = {"apiVersion": "v1", "kind": "Service",
              "metadata": {"name": "iris", "namespace": scene.namespace},
              "spec": {"selector": {"app": "other"}, "ports": [{"port": 80}]}}
    other_owner = scene.create({"apiVersion": "v1", "kind": "ConfigMap",
                                "metadata": {"name": "other", "namespace": scene.namespace}})
    theirs["metadata"]["ownerReferences"] = [{
        "apiVersion": "v1", "kind": "ConfigMap", "name": "other",
        "uid": other_owner["metadata"]["uid"], "controller": True}]
    scene.create(theirs)
    with scene.operator(resync=True):
        scene.create(example(namespace=scene.namespace))
        scene.wait(lambda: scene.condition("Ready").get("reason") == "ChildConflict",
                   what="ChildConflict")
        scene.settle()
        assert scene.must_get("services", "iris")["spec"]["selector"] == {"app": "other"}
        assert "Service/iris" in scene.condition("Ready")["message"]
        assert len(scene.events("ChildConflict")) == 1
        assert len(scene.list("deployments")) == 2
        scene.delete("services", "iris")
        scene.wait(lambda: (scene.get("services", "iris") or {}).get("spec", {}).get(
            "selector", {}).get(manifests.LABEL_ROLE) == "primary",
            what="our Service, from a resync", timeout=10 * RESYNC_SECONDS)
        scene.wait(lambda: scene.condition("Ready").get("status") == "True", what="Ready")
        scene.settle()


def test_a_write_the_api_server_refuses_shows_in_the_status(scene: Scene) -> None:
    """A ResourceQuota refuses the Deployments (403 Forbidden, exceeded quota): the refusal
    reaches the status and an Event, and once the quota goes the operator finishes."""
    scene.create({"apiVersion": "v1", "kind": "ResourceQuota",
                  "metadata": {"name": "no-deployments", "namespace": scene.namespace},
                  "spec": {"hard": {"count/deployments.apps": "0"}}})
    scene.wait(lambda: (scene.must_get("resourcequotas", "no-deployments").get("status") or {}
                        ).get("hard"), what="the quota to be counted")
    with scene.operator():
        scene.create(example(namespace=scene.namespace))
        scene.wait(lambda: scene.condition("Ready").get("reason") == "ChildRefused",
                   what="ChildRefused")
        message = scene.condition("Ready")["message"]
        assert "Deployment/iris-primary: 403 Forbidden" in message
        assert "exceeded quota" in message
        # The Event is posted after the status patch: wait for it, then count it.
        refused = scene.wait(lambda: scene.events("ChildRefused"), what="the ChildRefused Event")
        assert [e["type"] for e in refused] == ["Warning"]
        assert scene.names("services") == ["iris"]  # the rest was still made
        scene.delete("resourcequotas", "no-deployments")
        scene.wait(lambda: scene.condition("Ready").get("status") == "True", what="Ready")
        scene.settle()
    assert scene.names("deployments") == CHILDREN["deployments"]


def cordon(scene: Scene, unschedulable: bool) -> None:
    """Mark every node (un)schedulable, as ``kubectl cordon``/``uncordon`` does."""
    for node in scene.admin.list("nodes"):
        scene.admin.patch("nodes", None, node["metadata"]["name"],
                          {"spec": {"unschedulable": unschedulable or None}})


def rollback_cli(scene: Scene, role: str) -> subprocess.CompletedProcess[str]:
    """``tailguard rollback|rollforward iris --cluster -n NS`` as the admin."""
    command = "rollback" if role == "fallback" else "rollforward"
    tailguard = Path(sys.executable).with_name("tailguard")
    done = subprocess.run(
        [str(tailguard), command, "iris", "--cluster", "-n", scene.namespace],
        capture_output=True, text=True, timeout=60,
        env={"KUBECONFIG": str(scene.installation.cluster.admin.kubeconfig), "PATH": ""})
    assert done.returncode == 0, done.stderr
    return done


def roll_back_while_the_fallback_cannot_grow(scene: Scene) -> None:
    """The primary on 2 Ready pods, every node cordoned (new pods stay Pending), then
    ``tailguard rollback --cluster``: traffic must wait for a second fallback pod."""
    scene.admin.patch("deployments", scene.namespace, "iris-primary",
                      {"spec": {"replicas": 2}}, subresource="scale")
    scene.ready_deployment("iris-primary", 2)
    cordon(scene, True)
    rollback_cli(scene, "fallback")
    scene.wait(lambda: scene.condition("RolledBack").get("reason") == "WaitingForFallback",
               what="waiting condition")


@pytest.fixture
def cordoned(scene: Scene) -> Any:
    """Uncordons every node when the test ends, whatever happened."""
    yield
    cordon(scene, False)


def test_manual_rollback_moves_traffic_only_once_the_fallback_is_ready(
        scene: Scene, cordoned: None) -> None:
    with scene.operator():
        start(scene)
        roll_back_while_the_fallback_cannot_grow(scene)
        hpa = scene.must_get("horizontalpodautoscalers", "iris-fallback")
        assert hpa["spec"]["minReplicas"] == 2  # raised to carry the primary's load
        # The real HPA controller scales the fallback to its new minimum; one pod is Pending.
        scene.wait(lambda: scene.must_get("deployments", "iris-fallback")["spec"]["replicas"]
                   == 2, what="the HPA to scale the fallback", timeout=60)
        scene.wait(lambda: "1/2" in scene.condition("RolledBack").get("message", ""),
                   what="a pass that saw 1 Ready fallback")
        assert scene.selected_role() == "primary"
        assert active_in_config(scene) == "primary"
        assert scene.status()["activeModel"] == "primary"
        assert scene.condition("RolledBack")["status"] == "False"

        cordon(scene, False)
        scene.wait(lambda: scene.selected_role() == "fallback", what="selector on fallback")
        scene.wait(lambda: scene.condition("RolledBack").get("reason") == "ManualRollback",
                   what="rolled back")
        scene.settle()
        assert active_in_config(scene) == "fallback"
        assert scene.status()["activeModel"] == "fallback"
        assert scene.status()["replicaSummary"] == "2/2"
        # held at the two replicas traffic moved with, for the HPA's scale-down window (5 min)
        assert minimums(scene) == {"primary": 1, "fallback": 2}
        assert held(scene) == ("fallback", 2)
        assert len(scene.events("RolledBack")) == 1

        rollback_cli(scene, "primary")  # the primary is still Ready: at once
        scene.wait(lambda: scene.selected_role() == "primary", what="selector on primary")
        scene.wait(lambda: scene.condition("RolledBack").get("reason") == "OnPrimary",
                   what="rolled forward")
        scene.settle()
    assert active_in_config(scene) == "primary"
    assert len(scene.events("RolledForward")) == 1
    assert minimums(scene) == {"primary": 2, "fallback": 1}  # the hold moved with traffic
    assert held(scene) == ("primary", 2)
    deployments = scene.list("deployments")
    assert all(d["metadata"]["generation"] <= 2 for d in deployments)  # only scale changes
    assert len(set(checksums(scene).values())) == 2  # one per role; the switch rolled none


def minimums(scene: Scene) -> dict[str, int]:
    """Each role's HPA ``minReplicas``."""
    return {role: scene.must_get("horizontalpodautoscalers", f"iris-{role}")["spec"][
        "minReplicas"] for role in manifests.ROLES}


def held(scene: Scene) -> tuple[str, int] | None:
    """``status.minReplicasHold``'s role and replicas, if a hold is recorded."""
    hold = scene.status().get("minReplicasHold")
    return None if hold is None else (hold["role"], hold["replicas"])


def ready_pods(scene: Scene, role: str) -> dict[str, str]:
    """Name -> config checksum of each Ready pod of ``role``."""
    def ready(pod: dict[str, Any]) -> bool:
        return any(c.get("type") == "Ready" and c.get("status") == "True"
                   for c in (pod.get("status") or {}).get("conditions") or [])
    return {p["metadata"]["name"]: p["metadata"]["annotations"][CHECKSUM]
            for p in scene.list("pods")
            if p["metadata"]["labels"][manifests.LABEL_ROLE] == role and ready(p)
            and not p["metadata"].get("deletionTimestamp")}


def test_the_held_minimum_ends_after_the_hpas_scale_down_window(scene: Scene) -> None:
    """Traffic moves to a fallback raised to the primary's two pods; its HPA minimum stays at
    two for the scale-down window (5 s here, from ``scaling.behavior``), then the first pass
    after it (a resync) drops the minimum to ``minReplicas`` and removes the record."""
    behavior = {**BEHAVIOR, "scaleDown": {**BEHAVIOR["scaleDown"],
                                          "stabilizationWindowSeconds": 5}}
    with scene.operator(resync=True):
        start(scene, example(namespace=scene.namespace, scaling={
            "minReplicas": 1, "maxReplicas": 5, "behavior": behavior}))
        scene.admin.patch("deployments", scene.namespace, "iris-primary",
                          {"spec": {"replicas": 2}}, subresource="scale")
        scene.ready_deployment("iris-primary", 2)
        rollback_cli(scene, "fallback")
        scene.wait(lambda: scene.selected_role() == "fallback", what="selector on fallback",
                   timeout=60)
        scene.wait(lambda: held(scene) == ("fallback", 2), what="the hold recorded")
        assert minimums(scene) == {"primary": 1, "fallback": 2}
        scene.wait(lambda: held(scene) is None, what="the hold to end", timeout=30)
        scene.wait(lambda: minimums(scene) == {"primary": 1, "fallback": 1},
                   what="the fallback's minimum back to 1")
    assert scene.selected_role() == "fallback"


def test_rolling_forward_to_a_new_model_waits_for_the_new_models_pods(
        scene: Scene, cordoned: None) -> None:
    """Traffic on the fallback; a person changes the primary's model and rolls forward while
    no new pod can start. The old model's pods are Ready, but they serve the old model: traffic
    stays on the fallback until a pod of the new template is Ready."""
    with scene.operator():
        start(scene)
        rollback_cli(scene, "fallback")
        fields = scene.must_get(resource.PLURAL, "iris")["metadata"]["managedFields"]
        assert any(f["manager"] == "tailguard-cli" and "f:traffic" in json.dumps(f)
                   for f in fields), fields  # who set spec.traffic
        scene.wait(lambda: scene.selected_role() == "fallback", what="selector on fallback")
        scene.settle()
        old = checksums(scene)["iris-primary"]
        cordon(scene, True)
        scene.patch(resource.PLURAL, "iris", {"spec": {
            "model": {"uri": "builtin://iris/random-forest?trees=50"}, "traffic": "primary"}})
        scene.first_status(generation=3)
        new = checksums(scene)["iris-primary"]
        assert new != old
        scene.wait(lambda: scene.must_get("deployments", "iris-primary")["status"].get(
            "updatedReplicas") == 1, what="the new model's pod (Pending)")
        scene.settle()
        mark = scene.audit.mark()  # a wait is not an error: nothing is retried, nothing written
        time.sleep(5)  # ten of the retry delays (0.5 s) the scene gives the operator
        assert scene.writes(mark) == []
        assert set(ready_pods(scene, "primary").values()) == {old}  # the old model serves
        assert scene.selected_role() == "fallback"
        assert scene.status()["activeModel"] == "fallback"
        assert active_in_config(scene) == "fallback"
        assert scene.condition("RolledBack")["reason"] == "WaitingForPrimary"
        assert not scene.events("RolledForward")

        cordon(scene, False)
        scene.wait(lambda: scene.selected_role() == "primary", what="selector on primary",
                   timeout=60)
        assert new in ready_pods(scene, "primary").values()
        scene.wait(lambda: scene.condition("RolledBack").get("reason") == "OnPrimary",
                   what="rolled forward")
        scene.settle()
    assert active_in_config(scene) == "primary"
    assert len(scene.events("RolledForward")) == 1


def test_an_operator_restart_in_the_middle_of_a_rollback(scene: Scene, cordoned: None) -> None:
    with scene.operator():
        start(scene)
        roll_back_while_the_fallback_cannot_grow(scene)
    assert scene.selected_role() == "primary"
    cordon(scene, False)  # while no operator runs, the fallback's pods become Ready
    scene.wait(lambda: scene.must_get("deployments", "iris-fallback")["spec"]["replicas"] == 2,
               what="the HPA to scale the fallback", timeout=60)
    scene.ready_deployment("iris-fallback", 2)
    assert scene.selected_role() == "primary"  # nobody moved traffic meanwhile
    with scene.operator():
        scene.wait(lambda: scene.selected_role() == "fallback", what="selector on fallback")
        scene.wait(lambda: scene.condition("RolledBack").get("reason") == "ManualRollback",
                   what="rolled back")
        scene.settle()
    assert active_in_config(scene) == "fallback"
    assert len(scene.events("RolledBack")) == 1


def test_a_restart_neither_duplicates_nor_loses_anything(scene: Scene) -> None:
    with scene.operator():
        start(scene)
    before = {plural: {o["metadata"]["name"]: o for o in scene.children(plural)}
              for plural in CHILDREN}
    # While the operator is down: a new InferenceService, and a child of the old one deleted.
    scene.create(example("digits", namespace=scene.namespace))
    scene.delete("poddisruptionbudgets", "iris-fallback")
    mark = scene.audit.mark()
    with scene.operator():
        scene.first_status("digits")
        scene.wait(lambda: scene.get("poddisruptionbudgets", "iris-fallback"),
                   what="the deleted child")
        scene.settle()
    writes = scene.child_writes(mark)
    assert all(w.verb == "create" for w in writes), writes
    digits = resource.parse(example("digits"))
    assert sorted(w.body["metadata"]["name"] for w in writes) == sorted(
        [f"digits-{suffix}" for suffix in ("traffic", "primary", "fallback", "primary",
                                           "fallback", "primary", "fallback")]
        + [manifests.config_map_name("digits", role, manifests.config_checksum(digits, role))
           for role in manifests.ROLES]
        + ["digits", "iris-fallback"])
    for plural, objects in before.items():
        after = {o["metadata"]["name"]: o for o in scene.children(plural)
                 if o["metadata"]["name"].startswith("iris")}
        if plural == "poddisruptionbudgets":
            assert after["iris-fallback"]["metadata"]["uid"] != \
                objects["iris-fallback"]["metadata"]["uid"]
            after.pop("iris-fallback"), objects.pop("iris-fallback")
        for name, obj in objects.items():  # untouched: same uid, no new generation
            assert after[name]["metadata"]["uid"] == obj["metadata"]["uid"]
            assert after[name]["metadata"].get("generation") == \
                obj["metadata"].get("generation")


def test_a_condition_another_writer_sets_in_between_is_not_lost(
        scene: Scene, monkeypatch: pytest.MonkeyPatch) -> None:
    """One pass, run here as the operator's ServiceAccount, while another writer sets a
    condition of its own between the pass's read and its status write (with server-side apply,
    under its own field manager). The pass's first write fails its resourceVersion
    precondition (409); it reads the status again and keeps the other writer's condition."""
    with scene.operator():
        start(scene)
    scene.patch(resource.PLURAL, "iris", {"spec": {"scaling": {"maxReplicas": 4}}})
    theirs = {"type": "ExampleCheck", "status": "True", "reason": "Checked",
              "message": "set by another writer", "lastTransitionTime": "2026-01-01T00:00:00Z"}
    path = scene.admin.path(resource.PLURAL, scene.namespace, "iris") + "/status"
    real = kube.patch_status
    writes: list[dict[str, Any]] = []

    def racing(namespace: str, name: str, patch: dict[str, Any],
               **kwargs: Any) -> dict[str, Any]:
        if not writes:  # the other writer comes in between, once
            scene.admin.request("PATCH", path, {
                "apiVersion": resource.API_VERSION, "kind": resource.KIND,
                "metadata": {"name": "iris", "namespace": scene.namespace},
                "status": {"conditions": [theirs]}}, "application/apply-patch+yaml",
                query={"fieldManager": "another-writer", "force": "true"})
        writes.append(patch)
        return real(namespace, name, patch, **kwargs)

    monkeypatch.setattr(kube, "patch_status", racing)
    kube.connect(kubeconfig=str(scene.installation.identity.kubeconfig))
    handlers.reconcile_service(scene.namespace, "iris",
                               OperatorSettings.from_env(scene.installation.environment()))
    assert len(writes) == 2, writes  # the first failed its precondition
    status = scene.status()
    assert status["observedGeneration"] == 2
    assert {c["type"]: c["message"] for c in status["conditions"]}["ExampleCheck"] == \
        "set by another writer"
    assert scene.condition("Ready")["status"] == "True"


def test_an_operator_only_refusal_gets_a_condition_not_a_crash_loop(scene: Scene) -> None:
    """The CRD accepts a file:// model without sha256 (``tailguard up`` serves it), but the
    operator refuses it: it cannot inspect a file inside an image."""
    body = example(namespace=scene.namespace, model={"uri": "file:///models/iris.joblib"})
    with scene.operator(resync=True):
        scene.create(body)
        scene.wait(lambda: scene.condition("Ready").get("reason") == "InvalidSpec",
                   what="InvalidSpec")
        scene.settle(quiet=1.5)
        mark = scene.audit.mark()
        scene.settle(quiet=2 * RESYNC_SECONDS)
        assert scene.writes(mark) == []  # no retries write anything
        assert "spec.model.sha256" in scene.condition("Ready")["message"]
        assert scene.condition("Ready")["status"] == "False"
        assert all(scene.children(plural) == [] for plural in CHILDREN)
        assert [e["type"] for e in scene.events("InvalidSpec")] == ["Warning"]

        scene.patch(resource.PLURAL, "iris", {"spec": {"model": {"sha256": "ab" * 32}}})
        scene.wait(lambda: scene.names("deployments") == CHILDREN["deployments"],
                   what="reconciled once fixed")
        scene.settle()


def test_deleting_needs_no_operator_and_the_garbage_collector_takes_the_children(
        scene: Scene) -> None:
    with scene.operator():
        start(scene)
    scene.delete(resource.PLURAL, "iris")  # the operator is down: no finalizer holds it
    assert scene.get(resource.PLURAL, "iris") is None
    scene.wait(lambda: all(scene.children(plural) == [] for plural in CHILDREN),
               what="the garbage collector to delete every child", timeout=60)
    scene.wait(lambda: scene.list("pods") == [], what="pods gone", timeout=60)
    mark = scene.audit.mark()
    with scene.operator(resync=True):
        scene.settle(quiet=2 * RESYNC_SECONDS)
    assert scene.writes(mark) == []  # nothing resurrected, by a resume or a resync
    assert all(scene.children(plural) == [] for plural in CHILDREN)


def test_a_cluster_wide_operator_serves_every_namespace(scene: Scene) -> None:
    other = f"{scene.namespace[:50]}-b"
    scene.admin.create({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": other}})
    try:
        body = example(namespace=other)
        with scene.operator():  # the chart's default: every namespace
            scene.admin.create(body, other)
            scene.wait(lambda: (scene.admin.get(resource.PLURAL, other, "iris") or {}).get(
                "status", {}).get("url"), what="status in the other namespace")
            scene.admin.delete("services", other, "iris")
            scene.wait(lambda: scene.admin.get("services", other, "iris"),
                       what="restored Service")
        stored = scene.admin.get(resource.PLURAL, other, "iris")
        assert stored is not None
        assert stored["status"]["url"] == f"http://iris.{other}.svc/v2/models/iris/infer"
        assert len(scene.admin.list("deployments", other)) == 2
    finally:
        scene.admin.delete("namespaces", None, other)


def test_tailguard_status_cluster_reads_what_the_operator_wrote(scene: Scene) -> None:
    tailguard = Path(sys.executable).with_name("tailguard")
    env = {"KUBECONFIG": str(scene.installation.cluster.admin.kubeconfig), "PATH": ""}

    def status() -> subprocess.CompletedProcess[str]:
        return subprocess.run([str(tailguard), "status", "iris", "--cluster", "-n",
                               scene.namespace], capture_output=True, text=True, timeout=60,
                              env=env)

    scene.create(example(namespace=scene.namespace))
    early = status()  # no operator yet: no status, and it says so
    assert early.returncode == 0 and "no status yet" in early.stdout, early.stderr
    with scene.operator():
        scene.wait(lambda: scene.condition("Ready").get("status") == "True", what="Ready")
        done = status()
    assert done.returncode == 0, done.stderr
    assert f"{scene.namespace}/iris: traffic -> primary (intent primary)" in done.stdout
    assert f"url: http://iris.{scene.namespace}.svc/v2/models/iris/infer" in done.stdout
    assert "Ready=True (Serving)" in done.stdout
    assert "not in the status yet" in done.stdout  # no invented numbers
    missing = subprocess.run([str(tailguard), "status", "nope", "--cluster", "-n",
                              scene.namespace], capture_output=True, text=True, timeout=60,
                             env=env)
    assert missing.returncode != 0 and len(missing.stderr.strip().splitlines()) == 1
