"""SIGTERM drains: readiness turns 503, new work is refused with 503, every admitted request
is answered, and the process exits 0.

Each test starts its own server and signals that PID only.
"""

from __future__ import annotations

import signal
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

import httpx
import numpy as np

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

EXIT_TIMEOUT_S = 20.0


def _wait_in_flight(client: httpx.Client, name: str, value: float, timeout_s: float = 5.0) -> None:
    deadline = time.monotonic() + timeout_s
    while scrape(client).get(("tailguard_in_flight_requests", labels(name))) != value:
        assert time.monotonic() < deadline, f"in-flight never reached {value}"
        time.sleep(0.02)


def test_readiness_turns_503_while_a_long_batch_finishes(
        tmp_path: Path, probe_module: tuple[ModuleType, Path]) -> None:
    with probe_runtime(probe_module, tmp_path, name="drainy") as (server, model):
        x = slow_row(1500)
        box: dict[str, httpx.Response] = {}
        with server.client() as client, server.client() as other:
            worker = threading.Thread(target=lambda: box.__setitem__(
                "slow", client.post("/v2/models/drainy/infer", json=v2_body(x, id="slow"))))
            worker.start()
            _wait_in_flight(other, "drainy", 1.0)
            server.proc.send_signal(signal.SIGTERM)

            # the long batch is still computing: the listener is open, and says it is draining
            deadline = time.monotonic() + 5
            while (ready := other.get("/v2/health/ready")).status_code == 200:
                assert time.monotonic() < deadline, "readiness never turned 503"
                time.sleep(0.02)
            assert ready.status_code == 503
            error_of(ready)
            model_ready = other.get("/v2/models/drainy/ready")
            assert model_ready.status_code == 503
            refused = other.post("/v1/models/drainy:predict", json=v1_body(probe_rows(1, seed=0)))
            assert refused.status_code == 503
            assert "draining" in error_of(refused)
            assert other.get("/v2/health/live").status_code == 200
            assert "slow" not in box, "the slow request was answered before its batch finished"

            worker.join(timeout=30)
        answer = box["slow"]
        assert answer.status_code == 200, answer.text
        assert answer.json()["id"] == "slow"
        np.testing.assert_array_equal(v2_outputs(answer.json())["predict"], model.predict(x))
        assert server.proc.wait(timeout=EXIT_TIMEOUT_S) == 0


@dataclass
class Outcome:
    sent_at: float
    x: np.ndarray
    status: int | None = None
    body: Any = None
    error: str | None = None


def _load(server: RuntimeServer, seed: int, stop: threading.Event, out: list[Outcome]) -> None:
    """Send 1-3 row requests one after another until told to stop or the server is gone."""
    rng = np.random.default_rng(seed)
    with server.client(timeout=30.0) as client:
        while not stop.is_set():
            x = probe_rows(int(rng.integers(1, 4)), seed=int(rng.integers(1 << 30)))
            outcome = Outcome(time.monotonic(), x)
            out.append(outcome)
            try:
                r = client.post("/v1/models/loaded:predict", json=v1_body(x))
            except httpx.TransportError as exc:
                outcome.error = f"{type(exc).__name__}: {exc}"
                return  # the listener is closing: nothing more to send
            outcome.status = r.status_code
            outcome.body = r.json()


def test_sigterm_under_load_loses_no_admitted_request(
        tmp_path: Path, probe_module: tuple[ModuleType, Path]) -> None:
    with probe_runtime(probe_module, tmp_path, name="loaded", delay_s=0.02,
                       batching=batching(max_batch_size=4, max_queue_size=64,
                                         timeout_ms=20_000)) as (server, model):
        stop = threading.Event()
        outcomes: list[list[Outcome]] = [[] for _ in range(8)]
        threads = [threading.Thread(target=_load, args=(server, i, stop, outcomes[i]))
                   for i in range(8)]
        for t in threads:
            t.start()
        # let the load build up until a good number of requests have been answered
        deadline = time.monotonic() + 10
        while sum(o.status == 200 for out in outcomes for o in out) < 40:
            assert time.monotonic() < deadline, "load never got going"
            time.sleep(0.02)
        signalled_at = time.monotonic()
        server.proc.send_signal(signal.SIGTERM)
        code = server.proc.wait(timeout=EXIT_TIMEOUT_S)
        stop.set()
        for t in threads:
            t.join(timeout=30)
        assert not any(t.is_alive() for t in threads)
    assert code == 0, server.log_text()

    everything = [o for out in outcomes for o in out]
    before = [o for o in everything if o.sent_at < signalled_at]
    after = [o for o in everything if o.sent_at >= signalled_at]
    # a request sent before the signal always gets an HTTP answer: 200 or a 503 refusal
    for o in before:
        assert o.error is None, f"request sent before SIGTERM got no answer: {o.error}"
        assert o.status in (200, 503), (o.status, o.body)
    # after it, the listener may close: an answer is 200 or 503, or the connection is refused
    for o in after:
        assert o.status in (200, 503, None), (o.status, o.body)
        if o.status is None:
            assert o.error is not None and ("Connect" in o.error or "Protocol" in o.error
                                            or "Read" in o.error), o.error
    ok = [o for o in everything if o.status == 200]
    assert len(ok) >= 40
    for o in ok:
        np.testing.assert_array_equal(o.body["predictions"], model.predict(o.x))
    for o in everything:
        if o.status == 503:
            assert "draining" in o.body["error"]


