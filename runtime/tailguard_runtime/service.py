"""The served InferenceService: its models by role, which one takes traffic, and its lifecycle.

A :class:`Runtime` holds one :class:`ServedModel` per role (``primary``, optionally
``fallback``), each with its own predictor, batcher (queue and model thread), metrics and
sliding-window stats. ``/v2/models/{name}`` reaches whichever role is active; a request stays on
the model that admitted it even if traffic switches while it waits. The HTTP layer lives in
``app.py``, the process lifecycle in ``server.py``.
"""

from __future__ import annotations

import asyncio
import datetime
import logging
import re
from dataclasses import dataclass, field
from functools import partial
from time import perf_counter
from typing import Any, Callable

from tailguard_runtime import metrics
from tailguard_runtime.batcher import Batcher
from tailguard_runtime.errors import (
    Draining,
    GraceEnded,
    ModelFailed,
    ModelNotFound,
    NotReady,
    TailguardError,
)
from tailguard_runtime.models import Predictor, check_drop_in, load_model
from tailguard_runtime.settings import RuntimeSettings
from tailguard_runtime.stats import WindowStats
from tailguard_runtime.uris import shown
from tailguard_runtime.wire import served_by

logger = logging.getLogger(__name__)
traffic_logger = logging.getLogger("tailguard_runtime.traffic")
"""Traffic switches, one INFO line each; ``tailguard up`` shows this logger at any log level."""

ROLES = ("primary", "fallback")
DEADLINE_REASONS = frozenset(("deadline_exceeded", "deadline"))
"""A 504 for a passed deadline, and a 429 for a deadline the queue cannot meet."""
SWITCHED_BY = re.compile(r"[a-z][a-z0-9_-]{0,31}")
"""What may name who switched traffic (``cli``, ``guard``, ``spec``, ...): one short word, so
a caller cannot forge extra fields in the log line."""


@dataclass
class ServedModel:
    """One model and everything that serves it."""

    role: str
    version: str
    predictor: Predictor
    batcher: Batcher
    metrics: metrics.RoleMetrics
    stats: WindowStats
    headers: list[tuple[bytes, bytes]] = field(init=False)
    """The ``X-Tailguard-Role``/``-Model``/``-Model-Version`` headers of every reply this
    model's role gives (computed once)."""
    parameters: dict[str, str] = field(init=False)
    """The v2 response ``parameters``: ``{"role": ..., "model_uri": ...}`` (computed once)."""

    def __post_init__(self) -> None:
        self.headers = served_by(self.role, self.predictor.uri, self.version)
        self.parameters = {"role": self.role, "model_uri": self.predictor.uri}


@dataclass(frozen=True)
class Switch:
    """One traffic switch: who made it (``cli``, ``guard``, ``spec``, ...), from which role to
    which, and when (UTC)."""

    service: str
    from_role: str
    to_role: str
    by: str
    at: datetime.datetime

    def line(self) -> str:
        """The switch as one ``key=value`` log line, the time in ISO 8601 (UTC, ms)."""
        return (f"traffic switched service={self.service} from={self.from_role} "
                f"to={self.to_role} by={self.by} at={iso(self.at)}")

    def as_json(self) -> dict[str, str]:
        """The switch for the stats route: ``from``, ``to``, ``by``, ``at`` (ISO 8601)."""
        return {"from": self.from_role, "to": self.to_role, "by": self.by, "at": iso(self.at)}


@dataclass(frozen=True)
class DrainReport:
    """What a drain did: ``in_flight`` requests were admitted when it began; ``cut_off`` of
    them were still unanswered when the grace period ended (answered 503); ``refused`` new
    requests were answered 503 while it ran (the server goes on refusing until it stops
    listening: :attr:`Runtime.refused_draining` has the final count)."""

    in_flight: int
    cut_off: int
    refused: int

    @property
    def drained(self) -> int:
        """Admitted requests answered by their model (or with their own error) during the drain."""
        return self.in_flight - self.cut_off

    def line(self) -> str:
        """One line for people: drained and 503 counts."""
        return (f"drained {self.drained} in-flight request(s); {self.cut_off + self.refused} "
                f"answered 503 ({self.cut_off} cut off when the grace period ended, "
                f"{self.refused} arrived while draining)")


