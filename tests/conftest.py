"""Session fixtures shared by every test folder: the real Kubernetes control plane.

``cluster`` starts one control plane per test session (only when a test asks for it), built from
upstream by ``hack/kube/build.py``; ``installed`` is the Helm chart installed on it; ``namespace``
gives each test a namespace of its own, deleted afterwards; ``admin`` is a client acting as the
cluster admin. The Kubernetes version is
``$TAILGUARD_KUBE_VERSION`` (default: ``hack/kube/build.py``'s). Without Go the control plane
cannot be built, and the tests that need it fail with one line saying so: they are never skipped.
"""

from __future__ import annotations

import contextlib
import os
import re
import sys
import uuid
from pathlib import Path
from typing import Iterator

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "hack" / "kube"))
from build import DEFAULT_TAG  # noqa: E402
from kubecluster.client import ApiError, Client, wait_for  # noqa: E402
from kubecluster.controlplane import ControlPlane, ControlPlaneError, bindir  # noqa: E402
from kubecluster.install import Installation, install  # noqa: E402

KUBE_VERSION = os.environ.get("TAILGUARD_KUBE_VERSION", DEFAULT_TAG)


@pytest.fixture(scope="session", autouse=True)
def state_dir(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """``TAILGUARD_STATE_DIR`` for the whole session (inherited by every process a test
    starts), so the control files of ``tailguard up`` never land in the user's own state dir."""
    folder = tmp_path_factory.mktemp("tailguard-state")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("TAILGUARD_STATE_DIR", str(folder))
        yield folder


@pytest.fixture(scope="session")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ControlPlane]:
    """A running control plane (etcd, API server, controller manager, scheduler, kwok)."""
    try:
        binaries = bindir(KUBE_VERSION)
        for attempt in (1, 2):  # a free port can be taken between choosing and binding it
            plane = ControlPlane(binaries, tmp_path_factory.mktemp("cluster"), KUBE_VERSION)
            try:
                plane.start()
                break
            except ControlPlaneError:
                if attempt == 2:
                    raise
    except ControlPlaneError as exc:
        pytest.fail(f"no Kubernetes control plane: {exc}", pytrace=False)
    try:
        yield plane
    finally:
        plane.stop()


@pytest.fixture(scope="session")
def admin(cluster: ControlPlane) -> Iterator[Client]:
    """A client acting as the cluster admin (group ``system:masters``)."""
    client = Client(cluster.admin.kubeconfig)
    yield client
    client.close()


@pytest.fixture(scope="session")
def installed(cluster: ControlPlane, admin: Client) -> Iterator[Installation]:
    """The chart installed with the real ``helm`` (release ``tailguard`` in
    ``tailguard-system``, CRD included); its operator is started per test
    (:meth:`Installation.start_operator`)."""
    installation = install(cluster, admin)
    try:
        yield installation
    finally:
        for proc in installation.processes:
            installation.stop_operator(proc)


@pytest.fixture
def namespace(admin: Client, request: pytest.FixtureRequest) -> Iterator[str]:
    """A fresh namespace for one test, deleted when the test ends: its InferenceServices at
    once (so the next test's operator does not resume them), the rest by the namespace
    controller, not waited for."""
    stem = re.sub(r"[^a-z0-9]+", "-", request.node.name.lower().removeprefix("test_"))[:40]
    name = f"t-{stem.strip('-')}-{uuid.uuid4().hex[:5]}"
    admin.create({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}})
    # As in a real cluster, pods are admitted only once the namespace has its ServiceAccount.
    wait_for(lambda: admin.get("serviceaccounts", name, "default"),
             what=f"the default ServiceAccount in {name}")
    yield name
    with contextlib.suppress(ApiError):  # no CRD yet: nothing to delete
        admin.request("DELETE", admin.path("inferenceservices", name))
    admin.delete("namespaces", None, name)


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Under pytest-xdist's ``--dist loadgroup`` (what ``make test`` runs): every test that
    uses the control plane goes to one worker, so a session starts one control plane, and the
    other tests go module by module, so a module's server fixtures start once. First among
    the hooks: xdist's worker reads the groups in its own ``pytest_collection_modifyitems``,
    which otherwise runs before this one and finds none."""
    if not config.pluginmanager.hasplugin("xdist"):
        return
    for item in items:
        uses_cluster = "cluster" in getattr(item, "fixturenames", ())
        group = "kube" if uses_cluster else item.nodeid.split("::", 1)[0]
        item.add_marker(pytest.mark.xdist_group(group))
