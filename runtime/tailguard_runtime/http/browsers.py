"""Browsers on the data plane: every route refuses them, unless their origin is allowed.

A web page can send requests to any address its visitor's browser reaches, without the
visitor knowing: CORS only stops the page from reading the answers, not the requests from
running. A "simple" request (``Content-Type: text/plain``, no custom header) needs no preflight,
so a page could send inference requests with tiny deadlines or rows the model rejects, to steer
the SLO guard, or read nothing and still cost the model. Browsers mark their requests: every
cross-origin request carries ``Origin`` (and so does every POST), and every modern browser sends
``Sec-Fetch-Site``. Programs (clients, Prometheus, the kubelet's probes, the operator) send
neither. So a request with an ``Origin`` that is not allowed, or one marked
``Sec-Fetch-Site: cross-site`` without an allowed ``Origin``, gets 403 on every route. A person
who types a URL (``Sec-Fetch-Site: none``) is served. Allowed origins
(:attr:`~tailguard_runtime.settings.RuntimeSettings.allowed_origins`, empty by default) are
served; tailguard adds no CORS headers to their answers.

Pure: the check reads the raw header pairs and returns an error or ``None``.
"""

from __future__ import annotations

from typing import Collection, Iterable

from tailguard_runtime.errors import Forbidden


def browser_refusal(headers: Iterable[tuple[bytes, bytes]],
                    allowed_origins: Collection[bytes] = ()) -> Forbidden | None:
    """Why a request is refused as a browser's, or ``None`` to serve it.

    ``headers``: the raw ASGI header pairs (lowercase names); ``allowed_origins``: exact
    ``Origin`` values (``https://app.example.com``) to serve.
    """
    origin: bytes | None = None
    cross_site = False
    for name, value in headers:
        if name == b"origin":
            origin = value
        elif name == b"sec-fetch-site":
            cross_site = value.strip().lower() == b"cross-site"
    if origin is not None and origin not in allowed_origins:
        return Forbidden("this server does not answer browsers: a web page's request (an "
                         "Origin header) is refused unless its origin is in allowedOrigins")
    if cross_site and origin is None:
        return Forbidden("this server does not answer browsers: a cross-site request "
                         "(Sec-Fetch-Site: cross-site) is refused")
    return None
