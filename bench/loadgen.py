"""A lean closed-loop HTTP/1.1 load generator for the inference benchmarks.

``N`` clients, each on its own keep-alive connection, send one request (one row of the reference
model's 20 features), wait for the whole answer, and send the next at once, for a warm-up period
and then a measured window of fixed length; it stops by itself when the window ends, when
``--max-requests`` requests have been sent, or when ``--hard-timeout`` seconds have passed.

It is written on asyncio protocols (uvloop when installed) with a hand-rolled HTTP/1.1 client:
requests are pre-encoded bytes, responses are parsed only as far as the status code and the body's
end (``Content-Length`` or chunked transfer encoding). There is no coroutine per request: the
answer's ``data_received`` callback records the latency and writes the next request. One core
drives well over 10,000 requests per second this way, so at the runtime's rates it is not the
bottleneck; ``client_cpu`` in the report (CPU seconds used by this process per wall second of the
measured window) says how close it came.

    python bench/loadgen.py --url http://127.0.0.1:8080/v2/models/ref/infer --format v2 \\
        --clients 64 --duration 10 --warmup 3

Prints one JSON object (see :func:`summarize`) on stdout. Only loopback targets are accepted
unless ``--allow-remote`` is given.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import resource
import socket
import sys
import time
from typing import Any, Callable, Sequence
from urllib.parse import urlsplit

FORMATS = ("v2", "v1", "mosec")
N_FEATURES = 20
LOOPBACK_HOSTS = ("127.0.0.1", "localhost", "::1")


def make_rows(n_rows: int, n_features: int = N_FEATURES, seed: int = 1) -> list[list[float]]:
    """``n_rows`` rows of ``n_features`` standard-normal floats (the reference model's input)."""
    rng = random.Random(seed)
    return [[rng.gauss(0.0, 1.0) for _ in range(n_features)] for _ in range(n_rows)]


def encode_body(row: Sequence[float], fmt: str) -> bytes:
    """The JSON body that carries one row in protocol ``fmt``.

    ``v2``: Open Inference Protocol (tailguard, MLServer), a tensor ``x`` of shape ``[1, 20]``;
    ``v1``: KServe v1 ``{"instances": [row]}``; ``mosec``: ``{"x": row}`` (bench/peers/mosec_server.py).
    """
    data = [float(v) for v in row]
    if fmt == "v2":
        doc: Any = {"inputs": [{"name": "x", "shape": [1, len(data)], "datatype": "FP64",
                                "data": data}]}
    elif fmt == "v1":
        doc = {"instances": [data]}
    elif fmt == "mosec":
        doc = {"x": data}
    else:
        raise ValueError(f"unknown format {fmt!r}; one of {FORMATS}")
    return json.dumps(doc, separators=(",", ":")).encode()


def encode_request(host: str, port: int, path: str, body: bytes) -> bytes:
    """A complete HTTP/1.1 keep-alive POST with a JSON body."""
    head = (f"POST {path} HTTP/1.1\r\nHost: {host}:{port}\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n")
    return head.encode("ascii") + body


class ResponseParser:
    """Incremental HTTP/1.1 response parser: status code and body end, nothing else.

    :meth:`feed` takes bytes as they arrive and returns the status codes of the responses
    completed by them (usually zero or one). Handles ``Content-Length``, ``Transfer-Encoding:
    chunked`` (trailers skipped) and bodiless statuses (1xx, 204, 304). ``close`` is set when a
    completed response carried ``Connection: close``.

    Raises:
        ValueError: on a malformed status line, header block or chunk size.
    """

    __slots__ = ("buf", "status", "remaining", "chunked", "in_body", "close")

    def __init__(self) -> None:
        self.buf = bytearray()
        self.status = 0
        self.remaining = 0
        self.chunked = False
        self.in_body = False
        self.close = False

    def feed(self, data: bytes) -> list[int]:
        """Add ``data``; return the status codes of the responses it completed, in order."""
        buf = self.buf
        buf += data
        done: list[int] = []
        while True:
            if not self.in_body:
                end = buf.find(b"\r\n\r\n")
                if end < 0:
                    return done
                self._headers(bytes(buf[:end]))
                del buf[:end + 4]
                if self.status < 200 or self.status in (204, 304):
                    if self.status >= 200:
                        done.append(self.status)
                    continue
                self.in_body = True
            if self.chunked:
                if not self._chunks():
                    return done
            else:
                if len(buf) < self.remaining:
                    return done
                del buf[:self.remaining]
            self.in_body = False
            done.append(self.status)

    def _headers(self, head: bytes) -> None:
        lines = head.split(b"\r\n")
        status_line = lines[0]
        if not status_line.startswith(b"HTTP/1.") or len(status_line) < 12:
            raise ValueError(f"bad status line {status_line[:80]!r}")
        self.status = int(status_line[9:12])
        self.remaining = 0
        self.chunked = False
        for line in lines[1:]:
            key, _, value = line.partition(b":")
            key = key.strip().lower()
            if key == b"content-length":
                self.remaining = int(value)
            elif key == b"transfer-encoding":
                self.chunked = b"chunked" in value.lower()
            elif key == b"connection":
                self.close = self.close or b"close" in value.lower()

    def _chunks(self) -> bool:
        """Consume whole chunks; True once the last chunk and the trailers are consumed."""
        buf = self.buf
        while True:
            if self.remaining > 0:  # inside a chunk: its data plus the CRLF after it
                if len(buf) < self.remaining:
                    return False
                del buf[:self.remaining]
                self.remaining = 0
            line_end = buf.find(b"\r\n")
            if line_end < 0:
                return False
            size = int(bytes(buf[:line_end]).split(b";", 1)[0], 16)
            if size > 0:
                del buf[:line_end + 2]
                self.remaining = size + 2
                continue
            # last chunk: trailers until an empty line
            pos = line_end + 2
            while True:
                nxt = buf.find(b"\r\n", pos)
                if nxt < 0:
                    return False
                if nxt == pos:
                    del buf[:nxt + 2]
                    return True
                pos = nxt + 2


class LoadState:
    """Shared counters of one run. Times are ``time.perf_counter()`` seconds."""

    def __init__(self, requests: Sequence[bytes], measure_start: float, measure_end: float,
                 max_requests: int, timeout_s: float) -> None:
        self.requests = requests
        self.measure_start = measure_start
        self.measure_end = measure_end
        self.max_requests = max_requests
        self.timeout_s = timeout_s
        self.sent = 0
        self.latencies_ok: list[float] = []
        """Seconds, one per 200 answer to a request sent inside the measured window."""
        self.errors: dict[str, int] = {}
        """Error kind (HTTP status, ``timeout``, ``connection``) -> count, measured window only."""
        self.completed_in_window = 0
        self.stopped = False
        self.idle = asyncio.Event()
        self.active = 0

    def error(self, kind: str, sent_at: float) -> None:
        """Count an error of ``kind`` for a request sent at ``sent_at``."""
        if sent_at >= self.measure_start:
            self.errors[kind] = self.errors.get(kind, 0) + 1


class Client(asyncio.Protocol):
    """One closed-loop client on one keep-alive connection."""

    def __init__(self, state: LoadState, index: int, on_lost: Callable[["Client"], None]) -> None:
        self.state = state
        self.index = index
        self.on_lost = on_lost
        self.parser = ResponseParser()
        self.transport: asyncio.Transport | None = None
        self.sent_at = 0.0
        self.waiting = False
        self.retired = False
        self.next_request = index

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]  # uvloop's is not a subclass
        sock = transport.get_extra_info("socket")
        if sock is not None:
            try:
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            except OSError:
                pass

    def send(self) -> None:
        """Send the next request, or retire this client when the run is over."""
        state = self.state
        now = time.perf_counter()
        if state.stopped or now >= state.measure_end or state.sent >= state.max_requests:
            self.retire()
            return
        reqs = state.requests
        self.next_request = (self.next_request + 1) % len(reqs)
        state.sent += 1
        self.waiting = True
        self.sent_at = now
        assert self.transport is not None
        self.transport.write(reqs[self.next_request])

    def data_received(self, data: bytes) -> None:
        try:
            statuses = self.parser.feed(data)
        except ValueError:
            self._fail("bad_response")
            return
        if not statuses:
            return
        now = time.perf_counter()
        state = self.state
        sent_at = self.sent_at
        self.waiting = False
        status = statuses[-1]
        if sent_at >= state.measure_start:
            if status == 200:
                state.latencies_ok.append(now - sent_at)
            else:
                state.error(str(status), sent_at)
            if now <= state.measure_end:
                state.completed_in_window += 1
        if self.parser.close:
            self._reconnect()
            return
        self.send()

    def connection_lost(self, exc: Exception | None) -> None:
        self.transport = None
        if self.waiting:
            self.waiting = False
            self.state.error("connection", self.sent_at)
            self.on_lost(self)

    def check_timeout(self, now: float) -> None:
        """Abort the connection if its request has waited longer than the run's timeout."""
        if self.waiting and now - self.sent_at > self.state.timeout_s:
            self.waiting = False
            self.state.error("timeout", self.sent_at)
            self._reconnect()

    def _fail(self, kind: str) -> None:
        self.waiting = False
        self.state.error(kind, self.sent_at)
        self._reconnect()

    def _reconnect(self) -> None:
        transport, self.transport = self.transport, None
        self.waiting = False
        if transport is not None:
            transport.abort()
        self.on_lost(self)

    def retire(self) -> None:
        """Close the connection and tell the run this client is done (idempotent)."""
        if self.retired:
            return
        self.retired = True
        if self.transport is not None:
            self.transport.close()
            self.transport = None
        state = self.state
        state.active -= 1
        if state.active <= 0:
            state.idle.set()


