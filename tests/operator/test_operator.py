"""The real kopf operator against the fake Kubernetes API, asserting the stored objects.

Each test starts the operator (``kopf run -m tailguard_operator.handlers``) in a thread, acts as
a user or as the cluster's controllers would (creating and editing objects, reporting Ready
replicas), waits for the operator to go quiet, and checks what the API server holds and which
write requests it received.
"""

from __future__ import annotations

import json
from typing import Any, Callable

import pytest
from fakeapi import FakeApiServer
from harness import (NAMESPACE, assert_contracts, child_writes, condition, events, example,
                     make_ready, must_get, settle, status_of, wait_for)

from tailguard_operator import kube, manifests, spec

CHILDREN = {
    "configmaps": ["iris-runtime"],
    "deployments": ["iris-fallback", "iris-primary"],
    "services": ["iris"],
    "horizontalpodautoscalers": ["iris-fallback", "iris-primary"],
    "poddisruptionbudgets": ["iris-fallback", "iris-primary"],
}


def start(fake: FakeApiServer, body: dict[str, Any] | None = None) -> dict[str, Any]:
    """Create an InferenceService and wait until the operator has written its status."""
    created = fake.create(NAMESPACE, body or example())
    name = created["metadata"]["name"]
    wait_for(lambda: status_of(fake, name).get("observedGeneration") == 1, what="first status")
    settle(fake)
    return created


def selected_role(fake: FakeApiServer, name: str = "iris") -> str:
    service = fake.get("services", NAMESPACE, name)
    assert service is not None
    return service["spec"]["selector"][manifests.LABEL_ROLE]  # type: ignore[no-any-return]


def active_in_config(fake: FakeApiServer) -> str:
    config = fake.get("configmaps", NAMESPACE, "iris-runtime")
    assert config is not None
    return json.loads(config["data"]["runtime.json"])["activeModel"]  # type: ignore[no-any-return]


def test_create_makes_every_child_with_a_controller_owner_reference(
        fake: FakeApiServer, operator: Callable[..., Any]) -> None:
    with operator():
        owner = start(fake)
    uid = owner["metadata"]["uid"]
    for plural, names in CHILDREN.items():
        stored = fake.list(plural, NAMESPACE)
        assert sorted(o["metadata"]["name"] for o in stored) == names
        for obj in stored:
            assert obj["metadata"]["ownerReferences"] == [{
                "apiVersion": spec.API_VERSION, "kind": spec.KIND, "name": "iris", "uid": uid,
                "controller": True, "blockOwnerDeletion": True}]
            assert obj["metadata"]["labels"][manifests.LABEL_MANAGED_BY] == "tailguard-operator"
    assert selected_role(fake) == "primary"
    status = status_of(fake)
    assert status["activeModel"] == "primary"
    assert status["url"] == "http://iris.default.svc/v2/models/iris/infer"
    assert status["replicaSummary"] == "0/1"
    assert condition(fake, "Ready")["reason"] == "NoReadyReplicas"
    assert condition(fake, "SLOMet")["status"] == "Unknown"
    assert [e["involvedObject"]["uid"] for e in events(fake, "Created")] == [uid]
    assert all(r.content_type == "application/merge-patch+json"
               for r in fake.requests if r.method == "PATCH")
    assert_contracts(fake)


def test_readiness_reaches_the_status(fake: FakeApiServer, operator: Callable[..., Any]) -> None:
    with operator():
        start(fake)
        make_ready(fake, "iris-primary", 1)
        wait_for(lambda: condition(fake, "Ready").get("status") == "True", what="Ready")
        settle(fake)
    assert condition(fake, "PrimaryReady")["status"] == "True"
    assert condition(fake, "FallbackReady")["status"] == "False"
    assert status_of(fake)["replicas"]["primary"] == {"desired": 1, "ready": 1}
    assert status_of(fake)["replicaSummary"] == "1/1"
    assert_contracts(fake)


