"""What a new user reads and runs first: the README's commands and tables, benchmarks/README.md, and
`make up` (through `make -n`, which prints what would run without running it)."""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import pytest

from harness import REPO
from tailguard_runtime.metrics import REJECTION_REASONS

ROOT = REPO
README = (ROOT / "README.md").read_text(encoding="utf-8")


def shell_lines(markdown: str) -> list[str]:
    """The lines of the Markdown's ```bash blocks."""
    return [line for block in re.findall(r"```bash\n(.*?)```", markdown, re.S)
            for line in block.splitlines()]


def test_every_rejection_reason_is_explained_in_the_readme() -> None:
    rows = dict(re.findall(r"^\| `(\w+)` \| ([^|]+) \|", README, re.M))
    for reason in REJECTION_REASONS:
        assert reason in rows, f"rejection reason {reason!r} is not in the README's table"


def test_readme_commands_run_as_printed_from_a_fresh_shell() -> None:
    """After `make up`, `tailguard` is in .venv/bin, not on PATH: no command may start with a
    bare `tailguard`."""
    bare = [line for line in shell_lines(README) if re.match(r"\s*tailguard\s", line)]
    assert not bare, bare


def test_readme_layout_names_the_charts_pod_monitor() -> None:
    assert (ROOT / "charts" / "tailguard" / "templates" / "podmonitor.yaml").exists()
    layout = README[README.index("## Layout"):]
    assert "PodMonitor" in layout and "ServiceMonitor" not in layout


def test_bench_readme_names_no_development_machine_path() -> None:
    text = (ROOT / "benchmarks" / "README.md").read_text(encoding="utf-8")
    assert not re.search(r"(?<![\w.])/(work|home|Users)/", text)


def make_dry_run(venv: Path, *extra: str) -> str:
    done = subprocess.run(["make", "-n", "-C", str(ROOT), "up", f"VENV={venv}", "PORT=9191",
                           *extra], capture_output=True, text=True, timeout=60,
                          env={**os.environ, "MAKEFLAGS": ""})
    assert done.returncode == 0, done.stderr
    return done.stdout


@pytest.fixture
def installed_venv(tmp_path: Path) -> Path:
    """A stand-in venv folder whose install stamp is newer than pyproject.toml and
    constraints.txt (make -n only compares times; nothing in it runs)."""
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    (venv / "bin" / "python").write_text("")
    stamp = venv / ".installed"
    stamp.write_text("")
    newest = max((ROOT / name).stat().st_mtime for name in ("pyproject.toml", "constraints.txt"))
    os.utime(stamp, (newest + 60, newest + 60))
    return venv


def test_make_up_does_not_reinstall_when_nothing_changed(installed_venv: Path) -> None:
    planned = make_dry_run(installed_venv)
    assert "pip install" not in planned
    assert f"{installed_venv}/bin/tailguard up examples/digits.yaml --port 9191" in planned


@pytest.mark.parametrize("changed", ["pyproject.toml", "constraints.txt"])
def test_make_up_reinstalls_when_the_dependencies_changed(installed_venv: Path,
                                                          changed: str) -> None:
    assert "pip install" in make_dry_run(installed_venv, "-W", changed)


def test_make_tests_workers_run_each_module_as_one_group(request: pytest.FixtureRequest) -> None:
    """Under ``make test`` (pytest-xdist, ``--dist loadgroup``) each worker sees this test's id
    with its group appended, the sign that the groups of ``tests/conftest.py`` reached the
    scheduler: without them a module's server fixtures start once per worker, and the control
    plane twice. pytest 9.2 broke that silently (pytest-dev/pytest-xdist#1386)."""
    if not getattr(request.config.option, "loadgroup", False):
        return  # not under make test: there are no groups to check
    module = request.node.nodeid.split("::", 1)[0]
    assert request.node.nodeid.endswith(f"@{module}"), request.node.nodeid
