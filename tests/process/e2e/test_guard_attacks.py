"""The SLO guard of a real `tailguard up` judges the model, never its clients: a client sending
tiny deadlines, or requests as large as the whole queue, cannot roll a healthy primary back,
and cannot stop a broken one from being rolled back. Load from `tailguard bench` (a separate process) plus an attacker thread, both on
127.0.0.1 only, bounded in time.

Found by trying: requests carrying ``X-Request-Timeout-Ms: 0.001`` or v2 ``parameters.timeout:
1`` were admitted on an idle queue, expired, got 504 ``deadline_exceeded`` and counted as
failures of the model: two a second beside a good client moved traffic to the fallback while
the primary's p99 stayed far under the SLO.
"""

from __future__ import annotations

from pathlib import Path
from typing import Iterator

import httpx
import pytest

from harness.attacks import oversized, tiny_deadline
from harness.guard import (
    Attacker,
    StatusPoller,
    assert_rolled_back_on_streak,
    assert_the_attack_was_left_out,
    forest_spec,
    load,
    rollbacks,
    serving,
)
from harness.up import Up


@pytest.fixture
def healthy(tmp_path: Path) -> Iterator[Up]:
    with serving(tmp_path, "healthy", forest_spec("healthy")) as server:
        yield server


@pytest.fixture
def broken(tmp_path: Path) -> Iterator[Up]:
    # every model call beyond the 150 ms SLO
    with serving(tmp_path, "broken", forest_spec("broken", delay_ms=300)) as server:
        yield server


class TinyDeadlines(Attacker):
    """Requests whose own deadline is shorter than the SLO
    (:func:`harness.attacks.tiny_deadline`)."""

    def __init__(self, up: Up, name: str, rate: float = 10.0) -> None:
        super().__init__(rate)
        self.url = f"{up.base}/v2/models/{name}/infer"

    def send(self, client: httpx.Client, n: int) -> httpx.Response:
        body, headers = tiny_deadline(n)
        return client.post(self.url, content=body, headers=headers)


def test_tiny_deadlines_never_roll_back_a_healthy_primary(healthy: Up, tmp_path: Path) -> None:
    with StatusPoller(healthy) as poller, TinyDeadlines(healthy, "healthy") as attacker:
        answers = load(healthy, "healthy", tmp_path, rate=40, duration_s=10)
        live = httpx.get(f"{healthy.base}/tailguard/stats").json()["models"]["primary"]
    windows = poller.ordered()
    assert {a["status"] for a in answers} == {200}
    # the attack ran: its requests expired (504), were refused for their deadline (429), or
    # were answered within their short deadline (200)
    assert sum(attacker.codes.get(code, 0) for code in (429, 504)) >= 15, attacker.codes
    assert attacker.codes.get(200, 0) >= 10, attacker.codes
    judged = [w for w in windows if w["observed"]["samples"] >= 10]
    assert len(judged) >= 6, [w["observed"] for w in windows]
    assert all(w["activeModel"] == "primary" for w in windows)
    assert_the_attack_was_left_out(judged, "deadline")
    assert set(rollbacks(healthy, "healthy").values()) == {0.0}
    # and the guard says what it left out, window by window
    # (a 408 is the transport's: the body was not in by the deadline in the head, so no model
    # route ever saw the request; on a busy machine a tenth of the attack's can end so)
    excluded = sum(w["observed"].get("excluded", {}).get("short_deadline", 0) for w in windows)
    reached = sum(attacker.codes.values()) - attacker.codes.get(408, 0)
    assert excluded >= 0.8 * reached, (excluded, attacker.codes)
    # as does the stats route's sliding window (read while the attacker still sends; the good
    # client's load may have ended a moment before, so its window can hold no samples)
    assert live["excluded"].get("short_deadline", 0) > 0, live
    assert live["judged"] >= live["samples"], live


def test_tiny_deadlines_never_stop_a_broken_primary_from_being_rolled_back(
        broken: Up, tmp_path: Path) -> None:
    with StatusPoller(broken) as poller, TinyDeadlines(broken, "broken"):
        load(broken, "broken", tmp_path, rate=40, duration_s=7)
    windows = poller.ordered()
    status = poller.last
    assert status["activeModel"] == "fallback" and status["guard"]["state"] == "rolledBack"
    assert rollbacks(broken, "broken")["latency"] == 1.0
    assert_rolled_back_on_streak(windows, status)


class Oversized(Attacker):
    """Requests of ``maxQueueSize`` rows (256, the default; :func:`harness.attacks.oversized`):
    refused 429 ``queue_full`` whenever anything is queued, admitted (and run) only on an empty
    queue. Refusals never paint a window as overload; what is admitted is real work."""

    def __init__(self, up: Up, name: str, rate: float = 2.0) -> None:
        super().__init__(rate)
        self.url = f"{up.base}/v2/models/{name}/infer"
        self.body, self.headers = oversized(256)

    def send(self, client: httpx.Client, n: int) -> httpx.Response:
        return client.post(self.url, content=self.body, headers=self.headers)


def test_oversized_requests_never_stop_a_broken_primary_from_being_rolled_back(
        broken: Up, tmp_path: Path) -> None:
    with StatusPoller(broken) as poller, Oversized(broken, "broken") as attacker:
        load(broken, "broken", tmp_path, rate=40, duration_s=7)
    windows = poller.ordered()
    status = poller.last
    assert attacker.codes.get(200, 0) >= 2, attacker.codes  # the attack ran: admitted, deep queues
    assert status["activeModel"] == "fallback" and status["guard"]["state"] == "rolledBack", [
        (w["observed"], w["guard"]) for w in windows]
    assert rollbacks(broken, "broken")["latency"] == 1.0
    assert_rolled_back_on_streak(windows, status)


def test_oversized_requests_never_roll_back_a_healthy_primary(healthy: Up, tmp_path: Path) -> None:
    with StatusPoller(healthy) as poller, Oversized(healthy, "healthy") as attacker:
        answers = load(healthy, "healthy", tmp_path, rate=40, duration_s=10)
    windows = poller.ordered()
    # while an admitted oversized request fills the queue, others are refused 429: real load
    assert {a["status"] for a in answers} <= {200, 429}
    assert sum(a["status"] == 200 for a in answers) >= 0.8 * len(answers)
    assert sum(attacker.codes.values()) >= 10, attacker.codes
    judged = [w for w in windows if w["observed"]["samples"] >= 10]
    assert len(judged) >= 6, [w["observed"] for w in windows]
    assert all(w["activeModel"] == "primary" for w in windows)
    assert set(rollbacks(healthy, "healthy").values()) == {0.0}
