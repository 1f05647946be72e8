"""A model that raises on some rows fails only the requests that sent those rows.

The probe model raises ``ValueError`` on a row whose first value is -999 and ``RuntimeError`` on
-998. Requests queue up behind a slow batch so that they are batched together; the batcher must
bisect the failing batch and answer every good neighbour with its own, correct predictions.
"""

from __future__ import annotations

import json
import socket
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from types import ModuleType
from typing import Any

import httpx
import numpy as np

from harness.runtime import (
    RuntimeServer,
    error_of,
    gated_row,
    labels,
    new_gate,
    open_gate,
    probe_rows,
    probe_runtime,
    scrape,
    slow_row,
    v1_body,
    v2_body,
    v2_outputs,
)

V2 = "/v2/models/probe/infer"
V1 = "/v1/models/probe:predict"


def _poisoned(n: int, at: int, marker: float, seed: int) -> np.ndarray:
    x = probe_rows(n, seed)
    x[at, 0] = marker
    return x


def _wait_for(client: httpx.Client, sample: str, value: float, timeout_s: float = 30.0) -> None:
    """Poll ``/metrics`` until the probe primary's ``sample`` reads ``value``."""
    deadline = time.monotonic() + timeout_s
    seen = None
    while time.monotonic() < deadline:
        seen = scrape(client).get((sample, labels("probe")))
        if seen == value:
            return
        time.sleep(0.02)
    raise AssertionError(f"{sample} never read {value} (last {seen})")


def test_only_the_poisoned_requests_fail(probe_server: tuple[RuntimeServer, Any]) -> None:
    server, model = probe_server
    goods = [probe_rows(1 + i % 3, seed=i) for i in range(12)]
    poison_v2 = _poisoned(3, 1, -999.0, seed=100)        # ValueError -> 422
    crash_v1 = _poisoned(1, 0, -998.0, seed=101)         # RuntimeError -> 500
    poison_chunked = _poisoned(12, 10, -999.0, seed=102)  # > maxBatchSize 8: fails in chunk 2
    total_rows = sum(len(x) for x in goods) + 3 + 1 + 12

    with server.client(limits=httpx.Limits(max_connections=24)) as client:
        stats_before = client.get("/tailguard/stats").json()["models"]["primary"]
        results: dict[str, httpx.Response] = {}

        def post(key: str, path: str, body: dict[str, Any]) -> None:
            results[key] = client.post(path, json=body)

        # occupy the model so everything below queues up and is batched together
        blocker = threading.Thread(target=post, args=("blocker", V2, v2_body(slow_row(1500))))
        blocker.start()
        _wait_for(client, "tailguard_in_flight_requests", 1.0)

        with ThreadPoolExecutor(max_workers=16) as pool:
            jobs = [pool.submit(post, f"good-{i}", V2 if i % 2 else V1,
                                v2_body(x, id=f"good-{i}") if i % 2 else v1_body(x))
                    for i, x in enumerate(goods)]
            jobs += [pool.submit(post, "poison", V2, v2_body(poison_v2, id="poison")),
                     pool.submit(post, "crash", V1, v1_body(crash_v1)),
                     pool.submit(post, "poison-chunked", V2, v2_body(poison_chunked))]
            _wait_for(client, "tailguard_queue_depth", float(total_rows))
            for job in jobs:
                job.result()
        blocker.join(timeout=30)
        stats_after = client.get("/tailguard/stats").json()["models"]["primary"]
        after = client.post(V1, json=v1_body(goods[0]))

    assert results["blocker"].status_code == 200, results["blocker"].text
    poisoned = results["poison"]
    assert poisoned.status_code == 422, poisoned.text
    assert "ValueError" in error_of(poisoned) and "poisoned row" in error_of(poisoned)
    crashed = results["crash"]
    assert crashed.status_code == 500, crashed.text
    assert "RuntimeError" in error_of(crashed)
    assert results["poison-chunked"].status_code == 422, results["poison-chunked"].text
    assert "poisoned row" in error_of(results["poison-chunked"])

    for i, x in enumerate(goods):
        r = results[f"good-{i}"]
        assert r.status_code == 200, (i, r.text)
        if i % 2:
            assert r.json()["id"] == f"good-{i}"
            outputs = v2_outputs(r.json())
            np.testing.assert_array_equal(outputs["predict"], model.predict(x))
            np.testing.assert_allclose(outputs["predict_proba"], model.predict_proba(x))
        else:
            np.testing.assert_array_equal(r.json()["predictions"], model.predict(x))

    # the model's crash is an admitted request that failed: an error in the stats, not a
    # refusal; rows the model rejected (422) are the clients' own input, left out of what the
    # SLO guard judges and shown apart
    assert stats_after["errors"] - stats_before["errors"] == 1
    assert stats_after["samples"] - stats_before["samples"] == len(goods) + 2  # + blocker, crash
    assert stats_after["excluded"].get("input_rejected", 0) - stats_before["excluded"].get(
        "input_rejected", 0) == 2
    assert stats_after["rejected"].get("model_error", 0) == stats_before["rejected"].get(
        "model_error", 0)
    # and the model serves normally afterwards
    assert after.status_code == 200
    np.testing.assert_array_equal(after.json()["predictions"], model.predict(goods[0]))


