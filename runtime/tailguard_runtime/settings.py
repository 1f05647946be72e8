"""Typed, frozen runtime settings, built once at startup and passed down.

The field names carry their units. Defaults are the InferenceService CRD's defaults
(``crds/inferenceservice.yaml``); the operator and ``tailguard up`` build these objects from a
validated spec, and the container entry point from the JSON file the operator writes into a
ConfigMap. That file is written by :meth:`RuntimeSettings.to_config` and read by
:meth:`RuntimeSettings.from_config`, one class for both ends. Nothing is read at import time.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Mapping


@dataclass(frozen=True)
class BatchingSettings:
    """How requests are merged into model calls. Mirrors ``spec.batching``."""

    max_batch_size: int = 32
    """Most rows in one model call. A larger request is served in chunks of this size."""
    max_wait_ms: float = 0.0
    """How long a forming batch may wait for batch-mates while the model is free, in ms,
    measured from the arrival of its first request. 0: dispatch as soon as the model is free."""
    max_queue_size: int = 256
    """Most rows waiting (the batch being computed not counted). A request with more rows
    can never fit (413)."""
    timeout_ms: float = 1000.0
    """Default deadline of a request, in ms from arrival; a client may only shorten it."""

    @classmethod
    def from_spec(cls, batching: Mapping[str, Any]) -> "BatchingSettings":
        """Build from the camelCase ``spec.batching`` mapping (already validated)."""
        return cls(
            max_batch_size=int(batching.get("maxBatchSize", cls.max_batch_size)),
            max_wait_ms=float(batching.get("maxWaitMs", cls.max_wait_ms)),
            max_queue_size=int(batching.get("maxQueueSize", cls.max_queue_size)),
            timeout_ms=float(batching.get("timeoutMs", cls.timeout_ms)),
        )


@dataclass(frozen=True)
class ConnectionSettings:
    """What one client connection may hold (see :mod:`tailguard_runtime.http.connections`).

    Read from the runtime config's optional ``connections`` block (camelCase keys below); the
    defaults follow common proxy practice (nginx's ``client_header_timeout`` and
    ``client_body_timeout`` are 60 s; ours are shorter because a runtime's clients are services,
    not people on slow links).
    """

    max_connections: int | None = None
    """``maxConnections``: most open client connections; past it the longest-idle one is closed
    (or, with every connection busy, the new one gets 503). ``None``: the process's open-file
    limit minus 128."""
    max_connections_per_address: int | None = None
    """``maxConnectionsPerAddress``: most open connections from one client address; past it a
    new one from that address gets 503 at once, whatever the others do. ``None``: a quarter of
    ``max_connections`` (at least 16), so one address cannot fill the cap and leave the
    kubelet's probes and every other client a 503."""
    keep_alive_s: float = 30.0
    """``keepAliveSeconds``: an idle connection (just opened, or between requests) is closed
    after this many seconds."""
    max_connection_age_s: float = 10.0
    """``maxConnectionAgeSeconds``: an inference answer on a connection open longer than this
    (each connection's age drawn within ±10%, so that clients connected together do not all
    reconnect together) says ``Connection: close``, and the client's next request opens a new
    connection. Behind a Service, that new connection goes where traffic goes now: to the
    fallback's pods after a rollback (the kubelet passes the switch on to the pods that
    traffic left only at its next sync of the pod, up to a minute or more later), and to the
    pods a scale-out added. The name and the jitter are gRPC's ``MAX_CONNECTION_AGE``
    (gRFC A9, "Server-side Connection Management"), where the age has no default."""
    request_head_timeout_s: float = 10.0
    """``requestHeadTimeoutSeconds``: a request's head must be complete this many seconds after
    its first byte (408, then close)."""
    request_body_timeout_s: float = 30.0
    """``requestBodyTimeoutSeconds``: a body must be complete this many seconds after its head
    (408, then close). Inference bodies are also held to the request's own deadline."""
    send_stall_timeout_s: float = 30.0
    """``sendStallTimeoutSeconds``: a client that reads none of its answers for this many
    seconds (the write buffer stays full) is disconnected."""
    max_pipelined: int = 16
    """``maxPipelinedRequests``: most requests one connection may have parsed and unanswered;
    past it the server stops reading from that connection until answers go out."""
    refusals_per_s: float = 2.0
    """``refusalsPerSecond``: refusals (4xx answers to a client's own request: a body too
    large, invalid rows, an unknown model) answered at once, per second, per connection, with
    a burst of :data:`~tailguard_runtime.admission.REFUSAL_BURST_S` seconds' worth (10 by
    default); past it each is answered after ``refusal_delay_s``
    (:class:`~tailguard_runtime.admission.RefusalPacer`). Per connection, so one client's
    refusals never delay another's first mistake."""
    refusal_delay_s: float = 0.25
    """``refusalDelaySeconds``: how long a refusal past ``refusals_per_s`` waits before its
    answer; a client sending refused requests back to back gets about four answers a second
    per connection."""

    @classmethod
    def from_config(cls, raw: Mapping[str, Any]) -> "ConnectionSettings":
        """Build from the runtime config's ``connections`` mapping.

        Raises:
            ValueError: a value that is not positive.
        """
        made = cls(
            max_connections=(None if raw.get("maxConnections") is None
                             else int(raw["maxConnections"])),
            max_connections_per_address=(None if raw.get("maxConnectionsPerAddress") is None
                                         else int(raw["maxConnectionsPerAddress"])),
            keep_alive_s=float(raw.get("keepAliveSeconds", cls.keep_alive_s)),
            max_connection_age_s=float(raw.get("maxConnectionAgeSeconds",
                                               cls.max_connection_age_s)),
            request_head_timeout_s=float(raw.get("requestHeadTimeoutSeconds",
                                                 cls.request_head_timeout_s)),
            request_body_timeout_s=float(raw.get("requestBodyTimeoutSeconds",
                                                 cls.request_body_timeout_s)),
            send_stall_timeout_s=float(raw.get("sendStallTimeoutSeconds",
                                               cls.send_stall_timeout_s)),
            max_pipelined=int(raw.get("maxPipelinedRequests", cls.max_pipelined)),
            refusals_per_s=float(raw.get("refusalsPerSecond", cls.refusals_per_s)),
            refusal_delay_s=float(raw.get("refusalDelaySeconds", cls.refusal_delay_s)),
        )
        for key, value in (("maxConnections", 1 if made.max_connections is None
                            else made.max_connections),
                           ("maxConnectionsPerAddress", 1 if made.max_connections_per_address
                            is None else made.max_connections_per_address),
                           ("keepAliveSeconds", made.keep_alive_s),
                           ("maxConnectionAgeSeconds", made.max_connection_age_s),
                           ("requestHeadTimeoutSeconds", made.request_head_timeout_s),
                           ("requestBodyTimeoutSeconds", made.request_body_timeout_s),
                           ("sendStallTimeoutSeconds", made.send_stall_timeout_s),
                           ("maxPipelinedRequests", made.max_pipelined),
                           ("refusalsPerSecond", made.refusals_per_s),
                           ("refusalDelaySeconds", made.refusal_delay_s)):
            if not value > 0:
                raise ValueError(f"connections.{key} must be positive, got {value}")
        return made

    def to_config(self) -> dict[str, Any]:
        """The ``connections`` mapping :meth:`from_config` reads back (``maxConnections`` left
        out while it is ``None``)."""
        return {key: _number(getattr(self, attr)) for key, attr in _CONNECTION_KEYS
                if getattr(self, attr) is not None}


