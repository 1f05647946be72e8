"""A do-nothing HTTP/1.1 server: answers every request with a fixed small JSON body.

It measures the load generator's own ceiling (bench/run.py runs one point against it): whatever
rate loadgen reaches here is far above what it is asked to drive against the real servers.

    python bench/peers/null_server.py --port 9000 [--host 127.0.0.1]
"""

from __future__ import annotations

import argparse
import asyncio
import sys

BODY = b'{"model_name":"null","outputs":[{"name":"predict","datatype":"INT64","shape":[1],"data":[1]}]}'
RESPONSE = (b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: "
            + str(len(BODY)).encode() + b"\r\n\r\n" + BODY)


class NullHandler(asyncio.Protocol):
    """Answers each complete request (headers + Content-Length body) with :data:`RESPONSE`."""

    def __init__(self) -> None:
        self.buf = bytearray()
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]  # uvloop's is not a subclass

    def data_received(self, data: bytes) -> None:
        buf = self.buf
        buf += data
        while True:
            end = buf.find(b"\r\n\r\n")
            if end < 0:
                return
            length = 0
            for line in bytes(buf[:end]).split(b"\r\n")[1:]:
                key, _, value = line.partition(b":")
                if key.strip().lower() == b"content-length":
                    length = int(value)
            if len(buf) < end + 4 + length:
                return
            del buf[:end + 4 + length]
            assert self.transport is not None
            self.transport.write(RESPONSE)


async def serve(host: str, port: int) -> None:
    """Listen on ``host:port`` until cancelled."""
    server = await asyncio.get_running_loop().create_server(NullHandler, host, port, backlog=1024)
    print(f"null server on http://{host}:{port}", file=sys.stderr, flush=True)
    async with server:
        await server.serve_forever()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    args = parser.parse_args()
    try:
        import uvloop
        uvloop.run(serve(args.host, args.port))
    except ImportError:
        asyncio.run(serve(args.host, args.port))
    except KeyboardInterrupt:
        pass


if __name__ == "__main__":
    main()
