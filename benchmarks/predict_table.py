"""Raw in-process ``predict`` speed of the reference model: the ceiling any server can reach.

One thread, ``n_jobs=1``, BLAS/OpenMP threads limited to 1 (threadpoolctl). For each batch size
the model's ``predict`` is called repeatedly on fixed rows; the table gives the median wall time
of one call (ms) and the rows per second that median implies (``batch / median``).

    .venv/bin/python benchmarks/predict_table.py [--cpu 0] [--seconds 3] [--json OUT.json]

Bounded: about ``--seconds`` per batch size (default 3 s, 6 sizes: under 30 s in all).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any, Sequence

sys.path.insert(0, str(Path(__file__).resolve().parent))

from refmodel import build_model, sample_rows  # noqa: E402

from tailguard.tune.rawtable import RawRow, markdown, time_calls

DEFAULT_BATCHES = (1, 8, 32, 64, 128, 512)


def time_predict(model: Any, batch: int, seconds: float = 3.0, min_calls: int = 5,
                 max_calls: int = 5000) -> dict[str, float]:
    """Time ``model.predict`` on ``batch`` rows (shape ``(batch, 20)``) with
    :func:`tailguard.tune.rawtable.time_calls` (the table ``tailguard tune`` prints).

    Returns ``{"batch", "calls", "median_ms", "p90_ms", "rows_per_s"}``: the median and 90th
    percentile of one call's wall time in milliseconds, and ``batch / median`` in rows per second.
    """
    row = time_calls(model.predict, sample_rows(batch), seconds=seconds, min_calls=min_calls,
                     max_calls=max_calls)
    return row.as_dict()


def markdown_table(rows: Sequence[dict[str, float]]) -> str:
    """Render :func:`time_predict` results as a Markdown table."""
    return markdown([RawRow(int(r["batch"]), int(r["calls"]), r["median_ms"], r["p90_ms"],
                            r["rows_per_s"]) for r in rows])


def run(batches: Sequence[int] = DEFAULT_BATCHES, seconds: float = 3.0,
        cpu: int | None = None) -> list[dict[str, float]]:
    """Build the reference model and time it at each batch size (see :func:`time_predict`).

    ``cpu`` pins this process to one core first (Linux only), like the server in benchmarks/run.py.
    """
    if cpu is not None and hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {cpu})
    from threadpoolctl import threadpool_limits

    with threadpool_limits(limits=1):
        model = build_model()
        model.set_params(n_jobs=1)
        return [time_predict(model, b, seconds) for b in batches]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--batches", default=",".join(map(str, DEFAULT_BATCHES)),
                        help="comma-separated batch sizes (rows per call)")
    parser.add_argument("--seconds", type=float, default=3.0, help="time budget per batch size")
    parser.add_argument("--cpu", type=int, default=None, help="pin to this core")
    parser.add_argument("--json", help="also write the results to this JSON file")
    args = parser.parse_args(argv)
    batches = [int(b) for b in args.batches.split(",") if b]
    rows = run(batches, args.seconds, args.cpu)
    print(markdown_table(rows))
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
