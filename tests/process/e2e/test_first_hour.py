"""A new user's first hour with `tailguard up`, over the real CLI and real HTTP: the banner's
commands run exactly as printed, every answer says which model gave it, a switch is one log line
saying who, from where to where and when, `tailguard status` shows the live numbers, and Ctrl-C
says how many requests were drained and how many got 503."""

from __future__ import annotations

import datetime
import hashlib
import os
import re
import shlex
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
from prometheus_client.parser import text_string_to_metric_families

from harness.up import IRIS, ROOT, TAILGUARD, WAIT_S, Up, run_cli, start_up
from tailguard.up.control import find_control_file

SWITCH_LINE = (r"traffic switched service=iris from=(\w+) to=(\w+) by=(\w+) "
               r"at=(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z)$")


def banner_command(up: Up, label: str) -> list[str]:
    """The command the banner prints after ``label`` (e.g. ``roll back``), split as a shell
    would."""
    found = up.wait_for(rf"^  {label} +(\S.*)$")
    assert found, up.text()
    return shlex.split(found[0].group(1))


def run_printed(argv: list[str]) -> subprocess.CompletedProcess[str]:
    """Run a printed command from the repository root, with a PATH that has no `tailguard`
    on it (a fresh shell after `make up`)."""
    path = os.pathsep.join(p for p in os.environ.get("PATH", "").split(os.pathsep)
                           if not (Path(p) / "tailguard").exists())
    return subprocess.run(argv, capture_output=True, text=True, timeout=120, cwd=ROOT,
                          env={**os.environ, "PATH": path})


def predict(up: Up) -> httpx.Response:
    reply = httpx.post(f"{up.base}/v1/models/iris:predict",
                       json={"instances": [[5.1, 3.5, 1.4, 0.2]]}, timeout=30)
    assert reply.status_code == 200, reply.text
    return reply


def test_banner_commands_run_as_printed_and_answers_show_the_switch(iris: Up) -> None:
    rollback, rollforward, status = (banner_command(iris, label)
                                     for label in ("roll back", "and back", "status"))
    assert rollback[-4:] == ["rollback", "iris", "--port", str(iris.port)], rollback
    before = predict(iris)
    assert before.headers["x-tailguard-role"] == "primary"
    assert before.headers["x-tailguard-model"] == "builtin://iris/random-forest"
    assert before.headers["x-tailguard-model-version"] == "1"

    done = run_printed(rollback)
    assert done.returncode == 0, done.stderr
    assert "iris: traffic now goes to fallback" in done.stdout
    after = predict(iris)
    assert after.headers["x-tailguard-role"] == "fallback"
    assert after.headers["x-tailguard-model"] == "builtin://iris/logistic-regression"
    v2 = httpx.post(f"{iris.base}/v2/models/iris/infer", timeout=30, json={"inputs": [{
        "name": "x", "shape": [1, 4], "datatype": "FP64", "data": [5.1, 3.5, 1.4, 0.2]}]})
    assert v2.json()["parameters"] == {"role": "fallback",
                                       "model_uri": "builtin://iris/logistic-regression"}

    shown = run_printed(status)
    assert shown.returncode == 0, shown.stderr
    assert shown.stdout.startswith("iris: traffic -> fallback, ready\n"), shown.stdout
    assert "last switch: primary -> fallback by cli at " in shown.stdout
    assert "fallback (active): builtin://iris/logistic-regression version 1" in shown.stdout
    assert "(SLO 25ms)" in shown.stdout and "samples=" in shown.stdout

    done = run_printed(rollforward)
    assert done.returncode == 0 and "iris: traffic now goes to primary" in done.stdout
    assert predict(iris).headers["x-tailguard-role"] == "primary"


