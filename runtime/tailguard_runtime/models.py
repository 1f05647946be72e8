"""Model URIs, checksums, loading, and the one call the batcher makes per batch.

Four kinds of URI:

* ``file:///abs/path/model.joblib`` -- a scikit-learn estimator saved with ``joblib.dump``.
  An optional ``sha256`` is checked before the file is unpickled. A joblib file is code: load
  only files you trust.
* ``pvc://<claim>/<path>`` -- the same kind of file on a PersistentVolumeClaim, which the
  operator mounts read-only under ``$TAILGUARD_PVC_ROOT/<claim>`` (cluster only).
* ``https://host/path/model.joblib`` (``http://`` only to loopback or a ``*.svc`` host) -- the
  same kind of file, downloaded into a cache keyed by its required ``sha256`` and opened only
  once the checksum passed (:mod:`tailguard_runtime.sources`).
* ``builtin://<dataset>/<estimator>[?trees=N][&delayMs=N]`` -- a demo model trained
  deterministically at startup (``random_state=0``) on a dataset that ships inside scikit-learn
  (no download): datasets ``iris``, ``wine``, ``breast_cancer``, ``digits``; estimators
  ``logistic-regression`` and ``random-forest`` (``trees`` sets ``n_estimators``, default 100).
  ``delayMs`` (0 to 9999) adds a declared artificial delay of that many ms to every model call
  (one sleep per batch, not per row, holding no CPU), so a deliberately slow primary can be
  declared for tests and demos of the SLO guard.

Every failure is a :class:`~tailguard_runtime.errors.ModelLoadError` whose message starts with the
URI. Models run with ``n_jobs=1``; BLAS/OpenMP threads are limited by the server at startup.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import logging
import os
import re
import time
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable
from urllib.parse import parse_qs, unquote, urlsplit

import numpy as np

from tailguard_runtime import forests, sources
from tailguard_runtime.errors import InvalidInput, ModelLoadError
from tailguard_runtime.settings import DEFAULT_MAX_BYTES, PVC_ROOT_ENV
from tailguard_runtime.sources import FetchSettings
from tailguard_runtime.uris import URL_SCHEMES, shown

logger = logging.getLogger(__name__)

DATASETS = ("iris", "wine", "breast_cancer", "digits")
ESTIMATORS = ("logistic-regression", "random-forest")
MAX_TREES = 9999
MAX_DELAY_MS = 9999


@dataclass(frozen=True)
class OutputSpec:
    """One model output as the Open Inference Protocol describes it.

    ``shape`` is per request with ``-1`` for the row axis, e.g. ``[-1]`` or ``[-1, n_classes]``.
    """

    name: str
    datatype: str
    shape: tuple[int, ...]


@dataclass(frozen=True)
class Predictor:
    """A loaded model reduced to what serving needs.

    ``run(X)`` takes ``X`` of shape ``(n_rows, n_features)`` float64 and returns one array per
    output, each with ``n_rows`` as its first axis, in the order of ``outputs``. It raises
    whatever the estimator raises; the batcher isolates the offending rows.
    """

    uri: str
    n_features: int
    outputs: tuple[OutputSpec, ...]
    run: Callable[[np.ndarray], tuple[np.ndarray, ...]]
    classes: tuple[Any, ...] | None
    """The classifier's ``classes_``; ``None`` for a regressor."""
    estimator_type: str
    """The estimator's class name, for metadata and log lines."""
    input_limit: float | None = None
    """Largest ``|x|`` the estimator can take, or ``None`` for any finite float64: tree
    models compute in float32 (see :func:`float32_estimator`), where anything larger becomes
    infinite and the model raises. Checked per request by :func:`check_input_range`, before
    batching, so such a row never costs its batch-mates a bisection."""
    estimator: Any = dataclasses.field(default=None, repr=False, compare=False)
    """The fitted estimator itself (for ``tailguard report``'s model size); None if unknown."""
    feature_names: tuple[str, ...] | None = None
    """The estimator's ``feature_names_in_`` (set by scikit-learn when it was fitted on
    columns with string names), in its order; ``None`` when it has none. A v2 request may then
    send one tensor per feature, by name."""

    @functools.cached_property
    def output_names(self) -> tuple[str, ...]:
        """The names of ``outputs``, in order (computed once: the request path reads it)."""
        return tuple(o.name for o in self.outputs)


