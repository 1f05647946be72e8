"""Connections retire at their age: behind a Service, a client's kept-alive connection must
not pin it to the pods it first reached after traffic moved (a rollback) or new pods came (a
scale-out). An inference answer on a connection older than ``maxConnectionAgeSeconds`` says
``Connection: close``; the next request, on a new connection, is served as usual.
"""

from __future__ import annotations

import json
import socket
import time
from typing import Iterator

import pytest

from harness.runtime import RuntimeServer, batching, read_response, running_runtime

AGE_S = 2.0
"""``maxConnectionAgeSeconds`` of the server here; each connection's own is within ±10%. Long
enough that a busy machine answers a request well within it."""
V1 = "/v1/models/iris:predict"


@pytest.fixture(scope="module")
def aging(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RuntimeServer]:
    config = {"name": "iris",
              "models": [{"role": "primary", "uri": "builtin://iris/logistic-regression"}],
              "batching": batching(max_batch_size=8, timeout_ms=10_000),
              "connections": {"maxConnectionAgeSeconds": AGE_S}}
    with running_runtime(config, tmp_path_factory.mktemp("aging")) as server:
        yield server


def request(rows: object) -> bytes:
    body = json.dumps({"instances": rows}).encode()
    return (f"POST {V1} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\n\r\n").encode() + body


GOOD = request([[5.1, 3.5, 1.4, 0.2]])
BAD = request([[5.1, 3.5]])  # two features of four: 422


def closed_by_peer(sock: socket.socket, limit_s: float = 5.0) -> bool:
    """Whether the server closed ``sock`` (EOF) within ``limit_s`` seconds."""
    sock.settimeout(limit_s)
    try:
        return sock.recv(1) == b""
    except ConnectionResetError:
        return True
    except TimeoutError:
        return False


def test_answers_close_a_connection_past_its_age_and_the_next_one_is_served(
        aging: RuntimeServer) -> None:
    """Requests back to back on one connection: every answer is 200, those before its age
    keep it, and the first answer past its age says ``Connection: close`` and the server
    closes the connection after it; a new connection starts a new age."""
    for _ in range(2):  # the second round: a fresh connection starts a fresh age
        connected = time.monotonic()  # the server's clock for it starts later, not sooner
        sock = socket.create_connection(("127.0.0.1", aging.port))
        try:
            answers: list[tuple[float, str | None]] = []
            while True:
                sock.sendall(GOOD)
                status, headers, _ = read_response(sock)
                assert status == 200
                answers.append((time.monotonic() - connected, headers.get("connection")))
                if headers.get("connection") == "close":
                    break
                assert answers[-1][0] < 10 * AGE_S, "no answer closed the connection"
                time.sleep(0.02)
            assert closed_by_peer(sock), "the server kept the connection after saying close"
        finally:
            sock.close()
        assert len(answers) >= 2, answers  # requests every 20 ms or so until the age: kept
        assert all(connection is None for _, connection in answers[:-1]), answers
        assert answers[-1][0] >= 0.9 * AGE_S, answers[-1]  # never before its age


def test_a_refusal_past_the_age_closes_too(aging: RuntimeServer) -> None:
    """An error answer past the connection's age says ``Connection: close`` as a 200 would;
    before it, an error keeps the connection."""
    sock = socket.create_connection(("127.0.0.1", aging.port))
    try:
        sock.sendall(BAD)
        status, headers, _ = read_response(sock)
        assert (status, headers.get("connection")) == (422, None)
        time.sleep(1.2 * AGE_S)
        sock.sendall(BAD)
        status, headers, _ = read_response(sock)
        assert (status, headers.get("connection")) == (422, "close")
        assert closed_by_peer(sock)
    finally:
        sock.close()
