"""Every bad request gets its own status and an ``{"error": ...}`` body that names what was
expected, and a bad request never hurts the good requests it arrives with."""

from __future__ import annotations

import gzip
import json
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import httpx
import numpy as np
import pytest

from harness.runtime import (
    DIGITS_MAX_QUEUE,
    RuntimeServer,
    error_of,
    raw_exchange,
    v1_body,
    v2_body,
    v2_outputs,
)
from tailguard_runtime.wire import max_valid_body_bytes

V2 = "/v2/models/digits/infer"
V1 = "/v1/models/digits:predict"
N = 64  # digits features
DEFAULT_MAX_BODY = 16 * 1024 * 1024  # RuntimeSettings.max_body_bytes; no config key sets it
DIGITS_MAX_BODY = max_valid_body_bytes(64, DIGITS_MAX_QUEUE)
"""The digits server's body limit: what its largest valid request can need (< 16 MiB)."""


@dataclass(frozen=True)
class Bad:
    """One bad request and what the answer must be."""

    id: str
    path: str
    body: bytes | None
    status: int
    says: tuple[str, ...]
    """Substrings the error message must contain (what was expected, or what was wrong)."""
    method: str = "POST"
    headers: dict[str, str] = field(default_factory=dict)


def _v2(*, shape: Any = (1, N), datatype: Any = "FP64", data: Any = None,
        **extra: Any) -> bytes:
    tensor = {"name": "input-0", "shape": list(shape) if isinstance(shape, tuple) else shape,
              "datatype": datatype, "data": [0.0] * N if data is None else data}
    return json.dumps({"inputs": [tensor], **extra}).encode()


def _bin_header(shape: list[int] | None = None) -> bytes:
    """The JSON header of a v2 request with one FP64 row of binary tensor data."""
    return json.dumps({"inputs": [{"name": "input-0", "shape": shape or [1, N],
                                   "datatype": "FP64",
                                   "parameters": {"binary_data_size": N * 8}}]}).encode()


_BIN_HEADER = _bin_header()
_BIN_ROW = np.zeros(N, dtype="<f8").tobytes()


def _raw_row(first: str) -> str:
    """A JSON row of 64 numbers whose first entry is the raw token ``first``."""
    return "[" + ", ".join([first] + ["0"] * (N - 1)) + "]"


def _deep(depth: int) -> Any:
    """A list nested ``depth`` levels deep around 0."""
    value: Any = 0
    for _ in range(depth):
        value = [value]
    return value


GOOD_ROW = [1.0] * N
_GZ = gzip.compress(json.dumps({"instances": [GOOD_ROW]}).encode())


def _gzip_flipped(from_end: int) -> bytes:
    """:data:`_GZ` with one bit flipped ``from_end`` bytes before its end: 8 is its CRC-32,
    4 its ISIZE (the trailer, RFC 1952)."""
    raw = bytearray(_GZ)
    raw[-from_end] ^= 1
    return bytes(raw)


