"""The rate at SLO over each encoding: REST with JSON tensors, REST with binary tensor data, and
gRPC, one row per request, on the reference forest.

    .venv/bin/python benchmarks/protocols.py                 # about 6 minutes
    .venv/bin/python benchmarks/protocols.py --rounds 1 --rates 1000:6000:1000

Starts the tailguard runtime serving the reference forest (benchmarks/refmodel.py; batching on:
``maxBatchSize 64``, ``maxWaitMs 0``) pinned to ``--server-cpu`` (1), and runs ``tailguard
bench`` pinned to the other core: an open-loop Poisson sweep of ``--rates`` for each encoding
(``--protocol http``, ``--protocol http --binary``, ``--protocol grpc``), which stops at the
first rate whose p99 passes ``--slo-ms`` (50). Each round measures the three in an order that
rotates from round to round, so a drift in the machine's speed hits all alike; the server
serves all of them, so a sweep starts on a warm server.

Prints each sweep's rate at SLO, and per encoding the median over the rounds. A sweep whose
generator could not keep up (the bench marks the run invalid) is reported as such: on this
machine the Python gRPC client, not the server, may be the limit. Targets 127.0.0.1 only; the
server started here is stopped by its process group.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

BENCH = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH))

import run  # noqa: E402
from loadgen import encode_body  # noqa: E402
from refmodel import sample_rows, write_model  # noqa: E402

ENCODINGS = {"json": ("--protocol", "http"), "binary": ("--protocol", "http", "--binary"),
             "grpc": ("--protocol", "grpc")}


def sweep(url: str, grpc_port: int, rows: Path, encoding: str, rates: str, slo_ms: float,
          cpu: int, duration_s: float) -> dict[str, object]:
    """One ``tailguard bench`` sweep; its report's sweep and the runs' key figures."""
    argv = run.pinned([run.PYTHON, "-m", "tailguard.cli.main", "bench", url, "--rate", rates,
                       "--slo-ms", str(slo_ms), "--duration", str(duration_s), "--warmup", "1",
                       "--rows", str(rows), "--grpc-port", str(grpc_port), "--json",
                       *ENCODINGS[encoding]], cpu)
    done = subprocess.run(argv, capture_output=True, text=True, timeout=900)
    if done.returncode not in (0, 3):
        raise RuntimeError(f"bench {encoding} exited {done.returncode}: {done.stderr[-2000:]}")
    report = json.loads(done.stdout)
    return {"rate_at_slo": report["sweep"]["rateAtSlo"], "reason": report["sweep"]["reason"],
            "runs": [{"rate": r["offered_rps"], "p99_ms": r["latency_ms"].get("p99"),
                      "ok": r["ok"], "sent": r["sent"], "valid": r["valid"],
                      "generator_cpu": r["generator_cpu"]} for r in report["runs"]]}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rates", default="1000:8000:1000", help="A:B:STEP (1000:8000:1000)")
    parser.add_argument("--slo-ms", type=float, default=50.0, help="p99 SLO, ms (50)")
    parser.add_argument("--duration", type=float, default=5.0, help="seconds per rate (5)")
    parser.add_argument("--rounds", type=int, default=2, help="rounds (2)")
    parser.add_argument("--server-cpu", type=int, default=1, help="the server's core (1)")
    args = parser.parse_args(argv)
    client_cpu = 1 - args.server_cpu
    results: dict[str, list[object]] = {name: [] for name in ENCODINGS}
    names = list(ENCODINGS)
    with tempfile.TemporaryDirectory(prefix="tailguard-protocols-") as tmp:
        workdir = Path(tmp)
        model = write_model(workdir / "forest.joblib")
        rows = workdir / "rows.npy"
        np.save(rows, sample_rows(1024))
        (target,) = [t for t in run.build_targets(["tailguard"], model)
                     if t.config.startswith("batching on")]
        with run.running(target, workdir, args.server_cpu) as server:
            grpc_port = json.loads((workdir / "tailguard-64.json").read_text())["grpcPort"]
            server.wait_ready(encode_body([float(v) for v in sample_rows(1)[0]], target.fmt))
            url = f"http://127.0.0.1:{server.port}/v2/models/ref"
            for i in range(args.rounds):
                for name in names[i % 3:] + names[:i % 3]:
                    found = sweep(url, grpc_port, rows, name, args.rates, args.slo_ms,
                                  client_cpu, args.duration)
                    results[name].append(found)
                    print(f"round {i + 1} {name}: rate at SLO {found['rate_at_slo']} "
                          f"({found['reason']})", flush=True)
    summary = {name: statistics.median([float(r["rate_at_slo"] or 0)  # type: ignore[index]
                                        for r in found]) for name, found in results.items()}
    print(json.dumps({"rate_at_slo_median": summary, "sweeps": results}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
