"""The process lifecycle: listen, serve, and drain on SIGTERM.

Shutdown order, on the first SIGTERM or SIGINT: readiness turns 503 and admission stops (new
requests get 503, or ``UNAVAILABLE`` on gRPC, while the listeners are still open), the forming
batch is flushed at once, every admitted request gets up to ``drain_grace_seconds`` to finish,
whatever is still unanswered then gets 503 (never a dropped connection), and only then does
uvicorn close the listener and the idle connections, and the gRPC server stops. A second
SIGINT forces the exit. In a cluster a preStop delay before SIGTERM lets
the endpoints update first.

``tailguard-runtime`` (:mod:`tailguard_runtime.main`) is the container entry point; ``tailguard up``
calls :func:`serve` in-process.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import json
import logging
import os
import signal
import socket
from typing import Any, Awaitable, Callable, Iterator

import grpc
import uvicorn

from tailguard_runtime.errors import TailguardError
from tailguard_runtime.http.app import build_app
from tailguard_runtime.http.connections import bounded_protocol
from tailguard_runtime.http.pool import raise_fd_limit
from tailguard_runtime.looplag import LoopLagProbe
from tailguard_runtime.metrics import EVENT_LOOP_LAG
from tailguard_runtime.rpc.service import grpc_server
from tailguard_runtime.service import Runtime
from tailguard_runtime.settings import RuntimeSettings

logger = logging.getLogger(__name__)


class DrainingServer(uvicorn.Server):
    """A uvicorn server whose SIGTERM/SIGINT first drains the runtime, then exits; SIGUSR1 (the
    pod's preStop hook) makes it leave (:meth:`Runtime.leave`) and keep serving."""

    def __init__(self, config: uvicorn.Config, runtime: Runtime) -> None:
        super().__init__(config)
        self.runtime = runtime
        self._drain_task: asyncio.Task[None] | None = None

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        loop = asyncio.get_running_loop()
        signals = (signal.SIGTERM, signal.SIGINT)
        for sig in signals:
            loop.add_signal_handler(sig, self.begin_shutdown, sig)
        loop.add_signal_handler(signal.SIGUSR1, self.leave)
        try:
            yield
        finally:
            for sig in (*signals, signal.SIGUSR1):
                loop.remove_signal_handler(sig)

    def leave(self) -> None:
        """SIGUSR1: the pod is leaving; answers carry ``Connection: close`` from now on."""
        if not self.runtime.leaving:
            logger.info("signal SIGUSR1: leaving (answers close their connections)")
        self.runtime.leave()

    def begin_shutdown(self, sig: int = signal.SIGTERM) -> None:
        """Start the drain (first signal); a second SIGINT forces the exit."""
        if self._drain_task is not None:
            if sig == signal.SIGINT:
                logger.warning("second interrupt: exiting without waiting")
                self.force_exit = True
                self.should_exit = True
            return
        logger.info("signal %s: draining (grace %.0f s)", signal.Signals(sig).name,
                    self.runtime.settings.drain_grace_seconds)
        self._drain_task = asyncio.get_running_loop().create_task(self._drain(), name="tailguard-drain")

    async def _drain(self) -> None:
        try:
            report = await self.runtime.drain(self.runtime.settings.drain_grace_seconds)
            if report.cut_off:
                logger.warning("grace period ended: %s", report.line())
            else:
                logger.info("%s", report.line())
        finally:
            self.should_exit = True


def bind_socket(host: str, port: int) -> socket.socket:
    """Bind a listening TCP socket (``port`` 0 picks a free one).

    Raises:
        OSError: the address is in use or not available.
    """
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        sock.listen(2048)
    except OSError:
        sock.close()
        raise
    sock.setblocking(False)
    return sock


def free_port(host: str, port: int) -> int:
    """``port`` when it can be bound on ``host`` now, or, for 0, a port that was free a moment
    ago (for a server that binds later, such as the gRPC one); the socket is closed again.

    Raises:
        OSError: the address is in use or not available.
    """
    with contextlib.closing(bind_socket(host, port)) as sock:
        return int(sock.getsockname()[1])


def base_url(host: str, port: int) -> str:
    """``http://HOST:PORT``, with an IPv6 address in brackets (``http://[::]:8080``)."""
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"


async def serve(runtime: Runtime, sock: socket.socket, *, grpc_port: int | None = None,
                on_started: Callable[[DrainingServer], Awaitable[None]] | None = None) -> None:
    """Serve ``runtime`` on an already bound socket until a signal drains it, and the Open
    Inference Protocol's gRPC service on ``grpc_port`` of the same host (0: a free port;
    ``None``: no gRPC) until the drain has answered every admitted request.

    ``on_started`` runs once the server listens (``tailguard up`` uses it for its status line).

    Raises:
        OSError: the gRPC port cannot be bound (before anything is served).
    """
    rpc: grpc.aio.Server | None = None
    if grpc_port is not None:
        rpc = grpc_server(runtime, sock.getsockname()[0], grpc_port)
    await runtime.start()
    # http: uvicorn's httptools protocol with JSON errors and per-connection bounds.
    # proxy_headers off: nothing sits in front of the runtime that we trust, and uvicorn would
    # otherwise take X-Forwarded-For from any 127.0.0.1 peer as the client address.
    limits = runtime.settings.connections
    raise_fd_limit()

    def count_refusal(exc: TailguardError) -> None:
        # refused below the app, before any route: counted under the role traffic goes to
        runtime.active.metrics.count_rejection(exc.reason)

    # uvicorn calls ``http`` as a class, with keywords; a bound constructor serves as well
    protocol = bounded_protocol(limits, model=runtime.name, count_refusal=count_refusal)
    config = uvicorn.Config(build_app(runtime), http=protocol,  # type: ignore[arg-type]
                            ws="none", lifespan="off", access_log=False, log_config=None,
                            timeout_graceful_shutdown=5, server_header=False, proxy_headers=False,
                            timeout_keep_alive=limits.keep_alive_s)  # type: ignore[arg-type]
    server = DrainingServer(config, runtime)
    if rpc is not None:
        await rpc.start()
    tune_garbage_collector()
    lag_probe = LoopLagProbe(asyncio.get_running_loop(),
                             EVENT_LOOP_LAG.labels(runtime.name).observe)
    lag_probe.start()
    helper: asyncio.Task[None] | None = None
    if on_started is not None:
        async def _after_start() -> None:
            while not server.started:
                await asyncio.sleep(0.01)
            await on_started(server)
        helper = asyncio.get_running_loop().create_task(_after_start(), name="tailguard-on-started")
    try:
        await server.serve(sockets=[sock])
    finally:
        lag_probe.stop()
        if helper is not None:
            helper.cancel()
            await asyncio.gather(helper, return_exceptions=True)
        if rpc is not None:  # the drain has answered every admitted call by now
            await rpc.stop(grace=1.0)
        await runtime.close()


async def follow_traffic(runtime: Runtime, config_path: str, role: str,
                         interval_s: float = 2.0) -> None:
    """Re-read the JSON file ``config_path`` (in a cluster, the operator's ``traffic.json``)
    every ``interval_s`` seconds when its mtime changed; when its ``activeModel`` names another
    role, stop keeping connections alive (a Service selector change does not move established
    connections; ``Connection: close`` does)."""
    last_mtime = 0.0
    while True:
        try:
            mtime = os.stat(config_path).st_mtime
            if mtime != last_mtime:
                last_mtime = mtime
                with open(config_path, encoding="utf-8") as fh:
                    active = RuntimeSettings.active_model_of(json.load(fh), role)
                if runtime.keep_alive != (active == role and not runtime.leaving):
                    runtime.keep_alive = active == role and not runtime.leaving
                    logger.info("traffic role=%s active=%s keep_alive=%s", role, active,
                                runtime.keep_alive)
        except (OSError, ValueError) as exc:
            logger.warning("cannot read %s: %s", config_path, exc)
        await asyncio.sleep(interval_s)


CPYTHON_GC_DEFAULTS = (700, 10, 10)
"""CPython's own thresholds for its generational collector (3.11 and 3.12)."""

GC_THRESHOLDS = (700, 3, 100)
"""The garbage collector's thresholds while serving, in place of :data:`CPYTHON_GC_DEFAULTS`
(:func:`gc.set_threshold`): a young collection every 700 net allocations, as by default; a
middle collection after every 3 young ones instead of 10 (what survives it moves to the old
generation, which is not scanned again until a full collection); a full collection considered
after 100 middle ones instead of 10, so after 300 young ones instead of 100 (CPython also waits
until the old generation has grown by a quarter). Open connections are long-lived tracked
objects, about 20 each: with the defaults, many open sockets made middle collections
frequent and full ones long, and both held the event loop. These make both rarer and
shorter; the runs and the other thresholds tried are in ``benchmarks/README.md`` ("Hostile
clients", the garbage collector's thresholds). The price: cycles that outlive a middle
collection wait about three times longer for a full one. No collection in those runs found
any garbage; cycles that die young are collected as often as before."""


def tune_garbage_collector() -> None:
    """Ready the garbage collector for serving: collect once, move every object alive now
    (models, modules, the app) out of its sight with :func:`gc.freeze` (Python 3.7+), and set
    :data:`GC_THRESHOLDS` if the thresholds are still CPython's 3.11/3.12 defaults (a newer
    CPython's collector, or thresholds set by whoever runs the process, are left alone).
    Without the freeze, every full collection scanned all the objects of startup and held the
    event loop for a long stretch under the hostile-client soak (figures in
    ``benchmarks/README.md``, "Hostile clients", garbage collection); with it, a full
    collection scans only what serving created."""
    gc.collect()
    gc.freeze()
    if gc.get_threshold() == CPYTHON_GC_DEFAULTS:
        gc.set_threshold(*GC_THRESHOLDS)


def limit_threads() -> None:
    """One BLAS/OpenMP thread per process: the model thread owns the core, and a second
    thread competes with the event loop for it (see ``benchmarks/README.md``, "Figures cited
    by the runtime's docstrings")."""
    from threadpoolctl import threadpool_limits

    threadpool_limits(limits=1)


def run(coro: Awaitable[Any]) -> Any:
    """Run ``coro`` on uvloop when it is installed, else on asyncio's default loop."""
    try:
        import uvloop
    except ImportError:  # pragma: no cover - uvloop ships with uvicorn[standard]
        return asyncio.run(coro)  # type: ignore[arg-type]
    return uvloop.run(coro)  # type: ignore[arg-type]
