"""HTTP routes: a lean inference path, and FastAPI for everything else.

The two inference routes (v2 ``POST /v2/models/{name}[/versions/{v}]/infer`` and v1
``POST /v1/models/{name}:predict``) and the two health probes (``/v2/health/live`` and
``/v2/health/ready``) are served by :class:`InferenceApp` itself, with orjson and no request
model: at thousands of requests per second every 0.1 ms counts. An inference request whose
whole body is in when it starts (nearly all of them) is served without ASGI at all
(:meth:`InferenceApp.direct`, called by the HTTP protocol); the rest (a body still arriving,
compressed or large) as ASGI (:meth:`InferenceApp._infer`), through the same steps. Every
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
from tailguard_runtime.http.errors import (
    Headers,
    as_tailguard_error,
    asgi_error,
    error_headers,
    error_response,
)
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
    encode_error,
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
Respond = Callable[[int, Headers, bytes], None]
"""Writes one whole answer: ``respond(status, headers, body)``."""

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
            if (route := inference_route(scope["path"])) is not None:
                await self._infer(scope, receive, send, *route)
                return
        elif scope["type"] == "http" and scope["path"] in HEALTH_PATHS \
                and scope["method"] in ("GET", "HEAD"):
            await self._health(send, scope["path"] == "/v2/health/ready",
                               scope["method"] == "HEAD")
            return
        elif scope["type"] == "http" and inference_route(scope["path"]) is not None:
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

    def direct(self, scope: Scope, body: bytes, respond: Respond) -> bool:
        """Serve an inference request whose whole body has arrived, without an ASGI task:
        the HTTP protocol calls this (:meth:`~tailguard_runtime.http.protocol.JsonHttpProtocol.serve_direct`)
        with the request's ``scope``, its ``body``, and ``respond(status, headers, body)``,
        which writes one whole answer. The steps, checks and answers are those of the ASGI
        path (:meth:`_infer`, one set of helpers for both); the answer is written from the
        batcher's future's done callback. This skips the task, the coroutines and the ASGI
        messages of a request: about a fifth of the event loop's time per request (measured
        in ``benchmarks/README.md``, "Served straight from the protocol").

        Returns False, having answered nothing, for a request this path leaves to the ASGI
        app: not ``POST`` to an inference route, a browser's, a compressed body, or one to
        decode in the decode thread (over :data:`INLINE_DECODE_BYTES`)."""
        route = inference_route(scope["path"]) if scope["method"] == "POST" else None
        if route is None or browser_refusal(scope["headers"], self.allowed_origins) is not None:
            return False
        name, version, v2 = route
        call = Call(scope, v2, self.default_timeout_s)
        try:
            encoding, header_length = self._begin(call, name, version)
            if encoding is not None or len(body) > INLINE_DECODE_BYTES:
                return False
            call.body_in()
            assert call.served is not None
            future = self._admit(call, self._decode(body, None, call.served.predictor, v2,
                                                    header_length))
        except TailguardError as exc:
            self._fail_direct(respond, call, exc)
            return True
        except Exception as exc:  # a bug of ours: answer 500, keep serving
            logger.exception("unexpected error serving %s", scope["path"])
            self._fail_direct(respond, call, _internal(exc))
            return True
        future.add_done_callback(functools.partial(self._answer_direct, call, respond))
        return True

    def _answer_direct(self, call: Call, respond: Respond, future: asyncio.Future[Any]) -> None:
        """The batcher's answer to a request of :meth:`direct`, written."""
        try:
            headers, payload = self._success(call, future.result())
        except TailguardError as exc:
            self._fail_direct(respond, call, exc)
            return
        except Exception as exc:  # a bug of ours: answer 500, keep serving
            logger.exception("unexpected error serving %s", call.scope["path"])
            self._fail_direct(respond, call, _internal(exc))
            return
        respond(200, headers, payload)
        assert call.served is not None
        self.runtime.record_answer(call.served, call.arrival, perf_counter(), call.timeout_s)

    def _fail_direct(self, respond: Respond, call: Call, exc: TailguardError) -> None:
        """:meth:`_fail` for :meth:`direct`: a paced refusal is written from a timer."""
        now = perf_counter()
        delay_s, headers, body = self._refusal(call, exc, now)

        def finish() -> None:
            respond(exc.status_code, headers, body)
            self._record_failure(call, exc, now)

        if delay_s:
            asyncio.get_running_loop().call_later(delay_s, finish)
        else:
            finish()

    async def _infer(self, scope: Scope, receive: Receive, send: Send, name: str,
                     version: str | None, v2: bool) -> None:
        """Serve an inference request as ASGI: what :meth:`direct` leaves (a body still
        arriving, compressed or large, a client that asked ``Expect: 100-continue``)."""
        call = Call(scope, v2, self.default_timeout_s)
        try:
            encoding, header_length = self._begin(call, name, version)
            body = await self._read_body(receive, call.arrival + call.timeout_s,
                                         BODY_COMPLETE in scope)
            call.body_in()
            assert call.served is not None
            predictor = call.served.predictor
            if encoding is None and len(body) <= INLINE_DECODE_BYTES:
                decoded = self._decode(body, encoding, predictor, v2, header_length)
            else:
                if encoding is not None:  # a gzip bomb that says so is refused here, cheaply
                    check_stated_size(body, encoding, self.max_body)
                decoded = await self._decodes.run(
                    functools.partial(self._decode, body, encoding, predictor, v2,
                                      header_length), len(body),
                    call.arrival + call.timeout_s, scope.get(CLIENT_GONE, _never))
            headers, payload = self._success(call, await self._admit(call, decoded))
        except TailguardError as exc:
            await self._fail(send, call, exc)
            return
        except Exception as exc:  # a bug of ours: answer 500, keep serving
            logger.exception("unexpected error serving %s", scope["path"])
            await self._fail(send, call, _internal(exc))
            return
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        await send({"type": "http.response.body", "body": payload})
        assert call.served is not None
        self.runtime.record_answer(call.served, call.arrival, perf_counter(), call.timeout_s)

    def _begin(self, call: Call, name: str, version: str | None
               ) -> tuple[bytes | None, int | None]:
        """The checks before the body: the role ``name`` (and ``version``) resolves to, not
        draining, ready, a stated ``Content-Length`` within the limit; the request's deadline
        (``X-Request-Timeout-Ms``) into ``call.timeout_s``. Returns the body's
        ``Content-Encoding`` and the ``Inference-Header-Content-Length`` (``None`` each when
        absent).

        Raises:
            RouteError: (404) an unknown model or version.
            Draining, NotReady: (503) the runtime drains, or its models are not loaded yet.
            PayloadTooLarge: (413) the stated length is over the limit.
            InvalidInput: (400) a malformed deadline or header length.
        """
        runtime = self.runtime
        call.resolved = runtime.resolve(name, version)
        if runtime.draining:
            raise Draining("runtime is draining: not accepting new requests")
        if not runtime.ready:
            raise NotReady(f"model {name!r} is not ready yet")
        call.served = call.resolved
        timeout_s = call.timeout_s
        encoding = None
        header_length: int | None = None
        for key, value in call.scope["headers"]:
            if key == b"content-length" and int(value) > self.max_body:
                raise PayloadTooLarge(f"body of {int(value)} bytes exceeds the limit of "
                                      f"{self.max_body} bytes{self.limit_reason}")
            if key == b"x-request-timeout-ms":
                timeout_s = min(timeout_s, parse_timeout_header(value))
            if key == b"inference-header-content-length":
                header_length = parse_header_length(value, call.v2)
            if key == b"content-encoding":
                encoding = value
        call.timeout_s = timeout_s
        return encoding, header_length

    def _admit(self, call: Call, decoded: V2Request | V1Request) -> asyncio.Future[Any]:
        """Queue ``decoded``'s rows with the role's batcher, by the request's deadline (a v2
        body's ``parameters.timeout`` shortens it); the future of its outputs.

        Raises:
            Draining, Overloaded, PayloadTooLarge, TailguardError: as
                :meth:`~tailguard_runtime.batcher.Batcher.enqueue`.
        """
        call.decoded = decoded
        if isinstance(decoded, V2Request) and decoded.timeout_us is not None:
            call.timeout_s = min(call.timeout_s, decoded.timeout_us / 1e6)
        call.admitted = True
        assert call.served is not None
        return call.served.batcher.enqueue(decoded.x, call.timeout_s)

    def _success(self, call: Call, outputs: Any) -> tuple[Headers, bytes]:
        """The headers and body of the 200 answering ``call`` with the model's ``outputs``
        (v2 JSON, v2 with binary tensor data, or v1), ``Connection: close`` when the runtime
        is leaving or the connection has reached its age."""
        served, decoded = call.served, call.decoded
        assert served is not None and decoded is not None
        binary_length = None
        if isinstance(decoded, V2Request):
            payload, binary_length = encode_v2(
                self.runtime.name, served.version, decoded.id, served.predictor.outputs,
                outputs, decoded.outputs, served.parameters, decoded.binary)
        else:
            payload = encode_v1(outputs[-1 if decoded.probabilities else 0])
        keep = self.runtime.keep_alive and RETIRING not in call.scope
        headers = self.headers[served.role][0 if keep else 1]
        if binary_length is not None:  # the same headers, as the binary extension has them
            headers = [(b"content-type", b"application/octet-stream"),
                       (b"inference-header-content-length", b"%d" % binary_length),
                       *headers[1:]]
        return [*headers, (b"content-length", b"%d" % len(payload))], payload

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

    def _refusal(self, call: Call, exc: TailguardError, now: float
                 ) -> tuple[float, Headers, bytes]:
        """How to answer ``call`` with ``exc``: the delay first (seconds; 0 for none), the
        headers and the body. The identity headers of the role the request reached go on the
        reply. The connection ends after it when the body was refused unread (keeping the
        connection means receiving and discarding all of it: 16 MiB bodies sent back to back
        took most of a core), when the connection has reached its age, or when the runtime is
        leaving. A 4xx past the refusal budget of its connection (``scope["client"]``) is
        answered late (:class:`~tailguard_runtime.admission.RefusalPacer`), counted in
        ``tailguard_refusals_delayed_total``."""
        scope = call.scope
        delay_s = 0.0
        if 400 <= exc.status_code < 500 and not isinstance(exc, UNPACED):
            delay_s = self._pacer(scope.get("client")).delay(now)
            if delay_s:
                self._count_delayed()
        close = ((not call.body_read and _has_body(scope)) or RETIRING in scope
                 or not self.runtime.keep_alive)
        body = encode_error(exc.message)
        extra = () if call.resolved is None else call.resolved.headers
        return delay_s, error_headers(exc, body, extra, close=close), body

    def _record_failure(self, call: Call, exc: TailguardError, now: float) -> None:
        """Count ``call``'s refusal or failure as of ``now`` (a paced refusal counts from
        when it was decided, as if answered at once:
        :meth:`~tailguard_runtime.service.Runtime.record_failure`)."""
        self.runtime.record_failure(call.served, exc, call.arrival, now, call.admitted,
                                    call.timeout_s if call.served is not None else None)

    async def _fail(self, send: Send, call: Call, exc: TailguardError) -> None:
        """Answer ``call`` with ``exc`` (:meth:`_refusal`) and count it."""
        now = perf_counter()
        delay_s, headers, body = self._refusal(call, exc, now)
        if delay_s:
            await asyncio.sleep(delay_s)
        await send({"type": "http.response.start", "status": exc.status_code,
                    "headers": headers})
        await send({"type": "http.response.body", "body": body})
        self._record_failure(call, exc, now)


