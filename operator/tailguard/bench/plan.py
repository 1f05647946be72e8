"""The pure arithmetic of a load test: arrival schedules, percentiles, the run's verdict, sweeps.

Everything here is a function of plain data (seconds, counts, latencies in seconds), with no clock
reads and no I/O, so the load generator (:mod:`tailguard.bench.loadgen`), ``tailguard bench``
and the benchmarks share one definition of what was measured and when a run is not to be trusted.
The generator that sends the requests lives in :mod:`~tailguard.bench.loadgen`; the server's own
view from ``/metrics`` in :mod:`~tailguard.bench.promview`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Sequence

import numpy as np

from tailguard._util.stats import nearest_rank

MAX_LAG_P99_MS = 1.0
"""A run without an SLO to judge against is invalid when its p99 schedule lag exceeds this many
ms: the generator did not send on time, so the latencies it reports are partly its own."""
LAG_SLO_SHARE = 0.1
"""With an SLO, a run is invalid when its p99 schedule lag exceeds this share of it (at least
:data:`MAX_LAG_P99_MS`): 5 ms against a 50 ms SLO. A few ms late against a 50 ms promise says
nothing about the server; a tenth of the SLO is enough to make a miss the generator's."""
MAX_CPU_SHARE = 0.90
"""A run whose generator used more than this share of one core is invalid: it was saturated."""
MAX_FAILED_SHARE = 0.01
"""A rate holds its SLO only if at most this share of the requests sent failed or were refused
(the SLO guard's default ``maxErrorRate``, see the README)."""
PERCENTILES = (50.0, 90.0, 95.0, 99.0, 99.9)
"""The latency percentiles every report carries."""
ISSUE_AHEAD_S = 0.003
"""Open loop: one timer tick issues every request due within this many seconds of now, so a
tick that fires up to 2 ms late (one timer step plus a busy loop iteration) still sends on time.
A request issued early has its latency counted from its actual send, never from before it."""
TICK_MIN_S = 0.001
"""Open loop: the shortest wait between two timer ticks, s. libuv's clock, and so uvloop's
timers, count whole milliseconds: a shorter wait rounds to zero and the loop would spin, calling
the tick tens of thousands of times a second with nothing due (it cost 60% of the generator's
CPU at 10,000 req/s before this floor)."""


@dataclass(frozen=True)
class ClosedLoop:
    """``concurrency`` clients, each on its own keep-alive connection, each sending its next
    request as soon as the answer to the previous one is in. Latency counts from the send."""

    concurrency: int


@dataclass(frozen=True)
class OpenLoop:
    """Requests arrive at ``rate`` per second whatever the answers, as users do: Poisson
    arrivals (exponential gaps, ``poisson=True``) or evenly spaced ones. Latency counts from each
    request's *scheduled* send time, so a client-side wait (a stalled server holding every
    connection) is part of the latency and cannot hide the tail."""

    rate: float
    poisson: bool = True
    seed: int = 0


Schedule = ClosedLoop | OpenLoop


@dataclass(frozen=True)
class Bounds:
    """What ends a run. Seconds throughout.

    ``warmup_s`` of load are sent and discarded, then ``duration_s`` are measured; at most
    ``max_requests`` requests are sent (warm-up included); a request unanswered after
    ``timeout_s`` is an error; at most ``max_connections`` connections are open at once (open
    loop: beyond it, requests wait in the client for a free connection, their latency running).
    ``max_lag_p99_ms`` is the validity limit on the p99 schedule lag (:func:`judge`); raise it
    only to study a machine known to be shared: the run then reports the lag it had.
    """

    duration_s: float = 10.0
    warmup_s: float = 2.0
    max_requests: int = 1_000_000
    timeout_s: float = 10.0
    max_connections: int = 256
    max_lag_p99_ms: float = MAX_LAG_P99_MS

    def __post_init__(self) -> None:
        rules = (("duration_s", self.duration_s > 0, "> 0"),
                 ("warmup_s", self.warmup_s >= 0, ">= 0"),
                 ("max_requests", self.max_requests >= 1, ">= 1"),
                 ("timeout_s", self.timeout_s > 0, "> 0"),
                 ("max_connections", self.max_connections >= 1, ">= 1"),
                 ("max_lag_p99_ms", self.max_lag_p99_ms > 0, "> 0"))
        for name, ok, need in rules:
            if not ok:
                raise ValueError(f"{name} must be {need}, got {getattr(self, name)}")


