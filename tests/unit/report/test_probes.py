"""The report's probes build bodies the runtime accepts: real v2 JSON, within the body limit."""

from __future__ import annotations

import json

import numpy as np

from tailguard.report.probes import BODY_BYTES, rows_of, rows_within_body, v2_body


def test_bodies_stay_under_the_limit_for_any_queue_size() -> None:
    assert rows_within_body(512, 64) == 512
    big = rows_within_body(1_000_000, 64)
    assert big < 1_000_000
    rows = np.random.default_rng(0).random((10, 64)) * 1e6  # long decimals
    assert len(v2_body(rows_of(rows, big))) < 2 * BODY_BYTES
    assert rows_within_body(5, 10**9) == 1


def test_a_v2_body_carries_the_rows_and_parameters() -> None:
    rows = np.arange(6, dtype=np.float64).reshape(3, 2)
    doc = json.loads(v2_body(rows_of(rows, 4), timeout=1))
    assert doc["inputs"][0]["shape"] == [4, 2] and doc["inputs"][0]["datatype"] == "FP64"
    assert doc["inputs"][0]["data"] == [0, 1, 2, 3, 4, 5, 0, 1]
    assert doc["parameters"] == {"timeout": 1}
