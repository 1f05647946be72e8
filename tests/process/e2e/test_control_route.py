"""The traffic switch of `tailguard up` answers `tailguard rollback NAME`, and nothing a web page
or another host can send.

Found by trying: a ``no-cors`` POST with ``Host: evil.example``, an ``Origin`` and
``Content-Type: text/plain`` rolled a service back (200 ``changed: true``); ``X-Forwarded-For``
from a local process was trusted; with ``--host ::`` the CLI's own requests (``::ffff:127.0.0.1``)
were refused and the banner read ``http://:::PORT``; ``{"activeModel": []}`` got a plain-text 500.
Every case runs against a real `tailguard up` process over HTTP.
"""

from __future__ import annotations

import os
import socket
import stat
from pathlib import Path

import httpx
import pytest

from harness.up import IRIS, Up, run_cli, start_up
from tailguard.up.control import find_control_file, state_dir


def _secret(up: Up, name: str = "iris") -> str:
    control = find_control_file(name, up.port)
    assert control is not None, f"no control file for {name} on {up.port} in {state_dir()}"
    return control.secret


def _active(up: Up) -> str:
    reply = httpx.get(f"{up.base}/tailguard/traffic", timeout=30)
    assert reply.status_code == 200, reply.text
    return str(reply.json()["activeModel"])


def _error(reply: httpx.Response) -> str:
    assert reply.headers["content-type"] == "application/json", reply.text
    doc = reply.json()
    assert set(doc) == {"error"} and isinstance(doc["error"], str), doc
    return str(doc["error"])


def test_a_web_page_cannot_switch_traffic(iris: Up) -> None:
    """What a page's ``fetch(url, {method: "POST", mode: "no-cors", body})`` sends, directly
    and after DNS rebinding (the page's own host name in ``Host``)."""
    for host in ("evil.example", f"127.0.0.1:{iris.port}"):
        reply = httpx.post(f"{iris.base}/tailguard/traffic", timeout=30,
                           content=b'{"name": "iris", "activeModel": "fallback"}',
                           headers={"Host": host, "Origin": "http://evil.example",
                                    "Content-Type": "text/plain;charset=UTF-8",
                                    "Sec-Fetch-Mode": "no-cors", "Sec-Fetch-Site": "cross-site"})
        assert reply.status_code == 403, reply.text
        _error(reply)
    assert _active(iris) == "primary"


SWITCH = b'{"name": "iris", "activeModel": "fallback", "by": "test"}'
BROKEN = {  # one guard broken at a time: (header changes, expected status, words in the error)
    "another-host": ({"Host": "evil.example"}, 403, "Host"),
    "loopback-name-another-port": ({"Host": "localhost:1"}, 403, "Host"),
    "origin": ({"Origin": "http://127.0.0.1"}, 403, "browsers"),
    "sec-fetch": ({"Sec-Fetch-Site": "same-origin"}, 403, "browsers"),
    "no-secret": ({"Authorization": None}, 403, "secret"),
    "wrong-secret": ({"Authorization": "Bearer guessed"}, 403, "secret"),
    "text-plain": ({"Content-Type": "text/plain"}, 415, "application/json"),
    "form": ({"Content-Type": "application/x-www-form-urlencoded"}, 415, "application/json"),
}


@pytest.mark.parametrize("case", list(BROKEN))
def test_a_switch_needs_every_guard(iris: Up, case: str) -> None:
    changes, status, needle = BROKEN[case]
    headers = {"Host": f"127.0.0.1:{iris.port}", "Content-Type": "application/json",
               "Authorization": f"Bearer {_secret(iris)}"}
    for key, value in changes.items():
        headers.pop(key, None)
        if value is not None:
            headers[key] = value
    with httpx.Client(timeout=30) as client:
        request = client.build_request("POST", f"{iris.base}/tailguard/traffic", content=SWITCH)
        for key in ("Host", "Content-Type", "Authorization"):
            request.headers.pop(key, None)
        request.headers.update(headers)
        reply = client.send(request)
    assert reply.status_code == status, reply.text
    assert needle in _error(reply)
    assert _active(iris) == "primary"


def test_with_every_guard_the_switch_works_on_each_loopback_name(iris: Up) -> None:
    secret = _secret(iris)
    for host, role in (("127.0.0.1", "fallback"), ("localhost", "primary")):
        reply = httpx.post(f"{iris.base}/tailguard/traffic", timeout=30,
                           json={"activeModel": role, "by": "test"},
                           headers={"Host": f"{host}:{iris.port}",
                                    "Authorization": f"Bearer {secret}"})
        assert reply.status_code == 200, reply.text
        assert reply.json() == {"name": "iris", "activeModel": role, "changed": True}


