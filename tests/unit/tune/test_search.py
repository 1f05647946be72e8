"""How tune turns runs into a point: the sweep's rates, which run speaks for the point, the
points the CRD refuses, and where the rows come from."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from tailguard.bench.plan import LoadResult
from tailguard.bench.serving import Unusable, service_rows
from tailguard.spec.resource import load_file
from tailguard.tune.grid import Policy
from tailguard.tune.rawtable import RawRow
from tailguard.tune.search import SWEEP_START_RPS, point_result, point_spec, sweep_rates

TABLE = [RawRow(1, 9, 1.0, 1.0, 900), RawRow(8, 9, 1.0, 1.0, 420), RawRow(32, 9, 2.0, 2.0, 16_000)]


def run(rate: float, p99: float, ok: int = 100, sent: int = 100,
        invalid: list[str] | None = None) -> LoadResult:
    return LoadResult("open", rate, None, 1.0, 1, sent=sent, ok=ok,
                      latency_ms={"p50": p99 / 2, "p95": p99 * 0.9, "p99": p99},
                      invalid=invalid or [])


def test_rates_double_from_the_start_up_to_the_table_ceiling_at_that_batch() -> None:
    assert sweep_rates(TABLE, 1) == [25, 50, 100, 200, 400, 800]
    # batch 16 is not in the table: the ceiling is the nearest row below (batch 8)
    assert sweep_rates(TABLE, 16) == [25, 50, 100, 200, 400]
    assert sweep_rates(TABLE, 16, floor_rps=150) == [200, 400]
    assert sweep_rates(TABLE, 16, floor_rps=10_000) == [400]  # always one rate
    assert sweep_rates([RawRow(1, 5, 100.0, 100.0, 10)], 1) == [SWEEP_START_RPS]


def test_the_last_rate_that_held_speaks_for_the_point() -> None:
    point = point_result(Policy(8, 0), [run(25, 10), run(50, 20), run(100, 80)], slo_ms=50)
    assert point.meets_slo and point.throughput_rps == 100 and point.p99_ms == 20
    assert point.note == "100 req/s broke it"
    assert point.detail is not None and len(point.detail["runs"]) == 3
    assert "latencies_s" not in point.detail["runs"][0]


def test_a_point_that_never_held_says_why() -> None:
    slow = point_result(Policy(8, 0), [run(25, 80)], slo_ms=50)
    assert not slow.meets_slo and slow.note == "p99 80.0 ms over the 50 ms SLO"
    shed = point_result(Policy(8, 0), [run(25, 10, ok=90)], slo_ms=50)
    assert not shed.meets_slo and shed.note == "10 of 100 requests not answered 200"
    lagging = point_result(Policy(8, 0), [run(25, 80, invalid=["p99 schedule lag 3 ms"])], 50)
    assert not lagging.meets_slo and lagging.note == "p99 schedule lag 3 ms"
    after = point_result(Policy(8, 0), [run(25, 10), run(50, 80, invalid=["lag"])], 50)
    assert after.meets_slo and after.note == "50 req/s was not a valid run: lag"
    # a late generator only makes latencies longer: a point within the SLO holds all the same
    held = point_result(Policy(8, 0), [run(25, 10, invalid=["p99 schedule lag 3 ms"])], 50)
    assert held.meets_slo


SPEC = """\
apiVersion: tailguard.dev/v1alpha1
kind: InferenceService
metadata: {name: iris}
spec:
  model: {uri: builtin://iris/random-forest}
  fallback: {uri: builtin://iris/logistic-regression}
  slo: {p99LatencyMs: 50}
"""


def test_a_point_the_crd_refuses_is_refused_before_anything_is_served() -> None:
    text = point_spec(SPEC, Policy(16, 5))
    assert (load_file(text).batching.max_batch_size, load_file(text).batching.max_wait_ms) == (
        16, 5)
    with pytest.raises(Unusable, match="maxBatchSize=8 maxWaitMs=50 is refused for this spec: "
                                       "spec.batching"):
        point_spec(SPEC, Policy(8, 50))  # maxWaitMs must stay below the SLO


def test_rows_come_from_the_builtin_dataset_or_a_file_never_invented(tmp_path: Path) -> None:
    isvc = load_file(SPEC)
    rows, source = service_rows(isvc, None, 4)
    assert rows.shape == (150, 4) and "iris" in source
    filed = load_file(SPEC.replace("builtin://iris/random-forest", "file:///m.joblib"))
    with pytest.raises(Unusable, match="no rows to send; give --rows FILE"):
        service_rows(filed, None, 4)
    np.save(tmp_path / "rows.npy", np.ones((3, 4)))
    rows, source = service_rows(filed, str(tmp_path / "rows.npy"), 4)
    assert rows.shape == (3, 4) and source.endswith("rows.npy")
