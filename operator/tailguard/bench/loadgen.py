"""The project's one load generator: open or closed loop, persistent connections, honest tails,
over HTTP/1.1 or gRPC.

:func:`run_load` drives a :class:`Target` with a schedule (:class:`~tailguard.bench.plan.OpenLoop` or
:class:`~tailguard.bench.plan.ClosedLoop`) inside :class:`~tailguard.bench.plan.Bounds` and returns a
:class:`~tailguard.bench.plan.LoadResult`. ``tailguard bench``, ``benchmarks/run.py`` and the benchmarks' other
load all come through here; the arithmetic (schedules, percentiles, the verdict) is in
:mod:`~tailguard.bench.plan`.

How it stays fast and honest from one core: asyncio protocols (uvloop when installed) and a
minimal HTTP/1.1 client: requests are pre-encoded bytes written in one call, responses parsed
only as far as status and body end; no coroutine per request. Each connection carries one request
at a time (no pipelining, so one slow answer never delays another) and stays open (keep-alive);
a connection the server closes is dropped and a new one opened when needed, and a request that
met a just-closed idle connection before any answer byte is sent once more on a fresh one (as
HTTP clients do). Open loop: a timer ticks at most once a millisecond (event-loop timers are
only millisecond-precise) and issues every request due within
:data:`~tailguard.bench.plan.ISSUE_AHEAD_S` of now (:func:`~tailguard.bench.plan.next_tick_in`); latency counts from
the scheduled time, or from the actual send when that was earlier, so neither a late generator
nor a busy connection pool makes a latency look shorter than it was. Over gRPC
(:attr:`Target.grpc_port`) the requests are pre-serialized ``ModelInferRequest`` messages sent
with ``grpc.aio`` over a few channels (:class:`_Grpc`), on the same schedules and bounds, and
recorded in the same result.
"""

from __future__ import annotations

import asyncio
import gc
import resource
import signal
import socket
import time
from array import array
from collections import deque
from dataclasses import dataclass
from typing import Any, Callable, Coroutine

import numpy as np

from tailguard.bench.httpwire import ResponseParser
from tailguard.bench.plan import (
    ISSUE_AHEAD_S,
    Bounds,
    ClosedLoop,
    LoadResult,
    OpenLoop,
    Schedule,
    arrival_offsets,
    judge,
    next_tick_in,
    percentiles_ms,
)
from tailguard.bench.promview import ServerSnapshot, scrape
from tailguard.bench.target import binary_header_length

TICK_S = 0.1
"""Period of the timeout watchdog and of progress reports, s."""
LOOPBACK = ("127.0.0.1", "localhost", "::1")


@dataclass(frozen=True)
class Target:
    """Where requests go and what they carry.

    ``host``/``port``/``path``: the inference route (``/v2/models/NAME/infer``); ``bodies``: JSON
    bodies sent in turn (each of ``rows_per_request`` rows); ``metrics_path``: the server's
    Prometheus route, read at the start and end of the measured window (None: not read);
    ``binary``: the bodies use the binary tensor data extension
    (:func:`tailguard.bench.target.encode_bodies` with ``binary``), sent with their
    ``Inference-Header-Content-Length``.
    """

    host: str
    port: int
    path: str
    bodies: tuple[bytes, ...]
    rows_per_request: int = 1
    metrics_path: str | None = "/metrics"
    binary: bool = False
    grpc_port: int | None = None
    """Send the requests as gRPC ``ModelInfer`` calls to this port of ``host`` instead (the
    ``bodies`` are then serialized ``ModelInferRequest`` messages,
    :func:`tailguard.bench.target.encode_messages`); ``port`` still serves ``metrics_path``."""

    def requests(self) -> list[bytes]:
        """Each body as a complete HTTP/1.1 keep-alive POST (as it is, for gRPC).

        Raises:
            ValueError: ``binary``, and a body does not start with its JSON header.
        """
        if self.grpc_port is not None:
            return list(self.bodies)
        start = f"POST {self.path} HTTP/1.1\r\nHost: {self.host}:{self.port}\r\n"
        heads = []
        for body in self.bodies:
            kind = ("Content-Type: application/octet-stream\r\nInference-Header-Content-Length:"
                    f" {binary_header_length(body)}\r\n" if self.binary
                    else "Content-Type: application/json\r\n")
            heads.append(f"{start}{kind}Content-Length: {len(body)}\r\n\r\n".encode("ascii"))
        return [head + body for head, body in zip(heads, self.bodies)]


