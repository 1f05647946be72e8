"""Decoding and encoding of the v2 and v1 bodies (pure functions, no server)."""

from __future__ import annotations

import re
from typing import Any

import numpy as np
import orjson
import pytest

from tailguard_runtime.errors import InvalidInput, PayloadTooLarge
from tailguard_runtime.models import OutputSpec
from tailguard_runtime.wire import (
    decode_v1,
    decode_v2,
    encode_v1,
    encode_v2,
    parse_timeout_header,
    served_by,
)

OUTPUTS = ["predict", "predict_proba"]


def _v2(**tensor: object) -> bytes:
    base: dict[str, object] = {"name": "x", "shape": [2, 3], "datatype": "FP32",
                               "data": [1, 2, 3, 4, 5, 6.5]}
    base.update(tensor)
    return orjson.dumps({"inputs": [base]})


def test_v2_flat_and_nested_data_decode_to_float64_rows() -> None:
    flat = decode_v2(_v2(), 3, OUTPUTS)
    nested = decode_v2(_v2(data=[[1, 2, 3], [4, 5, 6.5]]), 3, OUTPUTS)
    for request in (flat, nested):
        assert request.x.dtype == np.float64
        np.testing.assert_array_equal(request.x, [[1, 2, 3], [4, 5, 6.5]])


def test_v2_options_outputs_id_and_timeout() -> None:
    body = orjson.dumps({"id": "r-1", "parameters": {"timeout": 250000},
                         "outputs": [{"name": "predict"}],
                         "inputs": [{"name": "x", "shape": [1, 2], "datatype": "INT64",
                                     "data": [1, 2]}]})
    request = decode_v2(body, 2, OUTPUTS)
    assert request.id == "r-1" and request.outputs == ("predict",) and request.timeout_us == 250000


@pytest.mark.parametrize("body, status, needle", [
    (b"{not json", 400, "malformed JSON"),
    (b'{"inputs": [{"name": "x", "shape": [1, 3], "datatype": "FP64", "data": [1, NaN, 2]}]}',
     400, "NaN and Infinity are not valid JSON"),
    (b"[1, 2]", 422, "JSON object with an 'inputs' list"),
    (_v2(datatype="BYTES"), 422, "datatype must be one of FP32, FP64, INT64"),
    (_v2(shape=[6]), 422, "shape must be [n_rows, 3]"),
    (_v2(shape=[1, 6]), 422, "expected 3 features per row"),
    (_v2(shape=[3, 3]), 422, "needs 9 values, data has 6"),
    (_v2(shape=[0, 3], data=[]), 422, "has no rows"),
    (_v2(data=[1, 2, "3", 4, 5, 6]), 422, 'values must be numbers, got "3"'),
    (_v2(data=[1, 2, True, 4, 5, 6]), 422, "values must be numbers, got true"),
    (_v2(data=[1, 2, None, 4, 5, 6]), 422, "values must be numbers, got null"),
    (_v2(datatype="INT64"), 422, "INT64 tensor holds non-integer values"),
    (_v2(data=[[1, 2, 3], [4, 5]]), 422, "same length"),
    (orjson.dumps({"inputs": [{"name": "x", "shape": [2, 3], "datatype": "FP32", "data": [1] * 6},
                              {"name": "y", "shape": [2, 3], "datatype": "FP32", "data": [1] * 6}]}),
     422, "exactly one tensor"),
    (orjson.dumps({"outputs": [{"name": "logits"}], "inputs": [
        {"name": "x", "shape": [1, 3], "datatype": "FP32", "data": [1, 2, 3]}]}),
     422, "unknown output(s) ['logits']"),
    (orjson.dumps({"parameters": {"timeout": -5}, "inputs": [
        {"name": "x", "shape": [1, 3], "datatype": "FP32", "data": [1, 2, 3]}]}),
     422, "parameters.timeout must be a positive number of microseconds"),
])
def test_v2_bad_bodies_name_what_was_expected(body: bytes, status: int, needle: str) -> None:
    with pytest.raises(InvalidInput) as info:
        decode_v2(body, 3, OUTPUTS)
    assert info.value.status_code == status
    assert needle in info.value.message


