"""Both protocols answer exactly what the model answers offline, under concurrent mixed traffic.

The server's primary is a forest the test trained and saved itself (``file://`` with its
sha256), so every prediction is compared with ``digits_model.predict``/``predict_proba`` on the
same rows of scikit-learn's digits.
"""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Iterator

import httpx
import numpy as np
import pytest

from harness.runtime import RuntimeServer, labels, scrape, v1_body, v2_body, v2_outputs

MAX_BATCH = 32  # the digits server's maxBatchSize

# (protocol, rows, nested v2 data): 1 row, several rows, exactly a batch, and more than a batch
# (chunked through the model in maxBatchSize pieces and reassembled)
MIX = [("v2", 1, False), ("v1", 1, False), ("v2", 5, True), ("v1", 7, False),
       ("v2", 32, False), ("v1", 33, False), ("v2", 70, False), ("v1", 100, False),
       ("v2", 2, True), ("v1", 3, False), ("v2", 12, False), ("v1", 1, False)] * 4


def _check_v2(doc: dict[str, Any], expected: tuple[np.ndarray, np.ndarray],
              request_id: str) -> None:
    assert doc["model_name"] == "digits"
    assert doc["model_version"] == "1"
    assert doc["id"] == request_id
    outputs = v2_outputs(doc)
    assert set(outputs) == {"predict", "predict_proba"}
    kinds = {o["name"]: o["datatype"] for o in doc["outputs"]}
    assert kinds == {"predict": "INT64", "predict_proba": "FP64"}
    labels_, proba = expected
    np.testing.assert_array_equal(outputs["predict"], labels_)
    assert outputs["predict_proba"].shape == proba.shape
    np.testing.assert_allclose(outputs["predict_proba"], proba, rtol=0, atol=1e-12)


def test_concurrent_mixed_traffic_matches_offline_predict(
        digits_server: RuntimeServer, digits_model: Any,
        digits_data: tuple[np.ndarray, np.ndarray]) -> None:
    x_all, _ = digits_data
    rng = np.random.default_rng(7)
    jobs = []
    for i, (protocol, rows, nested) in enumerate(MIX):
        start = int(rng.integers(0, x_all.shape[0] - rows))
        x = x_all[start:start + rows]
        # Offline answers computed here, not in the senders' threads: scikit-learn's forest
        # warns (an error here) when its joblib helper runs in a thread whose configuration
        # it has not propagated, which concurrent calls sometimes are.
        jobs.append((i, protocol, x, nested, (digits_model.predict(x),
                                              digits_model.predict_proba(x))))

    def send(client: httpx.Client,
             job: tuple[int, str, np.ndarray, bool, tuple[np.ndarray, np.ndarray]]) -> None:
        i, protocol, x, nested, expected = job
        if protocol == "v2":
            body = v2_body(x, nested=nested, id=f"req-{i}")
            r = client.post("/v2/models/digits/infer", json=body)
            assert r.status_code == 200, r.text
            _check_v2(r.json(), expected, f"req-{i}")
        else:
            r = client.post("/v1/models/digits:predict", json=v1_body(x))
            assert r.status_code == 200, r.text
            assert set(r.json()) == {"predictions"}
            np.testing.assert_array_equal(np.asarray(r.json()["predictions"]), expected[0])

    with digits_server.client(limits=httpx.Limits(max_connections=16)) as client:
        with ThreadPoolExecutor(max_workers=12) as pool:
            for done in [pool.submit(send, client, job) for job in jobs]:
                done.result()
        # a request larger than maxBatchSize was chunked: no model call ever saw more rows
        metrics = scrape(client)
    key = labels("digits")
    count = metrics[("tailguard_batch_size_rows_count", key)]
    assert count > 0
    assert metrics[("tailguard_batch_size_rows_bucket",
                    labels("digits", le=f"{float(MAX_BATCH)}"))] == count
    assert metrics[("tailguard_batch_size_rows_sum", key)] >= sum(rows for _, rows, _ in MIX)


def test_v2_requested_outputs_subset_is_honoured(
        digits_server: RuntimeServer, digits_model: Any,
        digits_data: tuple[np.ndarray, np.ndarray]) -> None:
    x = digits_data[0][100:104]
    with digits_server.client() as client:
        only_proba = client.post("/v2/models/digits/infer", json=v2_body(
            x, outputs=[{"name": "predict_proba"}]))
        only_label = client.post("/v2/models/digits/infer", json=v2_body(
            x, outputs=[{"name": "predict", "parameters": {"binary_data": False}}]))
    assert only_proba.status_code == 200, only_proba.text
    assert [o["name"] for o in only_proba.json()["outputs"]] == ["predict_proba"]
    np.testing.assert_allclose(v2_outputs(only_proba.json())["predict_proba"],
                               digits_model.predict_proba(x), rtol=0, atol=1e-12)
    assert only_label.status_code == 200, only_label.text
    assert [o["name"] for o in only_label.json()["outputs"]] == ["predict"]
    np.testing.assert_array_equal(v2_outputs(only_label.json())["predict"], digits_model.predict(x))
    assert "id" not in only_label.json()  # no id sent, none echoed


