"""A bounded soak: the hostile mix of issue 9 beside a good client, against a real runtime.

    .venv/bin/python benchmarks/soak.py                    # about 6 minutes
    .venv/bin/python benchmarks/soak.py --duration 30 --ab-rounds 0
    .venv/bin/python benchmarks/soak.py --duration 20 --ab-rounds 0 --hostile bombs,padded
    .venv/bin/python benchmarks/soak.py --part3 --ab-rounds 0          # part 3, about 5 minutes
    .venv/bin/python benchmarks/soak.py --part3 nestbomb,pipeline --ab-rounds 0 --attack-seconds 10

What it does, all on 127.0.0.1, everything it starts stopped by PID at the end:

1. Starts ``tailguard-runtime`` for ``examples/digits.yaml`` (200-tree forest, SLO p99 50 ms,
   ``maxQueueSize`` 512) pinned to core 0 (``taskset -c 0``), with a soft limit of 1,024
   descriptors as in the report (the runtime raises it to the hard limit; ``--hard-fd-limit``
   caps that at 1,024 too, so the connection cap of 768 is what holds). This script and its load processes keep to core 1.
2. Calibrates: the good client (:func:`openloop`: the project's load generator,
   ``tailguard.bench.loadgen.run_load``, open loop with Poisson arrivals, one digits row per
   v2 request) at rising rates; the service's rate at SLO is the highest met (p99 within the
   SLO, every answer 200, in most of the runs the generator judged valid: :func:`calibrate`)
   before the first that is not. The good rate is half of it.
3. One good client at that rate through ``--rounds`` rounds of a phase alone and a phase
   beside the hostile mix (``--duration`` seconds of each in all, split evenly; alone first in
   odd rounds, beside the mix first in even ones), without a pause: its p99 alone and beside
   the mix are each over every answer of their phases pooled, so a slower spell of the machine
   falls on both rather than on one. Before each phase beside the mix, 2 s for the mix to
   build up; after it, 2 s for the sockets it left to close; requests scheduled in those
   stretches are left out of the comparison.
4. The hostile mix: 5 connections pipelining 13 MB of
   health probes each without reading (4 KiB receive buffer), 2 clients posting 16 KB gzip
   bodies that inflate to 16 MiB, 1 posting 512 rows padded to 16 MiB (64 KiB send buffer,
   ``--padded-sndbuf``: see :data:`PADDED_SNDBUF`), 200 idle sockets, 1,500
   sockets sending one header line every 5 s, 20 bodies sent one byte a second, and 59 requests
   a second holding ``1e300`` (poison for a float32 forest), all in threads of the
   ``SCHED_IDLE`` policy (``--hostile-sched``: see :data:`HOSTILE_SCHED`). All through step 3,
   phases alone included: the server's RSS every 0.25 s, and a health probe on a new
   connection every 0.5 s from a process of its own.
5. Unless ``--ab-rounds 0``: req/s at 64 clients (``benchmarks/loadgen.py``, the README's reference
   model and settings: a shell over the same generator, closed loop) of the runtime before
   (``--before`` git ref, exported with ``git archive``; by default main just before issue 9
   was merged) and after (this tree), alternating ABBA..., same cores; the ratio is the median
   of each round's after/before.
6. With ``--part3 [KINDS]``, instead of step 3 (:func:`part3`): the attacks of part 3 of the
   hostile-clients work (:data:`Hostile.PART3`; all unless named), each in a phase of its own
   beside the one good client: ``--attack-seconds`` (12) alone, then as long beside the attack,
   with 2 s of build-up before and 2 s of settling after. The server then runs under
   ``tailguard up`` (the same runtime, with the SLO guard in its process, so that a rollback
   can happen and is counted) with its hard open-file limit at 1,024 as ``--hard-fd-limit``
   sets it (connection cap 768, 192 per address). Every attack connects from 127.0.0.2
   (:data:`ATTACKER`) to 127.0.0.1, in threads as the mix's, and the prober reads ``/metrics``
   every 2 s besides its health probes:

   - ``bigheader``: requests whose one header value is 16 MiB, sent in 64 KiB pieces, one
     connection after another (431 past 64 KiB of head, then the server closes);
   - ``headerflood``: in turn, a head of endless short header lines (431 past 100 fields) and a
     chunked body followed by 300,000 trailer lines (431);
   - ``nestbomb``: every 0.5 s, 40 connections each posting a 5 KB gzip body that inflates to
     1.6 MB of JSON arrays nested 500 deep to ``/v1/models/digits:predict``, then all closed
     unread (refused by a count of arrays before parsing, or dropped once their client left);
   - ``unreadbody``: in turn, ``POST /v2/models/nope/infer`` (404) and ``GET`` on the digits
     inference route (405), each stating ``Content-Length: 1000000000000`` and then sending
     body bytes as fast as it can until the server closes (bytes sent counted per connection);
   - ``oneaddress``: 3,000 sockets opened in one burst (fewer if this process's open-file
     limit is lower), each a head stating ``Content-Length: 100`` and never the body, then
     reopened as the server answers them (503 past one address's share; 408 at the request's
     deadline) at up to 1,000 a second; all closed at the phase's end;
   - ``pipeline``: every 0.1 s, one connection pipelining 16 valid digits requests and then
     ``BREW / HTTP/1.1``, read to its end (16 x 200 with their ids in order, a 400, the close;
     anything else counts against the attack's check), and one pipelining 16 and closing unread.

   Gates of each attack, over its phase's whole span (from before the attack starts until it
   has settled): the event loop's longest stall at most 100 ms (the upper bound of the highest
   bucket of ``tailguard_event_loop_lag_seconds`` that grew, read from ``/metrics`` before and
   after; reported with the same bound in the phase alone before it, and the shares of the
   server's core that the server and other work on the machine took in each, from ``/proc``),
   the server's RSS under
   512 MiB all through, every good answer 200 (or 429, refused before admission) and none
   unanswered, no rollback (``tailguard_rollbacks_total`` unchanged, ``activeModel`` still
   ``primary``), every health probe and ``/metrics`` read answered within 1 s, and the attack's
   own answers as expected (:func:`attack_verdict`). The good client's p99 alone (the phase
   before) and beside each attack is reported as a measurement, not a gate: on this shared VM
   latency ratios swing too much to judge.

Prints one JSON report and the pass/fail of each bound (with ``--part3``, of the gates of step 6
instead of these): good p99 within twice its p99 alone and
within the SLO, RSS under 1 GiB, every health probe under 1 s, every good request answered
(200, or 429 refused before admission: nothing admitted left unanswered, alone or beside the
mix), and after/before req/s at 64 clients at least 0.95. When the generator's verdict fires
for the good client's run (p99 schedule lag over 1 ms, or more than 90% of a core), the report
says so (``generator_invalid``) and the check "good client's generator valid" fails: its
latencies are then partly its own. The verdict is over the whole run, phases alone and beside
the mix together (the records carry no lag per request), so lag confined to under 1% of the
run's requests passes it.
"""

from __future__ import annotations

import argparse
import asyncio
import bisect
import collections
import contextlib
import dataclasses
import functools
import gzip
import itertools
import json
import os
import re
import resource
import select
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any, Iterable, Iterator, Sequence

import httpx
import yaml

from tailguard._util.net import free_port

BENCH = Path(__file__).resolve().parent
REPO = BENCH.parent
PYTHON = sys.executable
SERVER_CPU, LOAD_CPU = 0, 1
LIVE = b"GET /v2/health/live HTTP/1.1\r\nHost: x\r\n\r\n"


def log(message: str) -> None:
    print(f"[soak {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def host_port(url: str) -> tuple[str, int]:
    """``http://HOST:PORT`` split into its host and port."""
    host, port = url.rsplit("/", 1)[1].rsplit(":", 1)
    return host, int(port)


def digits_config() -> dict[str, Any]:
    """The runtime config ``tailguard up examples/digits.yaml`` serves."""
    spec = yaml.safe_load((REPO / "examples" / "digits.yaml").read_text())["spec"]
    return {"name": "digits",
            "models": [{"role": "primary", "uri": spec["model"]["uri"]},
                       {"role": "fallback", "uri": spec["fallback"]["uri"]}],
            "batching": spec["batching"], "slo": spec["slo"]}


def _limit_fds() -> None:
    """A soft open-file limit of 1,024 (the hard one stays), as systemd and many container
    runtimes set it; ``--hard-fd-limit`` makes the hard limit 1,024 too."""
    hard = 1024 if HARD_FD_LIMIT else resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    resource.setrlimit(resource.RLIMIT_NOFILE, (1024, hard))


HARD_FD_LIMIT = False


@contextlib.contextmanager
def runtime(config: dict[str, Any], workdir: Path, pythonpath: str | None = None,
            fd_limit: bool = False, spec: Path | None = None
            ) -> Iterator[tuple[subprocess.Popen[bytes], str]]:
    """Start a runtime on core 0; yield the process and its base URL; SIGTERM it (by PID).

    ``spec``: serve that InferenceService file with ``tailguard up`` instead of ``config``
    with ``python -m tailguard_runtime``: the same runtime, with the SLO guard in its process,
    so that ``tailguard_rollbacks_total`` is served and a rollback can happen (its control file
    goes into ``workdir``)."""
    port = free_port()
    env = dict(os.environ, PYTHONPATH=pythonpath or os.environ.get("PYTHONPATH", ""))
    if spec is None:
        path = workdir / f"config-{port}.json"
        path.write_text(json.dumps(config))
        serve = ["-m", "tailguard_runtime", "--config", str(path)]
    else:
        serve = ["-m", "tailguard.cli.main", "up", str(spec)]
        env["TAILGUARD_STATE_DIR"] = str(workdir)
    argv = ["taskset", "-c", str(SERVER_CPU), PYTHON, *serve, "--host", "127.0.0.1", "--port",
            str(port), "--log-level", os.environ.get("SOAK_LOG_LEVEL", "WARNING")]
    tree = Path(pythonpath) if pythonpath else REPO / "runtime"
    if (tree / "tailguard_runtime" / "rpc").is_dir():  # a runtime with gRPC: a free port each
        argv += ["--grpc-port", "0"]
    logfile = open(workdir / f"server-{port}.log", "wb")
    proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=logfile, stderr=logfile,
                            env=env, preexec_fn=_limit_fds if fd_limit else None)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while True:
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(url + "/v2/health/ready", timeout=2).status_code == 200:
                    break
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"runtime did not start: {(workdir / f'server-{port}.log').read_text()[-800:]}")
            time.sleep(0.2)
        yield proc, url
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        logfile.close()


GOOD_CONNECTIONS = 256
"""Most connections the good client opens at once (:func:`openloop`)."""
GOOD_CONNECTIONS_PART3 = 128
"""The same in ``--part3`` mode, where the server's share of connections per address is 192
(a quarter of its cap of 768) and the good client, the prober and the ``/metrics`` reads all
come from 127.0.0.1: with 256, a stall of the server (this shared VM's, or an attack's) let the
good client's open connections pass its share, and the server then refused the good client
itself, and the probes beside it, with 503, as it should refuse any one address (run at
2026-12-05 07:45 UTC, ``benchmarks/README.md``). With 128, requests beyond them wait in the
generator, counted from their scheduled time."""

GOOD_NICE = -10
"""Scheduling priority (nice) of the good client's process when allowed (root): it shares core
1 with the hostile mix, whose threads would otherwise delay its sends (the schedule lag the
generator reports), and that delay would count as the server's latency."""


def _raise_priority() -> None:
    with contextlib.suppress(OSError):
        os.nice(GOOD_NICE)


