"""Rows per second for large v2 requests: JSON tensors against binary tensor data.

    .venv/bin/python benchmarks/binary_rows.py                    # about a minute
    .venv/bin/python benchmarks/binary_rows.py --rows 512 --rounds 6

Starts the tailguard runtime serving the reference forest (benchmarks/refmodel.py; batching on:
``maxBatchSize 64``, ``maxWaitMs 0``), pinned to ``--server-cpu`` (default 1), and sends it
requests of ``--rows`` rows (512 by default) one after another from this process, in rounds:
each round sends ``--requests`` JSON requests (``FP64`` data) and as many with the same rows as
binary tensor data (``Inference-Header-Content-Length``; outputs answered in binary too), in an
order that alternates from round to round, so a drift in the machine's speed hits both alike.
The bodies are encoded once, before the clock starts: what is measured is the server's side
(reading, decoding, the model, encoding) and the transfer.

Prints rows/s per encoding per round and the median of the per-round ratios (binary over JSON).
Targets 127.0.0.1 only; the server started here is stopped by its process group.
"""

from __future__ import annotations

import argparse
import http.client
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

BENCH = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH))

import run  # noqa: E402
from loadgen import encode_body  # noqa: E402
from refmodel import sample_rows, write_model  # noqa: E402


def bodies(x: np.ndarray) -> dict[str, tuple[bytes, dict[str, str]]]:
    """The same rows as a JSON request and as a binary one: ``encoding -> (body, headers)``."""
    tensor = {"name": "input-0", "shape": list(x.shape), "datatype": "FP64"}
    as_json = json.dumps({"inputs": [{**tensor, "data": x.ravel().tolist()}]}).encode()
    raw = np.ascontiguousarray(x, dtype="<f8").tobytes()
    header = json.dumps({"inputs": [{**tensor, "parameters": {"binary_data_size": len(raw)}}],
                         "parameters": {"binary_data_output": True}}).encode()
    return {"json": (as_json, {"Content-Type": "application/json"}),
            "binary": (header + raw, {"Content-Type": "application/octet-stream",
                                      "Inference-Header-Content-Length": str(len(header))})}


def rows_per_s(port: int, path: str, body: bytes, headers: dict[str, str], rows: int,
               requests: int) -> float:
    """Send ``requests`` copies of ``body`` back to back on one connection; rows per second.

    Raises:
        RuntimeError: an answer other than 200.
    """
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    try:
        started = time.perf_counter()
        for _ in range(requests):
            conn.request("POST", path, body, headers)
            answer = conn.getresponse()
            data = answer.read()
            if answer.status != 200:
                raise RuntimeError(f"HTTP {answer.status}: {data[:300]!r}")
        return rows * requests / (time.perf_counter() - started)
    finally:
        conn.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=512, help="rows per request (512)")
    parser.add_argument("--requests", type=int, default=40, help="requests per encoding a round")
    parser.add_argument("--rounds", type=int, default=6, help="rounds (6)")
    parser.add_argument("--server-cpu", type=int, default=1, help="the server's core (1)")
    args = parser.parse_args(argv)
    x = sample_rows(args.rows)
    encoded = bodies(x)
    with tempfile.TemporaryDirectory(prefix="tailguard-binary-") as tmp:
        workdir = Path(tmp)
        model = write_model(workdir / "forest.joblib")
        (target,) = [t for t in run.build_targets(["tailguard"], model)
                      if t.config.startswith("batching on")]
        with run.running(target, workdir, args.server_cpu) as server:
            server.wait_ready(encode_body([float(v) for v in x[0]], target.fmt))
            for body, headers in encoded.values():  # warm both paths
                rows_per_s(server.port, target.path, body, headers, args.rows, 3)
            results: dict[str, list[float]] = {"json": [], "binary": []}
            for i in range(args.rounds):
                order = ["json", "binary"] if i % 2 == 0 else ["binary", "json"]
                for name in order:
                    body, headers = encoded[name]
                    results[name].append(rows_per_s(server.port, target.path, body, headers,
                                                    args.rows, args.requests))
                print(f"round {i + 1}: json {results['json'][-1]:,.0f} rows/s, "
                      f"binary {results['binary'][-1]:,.0f} rows/s", flush=True)
    ratios = [b / j for b, j in zip(results["binary"], results["json"])]
    sizes = {name: len(body) for name, (body, _) in encoded.items()}
    print(json.dumps({"rows_per_request": args.rows, "body_bytes": sizes,
                      "json_rows_per_s_median": round(statistics.median(results["json"])),
                      "binary_rows_per_s_median": round(statistics.median(results["binary"])),
                      "median_ratio": round(statistics.median(ratios), 3),
                      "round_ratios": [round(r, 3) for r in ratios]}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
