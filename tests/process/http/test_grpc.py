"""The Open Inference Protocol's gRPC service, with NVIDIA's own client (``tritonclient.grpc``)
unchanged, and with that client's stub of the protocol where a test needs a message the client
never sends (typed ``contents``, malformed requests).

Against real runtime processes: the session's ``digits`` server for answers (compared with the
very forest the test trained, and with the REST answers for the same rows), and probe servers
whose gated rows hold the model thread, to show what only timing could otherwise: gRPC and REST
requests sharing one model call, a 429 as ``RESOURCE_EXHAUSTED`` with retry info, and deadlines
(the gRPC deadline and the ``timeout`` parameter) enforced by the server.
"""

from __future__ import annotations

import asyncio
import queue
import threading
import time
from pathlib import Path
from types import ModuleType
from typing import Any, Iterator

import grpc
import httpx
import numpy as np
import pytest
import tritonclient.grpc as triton
import tritonclient.grpc.aio as triton_aio
import tritonclient.http as triton_http
from google.rpc import error_details_pb2
from grpc_status import rpc_status
from tritonclient.utils import InferenceServerException

from harness.runtime import (
    RuntimeServer,
    batching,
    gated_row,
    new_gate,
    open_gate,
    probe_rows,
    probe_runtime,
    scrape,
    slow_row,
    v2_body,
)

# Triton's copy of the protocol (a superset, same package and field numbers): the runtime's own
# generated module registers the same message names, and one process cannot load both
pb: Any = triton.service_pb2
pb_grpc: Any = triton.service_pb2_grpc


@pytest.fixture
def client(digits_server: RuntimeServer) -> Iterator[triton.InferenceServerClient]:
    c = triton.InferenceServerClient(url=digits_server.grpc_target)
    try:
        yield c
    finally:
        c.close()


@pytest.fixture
def stub(digits_server: RuntimeServer) -> Iterator[pb_grpc.GRPCInferenceServiceStub]:
    with grpc.insecure_channel(digits_server.grpc_target) as channel:
        yield pb_grpc.GRPCInferenceServiceStub(channel)  # type: ignore[no-untyped-call]


NUMPY = {"FP64": np.float64, "FP32": np.float32}


def _input(x: np.ndarray, datatype: str = "FP64") -> triton.InferInput:
    tensor = triton.InferInput("input-0", list(x.shape), datatype)
    tensor.set_data_from_numpy(x.astype(NUMPY[datatype]))
    return tensor


def _status(info: pytest.ExceptionInfo[InferenceServerException]) -> str:
    return str(info.value.status())


def test_health_readiness_and_server_metadata(client: triton.InferenceServerClient) -> None:
    assert client.is_server_live() is True
    assert client.is_server_ready() is True
    assert client.is_model_ready("digits") is True
    assert client.is_model_ready("digits", model_version="1") is True
    meta = client.get_server_metadata(as_json=True)
    assert meta["name"] == "tailguard" and meta["extensions"] == ["binary_tensor_data"]
    with pytest.raises(InferenceServerException) as info:
        client.is_model_ready("no-such-model")
    assert _status(info) == "StatusCode.NOT_FOUND" and "no-such-model" in info.value.message()


def test_model_metadata_matches_rest(client: triton.InferenceServerClient,
                                     digits_server: RuntimeServer) -> None:
    meta = client.get_model_metadata("digits", as_json=True)
    with digits_server.client() as http:
        rest = http.get("/v2/models/digits").json()
    assert meta["name"] == rest["name"] == "digits"
    assert meta["versions"] == rest["versions"] and meta["platform"] == rest["platform"]
    for field in ("inputs", "outputs"):  # the JSON form of int64 shapes is strings
        assert [{**t, "shape": [int(d) for d in t["shape"]]} for t in meta[field]] == rest[field]
    with pytest.raises(InferenceServerException) as info:
        client.get_model_metadata("digits", model_version="7")
    assert _status(info) == "StatusCode.NOT_FOUND" and "version '7'" in info.value.message()


