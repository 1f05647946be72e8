"""KServe's own Python client (``kserve`` 0.21.0, pinned, in a venv of its own: it needs a
python-dateutil the kubernetes client refuses) against ``tailguard up``, unchanged: readiness
and predictions over KServe v1, the v2 REST protocol and v2 gRPC, each the same as the answer
this process gets over plain v2 REST for the same rows; and a rollback moving gRPC calls as it
moves REST requests."""

from __future__ import annotations

import json
import subprocess
import sys
from typing import Iterator

import httpx
import numpy as np
import pytest
import tritonclient.grpc as triton

from harness import REPO
from tailguard.up.child import UpProcess, start_up

KSERVE_PYTHON = REPO / ".venv-kserve" / "bin" / "python"
CLIENT = REPO / "tests" / "clients" / "kserve_client.py"
ROWS = [[5.1, 3.5, 1.4, 0.2], [6.7, 3.0, 5.2, 2.3], [5.9, 3.0, 4.2, 1.5]]


@pytest.fixture(scope="module")
def iris_up() -> Iterator[UpProcess]:
    up = start_up(REPO / "examples" / "iris.yaml")
    try:
        yield up
    finally:
        up.stop()


def test_kserve_clients_get_the_same_answers_on_every_path(iris_up: UpProcess) -> None:
    assert KSERVE_PYTHON.exists(), (
        f"{KSERVE_PYTHON} is missing: make install-test creates it (KServe's client)")
    done = subprocess.run([str(KSERVE_PYTHON), str(CLIENT), str(iris_up.port),
                           str(iris_up.grpc_port), "iris", json.dumps(ROWS)],
                          capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL)
    assert done.returncode == 0, done.stderr[-3000:]
    seen = json.loads(done.stdout)
    reference = httpx.post(f"{iris_up.base}/v2/models/iris/infer", timeout=30, json={
        "inputs": [{"name": "input-0", "shape": [3, 4], "datatype": "FP64",
                    "data": ROWS}]}).json()
    expected = {o["name"]: o["data"] for o in reference["outputs"]}
    labels = expected["predict"]
    assert labels == [0, 2, 1]  # setosa, virginica, versicolor, as the dataset labels them
    assert seen["v1_ready"] is seen["v2_ready"] is seen["v2_server_ready"] is True
    assert seen["grpc_ready"] is True
    assert seen["v1"] == labels
    for path in ("v2", "grpc"):
        assert seen[path]["predict"] == labels, path
        flat = [p for row in seen[path]["predict_proba"] for p in row]
        assert flat == expected["predict_proba"], path  # bit for bit: both are float64


def test_a_rollback_moves_grpc_calls_as_it_moves_rest_requests(iris_up: UpProcess) -> None:
    """``tailguard rollback`` switches the service: the next gRPC call is answered by the
    fallback, as a REST request is, and ``rollforward`` brings both back."""
    client = triton.InferenceServerClient(f"127.0.0.1:{iris_up.grpc_port}")
    tensor = triton.InferInput("input-0", [1, 4], "FP64")
    tensor.set_data_from_numpy(np.array(ROWS[:1]))

    def roles() -> tuple[str, str]:
        answer = client.infer("iris", [tensor], client_timeout=30).get_response()
        rest = httpx.post(f"{iris_up.base}/v1/models/iris:predict", json={"instances": ROWS[:1]},
                          timeout=30)
        return answer.parameters["role"].string_param, rest.headers["x-tailguard-role"]

    def tailguard(*args: str) -> None:
        done = subprocess.run([sys.executable, "-m", "tailguard.cli.main", *args, "iris",
                               "--port", str(iris_up.port)], capture_output=True, text=True,
                              timeout=60, stdin=subprocess.DEVNULL)
        assert done.returncode == 0, done.stderr

    try:
        assert roles() == ("primary", "primary")
        tailguard("rollback")
        assert roles() == ("fallback", "fallback")
        tailguard("rollforward")
        assert roles() == ("primary", "primary")
    finally:
        client.close()
