"""Below the routes: malformed HTTP, Upgrade requests and bodies cut short, on a real server.

Each case was reproduced against a running server: uvicorn answered malformed HTTP with
``text/plain``, a WebSocket handshake with an empty 403, ran ``curl --http2``'s ``Upgrade: h2c``
POST with an empty body, and ran a body cut short by the client through the model, counting a
200. Now every error is the protocol's JSON, Upgrade is ignored, and a part of a body never runs.
"""

from __future__ import annotations

import contextlib
import json
import socket
import time
from pathlib import Path
from types import ModuleType
from typing import Any, Iterator

import pytest

from harness.runtime import (
    GoodClient,
    RuntimeServer,
    labels,
    probe_rows,
    probe_runtime,
    raw_exchange,
    read_response,
    scrape,
    v1_body,
)

NAME = "wire"
V1 = f"/v1/models/{NAME}:predict"


@pytest.fixture(scope="module")
def wire(tmp_path_factory: pytest.TempPathFactory,
         probe_module: tuple[ModuleType, Path]) -> Iterator[tuple[RuntimeServer, Any]]:
    with probe_runtime(probe_module, tmp_path_factory.mktemp("wire"), name=NAME) as served:
        yield served


def _post_head(length: int, *extra: str) -> bytes:
    lines = [f"POST {V1} HTTP/1.1", "Host: 127.0.0.1", "Content-Type: application/json",
             f"Content-Length: {length}", *extra]
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


def _chunked_head(*extra: str) -> bytes:
    lines = [f"POST {V1} HTTP/1.1", "Host: 127.0.0.1", "Content-Type: application/json",
             "Transfer-Encoding: chunked", *extra]
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


BODY = json.dumps(v1_body(probe_rows(2, seed=5))).encode()

MALFORMED = {
    "duplicate-content-length": (_post_head(len(BODY), f"Content-Length: {len(BODY) + 1}") + BODY,
                                 400, "Content-Length"),
    "bad-content-length": (_post_head(0).replace(b"Content-Length: 0", b"Content-Length: 1x"),
                           400, "malformed HTTP request"),
    "content-length-with-chunked": (_post_head(len(BODY), "Transfer-Encoding: chunked")
                                    + b"0\r\n\r\n", 400, "Transfer-Encoding"),
    "bare-lf": ("GET /v2/health/live HTTP/1.1\nHost: 127.0.0.1\n\n".encode(), 400,
                "malformed HTTP request"),
    "100-kb-path": (b"GET /" + b"a" * 100_000 + b" HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n", 414,
                    "exceeds 8192 bytes"),
    "connect": (b"CONNECT 127.0.0.1:80 HTTP/1.1\r\nHost: 127.0.0.1:80\r\n\r\n", 405, "CONNECT"),
    "no-host": (b"GET /v2/health/live HTTP/1.1\r\n\r\n", 400, "exactly one Host header"),
    "two-hosts": (b"GET /v2/health/live HTTP/1.1\r\nHost: a\r\nHost: b\r\n\r\n", 400,
                  "exactly one Host header"),
    "1-mib-header-value": (_post_head(len(BODY), "X-Big: " + "a" * (1 << 20)) + BODY, 431,
                           "the request head exceeds 65536 bytes"),
    "101-header-fields": (_post_head(len(BODY), *(f"X-F{i}: 1" for i in range(98))) + BODY, 431,
                          "more than 100 header fields"),
    "200-trailers": (_chunked_head() + b"%x\r\n%s\r\n0\r\n" % (len(BODY), BODY)
                     + b"".join(b"X-T%d: 1\r\n" % i for i in range(200)) + b"\r\n", 431,
                     "more than 100 header fields (trailers included)"),
}


@pytest.mark.parametrize("case", list(MALFORMED))
def test_malformed_http_gets_a_json_error_and_the_connection_closes(
        wire: tuple[RuntimeServer, Any], case: str) -> None:
    request, status, needle = MALFORMED[case]
    server, _ = wire
    got, headers, body = raw_exchange(server.port, request)
    assert got == status, (got, body)
    assert headers["content-type"] == "application/json" and headers["connection"] == "close"
    doc = json.loads(body)
    assert set(doc) == {"error"} and needle in doc["error"], doc
    with server.client() as client:  # and the server is fine
        assert client.get("/v2/health/live").status_code == 200


