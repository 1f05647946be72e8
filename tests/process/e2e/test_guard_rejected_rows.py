"""Rows the model rejects are the client's failure, never the model's, while the model still
answers a row it answered before: on a real `tailguard up` serving a file:// model that raises
``ValueError`` on a poisoned row, a client sending 5% poisoned requests beside a good client, or
only poisoned requests on a quiet service, cannot roll a healthy primary back; a model that
raises on every row it gets is rolled back on errors.

Found by trying: 5% of requests with an input the model rejects (422 ``model_error``) rolled a
healthy primary back in 6 s; later, one client sending only such requests to a quiet service
did the same.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.util
import json
import sys
import threading
import time
from pathlib import Path
from typing import Iterator

import httpx
import numpy as np
import pytest

from harness.guard import (
    Attacker,
    StatusPoller,
    assert_rolled_back_on_streak,
    assert_the_attack_was_left_out,
    load,
    rollbacks,
)
from harness.runtime import PROBE_MODULE, PROBE_SOURCE, make_probe, probe_rows
from harness.up import Up
from tailguard.up.child import start_up

MODULE = f"{PROBE_MODULE}_guard"
"""The probe's module name here: its own, so that this test never replaces the module the HTTP
tests of the same worker registered under ``PROBE_MODULE``."""

POISON = -999.0
"""A first value the probe model raises ``ValueError`` on (``harness.runtime``)."""

SPEC = """\
apiVersion: tailguard.dev/v1alpha1
kind: InferenceService
metadata: {{name: probe}}
spec:
  model: {{uri: "file://{path}", sha256: "{sha256}"}}
  fallback: {{uri: builtin://iris/logistic-regression}}
  batching: {{timeoutMs: 3000}}
  slo: {{p99LatencyMs: 150, windowSeconds: 1, breachWindows: 2, recoverWindows: 2, minSamples: 10}}
"""


def _serve(tmp_path: Path, *, reject_all: bool = False) -> Iterator[Up]:
    """`tailguard up` serving the probe model (its module on the child's ``PYTHONPATH``);
    ``reject_all``: a broken probe that raises ``ValueError`` on every row."""
    folder = tmp_path / "probe"
    folder.mkdir()
    source = folder / f"{MODULE}.py"
    source.write_text(PROBE_SOURCE, encoding="utf-8")
    spec = importlib.util.spec_from_file_location(MODULE, source)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[MODULE] = module  # so that joblib pickles the class by this name
    try:
        spec.loader.exec_module(module)
        _, path = make_probe((module, source), folder, "probe", reject_all=reject_all)
    finally:
        del sys.modules[MODULE]
    digest = hashlib.sha256(path.read_bytes()).hexdigest()
    yaml_path = tmp_path / "probe.yaml"
    yaml_path.write_text(SPEC.format(path=path, sha256=digest))
    np.save(tmp_path / "rows.npy", probe_rows(200, seed=7))
    server = start_up(yaml_path, env={"PYTHONPATH": str(folder)})
    try:
        yield server
    finally:
        assert server.stop() == 0


@pytest.fixture
def up(tmp_path: Path) -> Iterator[Up]:
    """A healthy probe: it rejects only poisoned rows."""
    yield from _serve(tmp_path)


@pytest.fixture
def rejecting(tmp_path: Path) -> Iterator[Up]:
    """A broken probe: it rejects every row."""
    yield from _serve(tmp_path, reject_all=True)


class Poisoner(Attacker):
    """One-row requests the model rejects; with ``after_admitted``, only once the good client
    has had that many requests admitted."""

    def __init__(self, up: Up, rate: float, after_admitted: int = 0) -> None:
        super().__init__(rate)
        self.base = up.base
        self.after_admitted = after_admitted
        row = probe_rows(1, seed=9)
        row[0, 0] = POISON
        self.body = json.dumps({"inputs": [{"name": "input-0", "shape": [1, 4],
                                            "datatype": "FP64", "data": row.tolist()}]})

    def ready(self, client: httpx.Client, stopped: threading.Event) -> None:
        while self.after_admitted and not stopped.wait(0.05):  # the good client first
            totals = client.get(f"{self.base}/tailguard/stats").json()["totals"]
            if totals["primary"]["admitted"] >= self.after_admitted:
                return

    def send(self, client: httpx.Client, n: int) -> httpx.Response:
        return client.post(f"{self.base}/v2/models/probe/infer", content=self.body,
                           headers={"Content-Type": "application/json"})


def _bench(up: Up, tmp_path: Path, duration_s: float) -> list[dict[str, object]]:
    return load(up, "probe", tmp_path, rate=40, duration_s=duration_s,
                extra=("--rows", str(tmp_path / "rows.npy")))


def test_a_client_whose_rows_the_model_rejects_never_rolls_a_healthy_primary_back(
        up: Up, tmp_path: Path) -> None:
    with StatusPoller(up) as poller, Poisoner(up, rate=2, after_admitted=20) as poisoner:
        answers = _bench(up, tmp_path, duration_s=10)
    windows = poller.ordered()
    assert answers and {a["status"] for a in answers} == {200}
    assert poisoner.codes.get(422, 0) >= 10 and set(poisoner.codes) == {422}, poisoner.codes
    judged = [w for w in windows if w["observed"]["samples"] >= 10]
    assert len(judged) >= 6, [w["observed"] for w in windows]
    assert all(w["activeModel"] == "primary" for w in windows)
    assert_the_attack_was_left_out(judged, "errors")
    assert set(rollbacks(up, "probe").values()) == {0.0}
    rejected = sum(w["observed"].get("excluded", {}).get("input_rejected", 0) for w in windows)
    assert rejected >= 10, [w["observed"] for w in windows]


def test_only_rejected_rows_on_a_quiet_service_never_roll_a_healthy_primary_back(
        up: Up) -> None:
    """Clients alone on the service, sending only rows the model rejects, together well past
    minSamples (10) in every 1 s window: each gets its 422 and is left out; the guard sees too
    little to judge, never a breach. (Six connections: each is paced to a few refusals a
    second past its own budget, which is per connection.)"""
    poisoners = [Poisoner(up, rate=8) for _ in range(6)]
    with StatusPoller(up) as poller, contextlib.ExitStack() as stack:
        for poisoner in poisoners:
            stack.enter_context(poisoner)
        deadline = time.monotonic() + 30
        while len(poller.ordered()) < 10 and time.monotonic() < deadline:
            time.sleep(0.1)
    windows = poller.ordered()
    assert len(windows) >= 10, windows
    codes = [p.codes for p in poisoners]
    assert all(set(c) == {422} for c in codes), codes
    assert sum(c[422] for c in codes) >= 100, codes
    assert all(w["activeModel"] == "primary" for w in windows)
    assert all(w["guard"]["state"] == "idle" for w in windows), [w["guard"] for w in windows]
    assert set(rollbacks(up, "probe").values()) == {0.0}
    rejected = sum(w["observed"].get("excluded", {}).get("input_rejected", 0) for w in windows)
    assert rejected >= 100, [w["observed"] for w in windows]


def test_a_model_that_rejects_every_row_is_rolled_back(rejecting: Up, tmp_path: Path) -> None:
    """Its rejections are 500s (it raises on its reference row too), judged as errors."""
    with StatusPoller(rejecting) as poller:
        answers = _bench(rejecting, tmp_path, duration_s=6)
        deadline = time.monotonic() + 15  # 2 windows of 1 s, and room for a busy machine
        while poller.last.get("activeModel") != "fallback" and time.monotonic() < deadline:
            time.sleep(0.1)
    status = poller.last
    assert status["activeModel"] == "fallback" and status["guard"]["state"] == "rolledBack"
    assert rollbacks(rejecting, "probe")["errors"] == 1.0
    assert 500 in {a["status"] for a in answers}, {a["status"] for a in answers}
    windows = poller.ordered()
    assert_rolled_back_on_streak(windows, status)


def test_poisoned_batch_mates_fail_no_good_request_and_roll_nothing_back(
        up: Up, tmp_path: Path) -> None:
    """Eight connections sending rows the model rejects beside a good client: they share
    batches with its requests, bisection and requests run alone settle every batch, and no
    good request fails."""
    # 24/s of 64/s: under half, from once the good client's load is on
    poisoners = [Poisoner(up, rate=3, after_admitted=20) for _ in range(8)]
    with StatusPoller(up) as poller, contextlib.ExitStack() as stack:
        for poisoner in poisoners:
            stack.enter_context(poisoner)
        answers = _bench(up, tmp_path, duration_s=10)
    assert answers and {a["status"] for a in answers} == {200}
    assert all(set(p.codes) == {422} for p in poisoners), [p.codes for p in poisoners]
    windows = poller.ordered()
    assert all(w["activeModel"] == "primary" for w in windows)
    assert set(rollbacks(up, "probe").values()) == {0.0}