@pytest.mark.parametrize("datatype", ["FP64", "FP32"])
def test_infer_matches_offline_predict_and_both_rest_encodings(
        client: triton.InferenceServerClient, digits_server: RuntimeServer, digits_model: Any,
        digits_data: tuple[np.ndarray, np.ndarray], datatype: str) -> None:
    x = digits_data[0][600:640]  # 40 rows: more than one batch of 32
    result = client.infer("digits", [_input(x, datatype)], request_id="grpc-1")
    response = result.get_response()
    assert response.id == "grpc-1" and response.model_name == "digits"
    assert response.model_version == "1"
    assert response.parameters["role"].string_param == "primary"
    labels, proba = result.as_numpy("predict"), result.as_numpy("predict_proba")
    np.testing.assert_array_equal(labels, digits_model.predict(x))
    np.testing.assert_allclose(proba, digits_model.predict_proba(x), rtol=0, atol=1e-12)
    http = triton_http.InferenceServerClient(url=f"127.0.0.1:{digits_server.port}")
    try:
        for binary in (True, False):  # tritonclient.http's default, then JSON tensors
            tensor = triton_http.InferInput("input-0", list(x.shape), datatype)
            tensor.set_data_from_numpy(x.astype(NUMPY[datatype]), binary_data=binary)
            rest = http.infer("digits", [tensor])
            np.testing.assert_array_equal(rest.as_numpy("predict"), labels)
            np.testing.assert_array_equal(rest.as_numpy("predict_proba"), proba)
    finally:
        http.close()


def test_requested_output_subset_and_identity_metadata(
        stub: pb_grpc.GRPCInferenceServiceStub, digits_model: Any,
        digits_data: tuple[np.ndarray, np.ndarray]) -> None:
    x = digits_data[0][:3]
    request = pb.ModelInferRequest(model_name="digits", inputs=[pb.ModelInferRequest.InferInputTensor(
        name="input-0", datatype="FP64", shape=[3, 64],
        contents=pb.InferTensorContents(fp64_contents=x.ravel().tolist()))],
        outputs=[pb.ModelInferRequest.InferRequestedOutputTensor(name="predict")])
    response, call = stub.ModelInfer.with_call(request, timeout=30)
    assert [o.name for o in response.outputs] == ["predict"]
    assert len(response.raw_output_contents) == 1
    labels = np.frombuffer(response.raw_output_contents[0], dtype="<i8")
    np.testing.assert_array_equal(labels, digits_model.predict(x))
    metadata = dict(call.initial_metadata())
    assert metadata["x-tailguard-role"] == "primary"
    assert metadata["x-tailguard-model-version"] == "1"


@pytest.mark.parametrize("datatype, field, dtype", [
    ("FP32", "fp32_contents", np.float32), ("INT64", "int64_contents", np.int64)])
def test_typed_contents_are_served_as_raw_contents_are(
        stub: pb_grpc.GRPCInferenceServiceStub, digits_model: Any,
        digits_data: tuple[np.ndarray, np.ndarray], datatype: str, field: str,
        dtype: Any) -> None:
    x = digits_data[0][10:14]  # digits' pixels are whole numbers: exact in every datatype
    typed = pb.ModelInferRequest(model_name="digits", inputs=[
        pb.ModelInferRequest.InferInputTensor(
            name="input-0", datatype=datatype, shape=[4, 64],
            contents=pb.InferTensorContents(**{field: x.astype(dtype).ravel().tolist()}))])
    raw = pb.ModelInferRequest(model_name="digits", inputs=[
        pb.ModelInferRequest.InferInputTensor(name="input-0", datatype=datatype, shape=[4, 64])],
        raw_input_contents=[x.astype(dtype).astype(f"<{np.dtype(dtype).str[1:]}").tobytes()])
    answers = [stub.ModelInfer(r, timeout=30) for r in (typed, raw)]
    for answer in answers:
        np.testing.assert_array_equal(np.frombuffer(answer.raw_output_contents[0], "<i8"),
                                      digits_model.predict(x))
    assert answers[0].raw_output_contents == answers[1].raw_output_contents