def test_each_switch_is_one_log_line_with_who_from_to_and_when(iris: Up) -> None:
    before = len(iris.wait_for(SWITCH_LINE, count=0))
    sent = datetime.datetime.now(datetime.timezone.utc)
    for command in ("rollback", "rollback", "rollforward"):  # the second changes nothing
        done = run_cli(command, "iris", "--port", str(iris.port))
        assert done.returncode == 0, done.stderr
    found = iris.wait_for(SWITCH_LINE, count=before + 2)
    new = found[before:]
    assert [(m.group(1), m.group(2), m.group(3)) for m in new] == [
        ("primary", "fallback", "cli"), ("fallback", "primary", "cli")]
    for match in new:
        at = datetime.datetime.fromisoformat(match.group(4))
        assert at >= sent.replace(microsecond=sent.microsecond // 1000 * 1000)


def test_status_of_another_name_or_port_is_one_line(iris: Up) -> None:
    done = run_cli("status", "digits", "--port", str(iris.port))
    assert done.returncode == 1 and done.stdout == ""
    assert done.stderr.strip() == f"tailguard status: 127.0.0.1:{iris.port} serves 'iris', not 'digits'"


# -- Ctrl-C ----------------------------------------------------------------------------------

GATE_MODULE = "tg_e2e_gate"
GATE_SOURCE = '''
"""A classifier whose rows with x[0] == -1 wait for the file ``gate`` to exist, and whose loading
waits for the file ``load_gate`` (when set) (tests/process/e2e/test_first_hour.py)."""

import os
import time

import numpy as np
from sklearn.base import BaseEstimator, ClassifierMixin


def _wait(path):
    end = time.monotonic() + 120
    while path and not os.path.exists(path) and time.monotonic() < end:
        time.sleep(0.01)


class GateClassifier(ClassifierMixin, BaseEstimator):
    def __init__(self, gate="", load_gate=""):
        self.gate = gate
        self.load_gate = load_gate

    def __setstate__(self, state):
        super().__setstate__(state)
        _wait(self.load_gate)

    def fit(self, X, y):
        self.classes_ = np.unique(np.asarray(y))
        self.n_features_in_ = np.asarray(X).shape[1]
        return self

    def predict_proba(self, X):
        X = np.asarray(X, dtype=np.float64)
        if (X[:, 0] == -1).any():
            _wait(self.gate)
        proba = np.zeros((len(X), len(self.classes_)))
        proba[:, 0] = 1.0
        return proba

    def predict(self, X):
        return self.classes_[self.predict_proba(X).argmax(axis=1)]
'''


def gated_spec(folder: Path, load_gate: Path | None = None) -> tuple[Path, Path]:
    """An InferenceService whose primary holds a row with x[0] == -1 until ``gate`` exists
    (and, with ``load_gate``, does not finish loading until that file exists), with iris's
    logistic regression (4 features, classes 0..2) as its fallback."""
    (folder / f"{GATE_MODULE}.py").write_text(GATE_SOURCE, encoding="utf-8")
    gate = folder / "gate-open"
    done = subprocess.run(
        [sys.executable, "-c",
         "import sys, joblib, numpy as np; sys.path.insert(0, sys.argv[1]); "
         f"from {GATE_MODULE} import GateClassifier; "
         "joblib.dump(GateClassifier(sys.argv[2], sys.argv[4]).fit(np.zeros((3, 4)), [0, 1, 2]), "
         "sys.argv[3])",
         str(folder), str(gate), str(folder / "gate.joblib"), str(load_gate or "")],
        capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    model = folder / "gate.joblib"
    digest = hashlib.sha256(model.read_bytes()).hexdigest()
    spec = folder / "gate.yaml"
    spec.write_text(f"""apiVersion: tailguard.dev/v1alpha1
kind: InferenceService
metadata: {{name: gate}}
spec:
  model: {{uri: "{model.as_uri()}", sha256: "{digest}"}}
  fallback: {{uri: builtin://iris/logistic-regression}}
  batching: {{timeoutMs: 120000}}
  slo: {{p99LatencyMs: 50}}
""", encoding="utf-8")
    return spec, gate


def in_flight(base: str) -> float:
    text = httpx.get(f"{base}/metrics", timeout=30).text
    return sum(sample.value for family in text_string_to_metric_families(text)
               if family.name == "tailguard_in_flight_requests" for sample in family.samples)


def wait_until(predicate: Any) -> None:
    """Poll ``predicate`` until it holds (at most :data:`WAIT_S`)."""
    deadline = time.monotonic() + WAIT_S
    while not predicate():
        assert time.monotonic() < deadline, "condition never held"
        time.sleep(0.02)


def test_ctrl_c_reports_drained_and_503_counts(tmp_path: Path) -> None:
    spec, gate = gated_spec(tmp_path)
    up = start_up(spec, env={"PYTHONPATH": str(tmp_path)})
    held: list[httpx.Response] = []
    try:
        sender = threading.Thread(target=lambda: held.append(httpx.post(
            f"{up.base}/v1/models/gate:predict", json={"instances": [[-1.0, 0.0, 0.0, 0.0]]},
            timeout=120)))
        sender.start()
        wait_until(lambda: in_flight(up.base) == 1)
        up.proc.send_signal(signal.SIGINT)  # as Ctrl-C
        wait_until(lambda: httpx.get(f"{up.base}/v2/health/ready", timeout=30).status_code == 503)
        refused = httpx.post(f"{up.base}/v1/models/gate:predict",
                             json={"instances": [[1.0, 0.0, 0.0, 0.0]]}, timeout=30)
        assert refused.status_code == 503, refused.text
        assert refused.headers["x-tailguard-role"] == "primary"
        gate.touch()
        sender.join(120)
    finally:
        gate.touch()
        code = up.stop() if up.proc.poll() is None else up.wait()
    assert code == 0
    assert [r.status_code for r in held] == [200]
    assert held[0].headers["x-tailguard-role"] == "primary"
    assert ("tailguard up: drained 1 in-flight request(s); 1 answered 503 (0 cut off when the "
            "grace period ended, 1 arrived while draining); stopped") in up.text(), up.text()
    assert np.asarray(held[0].json()["predictions"]).tolist() == [0]
    assert re.search(r"(?m)^tailguard up: drained", up.text())


def test_a_spec_that_starts_on_the_fallback_logs_that_switch(tmp_path: Path) -> None:
    spec = tmp_path / "iris-fallback.yaml"
    spec.write_text(IRIS.read_text() + "  traffic: fallback\n")
    up = start_up(spec)
    try:
        found = up.wait_for(SWITCH_LINE)
        assert [(m.group(1), m.group(2), m.group(3)) for m in found] == [
            ("primary", "fallback", "spec")], up.text()
        assert predict(up).headers["x-tailguard-role"] == "fallback"
    finally:
        assert up.stop() == 0


def test_the_switch_route_refuses_a_who_that_is_not_one_word(iris: Up) -> None:
    control = find_control_file("iris", iris.port)
    assert control is not None
    reply = httpx.post(f"{iris.base}/tailguard/traffic", timeout=30,
                       headers={"Authorization": f"Bearer {control.secret}"},
                       json={"name": "iris", "activeModel": "fallback", "by": "cli at=yesterday"})
    assert reply.status_code == 400 and "one short lowercase word" in reply.json()["error"]
    assert httpx.get(f"{iris.base}/tailguard/traffic", timeout=30).json()["activeModel"] == "primary"


@pytest.mark.parametrize("after_s, inherited", [(0.0, "default"), (0.1, "default"),
                                                (0.3, "ignored")])
def test_ctrl_c_while_a_model_loads_is_one_line(tmp_path: Path, after_s: float,
                                                inherited: str) -> None:
    """Ctrl-C at any moment of a load that cannot finish (``after_s`` after the loading line:
    in the import of joblib, in the unpickler), and when SIGINT came ignored from the parent
    (as a script's background job gets it), ends the process at once with 130 and one line.
    Found by trying: a KeyboardInterrupt raised inside the load sometimes hung the process, or
    ended it killed by SIGINT (-2) after the line; and in the suite, on one pytest-xdist worker,
    the load was never interrupted at all while the same worker's serving processes answered
    Ctrl-C: what SIGINT comes ignored reproduces it (why it came so there was not found)."""
    load_gate = tmp_path / "never-created"
    spec, _ = gated_spec(tmp_path, load_gate)
    argv = [*TAILGUARD, "up", str(spec), "--port", "0"]
    if inherited == "ignored":  # the shell's trap '' INT is inherited through exec
        argv = ["sh", "-c", "trap '' INT; exec \"$@\"", "sh", *argv]
    with subprocess.Popen(argv, cwd=ROOT, text=True,
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                          env={**os.environ, "PYTHONPATH": str(tmp_path)}) as proc:
        try:
            assert proc.stdout is not None
            for line in proc.stdout:
                if line.startswith("loading primary"):
                    break
            time.sleep(after_s)
            proc.send_signal(signal.SIGINT)  # as Ctrl-C; the load cannot finish without the gate
            out, err = proc.communicate(timeout=WAIT_S)
        finally:
            if proc.poll() is None:
                proc.kill()
    assert proc.returncode == 130
    assert err == "tailguard up: interrupted\n", err
    assert not load_gate.exists()
