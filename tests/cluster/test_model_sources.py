"""Models from where users keep them, served on the real node.

An https:// model: the runtime pod downloads it from a server inside the cluster's namespace
whose certificate the test's own CA signed (trusted through a ConfigMap named in the spec) and
serves it through the Service; a wrong checksum leaves the old pods serving and says why in the
role's condition, as do a file above maxBytes, a 404 and a redirect to plain http. Two pvc:// models on a claim bound to a hostPath volume: both roles serve from
it, traffic moves between them; a claim that does not exist is named in the conditions, and
its pod never starts a container."""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Iterator

import pytest
from sklearn.ensemble import RandomForestClassifier
from sklearn.linear_model import LogisticRegression

from harness import REPO
from harness.kube.client import wait_for
from harness.kube.holder import NODE_IP
from harness.kube.pki import Authority
from harness.modelserver import joblib_bytes, sha256_of
from harness.onnode import LONG_MS, OnNode
from harness.scene import example
from tailguard_runtime.models import load_dataset

pytestmark = pytest.mark.cluster

PORT = 9443
IRIS_ROW = [5.1, 3.5, 1.4, 0.2]


@pytest.fixture(scope="module")
def model_server(node: OnNode) -> Iterator[tuple[str, bytes, Path]]:
    """A model server on the node's address inside the namespace: its URL for the iris model,
    the model's bytes and its CA's certificate."""
    folder = node.workdir / "models"
    folder.mkdir()
    authority = Authority(folder)
    pair = authority.serving("models", dns=["models"], ips=[NODE_IP])
    x, y = load_dataset("iris")
    data = joblib_bytes(LogisticRegression(max_iter=500).fit(x, y), folder, "iris.joblib")
    log = folder / "server.log"
    proc = node.holder.spawn(
        [sys.executable, "-m", "harness.modelserver", "--cert", str(pair.cert),
         "--key", str(pair.key), "--host", NODE_IP, "--port", str(PORT),
         "--file", f"/iris.joblib={folder / 'iris.joblib'}",
         "--redirect", f"/to-http=http://{NODE_IP}:{PORT}/iris.joblib"],
        log=log, env={**os.environ, "PYTHONPATH": str(REPO / "tests")})
    try:
        wait_for(lambda: "serving" in log.read_text() or proc.poll() is not None, timeout=30,
                 what="the model server to listen")
        assert proc.poll() is None, log.read_text()
        yield f"https://{NODE_IP}:{PORT}/iris.joblib", data, authority.pair.cert
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def test_an_https_model_is_downloaded_in_its_pod_and_each_failure_is_named(
        node: OnNode, model_server: tuple[str, bytes, Path]) -> None:
    url, data, ca = model_server
    node.admin.create({"apiVersion": "v1", "kind": "ConfigMap",
                       "metadata": {"name": "model-ca", "namespace": node.namespace},
                       "data": {"ca.crt": ca.read_text()}})
    body = example("iris", node.namespace, traffic="primary", rollback={"automatic": False},
                   batching={"timeoutMs": LONG_MS},
                   model={"uri": f"{url}?sig=secret", "sha256": sha256_of(data),
                          "caConfigMap": "model-ca"},
                   fallback={"uri": "builtin://iris/logistic-regression"})
    body["metadata"]["name"] = "remote"
    node.admin.create(body)
    node.wait_serving("remote")
    status, headers, answer = node.request("remote", "/v2/models/remote/infer", {"inputs": [
        {"name": "input-0", "shape": [1, 4], "datatype": "FP64", "data": IRIS_ROW}]})
    assert status == 200 and headers["x-tailguard-role"] == "primary", answer
    (serving,) = node.ready_pods("remote", "primary")

    node.patch("remote", {"model": {"uri": url, "sha256": "0" * 64, "caConfigMap": "model-ca"}})

    def named() -> bool:
        return "ModelChecksumMismatch" in node.condition("remote", "PrimaryReady").get(
            "message", "")
    wait_for(named, timeout=180, what="PrimaryReady to name the checksum mismatch")
    condition = node.condition("remote", "PrimaryReady")
    assert condition["reason"] == "PodsNotStarting", condition
    assert f"ModelChecksumMismatch: {url}: sha256 mismatch: expected {'0' * 64}" \
        in condition["message"], condition
    assert "secret" not in condition["message"]
    # The new model is not Ready, and the pod of the previous template still serves.
    ready = node.condition("remote", "Ready")
    assert (ready["status"], ready["reason"]) == ("False", "PodsNotStarting"), ready
    assert "1 Ready pod(s) of the previous template still serve" in ready["message"], ready
    assert [p["metadata"]["uid"] for p in node.ready_pods("remote", "primary")] == \
        [serving["metadata"]["uid"]]
    status, headers, _ = node.request("remote", "/v2/models/remote/infer", {"inputs": [
        {"name": "input-0", "shape": [1, 4], "datatype": "FP64", "data": IRIS_ROW}]})
    assert status == 200 and headers["x-tailguard-role"] == "primary"

    # Three more failures at once, each named in its role's condition: a file above the cap,
    # a 404, and a redirect to plain http (a stall is shown over loopback, in
    # tests/process/http/test_model_urls.py: its 30 s timeout is not a spec field).
    base = url.rsplit("/", 1)[0]
    node.patch("remote", {"model": {"uri": url, "sha256": sha256_of(data),
                                    "caConfigMap": "model-ca", "maxBytes": len(data) - 1}})
    broken = example("iris", node.namespace, traffic="primary", rollback={"automatic": False},
                     model={"uri": f"{base}/absent.joblib", "sha256": sha256_of(data),
                            "caConfigMap": "model-ca"},
                     fallback={"uri": f"{base}/to-http", "sha256": sha256_of(data),
                               "caConfigMap": "model-ca"})
    broken["metadata"]["name"] = "broken"
    node.admin.create(broken)
    expected = {("remote", "PrimaryReady"): f"ModelTooLarge: {url}: {len(data)} bytes announced",
                ("broken", "PrimaryReady"): f"ModelNotFound: {base}/absent.joblib: 404",
                ("broken", "FallbackReady"): f"ModelURLRefused: {base}/to-http: redirect to "
                                             f"http://{NODE_IP}:{PORT}/iris.joblib refused"}

    def all_named() -> bool:
        return all(text in node.condition(name, type_).get("message", "")
                   for (name, type_), text in expected.items())
    try:
        wait_for(all_named, timeout=180, what="each failure named in its condition")
    except AssertionError as exc:
        raise AssertionError(f"{exc}: " + "; ".join(
            node.condition(n, t).get("message", "") for n, t in expected)) from None


