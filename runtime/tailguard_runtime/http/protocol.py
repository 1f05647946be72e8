"""uvicorn's httptools protocol, with these changes at the HTTP/1.1 level (below any ASGI app).

* **Malformed HTTP gets the protocol's JSON error.** A request the parser refuses (a bad or
  duplicate ``Content-Length``, ``Content-Length`` with ``Transfer-Encoding``, bare LF line
  ends, an invalid URL) is answered ``400 {"error": "malformed HTTP request: ..."}`` with the
  parser's reason (and an HTTP/1.1 request without exactly one ``Host``, as RFC 9112 §3.2
  requires), a request target over :data:`MAX_URL_BYTES` with 414, a request head (or
  its trailers) over :data:`MAX_HEAD_BYTES` or :data:`MAX_HEADER_FIELDS` with 431, and the
  connection is closed; uvicorn answers ``text/plain``. The answer is the one error writer's
  (:func:`~tailguard_runtime.http.errors.raw_error`), and :meth:`JsonHttpProtocol.refused` is
  told of each refusal, for a subclass to count it.
* **Upgrade requests are served as plain HTTP/1.1** (RFC 9110 §7.8: a server may ignore
  ``Upgrade``). ``curl --http2`` sends ``Upgrade: h2c`` on a POST; httptools then skips the body
  and stops parsing, so uvicorn ran the request with an empty body. Here the request head is
  replayed without ``Upgrade`` into a fresh parser, followed by the bytes after it, so the body
  arrives as usual. WebSocket upgrades (``ws="none"`` in the server config) take the same path:
  the route answers as HTTP, a 404 JSON error for any path that is not a route. ``CONNECT``
  (an upgrade by method) is refused with 405.
* **A connection's addresses are the ones the transport recorded when it was accepted.**
  uvicorn asks a socket object made for the call (``get_extra_info("socket")``), and under
  uvloop that costs system calls that release the GIL; with the model's thread waiting for it,
  each one hands the GIL over, and every connection accepted in a burst waits its turn
  (:meth:`JsonHttpProtocol.connection_made`).
* **Pipelined answers keep their order.** A request the parser refuses after earlier requests
  of the same connection that are still unanswered waits for them: reading stops, their
  answers go out in order, then the refusal (:attr:`JsonHttpProtocol.last_word`), and the
  connection closes. uvicorn wrote the refusal at once and closed the connection, so the
  earlier answers were lost, and each one's write to the closed transport was an ERROR
  traceback.
* **Requests a closed connection leaves unanswered are counted, not logged one by one.** The
  request being served when the connection closed (its answer, if computed, is dropped quietly)
  and those pipelined behind it are reported to :meth:`JsonHttpProtocol.unanswered`. uvicorn
  marks only the last parsed request as disconnected, so the one being served wrote into the
  closed transport and raised.
* **A response's head and body go out in one write.** uvicorn writes the status line and
  headers, then the body, each with its own ``transport.write``, and uvloop sends each at once:
  two ``send(2)`` calls, and two TCP segments for the client to read, per answer. Here the head
  waits for the first part of the body (:class:`OneWriteResponse`), and both go out together.

* **Inference requests skip the ASGI cycle when they can.** A ``POST`` whose whole body is in
  when its turn comes is handed to the app's ``direct`` method
  (:meth:`~tailguard_runtime.http.app.InferenceApp.direct`) with a function that writes its
  whole answer (:meth:`JsonHttpProtocol.respond`): no task, coroutines or ASGI messages per
  request, about a fifth of the event loop's time per request (``benchmarks/README.md``,
  "Served straight from the protocol"). The answer's bytes, and what happens to the
  connection, are those uvicorn's cycle would have written
  (``tests/process/http/test_two_paths.py``).

Everything else (keep-alive, pipelining, flow control, the ASGI cycle) is uvicorn's own
``HttpToolsProtocol`` (uvicorn 0.54, ``uvicorn/protocols/http/httptools_impl.py``).
"""

from __future__ import annotations

import asyncio
import functools
import logging
from typing import Any, Callable, cast

import httptools
from uvicorn.logging import TRACE_LOG_LEVEL
from uvicorn.protocols.http.flow_control import FlowControl
from uvicorn.protocols.http.httptools_impl import (
    STATUS_LINE,
    HttpToolsProtocol,
    RequestResponseCycle,
)
from uvicorn.protocols.utils import is_ssl

