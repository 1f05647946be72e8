"""Helpers for the end-to-end tests: a real `tailguard up` process, and the `tailguard` command.

:func:`start_up` runs ``tailguard up SPEC --port 0`` in the repository root through
:mod:`tailguard.up.child`, the one way the project starts it (``tailguard bench`` and
benchmarks/guard.py use it too); :class:`Up` is its ``UpProcess``. :func:`run_cli` runs one
`tailguard` command to completion. Every process listens on 127.0.0.1 only and is stopped by PID.

This module has a name of its own (not ``conftest``) so that test modules can import it.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path
from typing import Mapping

from harness import REPO
from tailguard.up.child import TAILGUARD, WAIT_S
from tailguard.up.child import UpProcess as Up
from tailguard.up.child import start_up as _start_up

__all__ = ["EXAMPLE", "IRIS", "ROOT", "TAILGUARD", "WAIT_S", "Up", "one_line_failure", "run_cli",
           "start_up"]

ROOT = REPO
EXAMPLE = ROOT / "examples" / "digits.yaml"
IRIS = ROOT / "examples" / "iris.yaml"


def start_up(spec: Path, timeout_s: float = WAIT_S, env: Mapping[str, str] | None = None,
             host: str | None = None) -> Up:
    """Start `tailguard up SPEC --port 0` in the repository root; ``env`` adds variables,
    ``host`` is passed as ``--host``."""
    return _start_up(spec, timeout_s, env, cwd=ROOT, host=host)


def run_cli(*args: str, env: Mapping[str, str] | None = None,
            cwd: Path = ROOT) -> subprocess.CompletedProcess[str]:
    """Run ``tailguard ARGS`` to completion (at most 120 s) and return what it did."""
    return subprocess.run([*TAILGUARD, *args], capture_output=True, text=True, timeout=120,
                          cwd=cwd, env={**os.environ, **(env or {})})


def one_line_failure(done: subprocess.CompletedProcess[str]) -> str:
    """Assert that a command failed the way every `tailguard` error path must: a non-zero exit,
    nothing on stdout, exactly one line on stderr and no traceback. Returns that line."""
    assert done.returncode != 0, (done.stdout, done.stderr)
    assert "Traceback" not in done.stderr, done.stderr
    assert done.stdout == "", done.stdout
    lines = done.stderr.splitlines()
    assert len(lines) == 1, done.stderr
    return lines[0]