def test_a_spec_change_patches_exactly_what_changed(
        fake: FakeApiServer, operator: Callable[..., Any]) -> None:
    with operator():
        start(fake)
        mark = len(fake.requests)
        fake.patch(spec.PLURAL, NAMESPACE, "iris", {"spec": {"scaling": {"maxReplicas": 7}}})
        wait_for(lambda: status_of(fake).get("observedGeneration") == 2, what="generation 2")
        settle(fake)
        writes = child_writes(fake, mark)
        assert sorted(r.path.rsplit("/", 1)[1] for r in writes) == ["iris-fallback", "iris-primary"]
        assert all("horizontalpodautoscalers" in r.path for r in writes)
        assert [r.body for r in writes] == [{"spec": {"maxReplicas": 7}}] * 2

        mark = len(fake.requests)
        fake.patch(spec.PLURAL, NAMESPACE, "iris", {"spec": {"batching": {"maxBatchSize": 8}}})
        wait_for(lambda: status_of(fake).get("observedGeneration") == 3, what="generation 3")
        settle(fake)
        writes = child_writes(fake, mark)
    config = fake.get("configmaps", NAMESPACE, "iris-runtime")
    assert config is not None
    checksum = must_get(fake, "deployments", "iris-primary")["spec"]["template"][
        "metadata"]["annotations"][manifests.CHECKSUM_ANNOTATION]
    assert json.loads(config["data"]["runtime.json"])["batching"]["maxBatchSize"] == 8
    assert sorted((r.path.split("/")[-2], r.path.split("/")[-1]) for r in writes) == [
        ("configmaps", "iris-runtime"), ("deployments", "iris-fallback"),
        ("deployments", "iris-primary")]
    for record in writes:
        if "deployments" in record.path:
            assert record.body == {"spec": {"template": {"metadata": {"annotations": {
                manifests.CHECKSUM_ANNOTATION: checksum}}}}}
        else:
            assert record.body == {"data": config["data"]}
    assert_contracts(fake)


def test_a_quiet_resync_writes_nothing(fake: FakeApiServer, operator: Callable[..., Any]) -> None:
    with operator():
        start(fake)
        mark = len(fake.requests)
        # An annotation is part of what kopf compares: this runs the update handler in full.
        fake.patch(spec.PLURAL, NAMESPACE, "iris",
                   {"metadata": {"annotations": {"example.com/owner": "team-a"}}})
        wait_for(lambda: any(r.method == "GET" and r.path.endswith("/iris-runtime")
                             for r in fake.requests[mark:]), what="a reconcile pass")
        settle(fake)
    assert child_writes(fake, mark) == []
    assert [r for r in fake.requests[mark:] if r.path.endswith("/status")] == []
    assert_contracts(fake)


def test_replicas_set_by_the_autoscaler_survive(
        fake: FakeApiServer, operator: Callable[..., Any]) -> None:
    with operator():
        start(fake)
        fake.patch("deployments", NAMESPACE, "iris-primary", {"spec": {"replicas": 4}})
        settle(fake)
        fake.patch(spec.PLURAL, NAMESPACE, "iris",
                   {"spec": {"model": {"uri": "builtin://iris/random-forest?trees=50"}}})
        wait_for(lambda: status_of(fake).get("observedGeneration") == 2, what="generation 2")
        settle(fake)
    primary = fake.get("deployments", NAMESPACE, "iris-primary")
    assert primary is not None and primary["spec"]["replicas"] == 4
    patches = [r for r in child_writes(fake) if r.method == "PATCH"]
    assert patches and all("replicas" not in (r.body.get("spec") or {}) for r in patches)
    assert "trees=50" in must_get(fake, "configmaps", "iris-runtime")["data"]["runtime.json"]
    assert_contracts(fake)


