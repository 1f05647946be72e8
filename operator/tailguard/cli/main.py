"""The ``tailguard`` command: a thin shell over local mode, the control route and the operator.

* ``tailguard up FILE.yaml [--host H] [--port P]`` -- serve an InferenceService on this machine.
* ``tailguard rollback NAME`` / ``tailguard rollforward NAME`` -- switch traffic of the local
  service (``--port`` for another port), or with ``--cluster`` patch ``spec.traffic`` of the
  InferenceService in the current kubeconfig context.
* ``tailguard status NAME`` -- the live numbers of the local service (``--port``), or with
  ``--cluster`` the InferenceService's status.
* ``tailguard validate FILE.yaml [--models]`` -- check a spec the way the API server would; print
  it defaulted, as YAML that can be applied again; ``--models`` also loads both models.
* ``tailguard bench TARGET`` -- load-test a served InferenceService (see :mod:`tailguard.cli.bench`).
* ``tailguard tune FILE.yaml`` -- choose the batch policy inside the SLO (see :mod:`tailguard.cli.tune`).
* ``tailguard report FILE.yaml`` -- write the service's evidence card (see :mod:`tailguard.cli.report`).
* ``tailguard operator`` -- run the Kubernetes operator.

Every failure is one line on stderr and a non-zero exit code: 1 when the command ran and was
refused (no server, unknown name, unreachable API server, invalid spec), 2 for bad arguments or
a file that cannot be read, 130 on Ctrl-C.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any, Sequence

if TYPE_CHECKING:
    from tailguard.operator.kube import KubeError

DEFAULT_PORT = 8080


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


def _parser() -> argparse.ArgumentParser:
    from tailguard_runtime import __version__

    parser = argparse.ArgumentParser(
        prog="tailguard", description="Serve scikit-learn models under a p99 latency SLO, on "
        "this machine (tailguard up) or on Kubernetes (tailguard operator).")
    parser.add_argument("--version", action="version", version=f"tailguard {__version__}",
                        help="print the version and exit")
    parser.set_defaults(command=None)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")

    text = "serve an InferenceService on this machine (no cluster); Ctrl-C drains and stops"
    up = sub.add_parser("up", help=text, description=text + ".")
    up.add_argument("file", help="InferenceService YAML, as given to kubectl apply")
    up.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    up.add_argument("--port", type=int, default=DEFAULT_PORT,
                    help="port to listen on (default 8080; 0 picks a free one)")
    up.add_argument("--log-level", default="WARNING",
                    help="runtime log level: DEBUG, INFO, WARNING or ERROR (default WARNING; "
                         "traffic switches are always shown)")
    up.set_defaults(func=_up)

    for name, role, text in (("rollback", "fallback", "send traffic to the fallback model"),
                             ("rollforward", "primary", "send traffic back to the primary model")):
        cmd = sub.add_parser(name, help=text, description=(
            f"{text[0].upper()}{text[1:]}: of the local tailguard up by default, or with "
            "--cluster by setting spec.traffic of the InferenceService (the operator switches "
            "once that model is Ready)."))
        _target_arguments(cmd, "tailguard up")
        cmd.set_defaults(func=_switch, role=role)

    text = "show a service's live numbers: active model, p99 against the SLO, queue, errors"
    status = sub.add_parser("status", help=text, description=(
        "Show the live numbers of the local tailguard up (active model, p99 against the SLO, "
        "queue depth, req/s, errors, rejections by reason, over the SLO window), or with "
        "--cluster the InferenceService's status."))
    _target_arguments(status, "tailguard up")
    status.set_defaults(func=_status)

    text = "check an InferenceService YAML exactly as the API server would"
    validate = sub.add_parser("validate", help=text, description=(
        "Check an InferenceService YAML exactly as the API server would (schema, defaults, CEL "
        "rules) and print it as YAML with every default filled in, ready to apply again."))
    validate.add_argument("file", help="InferenceService YAML, as given to kubectl apply")
    validate.add_argument("--models", action="store_true",
                          help="also load both models and check that the fallback is a drop-in "
                               "for the primary (same features, same classes)")
    validate.set_defaults(func=_validate)

    from tailguard.cli.bench import add_parser as add_bench

    add_bench(sub)

    from tailguard.cli.report import add_parser as add_report
    from tailguard.cli.tune import add_parser as add_tune

    add_tune(sub)
    add_report(sub)

    text = "run the Kubernetes operator (in a cluster, or against the current kubeconfig)"
    operator = sub.add_parser("operator", help=text, description=text + ".")
    operator.add_argument("-n", "--namespace", action="append", default=None,
                          help="watch only this namespace (repeatable; default: all, or "
                               "$TAILGUARD_NAMESPACES)")
    operator.set_defaults(func=_operator)
    return parser


def _target_arguments(cmd: argparse.ArgumentParser, local: str) -> None:
    cmd.add_argument("name", help="the InferenceService name (metadata.name)")
    cmd.add_argument("--port", type=int, default=None,
                     help=f"port of the local {local} (default 8080, or the only port a "
                          f"{local} of NAME runs on)")
    cmd.add_argument("--cluster", action="store_true",
                     help="talk to the cluster of the current kubeconfig context instead of "
                          "the local service")
    cmd.add_argument("-n", "--namespace", default=None,
                     help="namespace, with --cluster (default: the kubeconfig context's)")


def _up(args: argparse.Namespace) -> int:
    from tailguard_runtime.main import configure_logging

    from tailguard.up.serve import up

    configure_logging(args.log_level.upper())
    hint = ("use make up PORT=<port> to pick another port" if os.environ.get("MAKELEVEL")
            else "use --port to pick another port")
    return up(args.file, host=args.host, port=args.port, command=_spelled(), port_hint=hint)


def _spelled() -> str:
    script = Path(sys.prefix) / "bin" / "tailguard"
    return command_spelling(script, script.exists(), shutil.which("tailguard"), Path.cwd())


def command_spelling(script: Path, exists: bool, on_path: str | None, cwd: Path) -> str:
    """How to spell the ``tailguard`` command so that a printed line runs as printed.

    ``script`` is this environment's console script (``<venv>/bin/tailguard``), ``exists``
    whether it is there, ``on_path`` what ``PATH`` finds for ``tailguard`` (``None``: nothing),
    ``cwd`` the working directory. ``tailguard`` when ``PATH`` finds this very script; else the
    script's path, relative when it is under ``cwd`` (``.venv/bin/tailguard``); else
    ``python -m tailguard.cli.main`` with this environment's interpreter.
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
    return f"{shown} -m tailguard.cli.main"


