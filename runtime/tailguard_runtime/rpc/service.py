"""``inference.GRPCInferenceService`` on the runtime's event loop.

The gRPC server (``grpc.aio``) runs on the same loop as the HTTP server and hands requests to
the same :class:`~tailguard_runtime.service.Runtime`: the same admission, batches (a gRPC
request and a REST request can share a model call), deadlines, traffic switch, metrics and SLO
accounting (:meth:`~tailguard_runtime.service.Runtime.record_answer`,
:meth:`~tailguard_runtime.service.Runtime.record_failure`).

Errors map to gRPC status codes as :data:`STATUS_CODES` says; a 429 carries a
``google.rpc.RetryInfo`` in ``grpc-status-details-bin`` (the richer error model gRPC
documents) and the same ``retry-after`` (seconds) as trailing metadata. A request's deadline is
the shortest of the spec's ``timeoutMs``, the gRPC deadline and the request's ``timeout``
parameter (microseconds, as ``tritonclient`` sends it).

Bounds against hostile clients are gRPC's own (:func:`server_options`): a message size limit
derived from the largest valid request, concurrent streams per connection, concurrent calls per
process, keep-alive ping enforcement, idle connections closed, and server pings that end a
connection whose peer stopped reading; and one of ours, concurrent calls per client address
(:class:`CallsByAddress`).
"""

from __future__ import annotations

import asyncio
import functools
import logging
from time import perf_counter
from typing import Any, Awaitable, Callable, NoReturn, TypeVar

import grpc
from google.protobuf import any_pb2, duration_pb2
from google.rpc import code_pb2, error_details_pb2, status_pb2

from tailguard_runtime import __version__
from tailguard_runtime.errors import (
    DeadlineExceeded,
    Draining,
    NotReady,
    Overloaded,
    TailguardError,
)
from tailguard_runtime.metrics import REQUESTS_UNANSWERED
from tailguard_runtime.models import check_input_range
from tailguard_runtime.rpc import protocol as pb
from tailguard_runtime.rpc import tensors
from tailguard_runtime.service import Runtime, ServedModel

logger = logging.getLogger(__name__)
T = TypeVar("T")

STATUS_CODES: dict[int, grpc.StatusCode] = {
    400: grpc.StatusCode.INVALID_ARGUMENT,
    403: grpc.StatusCode.PERMISSION_DENIED,
    404: grpc.StatusCode.NOT_FOUND,
    408: grpc.StatusCode.DEADLINE_EXCEEDED,
    413: grpc.StatusCode.INVALID_ARGUMENT,
    422: grpc.StatusCode.INVALID_ARGUMENT,
    429: grpc.StatusCode.RESOURCE_EXHAUSTED,
    503: grpc.StatusCode.UNAVAILABLE,
    504: grpc.StatusCode.DEADLINE_EXCEEDED,
}
"""The HTTP status of each refusal, as a gRPC status code (anything else: ``INTERNAL``). 413
(more rows than the queue holds) is ``INVALID_ARGUMENT``, not ``RESOURCE_EXHAUSTED``: the same
request can never succeed, so a client must not retry it; 429 is ``RESOURCE_EXHAUSTED`` with
retry info, as gRPC's status code guide has it for load shedding."""

CANCEL_SLACK_S = 0.005
"""A call cancelled this close to its deadline (s) is counted as the deadline passing (504,
``deadline_exceeded``); one cancelled earlier, by its client, as unanswered
(``tailguard_requests_unanswered_total{stage="running"}``)."""

SERVER_EXTENSIONS = ("binary_tensor_data",)
"""The protocol extensions ``ServerMetadata`` names, as the REST ``GET /v2`` does."""

GRPC_BYTES_PER_VALUE = 10
"""The most bytes one input value can take in a ``ModelInferRequest``: 8 as raw contents or a
packed ``fp64_contents``, up to 10 as a packed ``int64_contents`` varint."""
MESSAGE_OVERHEAD_BYTES = 64 * 1024
"""Room in the message size limit for names, shapes, parameters and the id."""
MIN_CALLS_PER_ADDRESS = 16
"""The fewest calls one client address may have in progress (:func:`max_calls_per_address`)."""
MIN_CONCURRENT_CALLS = 256
"""The fewest calls the process handles at once; past :func:`max_concurrent_calls` a new call
gets ``RESOURCE_EXHAUSTED`` from gRPC at once."""
KEEPALIVE_TIME_MS = 30_000
"""The server pings a connection idle this long (ms) ..."""
KEEPALIVE_TIMEOUT_MS = 10_000
"""... and closes it when the ping is not acknowledged within this (ms): a peer that stopped
reading holds its calls at most about 40 s."""
MIN_CLIENT_PING_INTERVAL_MS = 10_000
"""Client pings closer together than this (ms) are strikes; past two, the connection gets
GOAWAY ``too_many_pings`` (gRPC's keep-alive enforcement, gRFC A8)."""
MAX_CONNECTION_IDLE_MS = 300_000
"""A connection with no call for this long (ms) is closed with GOAWAY (gRFC A9)."""
MAX_METADATA_BYTES = 16 * 1024
"""The largest header list a call may send, in bytes (gRPC's default soft limit is 8 KiB)."""


