"""How ``tailguard bench`` shows itself to a person: a rich progress bar on stderr while it runs,
then tables on stdout (client view, server view, verdict). Nothing here measures; it renders the
report dict that :mod:`~tailguard.cli.bench` builds (the same object ``--json`` prints)."""

from __future__ import annotations

import contextlib
from typing import Any, Callable, Iterator

from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeRemainingColumn
from rich.table import Table

from tailguard.bench.loadgen import Progress as LoadProgress


class _Bars:
    """One progress task per run; :meth:`start` returns the run's ``on_progress`` callback."""

    def __init__(self, progress: Progress | None) -> None:
        self.progress = progress

    def start(self, label: str) -> Callable[[LoadProgress], None] | None:
        progress = self.progress
        if progress is None:
            return None
        task = progress.add_task(label, total=1.0, status="")

        def update(p: LoadProgress) -> None:
            progress.update(task, total=p.total_s, completed=min(p.elapsed_s, p.total_s),
                            status=f"{p.phase}: {p.sent:,} sent, {p.ok:,} ok, "
                                   f"{p.answered - p.ok:,} not 200")
        return update


@contextlib.contextmanager
def progress(quiet: bool) -> Iterator[_Bars]:
    """Progress bars on stderr (none when ``quiet`` or stderr is not a terminal)."""
    console = Console(stderr=True)
    if quiet or not console.is_terminal:
        yield _Bars(None)
        return
    bars = Progress(TextColumn("{task.description}"), BarColumn(), TimeRemainingColumn(),
                    TextColumn("{task.fields[status]}"), console=console, refresh_per_second=4)
    with bars:
        yield _Bars(bars)


def _n(value: Any, spec: str = ",.1f") -> str:
    return "–" if value is None else format(value, spec)


def _codes(run: dict[str, Any]) -> str:
    parts = [f"{code}: {n}" for code, n in run["http_errors"].items()]
    parts += [f"{kind}: {n}" for kind, n in run["transport_errors"].items()]
    return ", ".join(parts) or "0"


def _load(run: dict[str, Any]) -> str:
    return (f"open {run['offered_rps']:g}/s" if run["mode"] == "open"
            else f"closed x{run['concurrency']}")


def _verdict(run: dict[str, Any]) -> str:
    text = ("INVALID" if not run["valid"]
            else {"held": "held SLO", "broke": "broke SLO"}.get(run.get("slo", ""), "valid"))
    return f"{text}, interrupted" if run.get("interrupted") else text


def print_report(report: dict[str, Any], console: Console | None = None) -> None:
    """Print ``report`` (see :func:`~tailguard.cli.bench.run`) as tables."""
    console = console or Console()
    console.print(f"[bold]{report['target']}[/bold]  rows: {report['rows']}, "
                  f"{report['rowsPerRequest']} per request"
                  + (f", SLO p99 {report['sloMs']:g} ms" if report["sloMs"] is not None else ""))
    runs = report["runs"]
    client = Table(title="client view: the measured window; latency (ms) of the 200 answers, "
                         "from each request's scheduled send time in open loop",
                   title_justify="left")
    client.add_column("")
    for run in runs:
        client.add_column(_load(run), justify="right")
    lines: list[tuple[str, Callable[[dict[str, Any]], str]]] = [
        ("offered req/s", lambda r: _n(r["offered_rps"], ",.0f")),
        ("achieved req/s (200s)", lambda r: _n(r["achieved_rps"], ",.0f")),
        ("rows/s", lambda r: _n(r["rows_per_s"], ",.0f")),
        *((key, (lambda k: lambda r: _n(r["latency_ms"].get(k), ".2f"))(key))
          for key in ("p50", "p90", "p95", "p99", "p99.9", "max")),
        ("sent / 200", lambda r: f"{r['sent']:,} / {r['ok']:,}"),
        ("429 (shed)", lambda r: f"{r['rejected_429']:,}"),
        ("errors", _codes),
        ("schedule lag p99 ms", lambda r: _n(r["schedule_lag_ms"].get("p99"), ".2f")),
        ("generator CPU", lambda r: f"{100 * r['generator_cpu']:.0f}%"),
        ("verdict", _verdict),
    ]
    for label, cell in lines:
        client.add_row(label, *(cell(run) for run in runs))
    console.print(client)
    views = [(run, run["server"]) for run in runs if run.get("server")]
    if views:
        table = Table(title="server view: its /metrics over the same window (histogram "
                            "percentiles are bucket edges)", title_justify="left")
        table.add_column("")
        for run, _ in views:
            table.add_column(_load(run), justify="right")
        rows: list[tuple[str, Callable[[dict[str, Any]], str]]] = [
            ("answers by code", lambda v: ", ".join(f"{c}: {n:,}" for c, n in
                                                    v["requests"].items()) or "0"),
            ("rejections", lambda v: ", ".join(f"{r}: {n:,}" for r, n in
                                               v["rejections"].items()) or "0"),
            ("batches", lambda v: f"{v['batches']:,}"),
            ("rows per batch: mean / p99", lambda v: f"{_n(v['batch_rows']['mean'], '.1f')} / "
                                                     f"{_n(v['batch_rows']['p99'], 'g')}"),
            ("server p99 ms (body in to answer)", lambda v: _n(v.get("request_p99_ms"), "g")),
            ("queue wait p99 ms", lambda v: _n(v["queue_wait_p99_ms"], "g")),
            ("model ms per batch: mean / p99", lambda v: (
                f"{_n(v['model_ms_per_batch']['mean'], '.2f')} / "
                f"{_n(v['model_ms_per_batch']['p99'], 'g')}")),
        ]
        for label, cell in rows:
            table.add_row(label, *(cell(view) for _, view in views))
        console.print(table)
    for run in report["runs"]:
        for reason in run["invalid"]:
            if run.get("slo") == "held":  # conclusive: lag only makes latencies longer
                console.print(f"[yellow]note[/yellow] ({run['mode']} loop): {reason}; held the "
                              "SLO all the same (latency counts from the scheduled time)")
            else:
                console.print(f"[red]invalid[/red] ({run['mode']} loop): {reason}; not the "
                              "server's latency")
    if report["sweep"]:
        sweep = report["sweep"]
        at = sweep["rateAtSlo"]
        console.print(f"rate at SLO: [bold]{'none' if at is None else f'{at:g} req/s'}[/bold] "
                      f"({sweep['reason']})")