class GoodClient:
    """:func:`openloop` in a process of its own (the hostile threads of this one share its GIL),
    at a higher priority than the hostile mix when allowed (:data:`GOOD_NICE`), started at once.
    Its report comes back through a file: with every latency in it, it runs to megabytes, and
    read from the child's stdout it once came back cut at 64 KiB (cause not found).

    ``record``: the report carries every request of the window; ``connections``: most open at
    once (see :func:`openloop`). :meth:`wait_measuring` returns once the measured window has
    begun; :meth:`report` waits for the end and returns the report.

    Raises (from :meth:`wait_measuring` and :meth:`report`):
        RuntimeError: the client process failed or did not finish in time.
    """

    def __init__(self, url: str, rate: float, duration_s: float, record: bool = False,
                 connections: int = GOOD_CONNECTIONS) -> None:
        self.tmp = tempfile.TemporaryDirectory(prefix="tailguard-good-")
        self.out = Path(self.tmp.name) / "report.json"
        self.duration_s = duration_s
        argv = [PYTHON, str(Path(__file__).resolve()), "--good-client", url, "--rate",
                str(rate), "--duration", str(duration_s), "--out", str(self.out),
                "--connections", str(connections)]
        # stderr to a file, not a pipe: nothing reads a pipe until the run ends, and a child
        # filling one would block
        self.err = Path(self.tmp.name) / "stderr"
        with open(self.err, "wb") as err:
            self.proc = subprocess.Popen(argv + (["--record"] if record else []),
                                         stdout=subprocess.DEVNULL, stderr=err,
                                         preexec_fn=_raise_priority)

    def wait_measuring(self, timeout_s: float = 60.0) -> None:
        marker = measuring_marker(self.out)
        deadline = time.monotonic() + timeout_s
        while not marker.exists():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self._fail()
            time.sleep(0.02)

    def report(self) -> dict[str, Any]:
        try:
            self.proc.wait(timeout=self.duration_s + GOOD_WARMUP_S + 60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        try:
            if self.proc.returncode != 0 or not self.out.exists():
                self._fail()
            report: dict[str, Any] = json.loads(self.out.read_text())
        finally:
            self.tmp.cleanup()
        return report

    def _fail(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()
        err = self.err.read_text(errors="replace")[-500:]
        self.tmp.cleanup()
        raise RuntimeError(f"good client failed ({self.proc.returncode}): {err}")


def measuring_marker(out: Path) -> Path:
    """The file a good client (:func:`openloop`) creates once its measured window begins."""
    return out.with_suffix(".measuring")


def good_client(url: str, rate: float, duration_s: float) -> dict[str, Any]:
    """One :class:`GoodClient` run from start to end: its report."""
    return GoodClient(url, rate, duration_s).report()


BUILD_UP_S = 2.0
"""Seconds the hostile mix runs before a phase beside it is measured."""
SETTLE_S = 2.0
"""Seconds after a phase beside the mix before the next phase: the mix's clients close their
sockets as they stop, and the server its side of them."""


def _server_brief(server: dict[str, Any] | None) -> str:
    """The server's view of a stretch of time in one log line: its own p99 of admitted requests
    (a histogram bucket's upper edge), model time per batch, batch rows, event-loop lag."""
    if not server:
        return "view unavailable"
    rows = server.get("batch_rows", {}).get("mean")
    return (f"p99 ms within {server.get('request_p99_ms')}, model ms per batch "
            f"{server.get('model_ms_per_batch')}, batch rows {rows}, event-loop lag ms "
            f"{server.get('event_loop_lag_ms')}")


GOOD_WARMUP_S = 1.0
"""Seconds of the good client's load sent and discarded before its measured window."""
GOOD_TIMEOUT_S = 5.0
"""A good request unanswered after this many seconds counts as ``timeout`` (unanswered)."""


def openloop(url: str, rate: float, duration_s: float, record: bool = False,
             measuring: Path | None = None, connections: int = GOOD_CONNECTIONS) -> dict[str, Any]:
    """The good client: one digits row per v2 request, Poisson arrivals at ``rate`` req/s for
    ``GOOD_WARMUP_S`` + ``duration_s`` s, sent by the project's load generator
    (:func:`tailguard.bench.loadgen.run_load`, open loop: keep-alive connections, at most
    ``connections`` open, latency from each request's scheduled time). ``measuring``: a file
    created when the measured window begins.

    Returns the generator's :meth:`~tailguard.bench.plan.LoadResult.as_dict` for the
    measured window plus ``codes`` (answers by status; ``timeout``/``connection``: no answer
    within ``GOOD_TIMEOUT_S`` or a dropped connection), ``p50Ms``/``p99Ms`` of the 200s and
    ``latencies_s`` (every 200's). Its ``valid``/``invalid`` carry the generator's verdict (p99
    schedule lag over 1 ms or more than 90% of a core: the latencies are partly the
    generator's own). With ``record``, also ``requests``: every request of the window as
    ``scheduled`` (Unix s), ``latency_s`` (None unless answered 200) and ``code`` lists.
    """
    from tailguard.bench.loadgen import Progress, Target, run_load, run_sync
    from tailguard.bench.plan import Bounds, OpenLoop
    from tailguard_runtime.models import load_dataset

    def progress(now: Progress) -> None:
        if measuring is not None and now.phase == "measure" and not measuring.exists():
            measuring.touch()

    x, _ = load_dataset("digits")
    host, port = host_port(url)
    bodies = tuple(json.dumps({"inputs": [{"name": "x", "shape": [1, 64], "datatype": "FP64",
                                           "data": row.tolist()}]}).encode() for row in x[:256])
    target = Target(host, port, "/v2/models/digits/infer", bodies)
    result = run_sync(run_load(target, OpenLoop(rate), Bounds(
        duration_s=duration_s, warmup_s=GOOD_WARMUP_S, timeout_s=GOOD_TIMEOUT_S,
        max_connections=connections), on_progress=progress, record=record))
    out: dict[str, Any] = result.as_dict()
    codes = {**result.http_errors, **result.transport_errors}
    if result.ok:
        codes["200"] = result.ok
    if result.rejected_429:
        codes["429"] = result.rejected_429
    out.update(codes=codes, p50Ms=result.latency_ms["p50"], p99Ms=result.latency_ms["p99"],
               latencies_s=[round(v, 6) for v in result.latencies_s.tolist()])
    if result.records is not None:
        out["requests"] = {
            "scheduled": [r["scheduled"] for r in result.records],
            "latency_s": [round(r["done"] - r["sent"], 6) if r["status"] == 200 else None
                          for r in result.records],
            "code": [str(r["status"]) if r["status"] else r["error"] for r in result.records]}
    return out


def by_phase(requests: dict[str, list[Any]], phases: Sequence[tuple[str, float, float]]
             ) -> dict[str, dict[str, Any]]:
    """The good client's requests (:func:`openloop`'s ``requests``) split by the phase their
    scheduled time fell in. ``phases``: ``(condition, start, end)``, Unix s; a request
    scheduled in none (a build-up or settling stretch) is left out.

    Returns, per condition: ``latency_ms`` (percentiles over every 200 of its phases pooled),
    ``p50Ms``, ``p99Ms``, ``codes`` (answers by status, summed), ``phase_p99_ms`` (each phase's
    own p99, in order) and ``phase_requests`` (each phase's count)."""
    from tailguard.bench.plan import percentiles_ms

    scheduled = requests["scheduled"]
    out: dict[str, dict[str, Any]] = {}
    for condition in dict.fromkeys(c for c, _, _ in phases):
        pooled: list[float] = []
        codes: collections.Counter[str] = collections.Counter()
        p99s, counts = [], []
        for _, start, end in (p for p in phases if p[0] == condition):
            lo, hi = bisect.bisect_left(scheduled, start), bisect.bisect_left(scheduled, end)
            latencies = [v for v in requests["latency_s"][lo:hi] if v is not None]
            codes.update(requests["code"][lo:hi])
            p99s.append(percentiles_ms(latencies)["p99"])
            counts.append(hi - lo)
            pooled += latencies
        ms = percentiles_ms(pooled)
        out[condition] = {"latency_ms": ms, "p50Ms": ms["p50"], "p99Ms": ms["p99"],
                          "codes": dict(codes), "phase_p99_ms": p99s, "phase_requests": counts}
    return out


CALIBRATE_TRIES = 3
"""Runs at most at one calibration rate (see :func:`calibrate`)."""
CLEAR_SHARE = 0.25
"""A valid calibration run with only 200s and a p99 under this share of the SLO meets its rate
on its own: far enough from the SLO that a second run would not change the verdict."""


def calibrate(url: str, slo_ms: float, rates: Sequence[float], seconds: float) -> float:
    """The highest of ``rates`` (req/s) served with p99 within ``slo_ms`` and only 200s, below
    the first rate that is not (the first rate when none is).

    A rate is run until two runs that the generator judged valid agree, at most
    :data:`CALIBRATE_TRIES` times (one run when it is clear, :data:`CLEAR_SHARE`), and is met
    when more of its valid runs met the SLO than missed it. A run the generator judged invalid
    (its own schedule lag or CPU: the client's fault, not the server's) counts for neither; a
    rate with no valid run proves nothing either way and is passed over. History: until
    2026-12-02 16:52 UTC one missed run ended the calibration, so a slow spell of a few seconds
    at 200 req/s once set the good rate to 50; from then until 2026-12-03 a rate was met by the
    better of two runs, so one lucky run at 8,000 req/s (p99 143.6 ms, then 42.4 ms) set a good
    rate of 4,000 req/s, which the server then served alone at p99 7.6-93.7 ms."""
    best = rates[0]
    for rate in rates:
        met = missed = 0
        for _ in range(CALIBRATE_TRIES):
            report = good_client(url, rate, seconds)
            log(f"calibrate {rate:.0f} req/s: p99 {report['p99Ms']} ms, codes {report['codes']}"
                + ("" if report["valid"] else f", generator invalid: {report['invalid']}"))
            if not report["valid"]:
                continue
            all_200 = set(report["codes"]) == {"200"}
            p99 = report["p99Ms"] or 1e9
            if all_200 and p99 <= slo_ms:
                met += 1
            else:
                missed += 1
            clear = all_200 and p99 < CLEAR_SHARE * slo_ms and not missed
            if met == 2 or missed == 2 or clear:
                break
        if met + missed == 0:
            log(f"calibrate {rate:.0f} req/s: inconclusive (the generator's own fault), "
                "passed over")
            continue
        if met <= missed:
            break
        best = rate
    return best


# -- the hostile mix ------------------------------------------------------------------------------


@functools.lru_cache(maxsize=None)
def hostile_bodies(n_features: int) -> tuple[bytes, bytes, bytes]:
    """The hostile mix's bodies, built once per run: a gzip body of 16 KB inflating to 16 MiB
    of v1 JSON (one row and white space: deflate's best ratio, about 1,025 to 1, as in the
    issue; until 2026-12-02 16:55 UTC the JSON was rows of zeros, 65 KB compressed), 512 rows
    padded to 16 MiB, and one row holding ``1e300``."""
    row = b"[" + b",".join([b"0"] * n_features) + b"]"
    head = b'{"instances":[' + row
    inflated = head + b" " * (16 * 1024 * 1024 - len(head) - 2) + b"]}"
    rows = json.dumps({"instances": [[0.0] * n_features] * 512}).encode()
    poison_row = [0.0] * n_features
    poison_row[3] = 1e300
    return (gzip.compress(inflated, 9), rows[:-1] + b" " * (16 * 1024 * 1024 - len(rows)) + b"}",
            json.dumps({"instances": [poison_row]}).encode())


PADDED_SNDBUF = 64 * 1024
"""Send buffer asked for (``SO_SNDBUF``, bytes; Linux doubles it) on the padded-body client's
sockets; 0 keeps the kernel's own (autotuned up to ``net.ipv4.tcp_wmem``'s maximum, 4 MiB
here). The server sees the same either way: a head stating 16 MiB, then body bytes until it
answers 413 and closes, at most its receive window of them. What changes is the attacker's own
kernel time on the load core, which the good client shares: on a kernel without preemption in
kernel mode (``PREEMPT_NONE``, this VM's), one ``send`` copying up to 4 MiB into the send buffer
runs to its end before the good client, woken on the same core, gets it. A choice about the
benchmark: the hostile clients stand for other machines than the good client's. Measured with
the padded part alone, the 64 KiB buffer halved the good client's rise in p99 at the same rate
of 413s; in the three whole soaks with it, the whole mix's rise did not shrink
(``benchmarks/README.md``, "Where the rest of the mix's cost comes from")."""


SCHED_POLICIES = ("idle", "normal")
"""The values of ``--hostile-sched`` (see :data:`HOSTILE_SCHED`)."""
HOSTILE_SCHED = "idle"
"""Scheduling policy of the hostile mix's threads on the load core: ``idle`` (``SCHED_IDLE``,
``sched(7)``) or ``normal`` (the default policy, as in every run before 2026-12-02 13:05 UTC).
The good client shares that core. Beside the mix, ``perf sched timehist`` showed the hostile
threads running in stretches of up to 5 ms (the pass over 1,720 sockets, the pipeliners, the
padded sends), and under the default policy a good client woken by an answer waited for the
running one to give up the core, nice -10 (:data:`GOOD_NICE`) notwithstanding: its wake-up
delay was 0.93 ms at p99 beside the mix, 0.00 ms alone. A normal task waking on a core where an
``SCHED_IDLE`` task runs marks it for preemption at once (``check_preempt_wakeup_fair`` in
Linux's ``kernel/sched/fair.c``; on this VM's kernel without preemption in kernel mode, the
switch comes when it next leaves the kernel): with ``idle`` that delay was 0.05 ms at p99 in the
same 8 s capture. The GIL is shared with this process's RSS sampler, which an idle thread
preempted while holding it can delay; only the largest sample is checked. A choice about the
benchmark, as :data:`PADDED_SNDBUF` is: the hostile clients stand for other machines than the
good client's, and the server's core is untouched. The load core was 11-17% busy beside the
mix (``/proc/stat``, the default policy), so the hostile threads still send what the server lets
them: the connection churn is unchanged, and the refused bodies and poison rows, which share
the server's refusal budget, split it differently (``benchmarks/README.md``, "The load core's scheduler")."""


ATTACKER = "127.0.0.2"
"""Source address of the part-3 attacks' connections (:data:`Hostile.PART3`); still to the
server on 127.0.0.1. The good client and the prober connect from 127.0.0.1, so an attack uses
its own share of the server's connections per address, as a client on another machine
would, and ``oneaddress`` can fill that share without touching theirs."""
ONEADDRESS_SOCKETS = 3000
"""Sockets ``oneaddress`` tries to hold open at once (fewer if this process's open-file limit,
less :data:`FD_RESERVE`, is lower)."""
ONEADDRESS_PER_PASS = 100
"""Most connections ``oneaddress`` opens per pass after its first (a pass every 0.1 s): the
first opens all of its :data:`ONEADDRESS_SOCKETS` as fast as it can, in one burst; after that,
those the server answered or closed are opened again at up to 1,000 a second."""
FD_RESERVE = 256
"""Descriptors of this process left to everything else while ``oneaddress`` runs."""
NESTBOMB_CONNECTIONS = 40
"""Connections of one ``nestbomb`` round, each one body, closed unread once all are sent."""
NESTBOMB_EVERY_S = 0.5
"""Seconds from the start of one ``nestbomb`` round to the next (80 bodies a second)."""
PIPELINE_DEPTH = 16
"""Valid requests one ``pipeline`` connection sends before its malformed one (the runtime's
``maxPipelinedRequests``)."""
PIPELINE_EVERY_S = 0.1
"""Seconds from the start of one ``pipeline`` pair of connections to the next: about 320 valid
requests a second beside the good client's, half of them abandoned."""
UNREAD_MAX_S = 5.0
"""Seconds an ``unreadbody`` connection sends its body at most: longer means the server reads
it (counted as ``cap``)."""
NOTES_KEPT = 10
"""Descriptions of unexpected outcomes an attack keeps (the first ones)."""


@functools.lru_cache(maxsize=None)
def part3_bodies(n_features: int) -> tuple[bytes, bytes]:
    """The part-3 attacks' requests, built once per run: ``nestbomb``'s (v1, gzip: 5 KB
    inflating to 1.6 MB of JSON arrays nested 500 deep, under the body limit of 1,638,400 bytes
    so that the count of arrays, not the size, refuses it) and ``pipeline``'s
    :data:`PIPELINE_DEPTH` v2 requests of one row of zeros each, ``id`` ``"0"``, ``"1"``, ...
    in order, as one run of bytes."""
    nest = b"[" * 500 + b"]" * 500
    inflated = b'{"instances":[' + b",".join([nest] * 1598) + b"]}"
    body = gzip.compress(inflated, 9)
    bomb = (b"POST /v1/models/digits:predict HTTP/1.1\r\nHost: x\r\n"
            b"Content-Type: application/json\r\nContent-Encoding: gzip\r\n"
            b"Content-Length: %d\r\n\r\n" % len(body)) + body
    requests = b""
    for i in range(PIPELINE_DEPTH):
        doc = json.dumps({"id": str(i), "inputs": [{"name": "x", "shape": [1, n_features],
                                                    "datatype": "FP64",
                                                    "data": [0.0] * n_features}]}).encode()
        requests += (b"POST /v2/models/digits/infer HTTP/1.1\r\nHost: x\r\n"
                     b"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n"
                     % len(doc)) + doc
    return bomb, requests


def read_answers(sock: socket.socket, timeout_s: float) -> tuple[list[tuple[int, bytes]], str]:
    """HTTP/1.1 answers read from a blocking ``sock``, in order, until it closes or
    ``timeout_s`` s have passed in all: each one's status and body (framed by its
    ``Content-Length``, which every answer of the runtime states), and how the reading ended:
    ``closed`` (the server closed after the last one), ``timeout``, ``reset`` or ``garbage``
    (bytes that are not a whole HTTP answer)."""
    deadline = time.monotonic() + timeout_s
    buffer = b""
    answers: list[tuple[int, bytes]] = []
    while True:
        while (head_end := buffer.find(b"\r\n\r\n")) >= 0:
            lines = buffer[:head_end].decode("latin-1").split("\r\n")
            if not lines[0].startswith("HTTP/1."):
                return answers, "garbage"
            length = 0
            for line in lines[1:]:
                name, _, value = line.partition(":")
                if name.strip().lower() == "content-length":
                    length = int(value)
            if len(buffer) < head_end + 4 + length:
                break
            answers.append((int(lines[0].split()[1]), buffer[head_end + 4:head_end + 4 + length]))
            buffer = buffer[head_end + 4 + length:]
        left = deadline - time.monotonic()
        if left <= 0:
            return answers, "timeout"
        sock.settimeout(left)
        try:
            chunk = sock.recv(65536)
        except TimeoutError:
            return answers, "timeout"
        except OSError:
            return answers, "reset"
        if not chunk:
            return answers, "garbage" if buffer else "closed"
        buffer += chunk


def pipeline_fault(answers: list[tuple[int, bytes]], end: str) -> str | None:
    """What is wrong with the answers to :data:`PIPELINE_DEPTH` valid requests pipelined before
    a malformed one (see :func:`read_answers`), or None: expected, in order, a 200 for each
    with its ``id`` (``"0"``, ``"1"``, ...), a 400, and the connection closed."""
    codes = [status for status, _ in answers]
    if codes != [200] * PIPELINE_DEPTH + [400]:
        return f"answers {codes}, reading ended {end}"
    ids = []
    for _, body in answers[:PIPELINE_DEPTH]:
        try:
            ids.append(json.loads(body).get("id"))
        except ValueError:
            ids.append(None)
    if ids != [str(i) for i in range(PIPELINE_DEPTH)]:
        return f"ids out of order: {ids}"
    return None if end == "closed" else f"not closed after the 400 (reading ended {end})"


class Hostile:
    """Every hostile client of issue 9, in threads, until :meth:`stop`; and the part-3 attacks
    (:data:`PART3`). Counts what it did (:attr:`counts`); an attack keeps the first few
    unexpected outcomes it met in :attr:`notes`.

    ``padded_sndbuf``: see :data:`PADDED_SNDBUF`; ``sched``: see :data:`HOSTILE_SCHED`."""

    KINDS = ("pipeliners", "bombs", "padded", "sockets", "poison")
    """The parts of the mix, as ``--hostile`` names them."""
    PART3 = ("bigheader", "headerflood", "nestbomb", "unreadbody", "oneaddress", "pipeline")
    """The attacks of part 3 of the hostile-clients work, as ``--part3`` (one phase each) and
    ``--hostile`` name them; each connects from :data:`ATTACKER`."""

    def __init__(self, url: str, port: int, n_features: int,
                 kinds: Sequence[str] = KINDS, padded_sndbuf: int = PADDED_SNDBUF,
                 sched: str = HOSTILE_SCHED) -> None:
        if sched not in SCHED_POLICIES:
            raise ValueError(f"sched must be one of {SCHED_POLICIES}, not {sched!r}")
        self.url, self.port = url, port
        self.padded_sndbuf, self.sched = padded_sndbuf, sched
        self.done = threading.Event()
        self.counts: dict[str, int] = {}
        self.notes: list[str] = []
        self.lock = threading.Lock()
        self.bomb, self.padded, self.poison = hostile_bodies(n_features)
        self.nestbomb, self.pipelined = part3_bodies(n_features)
        targets = {"pipeliners": [self._pipeliners], "bombs": [self._bombs, self._bombs],
                   "padded": [self._padded], "sockets": [self._sockets], "poison": [self._poison],
                   "bigheader": [self._bigheader], "headerflood": [self._headerflood],
                   "nestbomb": [self._nestbomb], "unreadbody": [self._unreadbody],
                   "oneaddress": [self._oneaddress], "pipeline": [self._pipeline]}
        self.threads = [threading.Thread(target=self._run, args=(t,), daemon=True)
                        for kind in kinds for t in targets[kind]]

    def count(self, key: str, n: int = 1) -> None:
        with self.lock:
            self.counts[key] = self.counts.get(key, 0) + n

    def most(self, key: str, n: int) -> None:
        """Keep under ``key`` the largest ``n`` seen."""
        with self.lock:
            self.counts[key] = max(self.counts.get(key, 0), n)

    def note(self, text: str) -> None:
        """Keep ``text`` among the first :data:`NOTES_KEPT` unexpected outcomes."""
        with self.lock:
            if len(self.notes) < NOTES_KEPT:
                self.notes.append(text)

    def start(self) -> None:
        for thread in self.threads:
            thread.start()

    def stop(self) -> None:
        self.done.set()
        for thread in self.threads:
            thread.join(timeout=30)

    def _run(self, client: Any) -> None:
        """Run ``client`` under ``self.sched`` (see :data:`HOSTILE_SCHED`). If ``SCHED_IDLE``
        cannot be set, the thread keeps its policy and the refusal is counted, once per
        thread, as ``sched_idle_refused`` (the run's log then warns)."""
        if self.sched == "idle":
            try:
                os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))  # 0: this thread
            except (OSError, AttributeError):
                self.count("sched_idle_refused")
        client()

    def _connect(self, rcvbuf: int | None = None,
                 source: str | None = None) -> socket.socket | None:
        """A non-blocking socket connected to the server (from ``source`` when given), or None
        when the connection failed within 2 s."""
        sock = socket.socket()
        if source:
            sock.bind((source, 0))
        if rcvbuf:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
        sock.settimeout(2)
        try:
            sock.connect(("127.0.0.1", self.port))
        except OSError:
            sock.close()
            return None
        sock.setblocking(False)
        return sock

    def _pipeliners(self) -> None:
        payload = LIVE * (1024 * 1024 // len(LIVE))
        socks: list[list[Any]] = []  # [socket, bytes sent]
        while not self.done.is_set():
            while len(socks) < 5:
                sock = self._connect(rcvbuf=4096)
                if sock is None:
                    break
                socks.append([sock, 0])
                self.count("pipeline_connections")
            for entry in list(socks):
                sock, sent = entry
                if sent >= 13 * len(payload):
                    continue
                try:
                    n = sock.send(payload[sent % len(payload):])
                    entry[1] += n
                    self.count("pipeline_bytes", n)
                except BlockingIOError:
                    pass
                except OSError:
                    sock.close()
                    socks.remove(entry)
                    self.count("pipeline_closed_by_server")
            time.sleep(0.01)
        for sock, _ in socks:
            sock.close()

    def _post_loop(self, body: bytes, headers: dict[str, str], key: str,
                   sndbuf: int = 0) -> None:
        options = [(socket.SOL_SOCKET, socket.SO_SNDBUF, sndbuf)] if sndbuf else []
        with httpx.Client(base_url=self.url, timeout=30,
                          transport=httpx.HTTPTransport(socket_options=options)) as client:
            while not self.done.is_set():
                try:
                    reply = client.post("/v1/models/digits:predict", content=body, headers=headers)
                    self.count(f"{key}_{reply.status_code}")
                except httpx.HTTPError as exc:
                    self.count(f"{key}_{type(exc).__name__}")

    def _bombs(self) -> None:
        self._post_loop(self.bomb, {"Content-Encoding": "gzip"}, "gzip_bomb")

    def _padded(self) -> None:
        self._post_loop(self.padded, {}, "padded_16MiB", self.padded_sndbuf)

    def _poison(self) -> None:
        with httpx.Client(base_url=self.url, timeout=30) as client:
            start = time.monotonic()
            i = 0
            while not self.done.is_set():
                delay = start + i / 59.0 - time.monotonic()
                if delay > 0:
                    time.sleep(delay)
                i += 1
                try:
                    self.count(f"poison_{client.post('/v1/models/digits:predict', content=self.poison).status_code}")
                except httpx.HTTPError as exc:
                    self.count(f"poison_{type(exc).__name__}")

    def _sockets(self) -> None:
        """200 idle, 1,500 half-sent heads (a line every 5 s), 20 bodies at a byte a second;
        each reopened when the server closes it."""
        kinds = {"idle": 200, "half_head": 1500, "slow_body": 20}
        live: dict[str, list[list[Any]]] = {k: [] for k in kinds}  # [socket, next send time]
        while not self.done.is_set():
            now = time.monotonic()
            for kind, want in kinds.items():
                opened = 0
                while len(live[kind]) < want and opened < 100:
                    sock = self._connect()
                    opened += 1
                    if sock is None:
                        self.count(f"{kind}_connect_failed")
                        break
                    with contextlib.suppress(OSError):
                        if kind == "half_head":
                            sock.send(b"GET /v2/health/live HTTP/1.1\r\n")
                        elif kind == "slow_body":
                            sock.send(b"POST /v1/models/digits:predict HTTP/1.1\r\nHost: x\r\n"
                                      b"Content-Length: 100000\r\n\r\n")
                    live[kind].append([sock, now + (5 if kind == "half_head" else 1)])
                    self.count(f"{kind}_opened")
                for entry in list(live[kind]):
                    sock, due = entry
                    try:
                        if sock.recv(4096) == b"":
                            raise ConnectionResetError
                        raise ConnectionResetError  # any answer means the server gave up on it
                    except BlockingIOError:
                        pass
                    except OSError:
                        sock.close()
                        live[kind].remove(entry)
                        self.count(f"{kind}_closed_by_server")
                        continue
                    if kind != "idle" and now >= due:
                        with contextlib.suppress(OSError):
                            sock.send(b"X-Slow: 1\r\n" if kind == "half_head" else b" ")
                        entry[1] = now + (5 if kind == "half_head" else 1)
            time.sleep(0.1)
        for entries in live.values():
            for sock, _ in entries:
                sock.close()

    # -- part 3 ---------------------------------------------------------------------------------

    @staticmethod
    def _push(sock: socket.socket, data: bytes) -> tuple[int, str | None]:
        """Send ``data`` on ``sock`` (blocking, with a timeout): the bytes the kernel took, and
        None, or why it stopped: ``stalled`` (no room within the timeout: the server stopped
        reading) or ``closed`` (the server closed or reset the connection)."""
        view = memoryview(data)
        sent = 0
        while sent < len(view):
            try:
                sent += sock.send(view[sent:])
            except TimeoutError:
                return sent, "stalled"
            except OSError:
                return sent, "closed"
        return sent, None

    @staticmethod
    def _answer(sock: socket.socket, wait_s: float = 0.0) -> str | None:
        """The status code of an answer waiting on ``sock`` (``"431"``), or ``closed`` (closed
        without one) or ``reset``; None when nothing came within ``wait_s`` s."""
        # select, not MSG_DONTWAIT: a socket with a timeout waits for that long on EAGAIN
        if not select.select([sock], [], [], wait_s)[0]:
            return None
        try:
            data = sock.recv(4096)
        except OSError:
            return "reset"
        if not data:
            return "closed"
        return data[9:12].decode("latin-1") if data.startswith(b"HTTP/1.") else "garbage"

    def _until_answered(self, key: str, head: bytes, pieces: Iterable[bytes],
                        expected: str) -> None:
        """One connection from :data:`ATTACKER` sending ``head`` and then ``pieces``, checking
        for an answer before each, until the server answers or closes, stops reading for 2 s,
        or the pieces run out. Counts ``{key}_connections``, ``{key}_answer_{status}`` (or
        ``closed``/``reset`` without an answer; ``stopped`` when the phase ended first) and the
        bytes sent, ``{key}_bytes`` in all and ``{key}_bytes_max`` on one connection; an
        answer other than ``expected`` is noted."""
        sock = self._connect(source=ATTACKER)
        if sock is None:
            self.count(f"{key}_connect_failed")
            return
        sock.settimeout(2.0)
        total, answer = 0, None
        with sock:
            for piece in itertools.chain((head,), pieces):
                if self.done.is_set() or (answer := self._answer(sock)) is not None:
                    break
                sent, stop = self._push(sock, piece)
                total += sent
                if stop is not None:
                    break
            if answer is None:
                answer = self._answer(sock, 2.0) or ("stopped" if self.done.is_set()
                                                     else "none")
        self.count(f"{key}_connections")
        self.count(f"{key}_answer_{answer}")
        self.count(f"{key}_bytes", total)
        self.most(f"{key}_bytes_max", total)
        if answer not in (expected, "stopped"):
            self.note(f"{key}: answer {answer} after {total} bytes sent")

    def _bigheader(self) -> None:
        """Requests whose one header value is 16 MiB, sent in 64 KiB pieces, one connection
        after another: the server answers 431 once the head passes 64 KiB, and closes."""
        head = (b"POST /v2/models/digits/infer HTTP/1.1\r\nHost: x\r\n"
                b"Content-Type: application/json\r\nX-Big: ")
        pieces = (b"a" * 65536,) * 256 + (b"\r\nContent-Length: 2\r\n\r\n{}",)
        while not self.done.is_set():
            self._until_answered("bigheader", head, pieces, "431")

    def _headerflood(self) -> None:
        """In turn, one connection after another: a request head of endless short header lines
        (100 a piece, 1,000,000 at most) and a chunked body followed by 300,000 trailer lines
        (1,000 a piece); the server answers 431 past 100 fields or 64 KiB, and closes."""
        fields = (b"GET /v2/health/live HTTP/1.1\r\nHost: x\r\n",
                  b"".join(b"X-F%d: 1\r\n" % i for i in range(100)), 10_000)
        trailers = (b"POST /v2/models/digits/infer HTTP/1.1\r\nHost: x\r\n"
                    b"Content-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n"
                    b"2\r\n{}\r\n0\r\n", b"".join(b"X-T%d: 1\r\n" % i for i in range(1000)), 300)
        while not self.done.is_set():
            for key, (head, piece, n) in (("headerflood_fields", fields),
                                          ("headerflood_trailers", trailers)):
                if not self.done.is_set():
                    self._until_answered(key, head, itertools.chain(
                        itertools.repeat(piece, n), (b"\r\n",)), "431")

    def _nestbomb(self) -> None:
        """Every :data:`NESTBOMB_EVERY_S` s, :data:`NESTBOMB_CONNECTIONS` connections each
        sending one gzip body inflating to arrays nested 500 deep (:func:`part3_bodies`) to the
        v1 route, then all closed without reading. Counts ``nestbomb_rounds`` and
        ``nestbomb_sent`` (bodies sent whole)."""
        while not self.done.is_set():
            started = time.monotonic()
            socks = []
            for _ in range(NESTBOMB_CONNECTIONS):
                if self.done.is_set():
                    break
                sock = self._connect(source=ATTACKER)
                if sock is None:
                    self.count("nestbomb_connect_failed")
                    continue
                socks.append(sock)
                try:  # non-blocking: 5 KB fit in the send buffer
                    if sock.send(self.nestbomb) == len(self.nestbomb):
                        self.count("nestbomb_sent")
                    else:
                        self.count("nestbomb_partial")
                except OSError:
                    self.count("nestbomb_send_failed")
            for sock in socks:
                sock.close()
            self.count("nestbomb_rounds")
            self.done.wait(max(0.0, NESTBOMB_EVERY_S - (time.monotonic() - started)))

    def _unreadbody(self) -> None:
        """In turn, one connection after another: ``POST`` to an unknown model (404) and ``GET``
        on the inference route (405), each stating ``Content-Length: 1000000000000`` and then
        sending body bytes as fast as it can, until the server closes the connection, stops
        reading for 2 s (``stalled``) or :data:`UNREAD_MAX_S` s pass (``cap``). Counts per
        variant the answers (``unreadbody_{variant}_answer_{status}``; ``stopped`` when the
        phase ended first), how the connections
        ended (``..._end_{closed,stalled,cap,stopped}``) and the body bytes sent, in all
        (``..._body_bytes``) and on one connection at most (``..._body_bytes_max``)."""
        heads = {"unknown_model": (b"POST /v2/models/nope/infer HTTP/1.1\r\nHost: x\r\n"
                                   b"Content-Type: application/json\r\n"
                                   b"Content-Length: 1000000000000\r\n\r\n", "404"),
                 "get": (b"GET /v2/models/digits/infer HTTP/1.1\r\nHost: x\r\n"
                         b"Content-Type: application/json\r\n"
                         b"Content-Length: 1000000000000\r\n\r\n", "405")}
        piece = b"0" * 65536
        while not self.done.is_set():
            for variant, (head, expected) in heads.items():
                if not self.done.is_set():
                    self._send_unread(f"unreadbody_{variant}", head, expected, piece)

    def _send_unread(self, key: str, head: bytes, expected: str, piece: bytes) -> None:
        """One connection of :meth:`_unreadbody`."""
        sock = self._connect(source=ATTACKER)
        if sock is None:
            self.count(f"{key}_connect_failed")
            return
        sock.settimeout(2.0)
        answer: str | None = None
        body, end = 0, "stopped"
        deadline = time.monotonic() + UNREAD_MAX_S
        with sock:
            _, stop = self._push(sock, head)
            while stop is None and not self.done.is_set():
                if time.monotonic() > deadline:
                    stop = "cap"
                    break
                if answer is None:
                    answer = self._answer(sock)
                sent, stop = self._push(sock, piece)
                body += sent
            end = stop or end
            if answer is None or answer in ("closed", "reset"):
                answer = self._answer(sock, 0.5) or answer or (
                    "stopped" if end == "stopped" else "none")
        self.count(f"{key}_connections")
        self.count(f"{key}_answer_{answer}")
        self.count(f"{key}_end_{end}")
        self.count(f"{key}_body_bytes", body)
        self.most(f"{key}_body_bytes_max", body)
        if answer not in (expected, "stopped") or end not in ("closed", "stopped"):
            self.note(f"{key}: answer {answer}, ended {end} after {body} body bytes")

    def _oneaddress(self) -> None:
        """Up to :data:`ONEADDRESS_SOCKETS` sockets from :data:`ATTACKER` at once, each sending
        a request head stating ``Content-Length: 100`` and never the body, all opened in one
        burst; a socket the server answers or closes is closed and opened again (at most
        :data:`ONEADDRESS_PER_PASS` new ones per pass after the first, a pass every 0.1 s).
        Counts ``oneaddress_opened``, the answers
        (``oneaddress_answer_{status}``, ``..._closed``, ``..._reset``), the server's share
        per address as its 503 states it (``oneaddress_share``), and ``oneaddress_held_max``:
        the most sockets open at one pass, unanswered a second or more after they were opened
        (the server holds its share at most, and answers the rest 503 as it accepts them; the
        others wait in its listen queue)."""
        head = (b"POST /v2/models/digits/infer HTTP/1.1\r\nHost: x\r\n"
                b"Content-Type: application/json\r\nContent-Length: 100\r\n\r\n")
        soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
        want = min(ONEADDRESS_SOCKETS, soft - len(os.listdir("/proc/self/fd")) - FD_RESERVE)
        self.most("oneaddress_target", want)
        live: list[tuple[socket.socket, float]] = []
        burst = want
        try:
            while not self.done.is_set():
                now = time.monotonic()
                opened = 0
                while len(live) < want and opened < burst and not self.done.is_set():
                    opened += 1
                    sock = self._connect(source=ATTACKER)
                    if sock is None:
                        self.count("oneaddress_connect_failed")
                        break
                    with contextlib.suppress(OSError):
                        sock.send(head)
                    live.append((sock, time.monotonic()))
                    self.count("oneaddress_opened")
                held = 0
                kept: list[tuple[socket.socket, float]] = []
                for sock, since in live:
                    try:
                        data = sock.recv(4096)
                    except BlockingIOError:
                        kept.append((sock, since))
                        held += int(now - since >= 1.0)
                        continue
                    except OSError:
                        data = b"reset"
                    sock.close()
                    if data.startswith(b"HTTP/1."):
                        self.count(f"oneaddress_answer_{data[9:12].decode('latin-1')}")
                        if share := re.search(rb"from this address \((\d+)\)", data):
                            self.most("oneaddress_share", int(share.group(1)))
                    else:
                        self.count(f"oneaddress_answer_{'reset' if data else 'closed'}")
                live, burst = kept, ONEADDRESS_PER_PASS
                self.most("oneaddress_held_max", held)
                self.most("oneaddress_open_max", len(live))
                self.done.wait(0.1)
        finally:
            self.count("oneaddress_open_at_end", len(live))
            for sock, _ in live:
                sock.close()

    def _pipeline(self) -> None:
        """Every :data:`PIPELINE_EVERY_S` s: one connection pipelining :data:`PIPELINE_DEPTH`
        valid digits requests and then a malformed one (``BREW / HTTP/1.1``) and reading every
        answer (``pipeline_read_ok`` when they are as :func:`pipeline_fault` expects, else
        ``pipeline_read_bad``, noted), and one pipelining the valid requests and closing at
        once without reading (``pipeline_abandoned``)."""
        brew = b"BREW / HTTP/1.1\r\nHost: x\r\n\r\n"
        while not self.done.is_set():
            started = time.monotonic()
            sock = self._connect(source=ATTACKER)
            if sock is None:
                self.count("pipeline_connect_failed")
            else:
                sock.settimeout(5.0)
                with sock:
                    _, stop = self._push(sock, self.pipelined + brew)
                    answers, end = read_answers(sock, 5.0)
                fault = pipeline_fault(answers, end)
                self.count("pipeline_read_bad" if fault else "pipeline_read_ok")
                if fault:
                    self.note(f"pipeline: {fault}" + (f" (sending: {stop})" if stop else ""))
            sock = self._connect(source=ATTACKER)
            if sock is None:
                self.count("pipeline_connect_failed")
            else:
                with sock, contextlib.suppress(OSError):
                    sock.send(self.pipelined)
                self.count("pipeline_abandoned")
            self.done.wait(max(0.0, PIPELINE_EVERY_S - (time.monotonic() - started)))


def probe_once(port: int, timeout_s: float = 5.0,
               path: str = "/v2/health/live") -> tuple[float, str | None]:
    """One health probe as a kubelet sends it: a new connection, ``GET /v2/health/live`` (or
    ``path``), the answer read to its end. Returns its seconds and None, or the seconds until it
    failed and why (a status other than 200, a timeout, a refused or reset connection)."""
    started = time.monotonic()
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=timeout_s) as sock:
            sock.settimeout(max(0.01, timeout_s - (time.monotonic() - started)))
            sock.sendall(f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                         "Connection: close\r\n\r\n".encode())
            answer = b""
            while chunk := sock.recv(4096):
                answer += chunk
    except OSError as exc:
        return time.monotonic() - started, type(exc).__name__
    took = time.monotonic() - started
    return took, None if answer.startswith(b"HTTP/1.1 200 ") else answer[:12].decode(
        "latin-1", "replace")


