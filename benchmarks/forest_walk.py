"""How the forest paths' cost and GIL hand-offs compare: the walk over the stacked trees and
the tree-by-tree loop (each fitted tree's ``tree_.predict``, summed in order), between which
:func:`tailguard_runtime.forests.predict_proba` chooses by batch size, and scikit-learn's own
``predict_proba``.

Each is timed on the 200-tree digits forest of ``examples/digits.yaml`` at a few batch sizes,
alone and beside a thread that stands in for a busy event loop: it runs Python for about 50 µs
at a time and then releases the GIL for a moment (``time.sleep(0)``), as uvloop does between
I/O callbacks. A path that gives the GIL away often waits for it each time.

    .venv/bin/python benchmarks/forest_walk.py [--cpu 0] [--calls 60]

Bounded: ``--calls`` calls per path, batch size and setting (under a minute at the default).
Prints a Markdown table of median and p99 ms per call.
"""

from __future__ import annotations

import argparse
import functools
import os
import sys
import threading
import time
from pathlib import Path
from typing import Callable

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "runtime"))

from tailguard_runtime import forests
from tailguard_runtime.models import load_dataset

BATCHES = (1, 5, 16, 64, 256)


class BusyLoop:
    """A thread that holds the GIL in bursts of ``burst`` loop steps while its ``with`` block runs."""

    def __init__(self, burst: int = 500) -> None:
        self.burst, self.done = burst, threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self.done.is_set():
            total = 0
            for i in range(self.burst):
                total += i
            time.sleep(0)

    def __enter__(self) -> "BusyLoop":
        self.thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self.done.set()
        self.thread.join()


def timed(fn: Callable[[np.ndarray], np.ndarray], rows: np.ndarray,
          calls: int) -> tuple[float, float]:
    """Median and p99 of ``calls`` calls of ``fn(rows)``, in ms."""
    fn(rows)
    took = []
    for _ in range(calls):
        start = time.perf_counter()
        fn(rows)
        took.append(time.perf_counter() - start)
    return float(np.median(took) * 1e3), float(np.percentile(took, 99) * 1e3)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cpu", type=int, default=0, help="pin to this core (Linux; -1: don't)")
    parser.add_argument("--calls", type=int, default=60, help="calls per path and batch size")
    args = parser.parse_args(argv)
    if args.cpu >= 0 and hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {args.cpu})
    from sklearn.ensemble import RandomForestClassifier
    from threadpoolctl import threadpool_limits

    x, y = load_dataset("digits")
    forest = RandomForestClassifier(n_estimators=200, random_state=0, n_jobs=1).fit(x, y)
    stacked = forests.stack_forest(forest)
    paths = {"stacked walk": functools.partial(forests.walk, stacked),
             "tree by tree": functools.partial(forests.tree_by_tree, stacked),
             "scikit-learn": forest.predict_proba}
    rng = np.random.default_rng(0)
    print("| batch (rows) | path | alone: median | alone: p99 | beside a busy loop: median | p99 |")
    print("|---:|---|---:|---:|---:|---:|")
    with threadpool_limits(limits=1):
        for batch in BATCHES:
            rows = x[rng.integers(0, len(x), batch)]
            for name, fn in paths.items():
                assert np.array_equal(fn(rows), forest.predict_proba(rows))
                alone = timed(fn, rows, args.calls)
                with BusyLoop():
                    busy = timed(fn, rows, args.calls)
                print(f"| {batch} | {name} | {alone[0]:.2f} ms | {alone[1]:.2f} ms "
                      f"| {busy[0]:.2f} ms | {busy[1]:.2f} ms |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
