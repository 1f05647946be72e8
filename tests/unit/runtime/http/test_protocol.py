"""A response's head and body leave in one write (``http11.OneWriteResponse``), over a real
uvloop transport on a socket pair: the peer sees nothing of the head until the body is
written, then both, in order. And a served request is freed without the garbage collector."""

from __future__ import annotations

import asyncio
import gc
import socket
import weakref
from typing import Awaitable, Callable

import pytest
import uvicorn
import uvloop
from uvicorn.server import ServerState

from tailguard_runtime.http.connections import bounded_protocol
from tailguard_runtime.http.protocol import JsonHttpProtocol, OneWriteResponse
from tailguard_runtime.settings import ConnectionSettings

HEAD = b"HTTP/1.1 200 OK\r\ncontent-length: 5\r\n\r\n"


def on_uvloop(case: Callable[[asyncio.Transport, socket.socket], Awaitable[None]]) -> None:
    """Run ``case`` on uvloop (the runtime's loop) with a real transport on one end of a
    socket pair and the other end, non-blocking, as the peer."""
    async def main() -> None:
        ours, peer = socket.socketpair()
        peer.setblocking(False)
        transport, _ = await asyncio.get_running_loop().connect_accepted_socket(
            asyncio.Protocol, ours)
        try:
            await case(transport, peer)
        finally:
            transport.close()
            peer.close()
    uvloop.run(main())


def received(peer: socket.socket) -> bytes:
    try:
        return peer.recv(65536)
    except BlockingIOError:
        return b""


def test_the_head_waits_for_the_body_and_both_arrive_in_order() -> None:
    on_uvloop(head_waits_for_body)


async def head_waits_for_body(transport: asyncio.Transport, peer: socket.socket) -> None:
    writer = OneWriteResponse(transport, head_only=False)
    writer.write(HEAD)
    await asyncio.sleep(0.05)
    assert received(peer) == b""
    writer.write(b"hello")
    await asyncio.sleep(0.05)
    assert received(peer) == HEAD + b"hello"
    writer.write(b"more")  # later parts (chunks) go out as they come
    await asyncio.sleep(0.05)
    assert received(peer) == b"more"


def test_what_is_written_before_the_response_starts_goes_out_at_once() -> None:
    on_uvloop(before_the_start)


async def before_the_start(transport: asyncio.Transport, peer: socket.socket) -> None:
    writer = OneWriteResponse(transport, head_only=False)
    writer.write(b"HTTP/1.1 100 Continue\r\n\r\n")  # the client waits for it to send its body
    await asyncio.sleep(0.05)
    assert received(peer) == b"HTTP/1.1 100 Continue\r\n\r\n"
    writer.write(HEAD)
    await asyncio.sleep(0.05)
    assert received(peer) == b""


def test_a_head_answer_has_no_body_to_wait_for() -> None:
    on_uvloop(head_method)


async def head_method(transport: asyncio.Transport, peer: socket.socket) -> None:
    OneWriteResponse(transport, head_only=True).write(HEAD)
    await asyncio.sleep(0.05)
    assert received(peer) == HEAD


def test_closing_sends_a_held_head_first() -> None:
    on_uvloop(close_flushes)


async def close_flushes(transport: asyncio.Transport, peer: socket.socket) -> None:
    writer = OneWriteResponse(transport, head_only=False)
    writer.write(HEAD)
    writer.close()
    await asyncio.sleep(0.05)
    assert received(peer) == HEAD
    assert writer.is_closing()


@pytest.mark.parametrize("bounded", [False, True], ids=["json-errors", "connection-bounds"])
def test_a_served_request_is_freed_without_the_garbage_collector(bounded: bool) -> None:
    """The cycle holds its writer; a writer holding its cycle back made every request garbage
    that only the collector frees: six times as many collections under load, about 6% of the
    throughput at 64 clients. With the collector off, a request's cycle must be gone once the
    next request on its connection has been answered, with the connection bounds too."""
    protocol_class = (bounded_protocol(ConnectionSettings(), model="test") if bounded
                      else JsonHttpProtocol)

    async def app(scope: dict, receive: Callable, send: Callable) -> None:
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-length", b"2")]})
        await send({"type": "http.response.body", "body": b"ok"})

    config = uvicorn.Config(app, ws="none", lifespan="off", access_log=False, log_config=None)
    config.load()
    request = b"GET /x HTTP/1.1\r\nHost: a\r\n\r\n"

    async def answer(peer: socket.socket) -> bytes:
        got = b""
        for _ in range(200):
            got += received(peer)
            if got.endswith(b"ok"):
                return got
            await asyncio.sleep(0.01)
        raise AssertionError(f"no answer: {got!r}")

    async def main() -> None:
        ours, peer = socket.socketpair()
        peer.setblocking(False)
        protocol = protocol_class(config=config, server_state=ServerState(), app_state={})
        transport, _ = await asyncio.get_running_loop().connect_accepted_socket(
            lambda: protocol, ours)
        try:
            peer.send(request)
            assert (await answer(peer)).startswith(b"HTTP/1.1 200")
            first = weakref.ref(protocol.cycle)
            peer.send(request)
            await answer(peer)
            await asyncio.sleep(0.05)
            assert protocol.cycle is not first()
            assert first() is None, gc.get_referrers(first())
        finally:
            transport.close()
            peer.close()

    gc.disable()
    try:
        uvloop.run(main())
    finally:
        gc.enable()