def iso(at: datetime.datetime) -> str:
    """``at`` as ISO 8601 in UTC with milliseconds, e.g. ``2026-12-01T08:45:00.123Z``."""
    return at.astimezone(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"


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
        self.last_switch: Switch | None = None
        """The latest traffic switch, for the stats route; ``None`` before the first."""
        self.refused_draining = 0
        """Requests answered 503 because the runtime was draining (the HTTP layer counts)."""
        self.drain_report: DrainReport | None = None
        """Set when :meth:`drain` returns."""
        self.keep_alive = True
        """False on a pod that traffic has left (cluster mode) or that is leaving: answers carry
        ``Connection: close`` so clients holding keep-alive connections reconnect through the
        Service."""
        self.leaving = False
        """True once :meth:`leave` was called (the pod's preStop hook): keep-alive stays off."""
        self.status_source: Callable[[], dict[str, Any]] | None = None
        """Set by ``tailguard up``: the InferenceService's status as its SLO guard keeps it (the
        CRD's ``status`` shape), served by the loopback ``GET /tailguard/status``."""
        batching = settings.batching
        self.models: dict[str, ServedModel] = {}
        for model in settings.models:
            predictor = predictors[model.role]
            slo_s = None if settings.slo_p99_ms is None else settings.slo_p99_ms / 1000.0
            role_metrics = metrics.bind(settings.name, model.version, model.role, slo_p99_s=slo_s)
            stats = WindowStats(settings.stats_window_seconds, slo_s=slo_s,
                                max_batch_size=batching.max_batch_size)
            batcher = Batcher(predictor.run, max_batch_size=batching.max_batch_size,
                              max_wait_ms=batching.max_wait_ms,
                              max_queue_size=batching.max_queue_size, name=model.role,
                              observe_batch=partial(_observe_batch, role_metrics, stats),
                              observe_queue_wait=role_metrics.queue_wait)
            role_metrics.attach_gauges(queue_depth=partial(_queue_depth, batcher),
                                       in_flight=partial(_in_flight, batcher),
                                       active=partial(self._is_active, model.role))
            self.models[model.role] = ServedModel(model.role, model.version, predictor, batcher,
                                                  role_metrics, stats)

    def _is_active(self, role: str) -> float:
        return 1.0 if self.active_role == role else 0.0

    @property
    def active(self) -> ServedModel:
        """The model that new requests go to."""
        return self.models[self.active_role]

    @property
    def broken(self) -> str | None:
        """Why the runtime can no longer serve (a model thread crashed), or ``None``. Only a
        restart mends it, so liveness turns 503 (a kubelet then restarts the container)."""
        for role, served in self.models.items():
            if served.batcher.failure is not None:
                return f"the {role} model cannot serve: {served.batcher.failure}"
        return None

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

    def readiness(self) -> TailguardError | None:
        """Why the model is not ready to serve (503: broken, draining, still loading), or
        ``None`` when it is: what the v2 readiness routes and the gRPC ``ModelReady`` say."""
        if self.broken is not None:
            return NotReady(self.broken)
        if self.draining:
            return Draining("runtime is draining")
        if not self.ready:
            return NotReady("models are not loaded yet")
        return None

    def model_metadata(self, served: ServedModel) -> dict[str, Any]:
        """The v2 model metadata of ``served`` (``GET /v2/models/{name}``, gRPC
        ``ModelMetadata``): one input ``[-1, n_features]``, the model's outputs, and
        ``parameters`` naming the role, URI, estimator type and, when the model knows them,
        its feature names."""
        p = served.predictor
        return {
            "name": self.name, "versions": [served.version], "platform": "scikit-learn",
            "inputs": [{"name": "input-0", "datatype": "FP64", "shape": [-1, p.n_features]}],
            "outputs": [{"name": o.name, "datatype": o.datatype, "shape": list(o.shape)}
                        for o in p.outputs],
            "parameters": {"role": served.role, "uri": p.uri, "estimator": p.estimator_type,
                           **({"feature_names": list(p.feature_names)}
                              if p.feature_names else {})},
        }

    def shortened(self, timeout_s: float | None) -> bool:
        """Whether the client shortened a request's deadline (``timeout_s``, seconds) below the
        SLO: then none of its outcomes can witness a breach
        (:data:`~tailguard_runtime.stats.EXCLUDED_REASONS`). A spec whose own ``timeoutMs`` is
        below the SLO shortens nothing: its requests are judged."""
        slo_ms = self.settings.slo_p99_ms
        return (timeout_s is not None and slo_ms is not None
                and timeout_s < self.settings.batching.timeout_ms / 1000.0
                and timeout_s < slo_ms / 1000.0)

    def record_answer(self, served: ServedModel, arrival: float, now: float,
                      timeout_s: float) -> None:
        """Count a request ``served`` answered: its latency from ``arrival`` to ``now``
        (``perf_counter`` seconds) in the metrics, and in the SLO stats unless its deadline
        ``timeout_s`` was shortened (:meth:`shortened`)."""
        served.metrics.request_duration(now - arrival)
        served.metrics.count_ok()
        if self.shortened(timeout_s):
            served.stats.excluded(now, "short_deadline")
        else:
            served.stats.admitted(now, now - arrival, True)

    def record_failure(self, served: ServedModel | None, exc: TailguardError, arrival: float,
                       now: float, admitted: bool, timeout_s: float | None) -> None:
        """Count a request refused or failed with ``exc``, whatever the protocol.
        ``served``: the role it reached once past readiness (``None`` before: only a refusal
        while draining is counted); ``admitted``: it reached the queue, so a 500 or 504
        counts its latency toward the SLO. What the SLO guard may not judge is left out of
        the stats (:data:`~tailguard_runtime.stats.EXCLUDED_REASONS`): a 422 for rows the
        model rejected, and a 504 or deadline refusal whose deadline ``timeout_s`` (s) the
        client shortened below the SLO."""
        if isinstance(exc, Draining) and not isinstance(exc, GraceEnded):
            self.refused_draining += 1
        if served is None:
            return
        served.metrics.count(exc.status_code, exc.reason)
        failed = admitted and (exc.status_code in (500, 504) or isinstance(exc, ModelFailed))
        if failed:
            served.metrics.request_duration(now - arrival)
        if isinstance(exc, ModelFailed) and exc.status_code == 422:
            served.stats.excluded(now, "input_rejected")
        elif exc.reason in DEADLINE_REASONS and self.shortened(timeout_s):
            served.stats.excluded(now, "short_deadline")
        elif failed:
            served.stats.admitted(now, now - arrival, False, exc.reason)
        else:
            served.stats.refused(now, exc.reason)

    def totals(self, now: float) -> dict[str, Any]:
        """Cumulative counts per role (:meth:`~tailguard_runtime.stats.Totals.snapshot`), read at
        ``now`` (``perf_counter`` seconds): what the SLO guard differences into windows."""
        return {role: served.stats.totals.snapshot(served.batcher.queue_row_seconds(now))
                for role, served in self.models.items()}

    def switch(self, role: str, *, by: str = "api",
               now: datetime.datetime | None = None) -> bool:
        """Send new requests to ``role``; requests already admitted finish where they are.

        ``by`` names who switched (``cli``, ``guard``, ``spec``; one lowercase word), ``now``
        when (default: the wall clock, UTC). A switch that changes something logs exactly one
        line (:meth:`Switch.line`, logger ``tailguard_runtime.traffic``, level INFO) and is
        kept as :attr:`last_switch`. Returns whether anything changed.

        Raises:
            KeyError: ``role`` is not one of the served roles.
            ValueError: ``by`` is not one short lowercase word.
        """
        if role not in self.models:
            raise KeyError(f"no {role!r} model is served; roles: {list(self.models)}")
        if not SWITCHED_BY.fullmatch(by):
            raise ValueError(f"'by' must be one short lowercase word (cli, guard, ...), got {by!r}")
        if role == self.active_role:
            return False
        at = now or datetime.datetime.now(datetime.timezone.utc)
        self.last_switch = Switch(self.name, self.active_role, role, by, at)
        self.active_role = role
        traffic_logger.info("%s", self.last_switch.line())
        return True

    def describe(self) -> dict[str, Any]:
        """The service's identity for the stats route: ``sloP99Ms`` (``None`` when not
        declared), ``lastSwitch`` (``None`` before the first) and each role's ``uri`` and
        ``version``."""
        return {"sloP99Ms": self.settings.slo_p99_ms,
                "lastSwitch": None if self.last_switch is None else self.last_switch.as_json(),
                "served": {role: {"uri": s.predictor.uri, "version": s.version}
                           for role, s in self.models.items()}}

    async def start(self) -> None:
        """Start every model thread and mark the runtime ready."""
        for served in self.models.values():
            served.batcher.start()
        self.ready = True

    def leave(self) -> None:
        """The pod is being removed (its preStop hook sent SIGUSR1): keep serving, but end every
        connection after its next answer, so keep-alive clients reconnect through the Service
        to pods that stay before this one stops admitting."""
        self.leaving = True
        self.keep_alive = False

    async def drain(self, grace_s: float) -> DrainReport:
        """Turn readiness off, stop admitting, flush, and wait up to ``grace_s`` seconds for
        admitted requests. Returns (and keeps as :attr:`drain_report`) how many were in flight,
        how many were answered 503 when the grace period ended, and how many new requests were
        refused meanwhile."""
        self.draining = True
        self.keep_alive = False  # clients reconnect elsewhere instead of reusing this pod
        in_flight = sum(len(m.batcher.in_flight) for m in self.models.values())
        results = await asyncio.gather(*(m.batcher.drain(grace_s) for m in self.models.values()))
        self.drain_report = DrainReport(in_flight, sum(results), self.refused_draining)
        return self.drain_report

    async def close(self) -> None:
        """Stop the model threads."""
        for served in self.models.values():
            await served.batcher.close()


def _observe_batch(role_metrics: metrics.RoleMetrics, stats: WindowStats, rows: int,
                   seconds: float, own_s: float) -> None:
    """A finished batch: the metrics see all the model time it cost (``seconds``); the SLO
    guard's call counts see the model's own time for its rows (``own_s``, its first call), so
    calls spent isolating a client's failing rows never make a fast model look slow."""
    role_metrics.observe_batch(rows, seconds)
    stats.totals.call(own_s, rows)


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
    return Runtime(settings, load_predictors(settings, on_loading=on_loading,
                                             on_loaded=on_loaded))


def load_predictors(settings: RuntimeSettings, *,
                    on_loading: Callable[[str, str], None] | None = None,
                    on_loaded: Callable[[str, Predictor, float], None] | None = None
                    ) -> dict[str, Predictor]:
    """The models of :func:`load_runtime`, by role, without serving anything (``tailguard
    validate --models`` uses it): loaded, and the fallback checked as a drop-in.

    Raises:
        ModelLoadError: a model could not be loaded, or the fallback does not match.
    """
    predictors: dict[str, Predictor] = {}
    for model in settings.models:
        logger.info("loading model service=%s role=%s uri=%s", settings.name, model.role,
                    shown(model.uri))
        if on_loading is not None:
            on_loading(model.role, shown(model.uri))
        started = perf_counter()
        predictors[model.role] = load_model(model.uri, model.sha256,
                                            fast_forests=settings.fast_forests,
                                            max_bytes=model.max_bytes)
        if on_loaded is not None:
            on_loaded(model.role, predictors[model.role], perf_counter() - started)
    if "primary" in predictors and "fallback" in predictors:
        check_drop_in(predictors["primary"], predictors["fallback"])
    return predictors
