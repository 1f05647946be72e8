"""Model URIs: builtin training, file loading, checksums, and the fallback drop-in check."""

from __future__ import annotations

import hashlib
from pathlib import Path

import joblib
import numpy as np
import pytest
from sklearn.ensemble import RandomForestClassifier
from sklearn.linear_model import LinearRegression

from tailguard_runtime.errors import ModelLoadError
from tailguard_runtime.models import check_drop_in, load_dataset, load_model, wrap_estimator


def test_builtin_forest_outputs_equal_sklearn_predict() -> None:
    x, y = load_dataset("iris")
    predictor = load_model("builtin://iris/random-forest?trees=20")
    reference = RandomForestClassifier(n_estimators=20, random_state=0, n_jobs=1).fit(x, y)
    labels, proba = predictor.run(x)
    np.testing.assert_array_equal(labels, reference.predict(x))
    np.testing.assert_allclose(proba, reference.predict_proba(x))
    assert predictor.n_features == 4 and predictor.classes == (0, 1, 2)
    assert [o.name for o in predictor.outputs] == ["predict", "predict_proba"]


def test_file_model_with_checksum_loads(tmp_path: Path) -> None:
    x, y = load_dataset("wine")
    path = tmp_path / "m.joblib"
    joblib.dump(RandomForestClassifier(n_estimators=5, random_state=0).fit(x, y), path)
    digest = hashlib.sha256(path.read_bytes()).hexdigest()
    predictor = load_model(f"file://{path}", digest)
    assert predictor.n_features == 13


@pytest.mark.parametrize("uri, needle", [
    ("s3://bucket/model.joblib", "unknown model URI scheme 's3'"),
    ("builtin://mnist/random-forest", "unknown builtin dataset 'mnist'"),
    ("builtin://iris/svm", "unknown builtin estimator 'svm'"),
    ("builtin://iris/random-forest?trees=0", "trees must be an integer"),
    ("builtin://iris/logistic-regression?trees=3", "only random-forest takes ?trees=N"),
    ("file:///nonexistent/model.joblib", "no such file"),
])
def test_bad_uris_fail_with_one_line_naming_the_uri(uri: str, needle: str) -> None:
    with pytest.raises(ModelLoadError) as info:
        load_model(uri)
    assert info.value.message.startswith(uri) and needle in info.value.message


def test_checksum_mismatch_and_non_estimators_are_refused(tmp_path: Path) -> None:
    path = tmp_path / "not-a-model.joblib"
    joblib.dump({"weights": [1, 2, 3]}, path)
    with pytest.raises(ModelLoadError, match="sha256 mismatch"):
        load_model(f"file://{path}", "0" * 64)
    with pytest.raises(ModelLoadError, match="not a scikit-learn estimator"):
        load_model(f"file://{path}")
    garbage = tmp_path / "garbage.joblib"
    garbage.write_bytes(b"this is not a pickle")
    with pytest.raises(ModelLoadError, match="cannot load with joblib"):
        load_model(f"file://{garbage}")
    with pytest.raises(ModelLoadError, match="not fitted"):
        wrap_estimator("file:///unfitted", RandomForestClassifier())


def test_fallback_must_be_a_drop_in() -> None:
    digits = load_model("builtin://digits/logistic-regression")
    iris = load_model("builtin://iris/logistic-regression")
    with pytest.raises(ModelLoadError, match="expects 4 features"):
        check_drop_in(digits, iris)
    x, y = load_dataset("iris")
    regressor = wrap_estimator("file:///reg", LinearRegression().fit(x, y.astype(float)))
    with pytest.raises(ModelLoadError, match="both be classifiers or both be regressors"):
        check_drop_in(iris, regressor)
    two_classes = wrap_estimator("file:///two", RandomForestClassifier(n_estimators=2).fit(
        x[y < 2], y[y < 2]))
    with pytest.raises(ModelLoadError, match="classes"):
        check_drop_in(iris, two_classes)
    check_drop_in(iris, load_model("builtin://iris/random-forest?trees=5"))


@pytest.mark.parametrize("forest_type", ["random", "extra"])
def test_fast_forest_path_is_bit_for_bit_sklearns(forest_type: str) -> None:
    from sklearn.ensemble import ExtraTreesClassifier

    from tailguard_runtime.models import forest_predict_proba

    x, y = load_dataset("digits")
    cls = RandomForestClassifier if forest_type == "random" else ExtraTreesClassifier
    forest = cls(n_estimators=30, random_state=0, n_jobs=1).fit(x, y)
    fast = forest_predict_proba(forest)
    rng = np.random.default_rng(0)
    noisy = x + rng.normal(0, 3, x.shape)  # off the training set, where trees disagree
    for rows in (x[:1], x[:64], noisy[:257]):
        assert np.array_equal(fast(rows), forest.predict_proba(rows))
    labels, proba = wrap_estimator("file:///f", forest).run(noisy)
    assert np.array_equal(labels, forest.predict(noisy))
    with pytest.raises(ValueError, match="too large for dtype"):
        fast(np.full((1, 64), 1e39))
    with pytest.raises(ValueError), np.errstate(over="ignore"):
        forest.predict_proba(np.full((1, 64), 1e39))  # sklearn refuses the same input


def test_a_claim_model_is_read_below_its_claims_mount(tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    x, y = load_dataset("iris")
    (tmp_path / "models" / "v2").mkdir(parents=True)
    path = tmp_path / "models" / "v2" / "forest.joblib"
    joblib.dump(RandomForestClassifier(n_estimators=3, random_state=0).fit(x, y), path)
    digest = hashlib.sha256(path.read_bytes()).hexdigest()
    monkeypatch.delenv("TAILGUARD_PVC_ROOT", raising=False)
    with pytest.raises(ModelLoadError, match="loads in a cluster.*TAILGUARD_PVC_ROOT"):
        load_model("pvc://models/v2/forest.joblib", digest)
    monkeypatch.setenv("TAILGUARD_PVC_ROOT", str(tmp_path))
    assert load_model("pvc://models/v2/forest.joblib", digest).n_features == 4
    with pytest.raises(ModelLoadError, match="sha256 mismatch"):
        load_model("pvc://models/v2/forest.joblib", "0" * 64)
    for escape in ("pvc://models/../other/forest.joblib", "pvc://models/v2/../../x",
                   "pvc://./models/v2/forest.joblib", "pvc://models/%2e%2e/other/x.joblib"):
        with pytest.raises(ModelLoadError, match="inside the claim"):
            load_model(escape, digest)