def arrival_offsets(schedule: OpenLoop, horizon_s: float, max_requests: int) -> np.ndarray:
    """Send times of an open-loop schedule, in seconds from its start, float64 ``(n,)``, sorted.

    Every arrival before ``horizon_s``, at most ``max_requests``. Poisson arrivals have
    exponential gaps of mean ``1 / rate`` drawn from ``numpy.random.default_rng(seed)``; even
    arrivals are ``i / rate``. Raises ValueError for a rate that is not positive.
    """
    rate = schedule.rate
    if not rate > 0 or not math.isfinite(rate):
        raise ValueError(f"rate must be a positive number of requests per second, got {rate}")
    expected = rate * horizon_s
    n = int(min(max_requests, math.ceil(expected + 6 * math.sqrt(expected) + 16)))
    if schedule.poisson:
        gaps = np.random.default_rng(schedule.seed).exponential(1.0 / rate, n)
        offsets = np.cumsum(gaps) - gaps[0]  # the first request leaves at once
    else:
        offsets = np.arange(n, dtype=np.float64) / rate
    inside: np.ndarray = offsets[offsets < horizon_s]
    return inside


def next_tick_in(next_due_s: float, now_s: float) -> float:
    """Seconds to wait before the open-loop timer's next tick, given the next unsent request's
    scheduled time ``next_due_s`` and the clock ``now_s`` (both s, same clock): early enough to
    issue it :data:`ISSUE_AHEAD_S` ahead, and never less than :data:`TICK_MIN_S`."""
    return max(TICK_MIN_S, next_due_s - ISSUE_AHEAD_S - now_s)


def parse_rates(text: str) -> list[float]:
    """``"R"`` -> ``[R]``; ``"A:B:STEP"`` -> ``[A, A+STEP, ...]`` up to ``B`` included.

    Raises ValueError naming the problem (not a number, a rate <= 0, STEP <= 0, B < A, or
    more than 100 steps).
    """
    parts = text.split(":")
    try:
        values = [float(p) for p in parts]
    except ValueError:
        raise ValueError(f"--rate {text!r}: expected R or A:B:STEP in requests per second")
    if len(values) == 1:
        if not values[0] > 0:
            raise ValueError(f"--rate {text!r}: the rate must be > 0")
        return values
    if len(values) != 3:
        raise ValueError(f"--rate {text!r}: expected R or A:B:STEP in requests per second")
    low, high, step = values
    if not (low > 0 and step > 0 and high >= low):
        raise ValueError(f"--rate {text!r}: need 0 < A <= B and STEP > 0")
    count = int(math.floor((high - low) / step + 1e-9)) + 1
    if count > 100:
        raise ValueError(f"--rate {text!r}: {count} steps; at most 100")
    return [round(low + k * step, 6) for k in range(count)]


def percentiles_ms(latencies_s: Sequence[float] | np.ndarray) -> dict[str, float | None]:
    """Nearest-rank percentiles (:data:`PERCENTILES`, :func:`tailguard._util.stats.nearest_rank`)
    and the max of latencies given in seconds,
    in ms, keyed ``p50``, ``p90``, ``p95``, ``p99``, ``p99.9``, ``max``; all None when empty.

    Nearest rank (the smallest value with at least q% of the values at or below it) never
    interpolates, so each is a latency some request really had, and they are ordered.
    """
    values = np.sort(np.asarray(latencies_s, dtype=np.float64))
    keys = [f"p{q:g}" for q in PERCENTILES] + ["max"]
    if values.size == 0:
        return dict.fromkeys(keys, None)
    out: dict[str, float | None] = {}
    for q, key in zip(PERCENTILES, keys):
        out[key] = round(nearest_rank(values, q) * 1e3, 3)
    out["max"] = round(float(values[-1]) * 1e3, 3)
    return out


