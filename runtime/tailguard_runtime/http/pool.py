"""The state the connection bounds share across one server's connections.

Modelled on uvicorn's ``ServerState`` (``uvicorn/server.py``: "shared servers state that is
available between all protocol instances"): one :class:`ConnectionPool` per server, handed to
every protocol instance (:class:`~tailguard_runtime.http.connections.BoundedHttpToolsProtocol`)
as an argument. It holds the limits in force, the connections that may be evicted at the cap,
the one timer sweeping every connection's deadlines, and the counting and logging of the
connections closed and requests refused to keep the bounds. What a single connection does
(reading, pipelining, its own deadlines) is the protocol's; the open connections themselves are
uvicorn's (``ServerState.connections``).
"""

from __future__ import annotations

import asyncio
import logging
import resource
from typing import TYPE_CHECKING, Any, Callable, Collection

from tailguard_runtime.errors import BodyTimeout, HeadTimeout, TailguardError, TooManyConnections
from tailguard_runtime.metrics import (
    CONNECTION_CLOSE_REASONS,
    CONNECTIONS_CLOSED,
    REQUESTS_UNANSWERED,
)
from tailguard_runtime.settings import ConnectionSettings

if TYPE_CHECKING:
    from tailguard_runtime.http.connections import BoundedHttpToolsProtocol

logger = logging.getLogger(__name__)

RESERVED_FDS = 128
"""File descriptors kept out of the connection cap at least: the listener, model files, logs,
pipes. A quarter of the limit is kept when that is more: the event loop accepts every pending
connection in one go before the connections evicted for them release their descriptors, and
at the limit libuv drops pending connections, good ones included."""

MAX_DEFAULT_CONNECTIONS = 16384

SWEEP_MIN_S = 0.05
SWEEP_MAX_S = 1.0
"""Idle, head and body deadlines are checked by one sweep over the open connections every
quarter of the shortest of the three timeouts, within these bounds (s), instead of timers:
uvicorn arms a keep-alive timer after every answer and cancels it when the next request
arrives, which costs time on every request and objects on every idle connection for the
garbage collector to scan, and head and body timers would cost as much twice more (figures in
``benchmarks/README.md``, "Connections without timers"). A deadline fires up to one sweep late
(at most 1 s, for the default 30 s, 10 s and 30 s). Short timeouts make the sweep more
frequent: a keep-alive of 2 s scans every connection twice a second."""
EXPIRE_BATCH = 16
"""Connections a sweep closes (with a 408 for an incomplete request) per event-loop iteration;
the rest wait for the next iterations. Sockets opened together expire together, and closing
them all in one go held the loop, and every other client's requests with it (figures in
``benchmarks/README.md``, "Hostile clients")."""

LOG_EVERY_S = 10.0
"""Seconds between two log lines about connections closed to keep the bounds."""


class EventTally:
    """Counts of events by kind, for a log line at most every ``every_s`` seconds.

    Under a connection flood the bounds close hundreds of connections a second; a log line
    each would flood the log, and each write to stderr releases the GIL to the model's thread
    and waits to get it back. The first event is reported at once; later ones are tallied and
    reported together once ``every_s`` has passed since the previous report, by the next event
    or the next call of :meth:`due`.
    """

    def __init__(self, every_s: float = LOG_EVERY_S) -> None:
        self.every_s = every_s
        self.counts: dict[str, int] = {}
        self._since = 0.0
        self._next_report = float("-inf")

    def add(self, kind: str, now: float, n: int = 1) -> tuple[dict[str, int], float] | None:
        """Count ``n`` of ``kind`` at ``now`` (monotonic seconds); then :meth:`due`."""
        if not self.counts:
            self._since = now
        self.counts[kind] = self.counts.get(kind, 0) + n
        return self.due(now)

    def due(self, now: float) -> tuple[dict[str, int], float] | None:
        """When a report is due at ``now``: the counts by kind since the last one and the
        seconds from the first of them to ``now`` (0 for the first event), and the counting
        starts afresh; otherwise (or with nothing counted) ``None``. Call it now and then
        (the connection sweep does) so that a tally is reported when events stop."""
        if not self.counts or now < self._next_report:
            return None
        report = (self.counts, now - self._since)
        self.counts = {}
        self._next_report = now + self.every_s
        return report