def prober(port: int, seconds: float, every_s: float = 0.5,
           metrics_every_s: float = 0.0) -> dict[str, Any]:
    """:func:`probe_once` every ``every_s`` s for ``seconds``, and with ``metrics_every_s``
    (s) a ``GET /metrics`` as often, on a new connection too: ``{"probe_s": [...], "failures":
    [...], "probes": [...]}``; ``probe_s`` and ``failures`` are the health probes', ``probes``
    every probe's ``[Unix s at its start, seconds, path, failure or None]``. Run in its own
    process (see :class:`Watch`)."""
    times: list[float] = []
    failures: list[str] = []
    probes: list[list[Any]] = []
    end = time.monotonic() + seconds
    next_metrics = time.monotonic()
    while (tick := time.monotonic()) < end:
        at = time.time()
        took, failure = probe_once(port)
        times.append(round(took, 4))
        if failure:
            failures.append(failure)
        probes.append([round(at, 3), round(took, 4), "/v2/health/live", failure])
        if metrics_every_s and tick >= next_metrics:
            next_metrics += metrics_every_s
            at = time.time()
            took, failure = probe_once(port, path="/metrics")
            probes.append([round(at, 3), round(took, 4), "/metrics", failure])
        time.sleep(max(0.0, every_s - (time.monotonic() - tick)))
    return {"probe_s": times, "failures": failures, "probes": probes}


