"""The control routes of ``tailguard up``: who may reach them, and what a traffic switch says.

``GET /tailguard/traffic``, ``GET /tailguard/status`` and ``POST /tailguard/traffic`` answer only
a local program, never a web page nor another host:

* the peer address is loopback (``127.0.0.0/8``, ``::1``, or ``::ffff:127.x.y.z`` on a dual-stack
  ``::`` listener); uvicorn's proxy headers are off, so ``X-Forwarded-For`` cannot fake it;
* ``Host`` names a loopback address and this server's own port (a DNS-rebinding page sends its
  own host name);
* no ``Origin`` and no ``Sec-Fetch-*`` header (only browsers send them);
* a switch also carries the per-run secret as ``Authorization: Bearer <secret>`` (``tailguard up``
  writes it to a 0600 file that ``tailguard rollback NAME`` reads; a page cannot read it, and a
  cross-origin page cannot set ``Authorization`` without a preflight this server never answers)
  and ``Content-Type: application/json`` (a ``no-cors`` form or ``text/plain`` POST cannot).

The checks and the body parser are pure; :func:`add_control_routes` is the thin FastAPI shell.
"""

from __future__ import annotations

import hmac
import ipaddress
from dataclasses import dataclass
from typing import Any, Iterable

import orjson
from fastapi import FastAPI, Request
from starlette.requests import ClientDisconnect

from tailguard_runtime.errors import (
    Forbidden,
    IncompleteBody,
    InvalidInput,
    ModelNotFound,
    TailguardError,
)
from tailguard_runtime.service import Runtime
from tailguard_runtime.wire import preview

LOOPBACK_HOSTS = ("127.0.0.1", "localhost", "[::1]")
"""Host names a local client may put in ``Host`` (with the server's port)."""
SWITCH_SHAPE = ('body must be {"name"?: ..., "activeModel": "primary" | "fallback", '
                '"by"?: "cli" | "guard" | ...}')
SWITCH_KEYS = frozenset(("name", "activeModel", "by"))


def is_loopback(host: str) -> bool:
    """Whether a peer address is loopback; an IPv4-mapped IPv6 address (``::ffff:127.0.0.1``,
    how a ``::`` listener sees an IPv4 client) counts as its IPv4 address. Names and garbage
    are not loopback."""
    try:
        address = ipaddress.ip_address(host.split("%", 1)[0])
    except ValueError:
        return False
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        address = address.ipv4_mapped
    return address.is_loopback


def refusal(client: str | None, port: int | None, headers: Iterable[tuple[bytes, bytes]],
            secret: str | None = None) -> TailguardError | None:
    """Why a control request must be refused, or ``None`` to serve it.

    ``client``: the peer address; ``port``: the port this server listens on; ``headers``: the
    raw ASGI header pairs (lowercase names); ``secret``: required as ``Authorization: Bearer``
    when given (the switch), not checked when ``None`` (the read-only routes).

    Returns :class:`~tailguard_runtime.errors.Forbidden` (403) for a peer or ``Host`` that is
    not loopback, a browser's request, or a missing or wrong secret; ``InvalidInput`` (415) for
    a switch whose ``Content-Type`` is not ``application/json``.
    """
    if client is None or not is_loopback(client):
        return Forbidden("the control routes answer only on loopback")
    hosts = [value for name, value in headers if name == b"host"]
    allowed = {f"{h}:{port}".encode() for h in LOOPBACK_HOSTS}
    if port == 80:
        allowed.update(h.encode() for h in LOOPBACK_HOSTS)
    if len(hosts) != 1 or hosts[0].lower() not in allowed:
        return Forbidden(f"the control routes answer only to Host 127.0.0.1:{port}, "
                         f"localhost:{port} or [::1]:{port}")
    names = {name for name, _ in headers}
    if b"origin" in names or any(name.startswith(b"sec-fetch-") for name in names):
        return Forbidden("the control routes do not answer browsers")  # not even allowed ones
    if secret is None:
        return None
    given = [value for name, value in headers if name == b"authorization"]
    expected = b"Bearer " + secret.encode()
    if len(given) != 1 or not hmac.compare_digest(given[0], expected):
        return Forbidden("missing or wrong control secret: use `tailguard rollback NAME` (it "
                         "reads the secret tailguard up wrote for this run)")
    types = [value for name, value in headers if name == b"content-type"]
    if len(types) != 1 or types[0].split(b";", 1)[0].strip().lower() != b"application/json":
        return InvalidInput("a traffic switch must be sent as Content-Type: application/json", 415)
    return None


