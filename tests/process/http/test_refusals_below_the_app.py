"""Refusals below the app, on a real runtime: a malformed request, a head past its deadline and
a connection past the cap are each answered in the protocol's JSON by the one error writer
(with ``date``, as answers through the app have) and counted in ``tailguard_rejections_total``
under the active role, as every other refusal is; ``tailguard_requests_total`` is left alone."""

from __future__ import annotations

import json
import socket
import time
from pathlib import Path
from types import ModuleType
from typing import Any, Iterator

import pytest

from harness.runtime import (
    RuntimeServer,
    gated_row,
    labels,
    new_gate,
    open_gate,
    probe_runtime,
    raw_exchange,
    read_response,
    scrape,
    v1_body,
)

NAME = "refusals"
CAP = 4
HEAD_TIMEOUT_S = 1.0


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory,
           probe_module: tuple[ModuleType, Path]) -> Iterator[tuple[RuntimeServer, Any]]:
    with probe_runtime(probe_module, tmp_path_factory.mktemp(NAME), name=NAME,
                       connections={"maxConnections": CAP,
                                    "requestHeadTimeoutSeconds": HEAD_TIMEOUT_S}) as pair:
        yield pair


def refusals(server: RuntimeServer, reason: str) -> tuple[float, float]:
    """This reason's rejections, and every answer counted by code, now."""
    with server.client() as client:
        samples = scrape(client)
    answers = sum(v for (name, found), v in samples.items()
                  if name == "tailguard_requests_total" and dict(found)["model"] == NAME)
    return samples[("tailguard_rejections_total", labels(NAME, reason=reason))], answers


def counted_once(server: RuntimeServer, reason: str, before: tuple[float, float]) -> None:
    deadline = time.monotonic() + 10
    while (now := refusals(server, reason))[0] == before[0] and time.monotonic() < deadline:
        time.sleep(0.05)
    assert now[0] - before[0] == 1, (reason, before, now)
    assert now[1] - before[1] == 0  # the scrapes are not inference answers


def check_json_refusal(status: int, headers: dict[str, str], body: bytes, expected: int) -> str:
    assert status == expected, (status, body)
    assert headers["content-type"] == "application/json" and headers["connection"] == "close"
    assert "date" in headers
    assert int(headers["content-length"]) == len(body)
    doc = json.loads(body)
    assert set(doc) == {"error"}
    return str(doc["error"])


def test_malformed_http_is_counted(served: tuple[RuntimeServer, Any]) -> None:
    server, _ = served
    before = refusals(server, "malformed_http")
    got = raw_exchange(server.port, b"GET /v2/health/live HTTP/1.1\nHost: x\n\n")
    assert "malformed HTTP request" in check_json_refusal(*got, expected=400)
    counted_once(server, "malformed_http", before)


def test_a_head_past_its_deadline_is_counted(served: tuple[RuntimeServer, Any]) -> None:
    server, _ = served
    before = refusals(server, "slow_head")
    with socket.create_connection(("127.0.0.1", server.port), timeout=30) as sock:
        sock.sendall(b"GET /v2/health/live HTTP/1.1\r\nHost: x\r\n")
        got = read_response(sock)
    message = check_json_refusal(*got, expected=408)
    assert message == f"request head not complete within {HEAD_TIMEOUT_S:g} s"
    counted_once(server, "slow_head", before)


def test_a_connection_past_the_cap_with_all_busy_is_counted(
        served: tuple[RuntimeServer, Any], probe_module: tuple[ModuleType, Path]) -> None:
    server, _ = served
    before = refusals(server, "connection_limit")
    gate = new_gate()
    body = json.dumps(v1_body(gated_row(gate))).encode()
    request = (f"POST /v1/models/{NAME}:predict HTTP/1.1\r\nHost: x\r\n"
               f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
               ).encode() + body
    busy = [socket.create_connection(("127.0.0.1", server.port), timeout=30)
            for _ in range(CAP)]
    try:
        for sock in busy:  # each waits for the gate: every connection has a request in progress
            sock.sendall(request)
        time.sleep(0.5)
        with socket.create_connection(("127.0.0.1", server.port), timeout=30) as extra:
            got = read_response(extra)
        status, headers, _ = got
        assert "all of them busy" in check_json_refusal(*got, expected=503)
        assert headers["retry-after"] == "1"
        open_gate(probe_module, gate)
        assert [read_response(sock)[0] for sock in busy] == [200] * CAP
    finally:
        open_gate(probe_module, gate)
        for sock in busy:
            sock.close()
    time.sleep(0.2)  # the answered connections' slots are free again before the scrape
    after = refusals(server, "connection_limit")
    assert after[0] - before[0] == 1, (before, after)


