"""`tailguard report` end to end: two real runs, each serving the spec with `tailguard up` and
measuring every section; the example request it prints is sent again to another instance."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path
from typing import Any, Iterator

import httpx
import pytest
from PIL import Image

from harness.up import ROOT, TAILGUARD, start_up

SPEC = """\
# iris, for its evidence card
apiVersion: tailguard.dev/v1alpha1
kind: InferenceService
metadata:
  name: iris-report
spec:
  model:
    uri: builtin://iris/random-forest?trees=20
  fallback:
    uri: builtin://iris/logistic-regression
  batching: {maxBatchSize: 32, maxWaitMs: 0, maxQueueSize: 256, timeoutMs: 1000}
  slo:
    p99LatencyMs: 100
"""

SECTIONS = ["## Runtime choice", "## Request contract", "## Latency and cost",
            "## Failure checks (each run now)", "## Rollback plan"]


@pytest.fixture(scope="module")
def spec(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("spec") / "iris.yaml"
    path.write_text(SPEC)
    return path


@pytest.fixture(scope="module")
def runs(spec: Path, tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    """Two complete report runs, one after the other (each serves and stops its own instance)."""
    outs = []
    for k in (1, 2):
        out = tmp_path_factory.mktemp(f"report{k}")
        # short loads: a 1 s window per rate, at most 5 s of sweep; the generator's lag limit
        # is loosened for a shared machine (its lag is still reported)
        done = subprocess.run([*TAILGUARD, "report", str(spec), "--out", str(out),
                               "--duration", "1", "--warmup", "0.5", "--table-seconds", "0.1",
                               "--budget", "5", "--max-lag-ms", "150"],
                              capture_output=True, text=True, timeout=240, cwd=ROOT)
        assert done.returncode == 0, done.stderr + done.stdout
        assert "5 of 5 failure checks behaved as expected" in done.stdout
        outs.append(out)
    return outs


def doc(out: Path) -> dict[str, Any]:
    return json.loads((out / "report.json").read_text())


def test_every_section_comes_from_measurements(runs: list[Path]) -> None:
    from importlib import metadata

    text = (runs[0] / "report.md").read_text()
    assert [line for line in text.splitlines() if line.startswith("## ")] == SECTIONS
    d = doc(runs[0])
    # runtime choice: the versions installed here, the models as loaded, this machine
    assert d["runtime"]["versions"]["scikit-learn"] == metadata.version("scikit-learn")
    models = {m["role"]: m for m in d["runtime"]["models"]}
    assert models["primary"]["class"] == "RandomForestClassifier"
    assert models["primary"]["trees"] == 20 and models["primary"]["sizeBytes"] > 1000
    assert models["fallback"]["steps"] == ["StandardScaler", "LogisticRegression"]
    assert d["runtime"]["machine"]["cores"] >= 1
    # request contract: every endpoint answered, every error shape got its status
    assert {e["status"] for e in d["contract"]["endpoints"]} == {200}
    statuses = {e["name"]: e["status"] for e in d["contract"]["errors"]}
    assert statuses["malformed request"] == 400 and statuses["wrong feature count"] == 422
    assert statuses["unknown model"] == 404 and statuses["too many rows"] == 413
    assert statuses["overload shedding"] == 429
    assert statuses["request past its deadline"] in (504, 429)
    assert all(json.loads(e["reply"]).keys() == {"error"} for e in d["contract"]["errors"])
    # latency and cost: a real load run, and the raw tables of both models
    load = d["latency"]["load"]
    first = load["detail"]["runs"][0]
    assert first["sent"] > 0 and first["ok"] + first["rejected_429"] <= first["sent"]
    assert [r["batch"] for r in d["latency"]["rawTables"]["primary"]] == [1, 8, 32, 128, 512]
    assert all(r["median_ms"] > 0 for t in d["latency"]["rawTables"].values() for r in t)
    # failure checks, all run and all as expected; the rollback plan's fallback was measured
    assert [c["name"] for c in d["failureChecks"]] == [
        "request past its deadline", "overload shedding", "malformed request",
        "wrong feature count", "fallback drop-in"]
    assert all(c["passed"] for c in d["failureChecks"]), d["failureChecks"]
    overload = d["failureChecks"][1]
    assert "Retry-After: " in overload["happened"]
    assert d["rollback"]["fallback"]["servedMedianMs"] > 0
    assert d["rollback"]["automatic"]["breachWindows"] == 3
    assert "tailguard rollback iris-report" in text
    for plot in ("load.png", "raw-table.png"):
        with Image.open(runs[0] / plot) as image:
            assert image.format == "PNG"
        assert f"![{plot}]({plot})" in text


def test_the_example_request_works_against_the_service(runs: list[Path], spec: Path) -> None:
    text = (runs[0] / "report.md").read_text()
    curl = re.search(r"^curl -s -X POST http://127\.0\.0\.1:8080(\S+) "
                     r"-H 'Content-Type: application/json' -d '(.+)'$", text, re.M)
    assert curl is not None
    path, body = curl.group(1), curl.group(2)
    shown = re.search(r"```json\n(.+)\n```", text)
    assert shown is not None
    up = start_up(spec)
    try:
        reply = httpx.post(up.base + path, content=body,
                           headers={"Content-Type": "application/json"}, timeout=30)
    finally:
        assert up.stop() == 0
    assert reply.status_code == 200
    # the same deterministic model (random_state=0) gives the same outputs the report shows
    assert reply.json()["outputs"] == json.loads(shown.group(1))["outputs"]


KEYED_BY_DATA = {"http_errors", "transport_errors", "server", "guardNow", "replyHeaders",
                 "schedule_lag_ms", "client_wait_ms"}
"""Maps whose keys are measurements themselves (status codes seen, the guard's state so far):
their presence is structure, their keys are not."""


def structure(value: Any, path: str = "") -> Iterator[str]:
    """Every key path of a JSON document, list positions folded into ``[]``; a list is a path
    of its own whether or not it is empty (a run's ``invalid`` reasons are often none)."""
    if path.rsplit(".", 1)[-1] in KEYED_BY_DATA:
        yield path
    elif isinstance(value, dict):
        for key, item in value.items():
            yield from structure(item, f"{path}.{key}")
    elif isinstance(value, list):
        yield f"{path}[]"
        for item in value:
            yield from structure(item, f"{path}[]")
    else:
        yield path


def skeleton(markdown: str) -> list[str]:
    """Headings and table header rows: the report's structure without its numbers."""
    lines = markdown.splitlines()
    return [line for k, line in enumerate(lines) if line.startswith("#")
            or (line.startswith("| ") and k + 1 < len(lines) and lines[k + 1].startswith("|--"))
            or (line.startswith("|---"))]


def test_two_runs_measure_different_numbers_in_the_same_structure(runs: list[Path]) -> None:
    one, two = doc(runs[0]), doc(runs[1])
    assert set(structure(one)) == set(structure(two))
    md = [(r / "report.md").read_text() for r in runs]
    assert skeleton(md[0]) == skeleton(md[1])
    assert md[0] != md[1]
    raw = [[r["median_ms"] for r in d["latency"]["rawTables"]["primary"]] for d in (one, two)]
    assert raw[0] != raw[1]
    assert one["contract"]["example"]["elapsedMs"] != two["contract"]["example"]["elapsedMs"]
    assert one["contract"]["base"] != two["contract"]["base"]  # each run served its own
