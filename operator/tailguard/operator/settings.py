"""Operator settings: one frozen group, built once at startup, then passed down.

What the InferenceService spec does not say about the pods (the runtime image, pod resources, the
termination timing) and how the operator itself behaves (retry delays) lives here.
:meth:`OperatorSettings.from_env` reads the ``TAILGUARD_*`` variables the Helm chart sets; nothing
is read at import time. The manifest builders and the handlers receive the object explicitly.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from typing import Any, Mapping

ENV_PREFIX = "TAILGUARD_"
LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR")
ZERO_ALLOWED = ("pre_stop_seconds", "metrics_port")
"""Numeric settings for which ``0`` means something (no preStop wait, no metrics port)."""


@dataclass(frozen=True)
class OperatorSettings:
    """How the operator builds pods and paces its retries.

    Defaults suit a kind cluster on a laptop; the chart overrides them through the environment.
    """

    runtime_image: str = "tailguard/runtime:0.1.0"
    """Image of the runtime container (``TAILGUARD_RUNTIME_IMAGE``). A ``file://`` model must be
    baked into this image (or a derived one named here), at the path its URI names."""
    image_pull_policy: str = "IfNotPresent"
    """``TAILGUARD_IMAGE_PULL_POLICY``: IfNotPresent suits images side-loaded with ``kind load``."""
    cpu_request: str = "500m"
    """CPU request of one runtime pod (``TAILGUARD_CPU_REQUEST``), a Kubernetes quantity in the
    API server's canonical form (``500m``, not ``0.5``: a value the server rewrites reads as a
    difference on every reconcile). The HPA's CPU utilization target is a percentage of it. No
    CPU limit is ever set: CFS throttling adds tens of ms to the tail."""
    memory_request: str = "256Mi"
    """Memory request of one runtime pod (``TAILGUARD_MEMORY_REQUEST``)."""
    memory_limit: str = "1Gi"
    """Memory limit of one runtime pod (``TAILGUARD_MEMORY_LIMIT``)."""
    pre_stop_seconds: int = 5
    """Seconds a terminating pod keeps serving before SIGTERM (``TAILGUARD_PRE_STOP_SECONDS``),
    so that endpoints and kube-proxy rules drop it first. The preStop hook first tells the
    runtime it is leaving (SIGUSR1): its answers then carry ``Connection: close``, so clients
    on kept-alive connections reconnect through the Service to pods that stay."""
    runtime_node_selector: dict[str, str] = field(default_factory=dict)
    """``nodeSelector`` of every runtime pod (``TAILGUARD_RUNTIME_NODE_SELECTOR``, a JSON
    object; empty: none)."""
    runtime_tolerations: list[dict[str, Any]] = field(default_factory=list)
    """``tolerations`` of every runtime pod (``TAILGUARD_RUNTIME_TOLERATIONS``, a JSON list of
    Kubernetes tolerations; empty: none)."""
    run_as_user: int = 10001
    """UID (and GID) the runtime runs as (``TAILGUARD_RUN_AS_USER``); matches the runtime image's
    non-root user."""
    retry_delay_seconds: float = 5.0
    """Delay before a handler that waits (a traffic switch waiting for Ready replicas) runs
    again, in seconds (``TAILGUARD_RETRY_DELAY_SECONDS``). Readiness changes also wake it early,
    through the watch on the Deployments."""
    resync_seconds: float = 120.0
    """Every this many seconds (``TAILGUARD_RESYNC_SECONDS``) each InferenceService the
    operator knows is reconciled again, whatever the watches said: a child deleted while a
    watch was reconnecting is restored within one period. A pass that finds nothing to change
    writes nothing, so the resync costs reads only: six LIST requests per namespace (the
    InferenceServices and each child kind, into the watch cache the passes read), whatever the
    number of InferenceServices in it."""
    guard: bool = True
    """Run the SLO guard (``TAILGUARD_GUARD``: ``true``/``false``): read every Ready runtime
    pod of the active role each ``slo.windowSeconds`` on its pod IP. Off for an operator that
    cannot reach pod IPs (one run outside the cluster while developing)."""
    guard_read_timeout_seconds: float = 1.0
    """How long the guard waits for one pod's totals, in seconds
    (``TAILGUARD_GUARD_READ_TIMEOUT_SECONDS``): a pod slower than this is left out of the
    window, counted and named, and never delays the others."""
    guard_concurrency: int = 64
    """Pod reads the guard has in flight at once, over all InferenceServices
    (``TAILGUARD_GUARD_CONCURRENCY``)."""
    metrics_port: int = 8081
    """Port of the operator's Prometheus ``/metrics`` (``TAILGUARD_METRICS_PORT``; ``0``:
    none): ``tailguard_rollbacks_total{model, reason}`` and the guard's pod reads."""
    log_level: str = "INFO"
    """Level of the operator's own loggers, ``tailguard.*`` (``TAILGUARD_LOG_LEVEL``: ``DEBUG``,
    ``INFO``, ``WARNING`` or ``ERROR``; kopf's follow ``--verbose``). ``DEBUG`` adds one line
    per reconcile pass."""

    def __post_init__(self) -> None:
        if self.log_level.upper() not in LOG_LEVELS:
            raise ValueError(f"{ENV_PREFIX}LOG_LEVEL: expected one of {', '.join(LOG_LEVELS)}, "
                             f"got {self.log_level!r}")

    @classmethod
    def from_env(cls, environ: Mapping[str, str]) -> "OperatorSettings":
        """Build from ``TAILGUARD_<FIELD_NAME_UPPER>`` variables; absent ones keep the default.

        Raises:
            ValueError: a numeric variable that does not parse, or a non-positive number; a
                JSON variable that does not parse or has the wrong shape.
        """
        values: dict[str, object] = {}
        for f in dataclasses.fields(cls):
            raw = environ.get(ENV_PREFIX + f.name.upper())
            if raw is None or raw == "":
                continue
            if isinstance(f.type, str) and f.type.startswith(("dict[", "list[")):
                values[f.name] = _json_value(ENV_PREFIX + f.name.upper(), raw,
                                             dict if f.type.startswith("dict[") else list)
            elif f.type == "bool":
                if raw.lower() not in ("true", "false"):
                    raise ValueError(f"{ENV_PREFIX}{f.name.upper()}: expected true or false, "
                                     f"got {raw!r}")
                values[f.name] = raw.lower() == "true"
            elif f.type in ("int", "float"):
                try:
                    number = int(raw) if f.type == "int" else float(raw)
                except ValueError:
                    raise ValueError(f"{ENV_PREFIX}{f.name.upper()}: expected a number, "
                                     f"got {raw!r}") from None
                if number < 0 or (number == 0 and f.name not in ZERO_ALLOWED):
                    raise ValueError(f"{ENV_PREFIX}{f.name.upper()}: must be positive, got {raw!r}")
                values[f.name] = number
            else:
                values[f.name] = raw
        return cls(**values)  # type: ignore[arg-type]


def _json_value(variable: str, raw: str, kind: type) -> Any:
    """``raw`` parsed as JSON, which must be a ``kind`` (dict: string values; list: objects).

    Raises:
        ValueError: names ``variable``, and says what was wrong.
    """
    try:
        value = json.loads(raw)
    except ValueError as exc:
        raise ValueError(f"{variable}: not JSON ({exc})") from None
    if kind is dict and not (isinstance(value, dict)
                             and all(isinstance(v, str) for v in value.values())):
        raise ValueError(f"{variable}: expected a JSON object of strings, got {raw!r}")
    if kind is list and not (isinstance(value, list)
                             and all(isinstance(v, dict) for v in value)):
        raise ValueError(f"{variable}: expected a JSON list of objects, got {raw!r}")
    return value