BAD = [
    # unparseable bodies: 400
    Bad("malformed-json-v2", V2, b'{"inputs": [', 400, ("malformed JSON",)),
    Bad("malformed-json-v1", V1, b"{instances: [[1, 2]]}", 400, ("malformed JSON",)),
    Bad("nan-v2", V2, ('{"inputs": [{"name": "input-0", "shape": [1, 64], "datatype": "FP64", '
                       '"data": ' + _raw_row("NaN") + "}]}").encode(), 400, ("NaN",)),
    Bad("nan-v1", V1, ('{"instances": [' + _raw_row("NaN") + "]}").encode(), 400, ("NaN",)),
    Bad("infinity-v1", V1, ('{"instances": [' + _raw_row("Infinity") + "]}").encode(), 400,
        ("Infinity",)),
    Bad("overflow-to-infinity-v2", V2, ('{"inputs": [{"name": "input-0", "shape": [1, 64], '
                                        '"datatype": "FP64", "data": ' + _raw_row("1e999")
                                        + "}]}").encode(), 400, ("infinity",)),
    # well-formed JSON, wrong content: 422
    Bad("string-in-data-v2", V2, _v2(data=["1"] + [0] * (N - 1)), 422, ("number",)),
    Bad("bool-in-data-v2", V2, _v2(data=[True] + [0] * (N - 1)), 422, ("number", "true")),
    Bad("null-in-data-v2", V2, _v2(shape=(2, N), data=[[0] * N, [None] * N]), 422, ("number",)),
    Bad("string-in-instances-v1", V1, json.dumps({"instances": [["a"] * N]}).encode(), 422,
        ("number",)),
    Bad("null-in-instances-v1", V1, json.dumps({"instances": [[None] * N]}).encode(), 422,
        ("number",)),
    Bad("bool-in-instances-v1", V1, json.dumps({"instances": [[False] * N]}).encode(), 422,
        ("number",)),
    Bad("feature-count-v2", V2, _v2(shape=(1, 10), data=[0.0] * 10), 422, ("64",)),
    Bad("feature-count-v1", V1, json.dumps({"instances": [[0.0] * 10]}).encode(), 422, ("64",)),
    Bad("rank-1-shape-v2", V2, _v2(shape=(N,)), 422, ("shape", "64")),
    Bad("rank-3-shape-v2", V2, _v2(shape=(1, 8, 8)), 422, ("shape", "64")),
    Bad("flat-instances-v1", V1, json.dumps({"instances": [0.0] * N}).encode(), 422, ("64",)),
    Bad("rank-3-instances-v1", V1, json.dumps({"instances": [[[0.0] * N]]}).encode(), 422,
        ("64",)),
    Bad("ragged-instances-v1", V1, json.dumps({"instances": [[0.0] * N, [0.0] * 3]}).encode(),
        422, ("same length",)),
    Bad("data-count-vs-shape-v2", V2, _v2(shape=(2, N), data=[0.0] * N), 422, ("128", "64")),
    Bad("ragged-nested-data-v2", V2, _v2(shape=(2, N), data=[[0.0] * N, [0.0] * 3]), 422,
        ("same length",)),
    Bad("datatype-bytes-v2", V2, _v2(datatype="BYTES"), 422, ("FP64", "BYTES")),
    Bad("datatype-fp16-v2", V2, _v2(datatype="FP16"), 422, ("FP64", "FP16")),
    Bad("datatype-missing-v2", V2, _v2(datatype=None), 422, ("datatype", "FP64")),
    Bad("int64-with-fractions-v2", V2, _v2(datatype="INT64", data=[0.5] * N), 422, ("INT64",)),
    Bad("empty-instances-v1", V1, b'{"instances": []}', 422, ("instances",)),
    Bad("missing-instances-v1", V1, b'{"inputs": []}', 422, ("instances",)),
    Bad("zero-rows-v2", V2, _v2(shape=(0, N), data=[]), 422, ("no rows",)),
    Bad("no-inputs-v2", V2, b'{"inputs": []}', 422, ("inputs", "64")),
    Bad("two-inputs-v2", V2, json.dumps({"inputs": [json.loads(_v2())["inputs"][0]] * 2}).encode(),
        422, ("exactly one",)),
    Bad("body-not-object-v2", V2, b"[1, 2, 3]", 422, ("inputs",)),
    Bad("unknown-output-v2", V2, _v2(outputs=[{"name": "logits"}]), 422,
        ("logits", "predict_proba")),
    Bad("non-string-id-v2", V2, _v2(id=7), 422, ("'id'",)),
    Bad("bad-parameters-timeout-v2", V2, _v2(parameters={"timeout": -5}), 422,
        ("parameters.timeout",)),
    # accepted once, wrong: refused now
    Bad("int64-beyond-2**53-v2", V2, _v2(datatype="INT64", data=[2**53 + 1] + [0] * (N - 1)), 422,
        ("INT64", "2**53", "not rounded")),
    Bad("int64-below-minus-2**53-v2", V2, _v2(datatype="INT64", data=[-(2**53) - 1] + [0] * (N - 1)),
        422, ("2**53",)),
    Bad("fp32-out-of-range-v2", V2, _v2(datatype="FP32", data=[1e300] + [0] * (N - 1)), 422,
        ("FP32", "float32")),
    Bad("outputs-empty-v2", V2, _v2(outputs=[]), 422, ("outputs", "empty", "predict_proba")),
    # a value nested 255 deep (orjson writes at most 254 levels) inside the error's subject
    Bad("nested-255-in-error-v2", V2, _v2(data=[{"a": _deep(255)}] + [0] * (N - 1)), 422,
        ("must be numbers", "nested too deep")),
    Bad("nested-255-in-error-v1", V1, json.dumps({"instances": [[{"a": _deep(255)}] + [0] * (N - 1)]}
                                                 ).encode(), 422, ("must be numbers",)),
    Bad("nested-255-datatype-v2", V2, _v2(datatype=_deep(255)), 422, ("datatype",)),
    # Content-Encoding: one whole stream, checksum verified
    *[Bad(f"gzip-{what}-v1", V1, body, 400, says, headers={"Content-Encoding": "gzip"})
      for what, body, says in [
          ("bad-crc", _gzip_flipped(8), ("gzip", "incorrect data check")),
          ("bad-length", _gzip_flipped(4), ("gzip", "incorrect length check")),
          ("trailing-junk", _GZ + b"junk", ("4 bytes follow the end",)),
          ("second-member", _GZ + _GZ, ("second member",)),
          ("truncated", _GZ[:-4], ("truncated",)),
      ]],
    # bad deadline header: 400
    *[Bad(f"timeout-header-{v}", path, json.dumps(v1_body(np.zeros((1, N)))).encode()
          if path == V1 else _v2(), 400, ("X-Request-Timeout-Ms",),
          headers={"X-Request-Timeout-Ms": v})
      for v, path in [("abc", V2), ("0", V1), ("-5", V2), ("nan", V2), ("inf", V1)]],
    # binary tensor data whose framing does not add up: 400; whose sizes miss the shape: 422
    *[Bad(f"binary-{name}", path, body, status, says,
          headers={"Inference-Header-Content-Length": length})
      for name, path, body, length, status, says in [
          ("header-beyond-body", V2, _BIN_HEADER + _BIN_ROW, str(len(_BIN_HEADER) + 600), 400,
           ("Inference-Header-Content-Length is", "the body has")),
          ("header-not-a-number", V2, _BIN_HEADER + _BIN_ROW, "12k", 400,
           ("Inference-Header-Content-Length must be",)),
          ("bytes-left-over", V2, _BIN_HEADER + _BIN_ROW + b"\0" * 8, str(len(_BIN_HEADER)),
           400, ("declare 512 bytes", "520 follow")),
          ("on-v1", V1, _BIN_HEADER + _BIN_ROW, str(len(_BIN_HEADER)), 400,
           ("part of the v2 protocol",)),
          ("size-misses-the-shape", V2, _bin_header(shape=[2, N]) + _BIN_ROW,
           str(len(_bin_header(shape=[2, N]))), 422, ("needs 1024 bytes", "is 512")),
      ]],
    # more rows than the queue can ever hold: 413
    Bad("rows-over-queue-v2", V2, _v2(shape=(DIGITS_MAX_QUEUE + 1, N),
                                      data=[0.0] * N * (DIGITS_MAX_QUEUE + 1)), 413,
        (str(DIGITS_MAX_QUEUE + 1), str(DIGITS_MAX_QUEUE))),
    Bad("rows-over-queue-v1", V1, json.dumps({"instances": [[0.0] * N] * 1500}).encode(), 413,
        ("1500", str(DIGITS_MAX_QUEUE))),
    # unknown model or route: 404
    Bad("unknown-model-infer-v2", "/v2/models/nope/infer", _v2(), 404, ("nope",)),
    Bad("unknown-model-versioned-infer-v2", "/v2/models/nope/versions/1/infer", _v2(), 404,
        ("nope",)),
    Bad("unknown-model-predict-v1", "/v1/models/nope:predict",
        json.dumps({"instances": [GOOD_ROW]}).encode(), 404, ("nope",)),
    Bad("unknown-model-metadata", "/v2/models/nope", None, 404, ("nope",), method="GET"),
    Bad("unknown-model-ready", "/v2/models/nope/ready", None, 404, ("nope",), method="GET"),
    Bad("unknown-model-version-ready", "/v2/models/nope/versions/1/ready", None, 404, ("nope",),
        method="GET"),
    Bad("unknown-route-get", "/v2/no/such/route", None, 404, (), method="GET"),
    Bad("unknown-route-post", "/v3/models/digits/infer", _v2(), 404, ()),
]


