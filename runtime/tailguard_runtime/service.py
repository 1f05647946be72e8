"""The served InferenceService: its models by role, which one takes traffic, and its lifecycle.

A :class:`Runtime` holds one :class:`ServedModel` per role (``primary``, optionally
``fallback``), each with its own predictor, batcher (queue and model thread), metrics and
sliding-window stats. ``/v2/models/{name}`` reaches whichever role is active; a request stays on
the model that admitted it even if traffic switches while it waits. The HTTP layer lives in
``app.py``, the process lifecycle in ``server.py``.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from functools import partial
from time import perf_counter
from typing import Any, Callable

from . import metrics
from .batcher import Batcher
from .errors import ModelNotFound
from .models import Predictor, check_drop_in, load_model
from .settings import RuntimeSettings
from .stats import WindowStats

logger = logging.getLogger(__name__)

ROLES = ("primary", "fallback")


@dataclass
class ServedModel:
    """One model and everything that serves it."""

    role: str
    version: str
    predictor: Predictor
    batcher: Batcher
    metrics: metrics.RoleMetrics
    stats: WindowStats


class Runtime:
    """The models of one InferenceService and the switch between them.

    Build with :func:`load_runtime`; call :meth:`start` inside the event loop before serving.
    """

    def __init__(self, settings: RuntimeSettings, predictors: dict[str, Predictor]) -> None:
        self.settings = settings
        self.name = settings.name
        self.active_role = "primary" if "primary" in predictors else next(iter(predictors))
        self.ready = False
        self.draining = False
        self.keep_alive = True
        self.status_source: Callable[[], dict[str, Any]] | None = None
        """Set by ``tailguard up``: the InferenceService's status as its SLO guard keeps it (the
        CRD's ``status`` shape), served by the loopback ``GET /tailguard/status``."""
        """False on a pod that traffic has left (cluster mode): answers carry ``Connection:
        close`` so clients holding keep-alive connections reconnect through the Service."""
        batching = settings.batching
        self.models: dict[str, ServedModel] = {}
        for model in settings.models:
            predictor = predictors[model.role]
            slo_s = None if settings.slo_p99_ms is None else settings.slo_p99_ms / 1000.0
            role_metrics = metrics.bind(settings.name, model.version, model.role, slo_p99_s=slo_s)
            batcher = Batcher(predictor.run, max_batch_size=batching.max_batch_size,
                              max_wait_ms=batching.max_wait_ms,
                              max_queue_size=batching.max_queue_size, name=model.role,
                              observe_batch=role_metrics.observe_batch,
                              observe_queue_wait=role_metrics.queue_wait)
            role_metrics.attach_gauges(queue_depth=partial(_queue_depth, batcher),
                                       in_flight=partial(_in_flight, batcher),
                                       active=partial(self._is_active, model.role))
            self.models[model.role] = ServedModel(model.role, model.version, predictor, batcher,
                                                  role_metrics,
                                                  WindowStats(settings.stats_window_seconds,
                                                              slo_s=slo_s))

    def _is_active(self, role: str) -> float:
        return 1.0 if self.active_role == role else 0.0

    @property
    def active(self) -> ServedModel:
        """The model that new requests go to."""
        return self.models[self.active_role]

    def resolve(self, name: str, version: str | None = None) -> ServedModel:
        """The model that ``/v2/models/{name}[/versions/{version}]`` reaches: the active one.

        Raises:
            ModelNotFound: another name, or a version the active model does not have.
        """
        if name != self.name:
            raise ModelNotFound(f"model {name!r} not found; this runtime serves {self.name!r}")
        served = self.active
        if version is not None and version != served.version:
            raise ModelNotFound(f"model {name!r} has no version {version!r}; it serves "
                                f"version {served.version!r}")
        return served

    def totals(self, now: float) -> dict[str, Any]:
        """Cumulative counts per role (:meth:`~tailguard_runtime.stats.Totals.snapshot`), read at
        ``now`` (``perf_counter`` seconds): what the SLO guard differences into windows."""
        return {role: served.stats.totals.snapshot(served.batcher.queue_row_seconds(now))
                for role, served in self.models.items()}

    def switch(self, role: str) -> bool:
        """Send new requests to ``role``; requests already admitted finish where they are.

        Returns whether anything changed.

        Raises:
            KeyError: ``role`` is not one of the served roles.
        """
        if role not in self.models:
            raise KeyError(f"no {role!r} model is served; roles: {list(self.models)}")
        if role == self.active_role:
            return False
        logger.info("traffic switched service=%s from=%s to=%s", self.name, self.active_role, role)
        self.active_role = role
        return True

    async def start(self) -> None:
        """Start every batch loop and mark the runtime ready."""
        for served in self.models.values():
            served.batcher.start()
        self.ready = True

    async def drain(self, grace_s: float) -> int:
        """Turn readiness off, stop admitting, flush, and wait up to ``grace_s`` seconds for
        admitted requests. Returns how many were answered 503 when the grace period ended."""
        self.draining = True
        self.keep_alive = False  # clients reconnect elsewhere instead of reusing this pod
        results = await asyncio.gather(*(m.batcher.drain(grace_s) for m in self.models.values()))
        return sum(results)

    async def close(self) -> None:
        """Stop the batch loops and their model threads."""
        for served in self.models.values():
            await served.batcher.close()


def _queue_depth(batcher: Batcher) -> float:
    return float(batcher.queue_depth)


def _in_flight(batcher: Batcher) -> float:
    return float(len(batcher.in_flight))


def load_runtime(settings: RuntimeSettings, *,
                 on_loading: Callable[[str, str], None] | None = None,
                 on_loaded: Callable[[str, Predictor, float], None] | None = None) -> Runtime:
    """Load every model the settings name (blocking: may train builtin models) and check that
    the fallback is a drop-in for the primary.

    Progress hooks: ``on_loading(role, uri)`` before each model, ``on_loaded(role, predictor,
    seconds)`` after it.

    Raises:
        ModelLoadError: a model could not be loaded, or the fallback does not match.
    """
    predictors: dict[str, Predictor] = {}
    for model in settings.models:
        logger.info("loading model service=%s role=%s uri=%s", settings.name, model.role, model.uri)
        if on_loading is not None:
            on_loading(model.role, model.uri)
        started = perf_counter()
        predictors[model.role] = load_model(model.uri, model.sha256,
                                            fast_forests=settings.fast_forests)
        if on_loaded is not None:
            on_loaded(model.role, predictors[model.role], perf_counter() - started)
    if "primary" in predictors and "fallback" in predictors:
        check_drop_in(predictors["primary"], predictors["fallback"])
    return Runtime(settings, predictors)
