"""Watching the SLO guard of a real `tailguard up` from a test: its status every window, bounded
open-loop load from `tailguard bench`, and its rollback counter."""

from __future__ import annotations

import contextlib
import json
import re
import subprocess
import threading
import time
from datetime import datetime
from pathlib import Path
from typing import Any, Iterator

import httpx

from harness.up import ROOT, TAILGUARD, Up, start_up


@contextlib.contextmanager
def serving(folder: Path, name: str, spec_text: str) -> Iterator[Up]:
    """`tailguard up` of the InferenceService ``spec_text`` (written to ``folder/NAME.yaml``),
    stopped with Ctrl-C afterwards, which must drain cleanly (exit 0)."""
    spec = folder / f"{name}.yaml"
    spec.write_text(spec_text)
    server = start_up(spec)
    try:
        yield server
    finally:
        assert server.stop() == 0


def forest_spec(name: str, *, delay_ms: int = 0) -> str:
    """An InferenceService of an iris random forest (20 trees; ``delay_ms`` added to every model
    call, ``delayMs``) under a 150 ms p99 SLO: windows of 1 s, rolled back after 2 breached
    ones (``minSamples`` 10), a logistic-regression fallback."""
    delay = f"&delayMs={delay_ms}" if delay_ms else ""
    return f"""\
apiVersion: tailguard.dev/v1alpha1
kind: InferenceService
metadata: {{name: {name}}}
spec:
  model: {{uri: "builtin://iris/random-forest?trees=20{delay}"}}
  fallback: {{uri: builtin://iris/logistic-regression}}
  batching: {{timeoutMs: 3000}}
  slo: {{p99LatencyMs: 150, windowSeconds: 1, breachWindows: 2, recoverWindows: 2, minSamples: 10}}
"""


def busy_spec(*, min_samples: int = 10, scaling: str = "targetQueueDepth: 2") -> str:
    """The InferenceService ``busy``: a primary fast for its SLO (40 ms calls against 200 ms) of
    small capacity (one row per call: about 24 requests/s a replica, a queue of 8 rows), so
    that a generator on a busy 2-core machine outruns it; ``scaling`` is its ``spec.scaling``
    (flow-style YAML without the braces)."""
    return f"""\
apiVersion: tailguard.dev/v1alpha1
kind: InferenceService
metadata: {{name: busy}}
spec:
  model: {{uri: "builtin://iris/random-forest?trees=20&delayMs=40"}}
  fallback: {{uri: builtin://iris/logistic-regression}}
  batching: {{maxBatchSize: 1, maxQueueSize: 8, timeoutMs: 2000}}
  slo: {{p99LatencyMs: 200, windowSeconds: 1, breachWindows: 2, recoverWindows: 2, minSamples: {min_samples}}}
  scaling: {{{scaling}}}
"""


def stamp(text: str) -> float:
    return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


class StatusPoller:
    """Reads GET /tailguard/status every 0.1 s in a thread; keeps one entry per window."""

    def __init__(self, up: Up) -> None:
        self.url = f"{up.base}/tailguard/status"
        self.windows: dict[str, dict[str, Any]] = {}
        self.last: dict[str, Any] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._poll, daemon=True)

    def __enter__(self) -> "StatusPoller":
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(10)

    def _poll(self) -> None:
        with httpx.Client(timeout=10) as http:
            while not self._stop.is_set():
                status = http.get(self.url).json()["status"]
                self.last = status
                observed = status.get("observed")
                if observed:
                    self.windows.setdefault(observed["windowEnd"], status)
                time.sleep(0.1)

    def ordered(self) -> list[dict[str, Any]]:
        return [self.windows[k] for k in sorted(self.windows, key=stamp)]


