"""Which URLs a model may come from, how they are shown, and the fetch settings' environment."""

from __future__ import annotations

from pathlib import Path

import pytest

from tailguard_runtime.errors import ModelFetchError, ModelLoadError
from tailguard_runtime.sources import FetchSettings, check_url, http_allowed
from tailguard_runtime.uris import shown


@pytest.mark.parametrize("host", ["localhost", "127.0.0.1", "127.8.9.1", "::1",
                                  "models.ml.svc", "models.ml.svc.cluster.local", "LOCALHOST."])
def test_plain_http_is_allowed_to_loopback_and_cluster_services(host: str) -> None:
    assert http_allowed(host)


@pytest.mark.parametrize("host", ["example.com", "10.0.0.1", "svc", "models.svc",
                                  "svc.example.com", "models..svc", "192.168.1.1",
                                  "models.ml.svc.evil.example", "models.ml.svc.cluster.local.io",
                                  "a.models.ml.svc"])
def test_plain_http_is_refused_anywhere_else(host: str) -> None:
    assert not http_allowed(host)


def test_a_refused_url_fails_before_any_connection() -> None:
    for uri in ("http://example.com/m.joblib", "ftp://example.com/m.joblib", "https:///m",
                "https://example.com:99999/m.joblib", "https://example.com:x/m.joblib"):
        with pytest.raises(ModelFetchError) as refused:
            check_url(uri)
        assert refused.value.cause == "ModelURLRefused"
        assert not refused.value.transient
    check_url("https://example.com/m.joblib")
    check_url("http://models.ml.svc:8080/m.joblib")


def test_shown_urls_keep_no_secret() -> None:
    assert shown("https://user:pw@s3.example.com:8443/b/m.joblib?X-Amz-Signature=abc#f") == \
        "https://s3.example.com:8443/b/m.joblib"
    assert shown("http://[::1]:9000/m.joblib?t=1") == "http://[::1]:9000/m.joblib"
    assert shown("builtin://iris/random-forest?trees=5") == "builtin://iris/random-forest?trees=5"
    assert shown("file:///m.joblib") == "file:///m.joblib"
    assert shown("https://h:99999/m?sig=1") == "https://h/m"


def test_fetch_settings_come_from_the_environment(tmp_path: Path) -> None:
    made = FetchSettings.from_env({"TAILGUARD_MODEL_CACHE": str(tmp_path),
                                   "TAILGUARD_MODEL_CA_FILE": "/etc/ca.pem",
                                   "TAILGUARD_MODEL_STALL_TIMEOUT_S": "0.5",
                                   "TAILGUARD_MODEL_FETCH_ATTEMPTS": "2"})
    assert (made.cache_dir, made.ca_file) == (tmp_path, Path("/etc/ca.pem"))
    assert (made.stall_timeout_s, made.attempts) == (0.5, 2)
    xdg = FetchSettings.from_env({"XDG_CACHE_HOME": "/x"})
    assert xdg.cache_dir == Path("/x/tailguard/models") and xdg.ca_file is None
    assert xdg.attempts == 4 and xdg.stall_timeout_s == 30.0


@pytest.mark.parametrize("env", [{"TAILGUARD_MODEL_STALL_TIMEOUT_S": "soon"},
                                 {"TAILGUARD_MODEL_STALL_TIMEOUT_S": "0"},
                                 {"TAILGUARD_MODEL_FETCH_ATTEMPTS": "0"},
                                 {"TAILGUARD_MODEL_FETCH_ATTEMPTS": "2.5"}])
def test_bad_fetch_settings_are_named(env: dict[str, str]) -> None:
    with pytest.raises(ModelLoadError, match=next(iter(env))):
        FetchSettings.from_env({"TAILGUARD_MODEL_CACHE": "/c", **env})