def _infer_error(stub: pb_grpc.GRPCInferenceServiceStub, request: pb.ModelInferRequest
                 ) -> grpc.RpcError:
    with pytest.raises(grpc.RpcError) as info:
        stub.ModelInfer(request, timeout=30)
    return info.value


def _tensor(**fields: Any) -> pb.ModelInferRequest.InferInputTensor:
    return pb.ModelInferRequest.InferInputTensor(**{"name": "input-0", "datatype": "FP64",
                                                   "shape": [1, 64], **fields})


@pytest.mark.parametrize("request_fields, expected", [
    ({"inputs": [_tensor(shape=[1, 63], contents=pb.InferTensorContents(
        fp64_contents=[0.0] * 63))]}, "expected 64 features per row"),
    ({"inputs": [_tensor(contents=pb.InferTensorContents(fp64_contents=[0.0] * 60))]},
     "shape [1, 64] needs 64 values, contents.fp64_contents has 60"),
    ({"inputs": [_tensor(contents=pb.InferTensorContents(fp32_contents=[0.0] * 64))]},
     "FP64 values go in contents.fp64_contents, got contents.fp32_contents"),
    ({"inputs": [_tensor()], "raw_input_contents": [b"\0" * 100]},
     "shape [1, 64] of FP64 needs 512 bytes, raw_input_contents[0] has 100"),
    ({"inputs": [_tensor(), _tensor(name="other")], "raw_input_contents": [b"\0" * 512]},
     "raw_input_contents has 1 entries for 2 inputs"),
    ({"inputs": [_tensor(contents=pb.InferTensorContents(fp64_contents=[float("nan")] * 64))]},
     "finite"),
    ({"inputs": [_tensor(datatype="BYTES")]}, "datatype must be one of FP32, FP64, INT64"),
    ({"inputs": [_tensor(contents=pb.InferTensorContents(fp64_contents=[0.0] * 64))],
      "outputs": [pb.ModelInferRequest.InferRequestedOutputTensor(name="nope")]},
     "unknown output(s) ['nope']"),
    ({"inputs": []}, "'inputs' must be a list of exactly one tensor"),
])
def test_bad_requests_are_invalid_argument_naming_the_field(
        stub: pb_grpc.GRPCInferenceServiceStub, request_fields: dict[str, Any],
        expected: str) -> None:
    error = _infer_error(stub, pb.ModelInferRequest(model_name="digits", **request_fields))
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT, error
    assert expected in (error.details() or ""), error.details()


def test_unknown_model_and_version_are_not_found(stub: pb_grpc.GRPCInferenceServiceStub) -> None:
    for name, version in (("nope", ""), ("digits", "9")):
        error = _infer_error(stub, pb.ModelInferRequest(model_name=name, model_version=version,
                                                        inputs=[_tensor()]))
        assert error.code() == grpc.StatusCode.NOT_FOUND, error


def test_a_message_larger_than_any_valid_request_is_refused_and_rest_still_serves(
        digits_server: RuntimeServer, digits_data: tuple[np.ndarray, np.ndarray]) -> None:
    # digits: maxQueueSize 1024 rows of 64 features: a valid message is under about 720 KB
    huge = pb.ModelInferRequest(model_name="digits", inputs=[_tensor(shape=[4096, 64])],
                                raw_input_contents=[b"\0" * (4096 * 64 * 8)])
    with grpc.insecure_channel(digits_server.grpc_target, options=[
            ("grpc.max_send_message_length", 64 << 20)]) as channel:
        stub = pb_grpc.GRPCInferenceServiceStub(channel)  # type: ignore[no-untyped-call]
        error = _infer_error(stub, huge)
        assert error.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, error
        assert "larger than max" in (error.details() or "")
    with digits_server.client() as http:
        answer = http.post("/v2/models/digits/infer",
                           json=v2_body(digits_data[0][:2]))
        assert answer.status_code == 200


