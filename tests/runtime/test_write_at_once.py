"""``http11.cycle_to_write`` and ``write_at_once``: an answer written from plain code on the
event loop, through uvicorn's own cycle, over a real uvloop transport on a socket pair. The
answer leaves while the request's handler is still waiting, and the connection goes on
serving; where the cycle cannot take it at once, nothing is written and the handler sends as
usual; a response uvicorn refuses half-way closes the connection."""

from __future__ import annotations

import asyncio
import socket
from typing import Any, Callable

import uvicorn
import uvloop
from uvicorn.server import ServerState

from tailguard_runtime.connections import bounded_protocol
from tailguard_runtime.http11 import cycle_to_write, write_at_once
from tailguard_runtime.settings import ConnectionSettings

REQUEST = b"POST /x HTTP/1.1\r\nHost: a\r\nContent-Length: 2\r\n\r\nhi"
HEADERS = [(b"content-type", b"application/json"), (b"content-length", b"2")]


def write(send: Callable, headers: list[tuple[bytes, bytes]], body: bytes) -> bool:
    """As the inference route does: write at once when the cycle allows; whether it did."""
    cycle = cycle_to_write(send)
    if cycle is None:
        return False
    write_at_once(cycle, 200, headers, body)
    return True


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
        loop.call_soon(lambda: wrote.append(write(send, HEADERS, b"%d!" % n)))
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
        outcomes.append(write(send, HEADERS, b"ok"))
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
        raise AssertionError("a send that is not uvicorn's must not be called")

    async def app(scope: dict, receive: Callable, send: Callable) -> None:
        await receive()
        outcomes.append(write(not_uvicorns, HEADERS, b"ok"))
        await send({"type": "http.response.start", "status": 200, "headers": HEADERS})
        outcomes.append(write(send, HEADERS, b"ok"))
        await send({"type": "http.response.body", "body": b"ok"})

    async def case(peer: socket.socket, protocol: Any) -> None:
        peer.send(REQUEST)
        got = await answer(peer, b"ok")
        assert got.count(b"HTTP/1.1") == 1 and outcomes == [False, False]

    serve(app, case)


def test_a_response_uvicorn_refuses_half_way_closes_the_connection() -> None:
    errors: list[str] = []

    async def app(scope: dict, receive: Callable, send: Callable) -> None:
        await receive()
        cycle = cycle_to_write(send)
        assert cycle is not None
        try:  # a header value with a line break: uvicorn refuses it after starting the response
            write_at_once(cycle, 200, [(b"x-bad", b"a\r\nb"), *HEADERS], b"ok")
        except RuntimeError as exc:
            errors.append(str(exc))
        assert cycle_to_write(send) is None  # begun, and closing: nothing more goes through

    async def case(peer: socket.socket, protocol: Any) -> None:
        peer.send(REQUEST)
        for _ in range(200):
            if protocol.transport.is_closing():
                break
            await asyncio.sleep(0.01)
        assert errors and "header value" in errors[0]
        assert protocol.transport.is_closing()
        await asyncio.sleep(0.05)
        assert received(peer) == b""  # no head without its body

    serve(app, case)
