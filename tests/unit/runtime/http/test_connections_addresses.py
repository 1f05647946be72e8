"""A connection's ``server`` and ``client`` (the ASGI scope's) come from the addresses the
transport recorded at accept, over real TCP on uvloop: the same values uvicorn's own lookup
gives, and ``JsonHttpProtocol.connection_made`` sets what uvicorn's sets, without asking a
socket object (whose system calls release the GIL to the model's thread)."""

from __future__ import annotations

import asyncio
import json
import socket
from typing import Any, Awaitable, Callable

import pytest
import uvicorn
import uvloop
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol
from uvicorn.server import ServerState

from tailguard_runtime.http.connections import bounded_protocol
from tailguard_runtime.http.protocol import JsonHttpProtocol
from tailguard_runtime.settings import ConnectionSettings


async def echo_addresses(scope: dict, receive: Callable, send: Callable) -> None:
    body = json.dumps({"client": scope["client"], "server": scope["server"]}).encode()
    await send({"type": "http.response.start", "status": 200,
                "headers": [(b"content-length", str(len(body)).encode())]})
    await send({"type": "http.response.body", "body": body})


def echo_config() -> uvicorn.Config:
    config = uvicorn.Config(echo_addresses, ws="none", lifespan="off", access_log=False,
                            log_config=None)
    config.load()
    return config


def on_accepted_tcp(case: Callable[[asyncio.Transport, socket.socket], Awaitable[Any]]) -> Any:
    """Run ``case`` on uvloop with a real transport on the accepted end of a TCP connection
    on 127.0.0.1 and the connecting socket as the peer; return what it returns."""
    async def main() -> Any:
        with socket.create_server(("127.0.0.1", 0)) as listener:
            peer = socket.create_connection(listener.getsockname())
            ours, _ = listener.accept()
        try:
            transport, _ = await asyncio.get_running_loop().connect_accepted_socket(
                asyncio.Protocol, ours)
            try:
                return await case(transport, peer)
            finally:
                transport.close()
        finally:
            peer.close()
    return uvloop.run(main())


def ask(family: socket.AddressFamily, host: str, protocol_class: type) -> dict[str, Any]:
    """Serve :func:`echo_addresses` on ``host`` with ``protocol_class``; one request from a
    blocking client socket; the scope's addresses as seen by the app, and the true ones."""
    config = echo_config()

    async def main() -> dict[str, Any]:
        loop = asyncio.get_running_loop()
        server = await loop.create_server(
            lambda: protocol_class(config=config, server_state=ServerState(), app_state={}),
            host, 0, family=family)
        listening = server.sockets[0].getsockname()
        client = socket.socket(family)
        try:
            await loop.sock_connect(client, listening)
            await loop.sock_sendall(client, b"GET / HTTP/1.1\r\nHost: a\r\n\r\n")
            reply = b""
            while not reply.endswith(b"}"):
                chunk = await asyncio.wait_for(loop.sock_recv(client, 4096), 10)
                assert chunk, f"connection closed before the answer: {reply!r}"
                reply += chunk
            seen = json.loads(reply.split(b"\r\n\r\n", 1)[1])
            return {"seen": seen, "client": list(client.getsockname()[:2]),
                    "server": list(listening[:2])}
        finally:
            client.close()
            server.close()
            await server.wait_closed()

    return uvloop.run(main())


def has_ipv6_loopback() -> bool:
    try:
        with socket.socket(socket.AF_INET6) as sock:
            sock.bind(("::1", 0))
        return True
    except OSError:
        return False


FAMILIES = [pytest.param(socket.AF_INET, "127.0.0.1", id="ipv4"),
            pytest.param(socket.AF_INET6, "::1", id="ipv6",
                         marks=pytest.mark.skipif(not has_ipv6_loopback(),
                                                  reason="no IPv6 loopback here"))]


@pytest.mark.parametrize("family,host", FAMILIES)
@pytest.mark.parametrize("bounded", [False, True], ids=["json-errors", "connection-bounds"])
def test_the_scope_holds_the_connections_true_addresses(family: socket.AddressFamily,
                                                        host: str, bounded: bool) -> None:
    protocol_class = (bounded_protocol(ConnectionSettings(), model="test") if bounded
                      else JsonHttpProtocol)
    got = ask(family, host, protocol_class)
    assert got["seen"] == {"client": got["client"], "server": got["server"]}
    assert got["seen"]["client"][0] == host


@pytest.mark.parametrize("bounded", [False, True], ids=["json-errors", "connection-bounds"])
def test_connection_made_asks_no_socket_object(bounded: bool) -> None:
    """uvicorn's lookup goes through ``get_extra_info("socket")``; ours must not, nor may the
    connection bounds (they look the descriptor up only for a client that pipelines): uvloop
    makes a socket object for it, one more object per connection for the garbage collector."""
    protocol_class = (bounded_protocol(ConnectionSettings(), model="test") if bounded
                      else JsonHttpProtocol)
    asked: list[str] = []

    class Recording(asyncio.Transport):
        def __init__(self, real: asyncio.Transport) -> None:
            super().__init__()
            self.real = real

        def get_extra_info(self, name: str, default: Any = None) -> Any:
            asked.append(name)
            return self.real.get_extra_info(name, default)

    config = echo_config()

    async def case(real: asyncio.Transport, peer: socket.socket) -> tuple[Any, Any]:
        protocol = protocol_class(config=config, server_state=ServerState(), app_state={})
        protocol.connection_made(Recording(real))
        return (protocol.server, protocol.client), peer.getsockname()

    (server, client), peer_address = on_accepted_tcp(case)
    assert "socket" not in asked
    assert client == peer_address[:2] and server[0] == "127.0.0.1"


def test_connection_made_sets_what_uvicorns_own_sets() -> None:
    """The override copies uvicorn's ``connection_made`` (0.54, pinned in constraints.txt); if
    an upgrade makes it set anything else, or set it differently, this fails."""
    config = echo_config()

    async def case(transport: asyncio.Transport,
                   peer: socket.socket) -> tuple[dict[str, Any], dict[str, Any]]:
        state = ServerState()
        mine = JsonHttpProtocol(config=config, server_state=state, app_state={})
        theirs = JsonHttpProtocol(config=config, server_state=state, app_state={})
        mine.connection_made(transport)
        HttpToolsProtocol.connection_made(theirs, transport)
        assert state.connections == {mine, theirs}
        return dict(vars(mine)), dict(vars(theirs))

    mine, theirs = on_accepted_tcp(case)
    assert mine.keys() == theirs.keys()
    differing = {k for k in mine if mine[k] != theirs[k] and k not in ("parser", "flow")}
    assert differing == set(), {k: (mine[k], theirs[k]) for k in differing}
    assert type(mine["flow"]) is type(theirs["flow"])
