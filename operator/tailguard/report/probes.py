"""Requests that ``tailguard report`` sends to a served InferenceService, and what came back.

Each probe sends real requests over HTTP and keeps the exchange as it happened (request, status,
the ``Retry-After`` and ``X-Tailguard-*`` headers, body, client-side time): one example request,
the error shapes (malformed JSON, a wrong feature count, an unknown model, too many rows), and
the failure checks (a request past its deadline, overload shedding, the fallback's drop-in check
through the traffic switch). A probe reports what happened; whether that was the expected
outcome is its ``passed`` flag, never an exception. Nothing here decides what the report says.
"""

from __future__ import annotations

import asyncio
import json
import statistics
import time
from dataclasses import dataclass, field
from typing import Any

import httpx
import numpy as np

KEPT_HEADERS = ("content-type", "retry-after", "x-tailguard-role", "x-tailguard-model",
                "x-tailguard-model-version")
"""Reply headers an exchange keeps (the contract's; dates and lengths change every run)."""
MAX_BURST = 64
"""Most concurrent requests the overload check sends (it doubles until one is shed)."""
BODY_BYTES = 8 * 1024 * 1024
"""Largest body a probe builds (half the runtime's 16 MiB limit, ``max_body_bytes``); JSON
numbers are counted at :data:`BYTES_PER_VALUE` each."""
BYTES_PER_VALUE = 24