def load_model(uri: str, sha256: str | None = None, *, fast_forests: bool = True,
               max_bytes: int | None = None, fetch: FetchSettings | None = None) -> Predictor:
    """Load the model a URI names and wrap it as a :class:`Predictor`
    (``fast_forests``: see :func:`wrap_estimator`). A URL model is fetched first, at most
    ``max_bytes`` bytes (default :data:`~tailguard_runtime.settings.DEFAULT_MAX_BYTES`), with
    ``fetch`` (default :meth:`FetchSettings.from_env`).

    Raises:
        ModelLoadError: unknown scheme, dataset or estimator; missing file; checksum mismatch;
            a URL without ``sha256``; a file that is not a fitted estimator. The message
            starts with the URI (a URL's without its query string).
        ModelFetchError: a URL model could not be fetched (a ModelLoadError with a ``cause``).
    """
    parts = urlsplit(uri)
    delay_ms = 0
    if parts.scheme == "builtin":
        query = parse_qs(parts.query)
        delay_ms = _delay_ms(uri, query.pop("delayMs", None))
        estimator = _train_builtin(uri, parts.netloc, parts.path.strip("/"), query)
    elif parts.scheme == "file":
        estimator = _load_file(uri, Path(unquote(parts.path)), sha256)
    elif parts.scheme == "pvc":
        estimator = _load_file(uri, claim_path(uri, parts.netloc, unquote(parts.path)), sha256)
    elif parts.scheme in URL_SCHEMES:
        if not sha256:
            raise ModelLoadError(f"{shown(uri)}: a URL model needs its sha256 (a joblib file is "
                                 "code: it is opened only once its checksum passed)")
        path = sources.fetch(uri, sha256, DEFAULT_MAX_BYTES if max_bytes is None else max_bytes,
                             FetchSettings.from_env() if fetch is None else fetch)
        uri = shown(uri)
        estimator = _load_file(uri, path, None)  # fetch checked the checksum
    else:
        raise ModelLoadError(f"{uri}: unknown model URI scheme {parts.scheme!r}; expected "
                             "file:///path/model.joblib, pvc://claim/path/model.joblib, "
                             "https://host/path/model.joblib or builtin://<dataset>/<estimator>")
    predictor = wrap_estimator(uri, estimator, fast_forests=fast_forests)
    if delay_ms:
        predictor = dataclasses.replace(predictor, run=_delayed(predictor.run, delay_ms / 1000.0))
    return predictor


def _delay_ms(uri: str, raw: list[str] | None) -> int:
    if raw is None:
        return 0
    if not raw[-1].isdigit() or int(raw[-1]) > MAX_DELAY_MS:
        raise ModelLoadError(f"{uri}: delayMs must be an integer from 0 to {MAX_DELAY_MS}, "
                             f"got {raw[-1]!r}")
    return int(raw[-1])


def _delayed(run: Callable[[np.ndarray], tuple[np.ndarray, ...]],
             delay_s: float) -> Callable[[np.ndarray], tuple[np.ndarray, ...]]:
    """``run`` that first sleeps ``delay_s`` seconds (in the model thread, releasing the GIL)."""
    def slow_run(x: np.ndarray) -> tuple[np.ndarray, ...]:
        time.sleep(delay_s)
        return run(x)

    return slow_run


