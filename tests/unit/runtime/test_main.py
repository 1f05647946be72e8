"""`tailguard-runtime` refuses bad configs and busy ports with one clear line."""

from __future__ import annotations

import json
import socket
from pathlib import Path

import pytest

from tailguard_runtime import main


@pytest.mark.parametrize("content, needle", [
    (None, "FileNotFoundError"),
    ("{not json", "JSONDecodeError"),
    (json.dumps({"models": []}), "KeyError: 'name'"),
    (json.dumps({"name": "x", "models": [{"role": "canary", "uri": "builtin://iris/random-forest"}]}),
     "distinct roles among primary/fallback"),
])
def test_bad_configs_are_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                  content: str | None, needle: str) -> None:
    path = tmp_path / "runtime.json"
    if content is not None:
        path.write_text(content)
    assert main.main(["--config", str(path), "--log-level", "ERROR"]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"tailguard-runtime: bad config {path}") and needle in err
    assert "Traceback" not in err


def test_a_busy_port_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "runtime.json"
    path.write_text(json.dumps({"name": "iris", "models": [
        {"role": "primary", "uri": "builtin://iris/logistic-regression"}]}))
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen(1)
        port = busy.getsockname()[1]
        code = main.main(["--config", str(path), "--host", "127.0.0.1", "--port", str(port),
                            "--log-level", "ERROR"])
    assert code == 2
    assert f"cannot listen on 127.0.0.1:{port}" in capsys.readouterr().err


def test_a_model_that_does_not_load_leaves_its_cause_in_the_termination_log(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "runtime.json"
    path.write_text(json.dumps({"name": "iris", "models": [
        {"role": "primary", "uri": "file:///no/such/model.joblib"},
        {"role": "fallback", "uri": "https://models.example.com/m.joblib"}]}))
    log = tmp_path / "termination-log"
    for role, cause in (("primary", "ModelLoadFailed: file:///no/such/model.joblib: no such "
                                    "file"),
                        ("fallback", "ModelLoadFailed: https://models.example.com/m.joblib: a "
                                     "URL model needs its sha256")):
        assert main.main(["--config", str(path), "--role", role, "--log-level", "ERROR",
                          "--termination-log", str(log)]) == 2
        assert log.read_text().startswith(cause)
        assert capsys.readouterr().err.startswith(f"tailguard-runtime: {cause}")


def test_request_lines_of_httpx_never_reach_the_log_at_info() -> None:
    """httpx logs each request's whole URL at INFO, a presigned model URL's signature too."""
    import logging

    main.configure_logging("INFO")
    assert not logging.getLogger("httpx").isEnabledFor(logging.INFO)
    assert not logging.getLogger("httpcore").isEnabledFor(logging.INFO)
