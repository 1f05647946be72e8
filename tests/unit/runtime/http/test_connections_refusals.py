"""Requests refused below the app (by the HTTP parser, at a head's deadline, at the connection
cap) are answered by the one error writer and reported once each to ``count_refusal``, over
real TCP on uvloop; a body past its deadline is answered but left for the app to count."""

from __future__ import annotations

import asyncio
import json
from typing import Any, Callable

import uvicorn
import uvloop
from uvicorn.server import ServerState

from tailguard_runtime import errors
from tailguard_runtime.http.connections import bounded_protocol
from tailguard_runtime.settings import ConnectionSettings


def serve_and_ask(settings: ConnectionSettings,
                  case: Callable[[tuple[str, int], asyncio.Event], Any]) -> tuple[Any, list[Any]]:
    """Serve an app that answers ``/wait`` once ``release`` is set (anything else at once)
    with ``settings``; run ``case(address, release)``; its result and the refusals counted."""
    counted: list[errors.TailguardError] = []
    protocol_class = bounded_protocol(settings, model="refusals", count_refusal=counted.append)

    async def main() -> Any:
        release = asyncio.Event()

        async def app(scope: dict, receive: Callable, send: Callable) -> None:
            if scope["path"] == "/wait":
                await release.wait()
            await send({"type": "http.response.start", "status": 200,
                        "headers": [(b"content-length", b"2")]})
            await send({"type": "http.response.body", "body": b"ok"})

        config = uvicorn.Config(app, ws="none", lifespan="off", access_log=False,
                                log_config=None)
        config.load()
        state = ServerState()
        loop = asyncio.get_running_loop()
        server = await loop.create_server(
            lambda: protocol_class(config=config, server_state=state, app_state={}),
            "127.0.0.1", 0)
        try:
            return await case(server.sockets[0].getsockname(), release)
        finally:
            release.set()
            server.close()
            await server.wait_closed()

    return uvloop.run(main()), counted


async def exchange(address: tuple[str, int], request: bytes,
                   limit_s: float = 10.0) -> bytes:
    """Send ``request`` on a new connection; everything read until the server closes it."""
    reader, writer = await asyncio.open_connection(*address)
    try:
        writer.write(request)
        return await asyncio.wait_for(reader.read(), limit_s)
    finally:
        writer.close()


def answer(raw: bytes) -> tuple[int, dict[str, str], Any]:
    head, _, body = raw.partition(b"\r\n\r\n")
    first, *lines = head.decode("latin-1").split("\r\n")
    headers = {k.lower(): v.strip() for k, v in (ln.split(":", 1) for ln in lines)}
    return int(first.split()[1]), headers, json.loads(body)


def test_a_request_the_parser_refuses_is_answered_and_counted_once() -> None:
    async def case(address: tuple[str, int], _: asyncio.Event) -> bytes:
        return await exchange(address, b"GET / HTTP/1.1\r\nContent-Length: 1x\r\n\r\n")

    raw, counted = serve_and_ask(ConnectionSettings(), case)
    status, headers, doc = answer(raw)
    assert status == 400 and headers["connection"] == "close"
    assert doc["error"].startswith("malformed HTTP request")
    assert [type(exc) for exc in counted] == [errors.MalformedHttp]


def test_a_head_past_its_deadline_is_a_counted_408() -> None:
    async def case(address: tuple[str, int], _: asyncio.Event) -> bytes:
        return await exchange(address, b"GET / HTTP/1.1\r\nHost: a\r\n")

    raw, counted = serve_and_ask(ConnectionSettings(request_head_timeout_s=0.2), case)
    status, headers, doc = answer(raw)
    assert status == 408 and headers["connection"] == "close"
    assert doc == {"error": "request head not complete within 0.2 s"}
    assert [exc.reason for exc in counted] == ["slow_head"]


def test_a_body_past_its_deadline_is_answered_but_left_to_the_app_to_count() -> None:
    async def case(address: tuple[str, int], _: asyncio.Event) -> bytes:
        return await exchange(address, b"POST /wait HTTP/1.1\r\nHost: a\r\n"
                                       b"Content-Length: 10\r\n\r\n{")

    raw, counted = serve_and_ask(ConnectionSettings(request_body_timeout_s=0.2), case)
    status, headers, doc = answer(raw)
    assert status == 408 and headers["connection"] == "close"
    assert doc == {"error": "request body not complete within 0.2 s"}
    assert counted == []


def test_a_connection_past_the_cap_with_every_one_busy_is_a_counted_503() -> None:
    async def case(address: tuple[str, int], release: asyncio.Event) -> tuple[bytes, bytes]:
        reader, writer = await asyncio.open_connection(*address)
        writer.write(b"GET /wait HTTP/1.1\r\nHost: a\r\n\r\n")  # in progress until released
        await writer.drain()
        await asyncio.sleep(0.1)
        refused = await exchange(address, b"")
        release.set()
        served = await asyncio.wait_for(reader.readuntil(b"ok"), 10)
        writer.close()
        return refused, served

    (refused, served), counted = serve_and_ask(ConnectionSettings(max_connections=1), case)
    status, headers, doc = answer(refused)
    assert status == 503 and headers["retry-after"] == "1" and headers["connection"] == "close"
    assert doc == {"error": "too many open connections (1), all of them busy"}
    assert served.startswith(b"HTTP/1.1 200")
    assert [exc.reason for exc in counted] == ["connection_limit"]

