"""The API client module against the fake API: dict in, dict out, merge patches, and errors
that say what happened."""

from __future__ import annotations

import datetime
import logging
import socket
from pathlib import Path

import pytest
import yaml
from fakeapi import FakeApiServer
from harness import NAMESPACE, example

from tailguard_operator import kube, spec

NOW = datetime.datetime(2025, 1, 1, tzinfo=datetime.timezone.utc)


@pytest.fixture
def connected(fake: FakeApiServer) -> FakeApiServer:
    creds = kube.connect()
    assert creds.server == fake.url and creds.token == "fake-token"
    return fake


def test_reads_and_writes_round_trip(connected: FakeApiServer) -> None:
    config_map = {"apiVersion": "v1", "kind": "ConfigMap",
                  "metadata": {"name": "c", "namespace": NAMESPACE}, "data": {"a": "1"}}
    stored = kube.create(config_map)
    assert stored["metadata"]["uid"]
    assert kube.get("ConfigMap", NAMESPACE, "c") == stored
    patched = kube.merge_patch("ConfigMap", NAMESPACE, "c", {"data": {"a": None, "b": "2"}})
    assert patched["data"] == {"b": "2"}
    (request,) = [r for r in connected.requests if r.method == "PATCH"]
    assert request.content_type == "application/merge-patch+json"
    assert kube.get("ConfigMap", NAMESPACE, "missing") is None


def test_errors_carry_their_status(connected: FakeApiServer) -> None:
    config_map = {"apiVersion": "v1", "kind": "ConfigMap",
                  "metadata": {"name": "c", "namespace": NAMESPACE}}
    kube.create(config_map)
    with pytest.raises(kube.Conflict) as conflict:
        kube.create(config_map)
    assert (conflict.value.status, conflict.value.reason) == (409, "AlreadyExists")
    with pytest.raises(kube.NotFound):
        kube.merge_patch("Deployment", NAMESPACE, "nope", {"spec": {}})
    with pytest.raises(ValueError, match="unsupported kind"):
        kube.get("Secret", NAMESPACE, "x")


def test_set_traffic_patches_the_intent_and_the_status_is_separate(
        connected: FakeApiServer) -> None:
    connected.create(NAMESPACE, example())
    assert kube.set_traffic("iris", NAMESPACE, "fallback")["spec"]["traffic"] == "fallback"
    stored = kube.patch_status(NAMESPACE, "iris", {"status": {"activeModel": "primary"},
                                                   "spec": {"traffic": "primary"}})
    assert stored["spec"]["traffic"] == "fallback"  # a status write changes nothing else
    assert stored["status"] == {"activeModel": "primary"}
    with pytest.raises(ValueError, match="role"):
        kube.set_traffic("iris", NAMESPACE, "canary")
    with pytest.raises(kube.NotFound):
        kube.set_traffic("nope", NAMESPACE, "fallback")


def test_the_namespace_defaults_to_the_context(connected: FakeApiServer, tmp_path: Path) -> None:
    connected.create(None, {"apiVersion": "v1", "kind": "Namespace",
                            "metadata": {"name": "team-a"}})
    body = example()
    body["metadata"]["namespace"] = "team-a"
    connected.create("team-a", body)
    config = {"apiVersion": "v1", "kind": "Config", "current-context": "a",
              "clusters": [{"name": "f", "cluster": {"server": connected.url}}],
              "users": [{"name": "u", "user": {"token": "t"}}],
              "contexts": [{"name": "a", "context": {"cluster": "f", "user": "u",
                                                     "namespace": "team-a"}},
                           {"name": "b", "context": {"cluster": "f", "user": "u"}}]}
    path = tmp_path / "contexts"
    path.write_text(yaml.safe_dump(config))
    kube.connect(kubeconfig=str(path))
    assert kube.default_namespace() == "team-a"
    assert kube.set_traffic("iris", None, "fallback")["metadata"]["namespace"] == "team-a"
    kube.connect(kubeconfig=str(path), context="b")
    assert kube.default_namespace() == "default"


def test_events_are_best_effort(connected: FakeApiServer, caplog: pytest.LogCaptureFixture) -> None:
    owner = connected.create(NAMESPACE, example())
    kube.post_event(owner, type_="Normal", reason="Created", message="made it", now=NOW)
    (event,) = connected.list("events", NAMESPACE)
    assert event["involvedObject"]["uid"] == owner["metadata"]["uid"]
    assert (event["type"], event["reason"], event["message"]) == ("Normal", "Created", "made it")
    elsewhere = {**owner, "metadata": {**owner["metadata"], "namespace": "absent"}}
    with caplog.at_level(logging.WARNING, logger="tailguard_operator.kube"):
        kube.post_event(elsewhere, type_="Warning", reason="X", message="y", now=NOW)
    assert "event not recorded" in caplog.text


def test_an_unreachable_server_and_missing_credentials_are_kube_errors(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with socket.socket() as sock:  # a port with nothing listening
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    config = {"apiVersion": "v1", "kind": "Config", "current-context": "x",
              "clusters": [{"name": "x", "cluster": {"server": f"http://127.0.0.1:{port}"}}],
              "users": [{"name": "x", "user": {"token": "t"}}],
              "contexts": [{"name": "x", "context": {"cluster": "x", "user": "x"}}]}
    path = tmp_path / "config"
    path.write_text(yaml.safe_dump(config))
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    kube.connect(kubeconfig=str(path))
    with pytest.raises(kube.KubeError) as unreachable:
        kube.get(spec.KIND, NAMESPACE, "iris")
    assert unreachable.value.reason == "Unreachable"
    with pytest.raises(kube.KubeError, match="no Kubernetes credentials"):
        kube.connect(kubeconfig=str(tmp_path / "absent"))