@dataclass
class Progress:
    """A snapshot for a progress display: ``phase`` (``warmup``, ``measure``, ``drain``),
    seconds ``elapsed`` of ``total`` (warm-up + window), requests ``sent`` and ``answered`` (all
    so far), ``ok`` (200s so far)."""

    phase: str
    elapsed_s: float
    total_s: float
    sent: int
    answered: int
    ok: int


class _Conn(asyncio.Protocol):
    """One keep-alive connection carrying at most one request at a time."""

    __slots__ = ("run", "transport", "parser", "req", "sched", "start", "got", "served")

    def __init__(self, run: "_Run") -> None:
        self.run = run
        self.transport: Any = None
        self.parser = ResponseParser(run.capture)
        self.req = -1          # index of the request in flight, -1 when idle
        self.sched = 0.0       # its scheduled send time: decides whether it is in the window
        self.start = 0.0       # its latency start (perf_counter s)
        self.got = False       # answer bytes seen for it
        self.served = 0        # answers received on this connection

    def connection_made(self, transport: Any) -> None:
        self.transport = transport
        sock = transport.get_extra_info("socket")
        if sock is not None:
            try:
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            except OSError:
                pass

    def send(self, i: int, start: float) -> None:
        run = self.run
        self.req, self.sched, self.start, self.got = i, start, start, False
        now = time.perf_counter()
        if start > now:  # issued early by the tick: count from the real send, never before it
            self.start = now
        if run.win_start <= start < run.win_end:
            run.waits.append(now - start if now > start else 0.0)
        self.transport.write(run.requests[i % run.n_bodies])

    def data_received(self, data: bytes) -> None:
        self.got = True
        try:
            statuses = self.parser.feed(data)
        except ValueError:
            self._fail("bad_response")
            return
        if not statuses or self.req < 0:
            return
        now = time.perf_counter()
        self.req = -1
        self.served += 1
        self.run.answered(self, self.sched, self.start, now, statuses[-1])

    def connection_lost(self, exc: Exception | None) -> None:
        self.transport = None
        self.run.lost(self)

    def _fail(self, kind: str) -> None:
        i, self.req = self.req, -1
        if i >= 0:
            self.run.record_error(self.sched, kind)
        if self.transport is not None:
            self.transport.abort()


