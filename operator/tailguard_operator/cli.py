"""The ``tailguard`` command: a thin shell over local mode, the control route and the operator.

* ``tailguard up FILE.yaml [--host H] [--port P]`` -- serve an InferenceService on this machine.
* ``tailguard rollback NAME`` / ``tailguard rollforward NAME`` -- switch traffic of the local
  service (``--port`` for another port), or with ``--cluster`` patch ``spec.traffic`` of the
  InferenceService in the current kubeconfig context.
* ``tailguard validate FILE.yaml`` -- check a spec the way the API server would; print it defaulted.
* ``tailguard operator`` -- run the Kubernetes operator.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Sequence

DEFAULT_PORT = 8080


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``tailguard`` console script; returns the process exit code."""
    parser = _parser()
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        return 2
    return int(args.func(args))


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="tailguard", description="Serve models under a p99 SLO.")
    parser.set_defaults(command=None)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")

    up = sub.add_parser("up", help="serve an InferenceService on this machine (no cluster)")
    up.add_argument("file", help="InferenceService YAML, as given to kubectl apply")
    up.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    up.add_argument("--port", type=int, default=DEFAULT_PORT, help="port (default 8080; 0 = any free)")
    up.add_argument("--log-level", default="WARNING", help="runtime log level (default WARNING)")
    up.set_defaults(func=_up)

    for name, role, text in (("rollback", "fallback", "send traffic to the fallback model"),
                             ("rollforward", "primary", "send traffic back to the primary model")):
        cmd = sub.add_parser(name, help=text)
        cmd.add_argument("name", help="the InferenceService name")
        cmd.add_argument("--port", type=int, default=DEFAULT_PORT,
                         help="port of the local `tailguard up` (default 8080)")
        cmd.add_argument("--cluster", action="store_true",
                         help="patch spec.traffic in the cluster instead of the local service")
        cmd.add_argument("-n", "--namespace", default=None,
                         help="namespace with --cluster (default: the kubeconfig context's)")
        cmd.set_defaults(func=_switch, role=role)

    validate = sub.add_parser("validate", help="validate an InferenceService YAML like the API server")
    validate.add_argument("file")
    validate.set_defaults(func=_validate)

    operator = sub.add_parser("operator", help="run the Kubernetes operator")
    operator.add_argument("-n", "--namespace", action="append", default=None,
                          help="watch only this namespace (repeatable; default: all, or "
                               "$TAILGUARD_NAMESPACES)")
    operator.set_defaults(func=_operator)
    return parser


def _up(args: argparse.Namespace) -> int:
    from tailguard_runtime.server import configure_logging

    from .local import up

    configure_logging(args.log_level.upper())
    return up(args.file, host=args.host, port=args.port)


def _switch(args: argparse.Namespace) -> int:
    if args.cluster:
        from . import kube

        kube.set_traffic(args.name, args.namespace, args.role)
        print(f"{args.name}: spec.traffic set to {args.role}; the operator switches once the "
              f"{args.role} model is Ready")
        return 0
    import httpx

    url = f"http://127.0.0.1:{args.port}/tailguard/traffic"
    try:
        reply = httpx.post(url, json={"name": args.name, "activeModel": args.role}, timeout=10)
    except httpx.HTTPError as exc:
        print(f"tailguard {args.command}: no local tailguard up answers on 127.0.0.1:{args.port} "
              f"({type(exc).__name__}); use --port, or --cluster for a cluster", file=sys.stderr)
        return 1
    if reply.status_code != 200:
        try:
            detail = reply.json().get("error", reply.text)
        except ValueError:
            detail = reply.text
        print(f"tailguard {args.command}: {detail}", file=sys.stderr)
        return 1
    body = reply.json()
    verb = "now" if body["changed"] else "already"
    print(f"{args.name}: traffic {verb} goes to {body['activeModel']}")
    return 0


def _validate(args: argparse.Namespace) -> int:
    from .spec import SpecError, load_file

    try:
        with open(args.file, encoding="utf-8") as fh:
            isvc = load_file(fh.read(), args.file)
    except OSError as exc:
        print(f"tailguard validate: cannot read {args.file}: {exc.strerror}", file=sys.stderr)
        return 2
    except SpecError as exc:
        print(f"{args.file}: invalid", file=sys.stderr)
        for line in exc.errors:
            print(f"  {line}", file=sys.stderr)
        return 1
    print(json.dumps({"name": isvc.name, "spec": isvc.spec}, indent=2))
    from .manifests import cluster_problems

    for line in cluster_problems(isvc):
        print(f"note: valid for tailguard up, but the operator refuses it: {line}", file=sys.stderr)
    return 0


def _operator(args: argparse.Namespace) -> int:
    """Run the operator; flags win over the chart's ``TAILGUARD_NAMESPACES`` (comma-separated),
    ``TAILGUARD_PEERING`` (peering object name, empty = standalone) and
    ``TAILGUARD_LIVENESS_ENDPOINT`` variables."""
    from .handlers import run_operator

    namespaces = args.namespace or [
        ns.strip() for ns in os.environ.get("TAILGUARD_NAMESPACES", "").split(",") if ns.strip()]
    run_operator(namespaces or None, peering=os.environ.get("TAILGUARD_PEERING", ""),
                 liveness_endpoint=os.environ.get("TAILGUARD_LIVENESS_ENDPOINT") or None)
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
