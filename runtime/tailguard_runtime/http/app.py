"""HTTP routes: a bare ASGI inference path, and FastAPI for everything else.

The two inference routes (v2 ``POST /v2/models/{name}[/versions/{v}]/infer`` and v1
``POST /v1/models/{name}:predict``) and the two health probes (``/v2/health/live`` and
``/v2/health/ready``) are served by :class:`InferenceApp` directly as ASGI, with orjson and no
request model: at thousands of requests per second every 0.1 ms counts. Every
reply of theirs once the active role is resolved, errors included, says which model answered:
``X-Tailguard-Role``, ``X-Tailguard-Model`` (URI) and ``X-Tailguard-Model-Version`` headers, and
in a v2 body ``model_version`` and ``parameters: {"role", "model_uri"}``. All other
routes (metadata, ``/metrics``, the stats and traffic routes) go to a FastAPI
app. Every error, on either side, is answered by the one error writer
(:mod:`tailguard_runtime.http.errors`): the protocol's ``{"error": "..."}``.
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections import OrderedDict
from time import perf_counter
from typing import Any, Awaitable, Callable, MutableMapping

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.exceptions import HTTPException as StarletteHTTPException

from tailguard_runtime import __version__
from tailguard_runtime.admission import REFUSAL_BURST_S, RefusalPacer
from tailguard_runtime.errors import (
    BodyTimeout,
    Draining,
    IncompleteBody,
    InvalidInput,
    NotReady,
    Overloaded,
    PayloadTooLarge,
    RouteError,
    TailguardError,
)
from tailguard_runtime.http.browsers import browser_refusal
from tailguard_runtime.http.control import add_control_routes
from tailguard_runtime.http.decoding import DecodeQueue
from tailguard_runtime.http.errors import as_tailguard_error, asgi_error, error_response
from tailguard_runtime.http.protocol import BODY_COMPLETE, CLIENT_GONE, RETIRING
from tailguard_runtime.metrics import DECODE_QUEUE_BYTES, REFUSALS_DELAYED
from tailguard_runtime.models import Predictor, check_input_range
from tailguard_runtime.service import Runtime, ServedModel
from tailguard_runtime.wire import (
    V1Request,
    V2Request,
    check_stated_size,
    check_structure,
    decode_v1,
    decode_v2,
    decompress,
    encode_v1,
    encode_v2,
    max_valid_body_bytes,
    parse_header_length,
    parse_timeout_header,
)

logger = logging.getLogger(__name__)

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]

SERVER_EXTENSIONS = ("binary_tensor_data",)
"""The v2 protocol extensions the server metadata (``GET /v2``) lists: the binary tensor data
extension (Triton's name for it). The repository index route is served, but not the rest of
the model repository extension (loading and unloading), so it is not listed."""
PROBABILITIES = "predict_proba"
"""The output a classifier's class probabilities come out as (last of its outputs)."""
JSON_HEADERS = [(b"content-type", b"application/json")]
CLOSING_HEADERS = JSON_HEADERS + [(b"connection", b"close")]
INCOMPLETE = "the connection closed before the whole request body arrived"
HEALTH_PATHS = frozenset(("/v2/health/live", "/v2/health/ready"))
LIVE_BODY = b'{"live":true}'
READY_BODY = b'{"ready":true}'
INLINE_DECODE_BYTES = 64 * 1024
"""Plain bodies up to this size are decoded on the event loop (a small share of a request's
cost); larger or compressed ones in the decode thread, so one big body never holds the loop
for its whole parse (the decode times are in ``benchmarks/README.md``, "Figures cited by the
runtime's docstrings")."""
MAX_PACED_CONNECTIONS = 4096
"""Refusal buckets kept (one per connection that was refused, most recent last); past it the
oldest goes, and its connection starts again with a full bucket."""

UNPACED = (BodyTimeout, IncompleteBody, Overloaded)
"""4xx answers never delayed by the :class:`RefusalPacer`: a slow or cut-off body (the client
is gone or its connection is closed), and 429 (load shedding, not the client's fault)."""


class InferenceApp:
    """The runtime's ASGI application.

    ``POST`` to an inference path is handled here; anything else is passed to ``fallthrough``
    (the FastAPI app built by :func:`build_app`).
    """

    def __init__(self, runtime: Runtime, fallthrough: Callable[[Scope, Receive, Send], Awaitable[None]]):
        self.runtime = runtime
        self.fallthrough = fallthrough
        self.default_timeout_s = runtime.settings.batching.timeout_ms / 1000.0
        self.max_rows = runtime.settings.batching.max_queue_size
        n_features = next(iter(runtime.models.values())).predictor.n_features  # equal per role
        self.max_body = min(runtime.settings.max_body_bytes,
                            max_valid_body_bytes(n_features, self.max_rows))
        """Bytes a body (inflated, when compressed) may have: what the largest valid request
        can need, never more than ``max_body_bytes``."""
        self.limit_reason = (f" (the largest valid request: {self.max_rows} rows of "
                             f"{n_features} features)"
                             if self.max_body < runtime.settings.max_body_bytes else "")
        self._decodes = DecodeQueue()
        DECODE_QUEUE_BYTES.labels(runtime.name).set_function(lambda: self._decodes.queued_bytes)
        self.headers = {role: (JSON_HEADERS + s.headers, CLOSING_HEADERS + s.headers)
                        for role, s in runtime.models.items()}
        """Per role: the reply headers with keep-alive, and with ``Connection: close``."""
        self.pacers: OrderedDict[Any, RefusalPacer] = OrderedDict()
        """One refusal bucket per connection (by the client's address and port), the most
        recently refused last; at most :data:`MAX_PACED_CONNECTIONS` are kept."""
        self._count_delayed = REFUSALS_DELAYED.labels(runtime.name).inc
        self.allowed_origins = frozenset(o.encode() for o in runtime.settings.allowed_origins)
        """``Origin`` values served (:mod:`tailguard_runtime.http.browsers`)."""

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and (
                refused := browser_refusal(scope["headers"], self.allowed_origins)) is not None:
            await self._refuse_browser(send, refused)
            return
        if scope["type"] == "http" and scope["method"] == "POST":
            path: str = scope["path"]
            if path.startswith("/v2/models/") and path.endswith("/infer"):
                name, versioned, version = path[11:-6].partition("/versions/")
                await self._infer(scope, receive, send, name, version if versioned else None,
                                  v2=True)
                return
            if path.startswith("/v1/models/") and path.endswith(":predict"):
                await self._infer(scope, receive, send, path[11:-8], None, v2=False)
                return
        elif scope["type"] == "http" and scope["path"] in HEALTH_PATHS \
                and scope["method"] in ("GET", "HEAD"):
            await self._health(send, scope["path"] == "/v2/health/ready",
                               scope["method"] == "HEAD")
            return
        elif scope["type"] == "http" and _inference_path(scope["path"]):
            # the route exists, for POST only (RFC 9110 §15.5.6); the body is never read
            start, answer = asgi_error(RouteError(
                f"{scope['method']} is not allowed here: inference takes POST", 405,
                [(b"allow", b"POST")]), close=True)
            await send(start)
            await send(answer)
            return
        if scope["type"] == "http" and _has_body(scope):
            await self._fallthrough_closing(scope, receive, send)
            return
        await self.fallthrough(scope, receive, send)

    async def _fallthrough_closing(self, scope: Scope, receive: Receive, send: Send) -> None:
        """The FastAPI routes, for a request that has a body: an answer given without reading
        all of it (an unknown path's 404, a 405) closes the connection, since keeping it
        means receiving and discarding the rest (one connection stating a body of 10**12
        bytes was read for gigabytes). A route that reads its body keeps the connection."""
        read_all = False

        async def tracking_receive() -> Message:
            nonlocal read_all
            message = await receive()
            if message["type"] == "http.request" and not message.get("more_body", False):
                read_all = True
            return message

        async def closing_send(message: Message) -> None:
            if message["type"] == "http.response.start" and not read_all:
                message = {**message, "headers": [*message.get("headers", []),
                                                   (b"connection", b"close")]}
            await send(message)

        await self.fallthrough(scope, tracking_receive, closing_send)

    async def _refuse_browser(self, send: Send, refused: TailguardError) -> None:
        """Answer a web page's request 403 without reading it, and count it under the active
        role (``tailguard_rejections_total{reason="forbidden"}``): the body, if any, is never
        read, so the connection closes."""
        start, answer = asgi_error(refused, close=True)
        await send(start)
        await send(answer)
        self.runtime.active.metrics.count(refused.status_code, refused.reason)

    async def _health(self, send: Send, readiness: bool, head: bool) -> None:
        """``/v2/health/live`` (200 ``{"live": true}`` while the process serves; 503 once a
        model thread has crashed, see :attr:`Runtime.broken`) and ``/v2/health/ready`` (200
        ``{"ready": true}``; 503 while loading or draining, or once broken), served here rather
        than by FastAPI: about a tenth of the cost, so that probes stay quick and a client
        pipelining them cannot buy much of the event loop."""
        runtime = self.runtime
        body = LIVE_BODY
        problem: TailguardError | None = None
        if (broken := runtime.broken) is not None:
            problem = NotReady(broken)
        elif readiness:
            if runtime.draining:
                problem = Draining("runtime is draining")
            elif not runtime.ready:
                problem = NotReady("models are not loaded yet")
            else:
                body = READY_BODY
        if problem is not None:
            start, answer = asgi_error(problem)
            await send(start)
            await send({"type": "http.response.body", "body": b"" if head else answer["body"]})
            return
        await send({"type": "http.response.start", "status": 200,
                    "headers": [*JSON_HEADERS, (b"content-length", b"%d" % len(body))]})
        await send({"type": "http.response.body", "body": b"" if head else body})

    async def _infer(self, scope: Scope, receive: Receive, send: Send, name: str,
                     version: str | None, v2: bool) -> None:
        runtime = self.runtime
        served: ServedModel | None = None
        resolved: ServedModel | None = None
        arrival = perf_counter()  # reset once the body is in: latency is the server's own
        admitted = False
        body: bytes | None = None
        try:
            resolved = runtime.resolve(name, version)
            if runtime.draining:
                raise Draining("runtime is draining: not accepting new requests")
            if not runtime.ready:
                raise NotReady(f"model {name!r} is not ready yet")
            served = resolved
            timeout_s = self.default_timeout_s
            encoding = None
            header_length: int | None = None
            for key, value in scope["headers"]:
                if key == b"content-length" and int(value) > self.max_body:
                    raise PayloadTooLarge(f"body of {int(value)} bytes exceeds the limit of "
                                          f"{self.max_body} bytes{self.limit_reason}")
                if key == b"x-request-timeout-ms":
                    timeout_s = min(timeout_s, parse_timeout_header(value))
                if key == b"inference-header-content-length":
                    header_length = parse_header_length(value, v2)
                if key == b"content-encoding":
                    encoding = value
            body = await self._read_body(receive, arrival + timeout_s, BODY_COMPLETE in scope)
            arrival = perf_counter()
            predictor = served.predictor
            if encoding is None and len(body) <= INLINE_DECODE_BYTES:
                decoded = self._decode(body, encoding, predictor, v2, header_length)
            else:
                if encoding is not None:  # a gzip bomb that says so is refused here, cheaply
                    check_stated_size(body, encoding, self.max_body)
                decoded = await self._decodes.run(
                    functools.partial(self._decode, body, encoding, predictor, v2,
                                      header_length), len(body),
                    arrival + timeout_s, scope.get(CLIENT_GONE, _never))
            if isinstance(decoded, V2Request) and decoded.timeout_us is not None:
                timeout_s = min(timeout_s, decoded.timeout_us / 1e6)
            admitted = True
            outputs = await served.batcher.submit(decoded.x, timeout_s)
            binary_length = None
            if isinstance(decoded, V2Request):
                payload, binary_length = encode_v2(
                    runtime.name, served.version, decoded.id, predictor.outputs, outputs,
                    decoded.outputs, served.parameters, decoded.binary)
            else:
                payload = encode_v1(outputs[-1 if decoded.probabilities else 0])
        except TailguardError as exc:
            await self._fail(send, resolved, served, exc, arrival, perf_counter(), admitted,
                             close=(body is None and _has_body(scope)) or RETIRING in scope,
                             timeout_s=timeout_s if served is not None else None,
                             client=scope.get("client"))
            return
        except Exception as exc:  # a bug of ours: answer 500, keep serving
            logger.exception("unexpected error serving %s", scope["path"])
            await self._fail(send, resolved, served,
                             TailguardError(f"internal error: {type(exc).__name__}"),
                             arrival, perf_counter(), admitted)
            return
        keep = runtime.keep_alive and RETIRING not in scope
        headers = self.headers[served.role][0 if keep else 1]
        if binary_length is not None:  # the same headers, as the binary extension has them
            headers = [(b"content-type", b"application/octet-stream"),
                       (b"inference-header-content-length", b"%d" % binary_length),
                       *headers[1:]]
        await send({"type": "http.response.start", "status": 200,
                    "headers": [*headers, (b"content-length", b"%d" % len(payload))]})
        await send({"type": "http.response.body", "body": payload})
        runtime.record_answer(served, arrival, perf_counter(), timeout_s)

    def _decode(self, body: bytes, encoding: bytes | None, predictor: Predictor,
                v2: bool, header_length: int | None = None) -> V2Request | V1Request:
        """Inflate, decode and range-check a body (a :class:`V2Request` or a
        :class:`V1Request`). ``header_length``: the ``Inference-Header-Content-Length`` of a v2
        body with binary tensor data (the JSON is that many bytes of the inflated body, the
        binary data the rest). Pure CPU work, run on the loop for small plain bodies and in
        the decode thread otherwise.

        Raises:
            InvalidInput, PayloadTooLarge: as :func:`decompress`, :func:`check_structure`,
                :func:`decode_v2`, :func:`decode_v1` and :func:`check_input_range` do; 422
                for v1 probabilities asked of a model that has none (a regressor); 400 for a
                header length beyond the body.
        """
        if encoding is not None:
            body = decompress(body, encoding, self.max_body)
        binary = None
        if header_length is not None:
            if header_length > len(body):
                raise InvalidInput(f"Inference-Header-Content-Length is {header_length}, but "
                                   f"the body has {len(body)} bytes", 400)
            body, binary = body[:header_length], body[header_length:]
        check_structure(body, self.max_rows)
        if v2:
            request = decode_v2(body, predictor.n_features, predictor.output_names, self.max_rows,
                                predictor.feature_names, binary)
            check_input_range(request.x, predictor, "inputs[0]")
            return request
        v1 = decode_v1(body, predictor.n_features, self.max_rows)
        if v1.probabilities and predictor.outputs[-1].name != PROBABILITIES:
            raise InvalidInput("parameters.probabilities: this model gives no probabilities "
                               f"(its outputs: {', '.join(predictor.output_names)})")
        check_input_range(v1.x, predictor, "instances")
        return v1

    async def _read_body(self, receive: Receive, deadline: float, complete: bool) -> bytes:
        """The whole request body; a body in several parts must be complete by ``deadline``
        (``perf_counter`` seconds), so a client dribbling its upload cannot hold a connection
        and a handler for ever. ``complete``: the whole body has already been parsed
        (:data:`~tailguard_runtime.http.protocol.BODY_COMPLETE`), so the first ``receive()``
        returns at once and no timer is armed for it.

        Raises:
            PayloadTooLarge: the body grows past the limit.
            BodyTimeout: the body is still incomplete at ``deadline``.
            IncompleteBody: the client closed (or half-closed) before the whole body arrived;
                a part of a body is never run.
        """
        try:  # the wait for the first part too: a body that never starts has the same deadline
            if complete:
                message = await receive()
            else:
                async with asyncio.timeout(max(deadline - perf_counter(), 0)):
                    message = await receive()
        except TimeoutError:
            raise BodyTimeout("the request body did not arrive within the request's "
                              "deadline") from None
        if message["type"] == "http.disconnect":
            raise IncompleteBody(INCOMPLETE)
        body: bytes = message.get("body", b"")
        if not message.get("more_body", False):
            return body
        chunks = [body]
        size = len(body)
        while message.get("more_body", False):
            try:
                message = await asyncio.wait_for(receive(), max(deadline - perf_counter(), 0))
            except TimeoutError:
                raise BodyTimeout("the request body did not arrive within the request's "
                                  "deadline") from None
            if message["type"] == "http.disconnect":
                raise IncompleteBody(INCOMPLETE)
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self.max_body:
                raise PayloadTooLarge(f"body exceeds the limit of {self.max_body} bytes"
                                      f"{self.limit_reason}")
            chunks.append(chunk)
        return b"".join(chunks)

    def _pacer(self, client: Any) -> RefusalPacer:
        """The refusal bucket of the connection ``client`` (ASGI ``scope["client"]``:
        ``(host, port)``), made full on its first refusal; the oldest is dropped past
        :data:`MAX_PACED_CONNECTIONS`."""
        pacer = self.pacers.get(client)
        if pacer is None:
            limits = self.runtime.settings.connections
            pacer = RefusalPacer(limits.refusals_per_s, limits.refusals_per_s * REFUSAL_BURST_S,
                                 limits.refusal_delay_s)
            self.pacers[client] = pacer
            if len(self.pacers) > MAX_PACED_CONNECTIONS:
                self.pacers.popitem(last=False)
        else:
            self.pacers.move_to_end(client)
        return pacer

    async def _fail(self, send: Send, resolved: ServedModel | None, served: ServedModel | None,
                    exc: TailguardError, arrival: float, now: float, admitted: bool,
                    close: bool = False, timeout_s: float | None = None,
                    client: Any = None) -> None:
        """Answer ``exc``; ``resolved`` is the role the request reached (its identity headers
        go on the reply), ``served`` the same once the request passed readiness (its metrics
        count the reply). ``close``: end the connection after the reply; for a body refused
        unread, since keeping the connection means receiving and discarding all of it (16 MiB
        bodies sent back to back took most of a core). A 4xx past the refusal budget of its
        connection ``client`` is answered late
        (:class:`~tailguard_runtime.admission.RefusalPacer`); its metrics and
        stats count from ``now``, as if it had been answered at once
        (:meth:`~tailguard_runtime.service.Runtime.record_failure`)."""
        runtime = self.runtime
        if 400 <= exc.status_code < 500 and not isinstance(exc, UNPACED):
            delay_s = self._pacer(client).delay(now)
            if delay_s:
                self._count_delayed()
                await asyncio.sleep(delay_s)
        start, body = asgi_error(exc, () if resolved is None else resolved.headers,
                                 close=close or not runtime.keep_alive)
        await send(start)
        await send(body)
        runtime.record_failure(served, exc, arrival, now, admitted, timeout_s)


def _never() -> bool:
    return False


def _has_body(scope: Scope) -> bool:
    """Whether the request says a body follows (a ``Content-Length`` above 0, or any
    ``Transfer-Encoding``)."""
    for name, value in scope["headers"]:
        if name == b"transfer-encoding" or (name == b"content-length" and value != b"0"):
            return True
    return False


def _inference_path(path: str) -> bool:
    """Whether ``path`` is an inference route (v2 ``.../infer``, v1 ``...:predict``)."""
    return ((path.startswith("/v2/models/") and path.endswith("/infer"))
            or (path.startswith("/v1/models/") and path.endswith(":predict")))


def build_app(runtime: Runtime) -> InferenceApp:
    """The full ASGI app for ``runtime``: the lean inference path in front of FastAPI."""
    # redirect_slashes off: Starlette answered ``GET /v2/`` with a 307 whose Location copied
    # the request's Host, whoever sent it; a path is served as written or is a 404
    api = FastAPI(title="tailguard runtime", version=__version__, docs_url=None, redoc_url=None,
                  openapi_url=None, redirect_slashes=False)

    async def _error(_: Request, exc: Exception) -> Response:
        # Exception: a bug of ours, answered in the same shape (Starlette still logs it)
        return error_response(as_tailguard_error(exc))

    for kind in (TailguardError, StarletteHTTPException, RequestValidationError, Exception):
        api.add_exception_handler(kind, _error)

    @api.get("/v2")
    async def server_metadata() -> dict[str, Any]:
        return {"name": "tailguard", "version": __version__,
                "extensions": list(SERVER_EXTENSIONS)}

    @api.get("/v2/models/{name}")
    @api.get("/v2/models/{name}/versions/{version}")
    async def model_metadata(name: str, version: str | None = None) -> dict[str, Any]:
        return runtime.model_metadata(runtime.resolve(name, version))

    @api.get("/v2/models/{name}/ready")
    @api.get("/v2/models/{name}/versions/{version}/ready")
    async def model_ready(name: str, version: str | None = None) -> dict[str, Any]:
        runtime.resolve(name, version)
        if runtime.readiness() is not None:
            raise NotReady(f"model {name!r} is not ready")
        return {"name": runtime.name, "ready": True}

    # KServe's v1 listing and readiness (its data plane: GET /v1/models, /v1/models/{name});
    # tailguard serves one model under the InferenceService's name
    @api.get("/v1/models")
    async def v1_models() -> dict[str, Any]:
        return {"models": [runtime.name]}

    @api.get("/v1/models/{name}")
    async def v1_model_ready(name: str) -> dict[str, Any]:
        runtime.resolve(name, None)
        if (problem := runtime.readiness()) is not None:
            raise problem
        return {"name": runtime.name, "ready": True}

    # the model repository extension's index (Triton, KServe), and KServe's v2 listing
    @api.post("/v2/repository/index")
    async def repository_index() -> list[dict[str, Any]]:
        problem = runtime.readiness()
        return [{"name": runtime.name, "version": runtime.active.version,
                 "state": "READY" if problem is None else "UNAVAILABLE",
                 "reason": "" if problem is None else problem.message}]

    @api.get("/v2/models")
    async def v2_models() -> dict[str, Any]:
        return {"models": [runtime.name]}

    @api.get("/metrics")
    async def prometheus() -> Response:
        return Response(generate_latest(), media_type=CONTENT_TYPE_LATEST)

    @api.get("/tailguard/stats")
    async def stats() -> dict[str, Any]:
        now = perf_counter()
        return {"name": runtime.name, "activeModel": runtime.active_role,
                "ready": runtime.ready and not runtime.draining, **runtime.describe(),
                "models": {role: s.stats.snapshot(now, s.batcher.queue_depth)
                           for role, s in runtime.models.items()},
                "totals": runtime.totals(now)}

    if runtime.settings.control_secret is not None:
        add_control_routes(api, runtime, runtime.settings.control_secret)

    return InferenceApp(runtime, api)
