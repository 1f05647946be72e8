"""Both forest paths (the walk over stacked trees, tree by tree) against scikit-learn's own
predict_proba, bit for bit, and which path a batch takes."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from sklearn.ensemble import ExtraTreesClassifier, RandomForestClassifier

from tailguard_runtime import forests
from tailguard_runtime.models import load_dataset


def same_as_sklearn(forest: Any, rows: np.ndarray) -> None:
    stacked = forests.stack_forest(forest)
    assert np.array_equal(forests.predict_proba(stacked, rows), forest.predict_proba(rows))


@pytest.mark.parametrize("max_depth", [1, 3, None])
@pytest.mark.parametrize("cls", [RandomForestClassifier, ExtraTreesClassifier])
def test_any_depth_and_either_forest_kind(cls: type, max_depth: int | None) -> None:
    x, y = load_dataset("wine")
    forest = cls(n_estimators=25, max_depth=max_depth, random_state=1, n_jobs=1).fit(x, y)
    rng = np.random.default_rng(1)
    off_training = x * rng.uniform(0.5, 1.5, x.shape)  # where the trees disagree
    same_as_sklearn(forest, off_training)
    same_as_sklearn(forest, off_training[:1])


def test_a_tree_that_is_one_leaf_and_a_class_some_trees_never_saw() -> None:
    x, y = load_dataset("iris")
    y = np.where(np.arange(len(y)) == 0, 2, 0)  # one row of class 2, the rest class 0
    forest = RandomForestClassifier(n_estimators=20, random_state=0, n_jobs=1).fit(x, y)
    depths = {estimator.tree_.max_depth for estimator in forest.estimators_}
    assert 0 in depths and max(depths) > 0  # bootstraps without the odd row grew a bare leaf
    same_as_sklearn(forest, x)


def test_small_batches_are_walked_and_large_ones_go_tree_by_tree(
        monkeypatch: pytest.MonkeyPatch) -> None:
    x, y = load_dataset("digits")
    forest = RandomForestClassifier(n_estimators=10, random_state=0, n_jobs=1).fit(x, y)
    stacked = forests.stack_forest(forest)
    for rows in (x[:1], x[:40], x[:300]):  # both paths, whatever the batch size
        expected = forest.predict_proba(rows)
        assert np.array_equal(forests.walk(stacked, rows), expected)
        assert np.array_equal(forests.tree_by_tree(stacked, rows), expected)
    taken: list[str] = []
    for name in ("_walked", "_tree_by_tree"):
        real = getattr(forests, name)
        monkeypatch.setattr(forests, name, lambda f, x32, real=real, name=name: (
            taken.append(name), real(f, x32))[1])
    small = forests.WALK_MAX_ROW_LEVELS // stacked.depth
    same_as_sklearn(forest, x[:small])
    same_as_sklearn(forest, x[:small + 1])
    monkeypatch.setattr(forests, "WALK_MAX_CELLS", 10 * 10 * 3)  # 3 rows of 10 trees, 10 classes
    same_as_sklearn(forest, x[:3])
    same_as_sklearn(forest, x[:4])
    assert taken == ["_walked", "_tree_by_tree", "_walked", "_tree_by_tree"]


def test_bad_shapes_and_float32_overflow_are_refused_and_split_ties_match() -> None:
    x, y = load_dataset("iris")
    forest = RandomForestClassifier(n_estimators=15, random_state=0, n_jobs=1).fit(x, y)
    stacked = forests.stack_forest(forest)
    with pytest.raises(ValueError, match="too large for dtype"):
        forests.predict_proba(stacked, np.full((1, 4), 1e39))
    with pytest.raises(ValueError, match="expects 4 features"):
        forests.predict_proba(stacked, np.zeros((2, 5)))
    # Rows exactly on a split threshold, and one float32 step either side of it.
    root = forest.estimators_[0].tree_
    on = np.repeat(x[:1], 3, axis=0).astype(np.float32)
    feature, threshold = root.feature[0], np.float32(root.threshold[0])
    on[:, feature] = [np.nextafter(threshold, -np.inf), threshold, np.nextafter(threshold, np.inf)]
    same_as_sklearn(forest, on.astype(np.float64))


def test_thresholds_are_compared_in_float64_as_sklearn_does() -> None:
    """A split threshold that float32 rounds up: a row holding that float32 value goes right
    (it is above the float64 threshold), where a float32 comparison would send it left."""
    x, y = load_dataset("wine")
    forest = ExtraTreesClassifier(n_estimators=20, random_state=0, n_jobs=1).fit(x, y)
    stacked = forests.stack_forest(forest)
    rows = []
    for estimator in forest.estimators_:
        root = estimator.tree_
        threshold = root.threshold[0]
        if np.float32(threshold) > threshold:
            row = x[:1].copy()
            row[0, root.feature[0]] = float(np.float32(threshold))
            rows.append(row)
    assert rows, "no root threshold rounds up in float32"
    batch = np.concatenate(rows)
    assert np.array_equal(forests.walk(stacked, batch), forest.predict_proba(batch))
    assert np.array_equal(forests.tree_by_tree(stacked, batch), forest.predict_proba(batch))


def test_multi_output_forests_are_not_stacked() -> None:
    x, y = load_dataset("iris")
    forest = RandomForestClassifier(n_estimators=3, random_state=0).fit(x, np.stack([y, y], 1))
    with pytest.raises(ValueError, match="single-output"):
        forests.stack_forest(forest)