def _switch(args: argparse.Namespace) -> int:
    if args.cluster:
        from tailguard.operator import kube

        try:
            kube.set_traffic(args.name, args.namespace, args.role)
        except kube.KubeError as exc:
            print(f"tailguard {args.command}: {kube_problem(exc, args.name, 'update')}",
                  file=sys.stderr)
            return 1
        print(f"{args.name}: spec.traffic set to {args.role}; the operator switches once the "
              f"{args.role} model is Ready")
        return 0
    from tailguard.up.control import find_control_file, state_dir

    control = find_control_file(args.name, args.port)
    args.port = control.port if control is not None else (args.port or DEFAULT_PORT)
    if control is None:
        # say why: nothing listens, another service listens, or no control file of ours
        stats = _local(args, "GET", "/tailguard/stats", None)
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
    reply = _local(args, "POST", "/tailguard/traffic",
                   {"name": args.name, "activeModel": args.role, "by": "cli"}, control.secret)
    if reply is None:
        return 1
    verb = "now" if reply["changed"] else "already"
    print(f"{args.name}: traffic {verb} goes to {reply['activeModel']}")
    if args.role == "primary" and reply["changed"]:
        print(f"{args.name}: the SLO guard judges the primary again from its next window "
              "(an automatic rollback, if any, is cleared)")
    return 0


def _status(args: argparse.Namespace) -> int:
    from tailguard.cli.status import cluster_lines, live_lines

    if args.cluster:
        from tailguard.operator import kube
        from tailguard.spec.resource import KIND

        try:
            namespace = args.namespace or kube.default_namespace()
            obj = kube.get(KIND, namespace, args.name)
        except kube.KubeError as exc:
            print(f"tailguard status: {kube_problem(exc, args.name, 'read')}", file=sys.stderr)
            return 1
        if obj is None:
            print(f"tailguard status: no InferenceService {args.name!r} in namespace "
                  f"{namespace!r}", file=sys.stderr)
            return 1
        print("\n".join(cluster_lines(obj)))
        return 0
    from tailguard.up.control import find_control_file

    if args.port is None:
        control = find_control_file(args.name, None)
        args.port = DEFAULT_PORT if control is None else control.port
    stats = _local(args, "GET", "/tailguard/stats", None)
    if stats is None:
        return 1
    if stats.get("name") != args.name:
        print(f"tailguard status: 127.0.0.1:{args.port} serves {stats.get('name')!r}, not "
              f"{args.name!r}", file=sys.stderr)
        return 1
    print("\n".join(live_lines(stats)))
    return 0


