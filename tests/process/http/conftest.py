"""Fixtures for the HTTP tests: models, and real runtime processes serving them.

* ``digits_server``: a RandomForestClassifier trained here on scikit-learn's digits and saved as
  a ``file://`` joblib with its sha256 (so tests compare the server's answers with the very object
  they hold, ``digits_model``), plus the builtin logistic-regression fallback. One per session.
* ``probe_server``: the misbehaving probe model (see :mod:`harness.runtime`), fresh per module.

The helpers themselves live in :mod:`harness.runtime`.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType
from typing import Any, Iterator

import joblib
import numpy as np
import pytest

from harness.runtime import (
    DIGITS_MAX_QUEUE,
    PROBE_MODULE,
    PROBE_SOURCE,
    RuntimeServer,
    batching,
    file_model,
    probe_runtime,
    running_runtime,
)

# -- models --------------------------------------------------------------------------------------


@pytest.fixture(scope="session")
def digits_data() -> tuple[np.ndarray, np.ndarray]:
    """scikit-learn's digits: X ``(1797, 64)`` float64, y ``(1797,)``."""
    from sklearn.datasets import load_digits

    x, y = load_digits(return_X_y=True)
    return np.asarray(x, dtype=np.float64), np.asarray(y)


@pytest.fixture(scope="session")
def digits_model(digits_data: tuple[np.ndarray, np.ndarray]) -> Any:
    """What ``builtin://digits/random-forest`` trains: 100 trees, random_state 0, one job."""
    from sklearn.ensemble import RandomForestClassifier

    x, y = digits_data
    return RandomForestClassifier(n_estimators=100, random_state=0, n_jobs=1).fit(x, y)


@pytest.fixture(scope="session")
def digits_model_path(tmp_path_factory: pytest.TempPathFactory, digits_model: Any) -> Path:
    path = tmp_path_factory.mktemp("digits-model") / "digits-rf.joblib"
    joblib.dump(digits_model, path)
    return path


@pytest.fixture(scope="session")
def probe_module(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[ModuleType, Path]]:
    """The probe model's module, written to a temporary folder and imported from there (and
    put on each probe server's ``PYTHONPATH``)."""
    folder = tmp_path_factory.mktemp("probe-module")
    path = folder / f"{PROBE_MODULE}.py"
    path.write_text(PROBE_SOURCE, encoding="utf-8")
    spec = importlib.util.spec_from_file_location(PROBE_MODULE, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[PROBE_MODULE] = module  # so that pickle finds the class by name
    try:
        spec.loader.exec_module(module)
        yield module, folder
    finally:
        sys.modules.pop(PROBE_MODULE, None)


# -- servers -------------------------------------------------------------------------------------


@pytest.fixture(scope="session")
def digits_server(tmp_path_factory: pytest.TempPathFactory,
                  digits_model_path: Path) -> Iterator[RuntimeServer]:
    """``digits``: the saved forest as primary, builtin logistic regression as fallback.

    ``maxQueueSize`` 1024 rows: the concurrent mixed-traffic test can have up to ~810 rows
    waiting at once, which must never be refused as a full queue.
    """
    config = {
        "name": "digits",
        "models": [file_model(digits_model_path),
                   {"role": "fallback", "uri": "builtin://digits/logistic-regression"}],
        "batching": batching(max_batch_size=32, max_wait_ms=0, max_queue_size=DIGITS_MAX_QUEUE,
                             timeout_ms=10_000),
        "drainGraceSeconds": 10,
    }
    with running_runtime(config, tmp_path_factory.mktemp("digits-server")) as server:
        yield server


@pytest.fixture(scope="module")
def probe_server(tmp_path_factory: pytest.TempPathFactory,
                 probe_module: tuple[ModuleType, Path]) -> Iterator[tuple[RuntimeServer, Any]]:
    """A fresh probe runtime per test module: maxBatchSize 8, queue 64 rows, 10 s deadline."""
    with probe_runtime(probe_module, tmp_path_factory.mktemp("probe-server"),
                       batching=batching(max_batch_size=8, max_queue_size=64)) as served:
        yield served
