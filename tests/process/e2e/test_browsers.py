"""A web page cannot reach the data plane of a real `tailguard up`: every route answers a
browser's request 403 without running it, unless its origin was allowed with --allow-origin.

Found by trying: a CORS "simple request" (``Content-Type: text/plain``, an ``Origin``, no
preflight) with a tiny deadline in its body was run by the inference route, and its 504 counted
against the model; ``/tailguard/stats`` handed the guard's status to any origin.
"""

from __future__ import annotations

import json
import re
import time
from typing import Iterator

import httpx
import pytest

from harness.up import IRIS, Up, run_cli
from tailguard.up.child import start_up

ALLOWED = "https://app.example.com"
ROW = [[5.1, 3.5, 1.4, 0.2]]
INFER = "/v2/models/iris/infer"


@pytest.fixture(scope="module")
def up() -> Iterator[Up]:
    server = start_up(IRIS, extra_args=("--allow-origin", ALLOWED))
    try:
        yield server
    finally:
        server.stop()


def _v2(timeout_us: int | None = None) -> str:
    doc: dict[str, object] = {"inputs": [{"name": "input-0", "shape": [1, 4],
                                          "datatype": "FP64", "data": ROW}]}
    if timeout_us is not None:
        doc["parameters"] = {"timeout": timeout_us}
    return json.dumps(doc)


def _forbidden(client: httpx.Client) -> float:
    text = client.get("/metrics").text
    found = re.search(r'tailguard_rejections_total\{[^}]*reason="forbidden"[^}]*\} ([0-9.e+]+)',
                      text)
    return float(found.group(1)) if found else 0.0


def test_a_web_pages_simple_request_is_refused_and_never_runs(up: Up) -> None:
    with httpx.Client(base_url=up.base, timeout=10) as client:
        admitted = client.get("/tailguard/stats").json()["totals"]["primary"]["admitted"]
        refused_before = _forbidden(client)
        for headers in ({"Origin": "https://evil.example", "Content-Type": "text/plain"},
                        {"Origin": "null", "Content-Type": "text/plain"},
                        {"Sec-Fetch-Site": "cross-site", "Content-Type": "text/plain"}):
            reply = client.post(INFER, content=_v2(timeout_us=1), headers=headers)
            assert reply.status_code == 403, (headers, reply.text)
            assert "browsers" in reply.json()["error"]
            assert reply.headers["connection"] == "close"
        stats = client.get("/tailguard/stats").json()
        assert stats["totals"]["primary"]["admitted"] == admitted  # none reached the model
        assert _forbidden(client) == refused_before + 3


@pytest.mark.parametrize("path", ["/metrics", "/tailguard/stats", "/v2/health/ready",
                                  "/v2/models/iris", "/v2"])
def test_every_route_refuses_a_browser(up: Up, path: str) -> None:
    with httpx.Client(base_url=up.base, timeout=10) as client:
        assert client.get(path).status_code == 200
        assert client.get(path, headers={"Origin": "https://evil.example"}).status_code == 403
        assert client.get(path, headers={"Sec-Fetch-Site": "cross-site"}).status_code == 403
        assert client.get(path, headers={"Sec-Fetch-Site": "none"}).status_code == 200


def test_an_allowed_origin_and_a_program_are_served(up: Up) -> None:
    with httpx.Client(base_url=up.base, timeout=10) as client:
        for headers in ({"Origin": ALLOWED, "Sec-Fetch-Site": "cross-site"}, {}):
            reply = client.post(INFER, content=_v2(),
                                headers={**headers, "Content-Type": "application/json"})
            assert reply.status_code == 200, reply.text
            assert reply.json()["outputs"][0]["data"]


def test_the_guards_status_is_only_on_the_loopback_status_route(up: Up) -> None:
    """``/tailguard/stats`` (what the operator reads over the pod network) carries the totals
    but not the guard's status; ``tailguard status`` still shows the guard, from the
    loopback-only route."""
    with httpx.Client(base_url=up.base, timeout=10) as client:
        stats = client.get("/tailguard/stats").json()
        assert "status" not in stats and "totals" in stats
        status = client.get("/tailguard/status").json()["status"]
        assert status["activeModel"] == "primary" and "guard" in status
        refused = client.get("/tailguard/status", headers={"Origin": ALLOWED})
        assert refused.status_code == 403  # an allowed origin never reaches the control routes
        deadline = time.monotonic() + 60  # the guard's first decision comes after one window
        while not client.get("/tailguard/status").json()["status"]["guard"].get("state"):
            assert time.monotonic() < deadline, "the guard never decided"
            time.sleep(0.2)
    shown = run_cli("status", "iris", "--port", str(up.port))
    assert shown.returncode == 0, shown.stderr
    assert "SLO guard:" in shown.stdout, shown.stdout