class _Run:
    """State of one run; see :func:`run_load`."""

    def __init__(self, target: Target, schedule: Schedule, bounds: Bounds, record: bool) -> None:
        self.loop = asyncio.get_running_loop()
        self.target, self.schedule, self.bounds = target, schedule, bounds
        self.requests = target.requests()
        self.n_bodies = len(self.requests)
        self.win_start = self.win_end = float("inf")
        self.idle: list[_Conn] = []
        self.busy: set[_Conn] = set()
        self.opening = 0
        self.opened = 0
        self.backlog: deque[tuple[int, float]] = deque()  # (index, scheduled time)
        self.issued = 0
        self.last_start = float("-inf")
        self.interrupted = False  # the window was cut short by SIGINT
        self.interrupted_early = False  # SIGINT in the warm-up: nothing to report
        self.stopping = False
        self.done = asyncio.Event()
        # the window's records
        self.sent = 0
        self.lat = array("d")
        self.codes: dict[int, int] = {}
        self.transport_errors: dict[str, int] = {}
        self.lags = array("d")
        self.waits = array("d")
        self.answers = self.oks = 0
        self.capture = (b"x-tailguard-role", b"x-tailguard-model") if record else ()
        self.records: list[tuple[float, float, float, int, Any]] | None = (
            [] if record else None)

    # -- recording
    def record_error(self, sched: float, kind: str) -> None:
        if self.win_start <= sched < self.win_end:
            self.transport_errors[kind] = self.transport_errors.get(kind, 0) + 1
            if self.records is not None:
                self.records.append((sched, sched, time.perf_counter(), 0, kind))

    def record_answer(self, sched: float, start: float, now: float, status: int,
                      captured: tuple[Any, ...]) -> None:
        """Count an answer with ``status`` (HTTP, or the one a gRPC status stands for) to the
        request scheduled at ``sched`` and sent at ``start`` (perf_counter s); ``captured``:
        its role and model, for the records."""
        self.answers += 1
        if status == 200:
            self.oks += 1
        if self.win_start <= sched < self.win_end:
            if status == 200:
                self.lat.append(now - start)
            else:
                self.codes[status] = self.codes.get(status, 0) + 1
            if self.records is not None:
                self.records.append((sched, start, now, status, captured))

    def answered(self, conn: _Conn, sched: float, start: float, now: float, status: int) -> None:
        self.record_answer(sched, start, now, status, tuple(conn.parser.captured))
        if conn.parser.close:
            conn.transport.close()
            return
        self.busy.discard(conn)
        self.next_for(conn)

    # -- connections
    def open_connection(self) -> None:
        self.opening += 1
        task = self.loop.create_task(self._open())
        task.add_done_callback(lambda t: t.exception())

    async def _open(self) -> None:
        conn = _Conn(self)
        try:
            await self.loop.create_connection(lambda: conn, self.target.host, self.target.port)
        except OSError:
            self.opening -= 1
            if self.backlog:
                i, start = self.backlog.popleft()
                self.record_error(start, "connection")
                if isinstance(self.schedule, ClosedLoop) and not self.stopping:
                    await asyncio.sleep(0.05)
                    self.open_connection()
            self.check_done()
            return
        self.opening -= 1
        self.opened += 1
        self.next_for(conn)

    def lost(self, conn: _Conn) -> None:
        self.busy.discard(conn)
        if conn in self.idle:
            self.idle.remove(conn)
        if conn.req >= 0:
            i, conn.req = conn.req, -1
            if not conn.got and conn.served > 0:  # a reused connection closed under us
                self.backlog.appendleft((i, conn.sched))
            else:
                self.record_error(conn.sched, "connection")
        if (self.backlog and self._room()) or (
                isinstance(self.schedule, ClosedLoop) and not self.stopping):
            self.open_connection()
        self.check_done()

    def next_for(self, conn: _Conn) -> None:
        """Give ``conn`` its next request, or park it idle."""
        if self.backlog:
            i, start = self.backlog.popleft()
        elif isinstance(self.schedule, ClosedLoop) and not self.stopping and self._may_issue():
            i, start = self.issue(time.perf_counter())
        else:
            if self.stopping:
                conn.transport.close()
            else:
                self.idle.append(conn)
            self.check_done()
            return
        self.busy.add(conn)
        conn.send(i, start)

    def _may_issue(self) -> bool:
        return self.issued < self.bounds.max_requests and time.perf_counter() < self.win_end

    def interrupt(self) -> None:
        """SIGINT (Ctrl-C): end the measured window now, after every request already issued
        (open loop issues up to ``ISSUE_AHEAD_S`` early); in the warm-up, stop the run; after
        the window, nothing (it ran whole). A second SIGINT is Python's own."""
        self.loop.remove_signal_handler(signal.SIGINT)
        now = time.perf_counter()
        if now < self.win_start:
            self.interrupted_early = True
        elif now < self.win_end:
            self.interrupted = True
            self.win_end = max(now, self.last_start + 1e-6)

    def issue(self, start: float) -> tuple[int, float]:
        i = self.issued
        self.issued += 1
        self.last_start = start
        if self.win_start <= start < self.win_end:
            self.sent += 1
        return i, start

    def dispatch(self, i: int, start: float) -> None:
        """Open loop: send request ``i`` on an idle connection, or queue it for one."""
        if self.idle:
            conn = self.idle.pop()
            self.busy.add(conn)
            conn.send(i, start)
            return
        self.backlog.append((i, start))
        if self._room():
            self.open_connection()

    def _room(self) -> bool:
        return len(self.busy) + self.opening + len(self.idle) < self.bounds.max_connections

    def watchdog(self, now: float) -> None:
        limit = self.bounds.timeout_s
        for conn in list(self.busy):
            if conn.req >= 0 and now - conn.start > limit:
                conn._fail("timeout")
        while self.backlog and now - self.backlog[0][1] > limit:
            _, start = self.backlog.popleft()
            self.record_error(start, "timeout")

    def check_done(self) -> None:
        if self.stopping and not self.busy and not self.backlog and not self.opening:
            self.done.set()

    def abort_all(self) -> None:
        for conn in list(self.busy):
            if conn.req >= 0:
                conn._fail("timeout")
        for _, start in self.backlog:
            self.record_error(start, "timeout")
        self.backlog.clear()
        for conn in self.idle:
            if conn.transport is not None:
                conn.transport.close()
        self.idle.clear()


def _cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