def max_message_bytes(n_features: int, max_rows: int) -> int:
    """The largest ``ModelInferRequest`` a valid call can need, in bytes: ``max_rows`` rows
    (``maxQueueSize``) of ``n_features`` values of :data:`GRPC_BYTES_PER_VALUE`, plus
    :data:`MESSAGE_OVERHEAD_BYTES`. gRPC refuses a larger message with ``RESOURCE_EXHAUSTED``
    before it is parsed."""
    return MESSAGE_OVERHEAD_BYTES + max_rows * n_features * GRPC_BYTES_PER_VALUE


def max_concurrent_calls(max_queue_size: int) -> int:
    """Calls in progress at once, in the process and on one connection: twice
    ``maxQueueSize`` (every admitted call holds at least one queued row, so more could never
    all be admitted), at least :data:`MIN_CONCURRENT_CALLS`.

    Past it, a new call gets ``RESOURCE_EXHAUSTED`` (the process's cap, ``grpc.aio``'s
    ``maximum_concurrent_rpcs``), and a stream opened past it on one connection is reset with
    ``REFUSED_STREAM``, which clients see as ``UNAVAILABLE`` (HTTP/2's
    ``SETTINGS_MAX_CONCURRENT_STREAMS``). The stream cap is the process's cap and not lower:
    with 128 streams per connection, ``grpc``'s own client sent 3,000 concurrent calls on one
    channel without waiting for free streams, and 2,300 of them failed ``UNAVAILABLE`` (all
    3,000 succeeded without the cap)."""
    return max(MIN_CONCURRENT_CALLS, 2 * max_queue_size)


