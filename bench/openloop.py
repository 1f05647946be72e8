"""A bounded open-loop load generator: requests leave on a fixed schedule, whatever the answers.

Request ``i`` is sent at ``start + i / rate`` seconds (the schedule never waits for answers, as
real users do not), each carrying one row of a scikit-learn bundled dataset over the Open
Inference Protocol v2, asking for ``predict_proba`` so that the answer shows which model
computed it. It stops by itself: after ``--duration`` seconds of schedule, or ``--max-requests``
requests, and at the latest after ``--hard-timeout`` seconds; at most ``--max-in-flight``
requests wait for answers at once (a request that would exceed it is counted as ``skipped``, not
sent). Only loopback targets are accepted.

    python bench/openloop.py --url http://127.0.0.1:8080/v2/models/digits/infer \\
        --dataset digits --rate 40 --duration 10 --out /tmp/answers.jsonl

Prints one JSON summary on stdout: requests sent, answers by status code, client-side latency
percentiles (ms), skipped. With ``--out``, one JSON line per request: ``i``, ``sent`` and
``done`` (Unix seconds), ``status``, ``role`` (the ``X-Tailguard-Role`` header when the server
sends one) and ``proba`` (the answer's first ``predict_proba`` row).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from typing import Any, Sequence
from urllib.parse import urlsplit

LOOPBACK_HOSTS = ("127.0.0.1", "localhost", "::1")


def _rows(dataset: str) -> list[list[float]]:
    from tailguard_runtime.models import load_dataset

    x, _ = load_dataset(dataset)
    return [[float(v) for v in row] for row in x]


async def run(url: str, rows: list[list[float]], *, rate: float, duration_s: float,
              max_requests: int, max_in_flight: int, timeout_s: float,
              hard_timeout_s: float) -> tuple[list[dict[str, Any]], int]:
    """Send the schedule; return one record per sent request and the number skipped."""
    import httpx

    n = min(max_requests, int(rate * duration_s))
    records: list[dict[str, Any]] = []
    skipped = 0
    in_flight: set[asyncio.Task[None]] = set()
    limits = httpx.Limits(max_connections=max_in_flight, max_keepalive_connections=max_in_flight)
    async with httpx.AsyncClient(timeout=timeout_s, limits=limits) as client:

        async def send(i: int) -> None:
            row = rows[i % len(rows)]
            body = {"inputs": [{"name": "x", "shape": [1, len(row)], "datatype": "FP64",
                                "data": row}], "outputs": [{"name": "predict_proba"}]}
            record: dict[str, Any] = {"i": i, "sent": time.time(), "row": i % len(rows)}
            try:
                reply = await client.post(url, json=body)
                record["status"] = reply.status_code
                record["role"] = reply.headers.get("x-tailguard-role")
                if reply.status_code == 200:
                    record["proba"] = reply.json()["outputs"][0]["data"]
            except httpx.HTTPError as exc:
                record["status"] = 0
                record["error"] = type(exc).__name__
            record["done"] = time.time()
            records.append(record)

        start = time.monotonic()
        end = start + hard_timeout_s
        for i in range(n):
            at = start + i / rate
            now = time.monotonic()
            if at > now:
                await asyncio.sleep(at - now)
            if time.monotonic() > end:
                break
            if len(in_flight) >= max_in_flight:
                skipped += 1
                continue
            task = asyncio.get_running_loop().create_task(send(i))
            in_flight.add(task)
            task.add_done_callback(in_flight.discard)
        if in_flight:
            await asyncio.wait(in_flight, timeout=max(end - time.monotonic(), 0.1))
        for task in in_flight:
            task.cancel()
    return records, skipped


def summarize(records: list[dict[str, Any]], skipped: int) -> dict[str, Any]:
    """Counts by status code, and client-side latency percentiles (ms) of 200 answers."""
    codes: dict[str, int] = {}
    for r in records:
        codes[str(r["status"])] = codes.get(str(r["status"]), 0) + 1
    lat = sorted((r["done"] - r["sent"]) * 1000.0 for r in records if r["status"] == 200)

    def pct(p: float) -> float | None:
        return round(lat[min(len(lat) - 1, int(p * len(lat)))], 2) if lat else None

    return {"sent": len(records), "skipped": skipped, "codes": codes,
            "p50Ms": pct(0.50), "p99Ms": pct(0.99)}


def main(argv: Sequence[str] | None = None) -> int:
    """Parse arguments, run, print the summary; exit code 2 for a non-loopback URL."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--url", required=True)
    parser.add_argument("--dataset", default="digits",
                        choices=("iris", "wine", "breast_cancer", "digits"))
    parser.add_argument("--rate", type=float, required=True, help="requests per second")
    parser.add_argument("--duration", type=float, required=True, help="seconds of schedule")
    parser.add_argument("--max-requests", type=int, default=100_000)
    parser.add_argument("--max-in-flight", type=int, default=256)
    parser.add_argument("--timeout", type=float, default=10.0, help="per request, seconds")
    parser.add_argument("--hard-timeout", type=float, default=None,
                        help="stop after this many seconds (default: duration + 30)")
    parser.add_argument("--out", default=None, help="write one JSON line per request here")
    args = parser.parse_args(argv)
    if urlsplit(args.url).hostname not in LOOPBACK_HOSTS:
        print(f"openloop: {args.url}: only loopback targets are allowed", file=sys.stderr)
        return 2
    records, skipped = asyncio.run(run(
        args.url, _rows(args.dataset), rate=args.rate, duration_s=args.duration,
        max_requests=args.max_requests, max_in_flight=args.max_in_flight,
        timeout_s=args.timeout, hard_timeout_s=args.hard_timeout or args.duration + 30.0))
    if args.out:
        with open(args.out, "w", encoding="utf-8") as fh:
            for r in sorted(records, key=lambda r: r["i"]):
                fh.write(json.dumps(r) + "\n")
    print(json.dumps(summarize(records, skipped)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