@dataclass
class LoadResult:
    """What one run measured over its measured window (warm-up excluded).

    Counts: ``sent`` requests whose send time was scheduled (open loop) or taken (closed loop)
    inside the window; each ends as exactly one of ``ok`` (HTTP 200), ``rejected_429``,
    ``http_errors`` (other statuses, by code) or ``transport_errors`` (``timeout``: no answer in
    time or still unanswered when the run ended; ``connection``: the connection closed under the
    request; ``bad_response``), so ``ok + rejected_429 + sum(http_errors) +
    sum(transport_errors) == sent``. Latency percentiles (ms) are over the 200 answers.
    ``schedule_lag`` (ms, open loop only) is how late the generator issued requests against
    their schedule; ``client_wait`` (ms) how long they then waited in the client for a
    connection; ``generator_cpu`` is the generator's CPU seconds per wall second of the window.
    ``latencies_s`` holds every 200 answer's latency (s, in completion order) for callers that
    need more than the percentiles; ``records`` (when asked for) one dict per request of the
    window in scheduled order: ``scheduled``, ``sent`` (latency start) and ``done`` in Unix
    seconds, ``status`` (0 for a transport error, then ``error`` names it), ``role`` and
    ``model`` (the ``X-Tailguard-Role`` and ``X-Tailguard-Model`` answer headers, None when
    absent). :meth:`as_dict` leaves both out. ``interrupted``: Ctrl-C ended the window early
    (``window_s`` is what ran).
    """

    mode: str
    offered_rps: float | None
    concurrency: int | None
    window_s: float
    rows_per_request: int
    sent: int = 0
    ok: int = 0
    rejected_429: int = 0
    http_errors: dict[str, int] = field(default_factory=dict)
    transport_errors: dict[str, int] = field(default_factory=dict)
    latency_ms: dict[str, float | None] = field(default_factory=dict)
    schedule_lag_ms: dict[str, float | None] = field(default_factory=dict)
    client_wait_ms: dict[str, float | None] = field(default_factory=dict)
    connections_opened: int = 0
    generator_cpu: float = 0.0
    server: dict[str, Any] | None = None
    invalid: list[str] = field(default_factory=list)
    latencies_s: np.ndarray = field(default_factory=lambda: np.empty(0), repr=False)
    records: list[dict[str, Any]] | None = field(default=None, repr=False)
    interrupted: bool = False

    @property
    def achieved_rps(self) -> float:
        """200 answers per second of window (0 for a window cut before it began)."""
        return self.ok / self.window_s if self.window_s > 0 else 0.0

    @property
    def errors(self) -> int:
        """Every request of the window that did not get a 200, 429s included."""
        return self.sent - self.ok

    @property
    def valid(self) -> bool:
        """False when the generator itself limited the run (see :func:`judge`)."""
        return not self.invalid

    def as_dict(self) -> dict[str, Any]:
        """A JSON-ready dict: every field, plus ``achieved_rps``, ``rows_per_s``, ``valid``."""
        out = dict(self.__dict__)
        del out["latencies_s"], out["records"]
        out.update(achieved_rps=round(self.achieved_rps, 1),
                   rows_per_s=round(self.achieved_rps * self.rows_per_request, 1),
                   valid=self.valid, generator_cpu=round(self.generator_cpu, 3))
        return out


def lag_limit_ms(slo_ms: float | None, given: float | None = None) -> float:
    """The p99 schedule lag (ms) a run may have and stay valid: ``given`` (``--max-lag-ms``)
    when set; else :data:`LAG_SLO_SHARE` of ``slo_ms`` (at least :data:`MAX_LAG_P99_MS`); else,
    without an SLO, :data:`MAX_LAG_P99_MS`."""
    if given is not None:
        return given
    if slo_ms is None:
        return MAX_LAG_P99_MS
    return max(MAX_LAG_P99_MS, LAG_SLO_SHARE * slo_ms)


