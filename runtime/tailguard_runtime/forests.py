"""A forest classifier's ``predict_proba`` as one level-by-level pass over all of its trees.

scikit-learn's ``ForestClassifier.predict_proba`` converts ``X`` to float32, asks every tree
through joblib (``tree.predict_proba(X, check_input=False)``), sums the answers in tree order
into a float64 array and divides by the tree count. With ``n_jobs=1`` the per-tree calls are
most of the cost: each checks its input and walks its own tree in a ``nogil`` block, so a
200-tree forest gives the GIL away and takes it back at least 200 times per batch. Beside a
busy event loop every one of those hand-backs can wait: beside the hostile clients of
``benchmarks/soak.py`` the model's p99 per batch went from 7.5 to 15 ms (``benchmarks/README.md``).

Here the trees are stacked once, at load, into flat arrays, and a small batch walks all
``(row, tree)`` pairs together, one tree level per step: seven numpy calls a level whatever the
tree count. Every pair walks as many levels as the deepest tree has, so the walk's work grows
with rows times depth; above :data:`WALK_MAX_ROW_LEVELS` the batch goes tree by tree instead,
through each fitted tree's ``tree_.predict`` (scikit-learn's per-tree answer without its
per-tree checks), which is then the faster of the two. Either way the arithmetic is
scikit-learn's, in its order, so the result is identical bit for bit (tested): the same float32
input, the same ``x <= threshold`` comparison in float64, the leaf values summed tree by tree
from zero and divided by the tree count.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

WALK_MAX_ROW_LEVELS = 1024
"""The walk is used while rows times the deepest tree's depth is at most this; larger batches
go tree by tree. On the 200-tree digits forest (depth 17) the two cost the same at about 64
rows, so the walk wins below that and loses above it (``benchmarks/forest_walk.py``; figures in
``benchmarks/README.md``)."""

WALK_MAX_CELLS = 1 << 20
"""Nor is a batch walked whose ``(row, tree, class)`` leaf values would pass this many cells
(8 MiB of float64, and as much again for their running sum): a forest of thousands of shallow
trees goes tree by tree from fewer rows, so the walk's memory stays bounded."""


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
        trees: the fitted ``tree_`` objects, in order, for batches that go tree by tree.
    """

    roots: np.ndarray
    children: np.ndarray
    feature: np.ndarray
    threshold: np.ndarray
    value: np.ndarray
    depth: int
    n_features: int
    trees: tuple[Any, ...]


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
        n_features=int(forest.n_features_in_),
        trees=tuple(trees))


def predict_proba(forest: StackedForest, x: np.ndarray) -> np.ndarray:
    """Class probabilities of ``x`` ``(n_rows, n_features)``: ``(n_rows, n_classes)`` float64,
    equal bit for bit to scikit-learn's ``predict_proba`` of the forest that was stacked. A
    batch of rows times depth up to :data:`WALK_MAX_ROW_LEVELS` (and of at most
    :data:`WALK_MAX_CELLS` leaf values) is walked (:func:`walk`), a larger one goes tree by
    tree (:func:`tree_by_tree`). Unlike scikit-learn, 0 rows give a
    ``(0, n_classes)`` array rather than an error.

    Raises:
        ValueError: ``x`` is not ``(n_rows, n_features)``, or holds NaN or values that are not
            finite in float32 (``1e39`` becomes ``inf``); scikit-learn refuses the latter too.
    """
    x32 = _checked_float32(forest, x)
    rows = x32.shape[0]
    if rows * forest.depth <= WALK_MAX_ROW_LEVELS and \
            rows * forest.value.shape[1] * len(forest.trees) <= WALK_MAX_CELLS:
        return _walked(forest, x32)
    return _tree_by_tree(forest, x32)


def walk(forest: StackedForest, x: np.ndarray) -> np.ndarray:
    """:func:`predict_proba` by the level-by-level walk whatever the batch size (for tests and
    ``benchmarks/forest_walk.py``); same shapes and errors."""
    return _walked(forest, _checked_float32(forest, x))


def tree_by_tree(forest: StackedForest, x: np.ndarray) -> np.ndarray:
    """:func:`predict_proba` tree by tree whatever the batch size (for tests and
    ``benchmarks/forest_walk.py``); same shapes and errors."""
    return _tree_by_tree(forest, _checked_float32(forest, x))


def _checked_float32(forest: StackedForest, x: np.ndarray) -> np.ndarray:
    if x.ndim != 2 or x.shape[1] != forest.n_features:
        raise ValueError(f"X has shape {x.shape}, but the forest expects "
                         f"{forest.n_features} features as input")
    with np.errstate(over="ignore"):  # overflow is reported just below, as sklearn does
        x32 = np.ascontiguousarray(x, dtype=np.float32)
    if not np.isfinite(x32).all():
        raise ValueError("Input contains NaN, infinity or a value too large for "
                         "dtype('float32').")
    return x32


def _tree_by_tree(forest: StackedForest, x32: np.ndarray) -> np.ndarray:
    n_classes = forest.value.shape[1]
    total = np.zeros((x32.shape[0], n_classes), dtype=np.float64)
    for tree in forest.trees:
        total += tree.predict(x32)[:, :n_classes]
    total /= len(forest.trees)
    return total


def _walked(forest: StackedForest, x32: np.ndarray) -> np.ndarray:
    """Walk every ``(row, tree)`` pair of ``x32`` ``(n_rows, n_features)`` float32 to its leaf;
    return the leaf values summed over the trees in order, divided by the tree count."""
    cells = x32.astype(np.float64).ravel()  # exact; compared as the C code does, in float64
    row_start = np.arange(x32.shape[0], dtype=np.intp)[:, None] * forest.n_features
    node = np.repeat(forest.roots[None, :], x32.shape[0], axis=0)  # (n_rows, n_trees)
    for _ in range(forest.depth):
        goes_right = cells.take(forest.feature.take(node) + row_start) > forest.threshold.take(node)
        node = forest.children.take(node + goes_right)
    leaf_values = forest.value.take(node >> 1, axis=0)  # (n_rows, n_trees, n_classes)
    total = np.cumsum(leaf_values, axis=1)[:, -1]  # in sequence, as scikit-learn adds
    total /= len(forest.trees)
    return total