class Watch:
    """The server's RSS every 0.25 s (a thread here), and a health probe on a new connection
    every 0.5 s from a process of its own (:func:`prober`), so that the hostile mix's threads,
    which share this process's GIL, cannot delay the probe and make the server look slow.
    ``metrics_every_s``: the prober also reads ``/metrics`` that often (s; 0: never)."""

    def __init__(self, pid: int, url: str, seconds: float, metrics_every_s: float = 0.0) -> None:
        self.pid, self.url, self.seconds = pid, url, seconds
        self.metrics_every_s = metrics_every_s
        self.rss_mib: list[float] = []
        self.rss_at: list[float] = []
        """Unix s of each RSS sample."""
        self.probe_s: list[float] = []
        self.probe_failures: list[str] = []
        self.probes: list[list[Any]] = []
        """Every probe (:func:`prober`'s ``probes``), once stopped."""
        self.done = threading.Event()
        self.thread = threading.Thread(target=self._rss, daemon=True)
        self.probe: subprocess.Popen[str] | None = None

    def start(self) -> None:
        self.thread.start()
        self.probe = subprocess.Popen(
            [PYTHON, str(Path(__file__).resolve()), "--probe", self.url, "--duration",
             str(self.seconds), "--probe-metrics", str(self.metrics_every_s)],
            stdout=subprocess.PIPE, text=True, preexec_fn=_raise_priority)

    def stop(self) -> None:
        self.done.set()
        self.thread.join(timeout=10)
        if self.probe is not None:
            out, _ = self.probe.communicate(timeout=self.seconds + 30)
            report = json.loads(out.strip().splitlines()[-1])
            self.probe_s, self.probe_failures = report["probe_s"], report["failures"]
            self.probes = report["probes"]

    def during(self, start: float, end: float) -> dict[str, Any]:
        """What was watched from ``start`` to ``end`` (Unix s), once stopped: ``rss_max_mib``
        (None without a sample), and per probed path (``/v2/health/live``, ``/metrics`` when
        probed) the probes' ``count``, ``max_s`` and ``failures``."""
        rss = [mib for at, mib in zip(self.rss_at, self.rss_mib) if start <= at <= end]
        probes: dict[str, dict[str, Any]] = {}
        for at, took, path, failure in self.probes:
            if start <= at <= end:
                seen = probes.setdefault(path, {"count": 0, "max_s": 0.0, "failures": []})
                seen["count"] += 1
                seen["max_s"] = max(seen["max_s"], took)
                if failure:
                    seen["failures"].append(failure)
        return {"rss_max_mib": round(max(rss), 1) if rss else None, "probes": probes}

    def _rss(self) -> None:
        while not self.done.wait(0.25):
            with contextlib.suppress(OSError):
                for line in Path(f"/proc/{self.pid}/status").read_text().splitlines():
                    if line.startswith("VmRSS:"):
                        self.rss_at.append(time.time())
                        self.rss_mib.append(int(line.split()[1]) / 1024)


