"""An https:// model served on the real node: the runtime pod downloads it from a server inside
the cluster's namespace whose certificate the test's own CA signed (trusted through a
ConfigMap named in the spec), serves it through the Service, and a wrong checksum leaves the
old pods serving and says why in the role's condition."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path
from typing import Iterator

import pytest
from sklearn.linear_model import LogisticRegression

from harness import REPO
from harness.kube.client import wait_for
from harness.kube.holder import NODE_IP
from harness.kube.pki import Authority
from harness.modelserver import joblib_bytes, sha256_of
from harness.onnode import OnNode
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
         "--file", f"/iris.joblib={folder / 'iris.joblib'}"],
        log=log, env={**os.environ, "PYTHONPATH": str(REPO / "tests")})
    try:
        wait_for(lambda: "serving" in log.read_text() or proc.poll() is not None, timeout=30,
                 what="the model server to listen")
        assert proc.poll() is None, log.read_text()
        yield f"https://{NODE_IP}:{PORT}/iris.joblib", data, authority.pair.cert
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def test_an_https_model_is_downloaded_in_its_pod_and_a_wrong_checksum_is_named(
        node: OnNode, model_server: tuple[str, bytes, Path]) -> None:
    url, data, ca = model_server
    node.admin.create({"apiVersion": "v1", "kind": "ConfigMap",
                       "metadata": {"name": "model-ca", "namespace": node.namespace},
                       "data": {"ca.crt": ca.read_text()}})
    body = example("iris", node.namespace, traffic="primary", rollback={"automatic": False},
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
    started = time.monotonic()
    status, headers, _ = node.request("remote", "/v2/models/remote/infer", {"inputs": [
        {"name": "input-0", "shape": [1, 4], "datatype": "FP64", "data": IRIS_ROW}]})
    assert status == 200 and headers["x-tailguard-role"] == "primary"
    assert time.monotonic() - started < 30
