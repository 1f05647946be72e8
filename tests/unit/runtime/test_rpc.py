"""The gRPC service's pure parts: message conversion, the message size limit, the per-address
call count. The service itself is tested over real processes in tests/process/http."""

from __future__ import annotations

from typing import Any, Callable

import numpy as np
import pytest

from tailguard_runtime.errors import InvalidInput, PayloadTooLarge
from tailguard_runtime.models import OutputSpec
from tailguard_runtime.rpc import protocol as pb
from tailguard_runtime.rpc.service import (
    CallsByAddress,
    max_calls_per_address,
    max_concurrent_calls,
    max_message_bytes,
    peer_address,
)
from tailguard_runtime.rpc.tensors import decode_infer, encode_infer

Tensor = pb.message("ModelInferRequest.InferInputTensor")
Contents = pb.message("InferTensorContents")


def _raw(x: np.ndarray, datatype: str = "FP64") -> Any:
    dtype = {"FP64": "<f8", "FP32": "<f4", "INT64": "<i8"}[datatype]
    return pb.ModelInferRequest(model_name="m", inputs=[Tensor(
        name="input-0", datatype=datatype, shape=list(x.shape))],
        raw_input_contents=[x.astype(dtype).tobytes()])


def test_every_encoding_of_the_same_rows_decodes_to_the_same_matrix() -> None:
    x = np.arange(12, dtype=np.float64).reshape(3, 4) - 5.0
    typed = pb.ModelInferRequest(model_name="m", inputs=[Tensor(
        name="input-0", datatype="INT64", shape=[3, 4],
        contents=Contents(int64_contents=x.astype(np.int64).ravel().tolist()))])
    for request in (_raw(x), _raw(x, "FP32"), _raw(x, "INT64"), typed):
        decoded = decode_infer(request, 4, ("label",), 64, None)
        np.testing.assert_array_equal(decoded.x, x)


def test_one_tensor_per_feature_is_put_in_the_models_order() -> None:
    names = ("a", "b")
    request = pb.ModelInferRequest(model_name="m", inputs=[
        Tensor(name="b", datatype="FP64", shape=[2], contents=Contents(fp64_contents=[3, 4])),
        Tensor(name="a", datatype="FP64", shape=[2], contents=Contents(fp64_contents=[1, 2]))])
    decoded = decode_infer(request, 2, ("label",), 64, names)
    np.testing.assert_array_equal(decoded.x, [[1, 3], [2, 4]])


def test_request_parameters_id_and_outputs_are_read() -> None:
    request = _raw(np.zeros((1, 4)))
    request.id = "r-1"
    request.parameters["timeout"].int64_param = 250_000
    request.outputs.add(name="label")
    decoded = decode_infer(request, 4, ("label", "proba"), 64, None)
    assert (decoded.id, decoded.timeout_us, decoded.outputs) == ("r-1", 250_000.0, ("label",))


def test_rows_past_the_queue_are_too_large() -> None:
    with pytest.raises(PayloadTooLarge):
        decode_infer(_raw(np.zeros((65, 4))), 4, ("label",), 64, None)


@pytest.mark.parametrize("make, expected", [
    (lambda: pb.ModelInferRequest(inputs=[Tensor(name="x", datatype="FP64", shape=[1, 4],
                                                 contents=Contents(fp64_contents=[1, 2]))]),
     "shape [1, 4] needs 4 values, contents.fp64_contents has 2"),
    (lambda: pb.ModelInferRequest(inputs=[Tensor(name="x", datatype="INT64", shape=[1, 4],
                                                 contents=Contents(int_contents=[1, 2, 3, 4]))]),
     "INT64 values go in contents.int64_contents, got contents.int_contents"),
    (lambda: pb.ModelInferRequest(
        inputs=[Tensor(name="x", datatype="FP64", shape=[1, 4],
                       contents=Contents(fp64_contents=[1, 2, 3, 4]))],
        raw_input_contents=[b"\0" * 32]),
     "values are in raw_input_contents, so contents must be empty"),
    (lambda: _raw(np.array([[np.inf, 0, 0, 0]])), "finite"),
])
def test_bad_tensors_name_the_field(make: Callable[[], Any], expected: str) -> None:
    with pytest.raises(InvalidInput) as info:
        decode_infer(make(), 4, ("label",), 64, None)
    assert expected in info.value.message