from tailguard_runtime.errors import MalformedHttp, TailguardError
from tailguard_runtime.http.errors import raw_error

logger = logging.getLogger(__name__)

UPGRADE_HEADERS = frozenset((b"upgrade", b"http2-settings"))
"""Request headers dropped when an upgrade is ignored (``HTTP2-Settings`` only means something
with ``Upgrade: h2c``)."""


MAX_URL_BYTES = 8192
"""Longest request target, in bytes (nginx's default header buffer, 8 KiB); a longer one is
a 414 (every route of the runtime is well under 1 KiB)."""


MAX_HEAD_BYTES = 65536
"""Most bytes of a request that are not its body (request line, header fields, chunk framing,
trailers), counted as they arrive: 64 KiB (Go's and Node's defaults are 1 MiB and 16 KiB; every
client of the runtime sends well under 1 KiB). Past it, a 431 and the connection closes. The
parser joins a header value across reads by copying, so an unbounded head cost time quadratic
in its size on the event loop (one 16 MiB header value froze it for 15 s)."""
MAX_HEADER_FIELDS = 100
"""Most header fields of one request, trailers included (Apache's ``LimitRequestFields``
default). Past it, a 431: the ASGI scope holds every field, and a request of 300,000 trailers
was scanned on every slice of its body."""

CLIENT_GONE = "tailguard.client_gone"
"""The scope key, set on each request's ASGI scope, of a callable that says whether the
request's connection has closed: the app drops a body waiting for the decode thread when it
does (:class:`~tailguard_runtime.http.decoding.DecodeQueue`)."""

RETIRING = "tailguard.retiring"
"""The scope key the connection bounds set (to ``True``) on the ASGI scope of a request whose
connection has outlived its age (``maxConnectionAgeSeconds``): the app answers an inference
request that has it with ``Connection: close``."""

BODY_COMPLETE = "tailguard.body_complete"
"""The scope key set (to ``True``) on a request's ASGI scope once its whole body has been
parsed: the app's first ``receive()`` then returns at once, and it arms no timer for a wait
that cannot happen (most requests arrive in one read, before the app starts)."""

CONTINUE = b"HTTP/1.1 100 Continue\r\n\r\n"
"""The interim answer uvicorn writes before the response, for ``Expect: 100-continue``."""


class OneWriteResponse:
    """The transport one request's cycle writes through: its first write (uvicorn's status
    line and headers; an interim ``100 Continue`` goes out at once) is held until the next one
    (the body, or its first chunk), and the two go out in one ``writelines``. The answer to a
    ``HEAD`` request (``head_only``) has no body, so its head goes out at once; ``close`` sends
    a held head first. Anything else is the connection's transport's.

    It holds no reference to the cycle: the cycle holds it, and a reference back would make
    every request's cycle garbage that only the collector can free, which costs throughput
    (measured in ``benchmarks/README.md``, "Hostile clients", one write per response)."""

    __slots__ = ("_transport", "_head", "_pending")

    def __init__(self, transport: asyncio.Transport, head_only: bool) -> None:
        self._transport = transport
        self._head: bytes | None = None
        self._pending = not head_only  # the head is still to be written, and may wait

    def write(self, data: bytes) -> None:
        if self._transport.is_closing():  # uvloop raises on a closed transport
            return
        head = self._head
        if head is not None:
            self._head = None
            self._transport.writelines((head, data))
        elif self._pending and data != CONTINUE:
            self._pending = False
            self._head = data
        else:
            self._transport.write(data)

    def close(self) -> None:
        head, self._head = self._head, None
        if head is not None and not self._transport.is_closing():
            self._transport.write(head)
        self._transport.close()

    def is_closing(self) -> bool:
        return self._transport.is_closing()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._transport, name)


def _host_port(info: Any) -> tuple[str, int] | None:
    """``(host, port)`` from a transport's ``sockname`` or ``peername`` on an IPv4 or IPv6
    socket (IPv6's 4-tuple adds flow and scope ids); ``None`` for anything else."""
    if isinstance(info, tuple) and len(info) >= 2:
        return (str(info[0]), int(info[1]))
    return None


class UrlTooLong(Exception):
    """The request target grew past :data:`MAX_URL_BYTES` (raised inside the parser)."""


class BadHost(Exception):
    """An HTTP/1.1 request without exactly one ``Host`` field (raised inside the parser)."""