@pytest.fixture(scope="module")
def claim(node: OnNode) -> Iterator[dict[str, str]]:
    """A PersistentVolumeClaim ``models`` bound to a hostPath PersistentVolume holding two iris
    models (a logistic regression and a small forest, drop-ins for each other): their SHA-256
    by file name."""
    folder = Path(tempfile.mkdtemp(prefix="tailguard-pv-"))
    folder.chmod(0o755)  # the runtime runs as an unprivileged user
    x, y = load_dataset("iris")
    digests = {}
    for name, model in (("linear.joblib", LogisticRegression(max_iter=500)),
                        ("forest.joblib", RandomForestClassifier(n_estimators=5, random_state=0))):
        digests[name] = sha256_of(joblib_bytes(model.fit(x, y), folder, name))
        (folder / name).chmod(0o644)
    volume = f"{node.namespace}-models"
    node.admin.create({"apiVersion": "v1", "kind": "PersistentVolume",
                       "metadata": {"name": volume},
                       "spec": {"capacity": {"storage": "10Mi"}, "accessModes": ["ReadOnlyMany"],
                                "persistentVolumeReclaimPolicy": "Retain",
                                "storageClassName": "", "volumeMode": "Filesystem",
                                "hostPath": {"path": str(folder), "type": "Directory"},
                                "claimRef": {"namespace": node.namespace, "name": "models"}}})
    node.admin.create({"apiVersion": "v1", "kind": "PersistentVolumeClaim",
                       "metadata": {"name": "models", "namespace": node.namespace},
                       "spec": {"accessModes": ["ReadOnlyMany"], "storageClassName": "",
                                "volumeName": volume,
                                "resources": {"requests": {"storage": "10Mi"}}}})
    try:
        wait_for(lambda: ((node.get("persistentvolumeclaims", "models") or {}).get("status")
                          or {}).get("phase") == "Bound", timeout=60, what="the claim to bind")
        yield digests
    finally:
        node.delete_all()
        node.admin.delete("persistentvolumeclaims", node.namespace, "models")
        node.admin.delete("persistentvolumes", None, volume)
        shutil.rmtree(folder)


def served_by(node: OnNode, name: str) -> tuple[str, str]:
    """The role and model that answer one v2 request to ``name``'s ClusterIP."""
    status, headers, answer = node.request(name, f"/v2/models/{name}/infer", {"inputs": [
        {"name": "input-0", "shape": [1, 4], "datatype": "FP64", "data": IRIS_ROW}]})
    assert status == 200, answer
    return headers["x-tailguard-role"], headers["x-tailguard-model"]


def test_models_on_a_claim_serve_roll_back_and_forward_and_a_missing_claim_is_named(
        node: OnNode, claim: dict[str, str]) -> None:
    body = example("iris", node.namespace, traffic="primary", rollback={"automatic": False},
                   batching={"timeoutMs": LONG_MS},
                   model={"uri": "pvc://models/forest.joblib", "sha256": claim["forest.joblib"]},
                   fallback={"uri": "pvc://models/linear.joblib",
                             "sha256": claim["linear.joblib"]})
    body["metadata"]["name"] = "claimed"
    node.admin.create(body)
    node.wait_serving("claimed")
    assert served_by(node, "claimed") == ("primary", "pvc://models/forest.joblib")
    for role, uri in (("fallback", "pvc://models/linear.joblib"),
                      ("primary", "pvc://models/forest.joblib")):
        node.patch("claimed", {"traffic": role})
        wait_for(lambda: node.selected_role("claimed") == role, timeout=90,
                 what=f"the Service to select the {role}")
        wait_for(lambda: served_by(node, "claimed") == (role, uri), timeout=30,
                 what=f"the {role} to answer")

    body = example("iris", node.namespace, traffic="primary", rollback={"automatic": False},
                   model={"uri": "pvc://absent/forest.joblib", "sha256": claim["forest.joblib"]})
    body["metadata"]["name"] = "unclaimed"
    node.admin.create(body)
    wait_for(lambda: "ClaimNotFound" in node.condition("unclaimed", "PrimaryReady").get(
        "message", ""), timeout=120, what="PrimaryReady to name the missing claim")
    ready = node.condition("unclaimed", "Ready")
    assert (ready["status"], ready["reason"]) == ("False", "PodsNotStarting"), ready
    assert 'persistentvolumeclaim "absent" not found' in ready["message"], ready
    assert all(not p["status"].get("containerStatuses")
               for p in node.pods("unclaimed", "primary"))  # never started, never crashed