def forest_predict_proba(forest: Any) -> Callable[[np.ndarray], np.ndarray]:
    """``forest.predict_proba`` computed from its stacked trees, bit for bit
    (:mod:`tailguard_runtime.forests`).

    Small batches are several times faster than scikit-learn's tree-by-tree dispatch, also
    beside a thread holding the GIL (``benchmarks/forest_walk.py``; figures in
    ``benchmarks/README.md``). Above :data:`forests.WALK_MAX_ROW_LEVELS` row-levels the batch
    goes tree by tree, which is then faster.
    A multi-output forest keeps scikit-learn's own ``predict_proba``.

    ``X`` is ``(n_rows, n_features)``; the callable returns ``(n_rows, n_classes)`` float64.
    It raises ``ValueError`` for values that are not finite in float32, as scikit-learn does.
    """
    if getattr(forest, "n_outputs_", 1) != 1:
        return forest.predict_proba  # type: ignore[no-any-return]
    return functools.partial(forests.predict_proba, forests.stack_forest(forest))


FLOAT32_MAX = float(np.finfo(np.float32).max)


def float32_estimator(estimator: Any) -> bool:
    """Whether scikit-learn casts ``X`` to float32 before ``estimator`` sees it: its tree
    module's ``DTYPE`` is float32, so decision trees, random and extra-trees forests, gradient
    boosting and isolation forests all do (alone, or as the first step of a ``Pipeline``)."""
    from sklearn import ensemble, tree
    from sklearn.pipeline import Pipeline

    if isinstance(estimator, Pipeline) and estimator.steps:
        estimator = estimator.steps[0][1]
    kinds = (tree.DecisionTreeClassifier, tree.DecisionTreeRegressor, tree.ExtraTreeClassifier,
             tree.ExtraTreeRegressor, ensemble.RandomForestClassifier,
             ensemble.RandomForestRegressor, ensemble.ExtraTreesClassifier,
             ensemble.ExtraTreesRegressor, ensemble.GradientBoostingClassifier,
             ensemble.GradientBoostingRegressor, ensemble.IsolationForest)
    return isinstance(estimator, kinds)


def check_input_range(x: np.ndarray, predictor: Predictor, field: str) -> None:
    """Refuse rows the model cannot take: any ``|value|`` above ``predictor.input_limit``.

    ``x``: ``(n_rows, n_features)`` float64, already finite; ``field`` names the tensor in the
    message (``inputs[0]`` or ``instances``). Costs one pass over ``x``; nothing when the
    model has no limit.

    Raises:
        InvalidInput: 422 naming the first offending row and feature and the model's range.
    """
    limit = predictor.input_limit
    if limit is None or x.size == 0 or np.abs(x).max() <= limit:
        return
    row, col = np.argwhere(np.abs(x) > limit)[0]
    raise InvalidInput(f"{field}: row {row}, feature {col} is {x[row, col]:g}, beyond "
                       f"+/-{limit:g}: {predictor.estimator_type} computes in float32, where "
                       "that value is infinite")


def check_drop_in(primary: Predictor, fallback: Predictor) -> None:
    """Check that ``fallback`` can take ``primary``'s traffic unchanged.

    Raises:
        ModelLoadError: different feature counts, different classes, or a classifier paired
            with a regressor.
    """
    if primary.n_features != fallback.n_features:
        raise ModelLoadError(
            f"{fallback.uri}: fallback expects {fallback.n_features} features but the primary "
            f"{primary.uri} expects {primary.n_features}")
    if (primary.classes is None) != (fallback.classes is None):
        raise ModelLoadError(f"{fallback.uri}: fallback and primary {primary.uri} must both be "
                             "classifiers or both be regressors")
    if primary.classes != fallback.classes:
        raise ModelLoadError(f"{fallback.uri}: fallback classes {list(fallback.classes or [])} "
                             f"differ from the primary's {list(primary.classes or [])}")


