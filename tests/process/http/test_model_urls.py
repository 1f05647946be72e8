"""URL models over real HTTPS on 127.0.0.1, with a CA and certificate the test makes: fetched
once into the checksum-keyed cache, and every way a download can go wrong refused with its
named cause, with nothing unpickled before its checksum passed."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Iterator

import numpy as np
import pytest
from sklearn.linear_model import LogisticRegression

from harness.kube.pki import Authority
from harness.modelserver import LeavesAMark, ModelServer, Route, joblib_bytes, sha256_of
from tailguard_runtime.errors import ModelFetchError, ModelLoadError
from tailguard_runtime.models import load_dataset, load_model
from tailguard_runtime.sources import FetchSettings, fetch


@pytest.fixture(scope="module")
def authority(tmp_path_factory: pytest.TempPathFactory) -> Authority:
    return Authority(tmp_path_factory.mktemp("pki"))


@pytest.fixture(scope="module")
def model_bytes(tmp_path_factory: pytest.TempPathFactory) -> bytes:
    x, y = load_dataset("iris")
    return joblib_bytes(LogisticRegression(max_iter=500).fit(x, y),
                        tmp_path_factory.mktemp("model"))


@pytest.fixture()
def plain(model_bytes: bytes) -> Iterator[ModelServer]:
    server = ModelServer({"/iris.joblib": Route("file", model_bytes)})
    yield server
    server.stop()


@pytest.fixture()
def server(authority: Authority, model_bytes: bytes, plain: ModelServer,
           tmp_path: Path) -> Iterator[ModelServer]:
    mark = tmp_path / "unpickled"
    routes = {
        "/iris.joblib": Route("file", model_bytes),
        "/moved": Route("redirect", location="/iris.joblib"),
        "/to-http": Route("redirect", location=plain.url("/iris.joblib")),
        "/gone": Route("status", status=404),
        "/unsized": Route("unsized", model_bytes),
        "/stall": Route("stall", model_bytes[:100]),
        "/flaky": Route("fail_first", model_bytes, failures=2),
        "/mark.joblib": Route("file", joblib_bytes(LeavesAMark(mark), tmp_path, "mark.joblib")),
    }
    made = ModelServer(routes, authority)
    yield made
    made.stop()


@pytest.fixture()
def settings(authority: Authority, tmp_path: Path) -> FetchSettings:
    return FetchSettings(cache_dir=tmp_path / "cache", ca_file=authority.pair.cert,
                         stall_timeout_s=1.0, attempts=2, backoff_s=0.05)


def refused(uri: str, sha256: str, settings: FetchSettings, **kwargs: int) -> ModelFetchError:
    with pytest.raises(ModelFetchError) as caught:
        load_model(uri, sha256, fetch=settings, **kwargs)
    assert not list(settings.cache_dir.iterdir()), "a refused download left a file behind"
    return caught.value


def test_an_https_model_is_fetched_once_then_served_from_the_cache(
        server: ModelServer, settings: FetchSettings, model_bytes: bytes) -> None:
    digest = sha256_of(model_bytes)
    first = load_model(server.url("/iris.joblib?token=secret"), digest, fetch=settings)
    again = load_model(server.url("/iris.joblib?token=secret"), digest, fetch=settings)
    assert server.hits["/iris.joblib"] == 1
    assert [p.name for p in settings.cache_dir.iterdir()] == [f"{digest}.joblib"]
    assert "secret" not in first.uri and first.n_features == 4
    x, _ = load_dataset("iris")
    np.testing.assert_array_equal(first.run(x)[0], again.run(x)[0])


def test_a_part_left_by_a_killed_download_is_removed_once_stale(
        server: ModelServer, settings: FetchSettings, model_bytes: bytes) -> None:
    digest = sha256_of(model_bytes)
    settings.cache_dir.mkdir()
    stale, fresh = (settings.cache_dir / f".{digest}.{pid}.part" for pid in (1, 2))
    for part in (stale, fresh):
        part.write_bytes(b"half a model")
    os.utime(stale, (time.time() - 3600, time.time() - 3600))
    load_model(server.url("/iris.joblib"), digest, fetch=settings)
    assert not stale.exists() and fresh.exists()  # another process may still write the fresh one


def test_https_redirects_are_followed(server: ModelServer, settings: FetchSettings,
                                      model_bytes: bytes) -> None:
    load_model(server.url("/moved"), sha256_of(model_bytes), fetch=settings)
    assert (server.hits["/moved"], server.hits["/iris.joblib"]) == (1, 1)


def test_a_wrong_checksum_is_refused_and_the_file_never_unpickled(
        server: ModelServer, settings: FetchSettings, tmp_path: Path) -> None:
    mark_bytes = server.routes["/mark.joblib"].body
    error = refused(server.url("/mark.joblib"), sha256_of(b"another file"), settings)
    assert error.cause == "ModelChecksumMismatch" and "was not opened" in str(error)
    assert not (tmp_path / "unpickled").exists()
    assert server.hits["/mark.joblib"] == 1  # a wrong checksum is not tried again
    # The control: with its own checksum the same file is unpickled and leaves its mark.
    with pytest.raises(ModelLoadError, match="not a scikit-learn estimator"):
        load_model(server.url("/mark.joblib"), sha256_of(mark_bytes), fetch=settings)
    assert (tmp_path / "unpickled").is_dir()


def test_a_file_above_the_cap_is_refused_announced_or_counted(
        server: ModelServer, settings: FetchSettings, model_bytes: bytes) -> None:
    digest, cap = sha256_of(model_bytes), len(model_bytes) - 1
    announced = refused(server.url("/iris.joblib"), digest, settings, max_bytes=cap)
    counted = refused(server.url("/unsized"), digest, settings, max_bytes=cap)
    assert announced.cause == counted.cause == "ModelTooLarge"
    assert "announced" in str(announced) and "download stopped" in str(counted)
    assert server.hits["/iris.joblib"] == server.hits["/unsized"] == 1
    load_model(server.url("/unsized"), digest, fetch=settings, max_bytes=len(model_bytes))


def test_a_redirect_to_plain_http_is_refused_before_it_is_followed(
        server: ModelServer, plain: ModelServer, settings: FetchSettings,
        model_bytes: bytes) -> None:
    error = refused(server.url("/to-http"), sha256_of(model_bytes), settings)
    assert error.cause == "ModelURLRefused" and "only to https://" in str(error)
    assert plain.hits["/iris.joblib"] == 0


def test_not_found_is_final(server: ModelServer, settings: FetchSettings) -> None:
    error = refused(server.url("/gone"), "a" * 64, settings)
    assert error.cause == "ModelNotFound" and "404" in str(error)
    assert server.hits["/gone"] == 1


def test_a_stalled_server_is_left_after_each_attempt(
        server: ModelServer, settings: FetchSettings, model_bytes: bytes) -> None:
    error = refused(server.url("/stall"), sha256_of(model_bytes), settings)
    assert error.cause == "ModelFetchStalled" and "after 2 attempts" in str(error)
    assert server.hits["/stall"] == 2


def test_server_errors_are_tried_again_with_doubling_waits(
        server: ModelServer, settings: FetchSettings, model_bytes: bytes) -> None:
    waits: list[float] = []
    more = FetchSettings(settings.cache_dir, settings.ca_file, attempts=3, backoff_s=0.05)
    fetch(server.url("/flaky"), sha256_of(model_bytes), 1 << 20, more, sleep=waits.append)
    assert server.hits["/flaky"] == 3 and waits == [0.05, 0.1]


def test_an_untrusted_certificate_is_refused(server: ModelServer, settings: FetchSettings,
                                             model_bytes: bytes) -> None:
    public_only = FetchSettings(settings.cache_dir, None, attempts=2, backoff_s=0.05)
    error = refused(server.url("/iris.joblib"), sha256_of(model_bytes), public_only)
    assert error.cause == "ModelTLSError" and "CERTIFICATE_VERIFY_FAILED" in str(error)
    assert server.hits["/iris.joblib"] == 0


def test_plain_http_to_loopback_serves(plain: ModelServer, settings: FetchSettings,
                                       model_bytes: bytes) -> None:
    predictor = load_model(plain.url("/iris.joblib"), sha256_of(model_bytes), fetch=settings)
    assert predictor.n_features == 4 and plain.hits["/iris.joblib"] == 1


def test_a_url_model_needs_its_checksum(server: ModelServer, settings: FetchSettings) -> None:
    with pytest.raises(ModelLoadError, match="needs its sha256"):
        load_model(server.url("/iris.joblib"), None, fetch=settings)
    assert server.hits["/iris.joblib"] == 0
