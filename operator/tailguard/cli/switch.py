"""``tailguard rollback NAME`` and ``tailguard rollforward NAME``: switch traffic of the local
``tailguard up`` (its loopback control route), or with ``--cluster`` set ``spec.traffic``."""

from __future__ import annotations

import argparse
import datetime
import sys
from typing import Any

from tailguard.cli.options import DEFAULT_PORT, add_target
from tailguard.cli.reach import call_local, kube_problem


def add_parser(sub: Any) -> None:
    """Register ``rollback`` and ``rollforward`` on the ``tailguard`` subcommands."""
    for name, role, text in (("rollback", "fallback", "send traffic to the fallback model"),
                             ("rollforward", "primary", "send traffic back to the primary model")):
        cmd = sub.add_parser(name, help=text, description=(
            f"{text[0].upper()}{text[1:]}: of the local tailguard up by default, or with "
            "--cluster by setting spec.traffic of the InferenceService (the operator switches "
            "once that model is Ready; rollforward also sets the tailguard.dev/roll-forward "
            "annotation, which clears an automatic rollback by the SLO guard)."))
        add_target(cmd, "tailguard up")
        cmd.set_defaults(func=_switch, role=role)


def _switch(args: argparse.Namespace) -> int:
    if args.cluster:
        from tailguard.guard.record import ROLL_FORWARD_ANNOTATION as ROLL_FORWARD
        from tailguard.guard.record import format_time
        from tailguard.operator import kube

        # rolling forward also clears an automatic rollback older than now
        stamp = (format_time(datetime.datetime.now(datetime.timezone.utc))
                 if args.role == "primary" else None)
        try:
            kube.set_traffic(args.name, args.namespace, args.role, roll_forward=stamp)
        except kube.KubeError as exc:
            print(f"tailguard {args.command}: {kube_problem(exc, args.name, 'update')}",
                  file=sys.stderr)
            return 1
        print(f"{args.name}: spec.traffic set to {args.role}; the operator switches once the "
              f"{args.role} model is Ready")
        if stamp is not None:
            print(f"{args.name}: {ROLL_FORWARD}={stamp}: an automatic rollback from before "
                  "now is cleared, and the SLO guard judges the primary again")
        return 0
    from tailguard.up.control import find_control_file, state_dir

    control = find_control_file(args.name, args.port)
    args.port = control.port if control is not None else (args.port or DEFAULT_PORT)
    if control is None:
        # say why: nothing listens, another service listens, or no control file of ours
        stats = call_local(args, "GET", "/tailguard/stats", None)
        if stats is None:
            return 1
        if stats.get("name") != args.name:
            print(f"tailguard {args.command}: no InferenceService {args.name!r} on 127.0.0.1:"
                  f"{args.port} (it serves {stats.get('name')!r})", file=sys.stderr)
        else:
            print(f"tailguard {args.command}: no control file for {args.name!r} on port "
                  f"{args.port} in {state_dir()} (run this as the user who started tailguard "
                  "up, with the same TAILGUARD_STATE_DIR)", file=sys.stderr)
        return 1
    reply = call_local(args, "POST", "/tailguard/traffic",
                       {"name": args.name, "activeModel": args.role, "by": "cli"}, control.secret)
    if reply is None:
        return 1
    verb = "now" if reply["changed"] else "already"
    print(f"{args.name}: traffic {verb} goes to {reply['activeModel']}")
    if args.role == "primary" and reply["changed"]:
        print(f"{args.name}: the SLO guard judges the primary again from its next window "
              "(an automatic rollback, if any, is cleared)")
    return 0
