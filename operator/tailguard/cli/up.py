"""``tailguard up FILE.yaml``: serve an InferenceService on this machine (the work is
:func:`tailguard.up.serve.up`)."""

from __future__ import annotations

import argparse
import os
import shutil
import sys
from pathlib import Path
from typing import Any

from tailguard.cli.options import DEFAULT_PORT


def add_parser(sub: Any) -> None:
    """Register ``up`` on the ``tailguard`` subcommands."""
    text = "serve an InferenceService on this machine (no cluster); Ctrl-C drains and stops"
    up = sub.add_parser("up", help=text, description=text + ".")
    up.add_argument("file", help="InferenceService YAML, as given to kubectl apply")
    up.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    up.add_argument("--port", type=int, default=DEFAULT_PORT,
                    help="port to listen on (default 8080; 0 picks a free one)")
    up.add_argument("--grpc-port", type=int, default=None, metavar="PORT",
                    help="port of the gRPC service (default: the spec's grpcPort, 8081 unless "
                         "set; a free one with --port 0; 0 picks a free one)")
    up.add_argument("--log-level", default="WARNING",
                    help="runtime log level: DEBUG, INFO, WARNING or ERROR (default WARNING; "
                         "traffic switches are always shown)")
    up.add_argument("--allow-origin", action="append", default=[], metavar="ORIGIN",
                    help="serve web pages of this origin (e.g. https://app.example.com; "
                         "repeatable); every other browser request gets 403")
    up.set_defaults(func=_up)


def _up(args: argparse.Namespace) -> int:
    from tailguard.up.serve import up
    from tailguard_runtime.main import configure_logging

    configure_logging(args.log_level.upper())
    hint = ("use make up PORT=<port> to pick another port" if os.environ.get("MAKELEVEL")
            else "use --port to pick another port")
    return up(args.file, host=args.host, port=args.port, command=_spelled(), port_hint=hint,
              allowed_origins=tuple(args.allow_origin), grpc_port=args.grpc_port)


def _spelled() -> str:
    script = Path(sys.prefix) / "bin" / "tailguard"
    return command_spelling(script, script.exists(), shutil.which("tailguard"), Path.cwd())


def command_spelling(script: Path, exists: bool, on_path: str | None, cwd: Path) -> str:
    """How to spell the ``tailguard`` command so that a printed line runs as printed.

    ``script`` is this environment's console script (``<venv>/bin/tailguard``), ``exists``
    whether it is there, ``on_path`` what ``PATH`` finds for ``tailguard`` (``None``: nothing),
    ``cwd`` the working directory. ``tailguard`` when ``PATH`` finds this very script; else the
    script's path, relative when it is under ``cwd`` (``.venv/bin/tailguard``); else
    ``python -m tailguard.cli`` with this environment's interpreter.
    """
    if exists:
        if on_path is not None and Path(on_path).resolve() == script.resolve():
            return "tailguard"
        try:
            return str(script.relative_to(cwd))
        except ValueError:
            return str(script)
    python = script.parent / "python"
    try:
        shown = str(python.relative_to(cwd))
    except ValueError:
        shown = str(python)
    return f"{shown} -m tailguard.cli"