# -- before/after at 64 clients -------------------------------------------------------------------


BEFORE_ISSUE_9 = "737b294"
"""main just before the first fix of issue 9 was merged: what "no fix may cost more than 5% of
the README's req/s at 64 clients" compares with."""


def export_before(ref: str, into: Path) -> Path:
    """``runtime/tailguard_runtime`` at git ``ref``, exported into ``into``; its parent dir.
    A ref that has the gRPC service gets this tree's compiled descriptor set (git ignores it;
    ``hack/proto/build.py`` makes it from the pinned ``.proto``, the same for every ref)."""
    archive = subprocess.run(["git", "-C", str(REPO), "archive", ref, "runtime/tailguard_runtime"],
                             capture_output=True, check=True).stdout
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive, check=True)
    rpc = into / "runtime" / "tailguard_runtime" / "rpc"
    compiled = REPO / "runtime" / "tailguard_runtime" / "rpc" / "grpc_predict_v2.binpb"
    if rpc.is_dir() and compiled.is_file():
        shutil.copyfile(compiled, rpc / compiled.name)
    return into / "runtime"


def loadgen(url: str, clients: int, duration_s: float, warmup_s: float) -> dict[str, Any]:
    argv = [PYTHON, str(BENCH / "loadgen.py"), "--url", url, "--format", "v2", "--clients",
            str(clients), "--duration", str(duration_s), "--warmup", str(warmup_s),
            "--timeout", "10"]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=duration_s + warmup_s + 40)
    if done.returncode != 0:
        raise RuntimeError(f"loadgen failed: {done.stderr[-500:]}")
    report: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return report