async def run_load(target: Target, schedule: Schedule, bounds: Bounds, *,
                   on_progress: Callable[[Progress], None] | None = None,
                   allow_host: str | None = None, record: bool = False,
                   interruptible: bool = False) -> LoadResult:
    """Drive ``target`` with ``schedule`` inside ``bounds``; return what the window measured.

    Open loop sends the arrivals of :func:`~tailguard.bench.plan.arrival_offsets` over warm-up + window;
    closed loop keeps ``concurrency`` requests in flight until the window ends. Then answers are
    awaited up to ``timeout_s``; what is still unanswered counts as ``timeout``. When
    ``target.metrics_path`` is set, the server's ``/metrics`` are read at the window's start and
    end and their difference is ``result.server`` (see :func:`~tailguard.bench.promview.server_view`).
    ``on_progress`` is called every :data:`TICK_S` seconds. The host must be loopback unless it
    equals ``allow_host``. With ``record``, ``result.records`` lists every request of the window
    (see :class:`~tailguard.bench.plan.LoadResult`). With ``interruptible`` (the main thread
    only), the first SIGINT (Ctrl-C) after the warm-up ends the measured window there: no
    request is scheduled after it, those in flight are awaited as at a normal end, and the
    result says ``interrupted``; a SIGINT during the warm-up, or a second one, raises
    KeyboardInterrupt as usual.

    Raises:
        ValueError: a non-loopback host not named by ``allow_host``, or bad bounds.
        OSError: the target refuses the first connection.
        KeyboardInterrupt: see ``interruptible``.
    """
    if target.host not in LOOPBACK and target.host != allow_host:
        raise ValueError(f"refusing to load {target.host}: only loopback unless the host is "
                         "named explicitly")
    gc.freeze()  # what exists now is never scanned again: shorter collector pauses mid-run
    previous = signal.getsignal(signal.SIGINT)
    try:
        return await _drive(target, schedule, bounds, on_progress, record, interruptible)
    finally:
        if interruptible:
            asyncio.get_running_loop().remove_signal_handler(signal.SIGINT)
            if previous is not None:
                signal.signal(signal.SIGINT, previous)
        gc.unfreeze()


async def _drive(target: Target, schedule: Schedule, bounds: Bounds,
                 on_progress: Callable[[Progress], None] | None, record: bool,
                 interruptible: bool) -> LoadResult:
    run = _Run(target, schedule, bounds, record)
    loop = run.loop
    if interruptible:
        loop.add_signal_handler(signal.SIGINT, run.interrupt)
    transport = None
    rpc: _Grpc | None = None
    if target.grpc_port is not None:
        rpc = _Grpc(run, target.host, target.grpc_port)
        await rpc.connect()  # fail fast, before any timing, when nothing listens
        run.dispatch = rpc.dispatch  # type: ignore[method-assign]
    else:
        probe = _Conn(run)  # fail fast, before any timing, when nothing listens
        transport, _ = await loop.create_connection(lambda: probe, target.host, target.port)
        run.idle.append(probe)
        run.opened = 1
    t0 = time.perf_counter()
    total_s = bounds.warmup_s + bounds.duration_s
    run.win_start, run.win_end = t0 + bounds.warmup_s, t0 + total_s
    if isinstance(schedule, OpenLoop):
        offsets = (arrival_offsets(schedule, total_s, bounds.max_requests) + t0).tolist()
        _start_ticks(run, offsets)
    elif rpc is not None:
        for _ in range(schedule.concurrency):
            rpc.next_call()
    else:
        for _ in range(schedule.concurrency - 1):
            run.open_connection()
        run.next_for(run.idle.pop())
    before: ServerSnapshot | None = None
    cpu0, measured_from = _cpu_s(), run.win_start
    phase = "warmup"
    while True:
        await asyncio.sleep(TICK_S)
        now = time.perf_counter()
        run.watchdog(now)
        if run.interrupted_early:
            raise KeyboardInterrupt  # Ctrl-C in the warm-up: nothing measured
        if phase == "warmup" and now >= run.win_start:
            phase, cpu0, measured_from = "measure", _cpu_s(), time.perf_counter()
            if target.metrics_path and now < run.win_end:
                before = await scrape(target.host, target.port, target.metrics_path)
        if phase == "measure" and (now >= run.win_end or run.issued >= bounds.max_requests):
            break
        if on_progress:
            on_progress(Progress(phase, now - t0, total_s, run.issued, run.answers, run.oks))
    cpu = (_cpu_s() - cpu0) / max(time.perf_counter() - measured_from, 1e-9)
    after = (await scrape(target.host, target.port, target.metrics_path)
             if before is not None and target.metrics_path else None)
    window_s = min(time.perf_counter(), run.win_end) - run.win_start
    run.stopping = True
    for conn in list(run.idle):
        run.idle.remove(conn)
        conn.transport.close()
    if rpc is not None:
        rpc.check_done()
    else:
        run.check_done()
    deadline = time.perf_counter() + bounds.timeout_s
    while not run.done.is_set() and time.perf_counter() < deadline:
        if on_progress:
            on_progress(Progress("drain", total_s, total_s, run.issued, run.answers, run.oks))
        try:
            await asyncio.wait_for(run.done.wait(), TICK_S)
        except asyncio.TimeoutError:
            run.watchdog(time.perf_counter())
    if rpc is not None:
        await rpc.close()
    else:
        run.abort_all()
    if transport is not None:
        transport.close()
    await asyncio.sleep(0)
    result = _result(run, schedule, window_s, cpu, before, after)
    result.interrupted = run.interrupted
    return result