def test_async_infer_and_the_asyncio_client(digits_server: RuntimeServer, digits_model: Any,
                                            digits_data: tuple[np.ndarray, np.ndarray]) -> None:
    x = digits_data[0][100:140]
    expected = digits_model.predict(x)
    client = triton.InferenceServerClient(url=digits_server.grpc_target)
    answers: queue.Queue[Any] = queue.Queue()
    try:
        for i in range(len(x)):  # one callback per row, all in flight together
            client.async_infer("digits", [_input(x[i:i + 1])], request_id=str(i),
                               callback=lambda result, error: answers.put((result, error)))
        got = {}
        for _ in range(len(x)):
            result, error = answers.get(timeout=60)
            assert error is None, error
            got[int(result.get_response().id)] = int(result.as_numpy("predict")[0])
        assert [got[i] for i in range(len(x))] == expected.tolist()
    finally:
        client.close()

    async def concurrent() -> list[int]:
        aio = triton_aio.InferenceServerClient(url=digits_server.grpc_target)
        try:
            results = await asyncio.gather(*(aio.infer("digits", [_input(x[i:i + 1])])
                                             for i in range(len(x))))
            return [int(r.as_numpy("predict")[0]) for r in results]
        finally:
            await aio.close()

    assert asyncio.run(concurrent()) == expected.tolist()


# -- the same queue as REST: shared batches, overload, deadlines ----------------------------------


@pytest.fixture(scope="module")
def gated_server(tmp_path_factory: pytest.TempPathFactory, probe_module: tuple[ModuleType, Path]
                 ) -> Iterator[tuple[RuntimeServer, Path]]:
    """A probe runtime whose model calls are logged: maxBatchSize 8, queue of 3 rows."""
    folder = tmp_path_factory.mktemp("grpc-gated")
    calls = folder / "calls.log"
    with probe_runtime(probe_module, folder, name="gated", calls_log=calls,
                       batching=batching(max_batch_size=8, max_queue_size=3,
                                         timeout_ms=30_000)) as (server, _):
        yield server, calls


def _in_flight(server: RuntimeServer) -> float:
    with server.client() as http:
        return sum(v for (name, _), v in scrape(http).items()
                   if name == "tailguard_in_flight_requests")


def _wait_in_flight(server: RuntimeServer, n: int) -> None:
    deadline = time.monotonic() + 30
    while _in_flight(server) < n and time.monotonic() < deadline:
        time.sleep(0.02)
    assert _in_flight(server) == n, f"expected {n} requests in flight"


def _rest_call(server: RuntimeServer, x: np.ndarray, into: dict[str, Any], key: str
               ) -> threading.Thread:
    def call() -> None:
        into[key] = httpx.post(f"{server.base_url}/v2/models/{server.name}/infer",
                               json=v2_body(x), timeout=90)
    thread = threading.Thread(target=call)
    thread.start()
    return thread


def test_grpc_and_rest_requests_share_one_model_call(
        gated_server: tuple[RuntimeServer, Path], probe_module: tuple[ModuleType, Path]) -> None:
    server, calls = gated_server
    before = len(calls.read_text().splitlines()) if calls.exists() else 0
    gate = new_gate()
    results: dict[str, Any] = {}
    threads = [_rest_call(server, gated_row(gate), results, "held")]
    try:
        _wait_in_flight(server, 1)
        threads.append(_rest_call(server, probe_rows(1, seed=1), results, "rest"))

        def grpc_call() -> None:
            c = triton.InferenceServerClient(url=server.grpc_target)
            try:
                results["grpc"] = c.infer("gated", [_input(probe_rows(1, seed=2))],
                                          client_timeout=90)
            finally:
                c.close()

        threads.append(threading.Thread(target=grpc_call))
        threads[-1].start()
        _wait_in_flight(server, 3)
    finally:
        open_gate(probe_module, gate)
        for thread in threads:
            thread.join(timeout=90)
    after = calls.read_text().splitlines()[before:]
    assert after == ["1", "2"], after  # the gated row alone, then both requests in one call
    assert results["rest"].status_code == 200 and results["held"].status_code == 200
    assert results["grpc"].as_numpy("predict").shape == (1,)


