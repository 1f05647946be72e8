"""Forward a listening socket's connections to a port on this namespace's loopback.

Run inside the cluster's namespace (:class:`~harness.kube.holder.Holder` starts it with
``nsenter``) with the number of an inherited listening socket that was bound on the *host's*
``127.0.0.1``: a socket keeps the namespace it was made in, so the host's clients connect to it
and each connection is joined to ``127.0.0.1:PORT`` here. Stdlib only; ends on SIGTERM.

Usage: ``python forward.py FD PORT``
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import socket
import sys


async def _pump(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
        if writer.can_write_eof():
            writer.write_eof()
    except (ConnectionError, OSError):
        writer.close()


async def _serve(fd: int, port: int) -> None:
    async def joined(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            inner_reader, inner_writer = await asyncio.open_connection("127.0.0.1", port)
        except OSError:
            writer.close()
            return
        await asyncio.gather(_pump(reader, inner_writer), _pump(inner_reader, writer))
        for w in (writer, inner_writer):
            w.close()

    listener = socket.socket(fileno=fd)
    server = await asyncio.start_server(joined, sock=listener)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    async with server:
        await stop.wait()


def main() -> None:
    fd, port = int(sys.argv[1]), int(sys.argv[2])
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(_serve(fd, port))


if __name__ == "__main__":
    main()
