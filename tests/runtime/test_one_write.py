"""A response's head and body leave in one write (``http11.OneWriteResponse``), over a real
uvloop transport on a socket pair: the peer sees nothing of the head until the body is
written, then both, in order."""

from __future__ import annotations

import asyncio
import socket
from types import SimpleNamespace
from typing import Any, Awaitable, Callable

import uvloop

from tailguard_runtime.http11 import OneWriteResponse

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


def cycle(method: str = "POST", started: bool = True) -> Any:
    return SimpleNamespace(response_started=started, scope={"method": method})


def test_the_head_waits_for_the_body_and_both_arrive_in_order() -> None:
    on_uvloop(head_waits_for_body)


async def head_waits_for_body(transport: asyncio.Transport, peer: socket.socket) -> None:
    writer = OneWriteResponse(transport, cycle())
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
    state = cycle(started=False)
    writer = OneWriteResponse(transport, state)
    writer.write(b"HTTP/1.1 100 Continue\r\n\r\n")  # the client waits for it to send its body
    await asyncio.sleep(0.05)
    assert received(peer) == b"HTTP/1.1 100 Continue\r\n\r\n"
    state.response_started = True
    writer.write(HEAD)
    await asyncio.sleep(0.05)
    assert received(peer) == b""


def test_a_head_answer_has_no_body_to_wait_for() -> None:
    on_uvloop(head_method)


async def head_method(transport: asyncio.Transport, peer: socket.socket) -> None:
    OneWriteResponse(transport, cycle(method="HEAD")).write(HEAD)
    await asyncio.sleep(0.05)
    assert received(peer) == HEAD


def test_closing_sends_a_held_head_first() -> None:
    on_uvloop(close_flushes)


async def close_flushes(transport: asyncio.Transport, peer: socket.socket) -> None:
    writer = OneWriteResponse(transport, cycle())
    writer.write(HEAD)
    writer.close()
    await asyncio.sleep(0.05)
    assert received(peer) == HEAD
    assert writer.is_closing()