def test_a_full_queue_is_resource_exhausted_with_retry_info(
        gated_server: tuple[RuntimeServer, Path], probe_module: tuple[ModuleType, Path]) -> None:
    server, _ = gated_server
    gate = new_gate()
    results: dict[str, Any] = {}
    threads = [_rest_call(server, gated_row(gate), results, "held")]
    try:
        _wait_in_flight(server, 1)
        for seed in range(3):  # the queue's 3 rows, over REST
            threads.append(_rest_call(server, probe_rows(1, seed=seed), results, str(seed)))
        _wait_in_flight(server, 4)
        with grpc.insecure_channel(server.grpc_target) as channel:
            stub = pb_grpc.GRPCInferenceServiceStub(channel)  # type: ignore[no-untyped-call]
            with pytest.raises(grpc.RpcError) as info:
                stub.ModelInfer(pb.ModelInferRequest(model_name="gated", inputs=[
                    pb.ModelInferRequest.InferInputTensor(name="input-0", datatype="FP64",
                                                          shape=[1, 4])],
                    raw_input_contents=[probe_rows(1, seed=9).astype("<f8").tobytes()]),
                    timeout=30)
    finally:
        open_gate(probe_module, gate)
        for thread in threads:
            thread.join(timeout=90)
    error: Any = info.value
    assert error.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, error
    assert "queue full" in error.details()
    status = rpc_status.from_call(error)
    assert status is not None and len(status.details) == 1
    retry = error_details_pb2.RetryInfo()
    assert status.details[0].Unpack(retry) and retry.retry_delay.seconds >= 1
    assert dict(error.trailing_metadata())["retry-after"] == str(retry.retry_delay.seconds)
    assert all(r.status_code == 200 for r in results.values())


@pytest.mark.parametrize("how", ["grpc_deadline", "timeout_parameter"])
def test_the_server_enforces_the_deadline(gated_server: tuple[RuntimeServer, Path],
                                          how: str) -> None:
    """A request whose own row takes the model 1.5 s, with a 0.4 s deadline: nothing is
    ahead of it, so it is admitted, and the server itself ends it at the deadline."""
    server, _ = gated_server
    with server.client() as http:
        before = _rejections(http, "deadline_exceeded")
        batches = _batches(http)
    c = triton.InferenceServerClient(url=server.grpc_target)
    try:
        with pytest.raises(InferenceServerException) as info:
            if how == "grpc_deadline":
                c.infer("gated", [_input(slow_row(1500))], client_timeout=0.4)
            else:  # microseconds, sent as parameters.timeout; the gRPC deadline stays far
                c.infer("gated", [_input(slow_row(1500))], timeout=400_000, client_timeout=60)
    finally:
        c.close()
    assert _status(info) == "StatusCode.DEADLINE_EXCEEDED", info.value
    deadline = time.monotonic() + 10  # the server's own count, not the client's clock
    with server.client() as http:
        while _rejections(http, "deadline_exceeded") == before and time.monotonic() < deadline:
            time.sleep(0.05)
        assert _rejections(http, "deadline_exceeded") == before + 1
        while _batches(http) == batches and time.monotonic() < deadline + 10:
            time.sleep(0.05)  # the slow row's model call ends: the next test starts idle


def _batches(http: httpx.Client) -> float:
    return sum(v for (name, _), v in scrape(http).items()
               if name == "tailguard_batch_duration_seconds_count")


def _rejections(http: httpx.Client, reason: str) -> float:
    return sum(v for (name, labels), v in scrape(http).items()
               if name == "tailguard_rejections_total" and dict(labels).get("reason") == reason)
