"""The runtime image's install, run here without Docker: `tailguard` without extras, from the
files the Dockerfile's build stage copies, into a fresh virtual environment, as that stage does
it. kopf, the Kubernetes client and matplotlib are missing there; the runtime and the local
command still start.

pip reads the package index (its cache helps), so this test needs the network.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

from harness import REPO
from harness.dockerfile import parse


def build_context(into: Path) -> None:
    """Copy what the build stage's COPY instructions copy, to the same places under ``into``."""
    for copy in parse("Dockerfile").stage("build").args("COPY"):
        *sources, dest = copy.split()
        for source in sources:
            if (REPO / source).is_dir():
                shutil.copytree(REPO / source, into / dest, dirs_exist_ok=True,
                                ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
            else:
                (into / dest).mkdir(parents=True, exist_ok=True)
                shutil.copy(REPO / source, into / dest / Path(source).name)


def test_the_base_install_has_no_operator_or_plot_libraries(tmp_path: Path) -> None:
    src, venv = tmp_path / "src", tmp_path / "venv"
    build_context(src)
    env = {**os.environ, "PIP_DISABLE_PIP_VERSION_CHECK": "1"}

    def run(*argv: str | Path, timeout: float = 300) -> subprocess.CompletedProcess[str]:
        return subprocess.run([str(a) for a in argv], cwd=src, env=env, capture_output=True,
                              text=True, timeout=timeout)

    made = run(sys.executable, "-m", "venv", venv)
    assert made.returncode == 0, made.stderr
    pip = venv / "bin" / "pip"
    # As the Dockerfile's build stage does; --no-compile only saves time.
    installed = run(pip, "install", "--no-compile", "-c", "constraints.txt", ".", timeout=600)
    assert installed.returncode == 0, installed.stdout + installed.stderr
    checked = run(pip, "check")
    assert checked.returncode == 0, checked.stdout + checked.stderr

    python = venv / "bin" / "python"
    for module in ("kopf", "kubernetes", "matplotlib"):
        missing = run(python, "-c", f"import {module}")
        assert missing.returncode != 0
        assert f"No module named '{module}'" in missing.stderr, missing.stderr
    runtime = run(venv / "bin" / "tailguard-runtime", "--help")
    assert runtime.returncode == 0 and "--config" in runtime.stdout, runtime.stderr
    cli = run(venv / "bin" / "tailguard", "--help")
    assert cli.returncode == 0 and "usage: tailguard" in cli.stdout, cli.stderr
