"""Who may reach the control routes, and what a switch body may say (pure functions)."""

from __future__ import annotations

import pytest

from tailguard_runtime.errors import InvalidInput
from tailguard_runtime.http.control import is_loopback, parse_switch, refusal

PORT = 8080
GOOD = [(b"host", b"127.0.0.1:8080"), (b"content-type", b"application/json; charset=utf-8"),
        (b"authorization", b"Bearer s3cret")]


@pytest.mark.parametrize("host, local", [
    ("127.0.0.1", True), ("127.8.9.10", True), ("::1", True), ("::ffff:127.0.0.1", True),
    ("10.0.0.1", False), ("::ffff:10.0.0.1", False), ("2001:db8::1", False),
    ("localhost", False), ("", False), ("fe80::1%eth0", False),
])
def test_loopback_includes_ipv4_mapped_addresses(host: str, local: bool) -> None:
    assert is_loopback(host) is local


def test_a_local_switch_with_every_guard_passes() -> None:
    assert refusal("127.0.0.1", PORT, GOOD, "s3cret") is None
    assert refusal("::ffff:127.0.0.1", PORT, [(b"host", b"[::1]:8080")]) is None


@pytest.mark.parametrize("client, headers, status, needle", [
    ("10.1.2.3", GOOD, 403, "loopback"),
    (None, GOOD, 403, "loopback"),
    ("127.0.0.1", [(b"host", b"evil.example"), *GOOD[1:]], 403, "Host"),
    ("127.0.0.1", [(b"host", b"127.0.0.1:9999"), *GOOD[1:]], 403, "Host"),
    ("127.0.0.1", [(b"host", b"127.0.0.1"), *GOOD[1:]], 403, "Host"),
    ("127.0.0.1", [*GOOD, (b"host", b"127.0.0.1:8080")], 403, "Host"),  # two Host headers
    ("127.0.0.1", [*GOOD, (b"origin", b"null")], 403, "browsers"),
    ("127.0.0.1", [*GOOD, (b"sec-fetch-mode", b"no-cors")], 403, "browsers"),
    ("127.0.0.1", GOOD[:2], 403, "secret"),
    ("127.0.0.1", [*GOOD[:2], (b"authorization", b"Bearer s3cre")], 403, "secret"),
    ("127.0.0.1", [*GOOD[:2], (b"authorization", b"s3cret")], 403, "secret"),
    ("127.0.0.1", [GOOD[0], (b"content-type", b"text/plain"), GOOD[2]], 415, "application/json"),
    ("127.0.0.1", [GOOD[0], GOOD[2]], 415, "application/json"),
])
def test_each_guard_refuses_alone(client: str | None, headers: list[tuple[bytes, bytes]],
                                  status: int, needle: str) -> None:
    problem = refusal(client, PORT, headers, "s3cret")
    assert problem is not None and problem.status_code == status and needle in problem.message


@pytest.mark.parametrize("body, status, needle", [
    (b'{"activeModel": []}', 422, "activeModel must be a string"),
    (b"{}", 422, "activeModel is missing"),
    (b"[]", 422, "activeModel"),
    (b"nope", 400, "malformed JSON"),
    (b'{"activeModel": "fallback", "x": 1}', 422, "unknown field(s) ['x']"),
    (b'{"activeModel": "fallback", "name": ' + b"[" * 300 + b"]" * 300 + b"}", 422,
     "nested too deep"),
])
def test_a_switch_body_is_exactly_its_shape(body: bytes, status: int, needle: str) -> None:
    with pytest.raises(InvalidInput) as info:
        parse_switch(body)
    assert info.value.status_code == status and needle in info.value.message


def test_a_switch_body_defaults_who_to_api() -> None:
    switch = parse_switch(b'{"activeModel": "fallback"}')
    assert (switch.name, switch.active_model, switch.by) == (None, "fallback", "api")
