"""``tailguard tune FILE.yaml``: choose the batch policy with the most throughput inside the SLO.

First the raw model, in process (:mod:`tailguard.tune.rawtable`): per-call latency and rows/s at batch 1, 8,
32, 128 and 512. Then a grid of ``maxBatchSize`` x ``maxWaitMs`` drawn from that table
(:func:`~tailguard.tune.grid.build_grid`), each point served by its own ``tailguard up`` (the file with
only its ``batching`` values changed) and measured with ``tailguard bench``'s open-loop
generator: at the target rate (``--rate``), or, without it, at doubling rates until the SLO
breaks (the point's rate at SLO). :func:`~tailguard.tune.grid.choose` picks the policy and says why; the
plot (:mod:`tailguard.tune.plot`) and ``--write`` (:mod:`tailguard.spec.yamledit`) follow. The whole run stays inside
``--budget`` seconds: a point that would not fit is skipped and named.

Exit codes: 0 a policy met the SLO; 1 none did (the closest is named), or its models or its
rows cannot be used; 2 bad arguments, or a spec that cannot be read or is invalid; 130 on
Ctrl-C.
"""

from __future__ import annotations

import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import numpy as np

from tailguard.bench.plan import LoadResult, OpenLoop, outcome
from tailguard.bench.serving import Unusable, measure, start
from tailguard.spec.resource import InferenceService
from tailguard.tune import DEFAULT_BUDGET_S
from tailguard.tune.grid import Choice, Grid, PointResult, Policy, build_grid, choose
from tailguard.tune.rawtable import BATCH_SIZES, RawRow, raw_table
from tailguard.up.child import UpProcess

SWEEP_START_RPS = 25.0
"""Without ``--rate``: a point's first rate (requests/s); each next rate doubles, up to the raw
table's rows/s at its batch size (the model thread's ceiling). Low, because HTTP and a busy
machine cost far more than the model call; later points skip the rates below half the best
rate at SLO found so far."""
START_S = 5.0
"""What starting the points' ``tailguard up`` processes is assumed to cost (s) before the first
start is measured."""
END_S = 5.0
"""Seconds of the budget kept for what follows the last point (stopping it, the plot)."""
START_AHEAD = 4
"""Points whose ``tailguard up`` start together, before any of them is measured: starting is
import- and training-bound and uses every core, while a started process waits idle (a status
line and an SLO guard tick per window) until its turn."""


@dataclass(frozen=True)
class TuneOptions:
    """The command line. Seconds and ms in the names; ``rate`` in requests/s (None: find each
    point's rate at SLO)."""

    rate: float | None = None
    budget_s: float = DEFAULT_BUDGET_S
    point_s: float = 10.0
    warmup_s: float = 2.0
    table_s: float = 1.0
    grid_batches: int = 3
    grid_waits: int = 2
    batch_sizes: tuple[int, ...] = ()
    waits_ms: tuple[int, ...] = ()
    max_lag_ms: float | None = None
    """The validity limit on the p99 schedule lag (ms); ``None``: a tenth of the SLO
    (:func:`tailguard.bench.plan.lag_limit_ms`)."""


@dataclass
class TuneResult:
    """What a run measured and chose; ``skipped`` names the points the budget left out."""

    table: list[RawRow]
    grid: Grid
    points: list[PointResult] = field(default_factory=list)
    skipped: list[Policy] = field(default_factory=list)
    choice: Choice | None = None


Show = Callable[[str], Any]
"""Starts one load run's progress display: ``show(label)`` returns its ``on_progress``."""