def test_sigterm_flushes_a_batch_that_waits_for_batch_mates(
        tmp_path: Path, probe_module: tuple[ModuleType, Path]) -> None:
    """With ``maxWaitMs`` 4000 a lone request waits for batch-mates; SIGTERM sends it at once."""
    with probe_runtime(probe_module, tmp_path, name="patient",
                       batching=batching(max_batch_size=8, max_wait_ms=4000)) as (server, model):
        x = probe_rows(2, seed=5)
        box: dict[str, Any] = {}

        def send() -> None:
            started = time.monotonic()
            with server.client() as client:
                box["answer"] = client.post("/v1/models/patient:predict", json=v1_body(x))
            box["elapsed_s"] = time.monotonic() - started

        with server.client() as client:
            worker = threading.Thread(target=send)
            worker.start()
            deadline = time.monotonic() + 5
            while scrape(client).get(("tailguard_queue_depth", labels("patient"))) != 2:
                assert time.monotonic() < deadline, "the request never queued"
                time.sleep(0.02)
        server.proc.send_signal(signal.SIGTERM)
        worker.join(timeout=30)
        assert box["answer"].status_code == 200, box["answer"].text
        np.testing.assert_array_equal(box["answer"].json()["predictions"], model.predict(x))
        assert box["elapsed_s"] < 3.0, f"answered after {box['elapsed_s']:.2f} s: not flushed"
        assert server.proc.wait(timeout=EXIT_TIMEOUT_S) == 0


def test_grace_period_end_answers_503_not_a_dropped_connection(
        tmp_path: Path, probe_module: tuple[ModuleType, Path]) -> None:
    """``drainGraceSeconds`` 1 against a 3 s batch: the request still gets an HTTP answer, 503,
    when the grace period ends, and the process exits 0."""
    with probe_runtime(probe_module, tmp_path, name="hasty", drainGraceSeconds=1) as (server, _):
        box: dict[str, Any] = {}

        def send() -> None:
            with server.client() as client:
                try:
                    box["answer"] = client.post("/v1/models/hasty:predict",
                                                json=v1_body(slow_row(3000)))
                except httpx.TransportError as exc:
                    box["error"] = exc

        with server.client() as client:
            worker = threading.Thread(target=send)
            worker.start()
            _wait_in_flight(client, "hasty", 1.0)
        server.proc.send_signal(signal.SIGTERM)
        worker.join(timeout=30)
        assert "error" not in box, f"connection dropped: {box.get('error')!r}"
        answer = box["answer"]
        assert answer.status_code == 503, answer.text
        assert "grace" in error_of(answer)
        assert server.proc.wait(timeout=EXIT_TIMEOUT_S) == 0


def test_sigusr1_keeps_serving_but_closes_each_connection(
        tmp_path: Path, probe_module: tuple[ModuleType, Path]) -> None:
    """The preStop hook's signal: the pod is leaving. Answers stay 200, each one ends its
    connection, readiness is unchanged until SIGTERM, and the runtime stays up."""
    with probe_runtime(probe_module, tmp_path, name="leaving") as (server, _):
        with server.client() as client:
            before = client.post("/v1/models/leaving:predict", json=v1_body(probe_rows(1, seed=0)))
            assert before.status_code == 200
            assert before.headers.get("connection") != "close"
            server.proc.send_signal(signal.SIGUSR1)
            deadline = time.monotonic() + 5
            while True:
                after = client.post("/v1/models/leaving:predict", json=v1_body(probe_rows(1, seed=0)))
                assert after.status_code == 200, after.text
                if after.headers.get("connection") == "close":
                    break
                assert time.monotonic() < deadline, "answers never closed their connection"
                time.sleep(0.02)
            for _ in range(3):  # every later answer closes too, on a fresh connection each
                again = client.post("/v1/models/leaving:predict", json=v1_body(probe_rows(1, seed=0)))
                assert (again.status_code, again.headers.get("connection")) == (200, "close")
            assert client.get("/v2/health/ready").status_code == 200
        assert server.proc.poll() is None
        server.proc.send_signal(signal.SIGTERM)
        assert server.proc.wait(timeout=EXIT_TIMEOUT_S) == 0
