"""``tailguard-runtime --config FILE [--role ROLE]``: the container entry point.

It reads the runtime config the operator wrote, loads the model(s), binds the port and hands
over to :mod:`tailguard_runtime.server` for the lifecycle (serve, drain on SIGTERM). Every
startup failure is one line on stderr and exit code 2.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import sys
from typing import Awaitable, Callable

from tailguard_runtime.errors import ModelLoadError, model_cause
from tailguard_runtime.server import (
    DrainingServer,
    base_url,
    bind_socket,
    follow_traffic,
    free_port,
    limit_threads,
    run,
    serve,
)
from tailguard_runtime.service import load_runtime
from tailguard_runtime.settings import RuntimeSettings

logger = logging.getLogger(__name__)


def configure_logging(level: str = "INFO") -> None:
    """Plain ``time level logger message`` lines on stderr (httpx and httpcore at WARNING or
    above)."""
    logging.basicConfig(level=level, stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s %(message)s")
    # httpx logs each request's whole URL at INFO: a presigned model URL's signature with it.
    for chatty in ("httpx", "httpcore"):
        logging.getLogger(chatty).setLevel(max(logging.WARNING, logging.getLogger().level))


def main(argv: list[str] | None = None) -> int:
    """``tailguard-runtime``: serve one InferenceService's model(s) from a runtime config file."""
    parser = argparse.ArgumentParser(prog="tailguard-runtime", description=main.__doc__)
    parser.add_argument("--config", required=True, help="runtime config JSON (written by the operator)")
    parser.add_argument("--traffic", metavar="PATH",
                        help="a JSON file whose activeModel names the role traffic goes to, "
                             "re-read while serving (default: the --config file)")
    parser.add_argument("--role", choices=("primary", "fallback"),
                        help="serve only this role's model (the cluster runs one role per pod)")
    parser.add_argument("--host", default="0.0.0.0")
    parser.add_argument("--port", type=int, default=8080)
    parser.add_argument("--grpc-port", type=int, default=None, metavar="PORT",
                        help="port of the gRPC service (default: the config's grpcPort, 8081 "
                             "unless set; a free one with --port 0; 0 picks a free one)")
    parser.add_argument("--log-level", default="INFO")
    parser.add_argument("--no-fast-forests", dest="fast_forests", action="store_false",
                        help="call scikit-learn's own forest predict_proba (for comparisons)")
    parser.add_argument("--termination-log", metavar="PATH",
                        help="write why the model did not load here, as 'CAUSE: message' "
                             "(the operator passes the pod's /dev/termination-log)")
    args = parser.parse_args(argv)
    configure_logging(args.log_level)
    limit_threads()
    try:
        with open(args.config, encoding="utf-8") as fh:
            settings = RuntimeSettings.from_config(json.load(fh))
        if args.role:
            settings = settings.for_role(args.role)
        settings = dataclasses.replace(settings, fast_forests=args.fast_forests)
    except (OSError, ValueError, KeyError, TypeError) as exc:
        print(f"tailguard-runtime: bad config {args.config}: {type(exc).__name__}: {exc}",
              file=sys.stderr)
        return 2
    try:
        runtime = load_runtime(settings)
    except ModelLoadError as exc:
        why = f"{model_cause(exc)}: {exc}"
        print(f"tailguard-runtime: {why}", file=sys.stderr)
        if args.termination_log:
            _write_termination_log(args.termination_log, why)
        return 2
    try:
        sock = bind_socket(args.host, args.port)
    except OSError as exc:
        print(f"tailguard-runtime: cannot listen on {args.host}:{args.port}: {exc.strerror}",
              file=sys.stderr)
        return 2
    grpc_port = args.grpc_port
    if grpc_port is None:
        grpc_port = 0 if args.port == 0 else settings.grpc_port
    try:
        if grpc_port is not None:
            grpc_port = free_port(args.host, grpc_port)
    except OSError as exc:
        print(f"tailguard-runtime: cannot listen on {args.host}:{grpc_port} for gRPC: "
              f"{exc.strerror}", file=sys.stderr)
        return 2
    logger.info("serving service=%s on %s grpc=%s", settings.name,
                base_url(args.host, sock.getsockname()[1]), grpc_port)
    follow: Callable[[DrainingServer], Awaitable[None]] | None = None
    if args.role:
        async def follow(_: DrainingServer) -> None:
            await follow_traffic(runtime, args.traffic or args.config, args.role)
    try:
        run(serve(runtime, sock, grpc_port=grpc_port, on_started=follow))
    except OSError as exc:  # the gRPC port
        print(f"tailguard-runtime: {exc.strerror or exc}", file=sys.stderr)
        return 2
    return 0


def _write_termination_log(path: str, line: str) -> None:
    """Leave ``line`` where the kubelet reads a container's termination message (it keeps at
    most 4096 bytes of it), or say on stderr why it could not."""
    try:
        with open(path, "w", encoding="utf-8") as fh:
            fh.write(line[:4000])
    except OSError as exc:
        print(f"tailguard-runtime: cannot write {path}: {exc.strerror}", file=sys.stderr)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
