"""Prometheus metrics, declared once, and the per-role handles the hot path uses.

Names follow Prometheus conventions (base units, ``_seconds``, ``_total``). Labels: ``model``
(the InferenceService name), ``version`` and ``role`` (``primary`` or ``fallback``). Gauges read
from the live objects at scrape time, so they read 0 when idle and never go missing.

| metric | type | meaning |
|---|---|---|
| ``tailguard_request_duration_seconds`` | histogram | admitted request, body received to answer |
| ``tailguard_queue_wait_seconds`` | histogram | arrival until its first rows reach the model |
| ``tailguard_batch_size_rows`` | histogram | rows per batch |
| ``tailguard_batch_duration_seconds`` | histogram | model time of one batch: its model call and, when that raised, the calls isolating the failing requests |
| ``tailguard_queue_depth`` | gauge | rows waiting (the unit of ``maxQueueSize``) |
| ``tailguard_in_flight_requests`` | gauge | admitted, not yet answered |
| ``tailguard_requests_total`` | counter | answered requests, by HTTP ``code`` |
| ``tailguard_rejections_total`` | counter | refused or failed requests, by ``reason``; those refused below the app (``malformed_http``, ``slow_head``, ``connection_limit``) under the active role, and not in ``tailguard_requests_total`` |
| ``tailguard_active_model`` | gauge | 1 for the role that traffic goes to, else 0 |
| ``tailguard_slo_p99_latency_seconds`` | gauge | the declared p99 SLO (when configured) |
| ``tailguard_refusals_delayed_total`` | counter | refusals answered late, past the refusal budget (label ``model``) |
| ``tailguard_connections_closed_total`` | counter | connections closed to keep the per-connection bounds (labels ``model``, ``reason``) |
| ``tailguard_event_loop_lag_seconds`` | histogram | how late a timer due on the event loop ran, every 20 ms, a stall's missed samples included (label ``model``; :mod:`tailguard_runtime.looplag`) |

The SLO guard declares its own ``tailguard_rollbacks_total`` (:mod:`tailguard.guard.rollbacks`)
in the same default registry, so ``tailguard up`` serves it here too.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from prometheus_client import Counter, Gauge, Histogram

from tailguard_runtime.looplag import SAMPLE_INTERVAL_S

LATENCY_BUCKETS_S = (0.0005, 0.001, 0.002, 0.003, 0.004, 0.005, 0.0075, 0.01, 0.015, 0.02, 0.025,
                     0.03, 0.04, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.5, 0.75, 1.0, 2.0, 5.0, 10.0)
"""Histogram bounds in seconds: 1 ms steps or finer up to 5 ms, so a p99 SLO of tens of ms is
resolved to within a few ms."""
BATCH_BUCKETS = (1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128, 192, 256, 512, 1024)

LABELS = ("model", "version", "role")

REQUEST_DURATION = Histogram("tailguard_request_duration_seconds",
                             "Admitted requests, from the body received to the answer.", LABELS,
                             buckets=LATENCY_BUCKETS_S)
QUEUE_WAIT = Histogram("tailguard_queue_wait_seconds",
                       "Time from arrival until a request's first rows reach the model.", LABELS,
                       buckets=LATENCY_BUCKETS_S)
BATCH_SIZE = Histogram("tailguard_batch_size_rows", "Rows per batch.", LABELS,
                       buckets=BATCH_BUCKETS)
BATCH_DURATION = Histogram("tailguard_batch_duration_seconds",
                           "Model time of one batch, calls isolating failing requests included.",
                           LABELS, buckets=LATENCY_BUCKETS_S)
QUEUE_DEPTH = Gauge("tailguard_queue_depth",
                    "Rows waiting for the model (the unit of maxQueueSize).", LABELS)
IN_FLIGHT = Gauge("tailguard_in_flight_requests", "Admitted requests not yet answered.", LABELS)
REQUESTS = Counter("tailguard_requests", "Answered inference requests by HTTP status code.",
                   (*LABELS, "code"))
REJECTIONS = Counter("tailguard_rejections", "Refused or failed inference requests by reason.",
                     (*LABELS, "reason"))
ACTIVE = Gauge("tailguard_active_model", "1 for the role that traffic goes to, else 0.", LABELS)
SLO_P99 = Gauge("tailguard_slo_p99_latency_seconds",
                "The declared p99 latency SLO (spec.slo.p99LatencyMs).", LABELS)

REFUSALS_DELAYED = Counter("tailguard_refusals_delayed",
                           "Refusals (4xx for the client's own request) answered after the "
                           "refusal delay, past the refusal budget.", ("model",))
CONNECTIONS_CLOSED = Counter("tailguard_connections_closed",
                             "Connections the server closed to keep its per-connection bounds "
                             "(tailguard_runtime.http.connections), by reason.", ("model", "reason"))
DECODE_QUEUE_BYTES = Gauge("tailguard_decode_queue_bytes",
                           "Bytes of request bodies waiting for (or in) the decode thread.",
                           ("model",))
REQUESTS_UNANSWERED = Counter("tailguard_requests_unanswered",
                              "Requests parsed on a connection that closed before their answer "
                              "was written, by stage: running (its answer, if computed, also "
                              "counts in tailguard_requests_total) or pipelined (never started).",
                              ("model", "stage"))
CONNECTION_CLOSE_REASONS = ("evicted", "refused", "head_timeout", "body_timeout", "send_stall")
"""``evicted``: the longest idle connection, closed for a new one at the connection cap;
``refused``: a new one answered 503 at the cap, every connection busy; ``head_timeout``: a
request's head not complete in time (408); ``body_timeout``: its body not complete in time (408
unless the answer had started; the app counts the request as an ``incomplete_body``
rejection); ``send_stall``: a client that read no answer in time. A connection is counted once,
under the first of these. Connections closed for being idle (the keep-alive timeout) are not
counted."""

LOOP_LAG_BUCKETS_S = (0.001, 0.002, 0.003, 0.005, 0.0075, 0.01, 0.015, 0.02, 0.03, 0.05, 0.1,
                      0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
"""Bounds for the event loop's lateness, s: an idle loop reads 0-2 ms; a few ms is a busy one;
tens of ms is a callback holding every client up."""
EVENT_LOOP_LAG = Histogram("tailguard_event_loop_lag_seconds",
                           "How late a timer due on the runtime's event loop every "
                           f"{SAMPLE_INTERVAL_S * 1000:g} ms ran, a stall's missed samples "
                           "included: the wait a new event meets at a random moment.",
                           ("model",), buckets=LOOP_LAG_BUCKETS_S)

REJECTION_REASONS = ("queue_full", "deadline", "deadline_exceeded", "slow_body",
                     "incomplete_body", "too_large", "invalid_input", "draining",
                     "not_ready", "model_error", "internal", "malformed_http", "slow_head",
                     "connection_limit", "forbidden", "decode_queue_full", "decode_deadline")
"""The ``reason`` slugs of ``tailguard_rejections_total``: the ``reason`` of each
:class:`~tailguard_runtime.errors.TailguardError` that is counted."""
COMMON_CODES = ("200", "400", "408", "413", "422", "429", "500", "503", "504")


@dataclass(frozen=True)
class RoleMetrics:
    """Metric children bound to one ``(model, version, role)``; built once per served model."""

    request_duration: Callable[[float], None]
    queue_wait: Callable[[float], None]
    batch_size: Callable[[float], None]
    batch_duration: Callable[[float], None]
    count_ok: Callable[[], None]
    """Count one 200 answer (the common case, bound once)."""
    labels: tuple[str, str, str]

    def count(self, code: int, reason: str | None) -> None:
        """Count one answered request (and its rejection reason, if any)."""
        REQUESTS.labels(*self.labels, str(code)).inc()
        if reason is not None:
            REJECTIONS.labels(*self.labels, reason).inc()

    def count_rejection(self, reason: str) -> None:
        """Count one request refused before it reached a route (no answer code counted): the
        HTTP parser's and the connection bounds' refusals."""
        REJECTIONS.labels(*self.labels, reason).inc()

    def observe_batch(self, rows: int, seconds: float) -> None:
        """Record one batch of ``rows`` rows whose model time was ``seconds`` (calls isolating
        failing requests included)."""
        self.batch_size(rows)
        self.batch_duration(seconds)

    def attach_gauges(self, *, queue_depth: Callable[[], float], in_flight: Callable[[], float],
                      active: Callable[[], float]) -> None:
        """Have the gauges read live values at scrape time (so they are never stale)."""
        QUEUE_DEPTH.labels(*self.labels).set_function(queue_depth)
        IN_FLIGHT.labels(*self.labels).set_function(in_flight)
        ACTIVE.labels(*self.labels).set_function(active)


def bind(model: str, version: str, role: str, *, slo_p99_s: float | None = None) -> RoleMetrics:
    """Bind the metric children for one served model; ``slo_p99_s`` (seconds), when given,
    sets the SLO gauge.

    Counters for the usual codes and every reason are touched so they are exported as 0 before
    the first request.
    """
    labels = (model, version, role)
    if slo_p99_s is not None:
        SLO_P99.labels(*labels).set(slo_p99_s)
    for code in COMMON_CODES:
        REQUESTS.labels(*labels, code)
    for reason in REJECTION_REASONS:
        REJECTIONS.labels(*labels, reason)
    return RoleMetrics(
        request_duration=REQUEST_DURATION.labels(*labels).observe,
        queue_wait=QUEUE_WAIT.labels(*labels).observe,
        batch_size=BATCH_SIZE.labels(*labels).observe,
        batch_duration=BATCH_DURATION.labels(*labels).observe,
        count_ok=REQUESTS.labels(*labels, "200").inc,
        labels=labels,
    )
