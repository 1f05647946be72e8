"""The server's own view of a load test, from two reads of a tailguard runtime's ``/metrics``.

:func:`parse_snapshot` sums a Prometheus text page over the ``model``, ``version`` and ``role``
labels (both roles together: the numbers of the whole service); :func:`server_view` differences
two snapshots into what the server saw in between: answers by code, rejections by reason, model
calls, the batch size distribution, and queue-wait and model-time percentiles. Percentiles from a
histogram are bucket upper edges (the smallest edge with at least q% of the observations at or
below it), as Prometheus' own ``histogram_quantile`` would bound them. Both are pure;
:func:`scrape` is the one small I/O helper, used by the load generator at the window's edges.
"""

from __future__ import annotations

import asyncio
import math
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

ServerSnapshot = dict[tuple[str, tuple[tuple[str, str], ...]], float]
"""``(sample name, sorted labels other than model/version/role) -> value`` summed over them."""

SUMMED_LABELS = frozenset({"model", "version", "role"})


def parse_snapshot(text: str) -> ServerSnapshot:
    """Sum every sample of a Prometheus text page over :data:`SUMMED_LABELS`.

    Raises ValueError when the text is not the Prometheus exposition format."""
    out: ServerSnapshot = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            labels = tuple(sorted((k, v) for k, v in sample.labels.items()
                                  if k not in SUMMED_LABELS))
            key = (sample.name, labels)
            out[key] = out.get(key, 0.0) + float(sample.value)
    return out


def _delta(before: ServerSnapshot, after: ServerSnapshot, name: str) -> dict[tuple[tuple[str, str], ...], float]:
    return {labels: value - before.get((n, labels), 0.0)
            for (n, labels), value in after.items() if n == name}


def _histogram(before: ServerSnapshot, after: ServerSnapshot,
               name: str) -> tuple[list[tuple[float, float]], float, float]:
    """``([(upper edge, cumulative count)], count, sum)`` of a histogram between two reads."""
    buckets = sorted((float(dict(labels)["le"]), value)
                     for labels, value in _delta(before, after, f"{name}_bucket").items())
    count = sum(_delta(before, after, f"{name}_count").values())
    total = sum(_delta(before, after, f"{name}_sum").values())
    return buckets, count, total


def bucket_quantile(buckets: list[tuple[float, float]], q: float) -> float | None:
    """The smallest bucket edge with at least ``q`` (0-1) of the observations at or below it;
    None when the histogram is empty, ``inf`` when only the +Inf bucket reaches ``q``."""
    if not buckets or buckets[-1][1] <= 0:
        return None
    need = q * buckets[-1][1]
    for edge, cumulative in buckets:
        if cumulative >= need - 1e-9:
            return edge
    return math.inf


def _ms(seconds: float | None) -> float | None:
    if seconds is None:
        return None
    return None if math.isinf(seconds) else round(seconds * 1e3, 3)


def _edge_ms(seconds: float | None) -> float | str | None:
    """A bucket edge in ms; ``"+Inf"`` past the last finite edge, so it is not read as none."""
    return "+Inf" if seconds is not None and math.isinf(seconds) else _ms(seconds)


def server_view(before: ServerSnapshot, after: ServerSnapshot) -> dict[str, Any]:
    """What the server counted between two snapshots (a JSON-ready dict).

    Keys: ``requests`` (answers by HTTP code), ``rejections`` (by reason), ``batches`` (model
    calls), ``batch_rows`` (``mean``, ``p50``, ``p99`` rows per call, and ``buckets``: rows
    edge -> calls in that bucket), ``request_p99_ms`` (the server's own latency of admitted
    requests, body received to answer: what is left of the client's when the network and the
    client's machine are taken out), ``queue_wait_p99_ms``, ``model_ms_per_batch``
    (``mean``, ``p99``) and ``event_loop_lag_ms`` (``samples``, ``p50``, ``p99``, ``max``: how
    late the runtime's event loop ran a due timer, ``tailguard_event_loop_lag_seconds``) in ms;
    histogram percentiles are bucket edges (``max``: the edge of the highest bucket with a
    sample; ``"+Inf"`` when that is the last bucket, past every edge). Counts absent from the
    page are 0.
    """
    codes = {dict(labels).get("code", "?"): int(round(v)) for labels, v in
             _delta(before, after, "tailguard_requests_total").items() if round(v)}
    reasons = {dict(labels).get("reason", "?"): int(round(v)) for labels, v in
               _delta(before, after, "tailguard_rejections_total").items() if round(v)}
    rows, calls, rows_sum = _histogram(before, after, "tailguard_batch_size_rows")
    waits, _, _ = _histogram(before, after, "tailguard_queue_wait_seconds")
    answers, _, _ = _histogram(before, after, "tailguard_request_duration_seconds")
    model, model_calls, model_s = _histogram(before, after, "tailguard_batch_duration_seconds")
    lag, lag_samples, _ = _histogram(before, after, "tailguard_event_loop_lag_seconds")
    per_bucket: dict[str, int] = {}
    previous = 0.0
    for edge, cumulative in rows:
        if cumulative - previous >= 0.5:
            per_bucket["+Inf" if math.isinf(edge) else f"{edge:g}"] = int(round(cumulative - previous))
        previous = cumulative
    return {
        "requests": dict(sorted(codes.items())),
        "rejections": dict(sorted(reasons.items())),
        "batches": int(round(calls)),
        "batch_rows": {"mean": round(rows_sum / calls, 2) if calls else None,
                       "p50": bucket_quantile(rows, 0.50), "p99": bucket_quantile(rows, 0.99),
                       "buckets": per_bucket},
        "request_p99_ms": _ms(bucket_quantile(answers, 0.99)),
        "queue_wait_p99_ms": _ms(bucket_quantile(waits, 0.99)),
        "model_ms_per_batch": {"mean": round(1e3 * model_s / model_calls, 3) if model_calls
                               else None, "p99": _ms(bucket_quantile(model, 0.99))},
        "event_loop_lag_ms": {"samples": int(round(lag_samples)),
                              **{key: _edge_ms(bucket_quantile(lag, q))
                                 for key, q in (("p50", 0.5), ("p99", 0.99), ("max", 1.0))}},
    }


async def scrape(host: str, port: int, path: str, timeout_s: float = 5.0) -> ServerSnapshot | None:
    """GET ``path`` (HTTP/1.0, one connection) and parse it; None when the server has no such
    page, answers something else than 200, or does not answer within ``timeout_s``."""
    try:
        reader, writer = await asyncio.wait_for(asyncio.open_connection(host, port), timeout_s)
    except (OSError, asyncio.TimeoutError):
        return None
    try:
        writer.write(f"GET {path} HTTP/1.0\r\nHost: {host}:{port}\r\n\r\n".encode("ascii"))
        raw = await asyncio.wait_for(reader.read(-1), timeout_s)
    except (OSError, asyncio.TimeoutError):
        return None
    finally:
        writer.close()
    head, _, body = raw.partition(b"\r\n\r\n")
    if not head.startswith((b"HTTP/1.0 200", b"HTTP/1.1 200")):
        return None
    try:
        return parse_snapshot(body.decode("utf-8", "replace"))
    except ValueError:
        return None
