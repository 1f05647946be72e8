"""What ``tailguard tune`` and ``tailguard report`` share: the spec, its models, its rows, a
served copy of it, and one load run against that copy.

Thin glue over the pieces that exist elsewhere: the spec's validation (:mod:`tailguard.spec.resource`), model
loading (:mod:`tailguard_runtime.service`), ``tailguard bench``'s row choice
(:mod:`tailguard.bench.target`), its way to start ``tailguard up`` (:mod:`tailguard.up.child`) and its load generator
(:mod:`tailguard.bench.loadgen`). Every refusal is an :class:`Unusable` with a one-line message.
"""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Callable, Iterator

import numpy as np

from tailguard.bench.loadgen import Progress
from tailguard.bench.plan import Bounds, LoadResult, Schedule
from tailguard.spec.resource import InferenceService
from tailguard.up.child import UpProcess
from tailguard_runtime.models import Predictor


class Unusable(Exception):
    """The spec, its models or its rows cannot be used; ``str()`` is one line. ``usage`` is
    True for bad input (an unreadable file, an invalid spec: exit code 2), False for a refusal
    (a model that does not load, rows that do not fit: exit code 1)."""

    def __init__(self, message: str, *, usage: bool = False) -> None:
        super().__init__(message)
        self.usage = usage


class ServeFailed(Exception):
    """``tailguard up`` did not start; ``str()`` is one line with the last thing it printed."""


def read_service(path: str | Path) -> tuple[InferenceService, str]:
    """The validated InferenceService in ``path`` and the file's text, line ends as written.

    Raises:
        Unusable: the file cannot be read (``usage``), or the CRD refuses the spec.
    """
    from tailguard.spec.resource import read_file
    from tailguard.spec.schema import SpecError

    try:
        found = read_file(path)
    except OSError as exc:
        raise Unusable(f"cannot read {path}: {exc.strerror}", usage=True) from None
    except SpecError as exc:
        more = (f" (and {len(exc.errors) - 1} more; tailguard validate lists them)"
                if len(exc.errors) > 1 else "")
        raise Unusable(f"{path} is not a valid InferenceService: {exc.errors[0]}{more}",
                       usage=True) from None
    return found.isvc, found.text


def load_models(isvc: InferenceService) -> dict[str, Predictor]:
    """Both models (``primary``, ``fallback``) as ``tailguard up`` loads them, the fallback
    checked as a drop-in, with one BLAS thread (as the runtime runs them).

    Raises:
        Unusable: a model cannot load, or the fallback is not a drop-in.
    """
    from tailguard_runtime.errors import ModelLoadError
    from tailguard_runtime.server import limit_threads
    from tailguard_runtime.service import load_predictors

    limit_threads()
    try:
        predictors: dict[str, Predictor] = load_predictors(isvc.runtime_settings())
    except ModelLoadError as exc:
        raise Unusable(str(exc)) from None
    return predictors


def service_rows(isvc: InferenceService, rows_file: str | None,
                 n_features: int) -> tuple[np.ndarray, str]:
    """Rows to send and where they came from: ``rows_file``, else the builtin model's own
    dataset (``tailguard bench``'s rule: rows are never invented).

    Raises:
        Unusable: no rows for a ``file://`` model without ``rows_file``, or the wrong width.
    """
    from tailguard.bench.target import BenchRefused, ModelInput, choose_rows

    try:
        return choose_rows(ModelInput(n_features, "FP64", isvc.model.uri), rows_file)
    except BenchRefused as exc:
        raise Unusable(str(exc)) from None


def start(spec: Path, *, own_session: bool = False) -> UpProcess:
    """Start ``tailguard up`` for ``spec`` on a free loopback port and wait for its banner; the
    caller stops it (:meth:`~tailguard.up.child.UpProcess.stop`: drain, then exit, by PID).
    ``own_session``: a Ctrl-C at the terminal does not reach it (``tailguard bench`` reports
    what it measured first).

    Raises:
        ServeFailed: it did not start.
    """
    from tailguard.up.child import UpFailed, start_up

    try:
        return start_up(spec, own_session=own_session)
    except UpFailed as exc:
        printed = [line for line in str(exc).splitlines()[1:] if line.strip()]
        raise ServeFailed(f"tailguard up {spec} did not start: "
                          f"{printed[-1] if printed else 'no output'}") from None


@contextlib.contextmanager
def served(spec: Path) -> Iterator[str]:
    """Serve ``spec`` (:func:`start`) for the ``with`` block; yields its base URL
    (``http://127.0.0.1:PORT``) and stops it afterwards.

    Raises:
        ServeFailed: it did not start.
    """
    up = start(spec)
    try:
        yield up.base
    finally:
        up.stop()


def measure(base: str, name: str, rows: np.ndarray, schedule: Schedule, bounds: Bounds,
            on_progress: Callable[[Progress], None] | None = None) -> LoadResult:
    """One run of ``tailguard bench``'s generator against the served ``name`` at ``base``
    (one row per request, FP64). Raises OSError when nothing listens there."""
    from tailguard.bench.loadgen import Target, run_load, run_sync
    from tailguard.bench.target import encode_bodies, parse_url

    target = parse_url(f"{base}/v2/models/{name}")
    bodies = encode_bodies(rows, "FP64", 1)
    return run_sync(run_load(Target(target.host, target.port, target.model_path + "/infer",
                                    bodies, 1), schedule, bounds, on_progress=on_progress))
