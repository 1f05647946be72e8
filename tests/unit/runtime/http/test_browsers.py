"""Which requests are a browser's, refused on every route unless their origin is allowed."""

from __future__ import annotations

import pytest

from tailguard_runtime.http.browsers import browser_refusal

HOST = [(b"host", b"10.0.0.7:8080"), (b"content-type", b"text/plain")]
ALLOWED = frozenset({b"https://app.example.com"})


@pytest.mark.parametrize("headers", [
    [],
    HOST,
    [*HOST, (b"sec-fetch-site", b"none")],  # a person typed the URL
    [*HOST, (b"sec-fetch-site", b"same-origin")],
    [*HOST, (b"origin", b"https://app.example.com")],
    [*HOST, (b"origin", b"https://app.example.com"), (b"sec-fetch-site", b"cross-site")],
], ids=["nothing", "a-program", "address-bar", "same-origin", "allowed", "allowed-cross-site"])
def test_programs_people_and_allowed_origins_are_served(headers: list[tuple[bytes, bytes]]
                                                         ) -> None:
    assert browser_refusal(headers, ALLOWED) is None


@pytest.mark.parametrize("headers", [
    [*HOST, (b"origin", b"https://evil.example")],
    [*HOST, (b"origin", b"null")],  # a sandboxed frame or a file:// page
    [*HOST, (b"origin", b"https://app.example.com.evil.example")],
    [*HOST, (b"sec-fetch-site", b"cross-site")],
    [*HOST, (b"sec-fetch-site", b"Cross-Site ")],
], ids=["foreign", "null", "suffix", "cross-site", "cross-site-spelled"])
def test_every_other_browser_request_is_403(headers: list[tuple[bytes, bytes]]) -> None:
    refused = browser_refusal(headers, ALLOWED)
    assert refused is not None and refused.status_code == 403
    assert refused.reason == "forbidden" and "browsers" in refused.message


def test_no_origin_is_allowed_by_default() -> None:
    assert browser_refusal([(b"origin", b"https://app.example.com")]) is not None