def _factory(client: Client) -> Callable[[], Client]:
    """A protocol factory that hands out ``client`` itself."""
    return lambda: client


def percentile(sorted_values: Sequence[float], q: float) -> float:
    """Nearest-rank percentile ``q`` (0-100) of already sorted values; NaN when empty."""
    if not sorted_values:
        return float("nan")
    rank = max(1, min(len(sorted_values), int(-(-q * len(sorted_values) // 100))))
    return sorted_values[rank - 1]


def summarize(state: LoadState, window_s: float, clients: int, cpu_s: float) -> dict[str, Any]:
    """The run's report.

    Keys: ``clients``; ``duration_s`` (measured window, s); ``requests`` (200 answers to requests
    sent in the window); ``req_per_s`` (answers, 200 or not, completed inside the window per
    second); ``rows_per_s`` (= ``req_per_s``, one row per request); ``p50_ms``, ``p90_ms``,
    ``p95_ms``, ``p99_ms``, ``max_ms``, ``mean_ms`` (latency of 200 answers, ms, from the first
    byte written to the last byte read); ``errors`` (non-200 answers, timeouts and dropped
    connections) and ``error_kinds``; ``client_cpu`` (this process's CPU seconds per wall second
    of the window: near 1.0 means the load generator itself was saturated).
    """
    lat = sorted(state.latencies_ok)
    ms = [v * 1e3 for v in lat]
    rate = state.completed_in_window / window_s if window_s > 0 else 0.0
    return {
        "clients": clients,
        "duration_s": round(window_s, 3),
        "requests": len(lat),
        "req_per_s": round(rate, 1),
        "rows_per_s": round(rate, 1),
        "p50_ms": round(percentile(ms, 50), 3),
        "p90_ms": round(percentile(ms, 90), 3),
        "p95_ms": round(percentile(ms, 95), 3),
        "p99_ms": round(percentile(ms, 99), 3),
        "max_ms": round(ms[-1], 3) if ms else float("nan"),
        "mean_ms": round(sum(ms) / len(ms), 3) if ms else float("nan"),
        "errors": sum(state.errors.values()),
        "error_kinds": dict(sorted(state.errors.items())),
        "client_cpu": round(cpu_s / window_s, 3) if window_s > 0 else 0.0,
    }


def _cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


async def run_load(url: str, fmt: str, clients: int, duration_s: float, warmup_s: float = 2.0,
                   max_requests: int = 1_000_000, timeout_s: float = 10.0,
                   distinct_rows: int = 256, hard_timeout_s: float | None = None,
                   allow_remote: bool = False) -> dict[str, Any]:
    """Drive ``clients`` closed-loop clients against ``url`` and return :func:`summarize`'s report.

    ``fmt`` is one of :data:`FORMATS`; each request carries one row (cycling through
    ``distinct_rows`` pre-encoded rows). ``warmup_s`` seconds of load are sent and discarded
    first, then ``duration_s`` seconds are measured. A request unanswered after ``timeout_s``
    seconds counts as an error and its connection is reopened. The whole run ends after
    ``hard_timeout_s`` seconds (default: warm-up + duration + timeout + 5) even if answers are
    still missing.

    Raises:
        ValueError: bad arguments, or a non-loopback host without ``allow_remote``.
        OSError: the first connections could not be opened.
    """
    parts = urlsplit(url)
    host, port = parts.hostname or "", parts.port or 80
    if parts.scheme != "http":
        raise ValueError(f"only http:// URLs are supported, got {url!r}")
    if host not in LOOPBACK_HOSTS and not allow_remote:
        raise ValueError(f"refusing to load {host!r}: benchmarks target loopback only")
    if clients < 1 or duration_s <= 0 or max_requests < 1:
        raise ValueError("clients, duration and max_requests must be positive")
    path = parts.path + (f"?{parts.query}" if parts.query else "")
    requests = [encode_request(host, port, path, encode_body(row, fmt))
                for row in make_rows(distinct_rows)]
    loop = asyncio.get_running_loop()
    hard = hard_timeout_s if hard_timeout_s is not None else warmup_s + duration_s + timeout_s + 5

    state = LoadState(requests, float("inf"), float("inf"), max_requests, timeout_s)
    reconnecting: set[asyncio.Task[None]] = set()

    async def reconnect(client: Client) -> None:
        try:
            await loop.create_connection(lambda: client, host, port)
        except OSError:
            client.state.error("connection", time.perf_counter())
            await asyncio.sleep(0.05)
            if not state.stopped and time.perf_counter() < state.measure_end:
                _schedule(client)
                return
            client.retire()
            return
        client.parser = ResponseParser()
        client.send()

    def _schedule(client: Client) -> None:
        if state.stopped or time.perf_counter() >= state.measure_end:
            client.retire()
            return
        task = loop.create_task(reconnect(client))
        reconnecting.add(task)
        task.add_done_callback(reconnecting.discard)

    pool = [Client(state, i, _schedule) for i in range(clients)]
    for start in range(0, clients, 64):  # open connections in waves, all before any load
        await asyncio.gather(*(loop.create_connection(_factory(c), host, port)
                               for c in pool[start:start + 64]))
    state.active = clients
    t0 = time.perf_counter()
    state.measure_start = t0 + warmup_s
    state.measure_end = state.measure_start + duration_s
    for client in pool:
        client.send()

    async def watchdog() -> None:
        while not state.idle.is_set():
            await asyncio.sleep(0.1)
            now = time.perf_counter()
            for client in pool:
                client.check_timeout(now)

    dog = loop.create_task(watchdog())
    await asyncio.sleep(max(0.0, state.measure_start - time.perf_counter()))
    cpu0 = _cpu_seconds()
    await asyncio.sleep(max(0.0, state.measure_end - time.perf_counter()))
    cpu1 = _cpu_seconds()
    try:
        await asyncio.wait_for(state.idle.wait(), max(0.1, t0 + hard - time.perf_counter()))
    except asyncio.TimeoutError:
        pass
    state.stopped = True
    dog.cancel()
    for task in list(reconnecting):
        task.cancel()
    for client in pool:
        if client.waiting:
            client.waiting = False
            state.error("timeout", client.sent_at)
        if client.transport is not None:
            client.transport.abort()
    await asyncio.gather(dog, *reconnecting, return_exceptions=True)
    report = summarize(state, duration_s, clients, cpu1 - cpu0)
    report.update({"url": url, "format": fmt, "warmup_s": warmup_s, "sent": state.sent})
    return report


def run_sync(coro: Any) -> Any:
    """Run ``coro`` on uvloop when installed, else on asyncio's default loop."""
    try:
        import uvloop
    except ImportError:
        return asyncio.run(coro)
    return uvloop.run(coro)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--url", required=True, help="e.g. http://127.0.0.1:8080/v2/models/ref/infer")
    parser.add_argument("--format", choices=FORMATS, default="v2", help="request body format")
    parser.add_argument("--clients", type=int, default=16, help="concurrent closed-loop clients")
    parser.add_argument("--duration", type=float, default=10.0, help="measured window, seconds")
    parser.add_argument("--warmup", type=float, default=2.0, help="discarded load first, seconds")
    parser.add_argument("--max-requests", type=int, default=1_000_000,
                        help="stop sending after this many requests (warm-up included)")
    parser.add_argument("--timeout", type=float, default=10.0, help="per-request timeout, seconds")
    parser.add_argument("--hard-timeout", type=float, default=None,
                        help="end the whole run after this many seconds")
    parser.add_argument("--cpu", type=int, default=None, help="pin this process to one core")
    parser.add_argument("--allow-remote", action="store_true", help="allow a non-loopback host")
    args = parser.parse_args(argv)
    if args.cpu is not None and hasattr(__import__("os"), "sched_setaffinity"):
        __import__("os").sched_setaffinity(0, {args.cpu})
    try:
        report = run_sync(run_load(args.url, args.format, args.clients, args.duration,
                                   args.warmup, args.max_requests, args.timeout,
                                   hard_timeout_s=args.hard_timeout,
                                   allow_remote=args.allow_remote))
    except (OSError, ValueError) as exc:
        print(f"loadgen: {exc}", file=sys.stderr)
        return 2
    print(json.dumps(report))
    if report["client_cpu"] >= 0.9:
        print(f"loadgen: warning: client CPU {report['client_cpu']:.2f} of one core; the load "
              "generator may be the bottleneck", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
