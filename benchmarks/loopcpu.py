"""The event loop's CPU per request at 64 clients, two commits side by side, and the generator's
ceiling.

    .venv/bin/python benchmarks/loopcpu.py --before 50c3f12 --after HEAD --rounds 6

Both commits' ``runtime/tailguard_runtime`` are exported with ``git archive`` and served at
once, each pinned to core 0, with the reference model and settings of ``benchmarks/soak.py``'s
before/after comparison (its :func:`~soak.runtime`, :func:`~soak.export_before` and
:func:`~soak.loadgen`); this script and the load keep to core 1. Each round loads the two in
turn, before then after (ABAB...), for ``--seconds`` after a 2 s warm-up. Per run: the event
loop's thread's CPU time (``utime + stime`` of ``/proc/PID/task/PID/stat``: the main thread,
whose id is the process's) over the whole run, divided by the answers the server counted
meanwhile (``tailguard_requests_total``, read before and after); the model's thread is left
out, its cost per request depends on the batch sizes. Before the first round and after the
last: the generator's ceiling, 64 clients against the do-nothing server
(:func:`run.loadgen_ceiling`). Prints one JSON report. Everything is on 127.0.0.1, bounded in
time and requests, and every process started is stopped by PID.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

BENCH = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH))

import run  # noqa: E402
import soak  # noqa: E402
from refmodel import write_model  # noqa: E402

CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


def loop_cpu_s(pid: int) -> float:
    """CPU seconds of ``pid``'s main thread (the event loop's) so far."""
    fields = Path(f"/proc/{pid}/task/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS  # utime, stime: fields 14, 15


def answered(url: str) -> float:
    """Every answer the runtime at ``url`` has counted (``tailguard_requests_total``)."""
    text = httpx.get(url + "/metrics", timeout=10).text
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith("tailguard_requests_total{"))


def one_run(pid: int, url: str, seconds: float) -> dict[str, Any]:
    cpu, count = loop_cpu_s(pid), answered(url)
    report = soak.loadgen(url + "/v2/models/ref/infer", 64, seconds, 2.0)
    cpu, count = loop_cpu_s(pid) - cpu, answered(url) - count
    return {"req_per_s": report["req_per_s"], "p99_ms": report["p99_ms"],
            "loop_us_per_request": round(1e6 * cpu / max(count, 1), 1),
            "client_cpu": report["client_cpu"], "invalid": report["invalid"]}


def ceiling(workdir: Path) -> dict[str, Any] | None:
    args = argparse.Namespace(server_cpu_or_none=soak.SERVER_CPU,
                              client_cpu_or_none=soak.LOAD_CPU)
    return run.loadgen_ceiling(workdir, args)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--before", required=True, help="git ref of the runtime before")
    parser.add_argument("--after", default="HEAD", help="git ref of the runtime after")
    parser.add_argument("--rounds", type=int, default=6, help="before/after pairs (ABAB...)")
    parser.add_argument("--seconds", type=float, default=5.0, help="measured seconds per run")
    args = parser.parse_args(argv)
    os.sched_setaffinity(0, {soak.LOAD_CPU})
    report: dict[str, Any] = {"before": args.before, "after": args.after, "rounds": []}
    for side in ("before", "after"):
        report[f"{side}_commit"] = subprocess.run(
            ["git", "-C", str(soak.REPO), "rev-parse", "--short", getattr(args, side)],
            capture_output=True, text=True, check=True).stdout.strip()
    with tempfile.TemporaryDirectory(prefix="tailguard-loopcpu-") as tmp:
        workdir = Path(tmp)
        report["ceiling_start"] = ceiling(workdir)
        model = write_model(workdir / "ref.joblib")
        config = {"name": "ref", "models": [{"role": "primary", "uri": model.as_uri()}],
                  "batching": {"maxBatchSize": 64, "maxWaitMs": 0, "maxQueueSize": 1024,
                               "timeoutMs": 5000}}
        paths = {}
        for side in ("before", "after"):
            (workdir / side).mkdir()
            paths[side] = str(soak.export_before(getattr(args, side), workdir / side))
        with soak.runtime(config, workdir, paths["before"]) as (before_proc, before_url), \
                soak.runtime(config, workdir, paths["after"]) as (after_proc, after_url):
            servers = {"before": (before_proc.pid, before_url),
                       "after": (after_proc.pid, after_url)}
            for i in range(args.rounds):
                pair = {}
                for side in ("before", "after"):
                    pair[side] = one_run(*servers[side], args.seconds)
                    soak.log(f"round {i + 1} {side}: {pair[side]}")
                report["rounds"].append(pair)
                time.sleep(0.5)
        report["ceiling_end"] = ceiling(workdir)
    per_side = {side: [r[side]["loop_us_per_request"] for r in report["rounds"]]
                for side in ("before", "after")}
    ratios = [a / b for a, b in zip(per_side["after"], per_side["before"])]
    report["median_us_per_request"] = {side: statistics.median(v) for side, v in per_side.items()}
    report["round_ratios"] = [round(r, 3) for r in ratios]
    report["median_ratio"] = round(statistics.median(ratios), 3)
    print(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