GRPC_AS_HTTP = {"OK": 200, "INVALID_ARGUMENT": 400, "NOT_FOUND": 404,
                "RESOURCE_EXHAUSTED": 429, "INTERNAL": 500, "UNAVAILABLE": 503,
                "DEADLINE_EXCEEDED": 504}
"""The HTTP status a gRPC status stands for in a :class:`~tailguard.bench.plan.LoadResult` (the
runtime's mapping, ``tailguard_runtime.rpc.service.STATUS_CODES``, read backwards); other
codes are transport errors named ``grpc_<code>``."""
GRPC_CHANNELS = 4
"""gRPC channels (one HTTP/2 connection each) the calls are spread over, round robin."""
MODEL_INFER = "/inference.GRPCInferenceService/ModelInfer"


class _Grpc:
    """The gRPC side of a run: pre-serialized ``ModelInferRequest`` bytes sent as
    ``ModelInfer`` calls over :data:`GRPC_CHANNELS` channels, each call's end recorded as
    :class:`_Run` records an HTTP answer (the gRPC client's own deadline is the run's
    ``timeout_s``; a call that passes it counts as ``timeout``). One task per call: ``grpc.aio``
    gives a call's status only to whoever awaits it."""

    def __init__(self, run: _Run, host: str, port: int) -> None:
        import grpc

        self.grpc = grpc
        self.run = run
        target = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
        limit = max(len(b) for b in run.requests) + (1 << 16)
        options = [("grpc.max_send_message_length", limit)]
        # a subchannel pool of each channel's own: channels with equal arguments would
        # otherwise share one connection
        options.append(("grpc.use_local_subchannel_pool", 1))
        self.channels = [grpc.aio.insecure_channel(target, options=options)
                         for _ in range(min(GRPC_CHANNELS, run.bounds.max_connections))]
        self.calls = [c.unary_unary(MODEL_INFER) for c in self.channels]
        self.in_flight = 0
        self.turn = 0
        self.tasks: set[asyncio.Task[None]] = set()

    async def connect(self) -> None:
        """Wait until every channel is connected.

        Raises:
            OSError: one does not connect within 5 s.
        """
        try:
            for channel in self.channels:
                await asyncio.wait_for(channel.channel_ready(), 5.0)
        except asyncio.TimeoutError:
            await self.close()
            raise OSError("the gRPC port did not accept a connection within 5 s") from None
        self.run.opened = len(self.channels)

    def dispatch(self, i: int, start: float) -> None:
        """Send call ``i`` (scheduled at ``start``, perf_counter s) now."""
        run = self.run
        now = time.perf_counter()
        begin = min(start, now)  # issued early by the tick: count from the real send
        if run.win_start <= start < run.win_end:
            run.waits.append(now - start if now > start else 0.0)
        self.turn = (self.turn + 1) % len(self.calls)
        self.in_flight += 1
        task = run.loop.create_task(self._call(self.calls[self.turn],
                                               run.requests[i % run.n_bodies], start, begin))
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    async def _call(self, call: Any, body: bytes, sched: float, start: float) -> None:
        """One call (``grpc.aio`` has no status without awaiting the call)."""
        try:
            await call(body, timeout=self.run.bounds.timeout_s)
            name = "OK"
        except self.grpc.aio.AioRpcError as exc:
            name = exc.code().name
        except asyncio.CancelledError:  # the run's end closed the channel
            name = "CANCELLED"
        self._finished(name, sched, start)

    def next_call(self) -> None:
        """Closed loop: issue the next call, unless the window is over."""
        run = self.run
        if not run.stopping and run._may_issue():
            self.dispatch(*run.issue(time.perf_counter()))

    def _finished(self, name: str, sched: float, start: float) -> None:
        run = self.run
        self.in_flight -= 1
        now = time.perf_counter()
        status = GRPC_AS_HTTP.get(name)
        if name in ("DEADLINE_EXCEEDED", "CANCELLED") and now - start >= run.bounds.timeout_s:
            run.record_error(sched, "timeout")
        elif status is None:
            run.record_error(sched, f"grpc_{name.lower()}")
        else:
            run.record_answer(sched, start, now, status, ("", ""))
        if isinstance(run.schedule, ClosedLoop):
            self.next_call()
        self.check_done()

    def check_done(self) -> None:
        if self.run.stopping and not self.in_flight:
            self.run.done.set()

    async def close(self) -> None:
        """Close every channel (calls still in flight are cancelled)."""
        for channel in self.channels:
            await channel.close()