def before_after(workdir: Path, before_ref: str, rounds: int, seconds: float) -> dict[str, Any]:
    """req/s at 64 clients of the runtime at git ``before_ref`` and of this tree, ``rounds``
    rounds of one ``seconds`` run each, in turn (ABBA...), both servers up throughout.

    ``ratio`` is the median over rounds of after/before within a round: the two runs of a round
    are adjacent in time, so a slower spell of the machine falls on both more often than on the
    medians of either side taken apart (until 2026-12-03 the ratio was of those medians)."""
    sys.path.insert(0, str(BENCH))
    from refmodel import write_model

    model = write_model(workdir / "ref.joblib")
    config = {"name": "ref", "models": [{"role": "primary", "uri": model.as_uri()}],
              "batching": {"maxBatchSize": 64, "maxWaitMs": 0, "maxQueueSize": 1024,
                           "timeoutMs": 5000}}
    before_path = str(export_before(before_ref, workdir))
    after_path = str(REPO / "runtime")
    results: dict[str, list[float]] = {"before": [], "after": []}
    invalid: list[str] = []
    with runtime(config, workdir, before_path) as (_, before_url), \
            runtime(config, workdir, after_path) as (_, after_url):
        for i in range(rounds):
            for name, url in (("before", before_url), ("after", after_url))[::1 if i % 2 == 0 else -1]:
                report = loadgen(url + "/v2/models/ref/infer", 64, seconds, 2.0)
                results[name].append(report["req_per_s"])
                if report["invalid"]:
                    invalid.append(f"{name} round {i + 1}: {'; '.join(report['invalid'])}")
                log(f"64 clients {name}: {report['req_per_s']:.0f} req/s p99 {report['p99_ms']:.1f} ms")
    ratios = [a / b for a, b in zip(results["after"], results["before"])]
    return {"before_req_s": results["before"], "after_req_s": results["after"],
            "median_before": statistics.median(results["before"]),
            "median_after": statistics.median(results["after"]),
            "round_ratios": [round(r, 3) for r in ratios],
            "ratio": round(statistics.median(ratios), 3), "generator_invalid": invalid}


PHASE_MARGIN_S = 3.0
"""Seconds per round that the good client's window runs past the phases' planned time: room
for the server snapshots and for the hostile threads to finish their last request."""


STALL_MS = 100.0
"""Gate of each part-3 phase: the event loop's longest stall (the upper bound of the highest
``tailguard_event_loop_lag_seconds`` bucket that grew, ms) at most this."""
RSS_MIB = 512.0
"""Gate of each part-3 phase: the server's RSS under this (MiB) all through."""
PROBE_SLOW_S = 1.0
"""A health probe or ``/metrics`` read slower than this (s) fails the probes' gate."""
PROBE_METRICS_EVERY_S = 2.0
"""Seconds between two ``/metrics`` reads of the prober in ``--part3`` mode."""
PART3_MARGIN_S = 8.0
""":data:`PHASE_MARGIN_S` in ``--part3`` mode: on this VM, busy with other work, a phase took up
to 6 s more than planned (snapshots of a slow server, attack threads stopping), and 3 s per
phase ended a run before its last phases."""


def server_snapshot(url: str) -> Any:
    """The server's ``/metrics`` now (:func:`tailguard.bench.promview.scrape`; None when
    unreadable)."""
    from tailguard.bench.promview import scrape

    return asyncio.run(scrape(*host_port(url), "/metrics"))


def rollbacks(snapshot: Any) -> float | None:
    """``tailguard_rollbacks_total`` in a :func:`server_snapshot`, summed over its labels; None
    without a snapshot or when the server serves no such counter (a runtime without the SLO
    guard: see :func:`runtime`'s ``spec``)."""
    if not snapshot:
        return None
    found = [value for (name, _), value in snapshot.items() if name == "tailguard_rollbacks_total"]
    return sum(found) if found else None


def counter_increase(before: Any, after: Any, name: str) -> dict[str, int]:
    """How much counter ``name`` (a sample name, ``..._total``) grew between two
    :func:`server_snapshot`\\ s, by the values of its labels other than model, version and role
    (joined with ``,``); only those that grew. Empty without both snapshots."""
    if not before or not after:
        return {}
    grew = {",".join(v for _, v in labels): int(round(value - before.get((n, labels), 0.0)))
            for (n, labels), value in after.items() if n == name}
    return {labels: n for labels, n in sorted(grew.items()) if n}


def cpu_seconds(pid: int | None) -> tuple[float, float] | None:
    """The CPU seconds process ``pid`` (the server, pinned to core :data:`SERVER_CPU`) has used,
    all its threads, user and system (``/proc/PID/stat``), and those the server's core has been
    busy with anything, the VM's steal included (``/proc/stat``); None when unreadable. Between
    two reads, the second less the first is the core's time taken by work other than the
    server's: the machine's, which no gate of the server's should be charged with."""
    tick = os.sysconf("SC_CLK_TCK")
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        core = next(line.split()[1:] for line in Path("/proc/stat").read_text().splitlines()
                    if line.startswith(f"cpu{SERVER_CPU} "))
    except (OSError, StopIteration):
        return None
    # utime, stime; user, nice, system, irq, softirq, steal
    return ((int(fields[11]) + int(fields[12])) / tick,
            sum(int(core[i]) for i in (0, 1, 2, 5, 6, 7)) / tick)


def active_model(url: str) -> str | None:
    """``activeModel`` of the server's ``/tailguard/stats`` now (None when unreadable)."""
    try:
        return str(httpx.get(url + "/tailguard/stats", timeout=5).json()["activeModel"])
    except (httpx.HTTPError, ValueError, KeyError, TypeError):
        return None


@dataclasses.dataclass
class PhasedRun:
    """What :func:`run_phases` gathered: the good client's report (``good``, less its
    per-request lists), its ``requests`` (:func:`openloop`'s, for :func:`by_phase`), the
    ``phases`` (:func:`_phase`'s entries, in order), the hostile ``counts`` summed over them,
    and the ``watch`` (stopped)."""

    good: dict[str, Any]
    requests: dict[str, list[Any]]
    phases: list[dict[str, Any]]
    counts: dict[str, int]
    watch: Watch


def run_phases(pid: int, url: str, rate: float, phase_s: float,
               plan: Sequence[tuple[str, Sequence[str]]], padded_sndbuf: int, sched: str,
               metrics_every_s: float = 0.0, margin_s: float = PHASE_MARGIN_S,
               connections: int = GOOD_CONNECTIONS) -> PhasedRun:
    """One good client at ``rate`` req/s (at most ``connections`` open) all through the phases
    of ``plan``, in order, without a pause: each a condition (its name in the report) and the
    hostile kinds that run beside the good client (none: the good client alone), ``phase_s`` s
    each (:func:`_phase`), the server (``pid``) watched all along (:class:`Watch`;
    ``metrics_every_s``: the prober reads ``/metrics`` that often too, s). The good client's
    window has ``margin_s`` s more per phase beside hostile clients than the phases' planned
    time, for the server snapshots and for the hostile threads to stop.

    Raises:
        RuntimeError: the good client failed, its window would end before the next phase, or
            a hostile thread outlived the phase it belonged to.
    """
    total_s = sum(phase_s + (BUILD_UP_S + SETTLE_S + margin_s if kinds else 0.0)
                  for _, kinds in plan)
    # the prober first: its start-up (a new interpreter on the load core) is over before the
    # good client's first phase
    watch = Watch(pid, url, total_s + 5.0, metrics_every_s)
    watch.start()
    client: GoodClient | None = None
    phases: list[dict[str, Any]] = []
    counts: dict[str, int] = {}
    try:
        client = GoodClient(url, rate, total_s, record=True, connections=connections)
        client.wait_measuring()
        window_end = time.time() + total_s - 0.5  # the marker appears just after the start
        for i, (condition, kinds) in enumerate(plan):
            if client.proc.poll() is not None:
                raise RuntimeError(f"good client ended early ({client.proc.returncode})")
            build_up = BUILD_UP_S if kinds else 0.0
            if time.time() + build_up + phase_s > window_end:
                raise RuntimeError("the good client's window would end before this phase; "
                                   "raise PHASE_MARGIN_S (PART3_MARGIN_S with --part3)")
            log(f"phase {i + 1}/{len(plan)}: {condition}"
                + (f" ({','.join(kinds)})" if kinds else "")
                + f", good client at {rate:.0f} req/s, {phase_s:.0f} s")
            phases.append(_phase(url, condition, phase_s, kinds, padded_sndbuf, sched, counts,
                                 pid))
    except BaseException:
        # end what was started now, not after the good client's whole window, and collect it
        if client is not None and client.proc.poll() is None:
            client.proc.kill()
        if watch.probe is not None and watch.probe.poll() is None:
            watch.probe.kill()
        with contextlib.suppress(Exception):
            if client is not None:
                client.report()
        with contextlib.suppress(Exception):
            watch.stop()
        raise
    try:
        good = client.report()
    finally:
        watch.stop()
    requests = good.pop("requests")
    del good["latencies_s"]
    log(f"good client, whole run: codes {good['codes']}, schedule lag ms "
        f"{good['schedule_lag_ms']}, generator CPU {good['generator_cpu']}"
        + ("" if good["valid"] else f", generator invalid: {good['invalid']}"))
    return PhasedRun(good, requests, phases, counts, watch)


def phased(pid: int, url: str, rate: float, phase_s: float, rounds: int, kinds: Sequence[str],
           padded_sndbuf: int, sched: str) -> dict[str, Any]:
    """One good client at ``rate`` req/s all through ``rounds`` rounds of a phase alone and a
    phase beside the hostile mix (``phase_s`` s each; alone first in odd rounds, beside the mix
    first in even ones), the server (``pid``) watched all along (:func:`run_phases`).

    Before each phase beside the mix, :data:`BUILD_UP_S` for the mix to build up; after it,
    :data:`SETTLE_S` for the sockets it left to close. Requests scheduled in those stretches
    are left out of the latency comparison (:func:`by_phase`) but not out of the answers.

    Returns report entries: ``alone`` and ``hostile`` (:func:`by_phase`), ``good_client``
    (the whole run's report, less its per-request lists), ``phases`` (:func:`_phase`'s),
    ``hostile_counts``, ``rss_max_mib``, ``health_max_s`` and ``health_failures``.

    Raises:
        RuntimeError: as :func:`run_phases`.
    """
    plan: list[tuple[str, Sequence[str]]] = []
    for i in range(rounds):
        # alone first in odd rounds, beside the mix first in even ones (ABBA...), so that
        # neither side always follows the other
        pair: list[tuple[str, Sequence[str]]] = [("alone", ()), ("beside", tuple(kinds))]
        plan += pair if i % 2 == 0 else pair[::-1]
    run = run_phases(pid, url, rate, phase_s, plan, padded_sndbuf, sched)
    split = by_phase(run.requests, [(p["condition"], p["start"], p["end"]) for p in run.phases])
    for condition, result in split.items():
        log(f"{condition}: p99 {result['p99Ms']} ms over the phases pooled (phases: "
            f"{result['phase_p99_ms']} ms), codes {result['codes']}")
    return {"alone": split["alone"], "hostile": split["beside"], "good_client": run.good,
            "phases": run.phases, "hostile_counts": run.counts,
            "rss_max_mib": round(max(run.watch.rss_mib, default=0.0), 1),
            "health_max_s": round(max(run.watch.probe_s, default=0.0), 3),
            "health_failures": run.watch.probe_failures}


