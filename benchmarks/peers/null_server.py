"""A do-nothing HTTP/1.1 server: answers every POST at once with a fixed small JSON body.

It measures the load generator's own ceiling (benchmarks/run.py and the README's number run against
it) and serves the load generator's tests: ``GET /v2/models/NAME`` answers Open Inference
Protocol v2 model metadata (``--features`` FP64 inputs, ``parameters.uri`` a builtin digits
model unless ``--uri`` names another, so that ``tailguard bench`` finds rows); ``GET /posts``
answers ``{"posts": N}``, the POSTs received so far (a test waits on it instead of a clock);
other GETs answer 404. For the load generator's tests it can also misbehave on purpose:

* ``--stall-at T --stall-seconds S``: stall once, T seconds after the first POST: no answer
  leaves for S seconds, then the held answers go out (a long GC pause, a blocked event loop);
* ``--delay-ms D``: every answer leaves D ms after its request arrived;
* ``--serial``: with ``--delay-ms``, one request at a time (a server of capacity 1000/D req/s,
  the rest queued in arrival order).

    python benchmarks/peers/null_server.py --port 9000 [--host 127.0.0.1] [--stall-at 1.5]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time

BODY = b'{"model_name":"null","outputs":[{"name":"predict","datatype":"INT64","shape":[1],"data":[1]}]}'
RESPONSE = (b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: "
            + str(len(BODY)).encode() + b"\r\n\r\n" + BODY)
NOT_FOUND = b"HTTP/1.1 404 Not Found\r\ncontent-type: application/json\r\ncontent-length: 21\r\n\r\n{\"error\":\"not found\"}"


def json_response(doc: object) -> bytes:
    """A 200 whose body is ``doc`` as JSON."""
    body = json.dumps(doc).encode()
    return (b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: "
            + str(len(body)).encode() + b"\r\n\r\n" + body)


def metadata_response(name: str, features: int, uri: str) -> bytes:
    """A 200 with v2 model metadata for ``name``: one FP64 input ``[-1, features]``."""
    return json_response({"name": name, "versions": ["1"], "platform": "null",
                          "inputs": [{"name": "input-0", "datatype": "FP64",
                                      "shape": [-1, features]}],
                          "parameters": {"uri": uri}})


class Behaviour:
    """How answers are delayed: ``delay_s`` each, ``serial`` one at a time, and one stall of
    ``stall_s`` starting ``stall_at_s`` after the first POST (0: no stall)."""

    def __init__(self, features: int, uri: str, delay_s: float, serial: bool, stall_at_s: float,
                 stall_s: float) -> None:
        self.features, self.uri = features, uri
        self.delay_s, self.serial = delay_s, serial
        self.stall_at_s, self.stall_s = stall_at_s, stall_s
        self.first = 0.0
        self.free_at = 0.0  # serial: when the one worker is next free
        self.posts = 0  # POSTs received

    def leave_at(self, now: float) -> float:
        """When the answer to a POST arriving at ``now`` (monotonic s) may leave."""
        if not self.first:
            self.first = now
        at = now + self.delay_s
        if self.serial:
            at = max(now, self.free_at) + self.delay_s
            self.free_at = at
        if self.stall_at_s:
            start = self.first + self.stall_at_s
            if start <= at < start + self.stall_s:
                at = start + self.stall_s
        return at


class NullHandler(asyncio.Protocol):
    """Answers each complete request (headers + Content-Length body) as the module says."""

    def __init__(self, behaviour: Behaviour) -> None:
        self.buf = bytearray()
        self.transport: asyncio.Transport | None = None
        self.behaviour = behaviour

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]  # uvloop's is not a subclass

    def data_received(self, data: bytes) -> None:
        buf = self.buf
        buf += data
        while True:
            end = buf.find(b"\r\n\r\n")
            if end < 0:
                return
            lines = bytes(buf[:end]).split(b"\r\n")
            length = 0
            for line in lines[1:]:
                key, _, value = line.partition(b":")
                if key.strip().lower() == b"content-length":
                    length = int(value)
            if len(buf) < end + 4 + length:
                return
            del buf[:end + 4 + length]
            self._answer(lines[0])

    def _answer(self, request_line: bytes) -> None:
        assert self.transport is not None
        method, _, rest = request_line.partition(b" ")
        path = rest.split(b" ", 1)[0].decode("latin-1")
        b = self.behaviour
        if method == b"GET":
            parts = path.strip("/").split("/")
            if len(parts) == 3 and parts[:2] == ["v2", "models"]:
                self.transport.write(metadata_response(parts[2], b.features, b.uri))
            elif path == "/posts":
                self.transport.write(json_response({"posts": b.posts}))
            else:
                self.transport.write(NOT_FOUND)
            return
        b.posts += 1
        if not (b.delay_s or b.stall_at_s):
            self.transport.write(RESPONSE)
            return
        now = time.monotonic()
        wait = b.leave_at(now) - now
        if wait > 0:
            asyncio.get_running_loop().call_later(wait, self._late, self.transport)
        else:
            self.transport.write(RESPONSE)

    @staticmethod
    def _late(transport: asyncio.Transport) -> None:
        if not transport.is_closing():
            transport.write(RESPONSE)


async def serve(host: str, port: int, behaviour: Behaviour) -> None:
    """Listen on ``host:port`` until cancelled; prints the address on stderr once listening."""
    server = await asyncio.get_running_loop().create_server(
        lambda: NullHandler(behaviour), host, port, backlog=1024)
    bound = server.sockets[0].getsockname()[1]
    print(f"null server on http://{host}:{bound}", file=sys.stderr, flush=True)
    async with server:
        await server.serve_forever()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True, help="0 picks a free port")
    parser.add_argument("--features", type=int, default=64, help="features in the metadata")
    parser.add_argument("--uri", default="builtin://digits/logistic-regression",
                        help="the model URI the metadata reports")
    parser.add_argument("--delay-ms", type=float, default=0.0, help="delay of every answer")
    parser.add_argument("--serial", action="store_true", help="one request at a time")
    parser.add_argument("--stall-at", type=float, default=0.0,
                        help="stall once, this many seconds after the first POST (0: never)")
    parser.add_argument("--stall-seconds", type=float, default=1.0)
    parser.add_argument("--no-uvloop", action="store_true")
    args = parser.parse_args()
    coro = serve(args.host, args.port, Behaviour(args.features, args.uri, args.delay_ms / 1e3,
                                                 args.serial, args.stall_at, args.stall_seconds))
    try:
        if args.no_uvloop:
            asyncio.run(coro)
        else:
            import uvloop
            uvloop.run(coro)
    except KeyboardInterrupt:
        pass


if __name__ == "__main__":
    main()