def test_v1_rows_and_errors() -> None:
    plain = decode_v1(b'{"instances": [[1, 2], [3, 4]]}', 2)
    np.testing.assert_array_equal(plain.x, [[1, 2], [3, 4]])
    assert plain.probabilities is False
    assert decode_v1(b'{"instances": [[1, 2]], "parameters": {"probabilities": true}}',
                     2).probabilities is True
    for body, needle in [(b'{"instances": []}', "at least one row"),
                         (b'{"inputs": [[1, 2]]}', '"instances"'),
                         (b'{"instances": [[1, 2, 3]]}', "each row must have 2 numbers"),
                         (b'{"instances": [1, 2]}', "each row must have 2 numbers"),
                         (b'{"instances": [[1, 2]], "parameters": []}',
                          "parameters must be an object, got []"),
                         (b'{"instances": [[1, 2]], "parameters": {"probabilities": 1}}',
                          "parameters.probabilities must be true or false, got 1")]:
        with pytest.raises(InvalidInput) as info:
            decode_v1(body, 2)
        assert needle in info.value.message


def test_encoders_follow_the_protocols() -> None:
    specs = (OutputSpec("predict", "INT64", (-1,)), OutputSpec("predict_proba", "FP64", (-1, 2)))
    outputs = (np.array([1, 0]), np.array([[0.25, 0.75], [0.5, 0.5]]))
    doc = orjson.loads(encode_v2("m", "1", "abc", specs, outputs, None)[0])
    assert doc == {"model_name": "m", "model_version": "1", "id": "abc", "outputs": [
        {"name": "predict", "datatype": "INT64", "shape": [2], "data": [1, 0]},
        {"name": "predict_proba", "datatype": "FP64", "shape": [2, 2],
         "data": [0.25, 0.75, 0.5, 0.5]}]}
    only = orjson.loads(encode_v2("m", "1", None, specs, outputs, ("predict_proba",))[0])
    assert [o["name"] for o in only["outputs"]] == ["predict_proba"] and "id" not in only
    assert orjson.loads(encode_v1(np.array(["cat", "dog"], dtype=object))) == {
        "predictions": ["cat", "dog"]}


def test_timeout_header_is_milliseconds() -> None:
    assert parse_timeout_header(b"250") == pytest.approx(0.25)
    for bad in (b"0", b"-1", b"soon", b"inf", b"nan"):
        with pytest.raises(InvalidInput) as info:
            parse_timeout_header(bad)
        assert info.value.status_code == 400


def test_compressed_bodies_are_inflated_within_the_limit() -> None:
    import gzip
    import zlib

    from tailguard_runtime.wire import decompress

    body = b'{"instances": [[1, 2]]}'
    assert decompress(gzip.compress(body), b"gzip", 1024) == body
    assert decompress(zlib.compress(body), b"deflate", 1024) == body
    assert decompress(body, b"identity", 1024) == body
    with pytest.raises(PayloadTooLarge):
        decompress(gzip.compress(b" " * 10_000), b"gzip", 1024)  # a small bomb
    with pytest.raises(InvalidInput) as info:
        decompress(body, b"br", 1024)
    assert info.value.status_code == 415
    with pytest.raises(InvalidInput) as info:
        decompress(b"not gzip", b"gzip", 1024)
    assert info.value.status_code == 400


def test_a_gzip_trailer_stating_more_than_the_limit_is_refused_before_inflating() -> None:
    import gzip
    import zlib

    from tailguard_runtime.errors import PayloadTooLarge
    from tailguard_runtime.wire import decompress

    bomb = gzip.compress(b" " * 4_000_000)
    with pytest.raises(PayloadTooLarge, match="would be 4000000 bytes .its gzip trailer says"):
        decompress(bomb, b"gzip", 1024)
    # a trailer that understates the size: inflated up to the limit, then refused all the same
    lying = bomb[:-4] + (100).to_bytes(4, "little")
    with pytest.raises(PayloadTooLarge, match="decompressed body exceeds the limit"):
        decompress(lying, b"gzip", 1024)
    # and one that understates a body inside the limit: zlib's own length check refuses it
    small = gzip.compress(b" " * 500)
    with pytest.raises(InvalidInput) as info:
        decompress(small[:-4] + (100).to_bytes(4, "little"), b"gzip", 1024)
    assert info.value.status_code == 400
    # a size deflate cannot reach from so few bytes is the tail of a cut stream, not a size
    cut = gzip.compress(b'{"instances": [[1, 2]]}')[:-3]
    with pytest.raises(InvalidInput, match="not valid gzip data") as info:
        decompress(cut + b"\xff\xff\xff", b"gzip", 1024)
    assert info.value.status_code == 400
    # a zlib (deflate) stream has no size trailer: its last bytes are a checksum, not read as one
    assert decompress(zlib.compress(b" " * 1000), b"deflate", 1024) == b" " * 1000


