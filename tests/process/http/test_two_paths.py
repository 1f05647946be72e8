"""The two ways an inference request is served give the same answer, byte for byte.

A request whose whole body has arrived when it starts is served straight from the HTTP
protocol (``InferenceApp.direct``: no ASGI task); one whose body is still arriving, through
the ASGI app (``InferenceApp._infer``). Here each request is sent both ways on a real server:
in one write, and with its body held back until the head has been parsed (the body's second
half follows 0.3 s later; the server starts a request at the loop's next turn after its
head). The status line, every header but ``date`` (names, values, order) and the body must be
the same, and so must what happens to the connection.
"""

from __future__ import annotations

import json
import socket
import time
from pathlib import Path
from types import ModuleType
from typing import Any, Iterator

import numpy as np
import pytest

from harness.runtime import RuntimeServer, probe_rows, probe_runtime, v1_body, v2_body

NAME = "paths"
HOLD_S = 0.3
"""How long the second half of a held-back body waits: a turn of the loop is far shorter."""


@pytest.fixture(scope="module")
def paths(tmp_path_factory: pytest.TempPathFactory,
          probe_module: tuple[ModuleType, Path]) -> Iterator[RuntimeServer]:
    with probe_runtime(probe_module, tmp_path_factory.mktemp("paths"), name=NAME) as (server, _):
        yield server


def _raw_answer(sock: socket.socket) -> tuple[bytes, list[bytes], bytes, bool]:
    """One answer as sent: status line, header lines (``date`` left out), body, and whether
    the server closed the connection after it."""
    data = b""
    while b"\r\n\r\n" not in data:
        more = sock.recv(65536)
        assert more, f"closed before an answer: {data!r}"
        data += more
    head, _, body = data.partition(b"\r\n\r\n")
    status, *lines = head.split(b"\r\n")
    length = next(int(line.split(b":", 1)[1]) for line in lines
                  if line.lower().startswith(b"content-length:"))
    while len(body) < length:
        more = sock.recv(65536)
        assert more, "closed mid-body"
        body += more
    assert len(body) == length, "more bytes than one answer"
    sock.settimeout(0.5)
    try:
        closed = sock.recv(1) == b""
    except TimeoutError:
        closed = False
    return status, [line for line in lines if not line.lower().startswith(b"date:")], body, closed


def _exchange(port: int, request: bytes, split_at: int | None) -> tuple[Any, ...]:
    with socket.create_connection(("127.0.0.1", port), timeout=30) as sock:
        if split_at is None:
            sock.sendall(request)
        else:
            sock.sendall(request[:split_at])
            time.sleep(HOLD_S)
            sock.sendall(request[split_at:])
        return _raw_answer(sock)


def _request(path: str, body: bytes, *, version: str = "1.1", extra: tuple[str, ...] = ()
             ) -> tuple[bytes, int]:
    """The raw request, and where its body starts plus half of it (where to split it)."""
    head = "\r\n".join([f"POST {path} HTTP/{version}", "Host: 127.0.0.1",
                        "Content-Type: application/json", f"Content-Length: {len(body)}",
                        *extra]).encode() + b"\r\n\r\n"
    return head + body, len(head) + max(1, len(body) // 2)


ROWS = probe_rows(3, seed=11)
V1 = f"/v1/models/{NAME}:predict"
V2 = f"/v2/models/{NAME}/infer"
CASES: dict[str, tuple[str, bytes, dict[str, Any]]] = {
    "v1 200": (V1, json.dumps(v1_body(ROWS)).encode(), {}),
    "v2 200": (V2, json.dumps(v2_body(ROWS, id="r-7")).encode(), {}),
    "v2 wrong width 4xx": (V2, json.dumps(v2_body(np.ones((2, 3)))).encode(), {}),
    "v1 not JSON 400": (V1, b"{instances: [1, 2", {}),
    "unknown model 404": ("/v2/models/nobody/infer", json.dumps(v2_body(ROWS)).encode(), {}),
    "deadline header 400": (V1, json.dumps(v1_body(ROWS)).encode(),
                            {"extra": ("X-Request-Timeout-Ms: soon",)}),
    "client says close": (V1, json.dumps(v1_body(ROWS)).encode(),
                          {"extra": ("Connection: close",)}),
    "HTTP/1.0": (V1, json.dumps(v1_body(ROWS)).encode(), {"version": "1.0"}),
}


@pytest.mark.parametrize("case", list(CASES))
def test_a_request_gets_the_same_answer_whole_or_with_its_body_held_back(
        paths: RuntimeServer, case: str) -> None:
    path, body, options = CASES[case]
    request, split_at = _request(path, body, **options)
    whole = _exchange(paths.port, request, None)
    held = _exchange(paths.port, request, split_at)
    assert whole == held
    status, headers, _, closed = whole
    if case.endswith("200") or case in ("client says close", "HTTP/1.0"):
        assert status.startswith(b"HTTP/1.1 200 ")
        assert b"x-tailguard-role: primary" in headers
    if case in ("client says close", "HTTP/1.0"):
        assert b"connection: close" in headers and closed
    elif case.endswith("200"):
        assert b"connection: close" not in headers and not closed
