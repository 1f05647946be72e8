"""Rate at SLO beside a do-nothing server: what tailguard's own path costs per request.

    .venv/bin/python benchmarks/request_cost.py                      # 3-5 minutes
    .venv/bin/python benchmarks/request_cost.py --rates 1000,2000,4000 --duration 4

Starts three servers, each pinned to the server core (``--server-cpu``, default 1): the
do-nothing asyncio server (benchmarks/peers/null_server.py), the tailguard runtime serving the
reference forest (benchmarks/refmodel.py; ``maxBatchSize 64``, ``maxWaitMs 0``) and mosec
(benchmarks/peers/mosec_server.py, when ``bash benchmarks/setup_peers.sh`` has made its venv).
This process, which generates the load, keeps to the client core (``--client-cpu``, default 0).

For each rate of ``--rates`` in turn, every server still in the race gets one open-loop run
(Poisson arrivals, one row per request, latency from each request's scheduled send time; the
project's generator, :func:`tailguard.bench.loadgen.run_load`): the servers take turns at every
rate, in an order that rotates from rate to rate, so a drift in the machine's speed hits them
alike. A run *holds* when every request is answered 200 and the p99 is within ``--slo-ms``
(default 50 ms); a server's **rate at SLO** is the highest rate it held before the first it did
not, and it leaves the race at that first failure (one that held every rate tried is reported
as "at least" its last). A failed run is tried once more at once (``--retries``): on this
shared VM a neighbour's burst can break one 4 s window, and one such window should not end a
server's race; the table shows the run that held, else the last. A run the generator itself could not keep
to (p99 schedule lag over 1 ms, or over 90% of its core) is marked invalid: it neither holds
nor fails, and no server goes higher afterwards, since the generator is then the limit.

First, ``--lone`` requests go to tailguard one at a time, beside the raw model call's time
(:func:`lone_requests`: the issue's bound, a lone request at most 1 ms over the raw call at
p50). Then it prints a Markdown table of every run, then each server's rate at SLO and tailguard's as a
share of the do-nothing server's (issue 33's measure: at least 40%), and writes the whole as
JSON to ``benchmarks/results/request-cost-*.json``. Everything listens on and targets
127.0.0.1; every run is bounded in time and requests; every server started here is stopped by
its process group (:class:`run.Server`).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import sys
import tempfile
from pathlib import Path
from typing import Any

BENCH = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH))

import run  # noqa: E402
from loadgen import encode_body  # noqa: E402
from refmodel import sample_rows, write_model  # noqa: E402

from tailguard.bench.loadgen import Target as LoadTarget  # noqa: E402
from tailguard.bench.loadgen import run_load, run_sync  # noqa: E402
from tailguard.bench.plan import Bounds, OpenLoop  # noqa: E402

DEFAULT_RATES = "1000,2000,3000,4000,4500,5000,5500,6000,7000,8000,10000,12000,14000,16000,20000"


def null_target() -> run.Target:
    """The do-nothing server as a :class:`run.Target` (it answers any POST at once)."""
    return run.Target("null", "answers at once", "v2", "/v2/models/null/infer",
                      lambda port, wd: [run.PYTHON, str(BENCH / "peers" / "null_server.py"),
                                        "--port", str(port)])


def targets(selected: list[str], model: Path) -> list[run.Target]:
    """The servers to race: the do-nothing one, tailguard with batching on (64 rows, 0 ms) and
    mosec at its best setting of benchmarks/run.py, those of ``selected`` that exist."""
    out = [null_target()] if "null" in selected else []
    for target in run.build_targets([s for s in selected if s != "null"], model):
        if target.name == "mosec" or target.config.startswith("batching on"):
            out.append(target)
    return out


def open_loop(server: run.Server, rows: list[list[float]], rate: float,
              args: argparse.Namespace) -> dict[str, Any]:
    """One open-loop run of ``rate`` req/s against ``server``; returns its summary: ``p50_ms``,
    ``p99_ms``, ``ok``, ``errors`` (by kind), ``achieved_rps``, ``valid`` and ``invalid``
    (the generator's own reasons), and ``holds``."""
    target = server.target
    bodies = tuple(encode_body(row, target.fmt) for row in rows)
    load = LoadTarget("127.0.0.1", server.port, target.path, bodies, metrics_path=None)
    result = run_sync(run_load(load, OpenLoop(rate, seed=int(rate)), Bounds(
        duration_s=args.duration, warmup_s=args.warmup, timeout_s=5.0,
        max_requests=int(rate * (args.duration + args.warmup)) + 1)))
    errors = {**result.http_errors, **result.transport_errors}
    if result.rejected_429:
        errors["429"] = result.rejected_429
    p99 = result.latency_ms["p99"]
    valid = not result.invalid
    return {"server": target.name, "rate": rate, "ok": result.ok, "errors": errors,
            "achieved_rps": round(result.achieved_rps, 1), "p50_ms": result.latency_ms["p50"],
            "p99_ms": p99, "valid": valid, "invalid": list(result.invalid),
            "holds": valid and not errors and p99 is not None and p99 <= args.slo_ms}


def race(servers: list[run.Server], rows: list[list[float]], rates: list[float],
         args: argparse.Namespace) -> list[dict[str, Any]]:
    """Every rate in turn against every server still in the race (order rotating per rate);
    returns one :func:`open_loop` summary per run."""
    runs: list[dict[str, Any]] = []
    alive = list(servers)
    for i, rate in enumerate(rates):
        if not alive:
            break
        order = alive[i % len(alive):] + alive[:i % len(alive)]
        generator_limited = False
        for server in order:
            for attempt in range(1 + args.retries):
                run.wait_for_quiet(server.proc.pid, args.wait_quiet)
                point = open_loop(server, rows, rate, args)
                runs.append(point)
                p99 = "-" if point["p99_ms"] is None else f"{point['p99_ms']:.1f} ms"
                verdict = ("holds" if point["holds"] else
                           f"invalid ({'; '.join(point['invalid'])})" if not point["valid"] else
                           "fails" + (", once more" if attempt < args.retries else ""))
                run.log(f"{rate:>6,.0f} req/s  {server.target.name:<9} p99 {p99:>9}  "
                        f"errors {sum(point['errors'].values())}  {verdict}")
                if point["holds"] or not point["valid"]:
                    break
            if not point["valid"]:
                generator_limited = True
            elif not point["holds"]:
                alive.remove(server)
        if generator_limited:
            run.log("the generator could not keep to this rate; no server goes higher")
            break
    return runs


def rate_at_slo(runs: list[dict[str, Any]], name: str) -> tuple[float, bool]:
    """``(rate, found)``: the highest rate ``name`` held before its first failing run (0: it
    held none), and whether it failed at all; ``found`` False means it held every valid rate
    tried, so ``rate`` is only a lower bound."""
    held: dict[float, bool] = {}
    for point in runs:  # a rate held when any of its runs held (a retry after a failure)
        if point["server"] == name and point["valid"]:
            held[point["rate"]] = held.get(point["rate"], False) or point["holds"]
    best = 0.0
    for rate in sorted(held):
        if not held[rate]:
            return best, True
        best = rate
    return best, False


def markdown(runs: list[dict[str, Any]], names: list[str], slo_ms: float) -> str:
    """The runs as a table (one row per rate, one p99 column per server) and the summary."""
    rates = sorted({p["rate"] for p in runs})
    lines = ["| offered req/s | " + " | ".join(f"{n} p99 (ms)" for n in names) + " |",
             "|---:|" + "---:|" * len(names)]
    for rate in rates:
        cells = []
        for name in names:
            tries = [p for p in runs if p["rate"] == rate and p["server"] == name]
            if not tries:
                cells.append("")
                continue
            point = next((p for p in tries if p["holds"]), tries[-1])
            p99 = "-" if point["p99_ms"] is None else f"{point['p99_ms']:.1f}"
            errs = sum(point["errors"].values())
            note = "" if point["holds"] else " (invalid)" if not point["valid"] else \
                f" ({errs} errors)" if errs else " (over)"
            cells.append(p99 + note)
        lines.append(f"| {rate:,.0f} | " + " | ".join(cells) + " |")
    lines += ["", f"Rate at SLO (p99 <= {slo_ms:g} ms, every request answered 200):", ""]
    null, null_found = rate_at_slo(runs, "null")
    for name in names:
        got, found = rate_at_slo(runs, name)
        line = f"- {name}: {'' if found else 'at least '}{got:,.0f} req/s"
        if null and name != "null":
            line += (f" ({got / null:.0%} of the do-nothing server's" +
                     ("" if null_found else ", at most: it held every rate tried") + ")")
        lines.append(line)
    return "\n".join(lines)


def lone_requests(server: run.Server, model: Path, rows: list[list[float]], count: int
                  ) -> dict[str, float]:
    """Issue 33's third bound: ``count`` requests to ``server``, one at a time on one
    kept-alive connection (each alone in the server, so each is its own batch), against the
    raw model call (the runtime's own :func:`~tailguard_runtime.models.load_model` predictor,
    one row, in this process). Returns the p50 of each in ms and their difference: the cost of
    the HTTP round trip and of the runtime's path for a request that has no batch-mates, which
    must not include a batching wait."""
    import http.client
    import statistics
    import time

    import numpy as np

    from tailguard_runtime.models import load_model

    predictor = load_model(model.as_uri())
    raw: list[float] = []
    for i in range(count):
        x = np.asarray([rows[i % len(rows)]])
        start = time.perf_counter()
        predictor.run(x)
        raw.append(time.perf_counter() - start)
    target = server.target
    bodies = [encode_body(row, target.fmt) for row in rows]
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=10)
    served: list[float] = []
    try:
        for i in range(count):
            start = time.perf_counter()
            conn.request("POST", target.path, bodies[i % len(bodies)],
                         {"Content-Type": "application/json"})
            answer = conn.getresponse()
            answer.read()
            served.append(time.perf_counter() - start)
            if answer.status != 200:
                raise RuntimeError(f"a lone request got {answer.status}")
    finally:
        conn.close()
    raw_p50 = statistics.median(raw) * 1000
    served_p50 = statistics.median(served) * 1000
    return {"requests": count, "raw_model_p50_ms": round(raw_p50, 3),
            "lone_request_p50_ms": round(served_p50, 3),
            "over_raw_ms": round(served_p50 - raw_p50, 3)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rates", default=DEFAULT_RATES, help="offered req/s, ascending")
    parser.add_argument("--targets", default="null,tailguard,mosec")
    parser.add_argument("--duration", type=float, default=5.0, help="measured s per run")
    parser.add_argument("--warmup", type=float, default=1.5, help="unmeasured s first")
    parser.add_argument("--slo-ms", type=float, default=50.0)
    parser.add_argument("--retries", type=int, default=1,
                        help="runs more at a rate a server failed before it leaves the race")
    parser.add_argument("--server-cpu", type=int, default=1)
    parser.add_argument("--client-cpu", type=int, default=0)
    parser.add_argument("--lone", type=int, default=2000,
                        help="requests sent one at a time to tailguard first (0: none)")
    parser.add_argument("--wait-quiet", type=float, default=10.0,
                        help="before each run, wait up to this many s for other processes to go quiet")
    args = parser.parse_args(argv)
    rates = sorted(float(r) for r in args.rates.split(","))
    os.sched_setaffinity(0, {args.client_cpu})
    with tempfile.TemporaryDirectory(prefix="tailguard-cost-") as tmp:
        workdir = Path(tmp)
        model = workdir / "model.joblib"
        write_model(model)
        rows = [[float(v) for v in row] for row in sample_rows(256)]
        chosen = targets(args.targets.split(","), model)
        servers: list[run.Server] = []
        try:
            for target in chosen:
                server = run.Server(target, workdir, args.server_cpu)
                servers.append(server)
                server.wait_ready(encode_body(rows[0], target.fmt))
                run.log(f"{target.name} ready on port {server.port}")
            lone: dict[str, float] | None = None
            for server in servers:
                if args.lone and server.target.name == "tailguard":
                    lone = lone_requests(server, model, rows, args.lone)
                    run.log(f"lone requests: p50 {lone['lone_request_p50_ms']} ms, the raw "
                            f"model call's {lone['raw_model_p50_ms']} ms: "
                            f"{lone['over_raw_ms']} ms over it (issue 33: at most 1 ms)")
            runs = race(servers, rows, rates, args)
        finally:
            for server in servers:
                server.stop()
    names = [t.name for t in chosen]
    table = markdown(runs, names, args.slo_ms)
    print(table)
    run.RESULTS.mkdir(exist_ok=True)
    stamp = dt.datetime.now(dt.timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    out = run.RESULTS / f"request-cost-{stamp}.json"
    out.write_text(json.dumps({"machine": run.machine_info(), "args": vars(args), "runs": runs,
                               "lone": lone,
                               "rate_at_slo": {n: rate_at_slo(runs, n)[0] for n in names}},
                              indent=2))
    run.log(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
