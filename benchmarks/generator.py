"""How much the load generator itself can offer from one core, open loop, and still be valid.

Starts benchmarks/peers/null_server.py (answers at once) pinned to the server core, then runs
``tailguard bench URL --rate R`` pinned to the client core for each rate, and prints a Markdown
table: offered and achieved req/s, latency, the generator's p99 schedule lag and CPU, whether
the run was valid (p99 lag <= 1 ms, CPU <= 90%), and how much CPU other processes used meanwhile
(the machine may be shared: a busy neighbour makes the generator late, and the run invalid).

    .venv/bin/python benchmarks/generator.py --rates 5000,10000,15000,20000 --duration 10

Bounded: each run sends at most rate x (warm-up + duration) requests; every process started
here listens on or targets 127.0.0.1 and is stopped by PID.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

BENCH = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH))

from run import ForeignLoad, pinned  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rates", default="5000,10000,15000,20000")
    parser.add_argument("--duration", type=float, default=10.0)
    parser.add_argument("--warmup", type=float, default=2.0)
    parser.add_argument("--server-cpu", type=int, default=0)
    parser.add_argument("--client-cpu", type=int, default=1)
    args = parser.parse_args(argv)
    server = subprocess.Popen(pinned([sys.executable, str(BENCH / "peers" / "null_server.py"),
                                      "--port", "0"], args.server_cpu),
                              stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True)
    rows: list[dict[str, Any]] = []
    try:
        assert server.stderr is not None
        port = int(re.findall(r":(\d+)", server.stderr.readline())[-1])
        for rate in [float(r) for r in args.rates.split(",")]:
            foreign = ForeignLoad(server.pid)
            load1 = os.getloadavg()[0]
            done = subprocess.run(pinned(
                [sys.executable, "-m", "tailguard.cli.main", "bench",
                 f"http://127.0.0.1:{port}/v2/models/null", "--rate", f"{rate:g}",
                 "--duration", str(args.duration), "--warmup", str(args.warmup), "--json",
                 "--max-requests", str(int(rate * (args.duration + args.warmup)) + 1)],
                args.client_cpu), capture_output=True, text=True,
                timeout=args.duration + args.warmup + 120)
            run = json.loads(done.stdout)["runs"][0]
            rows.append({**run, "foreign_cores": foreign.cores(), "load1": load1})
            print(f"[generator] {rate:g} req/s: valid={run['valid']} lag p99="
                  f"{run['schedule_lag_ms']['p99']} ms cpu={run['generator_cpu']}",
                  file=sys.stderr, flush=True)
    finally:
        server.terminate()
        server.wait(10)
    print("| offered req/s | achieved req/s | p50 ms | p99 ms | max ms | schedule lag p99 ms "
          "| generator CPU | valid | other load (cores) | load average |")
    print("|---:|---:|---:|---:|---:|---:|---:|---|---:|---:|")
    for r in rows:
        lat = r["latency_ms"]
        print(f"| {r['offered_rps']:,.0f} | {r['achieved_rps']:,.0f} | {lat['p50']:.2f} | "
              f"{lat['p99']:.2f} | {lat['max']:.2f} | {r['schedule_lag_ms']['p99']:.2f} | "
              f"{100 * r['generator_cpu']:.0f}% | {'yes' if r['valid'] else 'no'} | "
              f"{r['foreign_cores']} | {r['load1']:.1f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