def wrap_estimator(uri: str, estimator: Any, *, fast_forests: bool = True) -> Predictor:
    """Wrap a fitted scikit-learn estimator.

    For a forest classifier, ``predict`` is ``classes_[argmax(predict_proba)]`` (that is how
    scikit-learn's ``ForestClassifier.predict`` is defined), so both outputs come from one pass
    over the trees, and with ``fast_forests`` that pass is :func:`forest_predict_proba`. Other
    classifiers call ``predict`` and ``predict_proba`` separately.

    Raises:
        ModelLoadError: the object has no ``predict`` or is not fitted (no ``n_features_in_``).
    """
    if not callable(getattr(estimator, "predict", None)):
        raise ModelLoadError(f"{uri}: loaded object of type {type(estimator).__name__} is not a "
                             "scikit-learn estimator (it has no predict method)")
    n_features = getattr(estimator, "n_features_in_", None)
    if n_features is None:
        raise ModelLoadError(f"{uri}: estimator {type(estimator).__name__} is not fitted "
                             "(no n_features_in_)")
    _single_thread(estimator)
    limit = FLOAT32_MAX if float32_estimator(estimator) else None
    found = getattr(estimator, "feature_names_in_", None)
    names = (tuple(str(n) for n in found)
             if found is not None and len(found) == int(n_features) else None)
    if names is not None:  # the runtime always passes an array, in the model's own order
        warnings.filterwarnings("ignore", message="X does not have valid feature names",
                                category=UserWarning)
    classes = getattr(estimator, "classes_", None)
    if classes is None:
        def run(x: np.ndarray) -> tuple[np.ndarray, ...]:
            return (np.asarray(estimator.predict(x)),)
        return Predictor(uri, int(n_features), (OutputSpec("predict", "FP64", (-1,)),), run,
                         None, type(estimator).__name__, limit, estimator, names)

    classes = np.asarray(classes)
    label_type = _datatype(classes.dtype)
    outputs = [OutputSpec("predict", label_type, (-1,))]
    if hasattr(estimator, "predict_proba"):
        outputs.append(OutputSpec("predict_proba", "FP64", (-1, len(classes))))
        from sklearn.ensemble import ExtraTreesClassifier, RandomForestClassifier

        if isinstance(estimator, (RandomForestClassifier, ExtraTreesClassifier)):
            forest_proba = (forest_predict_proba(estimator) if fast_forests
                            else estimator.predict_proba)

            def run(x: np.ndarray) -> tuple[np.ndarray, ...]:
                proba = forest_proba(x)
                return classes.take(proba.argmax(axis=1)), proba
        else:
            def run(x: np.ndarray) -> tuple[np.ndarray, ...]:
                return np.asarray(estimator.predict(x)), estimator.predict_proba(x)
    else:
        def run(x: np.ndarray) -> tuple[np.ndarray, ...]:
            return (np.asarray(estimator.predict(x)),)
    return Predictor(uri, int(n_features), tuple(outputs), run, tuple(classes.tolist()),
                     type(estimator).__name__, limit, estimator, names)


def load_dataset(name: str) -> tuple[np.ndarray, np.ndarray]:
    """Return ``(X, y)`` of a dataset bundled with scikit-learn: X ``(n_rows, n_features)``
    float64, y ``(n_rows,)``.

    Raises:
        KeyError: unknown dataset name.
    """
    from sklearn import datasets

    loaders = {"iris": datasets.load_iris, "wine": datasets.load_wine,
               "breast_cancer": datasets.load_breast_cancer, "digits": datasets.load_digits}
    x, y = loaders[name](return_X_y=True)
    return np.asarray(x, dtype=np.float64), np.asarray(y)