_CONNECTION_KEYS = (("maxConnections", "max_connections"),
                    ("maxConnectionsPerAddress", "max_connections_per_address"),
                    ("keepAliveSeconds", "keep_alive_s"),
                    ("maxConnectionAgeSeconds", "max_connection_age_s"),
                    ("requestHeadTimeoutSeconds", "request_head_timeout_s"),
                    ("requestBodyTimeoutSeconds", "request_body_timeout_s"),
                    ("sendStallTimeoutSeconds", "send_stall_timeout_s"),
                    ("maxPipelinedRequests", "max_pipelined"),
                    ("refusalsPerSecond", "refusals_per_s"),
                    ("refusalDelaySeconds", "refusal_delay_s"))
"""The ``connections`` block's camelCase keys and the :class:`ConnectionSettings` fields."""


MODEL_CACHE_ENV = "TAILGUARD_MODEL_CACHE"
"""Where URL models are cached (:meth:`tailguard_runtime.sources.FetchSettings.from_env`)."""
MODEL_CA_FILE_ENV = "TAILGUARD_MODEL_CA_FILE"
"""A PEM bundle a URL model's download trusts besides the public CAs."""
PVC_ROOT_ENV = "TAILGUARD_PVC_ROOT"
"""Where the operator mounts each claim a ``pvc://`` model names, one folder per claim."""

