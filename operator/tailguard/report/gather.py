"""``tailguard report FILE.yaml``: the evidence card of a service, from its own measurements.

Serves the InferenceService with ``tailguard up`` on a free loopback port, then measures every
section itself: the runtime choice (versions, the models' class and size, the machine), the
request contract (endpoints, one example request and its real reply, the error shapes with the
status codes they really got), latency and cost (the raw model table, in process; the
configured policy under load), the failure checks (each run, with what happened) and the
rollback plan (the fallback's own measured latency, how to switch by hand, the SLO guard's rule
in force). Writes ``report.md``, ``report.json`` and the plots into ``--out DIR``.

:func:`gather` measures (I/O), :mod:`tailguard.report.markdown` renders (pure), :mod:`tailguard.cli.report` is the CLI
shell.
"""

from __future__ import annotations

import datetime
import json
import os
import pickle
import platform
import time
from importlib import metadata
from pathlib import Path
from typing import Any

import httpx
import numpy as np

from tailguard.bench.plan import outcome, sweep_verdict
from tailguard.guard.policy import (
    QUEUEING_RATIO,
    SLOW_FRACTION,
    GuardSpec,
)
from tailguard.report import probes
from tailguard.spec.resource import InferenceService
from tailguard.tune.grid import Policy
from tailguard.tune.rawtable import BATCH_SIZES, RawRow, raw_table
from tailguard.tune.search import Show, TuneOptions, measure_policy, point_result, sweep_rates
from tailguard.up.control import find_control_file
from tailguard_runtime.models import Predictor

GET_ROUTES = ("/v2/health/live", "/v2/health/ready", "/v2", "/v2/models/{name}",
              "/v2/models/{name}/ready", "/metrics", "/tailguard/stats")


def gather(isvc: InferenceService, base: str, rows: np.ndarray, rows_source: str,
           predictors: dict[str, Predictor], load: TuneOptions, *, table_seconds: float = 0.5,
           show: Show = lambda label: None) -> dict[str, Any]:
    """Measure every section against the service served at ``base`` (``http://host:port``).

    ``rows`` (``(n, n_features)`` float64, from ``rows_source``) feed every request;
    ``predictors`` are the service's models loaded in this process (``primary``, ``fallback``)
    for the raw tables (about ``table_seconds`` per batch size and model). The configured
    policy is loaded last, with ``tailguard tune``'s open-loop rate sweep (``load.point_s``
    measured per rate after ``load.warmup_s``, at most ``load.budget_s`` in all), since its last
    rate breaks the SLO on purpose. Returns the report as a JSON-ready dict (:mod:`tailguard.report.markdown`
    renders it). Raises ``httpx.HTTPError`` when the service stops answering.
    """
    name, b = isvc.name, isvc.batching
    raw = {role: raw_table(p.run, rows, BATCH_SIZES, seconds=table_seconds)
           for role, p in predictors.items()}
    tables = {role: [r.as_dict() for r in t] for role, t in raw.items()}
    with httpx.Client(base_url=base, timeout=30.0) as client:
        server = client.get("/v2").json()
        endpoints = [{"method": "GET", "path": p.format(name=name),
                      "status": client.get(p.format(name=name)).status_code} for p in GET_ROUTES]
        example = probes.send(client, "POST", probes.infer_path(name),
                              probes.v2_body(probes.rows_of(rows, 1)))
        v1 = probes.send(client, "POST", f"/v1/models/{name}:predict",
                         json.dumps({"instances": probes.rows_of(rows, 1).tolist()}))
        endpoints += [{"method": "POST", "path": example.path, "status": example.status},
                      {"method": "POST", "path": v1.path, "status": v1.status}]
        errors = probes.error_shapes(client, name, rows, b.max_queue_size)
        deadline = probes.deadline(client, name, rows, min(b.max_batch_size, b.max_queue_size))
        overload = probes.overload(base, name, rows, b.max_queue_size)
        control = find_control_file(name, int(base.rsplit(":", 1)[1]))
        drop_in = probes.drop_in(client, name, example, "" if control is None else control.secret)
        under_load = _under_load(isvc, base, rows, raw["primary"], load, show)
        guard_now = client.get("/tailguard/status").json().get("status", {})
    by_name = {c.name: c for c in errors}
    failures = [deadline, overload, by_name["malformed request"],
                by_name["wrong feature count"], drop_in]
    return {
        "service": {"name": name, "namespace": isvc.namespace},
        "measuredAt": datetime.datetime.now(datetime.timezone.utc).isoformat(
            timespec="seconds"),
        "runtime": {"versions": _versions(server), "machine": _machine(),
                    "models": [_model(role, p) for role, p in predictors.items()]},
        "contract": {"base": base, "endpoints": endpoints, "rowsSource": rows_source,
                     "example": _exchange(example), "v1Example": _exchange(v1),
                     "errors": [_check(c) for c in (*errors, deadline, overload)]},
        "latency": {"batching": dict(isvc.spec.get("batching", {})),
                    "sloP99Ms": isvc.slo.p99_latency_ms, "rawTables": tables,
                    "load": under_load},
        "failureChecks": [_check(c) for c in failures],
        "rollback": _rollback(isvc, tables, drop_in.measured, guard_now),
    }


