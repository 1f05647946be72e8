"""End to end: the SLO guard inside a real `tailguard up` process, under bounded open-loop load
from a separate process (`tailguard bench`, with one record per request), on 127.0.0.1 only.

Windows are 1 s long so the suite stays fast. The only time bound asserted is the guard's own
promise (rolled back within breachWindows x windowSeconds + 2 s of the end of the first breached
window), read from the guard's own timestamps.
"""

from __future__ import annotations

import re
import subprocess
import time
from pathlib import Path
from typing import Iterator

import pytest

from harness.guard import (
    StatusPoller,
    assert_rolled_back_on_streak,
    busy_spec,
    forest_spec,
    load,
    rollbacks,
    serving,
    stamp,
)
from harness.up import ROOT, TAILGUARD, Up

SLOW_PRIMARY = forest_spec("guarded", delay_ms=300)
FAST_PRIMARY = busy_spec()


@pytest.fixture
def slow(tmp_path: Path) -> Iterator[Up]:
    with serving(tmp_path, "slow", SLOW_PRIMARY) as server:
        yield server


@pytest.fixture
def busy(tmp_path: Path) -> Iterator[Up]:
    with serving(tmp_path, "busy", FAST_PRIMARY) as server:
        yield server


def test_a_primary_too_slow_for_its_slo_is_rolled_back_on_its_own(slow: Up, tmp_path: Path) -> None:
    with StatusPoller(slow) as poller:
        answers = load(slow, "guarded", tmp_path, rate=40, duration_s=7)
    windows = poller.ordered()

    # no admitted request failed during the switch (nor was any refused at this load)
    assert answers and {a["status"] for a in answers} == {200}
    # it was rolled back, by the guard, once, for latency
    status = poller.last
    assert status["activeModel"] == "fallback" and status["guard"]["state"] == "rolledBack"
    assert rollbacks(slow, "guarded") == {"latency": 1.0, "deadline": 0.0, "errors": 0.0}
    printed = "".join(slow.printed)
    assert "guarded: automatic rollback to the fallback: the primary breaks the SLO (p99=" in printed
    assert "2 windows in a row" in printed
    assert re.search(r"guarded: active=primary p99=[\d.]+ms/150ms .* guard=", printed)
    assert "guard=rolled back" in printed
    # within breachWindows x windowSeconds + 2 s of the end of the first breached window
    rolled_at = stamp(status["guard"]["rolledBackAt"])
    first_breach_end = rolled_at - assert_rolled_back_on_streak(windows, status)
    # the next windows are the fallback's, and its p99 is back under the SLO: in the first
    # (a machine busy with another suite stalled one to 500 ms, so a later one may be the first)
    after = [w for w in windows if stamp(w["observed"]["windowEnd"]) > rolled_at]
    assert after and all(w["observed"]["role"] == "fallback" for w in after)
    met = [w for w in after if w["observed"]["samples"] >= 10 and w["observed"]["p99Ms"] <= 150]
    assert met, [w["observed"] for w in after]
    assert {c["type"]: c["status"] for c in met[0]["conditions"]} == {"SLOMet": "True",
                                                                      "RolledBack": "True"}
    # answers name the model: the primary before the first breach, the fallback after the switch
    assert {a["role"] for a in answers if a["done"] < first_breach_end - 1} <= {"primary"}
    late = [a["role"] for a in answers if a["sent"] > rolled_at + 0.5]
    assert len(late) > 20 and set(late) == {"fallback"}

    # `tailguard status` shows what the guard saw
    done = subprocess.run([*TAILGUARD, "status", "guarded", "--port", str(slow.port)],
                          capture_output=True, text=True, timeout=30, cwd=ROOT)
    assert done.returncode == 0, done.stderr
    assert "SLO guard: rolledBack: rolled back automatically (the primary breaks the SLO" in \
        done.stdout

    # an explicit roll-forward re-arms the guard: the primary is judged again, and rolled back again
    done = subprocess.run([*TAILGUARD, "rollforward", "guarded", "--port", str(slow.port)],
                          capture_output=True, text=True, timeout=30, cwd=ROOT)
    assert done.returncode == 0, done.stderr
    with StatusPoller(slow) as poller:
        answers = load(slow, "guarded", tmp_path, rate=40, duration_s=7)
    assert {a["status"] for a in answers} == {200}
    assert "rolled forward by hand: traffic on the primary, the SLO guard is re-armed" in "".join(
        slow.printed)
    assert poller.last["activeModel"] == "fallback"
    assert rollbacks(slow, "guarded")["latency"] == 2.0


def test_idle_and_overload_never_roll_back(busy: Up, tmp_path: Path) -> None:
    # idle: several windows without traffic are Unknown, never a breach
    with StatusPoller(busy) as poller:
        deadline = time.monotonic() + 30  # three 1 s windows, or a busy machine's few more
        while len(poller.windows) < 3 and time.monotonic() < deadline:
            time.sleep(0.1)
    idle = poller.ordered()
    assert len(idle) >= 2
    for window in idle:
        assert window["guard"]["state"] == "idle" and window["activeModel"] == "primary"
        assert {c["type"]: (c["status"], c["reason"]) for c in window["conditions"]}["SLOMet"] == (
            "Unknown", "InsufficientData")

    # a primary fast for its SLO (40 ms calls, 200 ms SLO) but of small capacity (one row per
    # call: about 24 req/s), offered 4x that for several windows. The capacity is small so that
    # the generator outruns it even on a busy 2-core machine.
    with StatusPoller(busy) as poller:
        answers = load(busy, "busy", tmp_path, rate=100, duration_s=8)
    windows = poller.ordered()
    codes = {a["status"] for a in answers}
    assert 429 in codes and 200 in codes and codes <= {200, 429}  # it shed load, nothing failed
    assert sum(w["guard"]["state"] == "overload" for w in windows) >= 2
    seen = [(w["observed"]["role"], w["guard"]["state"], w["guard"].get("lastDecisionReason"))
            for w in windows]
    assert all(w["activeModel"] == "primary" for w in windows), seen
    assert poller.last["guard"].get("rolledBackAt") is None
    assert set(rollbacks(busy, "busy").values()) == {0.0}
    assert "automatic rollback" not in "".join(busy.printed)
    assert {a["role"] for a in answers if a["status"] == 200} == {"primary"}