def test_labels_and_annotations_added_by_others_survive(
        fake: FakeApiServer, operator: Callable[..., Any]) -> None:
    foreign = {"metadata": {"labels": {"team": "search"},
                            "annotations": {"example.com/cost-center": "42"}}}
    restarted = {"spec": {"template": {"metadata": {"annotations": {
        "kubectl.kubernetes.io/restartedAt": "2025-01-01T00:00:00Z"}}}}}
    with operator():
        start(fake)
        mark = len(fake.requests)
        for plural, name in (("services", "iris"), ("deployments", "iris-primary"),
                             ("horizontalpodautoscalers", "iris-primary")):
            fake.patch(plural, NAMESPACE, name, foreign)
        fake.patch("deployments", NAMESPACE, "iris-primary", restarted)
        settle(fake)
        assert child_writes(fake, mark) == []
        fake.patch(spec.PLURAL, NAMESPACE, "iris", {"spec": {"batching": {"maxBatchSize": 16},
                                                             "scaling": {"maxReplicas": 3}}})
        wait_for(lambda: status_of(fake).get("observedGeneration") == 2, what="generation 2")
        settle(fake)
    for plural, name in (("services", "iris"), ("deployments", "iris-primary"),
                         ("horizontalpodautoscalers", "iris-primary")):
        meta = must_get(fake, plural, name)["metadata"]
        assert meta["labels"]["team"] == "search"
        assert meta["annotations"]["example.com/cost-center"] == "42"
    template = must_get(fake, "deployments", "iris-primary")["spec"]["template"]
    assert template["metadata"]["annotations"]["kubectl.kubernetes.io/restartedAt"]
    assert must_get(fake, "horizontalpodautoscalers", "iris-primary")["spec"][
        "maxReplicas"] == 3
    assert_contracts(fake)


def test_children_deleted_or_edited_by_hand_are_restored(
        fake: FakeApiServer, operator: Callable[..., Any]) -> None:
    with operator():
        start(fake)
        fake.delete("deployments", NAMESPACE, "iris-fallback")
        fake.delete("services", NAMESPACE, "iris")
        wait_for(lambda: fake.get("deployments", NAMESPACE, "iris-fallback")
                 and fake.get("services", NAMESPACE, "iris"), what="restored children")
        fake.patch("services", NAMESPACE, "iris",
                   {"spec": {"selector": {manifests.LABEL_ROLE: "fallback"}}})
        fake.patch("horizontalpodautoscalers", NAMESPACE, "iris-primary",
                   {"spec": {"maxReplicas": 50}})
        fake.patch("configmaps", NAMESPACE, "iris-runtime", {"data": {"runtime.json": "{}"}})
        wait_for(lambda: selected_role(fake) == "primary", what="selector restored")
        settle(fake)
    assert must_get(fake, "horizontalpodautoscalers", "iris-primary")["spec"][
        "maxReplicas"] == 5
    assert active_in_config(fake) == "primary"
    assert events(fake, "Restored")
    for plural, names in CHILDREN.items():
        assert sorted(o["metadata"]["name"] for o in fake.list(plural, NAMESPACE)) == names
    assert_contracts(fake)


def test_manual_rollback_moves_traffic_only_once_the_fallback_is_ready(
        fake: FakeApiServer, operator: Callable[..., Any]) -> None:
    with operator():
        start(fake)
        make_ready(fake, "iris-primary", 2)
        wait_for(lambda: condition(fake, "Ready").get("status") == "True", what="Ready")

        kube.set_traffic("iris", NAMESPACE, "fallback")  # what `tailguard rollback --cluster` does
        wait_for(lambda: condition(fake, "RolledBack").get("reason") == "WaitingForFallback",
                 what="waiting condition")
        hpa = fake.get("horizontalpodautoscalers", NAMESPACE, "iris-fallback")
        assert hpa is not None and hpa["spec"]["minReplicas"] == 2  # raised to carry the load
        make_ready(fake, "iris-fallback", 1)  # not enough: the primary serves with 2
        # The handler retries every 0.5 s meanwhile (TemporaryError), so wait for a pass.
        wait_for(lambda: "1/2" in condition(fake, "RolledBack").get("message", ""),
                 what="a pass that saw 1 Ready fallback")
        assert selected_role(fake) == "primary"
        assert active_in_config(fake) == "primary"
        assert status_of(fake)["activeModel"] == "primary"
        assert condition(fake, "RolledBack")["status"] == "False"

        make_ready(fake, "iris-fallback", 2)
        wait_for(lambda: selected_role(fake) == "fallback", what="selector on fallback")
        wait_for(lambda: condition(fake, "RolledBack").get("reason") == "ManualRollback",
                 what="rolled back")
        settle(fake)
        assert active_in_config(fake) == "fallback"
        assert status_of(fake)["activeModel"] == "fallback"
        assert status_of(fake)["replicaSummary"] == "2/1"
        hpa = fake.get("horizontalpodautoscalers", NAMESPACE, "iris-fallback")
        assert hpa is not None and hpa["spec"]["minReplicas"] == 1
        assert len(events(fake, "RolledBack")) == 1

        kube.set_traffic("iris", NAMESPACE, "primary")  # the primary is still Ready: at once
        wait_for(lambda: selected_role(fake) == "primary", what="selector on primary")
        wait_for(lambda: condition(fake, "RolledBack").get("reason") == "OnPrimary",
                 what="rolled forward")
        settle(fake)
    assert active_in_config(fake) == "primary"
    assert len(events(fake, "RolledForward")) == 1
    deployments = {d["metadata"]["name"]: d for d in fake.list("deployments", NAMESPACE)}
    checksums = {d["spec"]["template"]["metadata"]["annotations"][manifests.CHECKSUM_ANNOTATION]
                 for d in deployments.values()}
    assert len(checksums) == 1  # switching traffic rolled no pods
    assert all(d["metadata"]["generation"] == 1 for d in deployments.values())
    assert_contracts(fake)