@dataclass(frozen=True)
class SwitchRequest:
    """A parsed ``POST /tailguard/traffic`` body."""

    name: str | None
    active_model: str
    by: str


def parse_switch(body: bytes) -> SwitchRequest:
    """Parse ``{"name"?: str, "activeModel": str, "by"?: str}`` (``by`` defaults to ``api``).

    Raises:
        InvalidInput: not JSON (400), not an object, an unknown key, or a field that is missing
            or not a string (422); the message shows the expected body.
    """
    try:
        doc: Any = orjson.loads(body)
    except orjson.JSONDecodeError:
        raise InvalidInput(f"malformed JSON; {SWITCH_SHAPE}", 400) from None
    if not isinstance(doc, dict):
        raise InvalidInput(SWITCH_SHAPE)
    unknown = sorted(set(doc) - SWITCH_KEYS)
    if unknown:
        raise InvalidInput(f"unknown field(s) {unknown}; {SWITCH_SHAPE}")
    if "activeModel" not in doc:
        raise InvalidInput(f"activeModel is missing; {SWITCH_SHAPE}")
    for key in SWITCH_KEYS & set(doc):
        if not isinstance(doc[key], str):
            raise InvalidInput(f"{key} must be a string, got {preview(doc[key])}; "
                               f"{SWITCH_SHAPE}")
    return SwitchRequest(doc.get("name"), doc["activeModel"], doc.get("by", "api"))


def add_control_routes(api: FastAPI, runtime: Runtime, secret: str) -> None:
    """Serve the control routes of ``runtime`` on ``api``; switches need ``secret``."""

    def check(request: Request, needs_secret: bool) -> None:
        client = request.client.host if request.client else None
        server = request.scope.get("server")
        problem = refusal(client, server[1] if server else None, request.scope["headers"],
                          secret if needs_secret else None)
        if problem is not None:
            raise problem

    @api.get("/tailguard/traffic")
    async def get_traffic(request: Request) -> dict[str, Any]:
        check(request, False)
        return {"name": runtime.name, "activeModel": runtime.active_role,
                "roles": list(runtime.models)}

    @api.get("/tailguard/status")
    async def get_status(request: Request) -> dict[str, Any]:
        check(request, False)
        doc: dict[str, Any] = {"activeModel": runtime.active_role}
        if runtime.status_source is not None:
            doc.update(runtime.status_source())
        return {"name": runtime.name, "status": doc}

    @api.post("/tailguard/traffic")
    async def set_traffic(request: Request) -> dict[str, Any]:
        check(request, True)
        try:
            body = await request.body()
        except ClientDisconnect:
            raise IncompleteBody("the connection closed before the whole switch arrived") from None
        switch = parse_switch(body)
        if switch.name is not None and switch.name != runtime.name:
            raise ModelNotFound(f"no InferenceService {switch.name!r} here; this "
                                f"tailguard up serves {runtime.name!r}")
        try:
            changed = runtime.switch(switch.active_model, by=switch.by)
        except KeyError as exc:
            raise InvalidInput(str(exc.args[0])) from None
        except ValueError as exc:
            raise InvalidInput(str(exc), 400) from None
        return {"name": runtime.name, "activeModel": runtime.active_role, "changed": changed}
