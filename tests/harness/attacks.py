"""What a hostile client sends to make the SLO guard misjudge a healthy iris model, and a runner
that sends it from a process of its own (inside the real node's network namespace, where the
Service's ClusterIP is reachable).

* :func:`tiny_deadline` -- requests whose own deadline is shorter than the SLO, in turn by
  header (``X-Request-Timeout-Ms: 0.001``), by v2 parameter (``timeout``: 1 µs), and by a header
  short of a 150 ms SLO but long enough to be answered (100 ms: its fast 200s must not dilute
  the slow answers either).
* :func:`oversized` -- one request of ``rows`` rows (``maxQueueSize``): refused 429
  ``queue_full`` whenever anything is queued, admitted (and run) only on an empty queue.

    python tests/harness/attacks.py http://10.96.0.12/v2/models/healthy deadlines \\
        --rate 10 --seconds 15

prints one JSON object, the answers counted by status: ``{"200": 61, "504": 40, ...}``. Bounded:
at most ``rate x seconds`` requests (and 2,000), sent one after the other; it stops on its own.
"""

from __future__ import annotations

import argparse
import json
import sys
import time

import httpx

ROW = [5.1, 3.5, 1.4, 0.2]
"""One iris row (4 features)."""
JSON = {"Content-Type": "application/json"}


def tiny_deadline(n: int) -> tuple[bytes, dict[str, str]]:
    """Request number ``n`` (from 1) of the tiny-deadline attack: its body and headers."""
    doc: dict[str, object] = {"inputs": [{"name": "input-0", "shape": [1, 4],
                                          "datatype": "FP64", "data": [ROW]}]}
    headers = dict(JSON)
    if n % 3 == 0:
        headers["X-Request-Timeout-Ms"] = "0.001"
    elif n % 3 == 1:
        doc["parameters"] = {"timeout": 1}
    else:
        headers["X-Request-Timeout-Ms"] = "100"
    return json.dumps(doc).encode(), headers


def oversized(rows: int) -> tuple[bytes, dict[str, str]]:
    """One request of ``rows`` iris rows: its body and headers."""
    doc = {"inputs": [{"name": "input-0", "shape": [rows, 4], "datatype": "FP64",
                       "data": [ROW] * rows}]}
    return json.dumps(doc).encode(), dict(JSON)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("model_url", help="the model's v2 URL, e.g. http://IP/v2/models/NAME")
    parser.add_argument("attack", choices=("deadlines", "oversized"))
    parser.add_argument("--rate", type=float, required=True, help="requests per second")
    parser.add_argument("--seconds", type=float, required=True)
    parser.add_argument("--rows", type=int, default=256, help="rows of an oversized request")
    args = parser.parse_args(argv)
    url = f"{args.model_url.rstrip('/')}/infer"
    codes: dict[str, int] = {}
    interval, end = 1.0 / args.rate, time.monotonic() + args.seconds
    with httpx.Client(timeout=10) as client:
        for n in range(1, min(int(args.rate * args.seconds), 2000) + 1):
            if time.monotonic() >= end:
                break
            body, headers = tiny_deadline(n) if args.attack == "deadlines" else oversized(
                args.rows)
            try:
                code = str(client.post(url, content=body, headers=headers).status_code)
            except httpx.HTTPError as exc:
                code = type(exc).__name__
            codes[code] = codes.get(code, 0) + 1
            time.sleep(interval)
    print(json.dumps(codes))
    return 0


if __name__ == "__main__":
    sys.exit(main())
