"""Every inference reply says which model answered it: the role, the model URI and its version.

The agreed interface (the SLO guard's tests and demos rely on it): on both protocols, every reply
produced once the request reached a role -- 200s and errors alike -- carries
``X-Tailguard-Role``, ``X-Tailguard-Model`` and ``X-Tailguard-Model-Version``; a v2 body's
``model_version`` is the served model's version and its ``parameters`` hold ``role`` and
``model_uri``. A request for another model never reached a role, so its 404 says nothing.
"""

from __future__ import annotations

from pathlib import Path
from types import ModuleType
from typing import Any, Iterator

import httpx
import numpy as np
import pytest

from harness.runtime import (
    RuntimeServer,
    batching,
    error_of,
    file_model,
    make_probe,
    probe_rows,
    running_runtime,
    v1_body,
    v2_body,
)

DIGITS_V2 = "/v2/models/digits/infer"
DIGITS_V1 = "/v1/models/digits:predict"


def _identity(response: httpx.Response) -> tuple[str | None, str | None, str | None]:
    headers = response.headers
    return (headers.get("x-tailguard-role"), headers.get("x-tailguard-model"),
            headers.get("x-tailguard-model-version"))


@pytest.fixture(scope="module")
def digits_uri(digits_server: RuntimeServer) -> str:
    with digits_server.client() as client:
        return str(client.get("/v2/models/digits").json()["parameters"]["uri"])


def test_v2_answer_names_role_model_and_version(digits_server: RuntimeServer,
                                                digits_uri: str) -> None:
    with digits_server.client() as client:
        reply = client.post(DIGITS_V2, json=v2_body(np.zeros((2, 64))))
    assert reply.status_code == 200, reply.text
    assert _identity(reply) == ("primary", digits_uri, "1")
    doc = reply.json()
    assert doc["model_version"] == "1"
    assert doc["parameters"] == {"role": "primary", "model_uri": digits_uri}
    assert digits_uri.startswith("file:///")


def test_v1_answer_names_role_model_and_version(digits_server: RuntimeServer,
                                                digits_uri: str) -> None:
    with digits_server.client() as client:
        reply = client.post(DIGITS_V1, json=v1_body(np.zeros((1, 64))))
    assert reply.status_code == 200, reply.text
    assert _identity(reply) == ("primary", digits_uri, "1")
    assert set(reply.json()) == {"predictions"}  # KServe v1 has no place for more


@pytest.mark.parametrize("path, body, status", [
    (DIGITS_V2, b"not json", 400),
    (DIGITS_V1, b"not json", 400),
    (DIGITS_V2, b'{"inputs": [{"name": "x", "shape": [1, 3], "datatype": "FP64", '
                b'"data": [1, 2, 3]}]}', 422),
    (DIGITS_V1, b'{"instances": [[1, 2]]}', 422),
    (DIGITS_V1, b'{"instances": [' + b", ".join([b"[0]"] * 2000) + b"]}", 413),
])
def test_error_replies_after_the_role_was_chosen_name_it_too(
        digits_server: RuntimeServer, digits_uri: str, path: str, body: bytes,
        status: int) -> None:
    with digits_server.client() as client:
        reply = client.post(path, content=body)
    assert reply.status_code == status, reply.text
    assert _identity(reply) == ("primary", digits_uri, "1")
    error_of(reply)


def test_a_body_that_is_not_json_is_told_so(digits_server: RuntimeServer) -> None:
    with digits_server.client() as client:
        reply = client.post(DIGITS_V1, content=b"not json")
    message = error_of(reply)
    assert reply.status_code == 400 and "not valid JSON" in message
    assert "NaN" not in message  # only a body holding NaN/Infinity gets that hint


def test_an_unknown_model_reached_no_role(digits_server: RuntimeServer) -> None:
    with digits_server.client() as client:
        reply = client.post("/v2/models/nope/infer", json=v2_body(np.zeros((1, 64))))
    assert reply.status_code == 404
    assert _identity(reply) == (None, None, None)


@pytest.fixture(scope="module")
def fallback_server(tmp_path_factory: pytest.TempPathFactory,
                    probe_module: tuple[ModuleType, Path]) -> Iterator[tuple[RuntimeServer, str]]:
    """A runtime serving only a fallback-role probe model of version ``7`` (as a cluster pod
    of the fallback Deployment does)."""
    workdir = tmp_path_factory.mktemp("served-by-fallback")
    _, path = make_probe(probe_module, workdir, "fallback-v7")
    model: dict[str, Any] = {**file_model(path, "fallback"), "version": "7"}
    config = {"name": "probe", "models": [model], "batching": batching(),
              "drainGraceSeconds": 10}
    with running_runtime(config, workdir, pythonpath=(probe_module[1],)) as server:
        yield server, model["uri"]


def test_the_fallback_role_and_its_version_are_named(
        fallback_server: tuple[RuntimeServer, str]) -> None:
    server, uri = fallback_server
    with server.client() as client:
        v2 = client.post("/v2/models/probe/infer", json=v2_body(probe_rows(3, seed=1)))
        v1 = client.post("/v1/models/probe:predict", json=v1_body(probe_rows(1, seed=2)))
        model_error = client.post("/v1/models/probe:predict",
                                  json={"instances": [[-999.0, 1.0, 2.0, 3.0]]})
    assert v2.status_code == 200 and v1.status_code == 200, (v2.text, v1.text)
    assert v2.json()["model_version"] == "7"
    assert v2.json()["parameters"] == {"role": "fallback", "model_uri": uri}
    assert model_error.status_code == 422
    for reply in (v2, v1, model_error):
        assert _identity(reply) == ("fallback", uri, "7")
