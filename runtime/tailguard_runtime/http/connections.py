"""Per-connection bounds: what one client may hold open, parsed or unanswered.

uvicorn's httptools protocol (``uvicorn/protocols/http/httptools_impl.py``, read at 0.54) parses
every request in whatever it reads, queues pipelined ones without limit, arms its keep-alive
timer only after a first response, and has no timeout for a request's head or body. So one
client could hold memory (pipelined requests it never reads), and many could hold every file
descriptor (sockets that send nothing, or one header line at a time).
:class:`BoundedHttpToolsProtocol` is a subclass that adds, per connection:

* an idle timeout (``keep_alive_s``, ``keepAliveSeconds``) from the moment of connecting and
  from each answer until the next request begins (bytes that begin none, such as blank lines,
  do not count): close;
* a deadline for a request's head (``request_head_timeout_s`` from its first byte) and for its
  body (``request_body_timeout_s`` from the end of its head): 408 and close;
* at most ``max_pipelined`` parsed and unanswered requests; past that, the rest of what was
  read is held unparsed and reading pauses until answers go out;
* no reading from a client that does not read its answers: while more than
  :data:`MAX_UNREAD_BYTES` of answers wait in the kernel's send queue (``TIOCOUTQ``), nothing
  more of that connection is read or parsed, so a client pipelining cheap requests cannot keep
  the event loop busy answering into a socket it never drains;
* a deadline for such a client (``send_stall_timeout_s`` while its answers stay unread, or the
  write buffer stays above its high-water mark): close.

And one bound on time that closes nothing itself: a connection open longer than its age
(``max_age_s``, ``maxConnectionAgeSeconds``, drawn within ±10% per connection) marks its
requests retiring (:data:`~tailguard_runtime.http.protocol.RETIRING` in their scope), and the
app answers them ``Connection: close``. Behind a Service, the client's next connection goes
where traffic goes now.

The limits, and what the connections share, are a :class:`~tailguard_runtime.http.pool.ConnectionPool`
that each protocol instance is given (as uvicorn's ``ServerState``). The idle, head and body
deadlines are checked by one sweep over the connections (see
:data:`~tailguard_runtime.http.pool.SWEEP_MAX_S`) rather than by timers. Per process, there is a cap of
``max_connections`` open connections: a connection past the cap evicts the one that has been
idle longest (no request in progress, or a head still incomplete; those that never completed
a request first), or is refused with 503 when every connection has a request in progress.
:func:`~tailguard_runtime.http.pool.raise_fd_limit` lifts the soft open-file limit first, so the cap is rarely what holds.

Every connection closed at the cap, at a head or body deadline, or for a client that reads no
answers is counted in ``tailguard_connections_closed_total`` by reason (idle ones closed at
the keep-alive timeout are not), and logged as one summary line at most every
:data:`~tailguard_runtime.http.pool.LOG_EVERY_S` seconds
(:class:`~tailguard_runtime.http.pool.EventTally`): a flood of connections must not become a
flood of log lines. What to serve is left to the ASGI app (:mod:`tailguard_runtime.http.app`); the drain to
:mod:`tailguard_runtime.server`.
"""


from __future__ import annotations

import asyncio
import fcntl
import functools
import logging
import random
import struct
import termios
from typing import Any, Callable

from tailguard_runtime.errors import TailguardError
from tailguard_runtime.http.errors import raw_error
from tailguard_runtime.http.pool import ConnectionPool
from tailguard_runtime.http.protocol import RETIRING, JsonHttpProtocol
from tailguard_runtime.settings import ConnectionSettings

logger = logging.getLogger(__name__)

FEED_SLICE_BYTES = 4096
"""Bytes handed to the HTTP parser at a time when more arrived at once, so that pipelined
requests are counted as they are parsed (one 4 KiB slice holds at most about 200)."""

AGE_JITTER = 0.1
"""Each connection's age is ``max_age_s`` times a factor drawn uniformly within 1 ± this, so
that the connections of clients that connected together do not all retire together (gRFC A9,
"Server-side Connection Management": ±10% on ``MAX_CONNECTION_AGE``)."""