def test_answers_are_raw_contents_in_the_order_of_the_outputs_asked_for() -> None:
    specs = (OutputSpec("label", "INT64", (-1,)), OutputSpec("proba", "FP64", (-1, 2)))
    outputs = (np.array([1, 0]), np.array([[0.25, 0.75], [1.0, 0.0]]))
    everything = encode_infer("m", "3", "r", specs, outputs, None, {"role": "primary"})
    assert [o.name for o in everything.outputs] == ["label", "proba"]
    assert list(everything.outputs[1].shape) == [2, 2]
    np.testing.assert_array_equal(
        np.frombuffer(everything.raw_output_contents[1], "<f8").reshape(2, 2), outputs[1])
    assert everything.parameters["role"].string_param == "primary"
    assert (everything.model_version, everything.id) == ("3", "r")
    only = encode_infer("m", "3", None, specs, outputs, ("proba",), {})
    assert [o.name for o in only.outputs] == ["proba"] and len(only.raw_output_contents) == 1


@pytest.mark.parametrize("n_features, max_rows", [(4, 256), (64, 1024), (784, 512)])
def test_the_largest_valid_message_fits_the_limit(n_features: int, max_rows: int) -> None:
    # INT64 contents of negative values: ten bytes each as varints, the longest encoding
    x = -np.ones((max_rows, n_features), dtype=np.int64)
    request = pb.ModelInferRequest(model_name="a-model-name", id="x" * 200, inputs=[Tensor(
        name="input-0", datatype="INT64", shape=[max_rows, n_features],
        contents=Contents(int64_contents=x.ravel().tolist()))])
    assert request.ByteSize() <= max_message_bytes(n_features, max_rows)


def test_call_caps() -> None:
    assert max_concurrent_calls(64) == 256 and max_concurrent_calls(1024) == 2048
    assert max_calls_per_address(64) == 64 and max_calls_per_address(1024) == 512


@pytest.mark.parametrize("peer, address", [
    ("ipv4:10.0.0.7:51234", "10.0.0.7"), ("ipv6:[::1]:51234", "[::1]"),
    ("unix:/tmp/socket", "unix:/tmp/socket")])
def test_peer_address_drops_the_port(peer: str, address: str) -> None:
    assert peer_address(peer) == address


class _Call:
    """What :class:`CallsByAddress` reads of a gRPC call: its peer, and its end."""

    def __init__(self, peer: str) -> None:
        self._peer = peer
        self.done: list[Callable[[Any], None]] = []

    def peer(self) -> str:
        return self._peer

    def add_done_callback(self, callback: Callable[[Any], None]) -> None:
        self.done.append(callback)

    def finish(self) -> None:
        for callback in self.done:
            callback(self)


def test_each_address_holds_at_most_its_limit_until_its_calls_end() -> None:
    calls = CallsByAddress(limit=2)
    first = [_Call(f"ipv4:10.0.0.1:{port}") for port in (1, 2, 3)]
    assert calls.enter(first[0]) is None and calls.enter(first[1]) is None  # type: ignore[arg-type]
    refused = calls.enter(first[2])  # type: ignore[arg-type]
    assert refused is not None and refused.reason == "address_limit"
    assert "10.0.0.1" in refused.message and refused.status_code == 429
    assert calls.enter(_Call("ipv4:10.0.0.2:9")) is None  # type: ignore[arg-type]
    first[0].finish()
    assert calls.enter(first[2]) is None  # type: ignore[arg-type]
    for call in (first[1], first[2]):
        call.finish()
    assert calls.calls == {"10.0.0.2": 1}
