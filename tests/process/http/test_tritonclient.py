"""NVIDIA's own HTTP client (``tritonclient.http``) works against the runtime, with its
defaults (binary tensor data both ways) and with JSON tensors.

``timeout=`` (microseconds, sent as ``parameters.timeout``) is a deadline the runtime honours.
"""

from __future__ import annotations

import time
from pathlib import Path
from types import ModuleType
from typing import Any, Iterator

import numpy as np
import pytest
import tritonclient.http as triton
from tritonclient.utils import InferenceServerException

from harness.runtime import RuntimeServer, probe_rows, probe_runtime, slow_row


@pytest.fixture
def client(digits_server: RuntimeServer) -> Iterator[triton.InferenceServerClient]:
    c = triton.InferenceServerClient(url=f"127.0.0.1:{digits_server.port}", network_timeout=30.0)
    try:
        yield c
    finally:
        c.close()


def _input(x: np.ndarray, datatype: str = "FP64", binary: bool = False) -> triton.InferInput:
    tensor = triton.InferInput("input-0", list(x.shape), datatype)
    dtype = {"FP64": np.float64, "FP32": np.float32}[datatype]
    tensor.set_data_from_numpy(x.astype(dtype), binary_data=binary)
    return tensor


def test_server_metadata_lists_the_binary_extension(client: triton.InferenceServerClient) -> None:
    meta = client.get_server_metadata()
    assert meta["name"] == "tailguard" and meta["extensions"] == ["binary_tensor_data"]


def test_health_and_readiness(client: triton.InferenceServerClient) -> None:
    assert client.is_server_live() is True
    assert client.is_server_ready() is True
    assert client.is_model_ready("digits") is True
    assert client.is_model_ready("digits", model_version="1") is True
    assert client.is_model_ready("no-such-model") is False


def test_model_metadata(client: triton.InferenceServerClient) -> None:
    meta = client.get_model_metadata("digits")
    assert meta["name"] == "digits"
    assert meta["versions"] == ["1"]
    assert meta["inputs"] == [{"name": "input-0", "datatype": "FP64", "shape": [-1, 64]}]
    assert {o["name"]: (o["datatype"], o["shape"]) for o in meta["outputs"]} == {
        "predict": ("INT64", [-1]), "predict_proba": ("FP64", [-1, 10])}
    with pytest.raises(InferenceServerException) as info:
        client.get_model_metadata("no-such-model")
    assert info.value.status() == "404"
    assert "no-such-model" in info.value.message()


@pytest.mark.parametrize("datatype", ["FP64", "FP32"])
def test_infer_matches_offline_predict(client: triton.InferenceServerClient, digits_model: Any,
                                       digits_data: tuple[np.ndarray, np.ndarray],
                                       datatype: str) -> None:
    x = digits_data[0][500:540]  # 40 rows: more than one batch of 32
    result = client.infer("digits", [_input(x, datatype)], request_id="triton-1", outputs=[
        triton.InferRequestedOutput("predict", binary_data=False),
        triton.InferRequestedOutput("predict_proba", binary_data=False)])
    assert result.get_response()["id"] == "triton-1"
    assert result.get_response()["model_name"] == "digits"
    np.testing.assert_array_equal(result.as_numpy("predict"), digits_model.predict(x))
    proba = result.as_numpy("predict_proba")
    assert proba is not None and proba.shape == (40, 10)
    np.testing.assert_allclose(proba, digits_model.predict_proba(x), rtol=0, atol=1e-12)


def test_infer_requested_output_subset(client: triton.InferenceServerClient, digits_model: Any,
                                       digits_data: tuple[np.ndarray, np.ndarray]) -> None:
    x = digits_data[0][:3]
    result = client.infer("digits", [_input(x)],
                          outputs=[triton.InferRequestedOutput("predict", binary_data=False)])
    assert [o["name"] for o in result.get_response()["outputs"]] == ["predict"]
    assert result.as_numpy("predict_proba") is None
    np.testing.assert_array_equal(result.as_numpy("predict"), digits_model.predict(x))


