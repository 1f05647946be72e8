"""Tabular inputs, one tensor per feature: a model that knows its feature names (scikit-learn's
``feature_names_in_``) takes a v2 request with one named tensor per column, in any order, and
answers exactly what it answers for the same rows as one tensor."""

from __future__ import annotations

import copy
from typing import Any, Iterator

import joblib
import numpy as np
import pytest

from harness.runtime import (
    RuntimeServer,
    batching,
    file_model,
    running_runtime,
    v2_body,
    v2_outputs,
)

NAMES = ["sepal_length", "sepal_width", "petal_length", "petal_width"]


@pytest.fixture(scope="module")
def named(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[RuntimeServer, Any, np.ndarray]]:
    """A runtime serving a logistic regression fitted on iris whose features are named
    :data:`NAMES` (as when fitted on a DataFrame), the same model without the names (what the
    test compares with: scikit-learn warns when named features come as an array), and the
    rows it was fitted on."""
    from sklearn.datasets import load_iris
    from sklearn.linear_model import LogisticRegression

    x, y = load_iris(return_X_y=True)
    model = LogisticRegression(max_iter=500).fit(x, y)
    unnamed = copy.deepcopy(model)
    model.feature_names_in_ = np.array(NAMES, dtype=object)
    workdir = tmp_path_factory.mktemp("named-features")
    path = workdir / "iris-named.joblib"
    joblib.dump(model, path)
    config = {"name": "iris", "models": [file_model(path),
                                         {"role": "fallback",
                                          "uri": "builtin://iris/logistic-regression"}],
              "batching": batching(max_batch_size=16, max_queue_size=256)}
    with running_runtime(config, workdir) as server:
        yield server, unnamed, x


def columns(x: np.ndarray, order: list[int], column_shape: bool = False) -> list[dict[str, Any]]:
    return [{"name": NAMES[j], "datatype": "FP64",
             "shape": [x.shape[0], 1] if column_shape else [x.shape[0]],
             "data": x[:, j].tolist()} for j in order]


def test_one_tensor_per_feature_in_any_order_answers_as_one_tensor(
        named: tuple[RuntimeServer, Any, np.ndarray]) -> None:
    server, model, x_all = named
    x = x_all[40:60]
    with server.client() as client:
        by_name = client.post("/v2/models/iris/infer", json={"inputs": columns(x, [3, 1, 0, 2])})
        mixed = client.post("/v2/models/iris/infer", json={
            "inputs": columns(x, [0, 1])[:1] + columns(x, [1, 2, 3], column_shape=True)})
        whole = client.post("/v2/models/iris/infer", json=v2_body(x))
        metadata = client.get("/v2/models/iris").json()
    assert metadata["parameters"]["feature_names"] == NAMES
    for reply in (by_name, mixed, whole):
        assert reply.status_code == 200, reply.text
        outputs = v2_outputs(reply.json())
        np.testing.assert_array_equal(outputs["predict"], model.predict(x))
        np.testing.assert_allclose(outputs["predict_proba"], model.predict_proba(x),
                                   rtol=0, atol=1e-12)


@pytest.mark.parametrize(("inputs", "needle"), [
    (lambda x: columns(x, [0, 1, 2]), "missing petal_width (the model's features: "
                                      "sepal_length, sepal_width, petal_length, petal_width)"),
    (lambda x: columns(x, [0, 1, 2, 3]) + [{**columns(x, [0])[0], "name": "colour"}],
     "unknown colour"),
    (lambda x: columns(x, [0, 1, 2, 3, 3]), "feature 'petal_width' is given twice"),
    (lambda x: columns(x, [0, 1, 2]) + columns(x[:3], [3]),
     "inputs (petal_width): 3 rows, but the first feature has 5"),
    (lambda x: columns(x, [0, 1, 2]) + [{**columns(x, [3])[0], "shape": [5, 2]}],
     "inputs (petal_width): shape must be [n_rows] or [n_rows, 1]"),
    (lambda x: columns(x, [0, 1, 2]) + [{**columns(x, [3])[0], "data": [1, 2, 3, 4, None]}],
     "inputs (petal_width).data: values must be numbers, got null"),
])
def test_named_tensors_that_do_not_fit_are_refused_with_the_names(
        named: tuple[RuntimeServer, Any, np.ndarray], inputs: Any, needle: str) -> None:
    server, _, x_all = named
    with server.client() as client:
        reply = client.post("/v2/models/iris/infer", json={"inputs": inputs(x_all[:5])})
    assert reply.status_code == 422, reply.text
    assert needle in reply.json()["error"]
