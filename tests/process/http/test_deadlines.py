"""A request's deadline is enforced: 504 when it passes, and the server stays healthy after.

The probe model sleeps ``x[1]`` ms on a row whose first value is -1, so one request can keep
the model busy while others wait in the queue past their deadline.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path
from types import ModuleType
from typing import Any, Callable, Iterator

import httpx
import numpy as np
import pytest

from harness.runtime import (
    RuntimeServer,
    batching,
    error_of,
    labels,
    probe_rows,
    probe_runtime,
    scrape,
    slow_row,
    v1_body,
    v2_body,
    v2_outputs,
)


def _poll(client: httpx.Client, sample: str, model: str, value: float,
          timeout_s: float = 10.0, done: Callable[[], bool] = lambda: False) -> None:
    """Scrape until ``sample`` of ``model`` reads ``value``, or ``done()`` says what it
    waits for happened anyway (a state briefer than one scrape on a busy machine)."""
    deadline = time.monotonic() + timeout_s
    seen = None
    while time.monotonic() < deadline:
        seen = scrape(client).get((sample, labels(model)))
        if seen == value or done():
            return
        time.sleep(0.02)
    raise AssertionError(f"{sample} never read {value} (last {seen})")


class Timed:
    """A request sent from a thread, with when it was sent and how long its answer took."""

    def __init__(self, client: httpx.Client, path: str, body: dict[str, Any],
                 headers: dict[str, str] | None = None) -> None:
        self.response: httpx.Response | None = None
        self.elapsed_s = float("nan")
        self._thread = threading.Thread(target=self._run, args=(client, path, body, headers or {}))
        self._thread.start()

    def _run(self, client: httpx.Client, path: str, body: dict[str, Any],
             headers: dict[str, str]) -> None:
        started = time.monotonic()
        self.response = client.post(path, json=body, headers=headers)
        self.elapsed_s = time.monotonic() - started

    def result(self) -> httpx.Response:
        self._thread.join(timeout=60)
        assert self.response is not None
        return self.response


def test_queued_requests_past_their_header_deadline_get_504(
        probe_server: tuple[RuntimeServer, Any]) -> None:
    server, model = probe_server
    v2, v1 = "/v2/models/probe/infer", "/v1/models/probe:predict"
    with server.client(limits=httpx.Limits(max_connections=16)) as client:
        rows_before = scrape(client)[("tailguard_batch_size_rows_sum", labels("probe"))]
        blocker = Timed(client, v2, v2_body(slow_row(1500)))  # the server's deadline is 10 s
        _poll(client, "tailguard_in_flight_requests", "probe", 1.0)
        late = [Timed(client, v1, v1_body(probe_rows(2, seed=1)), {"X-Request-Timeout-Ms": "300"}),
                Timed(client, v2, v2_body(probe_rows(1, seed=2)), {"X-Request-Timeout-Ms": "300"}),
                # the v2 body's own deadline, in microseconds, as tritonclient sends it
                Timed(client, v2, v2_body(probe_rows(3, seed=3), parameters={"timeout": 300_000}))]
        for request in late:
            r = request.result()
            assert r.status_code == 504, r.text
            assert "deadline" in error_of(r)
            # answered when the deadline passed, not when the 1.5 s batch ahead finished
            assert request.elapsed_s < 1.3, request.elapsed_s
        assert blocker.result().status_code == 200, blocker.result().text

        # the expired rows never reached the model: only the blocker's row was computed
        rows_after = scrape(client)[("tailguard_batch_size_rows_sum", labels("probe"))]
        assert rows_after - rows_before == 1
        # healthy afterwards
        assert client.get("/v2/health/ready").status_code == 200
        x = probe_rows(4, seed=4)
        r = client.post(v2, json=v2_body(x), headers={"X-Request-Timeout-Ms": "5000"})
        assert r.status_code == 200, r.text
        np.testing.assert_array_equal(v2_outputs(r.json())["predict"], model.predict(x))
        metrics = scrape(client)
    assert metrics[("tailguard_requests_total", labels("probe", code="504"))] == 3
    assert metrics[("tailguard_rejections_total", labels("probe", reason="deadline_exceeded"))] == 3
    assert metrics[("tailguard_queue_depth", labels("probe"))] == 0
    assert metrics[("tailguard_in_flight_requests", labels("probe"))] == 0


TIMEOUT_MS = 500


@pytest.fixture(scope="module")
def strict_server(tmp_path_factory: pytest.TempPathFactory,
                  probe_module: tuple[ModuleType, Path]) -> Iterator[tuple[RuntimeServer, Any]]:
    """``timeoutMs`` 500: the service's own deadline, which a client may shorten only."""
    with probe_runtime(probe_module, tmp_path_factory.mktemp("strict"), name="strict",
                       batching=batching(max_batch_size=8, max_queue_size=64,
                                         timeout_ms=TIMEOUT_MS)) as served:
        yield served


def test_service_deadline_cannot_be_extended_and_the_server_recovers(
        strict_server: tuple[RuntimeServer, Any]) -> None:
    """The very first batch is slow (3 s, longer than ``timeoutMs``): the request in it and
    the ones queued behind it get 504 at their deadline, even the one whose header asks for
    10 s. (Each deadline is 0.5 s; an answer within 2.5 s shows it was kept on a machine
    busy enough to delay answers by seconds, without the batch's 3 s.)

    Then the model is idle and the queue empty, and the server must serve again. An outlier
    batch (a cold first call, a GC pause) must not lock a service out: if every later request
    is refused because the one measured batch was slow, no batch ever runs again to correct
    the estimate, and ``Retry-After`` promises a retry that can never succeed.
    """
    server, model = strict_server
    v1 = "/v1/models/strict:predict"
    with server.client(limits=httpx.Limits(max_connections=8)) as client:
        slow = Timed(client, v1, v1_body(slow_row(3000)), {"X-Request-Timeout-Ms": "10000"})
        # admitted (in flight), or answered already: either way the batch holds the model
        # for seconds more, and the requests sent now queue behind it
        _poll(client, "tailguard_in_flight_requests", "strict", 1.0,
              done=lambda: slow.response is not None)
        queued = [Timed(client, v1, v1_body(probe_rows(1, seed=i))) for i in range(3)]
        r = slow.result()
        assert r.status_code == 504, r.text
        assert f"{TIMEOUT_MS} ms" in error_of(r)
        assert slow.elapsed_s < 2.5, slow.elapsed_s
        for request in queued:
            assert request.result().status_code == 504, request.result().text
            assert request.elapsed_s < 2.5, request.elapsed_s
        # wait for the slow batch to leave the model
        _poll(client, "tailguard_batch_size_rows_count", "strict", 1.0)
        assert client.get("/v2/health/ready").status_code == 200

        x = probe_rows(2, seed=42)
        answer = client.post(v1, json=v1_body(x))
        for _ in range(3):  # a well-behaved client honours Retry-After
            if answer.status_code != 429:
                break
            time.sleep(int(answer.headers["retry-after"]))
            answer = client.post(v1, json=v1_body(x))
    assert answer.status_code == 200, (
        f"idle server, empty queue, still refusing: {answer.status_code} {answer.text}")
    np.testing.assert_array_equal(answer.json()["predictions"], model.predict(x))