def default_max_connections() -> int:
    """The process's soft open-file limit less :data:`RESERVED_FDS` or a quarter of it,
    whichever is more (at least 16, at most :data:`MAX_DEFAULT_CONNECTIONS`); 768 for the common
    limit of 1,024. Past the limit, ``accept`` fails with EMFILE for everyone."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        return MAX_DEFAULT_CONNECTIONS
    return max(16, min(MAX_DEFAULT_CONNECTIONS, soft - max(RESERVED_FDS, soft // 4)))


def raise_fd_limit(most: int = 65536) -> int:
    """Raise the soft open-file limit to the hard limit (at most ``most``), as Go's runtime does
    since 1.19: the soft default of 1,024 (systemd, many container runtimes) is a
    compatibility setting for ``select()``, which the event loop does not use. Returns the soft
    limit now in force; leaves it as it is if it cannot be raised.
    """
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = most if hard == resource.RLIM_INFINITY else min(hard, most)
    if soft != resource.RLIM_INFINITY and soft < target:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            soft = target
        except (ValueError, OSError):
            logger.warning("cannot raise the open-file limit from %d to %d", soft, target)
    return soft


class ConnectionPool:
    """The limits and shared state of one server's connection bounds.

    ``settings`` gives the limits (timeouts in seconds; ``max_connections`` ``None`` means
    :func:`default_max_connections`); ``model`` labels ``tailguard_connections_closed_total``;
    ``count_refusal`` is called once for each request refused below the app with an answer (a
    408 for a head, a 503 at the cap, the HTTP parser's 400, 405 and 414), to count it by its
    reason; ``None``: not counted. A body past its deadline is answered but not counted here,
    as the app counts that request itself.
    """

    def __init__(self, settings: ConnectionSettings, *, model: str,
                 count_refusal: Callable[[TailguardError], None] | None = None) -> None:
        self.max_connections = settings.max_connections or default_max_connections()
        self.keep_alive_s = settings.keep_alive_s
        self.max_age_s = settings.max_connection_age_s
        self.head_timeout_s = settings.request_head_timeout_s
        self.body_timeout_s = settings.request_body_timeout_s
        self.stall_timeout_s = settings.send_stall_timeout_s
        self.max_pipelined = settings.max_pipelined
        self.head_late = HeadTimeout(f"request head not complete within "
                                     f"{self.head_timeout_s:g} s")
        self.body_late = BodyTimeout(f"request body not complete within "
                                     f"{self.body_timeout_s:g} s")
        self.full = TooManyConnections(f"too many open connections ({self.max_connections}), "
                                       "all of them busy")
        self.max_per_address = (settings.max_connections_per_address
                                or max(16, self.max_connections // 4))
        self.address_full = TooManyConnections(
            f"too many open connections from this address ({self.max_per_address})")
        self.by_address: dict[str, int] = {}
        """Open connections per client address (only addresses holding one or more)."""
        self.idle_by_address: dict[str, dict[BoundedHttpToolsProtocol, None]] = {}
        """The idle ones among them, longest idle first, for eviction within a share."""
        self.sweep_s = min(SWEEP_MAX_S, max(SWEEP_MIN_S, min(
            self.keep_alive_s, self.head_timeout_s, self.body_timeout_s) / 4))
        self.fresh: dict[BoundedHttpToolsProtocol, None] = {}
        """Idle connections that never completed a request, longest idle first (dicts keep
        order): evicted first, so sockets that never send a whole request cannot push out the
        connections of clients that do."""
        self.served: dict[BoundedHttpToolsProtocol, None] = {}
        """Idle connections that have completed a request, longest idle first."""
        self._sweeper: asyncio.TimerHandle | None = None
        """The one timer checking every connection's deadlines, while any connection is open."""
        self._count_closed = {reason: CONNECTIONS_CLOSED.labels(model, reason).inc
                              for reason in CONNECTION_CLOSE_REASONS}
        self._count_refusal = count_refusal
        self._tally = EventTally()
        self._count_unanswered = {stage: REQUESTS_UNANSWERED.labels(model, stage).inc
                                  for stage in ("running", "pipelined")}
        self._unanswered_tally = EventTally()

    # -- the share of one address -------------------------------------------------------------

    def joined(self, address: str) -> bool:
        """Count a new connection from ``address``; False when that puts the address past its
        share (the caller refuses the connection, and still calls :meth:`left`)."""
        count = self.by_address.get(address, 0) + 1
        self.by_address[address] = count
        return count <= self.max_per_address

    def left(self, address: str) -> None:
        """A connection from ``address`` closed."""
        count = self.by_address.get(address, 0) - 1
        if count > 0:
            self.by_address[address] = count
        else:
            self.by_address.pop(address, None)

    # -- eviction at the cap ------------------------------------------------------------------

    def mark_idle(self, conn: BoundedHttpToolsProtocol) -> None:
        """Queue ``conn`` for eviction, behind those idle longer."""
        self.unmark_idle(conn)
        (self.served if conn._served else self.fresh)[conn] = None
        if conn._address is not None:
            self.idle_by_address.setdefault(conn._address, {})[conn] = None

    def unmark_idle(self, conn: BoundedHttpToolsProtocol) -> None:
        self.fresh.pop(conn, None)
        self.served.pop(conn, None)
        address = conn._address
        if address is None:
            return
        idle = self.idle_by_address.get(address)
        if idle is not None:
            idle.pop(conn, None)
            if not idle:
                del self.idle_by_address[address]

    def victim_from(self, address: str,
                    newcomer: BoundedHttpToolsProtocol) -> BoundedHttpToolsProtocol | None:
        """The longest-idle connection of ``address`` to close for ``newcomer`` of the same
        address past its share; ``None`` when each of them has a request in progress."""
        for candidate in list(self.idle_by_address.get(address, ())):
            self.unmark_idle(candidate)
            if candidate is not newcomer and candidate._idle() \
                    and not candidate.transport.is_closing():
                return candidate
        return None

    def victim(self, newcomer: BoundedHttpToolsProtocol) -> BoundedHttpToolsProtocol | None:
        """The connection to close to make room for ``newcomer``: the longest idle of those
        that never completed a request, else of those that did; ``None`` when every other one
        has a request in progress. The candidates passed over leave the queues."""
        for order in (self.fresh, self.served):
            while order:
                candidate = next(iter(order))
                self.unmark_idle(candidate)
                if candidate is not newcomer and candidate._idle() \
                        and not candidate.transport.is_closing():
                    return candidate
        return None

    # -- the sweep ----------------------------------------------------------------------------

    def watch(self, loop: asyncio.AbstractEventLoop, connections: Collection[Any]) -> None:
        """Have ``connections`` (uvicorn's set of open ones) swept, if no sweep is due yet."""
        if self._sweeper is None:
            self._sweeper = loop.call_later(self.sweep_s, self._sweep, loop, connections)

    def _sweep(self, loop: asyncio.AbstractEventLoop, connections: Collection[Any]) -> None:
        now = loop.time()
        # the next sweep first: an error below must not end every connection's deadlines
        self._sweeper = (loop.call_later(self.sweep_s, self._sweep, loop, connections)
                         if connections else None)
        # attributes, not a method: this runs over every open connection, thousands at times
        self._expire(loop, [conn for conn in connections
                            if 0.0 < conn._idle_deadline <= now
                            or 0.0 < conn._head_deadline <= now
                            or 0.0 < conn._body_deadline <= now], now)
        self._log(self._tally.due(now))
        self._log_unanswered(self._unanswered_tally.due(now))

    def _expire(self, loop: asyncio.AbstractEventLoop, due: list[Any], now: float) -> None:
        for conn in due[:EXPIRE_BATCH]:
            conn.check_deadlines(now)
        if len(due) > EXPIRE_BATCH:
            loop.call_soon(self._expire, loop, due[EXPIRE_BATCH:], now)

    # -- counting -----------------------------------------------------------------------------

    def closed(self, conn: BoundedHttpToolsProtocol, reason: str, now: float) -> None:
        """Count ``conn`` as closed to keep a bound (once, under its first reason); log the
        tally when one is due."""
        if conn._closed_for is not None:
            return
        conn._closed_for = reason
        self._count_closed[reason]()
        self._log(self._tally.add(reason, now))

    def unanswered(self, running: int, pipelined: int, now: float) -> None:
        """Count the requests a closing connection left unanswered
        (``tailguard_requests_unanswered_total`` by stage); log a tally when one is due."""
        for stage, n in (("running", running), ("pipelined", pipelined)):
            if n:
                self._count_unanswered[stage](n)
                self._log_unanswered(self._unanswered_tally.add(stage, now, n))

    def _log_unanswered(self, report: tuple[dict[str, int], float] | None) -> None:
        if report is not None:
            counts, seconds = report
            logger.warning("%d request(s) left unanswered by connections that closed%s: %s "
                           "(see tailguard_requests_unanswered_total)", sum(counts.values()),
                           f" in {seconds:.1f} s" if seconds else "",
                           ", ".join(f"{stage} {n}" for stage, n in sorted(counts.items())))

    def refused(self, exc: TailguardError) -> None:
        """Count one request refused below the app with the answer to ``exc``."""
        if self._count_refusal is not None and exc is not self.body_late:
            self._count_refusal(exc)

    def _log(self, report: tuple[dict[str, int], float] | None) -> None:
        if report is not None:
            counts, seconds = report
            logger.warning("closed %d connection(s) to keep the connection bounds%s: %s "
                           "(connection cap %d; see tailguard_connections_closed_total)",
                           sum(counts.values()), f" in {seconds:.1f} s" if seconds else "",
                           ", ".join(f"{reason} {n}" for reason, n in sorted(counts.items())),
                           self.max_connections)
