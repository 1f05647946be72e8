"""The operator's API client module against the real API server: dicts in and out, merge
patches, the status subresource, and errors that say what happened."""

from __future__ import annotations

import datetime
import logging
from pathlib import Path
from typing import Iterator

import pytest
import yaml

from harness.kube.client import Client
from harness.kube.controlplane import ControlPlane
from harness.kube.install import Installation
from harness.scene import example
from tailguard.operator import events, kube
from tailguard.spec import resource

NOW = datetime.datetime(2026, 1, 1, tzinfo=datetime.timezone.utc)


@pytest.fixture
def connected(cluster: ControlPlane, installed: Installation, namespace: str,
              monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """:mod:`kube` connected as the admin, through ``$KUBECONFIG``; yields the namespace."""
    monkeypatch.setenv("KUBECONFIG", str(cluster.admin.kubeconfig))
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    creds = kube.connect()
    assert creds.server == cluster.url and creds.certificate_path
    yield namespace


def test_reads_and_writes_round_trip(connected: str) -> None:
    config_map = {"apiVersion": "v1", "kind": "ConfigMap",
                  "metadata": {"name": "c", "namespace": connected}, "data": {"a": "1"}}
    stored = kube.create(config_map)
    assert stored["metadata"]["uid"]
    assert kube.get("ConfigMap", connected, "c") == stored
    patched = kube.merge_patch("ConfigMap", connected, "c", {"data": {"a": None, "b": "2"}})
    assert patched["data"] == {"b": "2"}  # null removes a key: a merge patch, not a JSON patch
    assert kube.get("ConfigMap", connected, "missing") is None


def test_listing_one_namespace_or_all_by_label(connected: str, admin: Client) -> None:
    items, version = kube.list_objects(resource.KIND, connected)
    assert items == [] and version.isdigit()
    admin.create(example(namespace=connected))
    items, _ = kube.list_objects(resource.KIND, connected)
    assert [(i["kind"], i["apiVersion"], i["metadata"]["name"]) for i in items] == [
        (resource.KIND, resource.API_VERSION, "iris")]
    everywhere, _ = kube.list_objects(resource.KIND, None)
    assert (connected, "iris") in {(i["metadata"]["namespace"], i["metadata"]["name"])
                                   for i in everywhere}
    for name, labels in (("plain", {}), ("ours", {"app": "x"})):
        kube.create({"apiVersion": "v1", "kind": "ConfigMap",
                     "metadata": {"name": name, "namespace": connected, "labels": labels}})
    labelled, _ = kube.list_objects("ConfigMap", connected, "app=x")
    assert [(i["kind"], i["apiVersion"], i["metadata"]["name"]) for i in labelled] == [
        ("ConfigMap", "v1", "ours")]


def test_errors_carry_their_status(connected: str) -> None:
    config_map = {"apiVersion": "v1", "kind": "ConfigMap",
                  "metadata": {"name": "c", "namespace": connected}}
    kube.create(config_map)
    with pytest.raises(kube.Conflict) as conflict:
        kube.create(config_map)
    assert (conflict.value.status, conflict.value.reason) == (409, "AlreadyExists")
    with pytest.raises(kube.NotFound):
        kube.merge_patch("Deployment", connected, "nope", {"spec": {}})
    with pytest.raises(kube.KubeError) as invalid:
        kube.merge_patch("ConfigMap", connected, "c", {"data": {"a": 1}})
    assert (invalid.value.status, invalid.value.reason) == (422, "Invalid")
    with pytest.raises(kube.KubeError) as refused:
        kube.create({**config_map, "metadata": {"name": "Bad_Name", "namespace": connected}})
    assert (refused.value.status, refused.value.reason) == (422, "Invalid")
    assert "metadata.name" in str(refused.value)
    with pytest.raises(ValueError, match="unsupported kind"):
        kube.get("Secret", connected, "x")


def test_set_traffic_patches_the_intent_and_the_status_is_separate(
        connected: str, admin: Client) -> None:
    admin.create(example(namespace=connected))
    assert kube.set_traffic("iris", connected, "fallback")["spec"]["traffic"] == "fallback"
    stored = kube.patch_status(connected, "iris", {"status": {"activeModel": "primary"},
                                                   "spec": {"traffic": "primary"}})
    assert stored["spec"]["traffic"] == "fallback"  # a status write changes nothing else
    assert stored["status"] == {"activeModel": "primary"}
    assert stored["metadata"]["generation"] == 2  # the status write is no new generation
    with pytest.raises(kube.KubeError) as refused:  # the CRD's schema guards the status too
        kube.patch_status(connected, "iris", {"status": {"activeModel": "canary"}})
    assert refused.value.status == 422 and "activeModel" in str(refused.value)
    with pytest.raises(ValueError, match="role"):
        kube.set_traffic("iris", connected, "canary")
    with pytest.raises(kube.NotFound):
        kube.set_traffic("nope", connected, "fallback")


def test_the_namespace_defaults_to_the_context(connected: str, cluster: ControlPlane,
                                               admin: Client, tmp_path: Path) -> None:
    admin.create(example(namespace=connected))
    config = yaml.safe_load(cluster.admin.kubeconfig.read_text())
    (context,) = config["contexts"]
    context["context"]["namespace"] = connected
    config["contexts"].append({"name": "b", "context": {"cluster": context["context"][
        "cluster"], "user": context["context"]["user"]}})
    path = tmp_path / "contexts"
    path.write_text(yaml.safe_dump(config))
    kube.connect(kubeconfig=str(path))
    assert kube.default_namespace() == connected
    assert kube.set_traffic("iris", None, "fallback")["metadata"]["namespace"] == connected
    kube.connect(kubeconfig=str(path), context="b")
    assert kube.default_namespace() == "default"


def test_events_are_best_effort(connected: str, admin: Client,
                                caplog: pytest.LogCaptureFixture) -> None:
    owner = admin.create(example(namespace=connected))
    kube.post_event(owner, type_="Normal", reason="Created", message="made it", now=NOW)
    (event,) = [e for e in admin.list("events", connected) if e["reason"] == "Created"]
    assert event["involvedObject"]["uid"] == owner["metadata"]["uid"]
    assert (event["type"], event["message"]) == ("Normal", "made it")
    elsewhere = {**owner, "metadata": {**owner["metadata"], "namespace": "absent"}}
    with caplog.at_level(logging.WARNING, logger="tailguard.operator.kube"):
        kube.post_event(elsewhere, type_="Warning", reason="X", message="y", now=NOW)
    assert "event not recorded" in caplog.text


def test_a_repeated_event_raises_the_stored_ones_count(connected: str, admin: Client) -> None:
    """As client-go's recorder does: the same object, type, reason and message make one
    Event whose count and lastTimestamp move; one deleted meanwhile is created again; the
    table is bounded, and a repeat the recorder has forgotten is a new Event."""
    owner = admin.create(example(namespace=connected))
    recorder = events.EventRecorder(max_remembered=2)
    later = NOW + datetime.timedelta(minutes=3)

    def flaps() -> list[tuple[str, int, str, str]]:
        return sorted((e["message"], e["count"], e["firstTimestamp"], e["lastTimestamp"])
                      for e in admin.list("events", connected) if e["reason"] == "Flap")

    recorder.record(owner, type_="Warning", reason="Flap", message="a", now=NOW)
    recorder.record(owner, type_="Warning", reason="Flap", message="a", now=later)
    recorder.record(owner, type_="Warning", reason="Flap", message="b", now=later)
    first, last = "2026-01-01T00:00:00Z", "2026-01-01T00:03:00Z"
    assert flaps() == [("a", 2, first, last), ("b", 1, last, last)]

    (stored_a,) = [e for e in admin.list("events", connected) if e["message"] == "a"]
    admin.delete("events", connected, stored_a["metadata"]["name"])
    recorder.record(owner, type_="Warning", reason="Flap", message="a", now=later)
    assert flaps() == [("a", 1, last, last), ("b", 1, last, last)]

    recorder.record(owner, type_="Warning", reason="Flap", message="c", now=later)  # b goes
    assert len(recorder) == 2
    recorder.record(owner, type_="Warning", reason="Flap", message="b", now=later)  # a goes
    recorder.record(owner, type_="Warning", reason="Flap", message="c", now=later)
    assert flaps() == [("a", 1, last, last), ("b", 1, last, last), ("b", 1, last, last),
                       ("c", 2, last, last)]
