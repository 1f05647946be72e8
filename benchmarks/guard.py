"""Benchmark of the SLO guard in `tailguard up`: time to roll back, requests failed by the switch,
and false rollbacks while idle and under pure overload.

Three phases, each against its own real `tailguard up` process on 127.0.0.1 (started as
``tailguard bench`` starts one, tailguard.up.child), with open-loop load from `tailguard
bench` in a separate process (evenly spaced arrivals, one record per request):

1. **rollback** (``--trials`` times): a primary declared 120 ms slow per model call
   (``delayMs``) under a 50 ms SLO, 40 req/s open loop. Measured: from the end of the first
   breached window (the guard's ``observed.windowEnd``) to the guard's ``rolledBackAt`` and to
   the first answer computed by the fallback (``X-Tailguard-Role``), against the bound
   ``breachWindows x windowSeconds + 2 s``; and requests that did not get a 200. Between trials
   ``tailguard rollforward`` re-arms the guard (after its cooldown).
2. **idle** (``--idle-seconds``): no traffic; count rollbacks.
3. **overload** (``--overload-seconds``): a primary fast for its SLO (40 ms calls, 200 ms SLO)
   of small capacity (one row per call, about 24 req/s) offered ``--overload-rate`` req/s
   (default 100, 4x); count rollbacks and the windows the guard called overload. The capacity
   is small so that the generator outruns it even on a busy 2-core machine.

    python benchmarks/guard.py --trials 5 --idle-seconds 600 --overload-seconds 600

Prints one JSON object. Bounded: every load is bounded in requests and time.
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import tempfile
import threading
import time
from datetime import datetime
from pathlib import Path
from typing import Any, Sequence

import httpx

from tailguard.up.child import TAILGUARD, UpProcess, start_up

ROOT = Path(__file__).resolve().parents[1]

SLOW = """\
apiVersion: tailguard.dev/v1alpha1
kind: InferenceService
metadata: {name: slow}
spec:
  model: {uri: "builtin://digits/random-forest?trees=50&delayMs=120"}
  fallback: {uri: builtin://digits/logistic-regression}
  slo: {p99LatencyMs: 50, windowSeconds: %(window)d, breachWindows: %(breach)d, recoverWindows: %(breach)d, minSamples: 20}
"""
BUSY = """\
apiVersion: tailguard.dev/v1alpha1
kind: InferenceService
metadata: {name: busy}
spec:
  model: {uri: "builtin://iris/random-forest?trees=20&delayMs=40"}
  fallback: {uri: builtin://iris/logistic-regression}
  batching: {maxBatchSize: 1, maxQueueSize: 8, timeoutMs: 2000}
  slo: {p99LatencyMs: 200, windowSeconds: %(window)d, breachWindows: %(breach)d, recoverWindows: %(breach)d, minSamples: 20}
  scaling: {targetQueueDepth: 2}
"""


def stamp(text: str) -> float:
    """Unix seconds of an RFC 3339 UTC time."""
    return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


class Server:
    """A `tailguard up` process on a free port, and what the benchmark reads from it."""

    def __init__(self, spec_text: str, workdir: Path) -> None:
        spec = workdir / f"spec-{time.monotonic_ns()}.yaml"
        spec.write_text(spec_text)
        self.up: UpProcess = start_up(spec, timeout_s=120)
        self.port = self.up.port
        self.base = self.up.base

    def status(self) -> dict[str, Any]:
        return httpx.get(f"{self.base}/tailguard/status", timeout=10).json()["status"]  # type: ignore[no-any-return]

    def rollbacks(self) -> float:
        text = httpx.get(f"{self.base}/metrics", timeout=10).text
        return sum(float(v) for v in re.findall(r"tailguard_rollbacks_total\{[^}]*\} ([0-9.e+]+)", text))

    def stop(self) -> None:
        self.up.stop()


class Poller:
    """Polls the status route every 0.1 s; keeps each window's status once."""

    def __init__(self, server: Server) -> None:
        self.server = server
        self.windows: dict[str, dict[str, Any]] = {}
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while not self.stop.is_set():
            status = self.server.status()
            if status.get("observed"):
                self.windows.setdefault(status["observed"]["windowEnd"], status)
            time.sleep(0.1)

    def finish(self) -> list[dict[str, Any]]:
        self.stop.set()
        self.thread.join(10)
        return [self.windows[k] for k in sorted(self.windows, key=stamp)]


CLIENT_WAIT_P99_MS: list[float | None] = []
"""Per load run: p99 of how long requests waited in the generator for a free connection (ms)."""


def load(server: Server, name: str, rate: float, seconds: float,
         workdir: Path) -> list[dict[str, Any]]:
    """Run `tailguard bench` open loop; one record per request (``sent``, ``done``, ``status``,
    ``role``)."""
    out = workdir / f"answers-{time.monotonic_ns()}.jsonl"
    done = subprocess.run([*TAILGUARD, "bench", f"{server.base}/v2/models/{name}", "--rate",
                           str(rate), "--arrivals", "uniform", "--duration", str(seconds),
                           "--warmup", "0", "--max-requests", str(int(rate * seconds) + 1),
                           "--max-lag-ms", "100000", "--json", "--records", str(out)],
                          check=True, capture_output=True, text=True, timeout=seconds + 120)
    CLIENT_WAIT_P99_MS.append(json.loads(done.stdout)["runs"][0]["client_wait_ms"].get("p99"))
    return [json.loads(line) for line in out.read_text().splitlines()]


def rollback_trials(trials: int, window_s: int, breach: int, workdir: Path) -> dict[str, Any]:
    server = Server(SLOW % {"window": window_s, "breach": breach}, workdir)
    results = []
    try:
        for trial in range(trials):
            if trial:
                subprocess.run([*TAILGUARD, "rollforward", "slow", "--port", str(server.port)],
                               check=True, capture_output=True, timeout=30)
            poller = Poller(server)
            answers = load(server, "slow", 40, breach * window_s + 6 * window_s, workdir)
            windows = poller.finish()
            status = server.status()
            first = next(w for w in windows if w["observed"]["role"] == "primary"
                         and w["observed"]["slowFraction"] > 0.01)
            breached_end = stamp(first["observed"]["windowEnd"])
            rolled = stamp(status["guard"]["rolledBackAt"])
            on_fallback = min(a["done"] for a in answers if a.get("role") == "fallback")
            after = [w for w in windows if stamp(w["observed"]["windowEnd"]) > rolled]
            results.append({
                "toRolledBackS": round(rolled - breached_end, 3),
                "toFirstFallbackAnswerS": round(on_fallback - breached_end, 3),
                "boundS": breach * window_s + 2,
                "requests": len(answers),
                "failed": sum(a["status"] != 200 for a in answers),
                "failedCodes": sorted({a["status"] for a in answers if a["status"] != 200}),
                "failedSecondsFromSwitch": [round(a["done"] - rolled, 2) for a in answers
                                            if a["status"] != 200][:10],
                "nextWindowP99Ms": after[0]["observed"]["p99Ms"] if after else None,
            })
            time.sleep(breach * window_s)  # the cooldown (recoverWindows x windowSeconds)
    finally:
        server.stop()
    return {"windowSeconds": window_s, "breachWindows": breach, "trials": results}


def no_rollback(seconds: float, rate: float, window_s: int, breach: int,
                workdir: Path) -> dict[str, Any]:
    server = Server(BUSY % {"window": window_s, "breach": breach}, workdir)
    try:
        poller = Poller(server)
        started = time.monotonic()
        answers: list[dict[str, Any]] = []
        if rate > 0:
            answers = load(server, "busy", rate, seconds, workdir)
        time.sleep(max(seconds - (time.monotonic() - started), 0))
        windows = poller.finish()
        states: dict[str, int] = {}
        for w in windows:
            states[w["guard"]["state"]] = states.get(w["guard"]["state"], 0) + 1
        codes: dict[str, int] = {}
        for a in answers:
            codes[str(a["status"])] = codes.get(str(a["status"]), 0) + 1
        return {"seconds": seconds, "rate": rate, "windowsSeen": len(windows),
                "windowStates": states, "codes": codes,
                "generatorClientWaitP99Ms": CLIENT_WAIT_P99_MS[-1] if rate > 0 else None,
                "rollbacks": server.rollbacks(),
                "activeModel": server.status()["activeModel"]}
    finally:
        server.stop()


def main(argv: Sequence[str] | None = None) -> int:
    """Run the phases and print one JSON object."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--trials", type=int, default=3)
    parser.add_argument("--window-seconds", type=int, default=2)
    parser.add_argument("--breach-windows", type=int, default=3)
    parser.add_argument("--idle-seconds", type=float, default=600)
    parser.add_argument("--overload-seconds", type=float, default=600)
    parser.add_argument("--overload-rate", type=float, default=100)
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        report: dict[str, Any] = {
            "rollback": rollback_trials(args.trials, args.window_seconds, args.breach_windows, work)}
        if args.idle_seconds > 0:
            report["idle"] = no_rollback(args.idle_seconds, 0, args.window_seconds,
                                         args.breach_windows, work)
        if args.overload_seconds > 0:
            report["overload"] = no_rollback(args.overload_seconds, args.overload_rate,
                                             args.window_seconds, args.breach_windows, work)
    print(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
