"""Static contracts: layering (import-linter) and strict typing (mypy)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from harness import REPO

ROOT = REPO


def test_layering_contracts_hold() -> None:
    """Pure modules never import kopf, kubernetes or an HTTP framework; the runtime never
    imports the operator (contracts in pyproject.toml)."""
    lint_imports = Path(sys.executable).parent / "lint-imports"
    done = subprocess.run([str(lint_imports)], cwd=ROOT,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr


def test_packages_type_check_strictly() -> None:
    done = subprocess.run([sys.executable, "-m", "mypy", "runtime/tailguard_runtime",
                           "operator/tailguard"], cwd=ROOT, capture_output=True,
                          text=True, timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr
