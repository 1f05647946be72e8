"""The ``tailguard report`` command line: serve, measure (:mod:`tailguard.report.gather`), render
(:mod:`tailguard.report.markdown`), write ``report.md``, ``report.json`` and the plots into ``--out``.

Exit codes: 0 written; 1 its models or its rows cannot be used, or the service did not start
or stopped answering; 2 bad arguments, or a spec that cannot be read or is invalid.
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
    """Add ``tailguard report`` to the CLI's subparsers."""
    text = "write the evidence card of a service (Markdown and plots) from its own measurements"
    cmd = sub.add_parser("report", help=text, description=text[0].upper() + text[1:] + ".")
    cmd.add_argument("file", help="InferenceService YAML, as given to kubectl apply")
    cmd.add_argument("--out", default="tailguard-report",
                     help="folder for report.md, report.json and the plots (default "
                          "tailguard-report)")
    add_rows(cmd)
    add_table_seconds(cmd, 0.5)
    add_load_window(cmd, duration_s=5.0, warmup_s=1.0,
                    per="rate of the configured policy's sweep")
    cmd.add_argument("--budget", type=float, default=120.0,
                     help="most seconds the configured policy's rate sweep may take "
                          "(default 120)")
    add_max_lag(cmd)
    cmd.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """The CLI shell: read the spec, load the models, serve, gather, write; exit code."""
    import httpx

    if not require("report", "tools"):
        return 1
    from tailguard.bench.serving import (
        ServeFailed,
        Unusable,
        load_models,
        read_service,
        served,
        service_rows,
    )
    from tailguard.cli import view
    from tailguard.report.gather import gather
    from tailguard.report.markdown import render
    from tailguard.tune.plot import plot_raw, plot_sweep
    from tailguard.tune.search import TuneOptions

    if args.duration <= 0 or args.warmup < 0 or args.budget <= 0 or args.table_seconds <= 0:
        print("tailguard report: --duration, --budget and --table-seconds must be > 0, "
              "--warmup >= 0", file=sys.stderr)
        return 2
    load = TuneOptions(budget_s=args.budget, point_s=args.duration, warmup_s=args.warmup,
                       max_lag_ms=args.max_lag_ms)
    try:
        isvc, _ = read_service(args.file)
        predictors = load_models(isvc)
        rows, source = service_rows(isvc, args.rows, predictors["primary"].n_features)
    except Unusable as exc:
        print(f"tailguard report: {exc}", file=sys.stderr)
        return 2 if exc.usage else 1
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    try:
        with served(Path(args.file)) as base, view.progress(quiet=False) as bars:
            doc = gather(isvc, base, rows, source, predictors, load,
                         table_seconds=args.table_seconds, show=bars.start)
    except (ServeFailed, httpx.HTTPError, OSError) as exc:
        print(f"tailguard report: {exc}", file=sys.stderr)
        return 1
    plot_sweep(out / "load.png", doc["latency"]["load"]["detail"]["runs"],
               float(isvc.slo.p99_latency_ms))
    plot_raw(out / "raw-table.png", doc["latency"]["rawTables"])
    doc["plots"] = ["load.png", "raw-table.png"]
    (out / "report.json").write_text(json.dumps(doc, indent=2) + "\n")
    (out / "report.md").write_text(render(doc))
    print(f"tailguard report: wrote {out / 'report.md'} (and report.json, load.png, "
          "raw-table.png); "
          f"{sum(c['passed'] for c in doc['failureChecks'])} of {len(doc['failureChecks'])} "
          "failure checks behaved as expected")
    return 0