@pytest.mark.parametrize("datatype", ["FP32", "FP64", "INT64"])
def test_v2_accepts_every_numeric_datatype(
        digits_server: RuntimeServer, digits_model: Any,
        digits_data: tuple[np.ndarray, np.ndarray], datatype: str) -> None:
    # digits pixels are small integers, so all three datatypes carry them exactly
    x = digits_data[0][200:203]
    with digits_server.client() as client:
        r = client.post("/v2/models/digits/infer", json=v2_body(x, datatype=datatype, id="dt"))
    assert r.status_code == 200, r.text
    _check_v2(r.json(), (digits_model.predict(x), digits_model.predict_proba(x)), "dt")


def test_versioned_v2_path_serves_the_same_model(
        digits_server: RuntimeServer, digits_model: Any,
        digits_data: tuple[np.ndarray, np.ndarray]) -> None:
    x = digits_data[0][300:302]
    with digits_server.client() as client:
        r = client.post("/v2/models/digits/versions/1/infer", json=v2_body(x, id="versioned"))
        meta = client.get("/v2/models/digits")
        ready = client.get("/v2/models/digits/ready")
    assert r.status_code == 200, r.text
    _check_v2(r.json(), (digits_model.predict(x), digits_model.predict_proba(x)),
              "versioned")
    assert meta.status_code == 200
    doc = meta.json()
    assert doc["name"] == "digits" and doc["versions"] == ["1"]
    assert doc["inputs"] == [{"name": "input-0", "datatype": "FP64", "shape": [-1, 64]}]
    assert {o["name"]: o["shape"] for o in doc["outputs"]} == {"predict": [-1],
                                                                "predict_proba": [-1, 10]}
    assert ready.status_code == 200 and ready.json()["ready"] is True


def test_health_routes(digits_server: RuntimeServer) -> None:
    with digits_server.client() as client:
        live = client.get("/v2/health/live")
        ready = client.get("/v2/health/ready")
    assert live.status_code == 200 and live.json() == {"live": True}
    assert ready.status_code == 200 and ready.json() == {"ready": True}


def test_streamed_chunked_body_is_read_whole(
        digits_server: RuntimeServer, digits_model: Any,
        digits_data: tuple[np.ndarray, np.ndarray]) -> None:
    """A body sent with ``Transfer-Encoding: chunked`` (no Content-Length) arrives in pieces."""
    x = digits_data[0][600:650]
    rows = [json.dumps(row).encode() for row in x.tolist()]

    def pieces() -> Iterator[bytes]:
        yield b'{"instances": ['
        for i, row in enumerate(rows):
            yield (b", " if i else b"") + row
        yield b"]}"

    with digits_server.client() as client:
        r = client.post("/v1/models/digits:predict", content=pieces(),
                        headers={"content-type": "application/json"})
    assert r.status_code == 200, r.text
    np.testing.assert_array_equal(r.json()["predictions"], digits_model.predict(x))


def test_v1_answers_class_probabilities_when_asked(
        digits_server: RuntimeServer, digits_model: Any,
        digits_data: tuple[np.ndarray, np.ndarray]) -> None:
    x = digits_data[0][700:706]
    with digits_server.client() as client:
        labels_only = client.post("/v1/models/digits:predict", json=v1_body(x))
        asked = client.post("/v1/models/digits:predict", json={
            **v1_body(x), "parameters": {"probabilities": True}})
        refused = client.post("/v1/models/digits:predict", json={
            **v1_body(x), "parameters": {"probabilities": "yes"}})
    assert labels_only.status_code == 200 and asked.status_code == 200, asked.text
    np.testing.assert_array_equal(labels_only.json()["predictions"], digits_model.predict(x))
    assert set(asked.json()) == {"predictions"}
    np.testing.assert_allclose(asked.json()["predictions"], digits_model.predict_proba(x),
                               rtol=0, atol=1e-12)
    assert refused.status_code == 422
    assert refused.json() == {"error": "parameters.probabilities must be true or false, got "
                                       '"yes"'}


def test_kserve_listing_readiness_and_the_repository_index(
        digits_server: RuntimeServer) -> None:
    with digits_server.client() as client:
        v1_list, v2_list = client.get("/v1/models"), client.get("/v2/models")
        ready, unknown = client.get("/v1/models/digits"), client.get("/v1/models/iris")
        index = client.post("/v2/repository/index", json={})
        predict_by_get = client.get("/v1/models/digits:predict")
    assert v1_list.json() == v2_list.json() == {"models": ["digits"]}
    assert ready.status_code == 200 and ready.json() == {"name": "digits", "ready": True}
    assert unknown.status_code == 404 and "'iris' not found" in unknown.json()["error"]
    assert index.status_code == 200
    assert index.json() == [{"name": "digits", "version": "1", "state": "READY", "reason": ""}]
    assert predict_by_get.status_code == 405
