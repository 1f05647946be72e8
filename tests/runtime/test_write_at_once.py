"""``http11.write_at_once``: an answer written from plain code on the event loop, through
uvicorn's own cycle, over a real uvloop transport on a socket pair. The answer leaves while
the request's handler is still waiting, and the connection goes on serving; where the cycle
cannot take it at once, nothing is written and the handler sends as usual."""

from __future__ import annotations

import asyncio
import socket
from typing import Any, Callable

import uvicorn
import uvloop
from uvicorn.server import ServerState

from tailguard_runtime.connections import bounded_protocol
from tailguard_runtime.http11 import write_at_once
from tailguard_runtime.settings import ConnectionSettings

REQUEST = b"POST /x HTTP/1.1\r\nHost: a\r\nContent-Length: 2\r\n\r\nhi"
HEADERS = [(b"content-type", b"application/json"), (b"content-length", b"2")]


def received(peer: socket.socket) -> bytes:
    try:
        return peer.recv(65536)
    except BlockingIOError:
        return b""


async def answer(peer: socket.socket, ending: bytes) -> bytes:
    """What the peer reads until it ends with ``ending`` (at most 2 s)."""
    got = b""
    for _ in range(200):
        got += received(peer)
        if got.endswith(ending):
            return got
        await asyncio.sleep(0.01)
    raise AssertionError(f"no answer ending {ending!r}: {got!r}")


def serve(app: Callable[..., Any], case: Callable[[socket.socket, Any], Any]) -> None:
    """Run ``case(peer, protocol)`` on uvloop against the runtime's HTTP protocol (with the
    connection bounds) serving ``app`` on one end of a socket pair."""
    config = uvicorn.Config(app, ws="none", lifespan="off", access_log=False, log_config=None)
    config.load()

    async def main() -> None:
        ours, peer = socket.socketpair()
        peer.setblocking(False)
        protocol = bounded_protocol(ConnectionSettings(), model="test")(
            config=config, server_state=ServerState(), app_state={})
        transport, _ = await asyncio.get_running_loop().connect_accepted_socket(
            lambda: protocol, ours)
        try:
            await case(peer, protocol)
        finally:
            transport.close()
            peer.close()

    uvloop.run(main())


def test_the_answer_leaves_while_the_handler_waits_and_the_connection_goes_on() -> None:
    released = asyncio.Event()
    wrote: list[bool] = []
    finished: list[int] = []

    async def app(scope: dict, receive: Callable, send: Callable) -> None:
        await receive()
        loop = asyncio.get_running_loop()
        n = len(wrote) + 1
        # as the batcher's hand-out does: a plain callback, while the handler is parked
        loop.call_soon(lambda: wrote.append(write_at_once(send, 200, HEADERS, b"%d!" % n)))
        await released.wait()
        finished.append(n)

    async def case(peer: socket.socket, protocol: Any) -> None:
        peer.send(REQUEST)
        first = await answer(peer, b"1!")
        assert first.startswith(b"HTTP/1.1 200 OK\r\n") and b"content-length: 2" in first
        assert wrote == [True] and finished == []  # the handler is still waiting
        peer.send(REQUEST)  # keep-alive: the next request on the connection is served
        assert (await answer(peer, b"2!")).startswith(b"HTTP/1.1 200 OK\r\n")
        released.set()
        await asyncio.sleep(0.05)
        assert finished == [1, 2] and wrote == [True, True]
        assert not protocol.transport.is_closing()

    serve(app, case)


def test_nothing_is_written_while_writes_are_paused_and_the_handler_sends_it() -> None:
    outcomes: list[bool] = []

    async def app(scope: dict, receive: Callable, send: Callable) -> None:
        await receive()
        protocol = send.__self__.on_response.__self__  # the connection of this cycle
        protocol.pause_writing()  # as the transport does when the client stops reading
        outcomes.append(write_at_once(send, 200, HEADERS, b"ok"))
        protocol.resume_writing()
        await send({"type": "http.response.start", "status": 200, "headers": HEADERS})
        await send({"type": "http.response.body", "body": b"ok"})

    async def case(peer: socket.socket, protocol: Any) -> None:
        peer.send(REQUEST)
        got = await answer(peer, b"ok")
        assert got.count(b"HTTP/1.1") == 1 and outcomes == [False]

    serve(app, case)


def test_a_started_response_or_a_send_that_is_not_uvicorns_is_left_alone() -> None:
    outcomes: list[bool] = []

    async def not_uvicorns(message: dict) -> None:
        raise AssertionError("write_at_once must not call a send it does not know")

    async def app(scope: dict, receive: Callable, send: Callable) -> None:
        await receive()
        outcomes.append(write_at_once(not_uvicorns, 200, HEADERS, b"ok"))
        await send({"type": "http.response.start", "status": 200, "headers": HEADERS})
        outcomes.append(write_at_once(send, 200, HEADERS, b"ok"))
        await send({"type": "http.response.body", "body": b"ok"})

    async def case(peer: socket.socket, protocol: Any) -> None:
        peer.send(REQUEST)
        got = await answer(peer, b"ok")
        assert got.count(b"HTTP/1.1") == 1 and outcomes == [False, False]

    serve(app, case)