def rows_within_body(n_rows: int, n_features: int) -> int:
    """``n_rows``, or fewer so that one request's body stays under :data:`BODY_BYTES`."""
    return max(1, min(n_rows, BODY_BYTES // (BYTES_PER_VALUE * max(n_features, 1))))


@dataclass(frozen=True)
class Exchange:
    """One request and its reply. ``body`` is the request body as sent (None for a GET);
    ``reply`` the reply body as text; ``elapsed_ms`` the client's wall time for the exchange."""

    method: str
    path: str
    headers: dict[str, str]
    body: str | None
    status: int
    reply_headers: dict[str, str]
    reply: str
    elapsed_ms: float

    def reply_json(self) -> Any:
        """The reply parsed as JSON (None when it is not JSON)."""
        try:
            return json.loads(self.reply)
        except ValueError:
            return None


@dataclass(frozen=True)
class Check:
    """A probe's verdict: ``name``, what was ``expected``, whether it ``passed``, what
    ``happened`` (one line), and the exchanges it made (the telling ones)."""

    name: str
    expected: str
    passed: bool
    happened: str
    exchanges: tuple[Exchange, ...] = field(default_factory=tuple)
    measured: dict[str, float] = field(default_factory=dict)
    """Numbers the check measured, by name (ms unless the name says otherwise)."""


def infer_path(name: str) -> str:
    """The Open Inference Protocol v2 infer path of the InferenceService ``name``."""
    return f"/v2/models/{name}/infer"


def v2_body(rows: np.ndarray, **parameters: Any) -> str:
    """A v2 infer body for ``rows`` (``(n_rows, n_features)``), FP64, compact JSON."""
    doc: dict[str, Any] = {"inputs": [{"name": "input-0", "shape": list(rows.shape),
                                       "datatype": "FP64", "data": rows.ravel().tolist()}]}
    if parameters:
        doc["parameters"] = parameters
    return json.dumps(doc, separators=(",", ":"))


def send(client: httpx.Client, method: str, path: str, body: str | None = None,
         headers: dict[str, str] | None = None) -> Exchange:
    """Send one request with ``client`` (its base URL set) and keep the exchange."""
    headers = dict(headers or {})
    if body is not None:
        headers.setdefault("Content-Type", "application/json")
    t0 = time.perf_counter()
    reply = client.request(method, path, content=body, headers=headers)
    elapsed = (time.perf_counter() - t0) * 1e3
    return Exchange(method, path, headers, body, reply.status_code,
                    {k: v for k, v in reply.headers.items() if k.lower() in KEPT_HEADERS},
                    reply.text, elapsed)


def rows_of(rows: np.ndarray, n: int) -> np.ndarray:
    """``n`` rows from ``rows``, wrapping around."""
    return np.ascontiguousarray(rows[np.arange(n) % rows.shape[0]], dtype=np.float64)


def error_shapes(client: httpx.Client, name: str, rows: np.ndarray,
                 max_queue_size: int) -> list[Check]:
    """Malformed JSON (400), one feature too many (422), an unknown model (404) and one row
    more than ``maxQueueSize`` (413), each sent once; every reply must be ``{"error": ...}``."""
    one = rows_of(rows, 1)
    wide = np.hstack([one, np.zeros((1, 1))])
    if rows_within_body(max_queue_size + 1, rows.shape[1]) > max_queue_size:
        too_large = v2_body(rows_of(rows, max_queue_size + 1))
    else:  # that many rows could not even be sent: a body over the runtime's 16 MiB limit
        too_large = v2_body(one) + " " * (2 * BODY_BYTES)
    probes = [
        ("malformed request", 400, send(client, "POST", infer_path(name), '{"inputs": [')),
        ("wrong feature count", 422, send(client, "POST", infer_path(name), v2_body(wide))),
        ("unknown model", 404, send(client, "POST", infer_path(name + "-unknown"), v2_body(one))),
        ("too many rows", 413, send(client, "POST", infer_path(name), too_large)),
    ]
    return [_error_check(title, code, ex) for title, code, ex in probes]


def _error_check(title: str, code: int, ex: Exchange) -> Check:
    doc = ex.reply_json()
    shaped = isinstance(doc, dict) and set(doc) == {"error"} and isinstance(doc["error"], str)
    passed = ex.status == code and shaped
    message = doc["error"] if shaped else ex.reply[:200]
    return Check(title, f"{code} with {{\"error\": ...}}", passed,
                 f"answered {ex.status}: {message}", (ex,))


def deadline(client: httpx.Client, name: str, rows: np.ndarray, batch: int) -> Check:
    """A request of ``batch`` rows whose own deadline (v2 ``parameters.timeout``, 1 µs) passes
    before the model can answer: expected 504 (or 429 ``deadline`` when refused at admission)."""
    ex = send(client, "POST", infer_path(name), v2_body(rows_of(rows, batch), timeout=1))
    doc = ex.reply_json()
    message = doc.get("error", "") if isinstance(doc, dict) else ex.reply[:200]
    passed = ex.status == 504 or (ex.status == 429 and "deadline" in message)
    return Check("request past its deadline", "504 (or 429 refused for its deadline)", passed,
                 f"{batch} row(s) with parameters.timeout=1 (µs): answered {ex.status} in "
                 f"{ex.elapsed_ms:.1f} ms: {message}", (ex,))


def overload(base: str, name: str, rows: np.ndarray, max_queue_size: int,
             timeout_s: float = 30.0) -> Check:
    """Bursts of concurrent requests of ``maxQueueSize`` rows each (fewer when the body would
    pass :data:`BODY_BYTES`), enough of them to fill the queue twice over and at least 8,
    doubling up to :data:`MAX_BURST` until one is shed: expected 429 with an integer
    ``Retry-After`` >= 1."""
    per = rows_within_body(max_queue_size, rows.shape[1])
    body = v2_body(rows_of(rows, per))
    burst, codes, shed = min(MAX_BURST, max(8, 2 * -(-max_queue_size // per) + 2)), {}, None
    while burst <= MAX_BURST:
        exchanges = asyncio.run(_burst(base, infer_path(name), body, burst, timeout_s))
        codes = _count(ex.status for ex in exchanges)
        shed = next((ex for ex in exchanges if ex.status == 429), None)
        if shed is not None:
            break
        burst *= 2
    seen = ", ".join(f"{n} x {code}" for code, n in sorted(codes.items()))
    if shed is None:
        return Check("overload shedding", "429 with Retry-After", False,
                     f"no request shed in bursts up to {MAX_BURST}: {seen}")
    retry = shed.reply_headers.get("retry-after", "")
    passed = retry.isdigit() and int(retry) >= 1
    error = (shed.reply_json() or {}).get("error", shed.reply[:200])
    return Check("overload shedding", "429 with an integer Retry-After >= 1", passed,
                 f"{burst} concurrent requests of {per} rows: {seen}; a 429 carried "
                 f"Retry-After: {retry or '(none)'} and said: {error}", (shed,))


async def _burst(base: str, path: str, body: str, n: int, timeout_s: float) -> list[Exchange]:
    limits = httpx.Limits(max_connections=n, max_keepalive_connections=n)
    async with httpx.AsyncClient(base_url=base, limits=limits, timeout=timeout_s) as client:
        async def one() -> Exchange:
            t0 = time.perf_counter()
            reply = await client.post(path, content=body,
                                      headers={"Content-Type": "application/json"})
            return Exchange("POST", path, {"Content-Type": "application/json"}, "(omitted)",
                            reply.status_code,
                            {k: v for k, v in reply.headers.items() if k.lower() in KEPT_HEADERS},
                            reply.text, (time.perf_counter() - t0) * 1e3)
        return list(await asyncio.gather(*(one() for _ in range(n))))


def _count(codes: Any) -> dict[int, int]:
    out: dict[int, int] = {}
    for code in codes:
        out[code] = out.get(code, 0) + 1
    return out


def drop_in(client: httpx.Client, name: str, example: Exchange, secret: str,
            serial: int = 50) -> Check:
    """Switch traffic to the fallback (the loopback traffic route, ``by: report``, with the
    run's control ``secret`` as ``tailguard rollback`` sends it), send the example request
    again plus ``serial`` more one after another (their client-side latency is the fallback's
    served latency), then switch back. Passes when the fallback's reply has the primary's
    output names, datatypes and shapes and says ``X-Tailguard-Role: fallback``.
    """
    auth = {"Authorization": f"Bearer {secret}"}
    switched = send(client, "POST", "/tailguard/traffic",
                    json.dumps({"name": name, "activeModel": "fallback", "by": "report"}), auth)
    try:
        ex = send(client, "POST", example.path, example.body)
        times = [send(client, "POST", example.path, example.body).elapsed_ms
                 for _ in range(serial)]
    finally:
        back = send(client, "POST", "/tailguard/traffic",
                    json.dumps({"name": name, "activeModel": "primary", "by": "report"}), auth)
    if switched.status != 200 or back.status != 200:
        return Check("fallback drop-in", "same outputs from the fallback", False,
                     f"the traffic switch answered {switched.status} / {back.status}: "
                     f"{switched.reply[:200]}", (switched,))
    want, got = _outputs(example.reply_json()), _outputs(ex.reply_json())
    role = ex.reply_headers.get("x-tailguard-role", "")
    passed = ex.status == 200 and role == "fallback" and want == got
    same = _labels(example.reply_json()) == _labels(ex.reply_json())
    return Check(
        "fallback drop-in", "200 from the fallback with the primary's outputs (names, "
        "datatypes, shapes)", passed,
        f"traffic switched to the fallback and back; the example request answered {ex.status} "
        f"from role {role or '(none)'} ({ex.reply_headers.get('x-tailguard-model', '?')}) with "
        f"outputs {got}; {'the same' if same else 'a different'} predicted label as the "
        f"primary's; {serial} more requests one at a time: median "
        f"{statistics.median(times):.2f} ms, max {max(times):.2f} ms (client side)", (ex,),
        {"servedMedianMs": round(statistics.median(times), 3),
         "servedMaxMs": round(max(times), 3), "requests": float(serial)})


def _outputs(doc: Any) -> list[tuple[Any, Any, Any]]:
    if not isinstance(doc, dict):
        return []
    return [(o.get("name"), o.get("datatype"), o.get("shape")) for o in doc.get("outputs", [])]


def _labels(doc: Any) -> Any:
    if not isinstance(doc, dict):
        return None
    return next((o.get("data") for o in doc.get("outputs", []) if o.get("name") == "predict"),
                None)