class TooManyFields(Exception):
    """A request's header fields (trailers included) passed :data:`MAX_HEADER_FIELDS` (raised
    inside the parser)."""


class JsonHttpProtocol(HttpToolsProtocol):
    """``HttpToolsProtocol`` whose parse errors are JSON and which ignores ``Upgrade``.

    Pass the class as ``uvicorn.Config(http=JsonHttpProtocol, ws="none")``.
    """

    replay: bytes | None = None
    """The head of an upgrade request without its upgrade headers, waiting for the parser to
    stop at the upgrade point; ``None`` otherwise."""
    fed = 0
    """Bytes given to the parser on this connection."""
    body_bytes = 0
    """Of them, body bytes (``on_body``)."""
    overhead_mark = 0
    """``fed - body_bytes`` when the last request ended: what came after is the next one's."""
    fields = 0
    """Header fields of the current request, trailers included."""
    in_message = False
    """Between the first byte of a request and the end of its body."""
    head_done = False
    """The current request's head is complete: ``cycle`` is its own."""
    running: RequestResponseCycle | None = None
    """The request whose ASGI task was started last (uvicorn's ``cycle`` is the one parsed
    last, which may wait in ``pipeline`` behind it)."""
    last_word: bytes | None = None
    """A refusal held until the earlier requests of the connection are answered; then it is
    written and the connection closes. Nothing more is read or parsed meanwhile."""

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        """uvicorn's ``connection_made`` (0.54), with ``server`` and ``client`` read from the
        addresses the transport recorded at accept (``sockname``, ``peername``: uvloop's
        ``TCPTransport`` and asyncio's socket transports both keep them). uvicorn's
        ``get_local_addr`` and ``get_remote_addr`` build a socket object and call
        ``getsockname``/``getpeername`` instead, which release the GIL: with the model's thread
        waiting for it, every such call hands the GIL over and waits to get it back. The event
        loop accepts every waiting connection in one go, so that cost is paid once per
        connection of a burst before any other client is served (the figures are in
        ``benchmarks/README.md``, "Hostile clients", ``get_local_addr``)."""
        self.connections.add(self)
        self.transport = transport
        self.flow = FlowControl(transport)
        sockname = transport.get_extra_info("sockname")
        # a Unix socket's own address is its path (uvicorn: ``(path, None)``); its peer has none
        self.server = (sockname, None) if isinstance(sockname, str) else _host_port(sockname)
        self.client = _host_port(transport.get_extra_info("peername"))
        self.scheme = "https" if is_ssl(transport) else "http"
        if self.logger.level <= TRACE_LOG_LEVEL:
            self.logger.log(TRACE_LOG_LEVEL, "%sHTTP connection made",
                            "%s:%d - " % self.client if self.client else "")

    def data_received(self, data: bytes) -> None:
        if self.last_word is not None:  # the stream was refused: nothing after it is a request
            return
        self._unset_keepalive_if_required()
        self.fed += len(data)
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserUpgrade as exc:
            self._replay(data[exc.args[0]:])
        except httptools.HttpParserError as exc:
            cause = exc.__context__  # what a parser callback (ours or uvicorn's) raised
            if isinstance(cause, UrlTooLong):
                self.send_error(MalformedHttp(
                    f"the request target exceeds {MAX_URL_BYTES} bytes", 414))
            elif isinstance(cause, BadHost):
                self.send_error(MalformedHttp(
                    "an HTTP/1.1 request needs exactly one Host header (RFC 9112 section 3.2)"))
            elif isinstance(cause, TooManyFields):
                self.send_error(MalformedHttp(
                    f"more than {MAX_HEADER_FIELDS} header fields (trailers included)", 431))
            else:
                self.send_error(MalformedHttp(f"malformed HTTP request: {cause or exc}"))
            return
        # checked after each read: the parser holds at most one read past the limit
        if (self.fed - self.body_bytes - self.overhead_mark > MAX_HEAD_BYTES
                and not self.transport.is_closing()):
            self.send_error(MalformedHttp(
                f"the request head exceeds {MAX_HEAD_BYTES} bytes (trailers and chunk framing "
                "included)", 431))

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self.fields = 0
        self.in_message = True
        self.head_done = False

    def on_header(self, name: bytes, value: bytes) -> None:
        self.fields += 1
        if self.fields > MAX_HEADER_FIELDS:
            raise TooManyFields()
        super().on_header(name, value)

    def on_url(self, url: bytes) -> None:
        super().on_url(url)
        if len(self.url) > MAX_URL_BYTES:
            raise UrlTooLong()

    def _replay(self, rest: bytes) -> None:
        """Parse the held head of an upgrade request again, without ``Upgrade``, then
        ``rest`` (the bytes after the head: its body and whatever follows)."""
        head, self.replay = self.replay, None
        if head is None:  # CONNECT: already answered
            return
        self.fed -= len(rest)  # counted when it first arrived; fed again below
        self.parser = httptools.HttpRequestParser(self)
        self.parser.set_dangerous_leniencies(lenient_data_after_close=True)
        self.data_received(head + rest)

    def on_headers_complete(self) -> None:
        self.head_done = True
        if (sum(1 for name, _ in self.headers if name == b"host") != 1
                and self.parser.get_http_version() != "1.0"):
            raise BadHost()
        if not self.parser.should_upgrade():
            super().on_headers_complete()
            self.scope[CLIENT_GONE] = self.transport.is_closing  # type: ignore[literal-required]
            return
        method = self.parser.get_method()
        if method == b"CONNECT":
            self.send_error(MalformedHttp("CONNECT is not supported", 405))
            return
        lines = [b"%s %s HTTP/%s\r\n" % (method, self.url, self.parser.get_http_version().encode())]
        for name, value in self.headers:
            if name in UPGRADE_HEADERS:
                continue
            if name == b"connection":
                tokens = [t.strip() for t in value.split(b",")]
                value = b", ".join(t for t in tokens if t.lower() not in UPGRADE_HEADERS)
                if not value:
                    continue
            lines.append(b"%s: %s\r\n" % (name, value))
        self.replay = b"".join(lines) + b"\r\n"

    def on_body(self, body: bytes) -> None:
        self.body_bytes += len(body)
        if self.replay is None:
            super().on_body(body)

    def on_message_complete(self) -> None:
        self.in_message = False
        self.overhead_mark = self.fed - self.body_bytes
        if self.replay is None and self.cycle is not None:  # None: a first request refused
            self.cycle.scope[BODY_COMPLETE] = True  # type: ignore[literal-required]
            super().on_message_complete()

    def send_400_response(self, msg: str) -> None:
        self.send_error(MalformedHttp(msg))

    def send_error(self, exc: TailguardError) -> None:
        """Answer ``exc`` (the one error writer's bytes, with ``Connection: close``) and close
        the connection: the parser cannot find the next request in a stream it refused. When
        earlier requests of the connection are still unanswered, the answer is held as
        :attr:`last_word` and reading stops; their answers go out first."""
        logger.info("refused a request at the HTTP level: %d %s", exc.status_code, exc.message)
        self.refused(exc)
        answer = raw_error(exc, self.server_state.default_headers, close=True)
        own = self.cycle if self.in_message and self.head_done else None
        if own is not None:  # the refused request's head was parsed: it never runs
            own.disconnected = True
            own.message_event.set()
            if self.pipeline and self.pipeline[0][0] is own:
                self.pipeline.popleft()
        running = self.running
        if self.pipeline or (running is not None and running is not own
                             and not running.response_complete):
            self.last_word = answer
            self.flow.pause_reading()
            return
        self.transport.write(answer)
        self.transport.close()

    def _start_asgi_task(self, cycle: RequestResponseCycle, app: Callable[..., Any]) -> None:
        """Start serving ``cycle``: a ``POST`` to an app that serves requests directly (one
        with a ``direct`` method, :meth:`~tailguard_runtime.http.app.InferenceApp.direct`)
        is handed to it at the loop's next turn, once the parser has had the rest of what
        was read (:meth:`serve_direct`); anything else gets uvicorn's ASGI task."""
        self.running = cycle
        if cycle.scope["method"] == "POST" and getattr(app, "direct", None) is not None:
            self.loop.call_soon(self.serve_direct, cycle, app)
            return
        self._asgi_task(cycle, app)

    def _asgi_task(self, cycle: RequestResponseCycle, app: Callable[..., Any]) -> None:
        """uvicorn's ASGI task for ``cycle``, writing through a :class:`OneWriteResponse` (a
        request served directly writes its answer in one write of its own)."""
        # the cycle uses write, close and is_closing; OneWriteResponse has them
        cycle.transport = cast(asyncio.Transport, OneWriteResponse(
            self.transport, cycle.scope["method"] == "HEAD"))
        super()._start_asgi_task(cycle, app)

    def serve_direct(self, cycle: RequestResponseCycle, app: Any) -> None:
        """Give ``cycle`` to ``app.direct(scope, body, respond)`` when its whole body has
        arrived, the client waits for no ``100 Continue`` and is still connected; uvicorn's
        ASGI task serves it when it has not, or when the app declines it. Reading resumes,
        as at the ASGI app's first ``receive()``: a client that closes while its request is
        computed is then seen to leave (its answer is dropped and counted as unanswered)."""
        if cycle.more_body or cycle.disconnected or cycle.waiting_for_100_continue:
            self._asgi_task(cycle, app)
            return
        self.flow.resume_reading()
        try:
            served = app.direct(cycle.scope, bytes(cycle.body),
                                functools.partial(self.respond, cycle))
        except Exception:  # a bug of ours before the app took the request: ASGI answers it
            logger.exception("serving %s directly failed", cycle.scope["path"])
            served = False
        if not served:
            self._asgi_task(cycle, app)

    def respond(self, cycle: RequestResponseCycle, status: int,
                headers: list[tuple[bytes, bytes]], body: bytes) -> None:
        """Write the whole answer to ``cycle`` (a request :meth:`serve_direct` handed to the
        app) in one write, as uvicorn's ``RequestResponseCycle.send`` would write its two ASGI
        messages: the status line, the server's default headers (``date``), ``headers``
        (which carry ``content-length``), ``connection: close`` when the connection is not
        kept (the client's HTTP/1.0 or ``Connection: close``, the server's shutdown, or
        ``headers`` saying so), then ``body``. The connection then closes or goes on to its
        next request. Nothing is written to a connection that has closed."""
        if cycle.disconnected or cycle.response_complete or self.transport.is_closing():
            return
        says_close = False
        parts = [STATUS_LINE[status]]
        for name, value in self.server_state.default_headers:
            parts += (name, b": ", value, b"\r\n")
        for name, value in headers:
            if name == b"connection":
                says_close = True  # the app's only value for it is "close"
            parts += (name, b": ", value, b"\r\n")
        if not cycle.keep_alive and not says_close:
            parts.append(b"connection: close\r\n")
        keep_alive = cycle.keep_alive = cycle.keep_alive and not says_close
        parts += (b"\r\n", body)
        self.transport.write(b"".join(parts))
        cycle.response_started = cycle.response_complete = True
        if not keep_alive:
            self.transport.close()
        cycle.on_response()

    def on_response_complete(self) -> None:
        """uvicorn's, unless a refusal waits (:attr:`last_word`): then the next pipelined
        request starts, or, with none left, the refusal is written and the connection
        closes."""
        if self.last_word is None:
            super().on_response_complete()
            return
        self.server_state.total_requests += 1
        if self.transport.is_closing():
            return
        if self.pipeline:
            cycle, app = self.pipeline.pop()
            self._start_asgi_task(cycle, app)
            return
        word, self.last_word = self.last_word, b""  # b"": said; still nothing more is read
        self.transport.write(word)
        self.transport.close()

    def connection_lost(self, exc: Exception | None) -> None:
        """uvicorn's, with every request the connection leaves unanswered marked as
        disconnected (uvicorn marks only the last parsed one, ``cycle``), so none of them
        writes to the closed transport, and counted (:meth:`unanswered`)."""
        running = self.running
        left_running = (running is not None and not running.response_complete
                        and not running.more_body)  # a request still arriving is the app's
        if running is not None and running is not self.cycle and not running.response_complete:
            running.disconnected = True
            running.message_event.set()
        pipelined = len(self.pipeline)
        for cycle, _ in self.pipeline:
            cycle.disconnected = True
        self.pipeline.clear()
        super().connection_lost(exc)
        if left_running or pipelined:
            self.unanswered(int(left_running), pipelined)

    def unanswered(self, running: int, pipelined: int) -> None:
        """Called when the connection closes with requests unanswered: ``running`` (0 or 1)
        whose body had arrived and whose answer was not written (the app still counts the
        answer it computes in ``tailguard_requests_total``), and ``pipelined`` parsed requests
        that never started. Nothing by default; the connection bounds count them
        (:mod:`tailguard_runtime.http.connections`)."""

    def refused(self, exc: TailguardError) -> None:
        """Called once for each request refused below the app (here: by the HTTP parser);
        nothing by default. The connection bounds count it
        (:mod:`tailguard_runtime.http.connections`)."""