def tune(isvc: InferenceService, text: str, rows: np.ndarray, run_model: Callable[..., Any],
         opts: TuneOptions, show: Show, *, started: float | None = None) -> TuneResult:
    """Measure the raw table, build the grid, serve and measure every point within the budget,
    and choose. ``text`` is the spec file's text (each point serves it with only its batching
    changed); ``run_model`` the primary's in-process call (``X (n, features) -> outputs``);
    ``started`` when the budget began (``time.monotonic()``; default now). The points stop
    :data:`END_S` before the budget ends, which leaves the caller time to plot and write.

    Raises:
        Unusable: an explicit batch size or wait that the CRD refuses for this spec.
        ServeFailed: a point's ``tailguard up`` did not start.
    """
    started = time.monotonic() if started is None else started
    deadline = started + opts.budget_s - END_S
    table = raw_table(run_model, rows, BATCH_SIZES, seconds=opts.table_s)
    slo_ms = float(isvc.slo.p99_latency_ms)
    grid = build_grid(table, slo_ms, isvc.batching.max_queue_size,
                      n_batches=opts.grid_batches, n_waits=opts.grid_waits)
    if opts.batch_sizes or opts.waits_ms:
        grid = Grid(opts.batch_sizes or grid.batches, opts.waits_ms or grid.waits,
                    "as given on the command line")
    result = TuneResult(table, grid)
    specs = [(p, point_spec(text, p)) for p in grid.policies]  # refuse bad points up front
    run_s = opts.warmup_s + opts.point_s + 1.0
    start_cost = START_S
    live: list[UpProcess] = []
    stopping: list[threading.Thread] = []
    with tempfile.TemporaryDirectory(prefix="tailguard-tune-") as tmp:
        try:
            k = 0
            while k < len(specs):
                left_s = deadline - time.monotonic() - start_cost
                fit = min(int(left_s // run_s), START_AHEAD, len(specs) - k)
                if fit < 1:
                    break
                t0 = time.monotonic()
                live = _start_all([_write(Path(tmp), j, specs[j][1]) for j in range(k, k + fit)])
                start_cost = time.monotonic() - t0
                for up in list(live):
                    if time.monotonic() + run_s > deadline:
                        break  # the started processes that are left are stopped below
                    policy = specs[k][0]
                    k += 1
                    for thread in stopping:
                        thread.join()  # measure with nothing else of ours busy
                    held = [p.throughput_rps for p in result.points if p.meets_slo]
                    rates = ([opts.rate] if opts.rate is not None else
                             sweep_rates(table, policy.max_batch_size, max(held, default=0) / 2))
                    runs = measure_policy(isvc, up.base, rows, rates, opts, show,
                                          f"{k}/{len(specs)} {policy.label()}",
                                          until=deadline)
                    live.remove(up)
                    stopping.append(threading.Thread(target=up.stop, name=f"stop point {k}"))
                    stopping[-1].start()
                    result.points.append(point_result(policy, runs, slo_ms))
                if live:
                    break
            result.skipped = [p for p, _ in specs[k:]]
        finally:
            for up in live:
                up.stop()
            for thread in stopping:
                thread.join()
    result.choice = choose(result.points, slo_ms)
    return result


def _write(folder: Path, k: int, text: str) -> Path:
    path = folder / f"point-{k}.yaml"
    path.write_text(text)
    return path


def _start_all(specs: list[Path]) -> list[UpProcess]:
    """Start one ``tailguard up`` per spec, all at once (their imports and model training use
    every core), and return them in order once all are ready; stops the started ones if one
    fails (ServeFailed)."""
    with ThreadPoolExecutor(max_workers=len(specs)) as pool:
        futures = [pool.submit(start, spec) for spec in specs]
    ready: list[UpProcess] = []
    failed: BaseException | None = None
    for future in futures:
        try:
            ready.append(future.result())
        except BaseException as exc:  # noqa: BLE001 - re-raised once the others are stopped
            failed = failed or exc
    if failed is not None:
        for up in ready:
            up.stop()
        raise failed
    return ready


def point_spec(text: str, policy: Policy) -> str:
    """The spec file's ``text`` with only ``spec.batching`` set to ``policy``, checked as the
    API server would check it.

    Raises:
        Unusable: the CRD refuses that policy for this spec (e.g. ``maxWaitMs`` not below the
            SLO, ``maxBatchSize`` over ``maxQueueSize``), naming the field.
    """
    from tailguard.spec.resource import find_object, parse
    from tailguard.spec.schema import SpecError
    from tailguard.spec.yamledit import set_batching

    changed = set_batching(text, {"maxBatchSize": policy.max_batch_size,
                                  "maxWaitMs": policy.max_wait_ms})
    try:
        parse(find_object(changed))
    except SpecError as exc:
        raise Unusable(f"{policy.label()} is refused for this spec: {exc.errors[0]}") from None
    return changed


def sweep_rates(table: list[RawRow], batch: int, floor_rps: float = 0.0) -> list[float]:
    """Rates (requests/s) doubling from :data:`SWEEP_START_RPS` up to the rows/s at ``batch``
    (the nearest table row at or below it), without those below ``floor_rps``; at least one."""
    ceiling = max((r for r in table if r.batch <= batch), key=lambda r: r.batch,
                  default=table[0]).rows_per_s
    rates, rate = [], SWEEP_START_RPS
    while rate <= ceiling:
        rates.append(rate)
        rate *= 2
    kept = [r for r in rates if r >= floor_rps]
    return kept or rates[-1:] or [SWEEP_START_RPS]


def measure_policy(isvc: InferenceService, base: str, rows: np.ndarray, rates: list[float],
                   opts: TuneOptions, show: Show, label: str, *,
                   until: float) -> list[LoadResult]:
    """Load the service served at ``base`` with each rate in turn (open loop, ``opts.point_s``
    measured after ``opts.warmup_s``) until one does not hold the SLO, or until a next run would
    end after ``until`` (``time.monotonic()`` seconds; the first run always happens)."""
    from tailguard.bench.plan import Bounds, lag_limit_ms

    slo_ms = float(isvc.slo.p99_latency_ms)
    bounds = Bounds(opts.point_s, opts.warmup_s, timeout_s=isvc.batching.timeout_ms / 1000 + 1,
                    max_lag_p99_ms=lag_limit_ms(slo_ms, opts.max_lag_ms))
    runs: list[LoadResult] = []
    for rate in rates:
        if runs and time.monotonic() + opts.warmup_s + opts.point_s > until:
            break
        runs.append(measure(base, isvc.name, rows, OpenLoop(rate), bounds,
                            show(f"{label} at {rate:g} req/s")))
        if outcome(runs[-1], slo_ms) != "held":
            break
    return runs


def point_result(policy: Policy, runs: list[LoadResult], slo_ms: float) -> PointResult:
    """The point's result: its last run that held the SLO (the rate at SLO), else its first."""
    held = [r for r in runs if outcome(r, slo_ms) == "held"]
    best = held[-1] if held else runs[0]
    lat = best.latency_ms
    note = ""
    if not held:
        p99 = lat.get("p99")
        note = ("; ".join(best.invalid) if best.invalid else
                f"{best.errors} of {best.sent} requests not answered 200" if p99 is None
                or p99 <= slo_ms else f"p99 {p99:.1f} ms over the {slo_ms:g} ms SLO")
        if best.errors and p99 is not None and p99 > slo_ms:
            note += f"; {best.errors} of {best.sent} requests not answered 200"
    elif len(runs) > len(held):
        stop = runs[len(held)]
        note = (f"{stop.offered_rps:g} req/s broke it" if outcome(stop, slo_ms) == "broke"
                else f"{stop.offered_rps:g} req/s was not a valid run: {'; '.join(stop.invalid)}")
    return PointResult(policy, best.achieved_rps, lat.get("p50"), lat.get("p95"), lat.get("p99"),
                       bool(held), note, {"runs": [_run_dict(r) for r in runs]},
                       invalid=not held and outcome(best, slo_ms) == "invalid")


def _run_dict(r: LoadResult) -> dict[str, Any]:
    doc = r.as_dict()
    doc.pop("latencies_s", None)
    return doc


def as_json(result: TuneResult, plot: str | None, written: bool) -> dict[str, Any]:
    """The run for ``--json``: the raw table, the grid, every point, the choice."""
    choice = result.choice
    return {
        "rawTable": [r.as_dict() for r in result.table],
        "grid": {"maxBatchSize": list(result.grid.batches), "maxWaitMs": list(result.grid.waits),
                 "reason": result.grid.reason},
        "points": [p.as_dict() for p in result.points],
        "skipped": [{"maxBatchSize": p.max_batch_size, "maxWaitMs": p.max_wait_ms}
                    for p in result.skipped],
        "choice": None if choice is None else {
            "ok": choice.ok, "reason": choice.reason,
            "chosen": None if choice.chosen is None else choice.chosen.as_dict(),
            "closest": None if choice.closest is None else choice.closest.as_dict()},
        "plot": plot, "written": written}
