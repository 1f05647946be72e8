"""The PNG of ``tailguard tune`` (and of ``tailguard report``): the grid and the raw table.

Three panels side by side: p99 (ms) against ``maxBatchSize`` with one line per ``maxWaitMs``,
the SLO as a dashed line and the chosen point marked; throughput (req/s) against
``maxBatchSize``, same lines, same mark; and the raw model table (:mod:`tailguard.tune.rawtable`). Drawn with
matplotlib's object API on the Agg canvas (no pyplot, no global state, no display needed).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Sequence

from tailguard.tune.grid import PointResult, Policy
from tailguard.tune.rawtable import RawRow


def plot_tune(path: Path, points: Sequence[PointResult], table: Sequence[RawRow],
              slo_ms: float, chosen: Policy | None, *, title: str = "") -> Path:
    """Write the PNG to ``path`` (its folder must exist) and return ``path``.

    ``points`` in any order (points without a p99 are left out of the p99 panel; invalid ones
    are crossed in purple); ``chosen`` is marked in both panels when given; ``slo_ms`` is drawn
    on the p99 panel.
    """
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(15, 4.8), dpi=100)
    FigureCanvasAgg(fig)
    p99_ax, rps_ax, table_ax = fig.subplots(1, 3, gridspec_kw={"width_ratios": [1, 1, 0.9]})
    waits = sorted({p.policy.max_wait_ms for p in points})
    for wait in waits:
        line = sorted((p for p in points if p.policy.max_wait_ms == wait),
                      key=lambda p: p.policy.max_batch_size)
        with_p99 = [p for p in line if p.p99_ms is not None]
        label = f"maxWaitMs={wait}"
        p99_ax.plot([p.policy.max_batch_size for p in with_p99],
                    [p.p99_ms for p in with_p99], marker="o", label=label)
        rps_ax.plot([p.policy.max_batch_size for p in line], [p.throughput_rps for p in line],
                    marker="o", label=label)
    invalid = [p for p in points if p.invalid and p.p99_ms is not None]
    if invalid:  # measured while the generator lagged: neither met nor missed
        p99_ax.plot([p.policy.max_batch_size for p in invalid], [p.p99_ms for p in invalid],
                    marker="x", markersize=12, markeredgewidth=3, color="purple",
                    linestyle="none",
                    label="invalid (generator lagged)")
    p99_ax.axhline(slo_ms, color="red", linestyle="--", label=f"SLO p99 {slo_ms:g} ms")
    if chosen is not None:
        for p in points:
            if p.policy == chosen:
                if p.p99_ms is not None:
                    p99_ax.plot([chosen.max_batch_size], [p.p99_ms], marker="*", markersize=18,
                                color="gold", markeredgecolor="black", linestyle="none",
                                label=f"chosen: {chosen.label()}")
                rps_ax.plot([chosen.max_batch_size], [p.throughput_rps], marker="*",
                            markersize=18, color="gold", markeredgecolor="black",
                            linestyle="none", label="chosen")
    batches = sorted({p.policy.max_batch_size for p in points})
    for ax, ylabel in ((p99_ax, "p99 latency (ms)"), (rps_ax, "throughput (req/s)")):
        ax.set_xscale("log", base=2)
        if batches:
            ax.set_xticks(batches, [str(b) for b in batches])
        ax.set_xlabel("maxBatchSize (rows)")
        ax.set_ylabel(ylabel)
        ax.grid(True, alpha=0.3)
        if ax.get_legend_handles_labels()[0]:  # an empty legend is a matplotlib warning
            ax.legend(fontsize=8)
    p99_ax.set_title("p99 against batch size")
    rps_ax.set_title("throughput against batch size")
    table_ax.axis("off")
    table_ax.set_title("raw model, in process (one call)")
    if table:
        cells = [[str(r.batch), f"{r.median_ms:.2f}", f"{r.p90_ms:.2f}", f"{r.rows_per_s:,.0f}"]
                 for r in table]
        drawn = table_ax.table(cellText=cells, colLabels=["batch", "ms median", "ms p90",
                                                          "rows/s"], loc="center")
        drawn.scale(1, 1.6)
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, format="png")
    return path


def plot_raw(path: Path, tables: dict[str, list[dict[str, Any]]]) -> Path:
    """Write the raw model tables of ``tailguard report`` as a PNG (two panels: ms per call and
    rows/s against batch size, one line per role). ``tables`` maps a role to
    :meth:`~tailguard.tune.rawtable.RawRow.as_dict` rows. Returns ``path``."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(10, 4), dpi=100)
    FigureCanvasAgg(fig)
    ms_ax, rows_ax = fig.subplots(1, 2)
    for role, rows in tables.items():
        batches = [r["batch"] for r in rows]
        ms_ax.plot(batches, [r["median_ms"] for r in rows], marker="o", label=role)
        rows_ax.plot(batches, [r["rows_per_s"] for r in rows], marker="o", label=role)
    for ax, ylabel in ((ms_ax, "ms per call (median)"), (rows_ax, "rows/s")):
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("batch (rows per call)")
        ax.set_ylabel(ylabel)
        ax.grid(True, alpha=0.3)
        if ax.get_legend_handles_labels()[0]:  # an empty legend is a matplotlib warning
            ax.legend(fontsize=8)
    ms_ax.set_title("one model call, in process")
    rows_ax.set_title("where batching stops paying")
    fig.tight_layout()
    fig.savefig(path, format="png")
    return path


def plot_sweep(path: Path, runs: Sequence[dict[str, Any]], slo_ms: float) -> Path:
    """Write ``tailguard report``'s load plot: p99 and achieved throughput against the offered
    rate, with the SLO line. ``runs`` are :meth:`~tailguard.bench.plan.LoadResult.as_dict` rows in the
    order they ran (open loop: ``offered_rps`` set). Returns ``path``."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(10, 4), dpi=100)
    FigureCanvasAgg(fig)
    p99_ax, rps_ax = fig.subplots(1, 2)
    offered = [r["offered_rps"] for r in runs]
    answered = [(r["offered_rps"], r["latency_ms"].get("p99")) for r in runs
                if r["latency_ms"].get("p99") is not None]
    p99_ax.plot([a for a, _ in answered], [p for _, p in answered], marker="o", label="p99")
    p99_ax.axhline(slo_ms, color="red", linestyle="--", label=f"SLO p99 {slo_ms:g} ms")
    rps_ax.plot(offered, [r["achieved_rps"] for r in runs], marker="o", label="answered 200")
    rps_ax.plot(offered, offered, color="grey", linestyle=":", label="offered")
    for ax, ylabel in ((p99_ax, "p99 latency (ms)"), (rps_ax, "throughput (req/s)")):
        ax.set_xscale("log", base=2)
        if offered:
            ax.set_xticks(offered, [f"{r:g}" for r in offered])
        ax.set_xlabel("offered rate (req/s, open loop)")
        ax.set_ylabel(ylabel)
        ax.grid(True, alpha=0.3)
        if ax.get_legend_handles_labels()[0]:  # an empty legend is a matplotlib warning
            ax.legend(fontsize=8)
    p99_ax.set_title("p99 against the offered rate")
    rps_ax.set_title("throughput against the offered rate")
    fig.tight_layout()
    fig.savefig(path, format="png")
    return path
