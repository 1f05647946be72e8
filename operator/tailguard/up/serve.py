"""``tailguard up``: one InferenceService served on this machine, no cluster.

Reads the same YAML that ``kubectl apply`` takes, validates it with the CRD's own rules, loads
the primary and the fallback into one runtime process, and serves them at the cluster's paths.
A loopback-only control route (guarded by a per-run secret in a file only this user can read,
:mod:`tailguard.up.control`) lets ``tailguard rollback NAME`` switch traffic, and the SLO guard
(:mod:`tailguard.guard.local`) judges every window and rolls back a primary that breaks the SLO. Shows a live
status line on a terminal, plain log lines otherwise. Ctrl-C (or SIGTERM) drains and exits.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import os
import signal
import sys
import threading
import time
from typing import Any, Callable, TextIO, TypeVar

from tailguard.guard.local import LocalGuard
from tailguard.spec.resource import InferenceService, read_file
from tailguard.spec.schema import SpecError
from tailguard.up.control import new_secret, remove_control_file, write_control_file
from tailguard.up.statusline import StatusLine
from tailguard_runtime.errors import ModelLoadError
from tailguard_runtime.models import Predictor
from tailguard_runtime.server import (
    DrainingServer,
    base_url,
    bind_socket,
    free_port,
    limit_threads,
    run,
    serve,
)
from tailguard_runtime.service import Runtime, load_runtime

T = TypeVar("T")

CLUSTER_ONLY = {
    "scaling.minReplicas": "autoscaling needs a cluster; tailguard up runs one process",
    "scaling.maxReplicas": "autoscaling needs a cluster; tailguard up runs one process",
    "scaling.targetCPUUtilization": "autoscaling needs a cluster; tailguard up runs one process",
    "scaling.behavior": "autoscaling needs a cluster; tailguard up runs one process",
    "model.caConfigMap": "a ConfigMap is read in a cluster; tailguard up trusts "
                         "$TAILGUARD_MODEL_CA_FILE",
    "fallback.caConfigMap": "a ConfigMap is read in a cluster; tailguard up trusts "
                            "$TAILGUARD_MODEL_CA_FILE",
}
"""Fields that only mean something in a cluster. ``scaling.targetQueueDepth`` is not here: the
SLO guard reads it locally too (a deeper mean queue is overload, answered by shedding)."""


def not_applicable(raw_spec: dict[str, Any]) -> list[str]:
    """Lines naming the fields the user set that ``tailguard up`` accepts but does not apply,
    one line per reason."""
    by_reason: dict[str, list[str]] = {}
    for path, reason in CLUSTER_ONLY.items():
        if _has(raw_spec, path):
            by_reason.setdefault(reason, []).append(f"spec.{path}")
    return [f"{', '.join(paths)}: not applicable locally ({reason})"
            for reason, paths in by_reason.items()]


def _has(mapping: dict[str, Any], dotted: str) -> bool:
    for key in dotted.split("."):
        if not isinstance(mapping, dict) or key not in mapping:
            return False
        mapping = mapping[key]
    return True


def status_line(runtime: Runtime, now: float, guard: LocalGuard | None = None) -> str:
    """One line: active model, p99 against the SLO and p50 (ms, exact over the sliding window),
    queue depth (rows), admitted req/s, refusals, the requests the SLO guard judges and those
    it leaves out (a client's own short deadline or rejected rows), and the guard's state."""
    served = runtime.active
    snap = served.stats.snapshot(now, served.batcher.queue_depth)
    p99 = "-" if snap["p99Ms"] is None else f"{snap['p99Ms']:.1f}ms"
    p50 = "-" if snap["p50Ms"] is None else f"{snap['p50Ms']:.1f}ms"
    slo = runtime.settings.slo_p99_ms
    target = "" if slo is None else f"/{slo:g}ms"
    state = "" if guard is None else f" guard={guard.label()}"
    return (f"{runtime.name}: active={runtime.active_role} p99={p99}{target} p50={p50} "
            f"queue={snap['queueDepth']} req/s={snap['requestsPerSecond']:.0f} "
            f"errors={snap['errors']} rejected={snap['rejectedTotal']} judged={snap['judged']}"
            f"{_excluded(snap.get('excluded') or {})}{state} "
            f"(last {snap['windowSeconds']:.0f}s)")


def _excluded(excluded: dict[str, int]) -> str:
    """`` excluded=N (reason=n, ...)`` when the window left requests out of judgement."""
    if not excluded:
        return ""
    reasons = ", ".join(f"{reason}={n}" for reason, n in sorted(excluded.items()))
    return f" excluded={sum(excluded.values())} ({reasons})"


async def report_status(runtime: Runtime, shown: StatusLine, interval_s: float,
                        guard: LocalGuard | None = None) -> None:
    """Show :func:`status_line` every ``interval_s`` seconds."""
    while True:
        await asyncio.sleep(interval_s)
        shown.update(status_line(runtime, time.perf_counter(), guard))


def up(path: str, *, host: str, port: int, out: TextIO = sys.stdout, command: str = "tailguard",
       port_hint: str = "use --port to pick another port",
       allowed_origins: tuple[str, ...] = (), grpc_port: int | None = None) -> int:
    """Serve the InferenceService in ``path`` until interrupted. Returns the exit code:
    0 after a clean drain; 2 for a file that cannot be read or an invalid spec; 1 for a model
    that cannot load, a busy port or a control file that cannot be written.

    ``command`` is how the banner spells the ``tailguard`` command so that its lines run as
    printed (e.g. ``.venv/bin/tailguard``); ``port_hint`` ends the busy-port line (``make up``
    names ``PORT=``); ``allowed_origins``: web origins whose requests are served (every other
    browser request gets 403); ``grpc_port``: the gRPC service's port (``None``: the spec's
    ``grpcPort``, or a free port when ``port`` is 0; 0: a free port). Traffic switches are
    logged (logger ``tailguard_runtime.traffic``) and Ctrl-C prints the drain's counts.
    """
    try:
        found = read_file(path)
    except OSError as exc:
        print(f"tailguard up: cannot read {path}: {exc.strerror}", file=sys.stderr)
        return 2
    except SpecError as exc:
        print(exc.for_people("tailguard up", path), file=sys.stderr)
        return 2
    written, isvc = found.written, found.isvc
    traffic = logging.getLogger("tailguard_runtime.traffic")
    if not traffic.isEnabledFor(logging.INFO):
        traffic.setLevel(logging.INFO)  # every switch is one line, whatever --log-level says
    for line in not_applicable(written.get("spec") or {}):
        print(f"note: {line}", file=out)
    try:  # before the (possibly slow) model load, so a busy port fails at once
        sock = bind_socket(host, port)
    except OSError as exc:
        print(f"tailguard up: cannot listen on {host}:{port}: {exc.strerror} ({port_hint})",
              file=sys.stderr)
        return 1
    if grpc_port is None:
        grpc_port = 0 if port == 0 else isvc.grpc_port
    try:
        grpc_port = free_port(host, grpc_port)
    except OSError as exc:
        print(f"tailguard up: cannot listen on {host}:{grpc_port} for gRPC: {exc.strerror} "
              "(use --grpc-port to pick another port)", file=sys.stderr)
        sock.close()
        return 1
    limit_threads()
    secret = new_secret()
    runtime = load_or_exit(lambda: _load(isvc, out, secret, allowed_origins))
    if runtime is None:
        sock.close()
        return 1
    bound = sock.getsockname()[1]
    try:
        control = write_control_file(isvc.name, bound, secret)
    except OSError as exc:
        print(f"tailguard up: cannot write the control file for tailguard rollback: {exc}",
              file=sys.stderr)
        sock.close()
        return 1
    print(_banner(isvc, base_url(host, bound), command, grpc_port), file=out, flush=True)
    shown = StatusLine(out)
    guard = LocalGuard(runtime, isvc, shown)
    runtime.status_source = guard.status

    async def started(server: DrainingServer) -> None:
        await asyncio.gather(
            guard.run(),
            report_status(runtime, shown, 1.0 if shown.terminal
                          else float(isvc.slo.window_seconds), guard))

    try:
        with shown:
            run(serve(runtime, sock, grpc_port=grpc_port, on_started=started))
    except OSError as exc:  # the gRPC port, taken since free_port looked
        print(f"tailguard up: {exc.strerror or exc}", file=sys.stderr)
        return 1
    finally:
        remove_control_file(control)
    report = runtime.drain_report
    if report is not None:  # the 503s go on until the server stops listening: count them all
        report = dataclasses.replace(report, refused=runtime.refused_draining)
    print(f"tailguard up: {report.line() + '; ' if report else ''}stopped", file=out, flush=True)
    return 0


def load_or_exit(load: Callable[[], T]) -> T:
    """``load()`` (a model load: unpickling or training, arbitrary code that cannot be stopped
    safely) run in a daemon thread while the main thread waits. Returns what ``load``
    returns and raises what it raises.

    Ctrl-C while it runs writes ``tailguard up: interrupted`` and ends the process with 130,
    as every command does on Ctrl-C, from the signal handler itself (``os.write``, then
    ``os._exit``): nothing waits for the load or for a lock it may hold. (A load inside C code
    that holds the GIL delays the handler until it lets go.) The handler is ours for the load,
    even when SIGINT came ignored or blocked from the parent (a script's background job):
    serving, uvicorn installs its own handler all the same. Found by trying: a
    KeyboardInterrupt raised inside the load (an import, the unpickler) sometimes ended the
    process killed by SIGINT instead of with 130; started with SIGINT ignored, a load that
    could not finish was never interrupted.
    """
    outcome: list[Any] = []

    def interrupted(signum: int, frame: Any) -> None:
        os.write(2, b"tailguard up: interrupted\n")
        os._exit(130)

    def work() -> None:
        limit_threads()  # BLAS and OpenMP limits hold per thread: this one trains and loads
        try:
            outcome.append((True, load()))
        except BaseException as exc:  # handed to the main thread, raised there
            outcome.append((False, exc))

    previous = signal.signal(signal.SIGINT, interrupted)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
    try:
        thread = threading.Thread(target=work, name="tailguard-load", daemon=True)
        thread.start()
        while thread.is_alive():
            thread.join(0.1)
    finally:
        signal.signal(signal.SIGINT, previous)
    ok, value = outcome[0]
    if not ok:
        raise value
    return value  # type: ignore[no-any-return]


def _load(isvc: InferenceService, out: TextIO, secret: str,
          allowed_origins: tuple[str, ...] = ()) -> Runtime | None:
    settings = dataclasses.replace(isvc.runtime_settings(control_secret=secret),
                                   allowed_origins=allowed_origins)

    def loading(role: str, uri: str) -> None:
        print(f"loading {role} {uri} ...", file=out, flush=True)

    def loaded(role: str, predictor: Predictor, seconds: float) -> None:
        print(f"  {role}: {predictor.estimator_type}, {predictor.n_features} features, "
              f"ready in {seconds:.1f}s", file=out, flush=True)

    try:
        runtime = load_runtime(settings, on_loading=loading, on_loaded=loaded)
    except ModelLoadError as exc:
        print(f"tailguard up: {exc}", file=sys.stderr)
        return None
    if isvc.traffic == "fallback":
        runtime.switch("fallback", by="spec")
    return runtime


def _banner(isvc: InferenceService, base: str, command: str, grpc_port: int) -> str:
    b = isvc.batching
    port = "" if base.endswith(":8080") else f" --port {base.rsplit(':', 1)[1]}"
    grpc_at = base.removeprefix("http://").rsplit(":", 1)[0] + f":{grpc_port}"
    return "\n".join([
        f"serving InferenceService {isvc.name} on {base} (traffic -> {isvc.traffic})",
        f"  gRPC       {grpc_at} (inference.GRPCInferenceService)",
        f"  v2 infer   POST {base}/v2/models/{isvc.name}/infer",
        f"  v1 predict POST {base}/v1/models/{isvc.name}:predict",
        f"  metadata   GET  {base}/v2/models/{isvc.name}",
        f"  metrics    GET  {base}/metrics      stats GET {base}/tailguard/stats",
        f"  batching   maxBatchSize={b.max_batch_size} maxWaitMs={b.max_wait_ms:g} "
        f"maxQueueSize={b.max_queue_size} timeoutMs={b.timeout_ms:g}; "
        f"SLO p99 {isvc.slo.p99_latency_ms} ms",
        "  SLO guard  " + (f"rolls back after {isvc.slo.breach_windows} breached windows of "
                           f"{isvc.slo.window_seconds}s" if isvc.automatic_rollback
                           else "reports only (rollback.automatic: false)"),
        f"  roll back  {command} rollback {isvc.name}{port}",
        f"  and back   {command} rollforward {isvc.name}{port}",
        f"  status     {command} status {isvc.name}{port}",
        "Ctrl-C drains and stops.",
    ])
