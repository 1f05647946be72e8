"""The reference model of the benchmark, built the same way everywhere.

``RandomForestClassifier(n_estimators=100, random_state=0)`` trained on 2,000 rows of 20
standard-normal features drawn with ``np.random.default_rng(0)``, label ``x0 + x1 > 0``. Only
numpy, scikit-learn and joblib are needed, so a peer's virtual environment can import this file
too (``python benchmarks/refmodel.py OUT.joblib``).
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import numpy as np

N_TRAIN_ROWS = 2000
N_FEATURES = 20
N_TREES = 100


def training_data(n_rows: int = N_TRAIN_ROWS, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Return ``(x, y)``: ``x`` of shape ``(n_rows, 20)`` float64 standard normal, ``y`` of shape
    ``(n_rows,)`` int64 with ``y = x0 + x1 > 0``."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((n_rows, N_FEATURES))
    y = (x[:, 0] + x[:, 1] > 0).astype(np.int64)
    return x, y


def sample_rows(n_rows: int, seed: int = 1) -> np.ndarray:
    """Rows to send or predict: shape ``(n_rows, 20)`` float64, same distribution as training,
    a different seed than training."""
    return np.random.default_rng(seed).standard_normal((n_rows, N_FEATURES))


def build_model() -> Any:
    """Train and return the fitted reference forest (``n_jobs=1``); about 1-2 s on one core."""
    from sklearn.ensemble import RandomForestClassifier

    x, y = training_data()
    return RandomForestClassifier(n_estimators=N_TREES, random_state=0, n_jobs=1).fit(x, y)


def write_model(path: str | Path) -> Path:
    """Train the reference model and save it with ``joblib.dump`` to ``path``; returns the
    absolute path (serve it as ``file://`` + that path)."""
    import joblib

    path = Path(path).resolve()
    path.parent.mkdir(parents=True, exist_ok=True)
    joblib.dump(build_model(), path)
    return path


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: python benchmarks/refmodel.py OUT.joblib")
    print(write_model(sys.argv[1]))
