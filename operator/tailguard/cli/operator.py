"""``tailguard operator``: run the Kubernetes operator (in a cluster, or against the current
kubeconfig); the work is :func:`tailguard.operator.handlers.run_operator`."""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any

from tailguard.cli.reach import kube_problem


def add_parser(sub: Any) -> None:
    """Register ``operator`` on the ``tailguard`` subcommands."""
    text = "run the Kubernetes operator (in a cluster, or against the current kubeconfig)"
    operator = sub.add_parser("operator", help=text, description=text + ".")
    operator.add_argument("-n", "--namespace", action="append", default=None,
                          help="watch only this namespace (repeatable; default: all, or "
                               "$TAILGUARD_NAMESPACES)")
    operator.set_defaults(func=_operator)


def _operator(args: argparse.Namespace) -> int:
    """Run the operator; flags win over the chart's ``TAILGUARD_NAMESPACES`` (comma-separated),
    ``TAILGUARD_PEERING`` (peering object name, empty = standalone) and
    ``TAILGUARD_LIVENESS_ENDPOINT`` variables."""
    from tailguard.operator import kube
    from tailguard.operator.handlers import run_operator

    try:
        kube.connect()  # fail now, in one line, rather than inside kopf's login retries
    except kube.KubeError as exc:
        print(f"tailguard operator: {kube_problem(exc, '', 'watch')}", file=sys.stderr)
        return 1
    namespaces = args.namespace or [
        ns.strip() for ns in os.environ.get("TAILGUARD_NAMESPACES", "").split(",") if ns.strip()]
    run_operator(namespaces or None, peering=os.environ.get("TAILGUARD_PEERING", ""),
                 liveness_endpoint=os.environ.get("TAILGUARD_LIVENESS_ENDPOINT") or None)
    return 0