def _phase(url: str, condition: str, phase_s: float, kinds: Sequence[str], padded_sndbuf: int,
           sched: str, counts: dict[str, int], pid: int | None = None) -> dict[str, Any]:
    """One phase of :func:`run_phases`: ``condition`` for ``phase_s`` s, beside the hostile
    ``kinds`` (none: alone), with their build-up (:data:`BUILD_UP_S`) before and settling
    (:data:`SETTLE_S`) after; their counts are added to ``counts``.

    Returns the phase's ``condition`` and ``kinds``; the Unix ``start`` and ``end`` of its
    measured stretch and the server's view of it (``server``: :func:`server_view`); its
    ``span`` (Unix s, from before the attack started to after it settled; the measured stretch
    for a phase alone) and over the span: the server's view (``span_server``), the
    connections it closed to keep its bounds by reason (``span_connections_closed``) and the
    requests closed connections left unanswered by stage (``span_unanswered``), the CPU seconds
    of the server (``pid``) and of other work on its core (``span_cpu_s``: ``server``,
    ``other``; :func:`cpu_seconds`), ``tailguard_rollbacks_total`` before and after
    (``rollbacks``; :func:`rollbacks`), and ``/tailguard/stats``' ``activeModel`` at the end
    (``active_model``); and the hostile ``counts`` and ``notes`` of this phase alone.

    Raises:
        RuntimeError: a hostile thread was still running after the mix was stopped.
    """
    from tailguard.bench.promview import server_view

    first, span_start, cpu = server_snapshot(url), time.time(), cpu_seconds(pid)
    hostile = None
    if kinds:
        hostile = Hostile(url, host_port(url)[1], 64, kinds, padded_sndbuf, sched)
        hostile.start()
        time.sleep(BUILD_UP_S)
    try:
        before, start = (server_snapshot(url), time.time()) if kinds else (first, span_start)
        time.sleep(phase_s)
        end, after = time.time(), server_snapshot(url)
    finally:
        if hostile is not None:
            hostile.stop()
    view = server_view(before, after) if before and after else None
    log(f"{condition}: server {_server_brief(view)}")
    last, span_end = after, end
    if hostile is not None:
        if alive := sum(thread.is_alive() for thread in hostile.threads):
            raise RuntimeError(f"{alive} hostile thread(s) still running after the mix stopped")
        for key, n in hostile.counts.items():
            counts[key] = counts.get(key, 0) + n
        if hostile.counts.get("sched_idle_refused"):
            log(f"warning: SCHED_IDLE refused for {hostile.counts['sched_idle_refused']} "
                "hostile thread(s); they ran under the normal policy")
        time.sleep(SETTLE_S)
        last, span_end = server_snapshot(url), time.time()
    cpu_now = cpu_seconds(pid)
    return {"condition": condition, "kinds": list(kinds), "start": start, "end": end,
            "server": view, "span": [span_start, span_end],
            "span_server": server_view(first, last) if first and last else None,
            "span_connections_closed": counter_increase(
                first, last, "tailguard_connections_closed_total"),
            "span_unanswered": counter_increase(first, last,
                                                "tailguard_requests_unanswered_total"),
            "span_cpu_s": None if cpu is None or cpu_now is None else {
                "server": round(cpu_now[0] - cpu[0], 2),
                "other": round(max(0.0, (cpu_now[1] - cpu[1]) - (cpu_now[0] - cpu[0])), 2)},
            "rollbacks": [rollbacks(first), rollbacks(last)], "active_model": active_model(url),
            "counts": dict(hostile.counts) if hostile else {},
            "notes": list(hostile.notes) if hostile else []}


NESTBOMB_REFUSALS = ("invalid_input", "incomplete_body", "decode_queue_full", "decode_deadline")
"""The rejection reasons a ``nestbomb`` body may get: refused by the count of arrays (422
``invalid_input``), or dropped unparsed because its client left (``incomplete_body``) or the
decode queue was full or its deadline passed before its turn."""


def attack_verdict(kind: str, counts: dict[str, int],
                   rejections: dict[str, int] | None = None) -> tuple[bool | None, str]:
    """Whether the server answered a part-3 attack (:data:`Hostile.PART3`) as it should, by the
    attack's own ``counts`` (:meth:`Hostile._bigheader` and after say what each counts), and
    a summary of them in a line; ``rejections``: the server's count of refused requests by
    reason over the attack's span (:func:`server_view`), which ``nestbomb`` is judged by.

    ``bigheader``, ``headerflood``: a 431 on every connection; ``unreadbody``: a 404 (unknown
    model) or 405 (``GET``) on every connection, each closed by the server (none ``stalled``,
    none still read at :data:`UNREAD_MAX_S`); ``oneaddress``: 503s that state the share of one
    address (the sockets held unanswered a second or more are reported, not judged: they
    include those the server has not accepted yet, which a server slowed by the machine leaves
    in its listen queue); ``pipeline``: every connection read got its answers in order
    (:func:`pipeline_fault`); ``nestbomb``, which reads nothing: the server counted every body
    sent as refused or dropped (:data:`NESTBOMB_REFUSALS`; None without ``rejections``)."""

    def by(prefix: str) -> dict[str, int]:
        return {key[len(prefix):]: n for key, n in counts.items() if key.startswith(prefix)}

    if kind in ("bigheader", "headerflood", "unreadbody"):
        variants = {"bigheader": {"bigheader": "431"},
                    "headerflood": {"headerflood_fields": "431",
                                    "headerflood_trailers": "431"},
                    "unreadbody": {"unreadbody_unknown_model": "404",
                                   "unreadbody_get": "405"}}[kind]
        ok, parts = True, []
        for key, expected in variants.items():
            answers, ends = by(f"{key}_answer_"), by(f"{key}_end_")
            n = counts.get(f"{key}_connections", 0)
            sent = counts.get(f"{key}_bytes", counts.get(f"{key}_body_bytes", 0))
            most = counts.get(f"{key}_bytes_max", counts.get(f"{key}_body_bytes_max", 0))
            ok = ok and answers.get(expected, 0) > 0 and set(answers) <= {expected, "stopped"} \
                and set(ends) <= {"closed", "stopped"}
            parts.append(f"{key}: {n} connections, answers {answers}"
                         + (f", ended {ends}" if ends else "")
                         + f", {'body ' if ends else ''}bytes sent per connection: mean "
                           f"{sent / max(n, 1):,.0f}, max {most:,}")
        return ok, "; ".join(parts)
    if kind == "oneaddress":
        answers, share = by("oneaddress_answer_"), counts.get("oneaddress_share", 0)
        held = counts.get("oneaddress_held_max", 0)
        return (answers.get("503", 0) > 0 and share > 0,
                f"{counts.get('oneaddress_opened', 0)} opened (at most "
                f"{counts.get('oneaddress_open_max', 0)} open at once, of "
                f"{counts.get('oneaddress_target', 0)} wanted), answers {answers}, share of one "
                f"address {share}, held unanswered for 1 s or more: at most {held}")
    if kind == "pipeline":
        good, bad = counts.get("pipeline_read_ok", 0), counts.get("pipeline_read_bad", 0)
        return (good > 0 and bad == 0,
                f"{good + bad} connections read: {good} with 16 x 200 in order then 400 and "
                f"close, {bad} otherwise; {counts.get('pipeline_abandoned', 0)} abandoned unread")
    if kind == "nestbomb":
        sent = counts.get("nestbomb_sent", 0)
        summary = (f"{sent} bodies sent in {counts.get('nestbomb_rounds', 0)} rounds, each "
                   "connection closed unread")
        if rejections is None:
            return None, summary
        refused = {reason: n for reason, n in rejections.items() if reason in NESTBOMB_REFUSALS}
        return (sent > 0 and sum(refused.values()) == sent,
                f"{summary}; the server refused or dropped {refused}"
                + (f" (all refusals: {rejections})" if refused != rejections else ""))
    return None, json.dumps(counts)


def attack_report(kind: str, phase: dict[str, Any], alone_phase: dict[str, Any],
                  watched: dict[str, Any], alone: dict[str, Any], beside: dict[str, Any],
                  codes: dict[str, int]) -> dict[str, Any]:
    """One part-3 attack's phase (:func:`_phase`'s entry) judged: ``gates`` (name: passed) and
    what they read: ``stall_ms`` (the bound of the event loop's longest stall over the span,
    ms; ``"+Inf"`` past the last bucket; ``stall_ms_alone``, the same in the phase alone
    before), ``core_share`` (the shares of the server's core that the server and other work
    took over each span, alone before and beside: how busy the attack kept the server, and how
    much of its core the machine's other work took), ``rss_max_mib`` and ``probes`` (``watched``:
    :meth:`Watch.during` over the span), ``good_codes`` (``codes``: the good client's answers
    by code over the span), ``rollbacks`` and ``active_model``, ``attack`` (its counts, notes
    and :func:`attack_verdict`'s summary) and the server's counts over the span; and, as a
    measurement, not a gate, ``good_p99_ms``: the good client's p99 in the phase alone before
    (``alone``) and beside the attack (``beside``), each a :func:`by_phase` entry."""
    view = phase["span_server"] or {}
    stall = view.get("event_loop_lag_ms", {}).get("max")
    failed = {code: n for code, n in codes.items() if code.isdigit() and code not in ("200", "429")}
    unanswered = {code: n for code, n in codes.items() if not code.isdigit()}
    before, after = phase["rollbacks"]
    probes = watched["probes"]
    attack_ok, summary = attack_verdict(kind, phase["counts"], view.get("rejections"))
    gates = {
        f"longest event-loop stall <= {STALL_MS:g} ms": isinstance(stall, (int, float))
        and stall <= STALL_MS,
        f"RSS under {RSS_MIB:g} MiB": watched["rss_max_mib"] is not None
        and watched["rss_max_mib"] < RSS_MIB,
        "good answers 200 (or 429 before admission)": not failed,
        "no good request unanswered": not unanswered,
        "no rollback, primary active": before is not None and after == before
        and phase["active_model"] == "primary",
        f"health probes and /metrics answered within {PROBE_SLOW_S:g} s": {
            "/v2/health/live", "/metrics"} <= set(probes) and all(
            not p["failures"] and p["max_s"] < PROBE_SLOW_S for p in probes.values()),
    }
    if attack_ok is not None:
        gates["attack answered as expected"] = attack_ok
    alone_view = alone_phase["span_server"] or {}
    return {"gates": gates, "stall_ms": stall,
            "stall_ms_alone": alone_view.get("event_loop_lag_ms", {}).get("max"),
            "core_share": {name: None if p["span_cpu_s"] is None else {
                who: round(seconds / (p["span"][1] - p["span"][0]), 3)
                for who, seconds in p["span_cpu_s"].items()}
                for name, p in (("alone", alone_phase), ("beside", phase))},
            "rss_max_mib": watched["rss_max_mib"],
            "good_codes": codes,
            "good_p99_ms": {"alone": alone["p99Ms"], "beside": beside["p99Ms"]},
            "good_p999_ms": {"alone": alone["latency_ms"].get("p99.9"),
                             "beside": beside["latency_ms"].get("p99.9")},
            "rollbacks": phase["rollbacks"], "active_model": phase["active_model"],
            "probes": probes, "attack": {"summary": summary, "counts": phase["counts"],
                                         "notes": phase["notes"]},
            "server": {"answers": view.get("requests"), "rejections": view.get("rejections"),
                       "connections_closed": phase["span_connections_closed"],
                       "unanswered": phase["span_unanswered"],
                       "event_loop_lag_ms": view.get("event_loop_lag_ms")}}