def _start_ticks(run: _Run, at: list[float]) -> None:
    """Issue open-loop arrivals (absolute perf_counter times ``at``) from loop timers."""
    n = len(at)
    state = {"next": 0}

    def tick() -> None:
        now = time.perf_counter()
        horizon = now + ISSUE_AHEAD_S
        k = state["next"]
        cap = run.bounds.max_requests
        while k < n and at[k] <= horizon and at[k] < run.win_end and run.issued < cap:
            start = at[k]
            k += 1
            if run.win_start <= start < run.win_end:
                run.lags.append(now - start if now > start else 0.0)
            i, _ = run.issue(start)
            run.dispatch(i, start)
        state["next"] = k
        if k < n and at[k] < run.win_end and run.issued < cap and not run.stopping:
            run.loop.call_later(next_tick_in(at[k], time.perf_counter()), tick)

    run.loop.call_soon(tick)


def _result(run: _Run, schedule: Schedule, window_s: float, cpu: float,
            before: ServerSnapshot | None, after: ServerSnapshot | None) -> LoadResult:
    from tailguard.bench.promview import server_view

    lat = np.frombuffer(run.lat, dtype=np.float64).copy()
    lag = (percentiles_ms(np.frombuffer(run.lags, dtype=np.float64))
           if isinstance(schedule, OpenLoop) else {})
    result = LoadResult(
        mode="open" if isinstance(schedule, OpenLoop) else "closed",
        offered_rps=schedule.rate if isinstance(schedule, OpenLoop) else None,
        concurrency=schedule.concurrency if isinstance(schedule, ClosedLoop) else None,
        window_s=round(window_s, 3), rows_per_request=run.target.rows_per_request,
        sent=run.sent, ok=len(run.lat), rejected_429=run.codes.pop(429, 0),
        http_errors={str(k): v for k, v in sorted(run.codes.items())},
        transport_errors=dict(sorted(run.transport_errors.items())),
        latency_ms=percentiles_ms(lat), latencies_s=lat,
        schedule_lag_ms={k: lag.get(k) for k in ("p50", "p99", "max")} if lag else {},
        client_wait_ms={k: v for k, v in percentiles_ms(
            np.frombuffer(run.waits, dtype=np.float64)).items() if k in ("p50", "p99", "max")},
        connections_opened=run.opened, generator_cpu=cpu,
        server=server_view(before, after) if before is not None and after is not None else None)
    if run.records is not None:
        to_unix = time.time() - time.perf_counter()
        result.records = [
            {"scheduled": round(sched + to_unix, 6), "sent": round(start + to_unix, 6),
             "done": round(done + to_unix, 6), "status": status,
             **({"error": extra} if status == 0 else {"role": extra[0], "model": extra[1]})}
            for sched, start, done, status, extra in sorted(run.records)]
    result.invalid = judge(result.schedule_lag_ms, cpu, run.bounds.max_lag_p99_ms)
    return result


def run_sync(coro: Coroutine[Any, Any, LoadResult]) -> LoadResult:
    """Run :func:`run_load`'s coroutine on uvloop when installed, else asyncio's default loop."""
    try:
        import uvloop
    except ImportError:  # pragma: no cover - uvloop ships with uvicorn[standard]
        return asyncio.run(coro)
    result: LoadResult = uvloop.run(coro)
    return result