def test_too_many_rows_are_refused_before_their_data_is_converted() -> None:
    from tailguard_runtime.errors import PayloadTooLarge

    v2 = orjson.dumps({"inputs": [{"name": "x", "shape": [5, 1], "datatype": "FP64",
                                   "data": ["not", "even", "numbers", "!", "?"]}]})
    with pytest.raises(PayloadTooLarge, match="5 rows but the queue holds at most 4"):
        decode_v2(v2, 1, OUTPUTS, max_rows=4)
    with pytest.raises(PayloadTooLarge):
        decode_v1(b'{"instances": [[1], [2], [3]]}', 1, max_rows=2)


def test_a_body_that_is_not_json_gets_a_message_about_json() -> None:
    with pytest.raises(InvalidInput) as caught:
        decode_v1(b"not json", 3)
    assert caught.value.status_code == 400
    assert "not valid JSON" in caught.value.message and "NaN" not in caught.value.message


def test_identity_headers_carry_any_uri_as_ascii() -> None:
    headers = dict(served_by("fallback", "file:///models/modèle\n.joblib", "2"))
    assert headers == {b"x-tailguard-role": b"fallback",
                       b"x-tailguard-model": b"file:///models/mod%C3%A8le%0A.joblib",
                       b"x-tailguard-model-version": b"2"}


def test_v2_answer_carries_its_parameters() -> None:
    spec = OutputSpec("predict", "INT64", (-1,))
    doc = orjson.loads(encode_v2("m", "3", None, [spec], [np.array([1])], None,
                                 {"role": "primary", "model_uri": "builtin://iris/random-forest"}
                                 )[0])
    assert doc["model_version"] == "3"
    assert doc["parameters"] == {"role": "primary", "model_uri": "builtin://iris/random-forest"}


def test_a_body_of_more_arrays_than_rows_is_refused_before_parsing() -> None:
    """One array per row plus some slack passes (v1 instances, v2 nested data at the row
    limit); 1.6 MB of arrays nested 500 deep is refused by the count, not parsed."""
    from tailguard_runtime.wire import STRUCTURE_SLACK, check_structure

    rows = [[float(i), 1.0] for i in range(512)]
    check_structure(orjson.dumps({"instances": rows}), max_rows=512)
    check_structure(orjson.dumps({"inputs": [{"name": "x", "shape": [512, 2], "datatype": "FP64",
                                              "data": rows}], "outputs": [{"name": "label"}]}),
                    max_rows=512)
    nest = b"[" * 499 + b"]" * 499
    bomb = b'{"instances": [' + b",".join([nest] * 1600) + b"]}"
    with pytest.raises(InvalidInput) as info:
        check_structure(bomb, max_rows=512)
    assert info.value.status_code == 422
    assert "a request of at most 512 rows (maxQueueSize) holds about one per row" in \
        info.value.message
    too_many_rows = orjson.dumps({"instances": rows * 2})  # parsed: its own 413 names the rows
    check_structure(too_many_rows, max_rows=512)
    with pytest.raises(InvalidInput):
        check_structure(b"[" * (2 * 512 + STRUCTURE_SLACK + 1), max_rows=512)


def test_v2_one_tensor_per_named_feature_is_put_in_the_models_order() -> None:
    names = ("a", "b", "c")
    body = orjson.dumps({"inputs": [
        {"name": "c", "datatype": "INT64", "shape": [2], "data": [5, 6]},
        {"name": "a", "datatype": "FP64", "shape": [2, 1], "data": [1.5, 2.5]},
        {"name": "b", "datatype": "FP32", "shape": [2], "data": [[3], [4]]}], "id": "t"})
    request = decode_v2(body, 3, OUTPUTS, feature_names=names)
    np.testing.assert_array_equal(request.x, [[1.5, 3, 5], [2.5, 4, 6]])
    assert request.id == "t" and request.x.dtype == np.float64
    with pytest.raises(PayloadTooLarge):
        decode_v2(body, 3, OUTPUTS, max_rows=1, feature_names=names)
    # a model without feature names takes one tensor, and says so
    with pytest.raises(InvalidInput, match="exactly one tensor") as info:
        decode_v2(body, 3, OUTPUTS)
    assert "per feature" not in info.value.message
    with pytest.raises(InvalidInput, match="or one tensor per feature named a, b, c"):
        decode_v2(orjson.dumps({"inputs": []}), 3, OUTPUTS, feature_names=names)


