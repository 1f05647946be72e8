"""End to end: the README's main command (`tailguard up examples/digits.yaml`) as a real process,
real digits rows over real HTTP, and `tailguard rollback` under load."""

from __future__ import annotations

import functools
import os
import signal
import subprocess
import threading
import time
from pathlib import Path
from typing import Iterator

import httpx
import numpy as np
import pytest
from sklearn.ensemble import RandomForestClassifier
from sklearn.linear_model import LogisticRegression
from sklearn.pipeline import make_pipeline
from sklearn.preprocessing import StandardScaler

from harness.up import EXAMPLE, ROOT, TAILGUARD, Up, start_up
from tailguard_runtime.models import load_dataset


@pytest.fixture(scope="module")
def up() -> Iterator[Up]:
    server = start_up(EXAMPLE)
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="module")
def digits() -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Digits rows and the offline predictions of the example's primary and fallback."""
    x, _ = load_dataset("digits")
    return x, forest_model().predict(x), linear_model().predict(x)


@functools.cache
def forest_model() -> RandomForestClassifier:
    x, y = load_dataset("digits")
    return RandomForestClassifier(n_estimators=200, random_state=0, n_jobs=1).fit(x, y)


@functools.cache
def linear_model():  # type: ignore[no-untyped-def]
    x, y = load_dataset("digits")
    return make_pipeline(StandardScaler(), LogisticRegression(max_iter=2000)).fit(x, y)


def forest_proba(x: np.ndarray) -> np.ndarray:
    return forest_model().predict_proba(x)


def linear_proba(x: np.ndarray) -> np.ndarray:
    return linear_model().predict_proba(x)


