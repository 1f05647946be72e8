"""A client that reads none of a large last answer (``Connection: close``) is cut off at the
send-stall timeout, over a real uvloop transport: closing waits for the write buffer to drain,
which a client that does not read never lets happen, so the stall must abort it even then,
and count it once."""

from __future__ import annotations

import asyncio
import socket
from typing import Callable

import uvicorn
import uvloop
from prometheus_client import REGISTRY
from uvicorn.server import ServerState

from tailguard_runtime.http.connections import bounded_protocol
from tailguard_runtime.settings import ConnectionSettings

BODY = b"x" * (8 * 1024 * 1024)  # far more than the kernel's socket buffers hold


async def large_answer(scope: dict, receive: Callable, send: Callable) -> None:
    await send({"type": "http.response.start", "status": 200,
                "headers": [(b"content-length", str(len(BODY)).encode())]})
    await send({"type": "http.response.body", "body": BODY})


def stalls() -> float:
    return REGISTRY.get_sample_value("tailguard_connections_closed_total",
                                     {"model": "stall-test", "reason": "send_stall"}) or 0.0


def test_a_closing_connection_whose_client_reads_nothing_is_aborted_once() -> None:
    protocol_class = bounded_protocol(ConnectionSettings(send_stall_timeout_s=0.5),
                                      model="stall-test")
    config = uvicorn.Config(large_answer, ws="none", lifespan="off", access_log=False,
                            log_config=None)
    config.load()
    state = ServerState()
    before = stalls()

    async def main() -> tuple[bool, bool]:
        loop = asyncio.get_running_loop()
        server = await loop.create_server(
            lambda: protocol_class(config=config, server_state=state, app_state={}),
            "127.0.0.1", 0)
        client = socket.socket()
        client.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        try:
            await loop.sock_connect(client, server.sockets[0].getsockname())
            await loop.sock_sendall(client, b"GET / HTTP/1.1\r\nHost: a\r\n"
                                            b"Connection: close\r\n\r\n")
            for _ in range(50):  # the answer is written and the connection closing
                await asyncio.sleep(0.05)
                conns = list(state.connections)
                if conns and conns[0].transport.is_closing():
                    break
            closing = bool(conns) and conns[0].transport.is_closing()
            for _ in range(100):  # 5 s, ten times the stall timeout
                if not state.connections:
                    break
                await asyncio.sleep(0.05)
            return closing, not state.connections
        finally:
            client.close()
            server.close()
            await server.wait_closed()

    closing, gone = uvloop.run(main())
    assert closing, "the answer never finished writing into the buffer: nothing under test"
    assert gone, "a closing connection whose client reads nothing was never aborted"
    assert stalls() - before == 1
