"""Rows per second for large v2 requests: JSON tensors, binary tensor data, and gRPC.

    .venv/bin/python benchmarks/binary_rows.py                    # about a minute
    .venv/bin/python benchmarks/binary_rows.py --rows 512 --rounds 6

Starts the tailguard runtime serving the reference forest (benchmarks/refmodel.py; batching on:
``maxBatchSize 64``, ``maxWaitMs 0``), pinned to ``--server-cpu`` (default 1), and sends it
requests of ``--rows`` rows (512 by default) one after another from this process, in rounds:
each round sends ``--requests`` JSON requests (``FP64`` data), as many with the same rows as
binary tensor data (``Inference-Header-Content-Length``; outputs answered in binary too), and
as many gRPC ``ModelInfer`` calls (the rows as ``raw_input_contents``), in an order that
rotates from round to round, so a drift in the machine's speed hits all alike. The bodies and
messages are encoded once, before the clock starts: what is measured is the server's side
(reading, decoding, the model, encoding) and the transfer.

Prints rows/s per encoding per round and the medians of the per-round ratios to JSON.
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

from tailguard.bench.target import encode_messages  # noqa: E402


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


def grpc_rows_per_s(port: int, message: bytes, rows: int, requests: int) -> float:
    """Make ``requests`` ModelInfer calls of ``message`` back to back on one channel; rows
    per second.

    Raises:
        grpc.RpcError: a call that fails.
    """
    import grpc

    with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        call = channel.unary_unary("/inference.GRPCInferenceService/ModelInfer")
        call(message, timeout=30)  # the connection is up before the clock starts
        started = time.perf_counter()
        for _ in range(requests):
            call(message, timeout=30)
        return rows * requests / (time.perf_counter() - started)


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
            grpc_port = json.loads((workdir / "tailguard-64.json").read_text())["grpcPort"]
            (message,) = encode_messages(x, "FP64", len(x), "ref", limit=1)

            def measure(name: str, requests: int) -> float:
                if name == "grpc":
                    return grpc_rows_per_s(grpc_port, message, args.rows, requests)
                body, headers = encoded[name]
                return rows_per_s(server.port, target.path, body, headers, args.rows, requests)

            server.wait_ready(encode_body([float(v) for v in x[0]], target.fmt))
            names = ["json", "binary", "grpc"]
            for name in names:  # warm every path
                measure(name, 3)
            results: dict[str, list[float]] = {name: [] for name in names}
            for i in range(args.rounds):
                for name in names[i % 3:] + names[:i % 3]:
                    results[name].append(measure(name, args.requests))
                print(f"round {i + 1}: " + ", ".join(
                    f"{name} {results[name][-1]:,.0f} rows/s" for name in names), flush=True)
    sizes = {name: len(body) for name, (body, _) in encoded.items()} | {"grpc": len(message)}
    print(json.dumps({
        "rows_per_request": args.rows, "body_bytes": sizes,
        **{f"{name}_rows_per_s_median": round(statistics.median(results[name]))
           for name in names},
        **{f"{name}_over_json_median": round(statistics.median(
            [a / j for a, j in zip(results[name], results["json"])]), 3)
           for name in ("binary", "grpc")},
        "round_ratios": {name: [round(a / j, 3) for a, j in zip(results[name], results["json"])]
                         for name in ("binary", "grpc")}}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