def test_a_restart_neither_duplicates_nor_loses_anything(
        fake: FakeApiServer, operator: Callable[..., Any]) -> None:
    with operator():
        start(fake)
    before = {plural: {o["metadata"]["name"]: o for o in fake.list(plural, NAMESPACE)}
              for plural in CHILDREN}
    # While the operator is down: a new InferenceService, and a child of the old one deleted.
    fake.create(NAMESPACE, example("digits"))
    fake.delete("poddisruptionbudgets", NAMESPACE, "iris-fallback")
    mark = len(fake.requests)
    with operator():
        wait_for(lambda: status_of(fake, "digits").get("observedGeneration"), what="digits")
        wait_for(lambda: fake.get("poddisruptionbudgets", NAMESPACE, "iris-fallback"),
                 what="the deleted child")
        settle(fake)
    writes = child_writes(fake, mark)
    assert sorted(r.body["metadata"]["name"] for r in writes) == sorted(
        [f"digits-{suffix}" for suffix in ("runtime", "primary", "fallback", "primary",
                                           "fallback", "primary", "fallback")]
        + ["digits", "iris-fallback"])
    assert all(r.method == "POST" for r in writes)
    for plural, objects in before.items():
        after = {o["metadata"]["name"]: o for o in fake.list(plural, NAMESPACE)
                 if o["metadata"]["name"].startswith("iris")}
        if plural == "poddisruptionbudgets":
            assert after["iris-fallback"]["metadata"]["uid"] != \
                objects["iris-fallback"]["metadata"]["uid"]
            after.pop("iris-fallback"), objects.pop("iris-fallback")
        assert after == objects  # same uids, same resourceVersions: untouched
        assert len(fake.list(plural, NAMESPACE)) == 2 * len(CHILDREN[plural])  # iris + digits
    assert_contracts(fake)


def test_an_invalid_spec_gets_a_condition_not_a_crash_loop(
        fake: FakeApiServer, operator: Callable[..., Any]) -> None:
    bad = example(batching={"maxWaitMs": 30})  # the SLO is 25 ms: the CRD's CEL rule refuses it
    with operator():
        fake.create(NAMESPACE, bad)
        wait_for(lambda: condition(fake, "Ready").get("reason") == "InvalidSpec",
                 what="InvalidSpec")
        settle(fake, quiet=1.5)
        mark = len(fake.requests)
        settle(fake, quiet=1.0)
        assert len(fake.requests) == mark  # no retries
        assert "spec.batching.maxWaitMs" in condition(fake, "Ready")["message"]
        assert condition(fake, "Ready")["status"] == "False"
        assert all(fake.list(plural, NAMESPACE) == [] for plural in CHILDREN)
        assert [e["type"] for e in events(fake, "InvalidSpec")] == ["Warning"]

        fake.patch(spec.PLURAL, NAMESPACE, "iris", {"spec": {"batching": {"maxWaitMs": 2}}})
        wait_for(lambda: condition(fake, "Ready").get("reason") == "NoReadyReplicas",
                 what="reconciled once fixed")
        settle(fake)
    assert sorted(o["metadata"]["name"] for o in fake.list("deployments", NAMESPACE)) == \
        CHILDREN["deployments"]
    assert_contracts(fake)


