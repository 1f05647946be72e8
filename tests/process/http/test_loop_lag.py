"""``tailguard_event_loop_lag_seconds`` from a real runtime process: sampled while idle, and a
stall of the whole process shows in it with its length."""

from __future__ import annotations

import os
import signal
import time
from typing import Iterator

import pytest

from harness.runtime import RuntimeServer, batching, running_runtime, scrape
from tailguard_runtime.looplag import SAMPLE_INTERVAL_S
from tailguard_runtime.metrics import LOOP_LAG_BUCKETS_S

NAME = "lagged"


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RuntimeServer]:
    config = {"name": NAME, "batching": batching(),
              "models": [{"role": "primary", "uri": "builtin://iris/logistic-regression"}]}
    with running_runtime(config, tmp_path_factory.mktemp("lag")) as running:
        yield running


def lag_histogram(server: RuntimeServer) -> tuple[dict[float, float], float, float]:
    """Cumulative bucket counts by upper bound (s), the sample count and the sum (s)."""
    with server.client() as client:
        samples = scrape(client)
    labels = (("model", NAME),)
    buckets = {float(dict(lb)["le"]): value for (name, lb), value in samples.items()
               if name == "tailguard_event_loop_lag_seconds_bucket"
               and dict(lb)["model"] == NAME}
    return (buckets, samples[("tailguard_event_loop_lag_seconds_count", labels)],
            samples[("tailguard_event_loop_lag_seconds_sum", labels)])


def test_an_idle_runtime_samples_its_loop_every_20_ms(server: RuntimeServer) -> None:
    """One sample per interval of wall time, busy or not: a stall's missed samples are filled
    in when it ends, so the samples taken between two scrapes cover their time, plus the
    time before it of a stall that began earlier (at most the latest sample's lateness)."""
    earliest = time.monotonic()
    buckets, before, _ = lag_histogram(server)
    assert sorted(b for b in buckets if b != float("inf")) == sorted(LOOP_LAG_BUCKETS_S)
    started = time.monotonic()
    time.sleep(1.0)
    buckets_after, after, _ = lag_histogram(server)
    ended = time.monotonic()
    taken = after - before
    latest = min(b for b in buckets if buckets_after[b] - buckets[b] == taken)  # s, a bound
    assert (ended - started) / SAMPLE_INTERVAL_S / 2 <= taken, taken
    assert taken <= (ended - earliest + latest) / SAMPLE_INTERVAL_S + 2, (taken, latest)


def test_a_stalled_process_shows_its_stall_in_the_histogram(server: RuntimeServer) -> None:
    """SIGSTOP holds the whole process, its loop included, for 0.6 s: the timer due inside
    that time runs about 0.6 s late, past the 0.5 s bucket, and the samples it missed are
    filled in below it (about 30, one per 20 ms)."""
    buckets, count, total = lag_histogram(server)
    over_half_s = count - buckets[0.5]
    os.kill(server.proc.pid, signal.SIGSTOP)
    try:
        time.sleep(0.6)
    finally:
        os.kill(server.proc.pid, signal.SIGCONT)
    time.sleep(0.1)  # the late sample is taken as soon as the process runs again
    buckets_after, count_after, total_after = lag_histogram(server)
    assert count_after - buckets_after[0.5] - over_half_s >= 1
    assert count_after - count >= 25
    assert total_after - total >= 0.55 * 0.55 / 2 / SAMPLE_INTERVAL_S  # about 0.6 s * 30 / 2
    # not more than it was held: nothing past the 2.5 s bucket came of it
    assert count_after - buckets_after[2.5] == count - buckets[2.5]