def part3(pid: int, url: str, rate: float, phase_s: float, kinds: Sequence[str],
          sched: str) -> dict[str, Any]:
    """The part-3 attacks (``kinds``, of :data:`Hostile.PART3`), one phase each, beside one good
    client at ``rate`` req/s that runs all through (:func:`run_phases`): for each attack a phase
    of ``phase_s`` s alone, then one beside the attack (with its build-up before and settling
    after), the prober reading ``/metrics`` every :data:`PROBE_METRICS_EVERY_S` s besides the
    health probes.

    Returns report entries: ``part3`` (per attack, :func:`attack_report`), ``part3_checks``
    (every gate of every attack, as ``"<attack>: <gate>"``), ``alone_pooled`` (the good
    client over every phase alone), ``good_client``, ``phases``, ``rss_max_mib``,
    ``health_max_s`` and ``health_failures`` (the whole run's, as the mix's report has them).

    Raises:
        RuntimeError: as :func:`run_phases`.
    """
    if (active := active_model(url)) != "primary":
        log(f"warning: the active model is {active!r} before the first phase (rolled back "
            "during the calibration?); every phase's rollback gate will fail")
    plan: list[tuple[str, Sequence[str]]] = [
        phase for kind in kinds for phase in ((f"alone before {kind}", ()), (kind, (kind,)))]
    run = run_phases(pid, url, rate, phase_s, plan, PADDED_SNDBUF, sched, PROBE_METRICS_EVERY_S,
                     PART3_MARGIN_S, GOOD_CONNECTIONS_PART3)
    measured = by_phase(run.requests, [(p["condition"], p["start"], p["end"])
                                       for p in run.phases])
    spans = by_phase(run.requests, [(p["condition"], *p["span"]) for p in run.phases])
    alone = by_phase(run.requests, [("alone", p["start"], p["end"]) for p in run.phases
                                    if not p["kinds"]])["alone"]
    attacks: dict[str, Any] = {}
    checks: dict[str, bool] = {}
    by_condition = {p["condition"]: p for p in run.phases}
    for kind in kinds:
        phase, alone_phase = by_condition[kind], by_condition[f"alone before {kind}"]
        attacks[kind] = entry = attack_report(
            kind, phase, alone_phase, run.watch.during(*phase["span"]),
            measured[f"alone before {kind}"], measured[kind], spans[kind]["codes"])
        checks.update({f"{kind}: {gate}": ok for gate, ok in entry["gates"].items()})
        failed = [gate for gate, ok in entry["gates"].items() if not ok]
        log(f"{kind}: stall <= {entry['stall_ms']} ms (alone before: <= "
            f"{entry['stall_ms_alone']} ms), server's core: {entry['core_share']['beside']} "
            f"(alone before: {entry['core_share']['alone']}), RSS max "
            f"{entry['rss_max_mib']} MiB, good p99 {entry['good_p99_ms']['alone']} ms alone -> "
            f"{entry['good_p99_ms']['beside']} ms beside, good codes {entry['good_codes']}; "
            f"{entry['attack']['summary']}; "
            + (f"FAILED: {', '.join(failed)}" if failed else "every gate passed"))
    # requests scheduled between two phases' spans count too
    checks["whole run: every good request answered 200 (or 429 before admission)"] = all(
        code in ("200", "429") for code in run.good["codes"])
    return {"part3": attacks, "part3_checks": checks,
            "alone_pooled": {"p99Ms": alone["p99Ms"], "codes": alone["codes"]},
            "good_client": run.good, "phases": run.phases,
            "rss_max_mib": round(max(run.watch.rss_mib, default=0.0), 1),
            "health_max_s": round(max(run.watch.probe_s, default=0.0), 3),
            "health_failures": run.watch.probe_failures}


def load_average() -> str:
    return " ".join(Path("/proc/loadavg").read_text().split()[:3])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--duration", type=float, default=60.0,
                        help="seconds of the good client alone, and as many beside the hostile "
                             "mix, over all rounds (default 60)")
    parser.add_argument("--rounds", type=int, default=6,
                        help="rounds of a phase alone and a phase beside the mix "
                             "(default 6)")
    parser.add_argument("--rates", default="100,200,400,700,1000,1400,2000,2800,4000,5600,8000",
                        help="calibration rates, req/s, rising: the service rate is the "
                             "highest met before the first that misses the SLO")
    parser.add_argument("--calibrate-seconds", type=float, default=4.0,
                        help="seconds of each calibration run (default 4)")
    parser.add_argument("--ab-rounds", type=int, default=5,
                        help="before/after pairs at 64 clients (0: skip; default 5)")
    parser.add_argument("--ab-seconds", type=float, default=6.0,
                        help="seconds of each run at 64 clients (default 6)")
    parser.add_argument("--before", default=BEFORE_ISSUE_9,
                        help="git ref of the runtime to compare req/s at 64 clients with "
                             f"(default {BEFORE_ISSUE_9}: main just before issue 9 was merged; "
                             "main: the last commit, to measure a change not yet committed)")
    parser.add_argument("--hostile", default=",".join(Hostile.KINDS),
                        help="which parts of the hostile mix run (comma-separated; default all "
                             f"of {','.join(Hostile.KINDS)}); the part-3 attacks "
                             f"({','.join(Hostile.PART3)}) may be named too")
    parser.add_argument("--part3", nargs="?", const=",".join(Hostile.PART3), metavar="KINDS",
                        help="instead of the mix's rounds: one phase alone and one beside each "
                             "part-3 attack named (comma-separated; default all), each with "
                             "its own gates; the server runs under tailguard up (with the SLO "
                             "guard) and with --hard-fd-limit")
    parser.add_argument("--attack-seconds", type=float, default=12.0,
                        help="with --part3: seconds of each phase alone and beside an attack "
                             "(default 12)")
    parser.add_argument("--hard-fd-limit", action="store_true",
                        help="also cap the server's hard open-file limit at 1,024")
    parser.add_argument("--padded-sndbuf", type=int, default=PADDED_SNDBUF, metavar="BYTES",
                        help="send buffer of the padded-body client's sockets (0: the kernel's "
                             f"own; default {PADDED_SNDBUF})")
    parser.add_argument("--hostile-sched", choices=SCHED_POLICIES, default=HOSTILE_SCHED,
                        help="scheduling policy of the hostile threads on the load core "
                             f"(default {HOSTILE_SCHED}: SCHED_IDLE)")
    parser.add_argument("--good-client", metavar="URL", help=argparse.SUPPRESS)
    parser.add_argument("--probe", metavar="URL", help=argparse.SUPPRESS)
    parser.add_argument("--probe-metrics", type=float, default=0.0, help=argparse.SUPPRESS)
    parser.add_argument("--rate", type=float, help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    parser.add_argument("--record", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--connections", type=int, default=GOOD_CONNECTIONS,
                        help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.probe:
        print(json.dumps(prober(host_port(args.probe)[1], args.duration,
                                metrics_every_s=args.probe_metrics)))
        return 0
    if args.good_client:
        out = Path(args.out)
        out.write_text(json.dumps(openloop(args.good_client, args.rate, args.duration,
                                           args.record, measuring_marker(out),
                                           args.connections)))
        return 0
    if args.rounds < 1:
        raise SystemExit("soak: --rounds must be at least 1")
    if args.ab_rounds < 0:
        raise SystemExit("soak: --ab-rounds must be 0 (skip) or more")
    if args.padded_sndbuf < 0:
        raise SystemExit("soak: --padded-sndbuf must be 0 (the kernel's own) or a size in bytes")
    kinds = [k for k in args.hostile.split(",") if k]
    if unknown := set(kinds) - set(Hostile.KINDS + Hostile.PART3):
        raise SystemExit(f"soak: unknown --hostile {sorted(unknown)}; "
                         f"choose from {','.join(Hostile.KINDS + Hostile.PART3)}")
    attacks = [k for k in (args.part3 or "").split(",") if k]
    if args.part3 is not None and (not attacks or set(attacks) - set(Hostile.PART3)):
        raise SystemExit(f"soak: --part3 takes some of {','.join(Hostile.PART3)}, "
                         f"not {args.part3!r}")
    if args.attack_seconds <= 0:
        raise SystemExit("soak: --attack-seconds must be positive")
    if args.ab_rounds and subprocess.run(
            ["git", "-C", str(REPO), "cat-file", "-e", f"{args.before}^{{commit}}"],
            capture_output=True).returncode != 0:
        raise SystemExit(f"soak: --before {args.before} is not a commit of this clone (a "
                         "shallow clone?): fetch its history, or pass --before main or "
                         "--ab-rounds 0")
    if shutil.which("taskset") is None or (os.cpu_count() or 1) < 2:
        raise SystemExit("soak: needs taskset and 2 cores")
    global HARD_FD_LIMIT
    # part 3: a connection cap of 768, so that one address's share (192) is within the reach
    # of oneaddress's 3,000 sockets (the runtime would raise its soft limit to the hard one)
    HARD_FD_LIMIT = args.hard_fd_limit or bool(attacks)
    os.sched_setaffinity(0, {LOAD_CPU})
    resource.setrlimit(resource.RLIMIT_NOFILE, (8192, max(8192, resource.getrlimit(
        resource.RLIMIT_NOFILE)[1])))
    report: dict[str, Any] = {"load_average_start": load_average()}
    config = digits_config()
    slo_ms = float(config["slo"]["p99LatencyMs"])
    with tempfile.TemporaryDirectory(prefix="tailguard-soak-") as tmp:
        workdir = Path(tmp)
        spec = REPO / "examples" / "digits.yaml" if attacks else None
        with runtime(config, workdir, str(REPO / "runtime"), fd_limit=True,
                     spec=spec) as (proc, url):
            rates = [float(r) for r in args.rates.split(",")]
            service = calibrate(url, slo_ms, rates, args.calibrate_seconds)
            good_rate = service / 2
            report.update(service_rate_at_slo=service, good_rate=good_rate,
                          padded_sndbuf=args.padded_sndbuf, hostile_sched=args.hostile_sched)
            if attacks:
                report.update(phase_s=args.attack_seconds, **part3(
                    proc.pid, url, good_rate, args.attack_seconds, attacks, args.hostile_sched))
            else:
                phase_s = args.duration / args.rounds
                report.update(phase_s=phase_s, **phased(proc.pid, url, good_rate, phase_s,
                                                        args.rounds, kinds, args.padded_sndbuf,
                                                        args.hostile_sched))
        if args.ab_rounds:
            report["req_s_64_clients"] = before_after(workdir, args.before, args.ab_rounds,
                                                      args.ab_seconds)
    report["load_average_end"] = load_average()
    # the generator's verdict: when it fired, its latencies are partly its own, not the server's
    report["generator_invalid"] = report["good_client"]["invalid"]
    checks = dict(report["part3_checks"]) if attacks else mix_checks(report, slo_ms)
    if "req_s_64_clients" in report:
        checks["req/s at 64 clients >= 95% of before"] = report["req_s_64_clients"]["ratio"] >= 0.95
    report["checks"] = checks
    print(json.dumps(report, indent=2))
    for name, ok in checks.items():
        log(f"{'PASS' if ok else 'FAIL'} {name}")
    return 0 if all(checks.values()) else 1


def mix_checks(report: dict[str, Any], slo_ms: float) -> dict[str, bool]:
    """The bounds of a run beside the hostile mix (:func:`phased`'s entries in ``report``),
    by name; ``slo_ms``: the SLO's p99, ms."""
    alone, beside = report["alone"], report["hostile"]
    # every request of the run counts here, those of the build-up and settling stretches too
    unanswered = sum(n for code, n in report["good_client"]["codes"].items()
                     if code not in ("200", "429"))
    checks = {
        "p99 within 2x alone": (beside["p99Ms"] or 1e9) <= 2 * (alone["p99Ms"] or 0),
        "p99 within SLO": (beside["p99Ms"] or 1e9) <= slo_ms,
        "RSS under 1 GiB": report["rss_max_mib"] < 1024,
        "health probes under 1 s": report["health_max_s"] < 1.0 and not report["health_failures"],
        "no admitted request unanswered": unanswered == 0,
        "good client's generator valid (lag, CPU)": not report["generator_invalid"],
    }
    return checks


if __name__ == "__main__":
    sys.exit(main())