def test_binary_tensor_data_in_and_out() -> None:
    x = np.arange(6, dtype=np.float32).reshape(3, 2)
    header = orjson.dumps({"inputs": [{"name": "x", "datatype": "FP32", "shape": [3, 2],
                                       "parameters": {"binary_data_size": x.nbytes}}],
                           "outputs": [{"name": "predict", "parameters": {"binary_data": True}},
                                       {"name": "predict_proba"}]})
    request = decode_v2(header, 2, OUTPUTS, binary=x.tobytes())
    np.testing.assert_array_equal(request.x, x)
    assert request.binary == frozenset({"predict"})
    everything = orjson.dumps({**orjson.loads(header), "outputs": None,
                               "parameters": {"binary_data_output": True}})
    assert decode_v2(everything, 2, OUTPUTS, binary=x.tobytes()).binary == set(OUTPUTS)
    for parameters, needle in (([], "parameters must be an object, got []"),
                               ({"binary_data": 1}, "binary_data must be true or false, got 1")):
        odd = orjson.dumps({**orjson.loads(header),
                            "outputs": [{"name": "predict", "parameters": parameters}]})
        with pytest.raises(InvalidInput, match=re.escape(needle)):
            decode_v2(odd, 2, OUTPUTS, binary=x.tobytes())
    specs = [OutputSpec("predict", "BYTES", (-1,)), OutputSpec("predict_proba", "FP64", (-1, 2))]
    proba = np.array([[0.25, 0.75]])
    body, length = encode_v2("m", "1", None, specs, [np.array(["cat"]), proba], None,
                             binary=frozenset(OUTPUTS))
    assert length is not None
    doc = orjson.loads(body[:length])
    assert [o["parameters"]["binary_data_size"] for o in doc["outputs"]] == [7, 16]
    assert "data" not in doc["outputs"][0]
    assert body[length:] == (3).to_bytes(4, "little") + b"cat" + proba.astype("<f8").tobytes()
    assert encode_v2("m", "1", None, specs, [np.array(["cat"]), proba], None)[1] is None


@pytest.mark.parametrize(("tensor", "tail", "status", "needle"), [
    ({"shape": [1, 2], "parameters": {"binary_data_size": 16}}, b"\0" * 8, 400,
     "declare 16 bytes of binary tensor data (parameters.binary_data_size), but 8 follow"),
    ({"shape": [1, 2], "parameters": {"binary_data_size": 8}}, b"\0" * 8, 422,
     "shape [1, 2] of FP64 needs 16 bytes, binary_data_size is 8"),
    ({"shape": [1, 2], "parameters": {"binary_data_size": -1}}, b"", 400,
     "binary_data_size must be a non-negative integer, got -1"),
    ({"shape": [1, 2], "parameters": {"binary_data_size": 16}}, None, 400,
     "needs the binary tensor data after a JSON header"),
    ({"shape": [1, 2], "parameters": {"binary_data_size": 16}},
     np.array([1.0, np.nan]).tobytes(), 422, "values must be finite numbers"),
    ({"shape": [1, 2], "datatype": "INT64", "parameters": {"binary_data_size": 16}},
     np.array([1, 2**60], dtype="<i8").tobytes(), 422, "INT64 values beyond 2**53"),
])
def test_binary_tensor_data_that_does_not_add_up_is_refused(
        tensor: dict[str, Any], tail: bytes | None, status: int, needle: str) -> None:
    header = orjson.dumps({"inputs": [{"name": "x", "datatype": "FP64", **tensor}]})
    with pytest.raises(InvalidInput) as info:
        decode_v2(header, 2, OUTPUTS, binary=tail)
    assert info.value.status_code == status
    assert needle in info.value.message