DEFAULT_MAX_BYTES = 1 << 30
"""``model.maxBytes`` when the spec names none: 1 GiB, above any scikit-learn model we have
met (the reference 100-tree forest is a few MB) and small enough to fail fast on a wrong URL."""


@dataclass(frozen=True)
class ModelSettings:
    """One model to serve: where it comes from and which role it plays."""

    uri: str
    """``file:///abs/path.joblib``, ``https://host/path.joblib`` or
    ``builtin://<dataset>/<estimator>[?trees=N]``."""
    role: str = "primary"
    """``primary`` or ``fallback``; a metrics label and the key traffic switches on."""
    sha256: str | None = None
    """Hex digest a ``file://`` or URL model must match before it is unpickled (required for
    a URL)."""
    version: str = "1"
    """The model version reported by the v2 metadata route and the ``version`` metric label."""
    max_bytes: int | None = None
    """Largest download of a URL model, in bytes (``model.maxBytes``); ``None``: 1 GiB."""


@dataclass(frozen=True)
class RuntimeSettings:
    """Everything one runtime process needs. ``models`` holds one entry per role."""

    name: str
    """The InferenceService name: ``/v2/models/{name}`` reaches the active model."""
    models: tuple[ModelSettings, ...]
    batching: BatchingSettings = field(default_factory=BatchingSettings)
    stats_window_seconds: float = 10.0
    """Sliding window of the JSON stats endpoint, in seconds (``spec.slo.windowSeconds``)."""
    slo_p99_ms: float | None = None
    """The declared p99 SLO in ms (``spec.slo.p99LatencyMs``), exported as a gauge so
    dashboards draw the real SLO line; ``None``: not exported."""
    max_body_bytes: int = 16 * 1024 * 1024
    """Largest request body accepted, in bytes; a larger one gets 413 without being read."""
    drain_grace_seconds: float = 20.0
    """After SIGTERM, how long admitted requests get to finish, in seconds. Kept below the
    pod's ``terminationGracePeriodSeconds`` (30 s by default in Kubernetes)."""
    connections: ConnectionSettings = field(default_factory=ConnectionSettings)
    """Per-connection bounds: idle, head and body timeouts, the connection cap, pipelining."""
    allowed_origins: tuple[str, ...] = ()
    """``allowedOrigins``: web origins (``https://app.example.com``, exactly as browsers send
    ``Origin``) whose requests are served; every other browser request gets 403 on every route
    (:mod:`tailguard_runtime.http.browsers`). Empty by default: no web page is served."""
    control_secret: str | None = None
    """The per-run secret of ``tailguard up``'s control routes (``None``: no control routes,
    as in a cluster); see :mod:`tailguard_runtime.http.control`."""
    grpc_port: int | None = 8081
    """``grpcPort``: where the Open Inference Protocol's gRPC service listens, on the HTTP
    server's host (``spec.grpcPort``; 0: a free port; ``None``: no gRPC)."""
    fast_forests: bool = True
    """Evaluate random/extra-trees classifiers from their stacked trees (one walk for a small
    batch, tree by tree for a large one) instead of through scikit-learn's per-tree dispatch
    (same result; see :mod:`tailguard_runtime.forests`).
    ``tailguard-runtime --no-fast-forests`` turns it off, for comparisons."""

    def __post_init__(self) -> None:
        roles = [m.role for m in self.models]
        if not roles or len(set(roles)) != len(roles) or not set(roles) <= {"primary", "fallback"}:
            raise ValueError(f"models must have distinct roles among primary/fallback, got {roles}")

    @classmethod
    def from_config(cls, config: Mapping[str, Any]) -> "RuntimeSettings":
        """Build from the runtime config JSON written by the operator.

        Shape: ``{"name": str, "models": [{"role", "uri", "sha256"?, "version"?, "maxBytes"?}],
        "batching": {...}, "slo": {"windowSeconds", "p99LatencyMs"?},
        "drainGraceSeconds"?: float, "connections"?: {...} (see :class:`ConnectionSettings`),
        "allowedOrigins"?: [str], "grpcPort"?: int,
        "activeModel"?: str}`` with the same camelCase keys as the CRD (``activeModel`` is read
        by the server's traffic follower, not here).

        Raises:
            KeyError, ValueError: on a missing name or models, or bad roles.
        """
        models = tuple(
            ModelSettings(uri=m["uri"], role=m.get("role", "primary"), sha256=m.get("sha256"),
                          version=str(m.get("version", "1")),
                          max_bytes=None if m.get("maxBytes") is None else int(m["maxBytes"]))
            for m in config["models"]
        )
        return cls(
            name=config["name"],
            models=models,
            batching=BatchingSettings.from_spec(config.get("batching", {})),
            stats_window_seconds=float(config.get("slo", {}).get("windowSeconds", 10)),
            slo_p99_ms=_optional_float(config.get("slo", {}).get("p99LatencyMs")),
            drain_grace_seconds=float(config.get("drainGraceSeconds", 20)),
            connections=ConnectionSettings.from_config(config.get("connections", {})),
            allowed_origins=tuple(str(o) for o in config.get("allowedOrigins", ())),
            grpc_port=int(config.get("grpcPort", cls.grpc_port)),
        )

    @staticmethod
    def active_model_of(config: Mapping[str, Any], default: str) -> str:
        """The role that takes traffic, as the config's ``activeModel`` names it (``default``
        when it names none): what a pod of one role re-reads to know whether it still serves."""
        return str(config.get("activeModel", default))

    def for_role(self, role: str) -> RuntimeSettings:
        """These settings with only ``role``'s model (the cluster runs one role per pod).

        Raises:
            ValueError: no model has that role.
        """
        return dataclasses.replace(self, models=tuple(m for m in self.models if m.role == role))

    def to_config(self, active_model: str) -> dict[str, Any]:
        """The runtime config JSON that :meth:`from_config` reads back, with ``activeModel``
        naming the role that takes traffic (the operator writes it into each role's ConfigMap).

        Whole numbers are written as integers, as the CRD has them. ``connections`` and
        ``grpcPort`` are written only when they differ from the defaults. What one process
        chooses for itself is not written: ``control_secret``, ``fast_forests`` and
        ``max_body_bytes``.
        """
        b = self.batching
        config: dict[str, Any] = {
            "name": self.name,
            "models": [{"role": m.role, "uri": m.uri, "version": m.version,
                        **({"sha256": m.sha256} if m.sha256 else {}),
                        **({"maxBytes": m.max_bytes} if m.max_bytes is not None else {})}
                       for m in self.models],
            "batching": {"maxBatchSize": b.max_batch_size, "maxWaitMs": _number(b.max_wait_ms),
                         "maxQueueSize": b.max_queue_size, "timeoutMs": _number(b.timeout_ms)},
            "slo": {"windowSeconds": _number(self.stats_window_seconds),
                    **({} if self.slo_p99_ms is None
                       else {"p99LatencyMs": _number(self.slo_p99_ms)})},
            "drainGraceSeconds": _number(self.drain_grace_seconds),
            "activeModel": active_model,
        }
        if self.connections != ConnectionSettings():
            config["connections"] = self.connections.to_config()
        if self.allowed_origins:
            config["allowedOrigins"] = list(self.allowed_origins)
        if self.grpc_port != RuntimeSettings.grpc_port:
            config["grpcPort"] = self.grpc_port
        return config


def _optional_float(value: Any) -> float | None:
    return None if value is None else float(value)


def _number(value: float) -> int | float:
    """``12.0`` -> ``12``: the CRD's integers stay integers in the runtime JSON."""
    return int(value) if float(value).is_integer() else value