def _switch(up: Up, command: str) -> str:
    done = subprocess.run([*TAILGUARD, command, "digits", "--port", str(up.port)],
                          capture_output=True, text=True, timeout=30, cwd=ROOT)
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_concurrent_real_rows_get_the_models_offline_predictions(up: Up, digits) -> None:  # type: ignore[no-untyped-def]
    x, forest, _ = digits
    failures: list[str] = []

    def client(offset: int) -> None:
        with httpx.Client(base_url=up.base, timeout=30) as http:
            for i in range(offset, 600, 6):
                rows = x[i:i + 1 + i % 5]
                if i % 2:
                    reply = http.post("/v1/models/digits:predict", json={"instances": rows.tolist()})
                    got = reply.json().get("predictions") if reply.status_code == 200 else None
                else:
                    reply = http.post("/v2/models/digits/infer", json={"inputs": [{
                        "name": "x", "shape": list(rows.shape), "datatype": "FP64",
                        "data": rows.ravel().tolist()}]})
                    got = reply.json()["outputs"][0]["data"] if reply.status_code == 200 else None
                if got != forest[i:i + len(rows)].tolist():
                    failures.append(f"row {i}: {reply.status_code} {reply.text[:200]}")

    threads = [threading.Thread(target=client, args=(k,)) for k in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not failures, failures[:5]
    stats = httpx.get(f"{up.base}/tailguard/stats").json()
    assert stats["activeModel"] == "primary" and stats["models"]["primary"]["samples"] >= 100


def test_rollback_moves_traffic_to_the_fallback_with_no_failed_request(up: Up, digits) -> None:  # type: ignore[no-untyped-def]
    """Answers carry predict_proba: the forest's and the logistic regression's differ on every
    row, so each answer shows which model computed it. Requests answered before the switch began
    came from the primary; requests sent after `tailguard rollback` returned come from the
    fallback; those in between may come from either (they finish where they were admitted).
    None fails but by its own deadline on a stalled machine."""
    x, forest, linear = digits
    results: list[tuple[float, float, int, int, np.ndarray | None]] = []
    stop = threading.Event()

    def client(offset: int) -> None:
        with httpx.Client(base_url=up.base, timeout=30) as http:
            i = offset
            while not stop.is_set() and i < 20_000:
                row = i % len(x)
                sent = time.monotonic()
                reply = http.post("/v2/models/digits/infer", json={
                    "inputs": [{"name": "x", "shape": [1, 64], "datatype": "FP64",
                                "data": x[row].tolist()}],
                    "outputs": [{"name": "predict_proba"}]})
                proba = (np.asarray(reply.json()["outputs"][0]["data"])
                         if reply.status_code == 200 else None)
                results.append((sent, time.monotonic(), row, reply.status_code, proba))
                i += 4

    threads = [threading.Thread(target=client, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    time.sleep(1.0)
    switch_started = time.monotonic()
    assert "now goes to fallback" in _switch(up, "rollback")
    switched = time.monotonic()
    time.sleep(1.0)
    stop.set()
    for t in threads:
        t.join(30)

    # On a machine stalled by other work a request can wait out its 1 s deadline (the
    # example's timeoutMs): a 504, or a 408 when the stall fell between its head and its body.
    # Such a request took its deadline; any other failure was lost to the switch.
    failed = [(round(done - sent, 3), code) for sent, done, _, code, _ in results if code != 200]
    assert all(code in (408, 504) and took >= 0.95 for took, code in failed), failed
    assert len(failed) <= 0.05 * len(results), (len(failed), len(results))
    results = [r for r in results if r[3] == 200]
    forest_p, linear_p = forest_proba(x), linear_proba(x)

    def source(row: int, proba: np.ndarray) -> str:
        if np.allclose(proba, forest_p[row]):
            return "primary"
        assert np.allclose(proba, linear_p[row]), f"row {row}: answer from neither model"
        return "fallback"

    before = {source(row, p) for sent, done, row, _, p in results if done < switch_started}
    after = [source(row, p) for sent, done, row, _, p in results if sent > switched]
    assert before == {"primary"}
    assert len(after) > 20 and set(after) == {"fallback"}
    meta = httpx.get(f"{up.base}/v2/models/digits").json()
    assert meta["parameters"]["role"] == "fallback"

    assert "now goes to primary" in _switch(up, "rollforward")
    assert "already goes to primary" in _switch(up, "rollforward")
    reply = httpx.post(f"{up.base}/v1/models/digits:predict", json={"instances": [x[0].tolist()]})
    assert reply.json()["predictions"] == [forest[0]]


def test_rollback_of_an_unknown_name_is_refused(up: Up) -> None:
    done = subprocess.run([*TAILGUARD, "rollback", "nope", "--port", str(up.port)],
                          capture_output=True, text=True, timeout=30, cwd=ROOT)
    assert done.returncode == 1 and "no InferenceService 'nope'" in done.stderr


def test_sigint_drains_and_exits_cleanly(tmp_path: Path) -> None:
    spec = tmp_path / "iris.yaml"
    spec.write_text((ROOT / "examples" / "iris.yaml").read_text())
    server = start_up(spec)
    try:
        assert httpx.get(f"{server.base}/v2/health/ready").status_code == 200
    finally:  # stopped either way: a process left running fails the worker's next test
        code = server.stop(signal.SIGINT)
    assert code == 0
    assert ("tailguard up: drained 0 in-flight request(s); 0 answered 503 (0 cut off when the "
            "grace period ended, 0 arrived while draining); stopped") in "".join(server.printed)


@pytest.mark.parametrize("edit, needle", [
    ("batching:\n    maxBatchSize: 0", "spec.batching.maxBatchSize: 0 is less than the minimum of 1"),
    ("batching:\n    maxWaitMs: 30", "spec.batching.maxWaitMs: batching.maxWaitMs must be smaller"),
    ("surprise: true", "Additional properties are not allowed ('surprise' was unexpected)"),
])
def test_invalid_specs_are_refused_naming_the_field(tmp_path: Path, edit: str, needle: str) -> None:
    spec = tmp_path / "bad.yaml"
    spec.write_text((ROOT / "examples" / "iris.yaml").read_text() + f"  {edit}\n")
    done = subprocess.run([*TAILGUARD, "up", str(spec), "--port", "0"], capture_output=True,
                          text=True, timeout=60, cwd=ROOT)
    assert done.returncode == 2
    assert needle in done.stderr


def test_a_model_file_that_does_not_exist_fails_at_startup_with_its_uri(tmp_path: Path) -> None:
    spec = tmp_path / "missing.yaml"
    spec.write_text((ROOT / "examples" / "iris.yaml").read_text().replace(
        "builtin://iris/random-forest", "file:///no/such/model.joblib"))
    done = subprocess.run([*TAILGUARD, "up", str(spec), "--port", "0"], capture_output=True,
                          text=True, timeout=60, cwd=ROOT, env={**os.environ})
    assert done.returncode == 1  # a refusal, as validate --models says it
    assert "file:///no/such/model.joblib: no such file /no/such/model.joblib" in done.stderr