MAX_UNREAD_BYTES = 64 * 1024
"""Bytes of answers a client may leave unread in the kernel's send queue before the server
stops reading its further requests: hundreds of small answers, or one large one, in flight to
it. A client that reads drains the queue within a round trip, so only one that does not read
ever waits on this."""
UNREAD_POLL_S = 0.05
"""How often a connection held by :data:`MAX_UNREAD_BYTES` checks whether its client read, s."""
_OUTQ = getattr(termios, "TIOCOUTQ", None)
"""Linux's ioctl for the bytes in a socket's send queue not yet acknowledged by the peer
(``SIOCOUTQ`` in ``tcp(7)``); None elsewhere, where only the write-buffer stall applies."""


def unread_bytes(fd: int) -> int:
    """Bytes written to the TCP socket ``fd`` that its peer has not acknowledged yet: on a
    connection whose client stopped reading, the answers it left unread once its receive
    buffer is full (``SIOCOUTQ``, ``tcp(7)``). 0 where the ioctl is missing or fails."""
    if _OUTQ is None or fd < 0:
        return 0
    try:
        queued: int = struct.unpack("i", fcntl.ioctl(fd, _OUTQ, b"\0\0\0\0"))[0]
    except OSError:
        return 0
    return queued


class BoundedHttpToolsProtocol(JsonHttpProtocol):
    """uvicorn's httptools protocol with the bounds of this module, those of ``pool``: uvicorn
    passes ``config``, ``server_state`` and ``app_state`` when it makes one per connection;
    ``pool`` is bound beforehand (:func:`bounded_protocol`)."""

    def __init__(self, *args: Any, pool: ConnectionPool, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.pool = pool
        self._held = b""
        self._served = False
        self._idle_deadline = 0.0  # loop time by which the next request must begin; 0: none
        self._head_deadline = 0.0  # loop time by which the head must be complete; 0: none
        self._body_deadline = 0.0  # the same for the body
        self._stall_timer: asyncio.TimerHandle | None = None
        self._closed_for: str | None = None  # the bound it was closed for, once counted
        self._unread_timer: asyncio.TimerHandle | None = None
        self._unread_since = 0.0
        self._fd: int | None = None  # the socket's, looked up when first needed
        self._body_seen = 0  # bytes of the current request's body parsed so far
        self._address: str | None = None  # the client's address, counted in the pool
        self._retire_at = 0.0  # loop time from which its requests are answered with close

    # -- connections ---------------------------------------------------------------------

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        pool = self.pool
        self._address = self.client[0] if self.client else None
        if self._address is not None and not pool.joined(self._address):
            # its share is full: room is made among its own connections, whatever the others
            # hold; with every one of them busy, it gets 503
            victim = pool.victim_from(self._address, self)
            if victim is None:
                self._answer(pool.address_full)
                pool.closed(self, "refused", self.loop.time())
                return
            victim.transport.close()
            pool.closed(victim, "evicted", self.loop.time())
        pool.mark_idle(self)
        now = self.loop.time()
        self._idle_deadline = now + pool.keep_alive_s
        self._retire_at = now + pool.max_age_s * random.uniform(1 - AGE_JITTER, 1 + AGE_JITTER)
        if len(self.connections) > pool.max_connections:
            self._make_room()
        pool.watch(self.loop, self.connections)

    def _idle(self) -> bool:
        """No request whose head is complete is waiting for its answer."""
        cycle = self.cycle
        return (cycle is None or cycle.response_complete) and not self.pipeline

    def _make_room(self) -> None:
        victim = self.pool.victim(self)
        if victim is not None:
            victim.transport.close()
            self.pool.closed(victim, "evicted", self.loop.time())
        else:
            self._answer(self.pool.full)
            self.pool.closed(self, "refused", self.loop.time())

    def _answer(self, exc: TailguardError) -> None:
        """Write the error writer's answer to ``exc`` and close (after the write)."""
        self.transport.write(raw_error(exc, self.server_state.default_headers, close=True))
        self.transport.close()
        self.pool.refused(exc)

    def refused(self, exc: TailguardError) -> None:
        self.pool.refused(exc)

    def unanswered(self, running: int, pipelined: int) -> None:
        self.pool.unanswered(running, pipelined, self.loop.time())

    def send_error(self, exc: TailguardError) -> None:
        super().send_error(exc)
        # a held refusal waits for earlier answers, not for the client
        self._held = b""
        self._head_deadline = self._body_deadline = 0.0

    def connection_lost(self, exc: Exception | None) -> None:
        if self._address is not None:
            self.pool.left(self._address)
        self.pool.unmark_idle(self)
        self._cancel_timers()
        self._held = b""
        super().connection_lost(exc)

    def _cancel_timers(self) -> None:
        for timer in (self._stall_timer, self._unread_timer):
            if timer is not None:
                timer.cancel()
        self._stall_timer = self._unread_timer = None
        self._idle_deadline = self._head_deadline = self._body_deadline = 0.0

    def _unset_keepalive_if_required(self) -> None:
        """uvicorn cancels its keep-alive timer here whenever data arrives; here the idle
        deadline ends only when a request begins (:meth:`on_message_begin`), so that bytes
        beginning no request (blank lines, which the parser skips) cannot keep a
        connection open."""

    # -- reading, with at most max_pipelined requests parsed and unanswered ---------------

    def data_received(self, data: bytes) -> None:
        if self.last_word is not None:  # refused: what follows is never parsed
            return
        if self._held:
            data, self._held = self._held + data, b""
        if not self.pipeline and self._unread_timer is None \
                and len(data) <= FEED_SLICE_BYTES:
            super().data_received(data)  # the common case: one request, nothing waiting
            return
        if self._unread_timer is not None or (self.pipeline and self._client_behind()):
            self._hold_for_reader(data)
            return
        self._feed(data)

    def _feed(self, data: bytes) -> None:
        max_pipelined = self.pool.max_pipelined
        if len(self.pipeline) >= max_pipelined:
            self._held = data
            self.flow.pause_reading()
            return
        if len(data) <= FEED_SLICE_BYTES:
            super().data_received(data)
            return
        view = memoryview(data)
        start = 0
        while start < len(data):
            if self.parser is None or self.transport.is_closing() \
                    or self.last_word is not None:
                return
            if len(self.pipeline) >= max_pipelined:
                self._held = bytes(view[start:])
                self.flow.pause_reading()
                return
            # the rest of a body of known length goes in one piece: slices are only for
            # counting pipelined requests as they are parsed
            step = max(FEED_SLICE_BYTES, self._body_left())
            super().data_received(bytes(view[start:start + step]))
            start += step

    def on_response_complete(self) -> None:
        # uvicorn 0.54's (``HttpToolsProtocol.on_response_complete``), with the keep-alive
        # timeout as a deadline for the sweep instead of a timer; a held refusal is the
        # parent's (the earlier answers, then it, then close)
        if self.last_word is not None:
            super().on_response_complete()
            return
        self.server_state.total_requests += 1
        self._served = True
        if not self.transport.is_closing():
            self.flow.resume_reading()
            if self.pipeline:
                cycle, app = self.pipeline.pop()
                self._start_asgi_task(cycle, app)
            else:
                self._idle_deadline = self.loop.time() + self.pool.keep_alive_s
        if self._idle():
            self.pool.mark_idle(self)
        if self.transport.is_closing():
            return
        if self._unread_timer is not None or (self._held and self._client_behind()):
            self._hold_for_reader(self._held)  # uvicorn resumed reading: pause it again
        elif self._held:
            held, self._held = self._held, b""
            self._feed(held)

    # -- clients that do not read their answers ------------------------------------------

    def _client_behind(self) -> bool:
        if self._fd is None:  # uvloop makes a socket object for this; only pipeliners ask
            sock = self.transport.get_extra_info("socket")
            self._fd = sock.fileno() if sock is not None else -1
        return unread_bytes(self._fd) > MAX_UNREAD_BYTES

    def _hold_for_reader(self, data: bytes) -> None:
        """Keep ``data`` unparsed and stop reading until the client reads its answers."""
        self._held = data
        self.flow.pause_reading()
        if self._unread_timer is None:
            self._unread_since = self.loop.time()
            self._unread_timer = self.loop.call_later(UNREAD_POLL_S, self._check_reader)

    def _check_reader(self) -> None:
        self._unread_timer = None
        if self.transport.is_closing():
            return
        if self._client_behind():
            if self.loop.time() - self._unread_since >= self.pool.stall_timeout_s:
                self._stalled()
            else:
                self._unread_timer = self.loop.call_later(UNREAD_POLL_S, self._check_reader)
            return
        held, self._held = self._held, b""
        if len(self.pipeline) < self.pool.max_pipelined and (self.cycle is None
                                                   or self.cycle.response_complete):
            self.flow.resume_reading()
        if held:
            self._feed(held)

    # -- head and body deadlines ---------------------------------------------------------

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._idle_deadline = 0.0
        self._head_deadline = self.loop.time() + self.pool.head_timeout_s

    def on_headers_complete(self) -> None:
        self._head_deadline = 0.0
        self.pool.unmark_idle(self)
        super().on_headers_complete()
        now = self.loop.time()
        self._body_deadline = now + self.pool.body_timeout_s
        self._body_seen = 0
        if now >= self._retire_at and not self.parser.should_upgrade():  # a new scope
            self.scope[RETIRING] = True  # type: ignore[literal-required]

    def on_body(self, body: bytes) -> None:
        self._body_seen += len(body)
        super().on_body(body)

    def on_message_complete(self) -> None:
        self._body_deadline = 0.0
        super().on_message_complete()

    def _body_left(self) -> int:
        """Bytes of the current request's body still to come; 0 between requests or when
        its length is not stated (read only when slicing a large read)."""
        if self._body_deadline == 0.0:
            return 0
        for name, value in self.headers:
            if name == b"content-length" and value.isdigit():
                return max(0, int(value) - self._body_seen)
        return 0

    def _waiting_on_us(self) -> bool:
        """Earlier requests of this connection are still unanswered: its unparsed bytes
        wait for the server (see ``_feed``), not for the client."""
        return bool(self.pipeline) or bool(self._held)

    def check_deadlines(self, now: float) -> None:
        """Called by the sweep: close a connection idle past its deadline (``keep_alive_s``
        after connecting or after its last answer), answer 408 to a head or body past its
        deadline."""
        if 0.0 < self._idle_deadline <= now:
            self._idle_deadline = 0.0
            if self._held or self._unread_timer is not None:
                # requests held for a client that does not read its answers: the
                # send-stall timeout decides, and the connection is idle only after them
                self._idle_deadline = now + self.pool.keep_alive_s
            else:
                self.timeout_keep_alive_handler()
        if 0.0 < self._head_deadline <= now:
            self._head_timeout(now)
        if 0.0 < self._body_deadline <= now:
            self._body_timeout(now)

    def _head_timeout(self, now: float) -> None:
        self._head_deadline = 0.0
        if self.transport.is_closing():
            return
        if self._waiting_on_us() or not self._idle():
            self._head_deadline = now + self.pool.head_timeout_s
            return
        self._answer(self.pool.head_late)
        self.pool.closed(self, "head_timeout", now)

    def _body_timeout(self, now: float) -> None:
        self._body_deadline = 0.0
        cycle = self.cycle
        if self.transport.is_closing() or cycle is None or not cycle.more_body:
            return
        if self._waiting_on_us():
            self._body_deadline = now + self.pool.body_timeout_s
            return
        if not cycle.response_started:
            cycle.disconnected = True  # the app's own reply, if any, is dropped
            cycle.message_event.set()
            self._answer(self.pool.body_late)
        else:
            self.transport.close()
        self.pool.closed(self, "body_timeout", now)

    def pause_writing(self) -> None:
        super().pause_writing()
        if self._stall_timer is None:
            self._stall_timer = self.loop.call_later(self.pool.stall_timeout_s, self._stalled)

    def resume_writing(self) -> None:
        super().resume_writing()
        if self._stall_timer is not None:
            self._stall_timer.cancel()
            self._stall_timer = None

    def _stalled(self) -> None:
        if self._stall_timer is not None:  # called by the unread-answers check instead
            self._stall_timer.cancel()
            self._stall_timer = None
        # even when already closing: close() waits for the buffer to drain, here for ever
        self.transport.abort()
        self.pool.closed(self, "send_stall", self.loop.time())


def bounded_protocol(settings: ConnectionSettings, *, model: str,
                     count_refusal: Callable[[TailguardError], None] | None = None,
                     ) -> Callable[..., BoundedHttpToolsProtocol]:
    """What to pass as uvicorn's ``Config.http``: :class:`BoundedHttpToolsProtocol` bound to
    a new :class:`~tailguard_runtime.http.pool.ConnectionPool` of ``settings`` (see there for
    ``model`` and ``count_refusal``), shared by every connection of the server."""
    pool = ConnectionPool(settings, model=model, count_refusal=count_refusal)
    return functools.partial(BoundedHttpToolsProtocol, pool=pool)