def _send(client: httpx.Client, bad: Bad) -> httpx.Response:
    headers = {"content-type": "application/json", **bad.headers}
    return client.request(bad.method, bad.path, content=bad.body, headers=headers)


def _assert_answer(bad: Bad, response: httpx.Response) -> None:
    assert response.status_code == bad.status, (bad.id, response.status_code, response.text)
    assert response.headers["content-type"].startswith("application/json"), bad.id
    message = error_of(response)
    for fragment in bad.says:
        assert fragment.lower() in message.lower(), (bad.id, fragment, message)


@pytest.mark.parametrize("bad", BAD, ids=[b.id for b in BAD])
def test_bad_request_gets_its_status_and_an_error_body(digits_server: RuntimeServer,
                                                       bad: Bad) -> None:
    with digits_server.client() as client:
        _assert_answer(bad, _send(client, bad))


def test_declared_body_over_the_limit_is_refused_unread(digits_server: RuntimeServer) -> None:
    """A Content-Length over the limit is refused at once: no body is ever sent."""
    head = (f"POST {V2} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
            f"Content-Length: {DEFAULT_MAX_BODY + 1}\r\n\r\n").encode()
    status, headers, body = raw_exchange(digits_server.port, head)
    assert status == 413
    assert headers["content-type"].startswith("application/json")
    message = json.loads(body)["error"]
    assert str(DIGITS_MAX_BODY) in message