def _train_builtin(uri: str, dataset: str, estimator: str, query: dict[str, list[str]]) -> Any:
    if dataset not in DATASETS:
        raise ModelLoadError(f"{uri}: unknown builtin dataset {dataset!r}; one of {list(DATASETS)}")
    if estimator not in ESTIMATORS:
        raise ModelLoadError(f"{uri}: unknown builtin estimator {estimator!r}; "
                             f"one of {list(ESTIMATORS)}")
    unknown = set(query) - {"trees"}
    if unknown or (estimator != "random-forest" and query):
        raise ModelLoadError(f"{uri}: unknown option(s) {sorted(query)}; only random-forest "
                             "takes ?trees=N, and any builtin model takes delayMs=N")
    x, y = load_dataset(dataset)
    if estimator == "random-forest":
        raw = query.get("trees", ["100"])[-1]
        if not raw.isdigit() or not 1 <= int(raw) <= MAX_TREES:
            raise ModelLoadError(f"{uri}: trees must be an integer from 1 to {MAX_TREES}, got {raw!r}")
        from sklearn.ensemble import RandomForestClassifier

        model: Any = RandomForestClassifier(n_estimators=int(raw), random_state=0, n_jobs=1)
    else:
        from sklearn.linear_model import LogisticRegression
        from sklearn.pipeline import make_pipeline
        from sklearn.preprocessing import StandardScaler

        model = make_pipeline(StandardScaler(), LogisticRegression(max_iter=2000))
    logger.info("training builtin model uri=%s rows=%d features=%d", uri, x.shape[0], x.shape[1])
    return model.fit(x, y)


CLAIM_NAME = re.compile(r"[a-z0-9]([-a-z0-9.]*[a-z0-9])?")
"""A PersistentVolumeClaim's name (a DNS-1123 subdomain, as the CRD's pattern has it)."""


def claim_path(uri: str, claim: str, path: str) -> Path:
    """The file ``pvc://CLAIM/PATH`` names: ``$TAILGUARD_PVC_ROOT/CLAIM/PATH``.

    Raises:
        ModelLoadError: no ``TAILGUARD_PVC_ROOT`` (``pvc://`` is for a cluster, where the
            operator mounts the claim), or a path that leaves the claim's folder.
    """
    root = os.environ.get(PVC_ROOT_ENV)
    if not root:
        raise ModelLoadError(f"{uri}: a pvc:// model loads in a cluster, where the operator "
                             f"mounts the claim ({PVC_ROOT_ENV} is not set); locally, name the "
                             "file with file:///abs/path.joblib")
    folder = Path(root) / claim
    found = Path(os.path.normpath(folder / path.lstrip("/")))
    if not CLAIM_NAME.fullmatch(claim) or not found.is_relative_to(folder) or found == folder:
        raise ModelLoadError(f"{uri}: the path must name a file inside the claim {claim!r}")
    return found


def _load_file(uri: str, path: Path, sha256: str | None) -> Any:
    if not path.is_absolute():
        raise ModelLoadError(f"{uri}: file URIs need an absolute path (file:///abs/path.joblib)")
    if not path.is_file():
        raise ModelLoadError(f"{uri}: no such file {path}")
    if sha256 is not None:
        digest = hashlib.sha256(path.read_bytes()).hexdigest()
        if digest != sha256.lower():
            raise ModelLoadError(f"{uri}: sha256 mismatch: expected {sha256.lower()}, file has {digest}")
    import joblib

    try:
        return joblib.load(path)
    except Exception as exc:  # a corrupt or foreign file can raise almost anything
        raise ModelLoadError(f"{uri}: cannot load with joblib: {type(exc).__name__}: {exc}") from exc


def _single_thread(estimator: Any) -> None:
    """Set every ``n_jobs`` parameter (nested ones too) to 1: one model thread per process."""
    get_params = getattr(estimator, "get_params", None)
    if get_params is None:
        return
    keys = {k: 1 for k in get_params(deep=True) if k == "n_jobs" or k.endswith("__n_jobs")}
    if keys:
        estimator.set_params(**keys)


def _datatype(dtype: np.dtype[Any]) -> str:
    if dtype.kind in "iu":
        return "INT64"
    if dtype.kind == "f":
        return "FP64"
    if dtype.kind == "b":
        return "BOOL"
    return "BYTES"