def judge(schedule_lag_ms: dict[str, float | None], generator_cpu: float,
          max_lag_p99_ms: float = MAX_LAG_P99_MS) -> list[str]:
    """Why a run cannot be reported as the server's latency (empty: it can).

    ``schedule_lag_ms`` as in :class:`LoadResult` (its ``p99`` None for a closed loop, which has
    no schedule); ``generator_cpu`` in cores. Limits: ``max_lag_p99_ms`` (default
    :data:`MAX_LAG_P99_MS`) and :data:`MAX_CPU_SHARE`.
    """
    reasons = []
    lag = schedule_lag_ms.get("p99")
    if lag is not None and lag > max_lag_p99_ms:
        reasons.append(f"p99 schedule lag {lag:.2f} ms > {max_lag_p99_ms:g} ms: the generator "
                       "could not send on time")
    if generator_cpu > MAX_CPU_SHARE:
        reasons.append(f"generator CPU {100 * generator_cpu:.0f}% > {100 * MAX_CPU_SHARE:.0f}% "
                       "of a core: the generator was saturated")
    return reasons


def holds_slo(result: LoadResult, slo_ms: float) -> bool:
    """True when a run met the SLO: p99 of the 200 answers at most ``slo_ms``, and at most
    :data:`MAX_FAILED_SHARE` of the requests sent not answered 200 (shedding with 429s does not
    count as meeting it). A run the generator limited (:func:`judge`) still holds: latency
    counts from each request's scheduled time, so a generator sending late or short of CPU only
    makes latencies longer, never shorter; a run within the SLO despite it is conclusive."""
    p99 = result.latency_ms.get("p99")
    return (result.sent > 0 and p99 is not None and p99 <= slo_ms
            and result.errors <= MAX_FAILED_SHARE * result.sent)


def outcome(result: LoadResult, slo_ms: float) -> str:
    """``"held"`` (:func:`holds_slo`, whatever the generator did), ``"invalid"`` (it missed the
    SLO while the generator limited the run: inconclusive, the miss may be the generator's) or
    ``"broke"`` (it missed the SLO in a valid run)."""
    if holds_slo(result, slo_ms):
        return "held"
    return "broke" if result.valid else "invalid"


@dataclass(frozen=True)
class SweepVerdict:
    """The outcome of a rate sweep: ``rate_at_slo`` is the highest rate (req/s) that held the
    SLO before the first that did not (None: not even the first held); ``stopped_at`` the rate
    the sweep stopped at (None: every rate held); ``reason`` one line saying why."""

    rate_at_slo: float | None
    stopped_at: float | None
    reason: str


def sweep_verdict(rates: Sequence[float], outcomes: Sequence[str], *,
                  interrupted_at: float | None = None) -> SweepVerdict:
    """Judge a sweep from the rates run so far, in order, and their :func:`outcome`.

    The sweep stops at the first rate that did not hold (it broke the SLO, or the run was
    invalid, which says nothing about the server), so the rate at SLO is the one before it.
    ``interrupted_at``: the rate whose run Ctrl-C cut short (after ``rates``); it is not judged.
    """
    if interrupted_at is not None:
        held = sweep_verdict(rates, outcomes)
        if held.stopped_at is None:
            why = f"interrupted at {interrupted_at:g} req/s"
            if held.rate_at_slo is not None:
                why += f"; {held.rate_at_slo:g} req/s was the last rate that held"
            return SweepVerdict(held.rate_at_slo, interrupted_at, why)
        return held
    last_ok: float | None = None
    for rate, result in zip(rates, outcomes):
        if result != "held":
            why = (f"{rate:g} req/s broke the SLO" if result == "broke" else
                   f"{rate:g} req/s missed the SLO while the generator could not send on "
                   "time: inconclusive (invalid run)")
            if last_ok is not None:
                why += f"; {last_ok:g} req/s was the last rate that held"
            return SweepVerdict(last_ok, rate, why)
        last_ok = rate
    return SweepVerdict(last_ok, None, f"every rate up to {last_ok:g} req/s held the SLO"
                        if last_ok is not None else "no rate run")