def _under_load(isvc: InferenceService, base: str, rows: np.ndarray, table: list[RawRow],
                opts: TuneOptions, show: Show) -> dict[str, Any]:
    """The configured policy's latency and throughput at its rate at SLO (doubling rates)."""
    b = isvc.batching
    policy = Policy(b.max_batch_size, int(b.max_wait_ms))
    slo_ms = float(isvc.slo.p99_latency_ms)
    rates = sweep_rates(table, b.max_batch_size)
    runs = measure_policy(isvc, base, rows, rates, opts, show, f"configured {policy.label()}",
                          until=time.monotonic() + opts.budget_s)
    verdict = sweep_verdict([r.offered_rps or 0.0 for r in runs],
                            [outcome(r, slo_ms) for r in runs])
    point = point_result(policy, runs, slo_ms)
    return {**point.as_dict(), "rateAtSloRps": verdict.rate_at_slo, "sweep": verdict.reason,
            "durationS": opts.point_s, "warmupS": opts.warmup_s}


def _versions(server: dict[str, Any]) -> dict[str, str]:
    out = {"tailguard (served)": str(server.get("version", "?")),
           "Python": platform.python_version()}
    for dist in ("scikit-learn", "numpy", "scipy", "uvicorn"):
        try:
            out[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            out[dist] = "not installed"
    return out


def _machine() -> dict[str, Any]:
    cpu = "unknown"
    memory_gib = None
    try:
        info = Path("/proc/cpuinfo").read_text()
        cpu = next((line.split(":", 1)[1].strip() for line in info.splitlines()
                    if line.startswith("model name")), cpu)
        mem = Path("/proc/meminfo").read_text().split("\n", 1)[0].split()
        memory_gib = round(int(mem[1]) / 2**20, 1)
    except (OSError, IndexError, ValueError):
        pass
    usable = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return {"platform": platform.platform(), "cpu": cpu, "cores": os.cpu_count(),
            "usableCores": usable, "memoryGiB": memory_gib,
            "loadAverage1m": round(os.getloadavg()[0], 2) if hasattr(os, "getloadavg") else None}


def _model(role: str, p: Predictor) -> dict[str, Any]:
    """Class, features, classes, pickled size in bytes and, for forests, trees and nodes."""
    doc: dict[str, Any] = {"role": role, "uri": p.uri, "class": p.estimator_type,
                           "features": p.n_features,
                           "classes": None if p.classes is None else len(p.classes)}
    if p.estimator is not None:
        doc["sizeBytes"] = len(pickle.dumps(p.estimator, protocol=pickle.HIGHEST_PROTOCOL))
        trees = getattr(p.estimator, "estimators_", None)
        if isinstance(trees, list) and trees and hasattr(trees[0], "tree_"):
            doc["trees"] = len(trees)
            doc["nodes"] = int(sum(t.tree_.node_count for t in trees))
        steps = getattr(p.estimator, "steps", None)
        if steps:
            doc["steps"] = [type(s).__name__ for _, s in steps]
    return doc


def _exchange(ex: probes.Exchange) -> dict[str, Any]:
    return {"method": ex.method, "path": ex.path, "body": ex.body, "status": ex.status,
            "replyHeaders": ex.reply_headers, "reply": ex.reply,
            "elapsedMs": round(ex.elapsed_ms, 3)}


def _check(c: probes.Check) -> dict[str, Any]:
    return {"name": c.name, "expected": c.expected, "passed": c.passed, "happened": c.happened,
            "status": c.exchanges[0].status if c.exchanges else None,
            "reply": c.exchanges[0].reply if c.exchanges else None, "measured": c.measured}


def _rollback(isvc: InferenceService, tables: dict[str, list[dict[str, Any]]],
              served: dict[str, float], guard_now: dict[str, Any]) -> dict[str, Any]:
    spec = GuardSpec.from_service(isvc, local=True)
    fallback = tables.get("fallback", [])
    return {
        "fallback": {"uri": isvc.fallback.uri, "rawTable": fallback, **served},
        "byHand": {
            "local": [f"tailguard rollback {isvc.name}", f"tailguard rollforward {isvc.name}"],
            "cluster": [f"tailguard rollback {isvc.name} --cluster",
                        f"kubectl patch tgis {isvc.name} -n {isvc.namespace} --type merge "
                        "-p '{\"spec\":{\"traffic\":\"fallback\"}}'"]},
        "automatic": {"enabled": spec.automatic, "p99LatencyMs": spec.p99_latency_ms,
                      "windowSeconds": spec.window_seconds, "breachWindows": spec.breach_windows,
                      "recoverWindows": spec.recover_windows, "minSamples": spec.min_samples,
                      "maxErrorRate": spec.max_error_rate,
                      "targetQueueDepth": spec.target_queue_depth,
                      "slowFraction": SLOW_FRACTION,
                      "queueingRatio": QUEUEING_RATIO},
        "guardNow": guard_now,
    }