class Call:
    """One inference request while it is served: its ``scope``, whether it is v2, the role
    it resolved to (``resolved``) and, past readiness, the one serving it (``served``), its
    ``arrival`` (``perf_counter`` s; reset once the body is in, so latency is the server's
    own), its deadline ``timeout_s`` (s), whether its body was read and it was admitted, and
    its decoded rows."""

    __slots__ = ("scope", "v2", "resolved", "served", "arrival", "timeout_s", "body_read",
                 "admitted", "decoded")

    def __init__(self, scope: Scope, v2: bool, timeout_s: float) -> None:
        self.scope = scope
        self.v2 = v2
        self.resolved: ServedModel | None = None
        self.served: ServedModel | None = None
        self.arrival = perf_counter()
        self.timeout_s = timeout_s
        self.body_read = False
        self.admitted = False
        self.decoded: V2Request | V1Request | None = None

    def body_in(self) -> None:
        """The whole body has been read: latency counts from now."""
        self.body_read = True
        self.arrival = perf_counter()


def _internal(exc: Exception) -> TailguardError:
    """The 500 answering a bug of ours (only the exception's type is told)."""
    return TailguardError(f"internal error: {type(exc).__name__}")


def _never() -> bool:
    return False


def _has_body(scope: Scope) -> bool:
    """Whether the request says a body follows (a ``Content-Length`` above 0, or any
    ``Transfer-Encoding``)."""
    for name, value in scope["headers"]:
        if name == b"transfer-encoding" or (name == b"content-length" and value != b"0"):
            return True
    return False


def inference_route(path: str) -> tuple[str, str | None, bool] | None:
    """``(model name, version or None, v2)`` when ``path`` is an inference route (v2
    ``/v2/models/{name}[/versions/{version}]/infer``, v1 ``/v1/models/{name}:predict``);
    ``None`` otherwise."""
    if path.startswith("/v2/models/") and path.endswith("/infer"):
        name, versioned, version = path[11:-6].partition("/versions/")
        return name, version if versioned else None, True
    if path.startswith("/v1/models/") and path.endswith(":predict"):
        return path[11:-8], None, False
    return None


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
