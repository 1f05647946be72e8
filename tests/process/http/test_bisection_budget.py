"""A batch the model raises on costs at most ``2 * ceil(log2 maxBatchSize) + 1`` extra model
calls of bisection, one call on the model's reference row (``rows.ReferenceRow``: is it the
input or the model?), plus one call for each request that bisection could not clear and that
then runs alone; no sound request is failed for another's rows. Over real HTTP.

The probe model raises ``ValueError`` on a row whose first value is -999: a finite value inside
any range check, so the row reaches the model and fails its batch. Eight one-row requests are
queued, in a known order, behind a batch held by a gate, so that they share the next batch
(maxBatchSize 8); the probe logs every model call's row count to a file, which counts the calls
that batch cost.
"""

from __future__ import annotations

import math
import threading
import time
from pathlib import Path
from types import ModuleType
from typing import Any, Iterator

import httpx
import numpy as np
import pytest

from harness.runtime import (
    RuntimeServer,
    batching,
    error_of,
    gated_row,
    labels,
    new_gate,
    open_gate,
    probe_rows,
    probe_runtime,
    scrape,
    v1_body,
)

V1 = "/v1/models/probe:predict"
MAX_BATCH = 8
BUDGET = 2 * math.ceil(math.log2(MAX_BATCH)) + 1
"""Extra model calls of bisection one failing batch may cost: 7 for a batch of 8."""


@pytest.fixture(scope="module")
def counted(tmp_path_factory: pytest.TempPathFactory, probe_module: tuple[ModuleType, Path],
            ) -> Iterator[tuple[RuntimeServer, Any, Path]]:
    """A probe runtime (maxBatchSize 8) whose model logs its calls; yields it, the model, the
    log."""
    workdir = tmp_path_factory.mktemp("bisection-budget")
    log = workdir / "calls.log"
    with probe_runtime(probe_module, workdir, calls_log=log,
                       batching=batching(max_batch_size=MAX_BATCH, max_queue_size=64)) as (
            server, model):
        yield server, model, log


def _calls(log: Path) -> list[int]:
    """Rows of each model call so far, in order."""
    return [int(line) for line in log.read_text().split()] if log.exists() else []


def _wait_for(client: httpx.Client, want: dict[str, float], timeout_s: float = 30.0) -> None:
    """Poll ``/metrics`` until the probe primary's gauges read ``want``."""
    deadline = time.monotonic() + timeout_s
    seen: dict[str, float | None] = {}
    while time.monotonic() < deadline:
        samples = scrape(client)
        seen = {name: samples.get((name, labels("probe"))) for name in want}
        if seen == want:
            return
        time.sleep(0.02)
    raise AssertionError(f"gauges never read {want} (last {seen})")


def _one_batch(server: RuntimeServer, probe_module: tuple[ModuleType, Path], log: Path,
               poisoned: set[int]) -> tuple[list[np.ndarray], list[httpx.Response], list[int]]:
    """Send eight one-row requests (rows at ``poisoned`` positions hold -999) so that they
    make one batch in that order; return the rows, the answers, and the row counts of the
    model calls that batch cost."""
    rows = [probe_rows(1, seed=500 + i) for i in range(MAX_BATCH)]
    for i in poisoned:
        rows[i][0, 0] = -999.0
    answers: list[httpx.Response | None] = [None] * MAX_BATCH
    with server.client(limits=httpx.Limits(max_connections=MAX_BATCH + 2)) as client:
        _wait_for(client, {"tailguard_in_flight_requests": 0, "tailguard_queue_depth": 0})
        before = len(_calls(log))
        gate = new_gate()
        box: dict[str, httpx.Response] = {}
        blocker = threading.Thread(target=lambda: box.__setitem__(
            "blocker", client.post(V1, json=v1_body(gated_row(gate)))))
        blocker.start()
        _wait_for(client, {"tailguard_in_flight_requests": 1, "tailguard_queue_depth": 0})

        def send(i: int) -> None:
            answers[i] = client.post(V1, json=v1_body(rows[i]))

        senders = []
        for i in range(MAX_BATCH):  # one at a time, so the batch holds them in this order
            senders.append(threading.Thread(target=send, args=(i,)))
            senders[-1].start()
            _wait_for(client, {"tailguard_in_flight_requests": i + 2,
                               "tailguard_queue_depth": i + 1})
        open_gate(probe_module, gate)
        blocker.join(timeout=60)
        for sender in senders:
            sender.join(timeout=60)
    assert box["blocker"].status_code == 200, box["blocker"].text
    assert all(a is not None for a in answers)
    calls = _calls(log)[before:]
    assert calls[0] == 1, calls  # the held batch: the gated row alone
    return rows, [a for a in answers if a is not None], calls[1:]


@pytest.mark.parametrize("poisoned", [{5}, {2, 3}, {0}, {7}], ids=str)
def test_only_the_poisoned_requests_fail_within_the_budget(
        counted: tuple[RuntimeServer, Any, Path], probe_module: tuple[ModuleType, Path],
        poisoned: set[int]) -> None:
    """One or two adjacent poisoned requests among eight: bisection singles them out within
    the budget, and every sound neighbour gets its own predictions."""
    server, model, log = counted
    rows, answers, calls = _one_batch(server, probe_module, log, poisoned)
    assert calls[0] == MAX_BATCH, calls  # the eight shared one batch
    assert len(calls) - 1 <= BUDGET + 1, calls  # bisection, and the reference row
    for i, (x, r) in enumerate(zip(rows, answers)):
        if i in poisoned:
            assert r.status_code == 422, (i, r.text)
            assert "poisoned row" in error_of(r)
        else:
            assert r.status_code == 200, (i, r.text)
            np.testing.assert_array_equal(r.json()["predictions"], model.predict(x))


def test_a_batch_too_poisoned_to_isolate_runs_the_rest_alone_and_fails_no_sound_request(
        counted: tuple[RuntimeServer, Any, Path], probe_module: tuple[ModuleType, Path]) -> None:
    """Three scattered poisoned requests among eight need more calls than the budget allows.
    Bisection stops at the budget; each request of the groups still failing runs again in a
    batch of its own. No sound request is failed for its batch-mates' rows: each gets its own
    predictions, each poisoned one its own 422, and the batch costs the model at most
    2 + budget + 8 calls."""
    server, model, log = counted
    poisoned = {0, 3, 6}
    rows, answers, calls = _one_batch(server, probe_module, log, poisoned)
    assert calls[0] == MAX_BATCH, calls
    assert 1 + BUDGET < len(calls) <= 2 + BUDGET + MAX_BATCH, calls  # the budget did run out
    for i, (x, r) in enumerate(zip(rows, answers)):
        if i in poisoned:
            assert r.status_code == 422 and "poisoned row" in error_of(r), (i, r.text)
        else:
            assert r.status_code == 200, (i, r.text)
            np.testing.assert_array_equal(r.json()["predictions"], model.predict(x))