def max_calls_per_address(max_queue_size: int) -> int:
    """Calls one client address may have in progress: a quarter of
    :func:`max_concurrent_calls`, at least :data:`MIN_CALLS_PER_ADDRESS`, so that one address
    cannot fill the process's cap (as ``maxConnectionsPerAddress`` keeps one address from
    filling the HTTP connection cap). A call counts until gRPC has finished it, its answer
    sent: a client that never reads holds its calls, and no more than these."""
    return max(MIN_CALLS_PER_ADDRESS, max_concurrent_calls(max_queue_size) // 4)


class CallsByAddress:
    """The calls in progress per client address (the peer's IP, its port dropped), each
    counted from its start until gRPC reports it done."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.calls: dict[str, int] = {}

    def enter(self, context: grpc.aio.ServicerContext[Any, Any]) -> Overloaded | None:
        """Count the call of ``context``; or, with its address at :attr:`limit`, count nothing
        and return the refusal (429, reason ``address_limit``)."""
        address = peer_address(context.peer())
        held = self.calls.get(address, 0)
        if held >= self.limit:
            return Overloaded(f"too many calls in progress from {address} (at most "
                              f"{self.limit} per client address)", 1, "address_limit")
        self.calls[address] = held + 1
        context.add_done_callback(lambda _: self._leave(address))
        return None

    def _leave(self, address: str) -> None:
        held = self.calls.pop(address, 1) - 1
        if held > 0:
            self.calls[address] = held


def peer_address(peer: str) -> str:
    """The address of a gRPC peer string: ``ipv4:10.0.0.7:51234`` -> ``10.0.0.7``,
    ``ipv6:[::1]:51234`` -> ``[::1]``; anything else as it is."""
    kind, _, rest = peer.partition(":")
    if kind in ("ipv4", "ipv6") and ":" in rest:
        return rest.rsplit(":", 1)[0]
    return peer


def bounded(method: Callable[[InferenceServicer, Any, grpc.aio.ServicerContext[Any, Any]],
                             Awaitable[T]]
            ) -> Callable[[InferenceServicer, Any, grpc.aio.ServicerContext[Any, Any]],
                          Awaitable[T]]:
    """A servicer method whose calls count toward their address's
    :class:`CallsByAddress` limit; past it, the call ends ``RESOURCE_EXHAUSTED`` at once
    (counted as a ``tailguard_rejections_total{reason="address_limit"}``)."""
    @functools.wraps(method)
    async def call(self: InferenceServicer, request: Any,
                   context: grpc.aio.ServicerContext[Any, Any]) -> T:
        refused = self.by_address.enter(context)
        if refused is not None:
            self.runtime.active.metrics.count_rejection(refused.reason)
            await abort(context, refused)
        return await method(self, request, context)
    return call


def server_options(n_features: int, max_rows: int) -> list[tuple[str, int]]:
    """The ``grpc.aio.server`` channel arguments (see the module's docstring). ``so_reuseport``
    is off, so a second process cannot bind the same port unnoticed."""
    return [
        ("grpc.so_reuseport", 0),
        ("grpc.max_receive_message_length", max_message_bytes(n_features, max_rows)),
        ("grpc.max_concurrent_streams", max_concurrent_calls(max_rows)),
        ("grpc.max_metadata_size", MAX_METADATA_BYTES),
        ("grpc.keepalive_time_ms", KEEPALIVE_TIME_MS),
        ("grpc.keepalive_timeout_ms", KEEPALIVE_TIMEOUT_MS),
        ("grpc.keepalive_permit_without_calls", 0),
        ("grpc.http2.min_recv_ping_interval_without_data_ms", MIN_CLIENT_PING_INTERVAL_MS),
        ("grpc.http2.max_ping_strikes", 2),
        ("grpc.max_connection_idle_ms", MAX_CONNECTION_IDLE_MS),
    ]


class InferenceServicer:
    """The six calls of ``GRPCInferenceService``, served by ``runtime`` (named as the
    protocol names them; :func:`service_handler` registers them)."""

    def __init__(self, runtime: Runtime) -> None:
        self.runtime = runtime
        self.default_timeout_s = runtime.settings.batching.timeout_ms / 1000.0
        self.max_rows = runtime.settings.batching.max_queue_size
        self.by_address = CallsByAddress(max_calls_per_address(self.max_rows))

    @bounded
    async def ServerLive(self, request: Any,  # noqa: N802 (the protocol's names)
                         context: grpc.aio.ServicerContext[Any, Any]) -> Any:
        """``live``: false once a model thread has crashed (REST's liveness is then 503)."""
        return pb.ServerLiveResponse(live=self.runtime.broken is None)

    @bounded
    async def ServerReady(self, request: Any,  # noqa: N802
                          context: grpc.aio.ServicerContext[Any, Any]) -> Any:
        """``ready``: false while loading or draining, or once broken."""
        return pb.ServerReadyResponse(ready=self.runtime.readiness() is None)

    @bounded
    async def ModelReady(self, request: Any,  # noqa: N802
                         context: grpc.aio.ServicerContext[Any, Any]) -> Any:
        """``ready`` of the named model; ``NOT_FOUND`` for another name or version."""
        try:
            self.runtime.resolve(request.name, request.version or None)
        except TailguardError as exc:
            await abort(context, exc)
        return pb.ModelReadyResponse(ready=self.runtime.readiness() is None)

    @bounded
    async def ServerMetadata(self, request: Any,  # noqa: N802
                             context: grpc.aio.ServicerContext[Any, Any]) -> Any:
        """The server's name, version and extensions, as ``GET /v2``."""
        return pb.ServerMetadataResponse(name="tailguard", version=__version__,
                                         extensions=SERVER_EXTENSIONS)

    @bounded
    async def ModelMetadata(self, request: Any,  # noqa: N802
                            context: grpc.aio.ServicerContext[Any, Any]) -> Any:
        """The active model's metadata, as ``GET /v2/models/{name}`` (without its
        ``parameters``, which the message does not carry)."""
        try:
            served = self.runtime.resolve(request.name, request.version or None)
        except TailguardError as exc:
            await abort(context, exc)
        meta = self.runtime.model_metadata(served)
        return pb.ModelMetadataResponse(
            name=meta["name"], versions=meta["versions"], platform=meta["platform"],
            inputs=tensors.tensor_metadata(meta["inputs"]),
            outputs=tensors.tensor_metadata(meta["outputs"]))

    @bounded
    async def ModelInfer(self, request: Any,  # noqa: N802
                         context: grpc.aio.ServicerContext[Any, Any]) -> Any:
        """Decode, admit, batch and answer one inference call (see the module's docstring)."""
        runtime = self.runtime
        arrival = perf_counter()
        resolved: ServedModel | None = None
        served: ServedModel | None = None
        admitted = False
        timeout_s = self.default_timeout_s
        try:
            resolved = runtime.resolve(request.model_name, request.model_version or None)
            if runtime.draining:
                raise Draining("runtime is draining: not accepting new requests")
            if not runtime.ready:
                raise NotReady(f"model {request.model_name!r} is not ready yet")
            served = resolved
            remaining = context.time_remaining()
            if remaining is not None:
                timeout_s = min(timeout_s, max(remaining, 0.0))
            predictor = served.predictor
            decoded = tensors.decode_infer(request, predictor.n_features,
                                           predictor.output_names, self.max_rows,
                                           predictor.feature_names)
            check_input_range(decoded.x, predictor, "inputs[0]")
            if decoded.timeout_us is not None:
                timeout_s = min(timeout_s, decoded.timeout_us / 1e6)
            admitted = True
            outputs = await served.batcher.submit(decoded.x, timeout_s)
            response = tensors.encode_infer(runtime.name, served.version, decoded.id,
                                            predictor.outputs, outputs, decoded.outputs,
                                            served.parameters)
        except TailguardError as exc:
            runtime.record_failure(served, exc, arrival, perf_counter(), admitted,
                                   timeout_s if served is not None else None)
            await abort(context, exc, resolved)
        except asyncio.CancelledError:
            # gRPC cancels the handler when the call's deadline passes (at about the moment
            # the batcher's own timer would) or the client cancels: its rows leave the queue
            now = perf_counter()
            if served is not None and admitted and now >= arrival + timeout_s - CANCEL_SLACK_S:
                runtime.record_failure(served, DeadlineExceeded(
                    f"deadline of {timeout_s * 1000:.0f} ms exceeded"), arrival, now, True,
                    timeout_s)
            else:
                REQUESTS_UNANSWERED.labels(runtime.name, "running").inc()
            raise
        except Exception as exc:  # a bug of ours: INTERNAL, keep serving
            logger.exception("unexpected error serving a gRPC ModelInfer")
            error = TailguardError(f"internal error: {type(exc).__name__}")
            runtime.record_failure(served, error, arrival, perf_counter(), admitted, None)
            await abort(context, error, resolved)
        await context.send_initial_metadata(identity(served))
        runtime.record_answer(served, arrival, perf_counter(), timeout_s)
        return response


def identity(served: ServedModel) -> tuple[tuple[str, str], ...]:
    """The ``x-tailguard-role``/``-model``/``-model-version`` metadata of ``served``'s answers
    (the REST replies' headers of the same names)."""
    return tuple((key.decode(), value.decode()) for key, value in served.headers)


async def abort(context: grpc.aio.ServicerContext[Any, Any], exc: TailguardError,
                resolved: ServedModel | None = None) -> NoReturn:
    """End the call with ``exc``'s status code (:data:`STATUS_CODES`) and message; a 429
    also carries ``google.rpc.RetryInfo`` and ``retry-after``; ``resolved``'s identity goes in
    the trailing metadata.

    Raises:
        grpc.aio.AbortError: always (how ``grpc.aio`` ends a call).
    """
    code = STATUS_CODES.get(exc.status_code, grpc.StatusCode.INTERNAL)
    trailing: list[tuple[str, str | bytes]] = [] if resolved is None else list(identity(resolved))
    if isinstance(exc, Overloaded):
        detail = any_pb2.Any()
        detail.Pack(error_details_pb2.RetryInfo(
            retry_delay=duration_pb2.Duration(seconds=exc.retry_after_s)))
        status = status_pb2.Status(code=code_pb2.RESOURCE_EXHAUSTED, message=exc.message,
                                   details=[detail])
        trailing += [("grpc-status-details-bin", status.SerializeToString()),
                     ("retry-after", str(exc.retry_after_s))]
    await context.abort(code, exc.message, tuple(trailing))
    raise AssertionError("grpc.aio's abort returned")  # it raises AbortError


def service_handler(servicer: InferenceServicer) -> grpc.GenericRpcHandler:
    """``servicer``'s methods as the handlers of :data:`~tailguard_runtime.rpc.protocol.SERVICE`,
    each unary, its request and response classes taken from the protocol's descriptor.

    Raises:
        AttributeError: the servicer lacks a method the protocol names.
    """
    handlers = {name: grpc.unary_unary_rpc_method_handler(
        getattr(servicer, name), request_deserializer=request.FromString,
        response_serializer=response.SerializeToString)
        for name, (request, response) in pb.methods().items()}
    return grpc.method_handlers_generic_handler(pb.SERVICE, handlers)


def grpc_server(runtime: Runtime, host: str, port: int) -> grpc.aio.Server:
    """A ``grpc.aio`` server for ``runtime`` bound to ``host:port`` (``port`` 0 picks a free
    one), not yet started. Call inside the running loop.

    Raises:
        OSError: the address cannot be bound.
    """
    n_features = next(iter(runtime.models.values())).predictor.n_features
    max_rows = runtime.settings.batching.max_queue_size
    server = grpc.aio.server(options=server_options(n_features, max_rows),
                             maximum_concurrent_rpcs=max_concurrent_calls(max_rows))
    server.add_generic_rpc_handlers((service_handler(InferenceServicer(runtime)),))
    address = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    try:
        bound = server.add_insecure_port(address)
    except RuntimeError as exc:  # grpc says "Failed to bind to address ..."
        raise OSError(98, f"cannot listen on {address} for gRPC: {exc}") from None
    if bound == 0:
        raise OSError(98, f"cannot listen on {address} for gRPC")
    return server
