"""`tailguard tune` end to end: the real command serves each grid point with `tailguard up`,
loads it with bench's open-loop generator, chooses, plots and writes the spec back."""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path

from PIL import Image

from harness.up import ROOT, TAILGUARD, one_line_failure, run_cli

SPEC = """\
# iris, tuned by tailguard tune -- this comment must survive --write
apiVersion: tailguard.dev/v1alpha1
kind: InferenceService
metadata:
  name: iris-tune   # a name of our own
spec:
  model:
    uri: builtin://iris/random-forest?trees=20
  fallback: {uri: builtin://iris/logistic-regression}   # flow style, kept as written
  batching:
    maxBatchSize: 4      # picked by hand, before tuning
    maxWaitMs: 0
    maxQueueSize: 512    # rows
  slo:
    p99LatencyMs: 200
    windowSeconds: 10
"""

# A shared 2-core machine: the generator's schedule lag is judged against a looser limit than
# the 1 ms default (the lag a run had is still reported); the budget is what the test asserts.
SHARED = ("--max-lag-ms", "150")
BUDGET_S = 400
"""The --budget of the tests that need points measured: well past what they take, so that a
busy machine's slow starts do not skip them (s)."""


def tune(*args: str, timeout_s: float = 180) -> tuple[subprocess.CompletedProcess[str], float]:
    t0 = time.monotonic()
    done = subprocess.run([*TAILGUARD, "tune", *args], capture_output=True, text=True,
                          timeout=timeout_s, cwd=ROOT)
    return done, time.monotonic() - t0


def test_a_2x2_grid_of_3_second_points_is_measured_chosen_plotted_and_written(
        tmp_path: Path) -> None:
    """The budget is far above what the grid needs (about 40 s on a quiet machine): beside
    another suite, each point's `tailguard up` took most of a minute to import and load, and
    an 85 s budget ran out before the first point. test_a_budget_too_small_for_any_point_*
    shows the budget cut short."""
    spec = tmp_path / "iris.yaml"
    spec.write_text(SPEC)
    plot = tmp_path / "tune.png"
    done, wall_s = tune(str(spec), "--rate", "50", "--duration", "3", "--warmup", "1",
                        "--table-seconds", "0.2", "--grid", "2x2", "--budget", str(BUDGET_S),
                        "--plot", str(plot), "--write", "--json", *SHARED,
                        timeout_s=BUDGET_S + 120)
    assert done.returncode == 0, done.stderr + done.stdout
    assert wall_s < BUDGET_S + 60, wall_s  # a point started within the budget may finish
    out = json.loads(done.stdout)
    assert [r["batch"] for r in out["rawTable"]] == [1, 8, 32, 128, 512]
    grid = out["grid"]
    assert len(grid["maxBatchSize"]) == 2 and len(grid["maxWaitMs"]) == 2, grid
    assert len(out["points"]) + len(out["skipped"]) == 4 and out["points"]
    choice = out["choice"]
    chosen = choice["chosen"]
    assert choice["ok"] and chosen["meetsSlo"]
    # the chosen point met the SLO in its own measurement: a valid run, p99 within 200 ms,
    # and (nearly) every request answered 200
    run = chosen["detail"]["runs"][-1]
    assert run["valid"] and run["latency_ms"]["p99"] <= 200
    assert run["ok"] >= 0.99 * run["sent"] > 0
    assert chosen["p99Ms"] == run["latency_ms"]["p99"]
    best = max(p["throughputRps"] for p in out["points"] if p["meetsSlo"])
    assert chosen["throughputRps"] >= 0.98 * best
    assert chosen["maxBatchSize"] in grid["maxBatchSize"]
    with Image.open(plot) as image:
        assert image.format == "PNG"
    # --write: the two values changed, every other line byte for byte
    after = spec.read_text()
    changed = [(a, b) for a, b in zip(SPEC.splitlines(), after.splitlines()) if a != b]
    assert len(after.splitlines()) == len(SPEC.splitlines())
    assert [a.split(":")[0].strip() for a, _ in changed] == ["maxBatchSize", "maxWaitMs"][
        :len(changed)]
    assert f"maxBatchSize: {chosen['maxBatchSize']}      # picked by hand" in after
    assert f"    maxWaitMs: {chosen['maxWaitMs']}\n" in after
    assert out["written"] is True


def test_an_impossible_slo_is_said_plainly_and_exits_non_zero(tmp_path: Path) -> None:
    # every model call sleeps 30 ms: no policy can keep p99 within 10 ms
    text = SPEC.replace("trees=20", "trees=20&delayMs=30").replace(
        "p99LatencyMs: 200", "p99LatencyMs: 10")
    spec = tmp_path / "slow.yaml"
    spec.write_text(text)
    done, _ = tune(str(spec), "--rate", "20", "--duration", "2", "--warmup", "0.5",
                   "--table-seconds", "0.2", "--budget", str(BUDGET_S), "--plot",
                   str(tmp_path / "slow.png"), "--write", *SHARED, timeout_s=BUDGET_S + 120)
    assert done.returncode == 1, done.stderr + done.stdout
    assert "Traceback" not in done.stderr
    lines = done.stdout.splitlines()
    verdict = next(line for line in lines if line.startswith("no point meets the SLO"))
    assert "(p99 <= 10 ms); the closest is maxBatchSize=1 maxWaitMs=0:" in verdict
    assert f"{spec} left unchanged: no point met the SLO" in lines
    assert spec.read_text() == text


def test_bad_arguments_fail_in_one_line(tmp_path: Path) -> None:
    done = run_cli("tune", str(tmp_path / "missing.yaml"), "--grid", "0x2")
    assert done.returncode == 2
    assert "--grid: both sizes must be >= 1" in one_line_failure(done)
    missing = run_cli("tune", str(tmp_path / "missing.yaml"))
    assert missing.returncode == 2 and "cannot read" in one_line_failure(missing)


def test_a_budget_too_small_for_any_point_draws_no_empty_chart(tmp_path: Path) -> None:
    spec = tmp_path / "tiny.yaml"
    spec.write_text(SPEC)
    png = tmp_path / "tiny.png"
    done, _ = tune(str(spec), "--budget", "3", "--table-seconds", "0.2", "--plot", str(png))
    assert done.returncode == 1, done.stderr + done.stdout
    assert "no point was measured" in done.stdout
    assert "plot: none (no point was measured within --budget)" in done.stdout.splitlines()
    assert not png.exists()
    assert "Traceback" not in done.stderr and "Warning" not in done.stderr, done.stderr
