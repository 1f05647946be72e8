"""`tailguard up` and `tailguard validate --models` with an https:// model served on 127.0.0.1
by a server whose certificate the test's own CA signed: the model is downloaded once, kept in
the cache by its checksum, and served; a bad checksum or a missing file is one line."""

from __future__ import annotations

from pathlib import Path
from typing import Iterator

import httpx
import pytest
from sklearn.linear_model import LogisticRegression

from harness.kube.pki import Authority
from harness.modelserver import ModelServer, Route, joblib_bytes, sha256_of
from harness.up import IRIS, one_line_failure, run_cli, start_up
from tailguard_runtime.models import load_dataset


@pytest.fixture(scope="module")
def model_bytes(tmp_path_factory: pytest.TempPathFactory) -> bytes:
    x, y = load_dataset("iris")
    return joblib_bytes(LogisticRegression(max_iter=500).fit(x, y),
                        tmp_path_factory.mktemp("model"))


@pytest.fixture(scope="module")
def authority(tmp_path_factory: pytest.TempPathFactory) -> Authority:
    return Authority(tmp_path_factory.mktemp("pki"))


@pytest.fixture()
def server(authority: Authority, model_bytes: bytes) -> Iterator[ModelServer]:
    made = ModelServer({"/iris.joblib": Route("file", model_bytes)}, authority)
    yield made
    made.stop()


def spec_for(folder: Path, uri: str, sha256: str) -> Path:
    """examples/iris.yaml with its primary fetched from ``uri``."""
    spec = folder / "remote.yaml"
    spec.write_text(IRIS.read_text().replace(
        "uri: builtin://iris/random-forest", f"uri: {uri}\n    sha256: \"{sha256}\""))
    return spec


def test_up_downloads_once_and_serves_the_model(server: ModelServer, authority: Authority,
                                                model_bytes: bytes, tmp_path: Path) -> None:
    spec = spec_for(tmp_path, server.url("/iris.joblib"), sha256_of(model_bytes))
    env = {"TAILGUARD_MODEL_CACHE": str(tmp_path / "cache"),
           "TAILGUARD_MODEL_CA_FILE": str(authority.pair.cert)}
    for run in range(2):
        up = start_up(spec, env=env)
        try:
            answer = httpx.post(f"{up.base}/v2/models/iris/infer", json={"inputs": [
                {"name": "input-0", "shape": [1, 4], "datatype": "FP64",
                 "data": [5.1, 3.5, 1.4, 0.2]}]}, timeout=10)
            assert answer.status_code == 200, answer.text
            assert answer.json()["model_version"] == "1"
        finally:
            up.stop()
        assert server.hits["/iris.joblib"] == 1, f"run {run + 1} downloaded again"
    assert (tmp_path / "cache" / f"{sha256_of(model_bytes)}.joblib").is_file()


def test_validate_models_refuses_a_wrong_checksum_and_a_missing_file(
        server: ModelServer, authority: Authority, tmp_path: Path) -> None:
    env = {"TAILGUARD_MODEL_CACHE": str(tmp_path / "cache"),
           "TAILGUARD_MODEL_CA_FILE": str(authority.pair.cert)}
    wrong = spec_for(tmp_path, server.url("/iris.joblib?sig=s3cret"), "0" * 64)
    line = one_line_failure(run_cli("validate", str(wrong), "--models", env=env))
    assert line.startswith(f"tailguard validate: {wrong}: {server.url('/iris.joblib')}: "
                           "sha256 mismatch: expected 0000"), line
    assert "s3cret" not in line
    missing = spec_for(tmp_path, server.url("/nothing.joblib"), "0" * 64)
    line = one_line_failure(run_cli("validate", str(missing), "--models", env=env))
    assert line.endswith(f"404 Not Found from {server.url('/nothing.joblib')}"), line
    assert not list((tmp_path / "cache").iterdir())