@pytest.mark.parametrize("datatype", ["FP64", "FP32"])
def test_the_clients_defaults_binary_tensors_both_ways(
        client: triton.InferenceServerClient, digits_model: Any,
        digits_data: tuple[np.ndarray, np.ndarray], datatype: str) -> None:
    """``set_data_from_numpy(x)`` sends binary tensor data by default, and with no ``outputs``
    the client asks for every output in binary (``binary_data_output``)."""
    x = digits_data[0][200:270]
    tensor = triton.InferInput("input-0", list(x.shape), datatype)
    tensor.set_data_from_numpy(x.astype({"FP64": np.float64, "FP32": np.float32}[datatype]))
    result = client.infer("digits", [tensor], request_id="binary")
    response = result.get_response()
    assert response["id"] == "binary"
    assert all("data" not in o and o["parameters"]["binary_data_size"] > 0
               for o in response["outputs"])
    np.testing.assert_array_equal(result.as_numpy("predict"), digits_model.predict(x))
    np.testing.assert_allclose(result.as_numpy("predict_proba"), digits_model.predict_proba(x),
                               rtol=0, atol=1e-12)
    # binary in, one output asked for as JSON and one in binary
    mixed = client.infer("digits", [tensor], outputs=[
        triton.InferRequestedOutput("predict", binary_data=False),
        triton.InferRequestedOutput("predict_proba")])
    kinds = {o["name"]: "data" in o for o in mixed.get_response()["outputs"]}
    assert kinds == {"predict": True, "predict_proba": False}
    np.testing.assert_array_equal(mixed.as_numpy("predict"), digits_model.predict(x))


def test_infer_unknown_model_is_404(client: triton.InferenceServerClient,
                                    digits_data: tuple[np.ndarray, np.ndarray]) -> None:
    with pytest.raises(InferenceServerException) as info:
        client.infer("no-such-model", [_input(digits_data[0][:1])])
    assert info.value.status() == "404"


def test_unknown_version_is_404_everywhere(client: triton.InferenceServerClient,
                                           digits_data: tuple[np.ndarray, np.ndarray]) -> None:
    assert client.is_model_ready("digits", model_version="7") is False
    with pytest.raises(InferenceServerException) as info:
        client.get_model_metadata("digits", model_version="7")
    assert info.value.status() == "404" and "no version '7'" in info.value.message()
    with pytest.raises(InferenceServerException) as info:
        client.infer("digits", [_input(digits_data[0][:1])], model_version="7",
                     outputs=[triton.InferRequestedOutput("predict", binary_data=False)])
    assert info.value.status() == "404" and "no version '7'" in info.value.message()


@pytest.mark.parametrize("algorithm", ["gzip", "deflate"])
def test_compressed_requests_are_understood(client: triton.InferenceServerClient,
                                            digits_model: Any,
                                            digits_data: tuple[np.ndarray, np.ndarray],
                                            algorithm: str) -> None:
    x = digits_data[0][10:15]
    result = client.infer("digits", [_input(x)], request_compression_algorithm=algorithm,
                          outputs=[triton.InferRequestedOutput("predict", binary_data=False)])
    np.testing.assert_array_equal(result.as_numpy("predict"), digits_model.predict(x))


@pytest.fixture(scope="module")
def slow_server(tmp_path_factory: pytest.TempPathFactory,
                probe_module: tuple[ModuleType, Path]) -> Iterator[tuple[RuntimeServer, Any]]:
    with probe_runtime(probe_module, tmp_path_factory.mktemp("triton-slow"),
                       name="slow") as served:
        yield served


def test_infer_timeout_is_a_deadline(slow_server: tuple[RuntimeServer, Any]) -> None:
    """``timeout=`` is 300 ms against a 1.5 s batch (the server's own deadline is 10 s): the
    client gets 504 when its deadline passes, not a late answer."""
    server, model = slow_server
    client = triton.InferenceServerClient(url=f"127.0.0.1:{server.port}", network_timeout=30.0)
    try:
        x = slow_row(1500)
        started = time.monotonic()
        with pytest.raises(InferenceServerException) as info:
            client.infer("slow", [_input(x)], timeout=300_000)
        elapsed = time.monotonic() - started
        assert info.value.status() == "504"
        assert "deadline" in info.value.message()
        assert elapsed < 1.4, f"answered after {elapsed:.2f} s: the model's time, not the deadline"
        # and without a client timeout the same kind of request is answered
        good = probe_rows(3, seed=1)
        result = client.infer("slow", [_input(good)], timeout=10_000_000)
        np.testing.assert_array_equal(result.as_numpy("predict"), model.predict(good))
    finally:
        client.close()
