"""The ``tailguard tune`` command line: arguments, progress, output, ``--write``.

A thin shell over :func:`tailguard.tune.search.tune` (see that module for what is measured and the exit codes).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from tailguard.cli.extras import require
from tailguard.cli.options import add_load_window, add_max_lag, add_rows, add_table_seconds


def add_parser(sub: Any) -> None:
    """Register ``tune`` on the ``tailguard`` subcommands."""
    from tailguard.tune import DEFAULT_BUDGET_S

    text = "choose the batch policy with the most throughput inside the SLO, by measuring it"
    cmd = sub.add_parser("tune", help=text, description=(
        "Time the model in process at batch 1, 8, 32, 128 and 512, then serve a grid of "
        "maxBatchSize x maxWaitMs drawn from that table with tailguard up, measure each point "
        "with tailguard bench's open-loop generator (at --rate, or at doubling rates until its "
        "p99 breaks the SLO), and pick the policy with the highest throughput whose p99 stays "
        "within slo.p99LatencyMs. Exits 1 when no point meets the SLO."))
    cmd.add_argument("file", help="InferenceService YAML, as given to kubectl apply")
    cmd.add_argument("--rate", type=float,
                     help="measure every point at this many requests/s (default: find each "
                          "point's rate at SLO)")
    cmd.add_argument("--budget", type=float, default=DEFAULT_BUDGET_S,
                     help=f"seconds the whole run may take (default {DEFAULT_BUDGET_S:g}); "
                          "points that would not fit are skipped and named")
    add_load_window(cmd, duration_s=10.0, warmup_s=2.0)
    add_table_seconds(cmd, 1.0)
    cmd.add_argument("--grid", default="3x2", metavar="BxW",
                     help="grid size drawn from the table: B batch sizes x W waits (default 3x2)")
    cmd.add_argument("--batch-sizes", default="", metavar="N,N,...",
                     help="serve these maxBatchSize values instead of the table's choice")
    cmd.add_argument("--waits-ms", default="", metavar="MS,MS,...",
                     help="serve these maxWaitMs values instead of the table's choice")
    add_rows(cmd)
    add_max_lag(cmd)
    cmd.add_argument("--plot", help="where to write the PNG (default <name>-tune.png)")
    cmd.add_argument("--write", action="store_true",
                     help="set the chosen maxBatchSize and maxWaitMs in FILE, keeping the rest "
                          "of it (comments, order, layout) byte for byte")
    cmd.add_argument("--json", action="store_true",
                     help="print the grid and the choice as one JSON object")
    cmd.set_defaults(func=run)


def _ints(text: str, flag: str) -> tuple[int, ...]:
    try:
        values = tuple(int(v) for v in text.split(",") if v.strip())
    except ValueError:
        raise ValueError(f"{flag}: expected comma-separated integers, got {text!r}") from None
    if any(v < 0 for v in values):
        raise ValueError(f"{flag}: values must be >= 0")
    return values


def _options(args: argparse.Namespace) -> Any:
    from tailguard.tune.search import TuneOptions

    try:
        b, w = (int(v) for v in args.grid.lower().split("x"))
    except ValueError:
        raise ValueError(f"--grid: expected BxW such as 3x2, got {args.grid!r}") from None
    if b < 1 or w < 1:
        raise ValueError("--grid: both sizes must be >= 1")
    if args.rate is not None and args.rate <= 0:
        raise ValueError("--rate must be > 0")
    if args.budget <= 0 or args.duration <= 0 or args.warmup < 0 or args.table_seconds <= 0:
        raise ValueError("--budget, --duration and --table-seconds must be > 0, --warmup >= 0")
    return TuneOptions(args.rate, args.budget, args.duration, args.warmup, args.table_seconds,
                       b, w, _ints(args.batch_sizes, "--batch-sizes"),
                       _ints(args.waits_ms, "--waits-ms"), args.max_lag_ms)


def run(args: argparse.Namespace) -> int:
    """Run ``tailguard tune``; returns the exit code."""
    import time

    if not require("tune", "tools"):
        return 1
    started = time.monotonic()  # the budget counts the models' load and the raw table too
    try:
        opts = _options(args)
    except ValueError as exc:
        print(f"tailguard tune: {exc}", file=sys.stderr)
        return 2
    from tailguard.bench.serving import (
        ServeFailed,
        Unusable,
        load_models,
        read_service,
        service_rows,
    )
    from tailguard.cli import view
    from tailguard.spec.yamledit import set_batching
    from tailguard.tune.plot import plot_tune
    from tailguard.tune.rawtable import markdown
    from tailguard.tune.search import as_json, tune

    try:
        isvc, text = read_service(args.file)
        primary = load_models(isvc)["primary"]  # both load: a pair up would refuse fails here
        rows, _ = service_rows(isvc, args.rows, primary.n_features)
        with view.progress(quiet=args.json) as bars:
            result = tune(isvc, text, rows, primary.run, opts, bars.start, started=started)
    except Unusable as exc:
        print(f"tailguard tune: {exc}", file=sys.stderr)
        return 2 if exc.usage else 1
    except (ServeFailed, OSError) as exc:
        print(f"tailguard tune: {exc}", file=sys.stderr)
        return 1
    choice = result.choice
    assert choice is not None
    plot: Path | None = None
    if result.points:  # nothing measured (a --budget too small): no empty chart
        plot = Path(args.plot or f"{isvc.name}-tune.png")
        plot.parent.mkdir(parents=True, exist_ok=True)
        plot_tune(plot, result.points, result.table, float(isvc.slo.p99_latency_ms),
                  choice.chosen.policy if choice.chosen else None,
                  title=f"tailguard tune {isvc.name}: SLO p99 {isvc.slo.p99_latency_ms} ms")
    written = False
    if args.write and choice.chosen is not None:
        policy = choice.chosen.policy
        changed = set_batching(text, {"maxBatchSize": policy.max_batch_size,
                                      "maxWaitMs": policy.max_wait_ms}, args.file)
        with open(args.file, "w", encoding="utf-8", newline="") as fh:  # line ends as read
            fh.write(changed)
        written = True
    if args.json:
        print(json.dumps(as_json(result, None if plot is None else str(plot), written)))
    else:
        out = [f"raw model {isvc.model.uri}, in process:", markdown(result.table), "",
               f"grid: {result.grid.reason}"]
        for p in result.points:
            p99 = "-" if p.p99_ms is None else f"{p.p99_ms:.1f} ms"
            out.append(f"  {p.policy.label():<32} {p.throughput_rps:>9,.0f} req/s  p99 {p99:>9}"
                       f"  {p.verdict}"
                       f"{'  (' + p.note + ')' if p.note else ''}")
        if result.skipped:
            out.append("skipped (the --budget ran out): "
                       + ", ".join(p.label() for p in result.skipped))
        out.append(("chosen: " if choice.ok else "") + choice.reason)
        out.append(f"plot: {plot}" if plot is not None
                   else "plot: none (no point was measured within --budget)")
        if written:
            out.append(f"wrote spec.batching to {args.file}")
        elif args.write:
            out.append(f"{args.file} left unchanged: no point met the SLO")
        print("\n".join(out))
    return 0 if choice.ok else 1
