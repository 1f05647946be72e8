"""The closed-loop load of benchmarks/run.py: the project's load generator, sending the reference model's
rows in each peer's own request format.

``N`` clients, each on its own keep-alive connection, send one request (one row of the reference
model's 20 features), wait for the whole answer, and send the next at once, for a warm-up period
and then a measured window; it stops by itself when the window ends or ``--max-requests``
requests have been sent. The generator is :mod:`tailguard.bench.loadgen` (the one behind
``tailguard bench``); this script only builds the bodies, since the peers do not all speak the
Open Inference Protocol v2 (``tailguard bench`` reads v2 metadata; mosec and the plain FastAPI
app have none), and prints the report in the keys benchmarks/run.py reads:

    python benchmarks/loadgen.py --url http://127.0.0.1:8080/v2/models/ref/infer --format v2 \\
        --clients 64 --duration 10 --warmup 3

``req_per_s``: 200 answers to requests sent in the window, per second of window; ``p50_ms`` ...
``max_ms``, ``mean_ms``: their latency, first byte written to last byte read; ``errors`` (and
``error_kinds``): the window's other outcomes (non-200 statuses, ``timeout``, ``connection``);
``client_cpu``: the generator's CPU seconds per wall second of the window; ``invalid``: the
generator's verdict (:func:`tailguard.bench.plan.judge`, empty when the run is valid).
Only loopback targets are accepted unless ``--allow-remote`` is given.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any, Sequence
from urllib.parse import urlsplit

sys.path.insert(0, str(Path(__file__).resolve().parent))

from refmodel import sample_rows  # noqa: E402

from tailguard.bench.loadgen import Target, run_load, run_sync
from tailguard.bench.plan import Bounds, ClosedLoop, LoadResult

FORMATS = ("v2", "v1", "mosec")


def encode_body(row: Sequence[float], fmt: str) -> bytes:
    """The JSON body that carries one row in protocol ``fmt``.

    ``v2``: Open Inference Protocol (tailguard, MLServer), a tensor ``x`` of shape ``[1, 20]``;
    ``v1``: KServe v1 ``{"instances": [row]}``; ``mosec``: ``{"x": row}`` (benchmarks/peers/mosec_server.py).
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


def report(result: LoadResult, clients: int, url: str, fmt: str, warmup_s: float) -> dict[str, Any]:
    """The keys benchmarks/run.py and its tables read (see the module docstring)."""
    lat = result.latency_ms
    mean = float(result.latencies_s.mean()) * 1e3 if result.latencies_s.size else float("nan")
    kinds = {**result.http_errors, **result.transport_errors}
    if result.rejected_429:
        kinds["429"] = result.rejected_429
    return {"clients": clients, "duration_s": result.window_s, "requests": result.ok,
            "req_per_s": round(result.achieved_rps, 1), "rows_per_s": round(result.achieved_rps, 1),
            "p50_ms": lat["p50"], "p90_ms": lat["p90"], "p95_ms": lat["p95"], "p99_ms": lat["p99"],
            "max_ms": lat["max"], "mean_ms": round(mean, 3), "errors": result.errors,
            "error_kinds": dict(sorted(kinds.items())),
            "client_cpu": round(result.generator_cpu, 3), "url": url, "format": fmt,
            "warmup_s": warmup_s, "sent": result.sent, "invalid": result.invalid}


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
    parser.add_argument("--cpu", type=int, default=None, help="pin this process to one core")
    parser.add_argument("--allow-remote", action="store_true", help="allow a non-loopback host")
    args = parser.parse_args(argv)
    if args.cpu is not None and hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {args.cpu})
    parts = urlsplit(args.url)
    host, port = parts.hostname or "", parts.port or 80
    bodies = tuple(encode_body(row.tolist(), args.format) for row in sample_rows(256))
    target = Target(host, port, parts.path + (f"?{parts.query}" if parts.query else ""), bodies,
                    metrics_path=None)
    try:
        result = run_sync(run_load(
            target, ClosedLoop(args.clients),
            Bounds(args.duration, args.warmup, args.max_requests, args.timeout,
                   max_connections=args.clients),
            allow_host=host if args.allow_remote else None))
    except (OSError, ValueError) as exc:
        print(f"loadgen: {exc}", file=sys.stderr)
        return 2
    print(json.dumps(report(result, args.clients, args.url, args.format, args.warmup)))
    if result.generator_cpu >= 0.9:
        print(f"loadgen: warning: client CPU {result.generator_cpu:.2f} of one core; the load "
              "generator may be the bottleneck", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
