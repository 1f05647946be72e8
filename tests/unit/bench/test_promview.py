"""The server's view of a load test from two reads of /metrics (tailguard.bench.promview):
pages written by prometheus_client itself, with the runtime's metric names and labels, summed
over roles and differenced between the reads."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest

from tailguard.bench.promview import bucket_quantile, parse_snapshot, server_view

LABELS = ["model", "version", "role"]


def test_two_reads_give_what_the_server_saw_in_between_summed_over_roles() -> None:
    registry = CollectorRegistry()
    requests = Counter("tailguard_requests", "", LABELS + ["code"], registry=registry)
    rejections = Counter("tailguard_rejections", "", LABELS + ["reason"], registry=registry)
    rows = Histogram("tailguard_batch_size_rows", "", LABELS, buckets=(1, 2, 4, 8, 16, 32),
                     registry=registry)
    wait = Histogram("tailguard_queue_wait_seconds", "", LABELS,
                     buckets=(0.001, 0.002, 0.005, 0.01, 0.05), registry=registry)
    model = Histogram("tailguard_batch_duration_seconds", "", LABELS,
                      buckets=(0.001, 0.002, 0.005, 0.01, 0.05), registry=registry)
    answered = Histogram("tailguard_request_duration_seconds", "", LABELS,
                         buckets=(0.005, 0.01, 0.02, 0.05), registry=registry)
    lag = Histogram("tailguard_event_loop_lag_seconds", "", ["model"],
                    buckets=(0.001, 0.002, 0.005, 0.01, 0.05), registry=registry)
    lag.labels("d").observe(0.5)  # before the window: never counted
    primary, fallback = ("d", "1", "primary"), ("d", "1", "fallback")
    requests.labels(*primary, "200").inc(7)  # before the window: never counted
    rows.labels(*primary).observe(30)
    before = parse_snapshot(generate_latest(registry).decode())

    requests.labels(*primary, "200").inc(90)
    requests.labels(*fallback, "200").inc(10)
    requests.labels(*primary, "429").inc(5)
    rejections.labels(*primary, "queue_full").inc(5)
    for size in (1, 3, 3, 8):
        rows.labels(*primary).observe(size)
    rows.labels(*fallback).observe(16)
    for seconds in [0.0005] * 98 + [0.004, 0.04]:
        wait.labels(*primary).observe(seconds)
    for seconds in (0.0015, 0.0015, 0.0015, 0.0015, 0.008):
        model.labels(*primary).observe(seconds)
    for seconds in [0.004] * 95 + [0.03] * 5:
        answered.labels(*primary).observe(seconds)
    for seconds in [0.0008] * 150 + [0.0015] * 48 + [0.004, 0.03]:
        lag.labels("d").observe(seconds)
    after = parse_snapshot(generate_latest(registry).decode())

    view = server_view(before, after)
    assert view["requests"] == {"200": 100, "429": 5}
    assert view["rejections"] == {"queue_full": 5}
    assert view["batches"] == 5
    assert view["batch_rows"] == {"mean": 6.2, "p50": 4.0, "p99": 16.0,
                                  "buckets": {"1": 1, "4": 2, "8": 1, "16": 1}}
    assert view["queue_wait_p99_ms"] == 5.0  # 99 of 100 waits are at most 5 ms
    assert view["request_p99_ms"] == 50.0  # 5 of 100 answers took 30 ms: the 50 ms bucket
    assert view["model_ms_per_batch"] == {"mean": 2.8, "p99": 10.0}
    # 198 of 200 samples at most 2 ms, the 199th in the 5 ms bucket, the last in the 50 ms one
    assert view["event_loop_lag_ms"] == {"samples": 200, "p50": 1.0, "p99": 2.0, "max": 50.0}


def test_an_empty_window_and_bucket_edges() -> None:
    registry = CollectorRegistry()
    Histogram("tailguard_batch_size_rows", "", LABELS, buckets=(1, 2), registry=registry)
    page = parse_snapshot(generate_latest(registry).decode())
    view = server_view(page, page)
    assert view["batches"] == 0 and view["batch_rows"]["mean"] is None
    assert view["queue_wait_p99_ms"] is None and view["requests"] == {}
    assert view["request_p99_ms"] is None
    assert view["event_loop_lag_ms"] == {"samples": 0, "p50": None, "p99": None, "max": None}


def test_a_lag_past_the_last_bucket_reads_plus_inf_not_none() -> None:
    registry = CollectorRegistry()
    lag = Histogram("tailguard_event_loop_lag_seconds", "", ["model"], buckets=(0.001, 1.0),
                    registry=registry)
    before = parse_snapshot(generate_latest(registry).decode())
    for seconds in [0.0005] * 99 + [30.0]:
        lag.labels("d").observe(seconds)
    view = server_view(before, parse_snapshot(generate_latest(registry).decode()))
    assert view["event_loop_lag_ms"] == {"samples": 100, "p50": 1.0, "p99": 1.0, "max": "+Inf"}
    assert bucket_quantile([(1.0, 0.0), (float("inf"), 0.0)], 0.99) is None
    assert bucket_quantile([(1.0, 0.0), (float("inf"), 3.0)], 0.5) == float("inf")
