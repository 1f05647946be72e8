"""A forest classifier's ``predict_proba`` as one level-by-level pass over all of its trees.

scikit-learn's ``ForestClassifier.predict_proba`` converts ``X`` to float32, asks every tree
through joblib (``tree.predict_proba(X, check_input=False)``), sums the answers in tree order
into a float64 array and divides by the tree count. With ``n_jobs=1`` the per-tree calls are
most of the cost: each checks its input and walks its own tree in a ``nogil`` block, so a
200-tree forest gives the GIL away and takes it back at least 200 times per batch. Beside a
busy event loop every one of those hand-backs can wait: beside the hostile clients of
``bench/soak.py`` the model's p99 per batch went from 7.5 to 15 ms (``bench/README.md``).

Here the trees are stacked once, at load, into flat arrays, and a batch walks all ``(row,
tree)`` pairs together, one tree level per step: seven numpy calls a level whatever the tree
count. The arithmetic is scikit-learn's, in its order, so the result is identical bit for
bit (tested): the same float32 input, the same ``x <= threshold`` comparison in float64, the
leaf values summed tree by tree from zero (``np.cumsum``, which adds in sequence, not the
pairwise ``np.sum``) and divided by the tree count.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

CHUNK_CELLS = 1 << 20
"""At most this many ``(row, tree, class)`` cells are walked and summed at once (8 MiB of
float64); a larger batch goes in row chunks, so memory stays bounded for any forest."""


@dataclasses.dataclass(frozen=True)
class StackedForest:
    """The trees of a fitted single-output forest classifier, in flat arrays.

    Node ``k`` of the stack (tree after tree, in the forest's order) has the doubled id ``2k``,
    so that its child is ``children[2k + goes_right]`` in one lookup. A leaf is its own child,
    so a walk that reached it stays there for the remaining levels.

    Attributes:
        roots: ``(n_trees,)`` doubled ids of the trees' roots.
        children: ``(2 * n_nodes,)`` doubled id of the left (``2k``) and right (``2k + 1``)
            child of node ``k``.
        feature: ``(2 * n_nodes,)`` the feature node ``k`` splits on, at ``2k`` and ``2k + 1``
            (0 for a leaf, which does not look at it).
        threshold: ``(2 * n_nodes,)`` float64 split threshold, laid out as ``feature``.
        value: ``(n_nodes, n_classes)`` float64 what ``tree_.predict`` returns for a row that
            ends at node ``k``.
        depth: levels to walk: the deepest tree's ``max_depth``.
        n_features: columns of ``X``.
    """

    roots: np.ndarray
    children: np.ndarray
    feature: np.ndarray
    threshold: np.ndarray
    value: np.ndarray
    depth: int
    n_features: int


def stack_forest(forest: Any) -> StackedForest:
    """Stack the fitted trees of ``forest`` (a single-output ``RandomForestClassifier`` or
    ``ExtraTreesClassifier``).

    Raises:
        ValueError: ``forest`` has more than one output.
    """
    if getattr(forest, "n_outputs_", 1) != 1:
        raise ValueError(f"only single-output forests stack; this one has {forest.n_outputs_}")
    trees = [estimator.tree_ for estimator in forest.estimators_]
    n_classes = int(forest.n_classes_)
    sizes = np.array([tree.node_count for tree in trees], dtype=np.intp)
    offsets = np.concatenate([[0], np.cumsum(sizes)[:-1]]).astype(np.intp)
    first = np.repeat(offsets, sizes)  # each node's tree offset
    left = np.concatenate([tree.children_left for tree in trees]).astype(np.intp)
    right = np.concatenate([tree.children_right for tree in trees]).astype(np.intp)
    leaf = left < 0  # scikit-learn's TREE_LEAF is -1
    own = np.arange(len(left), dtype=np.intp)
    left = np.where(leaf, own, left + first)
    right = np.where(leaf, own, right + first)
    feature = np.where(leaf, 0, np.concatenate([tree.feature for tree in trees])).astype(np.intp)
    threshold = np.where(leaf, 0.0, np.concatenate([tree.threshold for tree in trees]))
    return StackedForest(
        roots=2 * offsets,
        children=2 * np.stack([left, right], axis=1).ravel(),
        feature=np.repeat(feature, 2),
        threshold=np.repeat(threshold.astype(np.float64), 2),
        value=np.ascontiguousarray(
            np.concatenate([tree.value[:, 0, :n_classes] for tree in trees]), dtype=np.float64),
        depth=max(int(tree.max_depth) for tree in trees),
        n_features=int(forest.n_features_in_))


def predict_proba(forest: StackedForest, x: np.ndarray) -> np.ndarray:
    """Class probabilities of ``x`` ``(n_rows, n_features)``: ``(n_rows, n_classes)`` float64,
    equal bit for bit to scikit-learn's ``predict_proba`` of the forest that was stacked.

    Raises:
        ValueError: ``x`` is not ``(n_rows, n_features)``, or holds values that are not
            finite in float32 (``1e39`` becomes ``inf``), as scikit-learn does.
    """
    if x.ndim != 2 or x.shape[1] != forest.n_features:
        raise ValueError(f"X has shape {x.shape}, but the forest expects "
                         f"{forest.n_features} features as input")
    with np.errstate(over="ignore"):  # overflow is reported just below, as sklearn does
        x32 = np.ascontiguousarray(x, dtype=np.float32)
    if not np.isfinite(x32).all():
        raise ValueError("Input contains infinity or a value too large for dtype('float32').")
    n_rows = x32.shape[0]
    n_trees, n_classes = forest.roots.shape[0], forest.value.shape[1]
    total = np.empty((n_rows, n_classes), dtype=np.float64)
    step = max(1, CHUNK_CELLS // (n_trees * n_classes))
    for start in range(0, n_rows, step):
        total[start:start + step] = _summed_leaves(forest, x32[start:start + step])
    total /= n_trees
    return total


def _summed_leaves(forest: StackedForest, x32: np.ndarray) -> np.ndarray:
    """Walk every ``(row, tree)`` pair of ``x32`` ``(n_rows, n_features)`` float32 to its leaf;
    return the leaf values summed over the trees in order, ``(n_rows, n_classes)`` float64."""
    cells = x32.astype(np.float64).ravel()  # exact; compared as the C code does, in float64
    row_start = np.arange(x32.shape[0], dtype=np.intp)[:, None] * forest.n_features
    node = np.repeat(forest.roots[None, :], x32.shape[0], axis=0)  # (n_rows, n_trees)
    for _ in range(forest.depth):
        goes_right = cells.take(forest.feature.take(node) + row_start) > forest.threshold.take(node)
        node = forest.children.take(node + goes_right)
    leaf_values = forest.value.take(node >> 1, axis=0)  # (n_rows, n_trees, n_classes)
    return np.cumsum(leaf_values, axis=1)[:, -1]