def test_chunked_body_over_the_limit_is_refused(digits_server: RuntimeServer) -> None:
    """Without a Content-Length the limit is enforced while reading."""
    head = (f"POST {V1} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
            "Transfer-Encoding: chunked\r\n\r\n").encode()
    piece = b" " * (1024 * 1024)
    chunks = [b"%x\r\n%s\r\n" % (len(piece), piece)] * 17 + [b"0\r\n\r\n"]
    status, headers, body = raw_exchange(digits_server.port, head, chunks)
    assert status == 413
    assert headers["content-type"].startswith("application/json")
    assert str(DIGITS_MAX_BODY) in json.loads(body)["error"]


def test_bad_requests_never_hurt_their_batch_mates(
        digits_server: RuntimeServer, digits_model: Any,
        digits_data: tuple[np.ndarray, np.ndarray]) -> None:
    """Every bad request above, sent at the same time as good ones: each bad one gets its own
    answer, and every good one is answered correctly."""
    x_all = digits_data[0]
    goods = [x_all[i * 7:i * 7 + 1 + i % 5] for i in range(40)]
    # offline answers first, in this thread: scikit-learn's predict in several threads at once
    # can trip its own warning about joblib configuration, which warnings-as-errors turns
    # into a failure of a good request
    expected = [digits_model.predict(x) for x in goods]

    def good(i: int) -> None:
        x = goods[i]
        if i % 2:
            r = client.post(V2, json=v2_body(x, id=f"good-{i}"))
            assert r.status_code == 200, r.text
            assert r.json()["id"] == f"good-{i}"
            np.testing.assert_array_equal(v2_outputs(r.json())["predict"], expected[i])
        else:
            r = client.post(V1, json=v1_body(x))
            assert r.status_code == 200, r.text
            np.testing.assert_array_equal(r.json()["predictions"], expected[i])

    def bad(case: Bad) -> None:
        _assert_answer(case, _send(client, case))

    with digits_server.client(limits=httpx.Limits(max_connections=16)) as client:
        with ThreadPoolExecutor(max_workers=12) as pool:
            futures = []
            for i in range(max(len(goods), len(BAD))):
                if i < len(goods):
                    futures.append(pool.submit(good, i))
                if i < len(BAD):
                    futures.append(pool.submit(bad, BAD[i]))
            for f in futures:
                f.result()
        ready = client.get("/v2/health/ready")
    assert ready.status_code == 200