def test_the_read_routes_answer_only_locally_and_ignore_forwarded_for(iris: Up) -> None:
    for path in ("/tailguard/traffic", "/tailguard/status"):
        for headers in ({"Host": "evil.example"}, {"Origin": "http://evil.example"}):
            reply = httpx.get(f"{iris.base}{path}", headers=headers, timeout=30)
            assert reply.status_code == 403, (path, headers, reply.text)
            _error(reply)
        # with uvicorn's proxy headers on, this peer would be 203.0.113.9 and get 403
        reply = httpx.get(f"{iris.base}{path}", timeout=30,
                          headers={"X-Forwarded-For": "203.0.113.9", "X-Forwarded-Proto": "https"})
        assert reply.status_code == 200, reply.text


@pytest.mark.parametrize("body, status, needle", [
    (b'{"activeModel": []}', 422, "activeModel must be a string"),
    (b"{}", 422, "activeModel is missing"),
    (b"[]", 422, '"activeModel": "primary" | "fallback"'),
    (b'"fallback"', 422, '"activeModel": "primary" | "fallback"'),
    (b"{not json", 400, "malformed JSON"),
    (b'{"activeModel": "fallback", "force": true}', 422, "unknown field(s) ['force']"),
    (b'{"activeModel": "canary"}', 422, "no 'canary' model"),
    (b'{"activeModel": "fallback", "by": 7}', 422, "by must be a string"),
    (b'{"name": "digits", "activeModel": "fallback"}', 404, "no InferenceService 'digits'"),
])
def test_a_body_the_switch_does_not_understand_is_a_4xx(iris: Up, body: bytes, status: int,
                                                        needle: str) -> None:
    reply = httpx.post(f"{iris.base}/tailguard/traffic", content=body, timeout=30,
                       headers={"Content-Type": "application/json",
                                "Authorization": f"Bearer {_secret(iris)}"})
    assert reply.status_code == status, reply.text
    assert needle in _error(reply)
    assert _active(iris) == "primary"


def test_a_switch_cut_short_changes_nothing(iris: Up) -> None:
    body = b'{"name": "iris", "activeModel": "fallback", "by": "test"}'
    head = (f"POST /tailguard/traffic HTTP/1.1\r\nHost: 127.0.0.1:{iris.port}\r\n"
            f"Authorization: Bearer {_secret(iris)}\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body) + 20}\r\n\r\n").encode()
    with socket.create_connection(("127.0.0.1", iris.port), timeout=30) as sock:
        sock.sendall(head + body)
        sock.shutdown(socket.SHUT_WR)
        assert sock.recv(65536) == b""  # closed without an answer: nobody is left to read it
    assert _active(iris) == "primary"
    assert "Traceback" not in iris.text()


def test_on_a_dual_stack_listener_the_cli_finds_the_service_by_name(tmp_path: Path) -> None:
    """``--host ::``: the banner shows ``http://[::]:PORT``, IPv4 loopback clients arrive as
    ``::ffff:127.0.0.1`` and are local, and `tailguard rollback NAME` needs no ``--port``: it
    finds the run's control file (0600, in a 0700 folder) by name; the file goes when the run
    ends."""
    spec = tmp_path / "iris6.yaml"
    spec.write_text(IRIS.read_text().replace("name: iris", "name: iris6"))
    up = start_up(spec, host="::")
    try:
        up.wait_for(r"^Ctrl-C drains and stops\.")
        assert f"serving InferenceService iris6 on http://[::]:{up.port} " in up.text()
        control = find_control_file("iris6", None)
        assert control is not None and control.port == up.port and control.pid == up.proc.pid
        assert stat.S_IMODE(os.stat(control.path).st_mode) == 0o600
        assert stat.S_IMODE(os.stat(control.path.parent).st_mode) == 0o700
        done = run_cli("rollback", "iris6")
        assert done.returncode == 0 and "iris6: traffic now goes to fallback" in done.stdout, (
            done.stdout, done.stderr)
        shown = run_cli("status", "iris6")
        assert shown.returncode == 0 and shown.stdout.startswith("iris6: traffic -> fallback"), (
            shown.stdout, shown.stderr)
    finally:
        assert up.stop() == 0
    assert not control.path.exists()
    gone = run_cli("rollback", "iris6", "--port", str(up.port))
    assert gone.returncode == 1 and "no local tailguard up answers" in gone.stderr, gone.stderr
