"""The one error writer: a :class:`~tailguard_runtime.errors.TailguardError` into an answer.

Every error the runtime answers goes out in one shape, whoever answers it: the status the error
carries, the Open Inference Protocol's ``{"error": "..."}`` body, ``content-type:
application/json``, the error's own headers (``Retry-After`` for a 429 or a 503 at the
connection cap), and ``connection: close`` when the error ends the connection
(:attr:`~tailguard_runtime.errors.TailguardError.closes_connection`) or the caller asks. Three
places answer errors, through three forms of the same answer:

* the inference routes (:class:`~tailguard_runtime.http.app.InferenceApp`), as the two ASGI
  messages of :func:`asgi_error`;
* the FastAPI routes, as the Starlette response of :func:`error_response` (any exception is
  first turned into a ``TailguardError`` by :func:`as_tailguard_error`);
* the HTTP and connection layers below any app (:mod:`tailguard_runtime.http.protocol`,
  :mod:`tailguard_runtime.http.connections`), as the complete HTTP/1.1 bytes of
  :func:`raw_error`, written straight to the transport.

What to count, and when to pace a refusal, is left to the callers; nothing here does I/O.
"""

from __future__ import annotations

from http import HTTPStatus
from typing import Any, Iterable

from fastapi.exceptions import RequestValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.responses import Response

from tailguard_runtime.errors import InvalidInput, RouteError, TailguardError
from tailguard_runtime.wire import encode_error

Headers = list[tuple[bytes, bytes]]

JSON_TYPE = (b"content-type", b"application/json")
CLOSE = (b"connection", b"close")


def error_headers(exc: TailguardError, body: bytes, extra: Iterable[tuple[bytes, bytes]] = (),
                  *, close: bool = False) -> Headers:
    """The raw header pairs of the answer to ``exc`` whose body is ``body``: the JSON content
    type, ``connection: close`` when ``close`` or the error closes the connection, ``extra``
    (say, which model answered), the error's own headers, and the content length."""
    headers = [JSON_TYPE]
    if close or exc.closes_connection:
        headers.append(CLOSE)
    headers.extend(extra)
    headers.extend(exc.headers)
    headers.append((b"content-length", b"%d" % len(body)))
    return headers


def asgi_error(exc: TailguardError, extra: Iterable[tuple[bytes, bytes]] = (), *,
               close: bool = False) -> tuple[dict[str, Any], dict[str, Any]]:
    """The ASGI ``http.response.start`` and ``http.response.body`` messages answering ``exc``
    (headers as :func:`error_headers`)."""
    body = encode_error(exc.message)
    return ({"type": "http.response.start", "status": exc.status_code,
             "headers": error_headers(exc, body, extra, close=close)},
            {"type": "http.response.body", "body": body})


def error_response(exc: TailguardError) -> Response:
    """The Starlette response answering ``exc`` (for FastAPI's exception handlers)."""
    body = encode_error(exc.message)
    response = Response(body, exc.status_code)
    response.raw_headers = error_headers(exc, body)
    return response


def as_tailguard_error(exc: Exception) -> TailguardError:
    """``exc`` as the error to answer: itself when a ``TailguardError``; Starlette's
    ``HTTPException`` as a :class:`~tailguard_runtime.errors.RouteError` with its status and
    headers (405's ``Allow``); FastAPI's validation error as a 422 ``InvalidInput`` listing the
    errors; anything else as a 500 naming only the exception's type (a bug of ours)."""
    if isinstance(exc, TailguardError):
        return exc
    if isinstance(exc, StarletteHTTPException):
        headers = [(k.lower().encode("latin-1"), v.encode("latin-1"))
                   for k, v in (exc.headers or {}).items()]
        return RouteError(str(exc.detail), exc.status_code, headers)
    if isinstance(exc, RequestValidationError):
        return InvalidInput(str(exc.errors()), 422)
    return TailguardError(f"internal error: {type(exc).__name__}")


_STATUS_LINES: dict[int, bytes] = {}


def status_line(status: int) -> bytes:
    """``HTTP/1.1 <status> <reason phrase>\\r\\n`` (RFC 9110's phrases)."""
    line = _STATUS_LINES.get(status)
    if line is None:
        try:
            phrase = HTTPStatus(status).phrase
        except ValueError:
            phrase = ""
        line = _STATUS_LINES[status] = b"HTTP/1.1 %d %s\r\n" % (status, phrase.encode("ascii"))
    return line


def raw_error(exc: TailguardError, default_headers: Iterable[tuple[bytes, bytes]] = (), *,
              close: bool = False) -> bytes:
    """The complete HTTP/1.1 answer to ``exc`` as bytes, for a layer below the ASGI app to
    write to the transport: the status line, ``default_headers`` (uvicorn's ``date`` and
    ``server``, as every answer through the app has), then :func:`error_headers`."""
    body = encode_error(exc.message)
    lines = [status_line(exc.status_code)]
    lines.extend(b"%s: %s\r\n" % pair for pair in default_headers)
    lines.extend(b"%s: %s\r\n" % pair for pair in error_headers(exc, body, close=close))
    lines.append(b"\r\n")
    lines.append(body)
    return b"".join(lines)
