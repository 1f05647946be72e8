"""The ``tailguard`` command: one subcommand per module of :mod:`tailguard.cli`.

* ``tailguard up FILE.yaml`` -- serve an InferenceService on this machine (:mod:`.up`).
* ``tailguard rollback NAME`` / ``tailguard rollforward NAME`` -- switch traffic of the local
  service, or with ``--cluster`` patch ``spec.traffic`` (:mod:`.switch`).
* ``tailguard status NAME`` -- the live numbers of the local service, or with ``--cluster`` the
  InferenceService's status (:mod:`.status`).
* ``tailguard validate FILE.yaml [--models]`` -- check a spec the way the API server would
  (:mod:`.validate`).
* ``tailguard bench TARGET`` -- load-test a served InferenceService (:mod:`.bench`).
* ``tailguard tune FILE.yaml`` -- choose the batch policy inside the SLO (:mod:`.tune`).
* ``tailguard report FILE.yaml`` -- write the service's evidence card (:mod:`.report`).
* ``tailguard operator`` -- run the Kubernetes operator (:mod:`.operator`).

Every failure is one line on stderr and a non-zero exit code, the same for every command: 1
when the command ran and was refused or a check failed (no server, unknown name, unreachable
API server, a model that does not load), 2 for bad input (bad arguments, a file that cannot be
read, an invalid spec), 3 for an inconclusive measurement (``bench``), 130 on Ctrl-C. A command whose optional part is not installed
(:mod:`.extras`) says which extra to install, and exits 1.
"""

from __future__ import annotations

import argparse
import sys
from typing import Sequence

from tailguard.cli import bench, operator, report, status, switch, tune, up, validate
from tailguard.cli.extras import extra_of, missing_line


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``tailguard`` console script; returns the process exit code."""
    parser = _parser()
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        return 2
    try:
        return int(args.func(args))
    except KeyboardInterrupt:
        print(f"tailguard {args.command}: interrupted", file=sys.stderr)
        return 130
    except ModuleNotFoundError as exc:
        extra = extra_of(exc.name)
        if extra is None:
            raise
        print(missing_line(args.command, extra), file=sys.stderr)
        return 1


def _parser() -> argparse.ArgumentParser:
    from tailguard_runtime import __version__

    parser = argparse.ArgumentParser(
        prog="tailguard", description="Serve scikit-learn models under a p99 latency SLO, on "
        "this machine (tailguard up) or on Kubernetes (tailguard operator).")
    parser.add_argument("--version", action="version", version=f"tailguard {__version__}",
                        help="print the version and exit")
    parser.set_defaults(command=None)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for command in (up, switch, status, validate, bench, tune, report, operator):
        command.add_parser(sub)
    return parser


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
