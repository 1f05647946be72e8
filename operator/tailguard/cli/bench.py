"""``tailguard bench TARGET``: load-test a served InferenceService, open or closed loop.

A thin shell: it resolves the target (a URL, or an InferenceService YAML that it serves with
`tailguard up` for the run and stops afterwards), reads the model's metadata and picks rows
(:mod:`~tailguard.bench.target`), runs the project's load generator (:mod:`~tailguard.bench.loadgen`) once per rate or
concurrency, judges a rate sweep against the SLO (:mod:`~tailguard.bench.plan`), and shows a progress bar
and tables with rich (:mod:`~tailguard.cli.view`) or prints one JSON object (``--json``).

Exit codes: 0 a conclusive run; 1 refused (no server, bad metadata, no rows, a spec whose
models do not load); 2 bad arguments, or a spec that cannot be read or is invalid; 3 the run finished but the generator itself limited it (marked
invalid) and, with an SLO, missed it (a run within the SLO is conclusive whatever the
generator did: latency counts from the scheduled time, so a late generator only makes it
longer); 130 on Ctrl-C. Ctrl-C after the warm-up ends the measured window there, as ``hey``
and ``vegeta`` do: what was measured is reported (and its records written), marked
interrupted, then the exit code is 130; a second Ctrl-C, or one during the warm-up, stops at
once.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tailguard.cli.options import add_load_window, add_max_lag, add_rows

if TYPE_CHECKING:  # numpy and the generator load only when bench runs
    from tailguard.bench.plan import Bounds, LoadResult
    from tailguard.bench.target import TargetURL


def add_parser(sub: Any) -> None:
    """Register ``bench`` on the ``tailguard`` subcommands."""
    text = "load-test a served InferenceService (open or closed loop) and report its tail"
    cmd = sub.add_parser("bench", help=text, description=(
        "Load-test a served InferenceService. TARGET is its URL "
        "(http://HOST:PORT/v2/models/NAME) or an InferenceService YAML, which is served with "
        "tailguard up for the run. Open loop (--rate) measures latency from each request's "
        "scheduled send time, so a stalled server cannot hide its tail; --rate A:B:STEP sweeps "
        "and reports the highest rate whose p99 stays within the SLO."))
    cmd.add_argument("target", help="http://HOST:PORT/v2/models/NAME, or an InferenceService YAML")
    load = cmd.add_mutually_exclusive_group(required=True)
    load.add_argument("--rate", help="open loop: R requests/s, or A:B:STEP to sweep rates")
    load.add_argument("--concurrency", type=int, help="closed loop: N requests in flight")
    cmd.add_argument("--arrivals", choices=("poisson", "uniform"), default="poisson",
                     help="open-loop arrival process (default poisson)")
    add_load_window(cmd, duration_s=10.0, warmup_s=2.0)
    cmd.add_argument("--max-requests", type=int, default=1_000_000,
                     help="most requests one run sends, warm-up included (default 1000000)")
    cmd.add_argument("--timeout", type=float, default=10.0,
                     help="seconds before an unanswered request counts as an error (default 10)")
    cmd.add_argument("--connections", type=int, default=256,
                     help="most connections open at once (default 256)")
    add_rows(cmd)
    cmd.add_argument("--rows-per-request", type=int, default=1, help="rows per request (default 1)")
    cmd.add_argument("--binary", action="store_true",
                     help="send the rows as binary tensor data (the v2 binary extension, as "
                          "tritonclient does by default) and ask for binary outputs")
    cmd.add_argument("--protocol", choices=("http", "grpc"), default="http",
                     help="http (REST, the default) or grpc: ModelInfer calls of the Open "
                          "Inference Protocol's gRPC service, the rows as raw contents")
    cmd.add_argument("--grpc-port", type=int, default=None, metavar="PORT",
                     help="the gRPC port, with --protocol grpc and a URL target (default 8081; "
                          "for a YAML target, the port tailguard up serves)")
    cmd.add_argument("--slo-ms", type=float,
                     help="the p99 SLO in ms (default: the spec's slo.p99LatencyMs; needed for "
                          "a sweep against a URL)")
    add_max_lag(cmd)
    cmd.add_argument("--allow-host", help="allow load on this non-loopback host (named exactly)")
    cmd.add_argument("--seed", type=int, default=0, help="seed of the Poisson arrivals")
    cmd.add_argument("--json", action="store_true", help="print one JSON object instead of tables")
    cmd.add_argument("--records", metavar="FILE",
                     help="also write one JSON line per request of each measured window: run, "
                          "scheduled, sent, done (Unix s), status, role and model "
                          "(X-Tailguard-Role, X-Tailguard-Model)")
    cmd.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Run ``tailguard bench``; returns the exit code (see the module docstring)."""
    from tailguard.bench.loadgen import LOOPBACK
    from tailguard.bench.plan import Bounds, lag_limit_ms, parse_rates
    from tailguard.bench.serving import Unusable
    from tailguard.bench.target import (
        BenchRefused,
        choose_rows,
        encode_bodies,
        encode_messages,
        parse_url,
        read_metadata,
    )

    try:
        rates = parse_rates(args.rate) if args.rate is not None else None
        bounds = Bounds(args.duration, args.warmup, args.max_requests, args.timeout,
                        args.connections, lag_limit_ms(None, args.max_lag_ms))
        if args.concurrency is not None and args.concurrency < 1:
            raise ValueError("--concurrency must be >= 1")
    except ValueError as exc:
        flags = {"duration_s": "--duration", "warmup_s": "--warmup",
                 "max_requests": "--max-requests", "timeout_s": "--timeout",
                 "max_connections": "--connections", "max_lag_p99_ms": "--max-lag-ms"}
        field, _, rest = str(exc).partition(" ")
        print(f"tailguard bench: {flags.get(field, field)} {rest}", file=sys.stderr)
        return 2
    spec_path = Path(args.target)
    up = None
    try:
        slo_ms = args.slo_ms
        if spec_path.suffix in (".yaml", ".yml") or spec_path.is_file():
            name, spec_slo = _read_spec(spec_path)
            slo_ms = slo_ms if slo_ms is not None else spec_slo
            up = _serve(spec_path, args)
            target = parse_url(f"{up.base}/v2/models/{name}")
        else:
            target = parse_url(args.target)
        if rates is not None and len(rates) > 1 and slo_ms is None:
            raise BenchRefused("a rate sweep needs the SLO: give --slo-ms for a URL")
        bounds = dataclasses.replace(bounds, max_lag_p99_ms=lag_limit_ms(slo_ms, args.max_lag_ms))
        if target.host not in LOOPBACK and target.host != args.allow_host:
            raise BenchRefused(f"{target.host} is not loopback; name it with --allow-host "
                               f"{target.host} to load it")
        model = read_metadata(target)
        rows, source = choose_rows(model, args.rows)
        grpc_port = None
        if args.protocol == "grpc":
            if args.binary:
                raise BenchRefused("--binary is a REST encoding; --protocol grpc sends the "
                                   "rows as raw contents already")
            grpc_port = up.grpc_port if up is not None else (args.grpc_port or 8081)
            bodies = encode_messages(rows, model.datatype, args.rows_per_request, target.name)
        else:
            bodies = encode_bodies(rows, model.datatype, args.rows_per_request,
                                   binary=args.binary)
        return _measure(args, target, bodies, source, rates, bounds, slo_ms, grpc_port)
    except BenchRefused as exc:
        print(f"tailguard bench: {exc}", file=sys.stderr)
        return 1
    except Unusable as exc:  # the spec: unreadable or invalid
        print(f"tailguard bench: {exc}", file=sys.stderr)
        return 2 if exc.usage else 1
    finally:
        if up is not None:
            up.stop()