def gated_request(gate: int) -> bytes:
    """A v1 request whose batch waits for ``gate``, as raw HTTP/1.1."""
    body = json.dumps(v1_body(gated_row(gate))).encode()
    return (f"POST /v1/models/{NAME}:predict HTTP/1.1\r\nHost: x\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
            ).encode() + body


def metric(server: RuntimeServer, name: str, **wanted: str) -> float:
    """The sum of ``name``'s samples for this model whose labels include ``wanted``."""
    with server.client() as client:
        samples = scrape(client)
    return sum(v for (found_name, found), v in samples.items()
               if found_name == name and dict(found)["model"] == NAME
               and all(dict(found).get(k) == v for k, v in wanted.items()))


def test_a_request_pipelined_before_a_malformed_one_is_answered_first(
        served: tuple[RuntimeServer, Any], probe_module: tuple[ModuleType, Path]) -> None:
    """The refusal waits for the earlier answer: 200, then 400, then the connection closes.
    uvicorn wrote the 400 at once and closed, and the earlier answer was lost."""
    server, _ = served
    gate = new_gate()
    with socket.create_connection(("127.0.0.1", server.port), timeout=30) as sock:
        try:
            sock.sendall(gated_request(gate) + b"BREW /v2/health/live HTTP/1.1\r\nHost: x\r\n\r\n")
            time.sleep(0.5)  # the malformed request is parsed while the first one waits
            open_gate(probe_module, gate)
            first = read_response(sock)
            second = read_response(sock)
        finally:
            open_gate(probe_module, gate)
        assert first[0] == 200, first
        assert json.loads(first[2])["predictions"] is not None
        assert "malformed HTTP request" in check_json_refusal(*second, expected=400)
        assert sock.recv(1) == b""  # closed after the refusal


def test_requests_a_closed_connection_leaves_unanswered_are_counted_not_tracebacks(
        served: tuple[RuntimeServer, Any], probe_module: tuple[ModuleType, Path]) -> None:
    """A client pipelines four requests and closes: the one being served is computed and
    counted (its answer dropped), the three behind it are counted as never started, and the
    log says so in one line, without the traceback per request that writing to the closed
    connection gave."""
    server, _ = served
    gate = new_gate()
    running = metric(server, "tailguard_requests_unanswered_total", stage="running")
    pipelined = metric(server, "tailguard_requests_unanswered_total", stage="pipelined")
    ok = metric(server, "tailguard_requests_total", code="200")
    log_mark = len(server.log_text())
    try:
        with socket.create_connection(("127.0.0.1", server.port), timeout=30) as sock:
            sock.sendall(gated_request(gate) * 4)
            time.sleep(0.5)  # all four parsed: one waits at the gate, three behind it
    finally:
        open_gate(probe_module, gate)
    deadline = time.monotonic() + 10
    while (metric(server, "tailguard_requests_total", code="200") == ok
           and time.monotonic() < deadline):
        time.sleep(0.05)
    assert metric(server, "tailguard_requests_total", code="200") - ok == 1
    assert metric(server, "tailguard_requests_unanswered_total", stage="running") - running == 1
    assert metric(server, "tailguard_requests_unanswered_total",
                  stage="pipelined") - pipelined == 3
    log = server.log_text()[log_mark:]
    assert "Traceback" not in log and "Exception in ASGI application" not in log, log
    assert "left unanswered by connections that closed" in log, log
