"""Errors that carry their own outcome.

Every error the runtime raises on purpose is a :class:`TailguardError`: it knows its HTTP
status code and a short ``reason`` slug (used as the ``reason`` label of the rejection counter).
One writer renders all of them, as the Open Inference Protocol's ``{"error": "..."}`` body
(:mod:`tailguard_runtime.http.errors`), whether an ASGI route raised them or the HTTP and
connection layers below the app refused a request. Nothing here does I/O.
"""

from __future__ import annotations


class TailguardError(Exception):
    """Base error: ``status_code`` is the HTTP status, ``reason`` a short slug for metrics."""

    status_code: int = 500
    reason: str = "internal"
    closes_connection: bool = False
    """Whether the answer ends the connection (``Connection: close``): true for refusals below
    the app, where the rest of what the client sent cannot be trusted or is not wanted."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message

    @property
    def headers(self) -> list[tuple[bytes, bytes]]:
        """Extra response headers (raw ASGI pairs); none by default."""
        return []


class InvalidInput(TailguardError):
    """The request body is not what the protocol and the model expect (400 or 422).

    400 is for bodies that cannot be parsed (malformed JSON); 422 for well-formed bodies whose
    content is wrong (shape, feature count, datatype, NaN). The message names the field.
    """

    reason = "invalid_input"

    def __init__(self, message: str, status_code: int = 422) -> None:
        super().__init__(message)
        self.status_code = status_code


class PayloadTooLarge(TailguardError):
    """A body or a row count that can never fit (413)."""

    status_code = 413
    reason = "too_large"


class Forbidden(TailguardError):
    """A request from a web page the runtime does not serve (:mod:`tailguard_runtime.http.browsers`),
    or a control request from somewhere the control routes never answer, or without the per-run
    secret (403)."""

    status_code = 403
    reason = "forbidden"


class ModelNotFound(TailguardError):
    """The name in the path is not the InferenceService this runtime serves (404)."""

    status_code = 404
    reason = "not_found"


class Overloaded(TailguardError):
    """Admission refused: the queue is full or the deadline cannot be met (429).

    ``retry_after_s`` is a whole number of seconds (at least 1) sent as ``Retry-After``.
    """

    status_code = 429

    def __init__(self, message: str, retry_after_s: int, reason: str) -> None:
        super().__init__(message)
        self.retry_after_s = max(1, int(retry_after_s))
        self.reason = reason

    @property
    def headers(self) -> list[tuple[bytes, bytes]]:
        return [(b"retry-after", str(self.retry_after_s).encode())]


class DeadlineExceeded(TailguardError):
    """The request's own deadline passed before its answer was ready (504)."""

    status_code = 504
    reason = "deadline_exceeded"


class DecodeLate(DeadlineExceeded):
    """The request's deadline passed while its body waited for the decode thread (504). Not
    the model's time: the SLO guard does not judge it (a refusal, not a deadline miss)."""

    reason = "decode_deadline"


class BodyTimeout(TailguardError):
    """The client did not finish sending its body within the request's deadline (408)."""

    status_code = 408
    reason = "slow_body"


class IncompleteBody(TailguardError):
    """The client closed or half-closed its connection before the whole body arrived (400,
    counted, though nobody reads the answer): the request is never run."""

    status_code = 400
    reason = "incomplete_body"


class NotReady(TailguardError):
    """The model is not loaded yet (503)."""

    status_code = 503
    reason = "not_ready"


class Draining(TailguardError):
    """The runtime is shutting down: no new admissions, or the grace period ended (503)."""

    status_code = 503
    reason = "draining"


class GraceEnded(Draining):
    """The drain's grace period ended before the model answered this admitted request (503)."""


class MalformedHttp(TailguardError):
    """The HTTP parser refused the request, before any route ran: malformed (400), a request
    target too long (414), or a method never served (``CONNECT``, 405). The parser cannot find
    the next request in a stream it refused, so the connection closes."""

    reason = "malformed_http"
    closes_connection = True

    def __init__(self, message: str, status_code: int = 400) -> None:
        super().__init__(message)
        self.status_code = status_code


class HeadTimeout(TailguardError):
    """A request's head was not complete within its deadline (408, and the connection
    closes)."""

    status_code = 408
    reason = "slow_head"
    closes_connection = True


class TooManyConnections(TailguardError):
    """A new connection at the connection cap while every open one has a request in progress
    (503, ``Retry-After: 1``, and the connection closes)."""

    status_code = 503
    reason = "connection_limit"
    closes_connection = True

    @property
    def headers(self) -> list[tuple[bytes, bytes]]:
        return [(b"retry-after", b"1")]


class RouteError(TailguardError):
    """An answer of the routing layer (Starlette's ``HTTPException``: 404 for an unknown path,
    405 with ``Allow`` for a method a route does not serve), rendered as every other error.
    Never counted: no model was reached."""

    reason = "route"

    def __init__(self, message: str, status_code: int,
                 headers: list[tuple[bytes, bytes]] | None = None) -> None:
        super().__init__(message)
        self.status_code = status_code
        self._headers = headers or []

    @property
    def headers(self) -> list[tuple[bytes, bytes]]:
        return self._headers


class ModelFailed(TailguardError):
    """The model raised on this request's own rows (422 for a ValueError, else 500)."""

    reason = "model_error"

    def __init__(self, message: str, status_code: int = 500) -> None:
        super().__init__(message)
        self.status_code = status_code


class ModelLoadError(TailguardError):
    """A model URI could not be turned into a usable estimator (raised at startup only)."""

    reason = "model_load"


class ModelFetchError(ModelLoadError):
    """A URL model could not be fetched. ``cause`` is one of :data:`MODEL_CAUSES`; ``transient``
    says whether trying again may help."""

    def __init__(self, message: str, cause: str, *, transient: bool = False) -> None:
        super().__init__(message)
        self.cause = cause
        self.transient = transient


MODEL_CAUSES = {
    "ModelURLRefused": "http:// to a host that is neither loopback nor *.svc, a port that is "
                       "not a number, a redirect to http://, or too many redirects",
    "ModelHostNotFound": "the host name does not resolve",
    "ModelUnreachable": "no connection (refused, reset, or no route)",
    "ModelTLSError": "the server's certificate is not trusted, or a handshake or stream was "
                     "cut short (tried again)",
    "ModelNotFound": "404 or 410",
    "ModelHTTPError": "any other answer than 2xx with a body",
    "ModelFetchStalled": "no byte for FetchSettings.stall_timeout_s, or the whole download "
                         "past FetchSettings.deadline_s",
    "ModelTooLarge": "more bytes than model.maxBytes (announced or counted)",
    "ModelChecksumMismatch": "the bytes' SHA-256 is not model.sha256",
    "ModelLoadFailed": "any other reason a model did not load: a missing file, a file that is "
                       "not a fitted estimator, a fallback that is not a drop-in",
}
"""Why a model did not load, by the word that names it: each :attr:`ModelFetchError.cause`,
and ``ModelLoadFailed`` for any other :class:`ModelLoadError` (:func:`model_cause`). A runtime
pod's termination message starts with it; docs/runtime.md has the same table."""


def model_cause(error: ModelLoadError) -> str:
    """The :data:`MODEL_CAUSES` word for ``error``."""
    return error.cause if isinstance(error, ModelFetchError) else "ModelLoadFailed"
