"""Command-line options that several ``tailguard`` commands share, defined once so that their
names, types and help read the same everywhere: the load window, rows, table time and lag bound
of ``bench``, ``tune`` and ``report``, and the target (name, port, cluster) of ``rollback``,
``rollforward`` and ``status``."""

from __future__ import annotations

from typing import Any


def add_load_window(cmd: Any, *, duration_s: float, warmup_s: float,
                    per: str = "run") -> None:
    """``--duration`` (measured seconds per ``per``) and ``--warmup`` (seconds of load sent
    first in each ``per`` and not measured), with the command's own defaults, in seconds."""
    cmd.add_argument("--duration", type=float, default=duration_s,
                     help=f"measured seconds per {per} (default {duration_s:g})")
    cmd.add_argument("--warmup", type=float, default=warmup_s,
                     help=f"seconds of load sent first in each {per} and not measured "
                          f"(default {warmup_s:g})")


def add_rows(cmd: Any) -> None:
    """``--rows``: the file of rows to send."""
    cmd.add_argument("--rows", help="rows to send: a .npy or .csv file (default: the builtin "
                                    "model's own dataset; needed for a file:// model)")


def add_table_seconds(cmd: Any, default_s: float) -> None:
    """``--table-seconds``: time per batch size of the raw model table, in seconds."""
    cmd.add_argument("--table-seconds", type=float, default=default_s,
                     help=f"seconds per batch size of the raw model table (default {default_s:g})")


def add_max_lag(cmd: Any) -> None:
    """``--max-lag-ms``: the generator's own validity bound (p99 schedule lag, ms)."""
    cmd.add_argument("--max-lag-ms", type=float,
                     help="a run whose p99 schedule lag exceeds this is invalid (default: a "
                          "tenth of the SLO, at least 1; 1 without an SLO)")

DEFAULT_PORT = 8080
"""The port ``tailguard up`` listens on, and the one the other commands look for, by default."""


def add_target(cmd: Any, local: str) -> None:
    """``NAME``, ``--port``, ``--cluster`` and ``-n/--namespace``: which service a command
    acts on, the local ``local`` (``tailguard up``) by default or the kubeconfig's cluster."""
    cmd.add_argument("name", help="the InferenceService name (metadata.name)")
    cmd.add_argument("--port", type=int, default=None,
                     help=f"port of the local {local} (default 8080, or the only port a "
                          f"{local} of NAME runs on)")
    cmd.add_argument("--cluster", action="store_true",
                     help="talk to the cluster of the current kubeconfig context instead of "
                          "the local service")
    cmd.add_argument("-n", "--namespace", default=None,
                     help="namespace, with --cluster (default: the kubeconfig context's)")