def test_routes_answer_as_written_never_by_redirect_and_inference_takes_post_only(
        wire: tuple[RuntimeServer, Any]) -> None:
    """``GET /v2/`` was a 307 whose ``Location`` copied a foreign ``Host``; a GET on an
    inference route was a 404. An HTTP/1.0 request may omit ``Host``."""
    server, _ = wire
    got, headers, body = raw_exchange(
        server.port, b"GET /v2/ HTTP/1.1\r\nHost: evil.example\r\n\r\n")
    assert got == 404 and "location" not in headers, (got, headers)
    for path in (f"/v2/models/{NAME}/infer", V1):
        got, headers, body = raw_exchange(
            server.port, f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n".encode())
        assert got == 405 and headers["allow"] == "POST", (got, body)
        assert "inference takes POST" in json.loads(body)["error"]
    got, _, body = raw_exchange(server.port, b"GET /v2/health/live HTTP/1.0\r\n\r\n")
    assert got == 200, body


@pytest.mark.parametrize("path", ["/v2/models/nope/infer", "/v2/nope"], ids=["unknown-model",
                                                                             "unknown-path"])
def test_a_body_refused_before_it_is_read_is_never_read(
        wire: tuple[RuntimeServer, Any], path: str) -> None:
    """A 404 for a request that states a body of 10**12 bytes closes the connection at once:
    the server read gigabytes of such a body, answered or not, to find the next request."""
    server, _ = wire
    sent = 0
    with socket.create_connection(("127.0.0.1", server.port), timeout=30) as sock:
        sock.sendall(f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: "
                     f"application/json\r\nContent-Length: {10 ** 12}\r\n\r\n".encode())
        got, headers, body = read_response(sock)
        with contextlib.suppress(ConnectionResetError, BrokenPipeError):
            while sent < 64 << 20:  # the server closed: the kernel refuses long before this
                sock.sendall(b"x" * (1 << 16))
                sent += 1 << 16
    assert got == 404 and headers["connection"] == "close", (got, headers, body)
    assert sent < 64 << 20


def test_heads_and_bodies_within_the_limits_are_served(wire: tuple[RuntimeServer, Any]) -> None:
    """100 header fields; 60 KB of header values; a body of 200 rows sent in 100-byte chunks
    (its chunk framing counts toward the head's 64 KiB, and stays far under it)."""
    server, _ = wire
    fields = _post_head(len(BODY), *(f"X-F{i}: 1" for i in range(97))) + BODY
    values = _post_head(len(BODY), *(f"X-V{i}: {'v' * 6000}" for i in range(10))) + BODY
    rows = json.dumps(v1_body(probe_rows(200, seed=6))).encode()
    chunks = b"".join(b"%x\r\n%s\r\n" % (len(rows[i:i + 100]), rows[i:i + 100])
                      for i in range(0, len(rows), 100))
    chunked = _chunked_head() + chunks + b"0\r\n\r\n"
    for request in (fields, values, chunked):
        got, _, body = raw_exchange(server.port, request)
        assert got == 200, body


def test_a_16_mib_header_is_cut_off_while_a_good_client_is_served(
        wire: tuple[RuntimeServer, Any]) -> None:
    """The server answers 431 and closes once the head passes 64 KiB, long before the client
    has sent it all; a good client on another connection gets every answer meanwhile."""
    server, _ = wire
    with GoodClient(server, V1, BODY) as good:
        sent = 0
        with socket.create_connection(("127.0.0.1", server.port), timeout=30) as sock:
            sock.sendall(_post_head(len(BODY))[:-2])  # the head, still open
            value = b"X-Huge: " + b"a" * (1 << 16)
            with contextlib.suppress(ConnectionResetError, BrokenPipeError):
                sock.sendall(value)
                sent += len(value)
                while sent < 16 << 20:
                    sock.sendall(b"a" * (1 << 16))
                    sent += 1 << 16
            got, headers, body = read_response(sock)
        good.goes_on()
    assert got == 431 and headers["connection"] == "close", body
    assert "exceeds 65536 bytes" in json.loads(body)["error"]
    assert sent < 16 << 20  # refused before it was all sent
    assert good.answers and set(good.answers) == {200}, good.answers


def test_an_h2c_upgrade_is_served_as_http11_with_its_body(wire: tuple[RuntimeServer, Any]) -> None:
    """What ``curl --http2`` sends over plain HTTP; the body was lost (422 "no rows" or 400)."""
    server, model = wire
    upgrade = ("Connection: Upgrade, HTTP2-Settings", "Upgrade: h2c",
               "HTTP2-Settings: AAMAAABkAAQCAAAAAAIAAAAA")
    rows = probe_rows(2, seed=5)
    status, headers, body = raw_exchange(server.port, _post_head(len(BODY), *upgrade) + BODY)
    assert status == 200, body
    assert json.loads(body) == {"predictions": model.predict(rows).tolist()}
    # chunked, in pieces, and followed by a plain request on the same connection
    chunked = (f"POST {V1} HTTP/1.1\r\nHost: 127.0.0.1\r\n{upgrade[0]}\r\n{upgrade[1]}\r\n"
               f"{upgrade[2]}\r\nTransfer-Encoding: chunked\r\n\r\n").encode()
    pieces = [b"%x\r\n%s\r\n" % (len(BODY[:10]), BODY[:10]),
              b"%x\r\n%s\r\n0\r\n\r\n" % (len(BODY[10:]), BODY[10:])]
    with socket.create_connection(("127.0.0.1", server.port), timeout=30) as sock:
        sock.sendall(chunked)
        for piece in pieces:
            time.sleep(0.05)  # separate segments: the replayed parser keeps reading
            sock.sendall(piece)
        sock.sendall(b"GET /v2/health/live HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                     b"Connection: close\r\n\r\n")
        replies = b""
        while chunk := sock.recv(65536):
            replies += chunk
    first, second = replies.split(b"HTTP/1.1 ")[1:]
    assert first.startswith(b"200 ") and first.endswith(
        json.dumps({"predictions": model.predict(rows).tolist()}, separators=(",", ":")).encode())
    assert second.startswith(b"200 ") and second.endswith(b'{"live":true}')


def test_a_websocket_handshake_is_answered_as_http(wire: tuple[RuntimeServer, Any]) -> None:
    """uvicorn answered an empty 403 (no WebSocket route); there is no WebSocket here at all."""
    server, _ = wire
    handshake = ("Connection: Upgrade\r\nUpgrade: websocket\r\nSec-WebSocket-Version: 13\r\n"
                 "Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\r\n")
    for path, status, answer in (("/ws", 404, {"error": "Not Found"}),
                                 ("/v2/health/live", 200, {"live": True})):
        got, headers, body = raw_exchange(
            server.port, f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\n{handshake}".encode())
        assert got == status and headers["content-type"] == "application/json", (got, body)
        assert json.loads(body) == answer


@pytest.mark.parametrize("ending", ["close", "half-close"])
def test_a_body_cut_short_is_never_run_nor_counted_as_a_success(
        wire: tuple[RuntimeServer, Any], ending: str) -> None:
    """A Content-Length larger than what arrives, then the client closes or half-closes: the
    partial body once went through the model and counted as a 200."""
    server, _ = wire
    key, refusals = labels(NAME), ("tailguard_rejections_total",
                                   labels(NAME, reason="incomplete_body"))
    with server.client() as client:
        before = scrape(client)
        # a whole JSON document that would run, but shorter than its declared Content-Length
        with socket.create_connection(("127.0.0.1", server.port), timeout=30) as sock:
            sock.sendall(_post_head(len(BODY) + 10) + BODY)
            if ending == "half-close":
                sock.shutdown(socket.SHUT_WR)
                assert sock.recv(65536) == b""  # the server closes without an answer
        deadline = time.monotonic() + 30
        while True:  # counted once the server sees the connection close
            after = scrape(client)
            if after[refusals] > before[refusals] or time.monotonic() > deadline:
                break
            time.sleep(0.02)
    assert after[refusals] - before[refusals] == 1
    for name in ("tailguard_batch_size_rows_count", "tailguard_request_duration_seconds_count"):
        assert after[(name, key)] == before[(name, key)], name  # the model never ran
    ok = ("tailguard_requests_total", labels(NAME, code="200"))
    assert after[ok] == before[ok]