def assert_rolled_back_on_streak(windows: list[dict[str, Any]], status: dict[str, Any], *,
                                 breach_windows: int = 2, window_s: float = 1.0,
                                 min_samples: int = 10) -> float:
    """Check that the guard rolled back on an unbroken streak and return the seconds from the end
    of the first window it judged breached to ``status.guard.rolledBackAt``.

    ``windows``: :meth:`StatusPoller.ordered`; ``status``: the last status (rolled back). From the
    first primary window in state ``breach`` on, every primary window must be ``breach`` (judged
    breached, or stalled: too few requests finished while work waited, which holds the streak)
    or ``rolledBack``; the delay may be at most ``breach_windows`` windows plus one per stalled
    window, plus 2 s (the promise in docs/guard.md: ``breachWindows x windowSeconds + 2 s``). Windows the guard could not
    judge before the first breach (an attacker's admitted request running first) are not part
    of the streak: the guard has not yet seen the model break the SLO."""
    primary = [w for w in windows if w["observed"]["role"] == "primary"]
    trace = [(w["observed"]["windowEnd"], w["observed"]["judged"], w["observed"]["slowFraction"],
              w["guard"]["state"]) for w in primary]
    start = next((i for i, w in enumerate(primary)
                  if w["guard"]["state"] in ("breach", "rolledBack")), None)
    assert start is not None, trace
    streak = primary[start:]
    assert all(w["guard"]["state"] in ("breach", "rolledBack") for w in streak), trace
    stalled = sum(1 for w in streak if w["observed"]["judged"] < min_samples)
    delay = stamp(status["guard"]["rolledBackAt"]) - stamp(streak[0]["observed"]["windowEnd"])
    assert 0 <= delay <= (breach_windows + stalled) * window_s + 2.0, (delay, trace)
    return delay


ATTACK_VERDICTS = {"deadline": "refused for their deadline or timed out",
                   "errors": "error rate"}
"""What the guard's reason says (``tailguard.guard.policy``) when it counts a window's
requests refused for their deadline or expired, and when it counts its errors."""


def assert_the_attack_was_left_out(judged: list[dict[str, Any]], kind: str) -> None:
    """Check that the guard judged ``judged`` (:meth:`StatusPoller.ordered`'s windows with
    enough samples) on the model alone, beside an attack whose requests would be a breach of
    ``kind`` (a key of :data:`ATTACK_VERDICTS`) if they were counted: no window's reason names
    that breach, and at least half of the windows are ``ok``. The others may be a latency
    breach or an overload by queueing: a shared machine that stalls the server for a moment
    makes a window of slow answers, which the guard rightly judges (a CI run beside another
    suite saw one)."""
    said = [(w["guard"]["state"], w["guard"].get("lastDecisionReason", "")) for w in judged]
    assert not [reason for _, reason in said if ATTACK_VERDICTS[kind] in reason], said
    assert sum(state == "ok" for state, _ in said) >= len(said) / 2, said


def load(up: Up, name: str, tmp_path: Path, *, rate: float, duration_s: float,
         extra: tuple[str, ...] = ()) -> list[dict[str, Any]]:
    """Run `tailguard bench` open loop to completion (no warm-up: the whole schedule is measured,
    uniform arrivals; ``extra``: more options, such as ``--rows``); return one record per
    request. Its schedule lag on this shared machine is not under test here, so the run's
    validity is not asserted."""
    out = tmp_path / f"answers-{time.monotonic_ns()}.jsonl"
    done = subprocess.run([*TAILGUARD, "bench", f"{up.base}/v2/models/{name}", "--rate", str(rate),
                           "--arrivals", "uniform", "--duration", str(duration_s), "--warmup", "0",
                           "--max-requests", "4000", "--max-lag-ms", "100000", "--json",
                           "--records", str(out), *extra],
                          capture_output=True, text=True, timeout=duration_s + 60, cwd=ROOT)
    assert done.returncode == 0, done.stderr
    return [json.loads(line) for line in out.read_text().splitlines()]


def rollbacks(up: Up, name: str) -> dict[str, float]:
    text = httpx.get(f"{up.base}/metrics").text
    return {m.group(1): float(m.group(2)) for m in re.finditer(
        r'tailguard_rollbacks_total\{model="%s",reason="(\w+)"\} ([0-9.e+]+)' % name, text)}


class Attacker:
    """A client in a thread of its own: one request every ``1 / rate`` seconds (at most 2,000)
    until stopped, answers counted by status in :attr:`codes`. Subclasses say what to send
    (:meth:`send`) and may first wait for something (:meth:`ready`)."""

    def __init__(self, rate: float) -> None:
        self.interval_s = 1.0 / rate
        self.codes: dict[int, int] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> "Attacker":
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(10)

    def ready(self, client: httpx.Client, stopped: threading.Event) -> None:
        """Wait, if need be, before the first request (default: start at once)."""

    def send(self, client: httpx.Client, n: int) -> httpx.Response:
        """Send request number ``n`` (from 1)."""
        raise NotImplementedError

    def _run(self) -> None:
        with httpx.Client(timeout=10) as client:
            self.ready(client, self._stop)
            n = 0
            while not self._stop.wait(self.interval_s) and n < 2000:
                n += 1
                reply = self.send(client, n)
                self.codes[reply.status_code] = self.codes.get(reply.status_code, 0) + 1