def _local(args: argparse.Namespace, method: str, path: str, body: dict[str, Any] | None,
           secret: str | None = None) -> dict[str, Any] | None:
    """Call the local ``tailguard up`` (``secret``: its control secret, sent as
    ``Authorization: Bearer``); ``None`` (after printing one line) on any failure."""
    import httpx

    headers = {} if secret is None else {"Authorization": f"Bearer {secret}"}
    try:
        reply = httpx.request(method, f"http://127.0.0.1:{args.port}{path}", json=body,
                              headers=headers, timeout=10)
    except httpx.HTTPError as exc:
        print(f"tailguard {args.command}: no local tailguard up answers on 127.0.0.1:{args.port} "
              f"({type(exc).__name__}); use --port, or --cluster for a cluster", file=sys.stderr)
        return None
    try:
        doc = reply.json()
    except ValueError:
        doc = None
    if reply.status_code != 200 or not isinstance(doc, dict):
        detail = doc.get("error", reply.text) if isinstance(doc, dict) else reply.text[:200]
        print(f"tailguard {args.command}: 127.0.0.1:{args.port} answered {reply.status_code}: "
              f"{detail}", file=sys.stderr)
        return None
    return doc


def kube_problem(exc: KubeError, name: str, verb: str) -> str:
    """One line for a :class:`~tailguard.operator.kube.KubeError` (``status``, ``reason``,
    message): no credentials, an unreachable API server (its address and the socket error), a
    missing InferenceService or CRD, or the API server's own refusal."""
    text = str(exc)
    if exc.reason == "NoCredentials":
        detail = text.split("no Kubernetes credentials: ", 1)[-1]
        return (f"no Kubernetes credentials ({detail}); set KUBECONFIG or use a context where "
                "kubectl works")
    if exc.reason == "Unreachable":
        where = re.search(r"host='([^']+)', port=(\d+)", text)
        why = re.search(r"\[Errno -?\d+\] ([^'\")]+)|(timed out|[A-Za-z]*SSL[A-Za-z]*Error)", text)
        return ("cannot reach the Kubernetes API server"
                + (f" at {where.group(1)}:{where.group(2)}" if where else "")
                + (f" ({(why.group(1) or why.group(2)).strip()})" if why else "")
                + "; check the kubeconfig context (kubectl cluster-info)")
    if exc.status == 404:
        return (f"cannot {verb} InferenceService {name!r}: not found (wrong name or namespace, "
                "or the tailguard CRD is not installed)")
    return f"cannot {verb} InferenceService {name!r}: the API server answered {text}"


def _validate(args: argparse.Namespace) -> int:
    import yaml

    from tailguard.up.serve import spec_error_text
    from tailguard.operator.manifests import cluster_problems
    from tailguard.spec.resource import as_applied, find_object, parse
    from tailguard.spec.schema import SpecError

    try:
        with open(args.file, encoding="utf-8") as fh:
            text = fh.read()
    except OSError as exc:
        print(f"tailguard validate: cannot read {args.file}: {exc.strerror}", file=sys.stderr)
        return 2
    try:
        written = find_object(text, args.file)
        isvc = parse(written)
    except SpecError as exc:
        print(spec_error_text("tailguard validate", args.file, exc), file=sys.stderr)
        return 1
    if args.models and not _check_models(args.file, isvc):
        return 1
    print(yaml.safe_dump(as_applied(written, isvc), sort_keys=False), end="")
    for line in cluster_problems(isvc):
        print(f"note: valid for tailguard up, but the operator refuses it: {line}", file=sys.stderr)
    if not args.models:
        print("note: models not loaded (a file:// model may live inside an image); --models "
              "loads both and checks that the fallback is a drop-in", file=sys.stderr)
    return 0


def _check_models(path: str, isvc: Any) -> bool:
    """Load both models as ``tailguard up`` does; print one line either way."""
    from tailguard_runtime.errors import ModelLoadError
    from tailguard_runtime.service import load_predictors

    try:
        predictors = load_predictors(isvc.runtime_settings())
    except ModelLoadError as exc:
        print(f"tailguard validate: {path}: {exc}", file=sys.stderr)
        return False
    primary, fallback = predictors["primary"], predictors["fallback"]
    classes = "" if primary.classes is None else f", {len(primary.classes)} classes"
    print(f"models: primary {primary.estimator_type} and fallback {fallback.estimator_type} "
          f"load; the fallback is a drop-in ({primary.n_features} features{classes})",
          file=sys.stderr)
    return True


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


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
