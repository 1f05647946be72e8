"""``http.errors``: one error, one answer, in each of the three forms the layers write (raw
HTTP/1.1 bytes below the app, ASGI messages for the inference routes, a Starlette response for
FastAPI's routes); and the error classes that are counted, against the counter's reasons."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest
from fastapi.exceptions import RequestValidationError
from starlette.exceptions import HTTPException

from tailguard_runtime import errors
from tailguard_runtime.http.errors import (
    as_tailguard_error,
    asgi_error,
    error_response,
    raw_error,
    status_line,
)
from tailguard_runtime.metrics import REJECTION_REASONS

CASES = [
    pytest.param(errors.MalformedHttp("malformed HTTP request: bad"), 400, True, {}, id="400"),
    pytest.param(errors.MalformedHttp("target too long", 414), 414, True, {}, id="414"),
    pytest.param(errors.HeadTimeout("request head not complete within 2 s"), 408, True, {},
                 id="head-408"),
    pytest.param(errors.TooManyConnections("too many open connections (4), all of them busy"),
                 503, True, {"retry-after": "1"}, id="cap-503"),
    pytest.param(errors.Overloaded("queue full", 3, "queue_full"), 429, False,
                 {"retry-after": "3"}, id="429"),
    pytest.param(errors.PayloadTooLarge("body of 9 bytes exceeds \u00e9"), 413, False, {},
                 id="413-non-ascii"),
]


def parse(raw: bytes) -> tuple[str, list[tuple[str, str]], bytes]:
    head, _, body = raw.partition(b"\r\n\r\n")
    first, *lines = head.decode("latin-1").split("\r\n")
    return first, [(k.lower(), v.strip()) for k, v in (ln.split(":", 1) for ln in lines)], body


@pytest.mark.parametrize("exc,status,closes,extra", CASES)
def test_the_raw_answer_is_complete_json_and_says_what_the_error_needs(
        exc: errors.TailguardError, status: int, closes: bool, extra: dict[str, str]) -> None:
    first, headers, body = parse(raw_error(exc, [(b"date", b"Thu, 03 Dec 2026 10:00:00 GMT")]))
    assert first.startswith(f"HTTP/1.1 {status} ") and len(first) > len(f"HTTP/1.1 {status} ")
    found = dict(headers)
    assert len(found) == len(headers), headers  # no header twice
    assert found["content-type"] == "application/json"
    assert found["date"] == "Thu, 03 Dec 2026 10:00:00 GMT"
    assert int(found["content-length"]) == len(body)
    assert ("connection" in found) == closes and found.get("connection", "close") == "close"
    assert {k: found[k] for k in extra} == extra
    assert json.loads(body) == {"error": exc.message}


def test_a_caller_may_close_on_an_error_that_does_not_close_by_itself() -> None:
    exc = errors.BodyTimeout("request body not complete within 2 s")
    assert "connection" not in dict(parse(raw_error(exc))[1])
    assert dict(parse(raw_error(exc, close=True))[1])["connection"] == "close"


def asgi_answer(messages: tuple[dict[str, Any], dict[str, Any]]
                ) -> tuple[int, list[tuple[bytes, bytes]], bytes]:
    start, body = messages
    assert start["type"] == "http.response.start" and body["type"] == "http.response.body"
    return start["status"], start["headers"], body["body"]


def starlette_answer(exc: errors.TailguardError) -> tuple[int, list[tuple[bytes, bytes]], bytes]:
    sent: list[dict[str, Any]] = []

    async def send(message: Any) -> None:
        sent.append(message)

    async def receive() -> Any:
        return {"type": "http.request", "body": b""}

    scope = {"type": "http", "method": "GET", "path": "/", "headers": []}
    asyncio.run(error_response(exc)(scope, receive, send))
    return sent[0]["status"], sent[0]["headers"], sent[1]["body"]


@pytest.mark.parametrize("exc,status,closes,extra", CASES)
def test_the_three_forms_are_the_same_answer(exc: errors.TailguardError, status: int,
                                             closes: bool, extra: dict[str, str]) -> None:
    first, raw_headers, raw_body = parse(raw_error(exc))
    asgi = asgi_answer(asgi_error(exc))
    routed = starlette_answer(exc)
    for got_status, headers, body in (asgi, routed):
        assert got_status == status and body == raw_body
        assert sorted((k.decode(), v.decode()) for k, v in headers) == sorted(raw_headers)


def test_the_inference_routes_add_who_answered_and_may_close() -> None:
    who = [(b"x-tailguard-role", b"primary")]
    _, headers, _ = asgi_answer(asgi_error(errors.NotReady("not yet"), who, close=True))
    assert (b"x-tailguard-role", b"primary") in headers and (b"connection", b"close") in headers


def test_routing_errors_keep_their_status_and_headers() -> None:
    exc = as_tailguard_error(HTTPException(405, headers={"Allow": "GET"}))
    status, headers, body = starlette_answer(exc)
    assert status == 405 and (b"allow", b"GET") in headers
    assert json.loads(body) == {"error": "Method Not Allowed"}
    assert as_tailguard_error(HTTPException(404)).status_code == 404


def test_validation_errors_are_422_and_bugs_500_naming_only_the_type() -> None:
    invalid = as_tailguard_error(RequestValidationError([{"loc": ("query", "x")}]))
    assert isinstance(invalid, errors.InvalidInput) and invalid.status_code == 422
    assert "query" in invalid.message
    bug = as_tailguard_error(KeyError("secret detail"))
    assert (bug.status_code, bug.message) == (500, "internal error: KeyError")
    own = errors.ModelNotFound("no such model")
    assert as_tailguard_error(own) is own


def test_an_unknown_status_still_has_a_status_line() -> None:
    assert status_line(599) == b"HTTP/1.1 599 \r\n"
    assert status_line(408) == b"HTTP/1.1 408 Request Timeout\r\n"


@pytest.mark.parametrize("kind", [errors.MalformedHttp, errors.HeadTimeout,
                                  errors.TooManyConnections, errors.BodyTimeout,
                                  errors.IncompleteBody, errors.PayloadTooLarge,
                                  errors.InvalidInput, errors.DeadlineExceeded, errors.NotReady,
                                  errors.Draining, errors.ModelFailed])
def test_every_counted_refusal_has_a_reason_the_counter_exports(
        kind: type[errors.TailguardError]) -> None:
    assert kind("x").reason in REJECTION_REASONS