def test_every_row_poisoned_fails_alone(probe_server: tuple[RuntimeServer, Any]) -> None:
    """Several poisoned requests among good ones, no gating: each poisoned one fails, each
    good one succeeds at its first try, whatever batches they happen to share (a batch whose
    bisection budget runs out sends its unsettled requests to run alone; none is told to
    retry)."""
    server, model = probe_server
    requests = []
    for i in range(30):
        x = probe_rows(1 + i % 4, seed=200 + i)
        if i % 5 == 2:
            x[-1, 0] = -999.0
        requests.append(x)

    def send(x: np.ndarray) -> httpx.Response:
        return client.post(V1, json=v1_body(x))

    with server.client(limits=httpx.Limits(max_connections=16)) as client:
        with ThreadPoolExecutor(max_workers=10) as pool:
            answers = list(pool.map(send, requests))
    for i, (x, r) in enumerate(zip(requests, answers)):
        if i % 5 == 2:
            assert r.status_code == 422, (i, r.text)
            assert "poisoned row" in error_of(r)
        else:
            assert r.status_code == 200, (i, r.text)
            np.testing.assert_array_equal(r.json()["predictions"], model.predict(x))


def test_clients_that_disconnect_never_stall_batching(
        probe_server: tuple[RuntimeServer, Any], probe_module: tuple[ModuleType, Path]) -> None:
    """Clients that hang up while queued, or halfway through sending their body, leave the
    model serving everyone else, and leave no row counted as waiting. A gated row holds the
    model while they queue (a fixed sleep ran out on a machine busy with another suite)."""
    server, model = probe_server
    body = json.dumps(v1_body(probe_rows(3, seed=300))).encode()
    head = (f"POST {V1} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\n\r\n").encode()
    goods = [probe_rows(1 + i % 3, seed=400 + i) for i in range(8)]
    gate = new_gate()
    with server.client(limits=httpx.Limits(max_connections=16)) as client, \
            ThreadPoolExecutor(max_workers=9) as pool:
        try:
            blocker = pool.submit(client.post, V1, json=v1_body(gated_row(gate)))
            _wait_for(client, "tailguard_in_flight_requests", 1.0)
            for _ in range(3):  # whole request queued, then gone
                with socket.create_connection(("127.0.0.1", server.port), timeout=10) as sock:
                    sock.sendall(head + body)
            _wait_for(client, "tailguard_queue_depth", 9.0)
            with socket.create_connection(("127.0.0.1", server.port), timeout=10) as sock:
                sock.sendall(head + body[: len(body) // 2])  # gone mid-body
            answers = [pool.submit(client.post, V1, json=v1_body(x)) for x in goods]
            _wait_for(client, "tailguard_queue_depth", 9.0 + sum(len(x) for x in goods))
        finally:
            open_gate(probe_module, gate)
        held = blocker.result(timeout=60)
        answered = [a.result(timeout=60) for a in answers]
        _wait_for(client, "tailguard_in_flight_requests", 0.0)
        _wait_for(client, "tailguard_queue_depth", 0.0)
        ready = client.get("/v2/health/ready")
    assert held.status_code == 200
    for x, r in zip(goods, answered):
        assert r.status_code == 200, r.text
        np.testing.assert_array_equal(r.json()["predictions"], model.predict(x))
    assert ready.status_code == 200


def test_a_crashed_model_thread_fails_liveness_so_the_pod_restarts(
        probe_module: tuple[ModuleType, Path], tmp_path: Path) -> None:
    """A row that ends the model thread (``SystemExit``, which no row isolation catches) gets
    a 500, so does every request after it, and liveness and readiness turn 503 naming why:
    a kubelet restarts the container instead of leaving a pod that can only answer 500."""
    with probe_runtime(probe_module, tmp_path) as (server, _), server.client() as client:
        assert client.get("/v2/health/live").status_code == 200
        ended = client.post(V1, json=v1_body(_poisoned(2, 1, -997.0, seed=7)))
        assert ended.status_code == 500 and "model thread crashed" in error_of(ended)
        after = client.post(V1, json=v1_body(probe_rows(1, seed=8)))
        assert after.status_code == 500 and "model thread crashed" in error_of(after)
        for probe in ("/v2/health/live", "/v2/health/ready"):
            answer = client.get(probe)
            assert answer.status_code == 503, (probe, answer.text)
            assert "primary model cannot serve: model thread crashed" in error_of(answer)
        assert client.get("/v2/models/probe/ready").status_code == 503
