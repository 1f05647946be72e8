"""The SLO guard in the cluster at scale: what one operator pays to observe a runtime pod.

    .venv/bin/python benchmarks/guard_scale.py                           # 100 x 10 pods, 10 s windows
    .venv/bin/python benchmarks/guard_scale.py --services 10 --seconds 25   # a smoke run

1. One process serves ``/tailguard/stats`` on ``services x pods`` ports of 127.0.0.1 (uvicorn,
   one socket a pod, the ``--serve`` mode of this file). Each answer has a runtime's shape and
   is built by the runtime's own code (:class:`tailguard_runtime.stats.WindowStats`): before
   each answer the pod records the requests it would have served since its last read, at
   ``--rate`` requests/s, 0.5% of them slower than the SLO.
2. A control plane built from upstream (the test harness's, ``hack/kube/build.py``) with the
   chart installed, and one InferenceService a service (``--window`` s windows).
3. The operator's guard (:class:`tailguard.operator.guarding.ClusterGuard`, the code the
   operator pod runs) runs in this process for ``--seconds``, as the operator's ServiceAccount,
   writing status to the real API server; its pod index holds the served endpoints (what the
   pod watch would hold).

It prints one JSON object: reads by result; windows closed against those due; how late each
window began against its schedule and how long it took (p50/p99/max, ms: a guard that falls
behind begins windows late); status writes; the guard's CPU time (this process: reads,
parsing, differencing, deciding and writing) per pod read; and from that, the most pods one
operator can guard at 10 s windows with one core, and with half of one. Everything listens on
127.0.0.1; every process started here is stopped by its PID.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import resource as rusage
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))  # the test harness, as a package

import yaml  # noqa: E402

SLO_MS = 100
SLOW_SHARE = 0.005
"""Share of the served requests slower than the SLO (under the 1% a breach needs)."""


# --- the stats endpoints (``--serve``) ------------------------------------------------------

def serve(count: int, rate: float, ports_file: Path) -> None:
    """Serve ``count`` runtime-shaped ``/tailguard/stats`` endpoints from this process, one
    socket each on 127.0.0.1; write their ports to ``ports_file`` (JSON) once listening."""
    import numpy as np
    import uvicorn
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import JSONResponse
    from starlette.routing import Route

    from tailguard_runtime.stats import WindowStats

    _, hard = rusage.getrlimit(rusage.RLIMIT_NOFILE)
    rusage.setrlimit(rusage.RLIMIT_NOFILE, (hard, hard))  # a socket a pod, and their clients
    if hard < 2 * count + 64:
        raise SystemExit(f"{count} endpoints need more file descriptors than the limit {hard}")
    sockets = []
    for _ in range(count):
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.bind(("127.0.0.1", 0))
        sockets.append(sock)
    ports = [s.getsockname()[1] for s in sockets]
    index = {port: i for i, port in enumerate(ports)}
    start = time.perf_counter()
    pods = [WindowStats(10.0, slo_s=SLO_MS / 1000, max_batch_size=32) for _ in ports]
    last = [start] * count
    rng = np.random.default_rng(0)

    async def stats(request: Request) -> JSONResponse:
        i = index[request.scope["server"][1]]
        now = time.perf_counter()
        served = int(rate * (now - last[i]))
        if served:
            last[i] += served / rate
            slow = rng.random(served) < SLOW_SHARE
            latencies = np.where(slow, SLO_MS * 1.5, rng.uniform(2.0, 40.0, served)) / 1000
            window = pods[i]
            for latency in latencies.tolist():
                window.admitted(now, latency, True)
            for _ in range(max(1, served // 4)):
                window.totals.call(0.004, 4)
        queue_row_seconds = 0.5 * (now - start)
        return JSONResponse({"name": f"pod-{i}", "activeModel": "primary", "ready": True,
                             "models": {"primary": pods[i].snapshot(now, 0)},
                             "totals": {"primary": pods[i].totals.snapshot(queue_row_seconds)}})

    app = Starlette(routes=[Route("/tailguard/stats", stats)])
    config = uvicorn.Config(app, log_level="warning", access_log=False, lifespan="off",
                            backlog=4096)
    server = uvicorn.Server(config)

    async def run() -> None:
        task = asyncio.create_task(server.serve(sockets=sockets))
        while not server.started:
            await asyncio.sleep(0.05)
        ports_file.write_text(json.dumps(ports))
        await task

    asyncio.run(run())


# --- the guard ------------------------------------------------------------------------------

def pod_body(namespace: str, service: str, i: int, port: int) -> dict[str, Any]:
    """A Ready runtime pod of ``service`` on 127.0.0.1:``port``, as the pod watch lists it."""
    from tailguard.operator.manifests import LABEL_ROLE, LABEL_SERVICE, PORT_NAME
    return {"metadata": {"namespace": namespace, "name": f"{service}-primary-{i}",
                         "uid": f"{service}-{i}",
                         "labels": {LABEL_SERVICE: service, LABEL_ROLE: "primary"}},
            "spec": {"containers": [{"ports": [{"name": PORT_NAME, "containerPort": port}]}]},
            "status": {"phase": "Running", "podIP": "127.0.0.1",
                       "conditions": [{"type": "Ready", "status": "True"}]}}


def percentile(values: list[float], q: float) -> float:
    """The ``q``-quantile (0..1) of ``values`` by nearest rank; 0 for none."""
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def guard_for(guard: Any, seconds: float) -> dict[str, Any]:
    """Run ``guard`` for ``seconds``; how late each window began against its schedule (ms),
    how long each took (ms), and how many were closed (a window cut off at the end is not)."""
    late_ms: list[float] = []
    took_ms: list[float] = []
    closed = 0
    due, window = guard._due, guard.window

    async def timed_due(key: Any, now_s: float) -> Any:
        late_ms.append(max(0.0, time.monotonic() - guard._tracked[key].next_s) * 1000)
        return await due(key, now_s)

    async def timed_window(body: Any, isvc: Any, tracked: Any) -> Any:
        nonlocal closed
        began = time.monotonic()
        decision = await window(body, isvc, tracked)
        took_ms.append((time.monotonic() - began) * 1000)
        closed += 1
        return decision

    guard._due, guard.window = timed_due, timed_window
    task = asyncio.create_task(guard.run())
    await asyncio.sleep(seconds)
    task.cancel()
    try:
        await task
    except asyncio.CancelledError:
        pass
    return {"windows": closed, "late_ms": late_ms, "took_ms": took_ms}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--services", type=int, default=100)
    parser.add_argument("--pods", type=int, default=10, help="runtime pods a service")
    parser.add_argument("--window", type=int, default=10, help="slo.windowSeconds")
    parser.add_argument("--seconds", type=float, default=65.0, help="how long the guard runs")
    parser.add_argument("--rate", type=float, default=20.0, help="requests/s a pod serves")
    parser.add_argument("--serve", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    total = args.services * args.pods
    if args.serve is not None:
        serve(total, args.rate, args.serve)
        return 0

    from harness.hack import load
    from harness.kube.client import Client
    from harness.kube.controlplane import ControlPlane, bindir
    from harness.kube.install import install
    from tailguard.operator import kube
    from tailguard.operator.cache import WatchCache
    from tailguard.operator.guarding import READS, ClusterGuard
    from tailguard.operator.podindex import PodIndex
    from tailguard.operator.settings import OperatorSettings
    from tailguard.spec import resource

    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # run the cleanup below
    tag = os.environ.get("TAILGUARD_KUBE_VERSION", load("build").DEFAULT_TAG)
    work = Path(tempfile.mkdtemp(prefix="tailguard-guard-scale-"))
    ports_file = work / "ports.json"
    with open(work / "stats-server.log", "wb") as log:
        server = subprocess.Popen([sys.executable, __file__, "--services", str(args.services),
                                   "--pods", str(args.pods), "--rate", str(args.rate),
                                   "--serve", str(ports_file)], stdout=log, stderr=log,
                                  stdin=subprocess.DEVNULL)
    plane = ControlPlane(bindir(tag), work / "cluster", tag)
    print(f"serving {total} stats endpoints; starting a {tag} control plane in {work} ...",
          flush=True)
    plane.start()
    installation = None
    try:
        admin = Client(plane.admin.kubeconfig)
        installation = install(plane, admin)
        namespace = "guard-scale"
        admin.create({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}})
        example = yaml.safe_load((REPO / "examples" / "iris.yaml").read_text())
        example["spec"]["slo"] = {"p99LatencyMs": SLO_MS, "windowSeconds": args.window,
                                  "breachWindows": 3, "minSamples": 50}
        cache, pods = WatchCache(), PodIndex()
        for s in range(args.services):
            cache.keep(admin.create({**example, "metadata": {"name": f"iris-{s:04d}",
                                                              "namespace": namespace}}))
        deadline = time.monotonic() + 120
        while not ports_file.exists():
            if server.poll() is not None or time.monotonic() > deadline:
                raise SystemExit("the stats server did not start: "
                                 + (work / "stats-server.log").read_text()[-2000:])
            time.sleep(0.2)
        ports = json.loads(ports_file.read_text())
        for s in range(args.services):
            for p in range(args.pods):
                pods.keep(pod_body(namespace, f"iris-{s:04d}", p, ports[s * args.pods + p]))
        kube.connect(kubeconfig=str(installation.identity.kubeconfig))
        guard = ClusterGuard(OperatorSettings(), cache, pods, reconcile=lambda ns, name: None)
        print(f"{args.services} InferenceServices x {args.pods} pods; the guard runs for "
              f"{args.seconds:g} s ({args.window} s windows) ...", flush=True)

        def reads(result: str) -> float:
            return READS.labels(result)._value.get()  # type: ignore[no-any-return]

        before = {r: reads(r) for r in ("ok", "timeout", "error")}
        cpu0 = rusage.getrusage(rusage.RUSAGE_SELF)
        run = asyncio.run(guard_for(guard, args.seconds))
        cpu1 = rusage.getrusage(rusage.RUSAGE_SELF)
        cpu_s = (cpu1.ru_utime - cpu0.ru_utime) + (cpu1.ru_stime - cpu0.ru_stime)
        counted = {r: int(reads(r) - before[r]) for r in before}
        written = [isvc for isvc in admin.list(resource.PLURAL, namespace)
                   if (isvc.get("status") or {}).get("observed")]
        per_read_ms = cpu_s * 1000 / max(1, counted["ok"])
        result = {
            "services": args.services, "pods": total, "window_s": args.window,
            "seconds": args.seconds, "kubernetes": tag,
            "reads": counted,
            "windows_closed": run["windows"],
            "windows_due": int(args.services * (args.seconds // args.window + 1)),
            "late_ms": {q: round(percentile(run["late_ms"], v), 1)
                        for q, v in (("p50", 0.5), ("p99", 0.99), ("max", 1.0))},
            "window_ms": {q: round(percentile(run["took_ms"], v), 1)
                          for q, v in (("p50", 0.5), ("p99", 0.99), ("max", 1.0))},
            "services_with_status_observed": len(written),
            "guard_cpu_s": round(cpu_s, 2),
            "guard_cpu_ms_per_pod_read": round(per_read_ms, 3),
            "most_pods_at_10s_windows_one_core": int(10_000 / per_read_ms),
            "most_pods_at_10s_windows_half_core": int(5_000 / per_read_ms),
        }
    finally:
        server.send_signal(signal.SIGTERM)
        try:
            server.wait(10)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()
        for started in installation.processes if installation else ():
            installation.stop_operator(started)  # type: ignore[union-attr]
        plane.stop()
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