def _read_spec(path: Path) -> tuple[str, float]:
    """The name and SLO (ms) of the InferenceService in ``path`` (:func:`tailguard.bench.serving.read_service`).

    Raises:
        Unusable: the file cannot be read or is not a valid InferenceService (exit code 2).
    """
    from tailguard.bench.serving import read_service

    isvc, _ = read_service(path)
    return isvc.name, float(isvc.slo.p99_latency_ms)


def _serve(spec: Path, args: argparse.Namespace) -> Any:
    """``tailguard up`` for ``spec`` (:func:`tailguard.bench.serving.start`), its progress line unless --json.

    Raises:
        BenchRefused: it did not start.
    """
    from tailguard.bench.serving import ServeFailed, start
    from tailguard.bench.target import BenchRefused

    if not args.json:
        print(f"starting tailguard up {spec} ...", file=sys.stderr, flush=True)
    try:
        return start(spec, own_session=True)  # Ctrl-C cuts the window; the server stays up
    except ServeFailed as exc:
        raise BenchRefused(str(exc)) from None


def _measure(args: argparse.Namespace, target: TargetURL, bodies: tuple[bytes, ...], source: str,
             rates: list[float] | None, bounds: Bounds, slo_ms: float | None,
             grpc_port: int | None = None) -> int:
    from tailguard.bench.loadgen import Target, run_load, run_sync
    from tailguard.bench.plan import ClosedLoop, OpenLoop, outcome, sweep_verdict
    from tailguard.bench.target import BenchRefused
    from tailguard.cli import view

    gen_target = Target(target.host, target.port, target.model_path + "/infer", bodies,
                        args.rows_per_request, binary=args.binary, grpc_port=grpc_port)
    schedules: list[OpenLoop | ClosedLoop] = (
        [OpenLoop(r, args.arrivals == "poisson", args.seed) for r in rates] if rates
        else [ClosedLoop(args.concurrency)])
    results: list[LoadResult] = []
    outcomes: list[str] = []
    cut_at: OpenLoop | ClosedLoop | None = None  # the run Ctrl-C cut short or stopped
    with view.progress(quiet=args.json) as show:
        for schedule in schedules:
            label = (f"{schedule.rate:g} req/s" if isinstance(schedule, OpenLoop)
                     else f"{schedule.concurrency} in flight")
            try:
                result = run_sync(run_load(gen_target, schedule, bounds,
                                           on_progress=show.start(label),
                                           allow_host=args.allow_host,
                                           record=args.records is not None,
                                           interruptible=True))
            except OSError as exc:
                where = target.base if grpc_port is None else f"{target.host}:{grpc_port} (gRPC)"
                raise BenchRefused(f"cannot connect to {where}: {exc.strerror or exc}")
            except KeyboardInterrupt:  # in a warm-up: report the rates that ran, if any
                if not results:
                    raise
                cut_at = schedule
                break
            results.append(result)
            if result.interrupted:
                cut_at = schedule
                break
            if slo_ms is not None:
                outcomes.append(outcome(result, slo_ms))
                if len(schedules) > 1 and outcomes[-1] != "held":
                    break
    interrupted = cut_at is not None
    sweep = (sweep_verdict(rates[:len(outcomes)], outcomes, interrupted_at=(
        cut_at.rate if isinstance(cut_at, OpenLoop) else None)) if rates and len(rates) > 1
        else None)
    if results[-1].interrupted and slo_ms is not None:  # judged on its own, never in a sweep
        outcomes.append(outcome(results[-1], slo_ms))
    report: dict[str, Any] = {
        "target": target.base + target.model_path, "rows": source,
        "protocol": "grpc" if grpc_port is not None else (
            "http-binary" if args.binary else "http"),
        "rowsPerRequest": args.rows_per_request, "sloMs": slo_ms,
        "runs": [r.as_dict() | ({"slo": outcomes[k]} if k < len(outcomes) else {})
                 for k, r in enumerate(results)],
        "sweep": None if sweep is None else {"rateAtSlo": sweep.rate_at_slo,
                                             "stoppedAt": sweep.stopped_at,
                                             "reason": sweep.reason},
        "valid": all(r.valid or (k < len(outcomes) and outcomes[k] == "held")
                     for k, r in enumerate(results)),
        "interrupted": interrupted}
    if args.records:
        _write_records(Path(args.records), results)
    if args.json:
        print(json.dumps(report))
    else:
        view.print_report(report)
    if interrupted:
        print("tailguard bench: interrupted; the report covers what ran", file=sys.stderr)
        return 130
    return 0 if report["valid"] else 3


def _write_records(path: Path, results: list[LoadResult]) -> None:
    from tailguard.bench.target import BenchRefused

    try:
        with path.open("w", encoding="utf-8") as out:
            for index, result in enumerate(results):
                for record in result.records or []:
                    out.write(json.dumps({"run": index, **record}) + "\n")
    except OSError as exc:
        raise BenchRefused(f"--records {path}: cannot write: {exc.strerror}") from exc