def test_a_file_model_without_checksum_is_refused_in_the_cluster(
        fake: FakeApiServer, operator: Callable[..., Any]) -> None:
    body = example(model={"uri": "file:///models/iris.joblib"})
    with operator():
        fake.create(NAMESPACE, body)
        wait_for(lambda: condition(fake, "Ready").get("reason") == "InvalidSpec",
                 what="InvalidSpec")
        settle(fake)
    assert "spec.model.sha256" in condition(fake, "Ready")["message"]
    assert fake.list("deployments", NAMESPACE) == []
    assert_contracts(fake)


def test_deleting_needs_no_operator_and_gone_owners_are_not_resurrected(
        fake: FakeApiServer, operator: Callable[..., Any]) -> None:
    with operator():
        start(fake)
        fake.delete(spec.PLURAL, NAMESPACE, "iris")
        assert fake.get(spec.PLURAL, NAMESPACE, "iris") is None  # no finalizer held it
        mark = len(fake.requests)
        fake.delete("deployments", NAMESPACE, "iris-primary")  # as the garbage collector would
        settle(fake)
        assert fake.get("deployments", NAMESPACE, "iris-primary") is None
        assert child_writes(fake, mark) == []
    assert_contracts(fake)


def test_a_child_owned_by_someone_else_is_left_alone(
        fake: FakeApiServer, operator: Callable[..., Any]) -> None:
    theirs = {"apiVersion": "v1", "kind": "Service",
              "metadata": {"name": "iris", "namespace": NAMESPACE, "ownerReferences": [{
                  "apiVersion": "apps/v1", "kind": "Deployment", "name": "other",
                  "uid": "0000", "controller": True}]},
              "spec": {"selector": {"app": "other"}, "ports": [{"port": 80}]}}
    fake.create(NAMESPACE, theirs)
    with operator():
        fake.create(NAMESPACE, example())
        wait_for(lambda: condition(fake, "Ready").get("reason") == "ChildConflict",
                 what="ChildConflict")
        settle(fake)
    service = fake.get("services", NAMESPACE, "iris")
    assert service is not None and service["spec"]["selector"] == {"app": "other"}
    assert "Service/iris" in condition(fake, "Ready")["message"]
    assert len(fake.list("deployments", NAMESPACE)) == 2
    assert_contracts(fake)


def test_a_cluster_wide_operator_serves_every_namespace(
        fake: FakeApiServer, operator: Callable[..., Any]) -> None:
    fake.create(None, {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "team-a"}})
    body = example()
    body["metadata"]["namespace"] = "team-a"
    with operator(["run", "--standalone", "--all-namespaces", "-m",
                   "tailguard_operator.handlers"]):
        fake.create("team-a", body)
        wait_for(lambda: (fake.get(spec.PLURAL, "team-a", "iris") or {}).get("status"),
                 what="status in team-a")
        fake.delete("services", "team-a", "iris")
        wait_for(lambda: fake.get("services", "team-a", "iris"), what="restored Service")
        settle(fake)
    assert len(fake.list("deployments", "team-a")) == 2
    assert fake.list("deployments", NAMESPACE) == []
    stored = fake.get(spec.PLURAL, "team-a", "iris")
    assert stored is not None
    assert stored["status"]["url"] == "http://iris.team-a.svc/v2/models/iris/infer"
    assert_contracts(fake)


def test_run_operator_hands_kopf_its_scope(monkeypatch: pytest.MonkeyPatch) -> None:
    """``tailguard operator`` is kopf.run with the namespaces, peering and settings given."""
    import kopf

    from tailguard_operator import handlers
    from tailguard_operator.settings import OperatorSettings

    calls: list[dict[str, Any]] = []
    monkeypatch.setattr(kopf, "configure", lambda **kwargs: None)
    monkeypatch.setattr(kopf, "run", lambda **kwargs: calls.append(kwargs))
    settings = OperatorSettings(runtime_image="registry.example/rt:1")
    handlers.run_operator(["team-a", "team-b"], settings=settings)
    handlers.run_operator(None, peering="tailguard", liveness_endpoint="http://0.0.0.0:8080/h")
    first, second = calls
    assert (first["clusterwide"], first["namespaces"], first["standalone"]) == \
        (False, ["team-a", "team-b"], True)
    assert first["memo"].tailguard == settings
    assert (second["clusterwide"], second["standalone"], second["peering_name"]) == \
        (True, False, "tailguard")
    assert second["liveness_endpoint"] == "http://0.0.0.0:8080/h"
