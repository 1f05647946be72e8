"""Static contracts: layering (import-linter), strict typing (mypy), lint (ruff) and declared
dependencies (deptry), each run as its own program over the repository."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from harness import REPO

ROOT = REPO
BIN = Path(sys.executable).parent


def _run(*argv: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run(list(argv), cwd=ROOT, capture_output=True, text=True, timeout=timeout)


def test_layering_contracts_hold() -> None:
    """Each room imports only the rooms below it, the pure modules import no I/O library, and
    the runtime never imports the control plane (contracts in pyproject.toml)."""
    done = _run(str(BIN / "lint-imports"))
    assert done.returncode == 0, done.stdout + done.stderr


def test_packages_type_check_strictly() -> None:
    done = _run(sys.executable, "-m", "mypy", "runtime/tailguard_runtime", "operator/tailguard",
                timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr


def test_ruff_finds_nothing() -> None:
    """pyflakes, pycodestyle and import order over the packages, tests, benchmarks and hack
    scripts (rules in pyproject.toml)."""
    done = _run(str(BIN / "ruff"), "check", "--no-cache", ".")
    assert done.returncode == 0, done.stdout + done.stderr


def test_every_import_is_a_declared_dependency() -> None:
    """deptry: each third-party package the shipped code imports is declared in pyproject.toml
    (not only pulled in by another), and each declared one is used."""
    done = _run(str(BIN / "deptry"), ".")
    assert done.returncode == 0, done.stdout + done.stderr
