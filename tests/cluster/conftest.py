"""Fixtures of the tests on the real Kubernetes control plane (every test here is marked
``cluster``).

``cluster`` starts one cluster per test session (only when a test asks for it): a control plane
built from upstream by ``hack/kube/build.py``, kwok nodes, and a real node running the images
``hack/image/build.py`` builds; ``installed`` is the Helm chart installed on it; ``namespace``
gives each test a namespace of its own, deleted afterwards; ``admin`` is a client acting as the
cluster admin; ``scene`` is one test's namespace with the chart installed and its operator run
per test (``scene.operator()``); ``node`` is a module's namespace watched by the operator pod of
a second release on the real node (:mod:`harness.onnode`). The Kubernetes version is ``$TAILGUARD_KUBE_VERSION`` (default:
``hack/kube/build.py``'s). Without Go the control plane cannot be built, and the tests that need
it fail with one line saying so: they are never skipped.
"""

from __future__ import annotations

import contextlib
import os
import re
import uuid
from pathlib import Path
from typing import Iterator

import pytest

from harness.groups import NODE_GROUP
from harness.hack import load
from harness.kube.audit import AuditLog
from harness.kube.client import ApiError, Client, wait_for
from harness.kube.controlplane import ControlPlane, ControlPlaneError, bindir
from harness.kube.holder import HolderError
from harness.kube.images import ImageError, node_images
from harness.kube.install import Installation, install
from harness.kube.node import NodeError
from harness.onnode import OnNode, installed_on_node, uninstall
from harness.scene import Scene

KUBE_VERSION = os.environ.get("TAILGUARD_KUBE_VERSION", load("build").DEFAULT_TAG)


FIRST: list[pytest.Item] = []
"""The first test here that this session sets up."""


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    if not FIRST:
        FIRST.append(item)


def _needs_node_first() -> bool:
    """Whether this session's first test here is in pytest-xdist's group of the real node's
    tests (or in no group: one session runs them all). A worker whose first test here needs
    only the control plane starts the real node only if a test asks for it
    (:meth:`ControlPlane.wait_node`)."""
    marker = FIRST[0].get_closest_marker("xdist_group") if FIRST else None
    return marker is None or marker.args[0] == NODE_GROUP


@pytest.fixture(scope="session")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ControlPlane]:
    """A running cluster in its own network namespace: the control plane (etcd, API server,
    controller manager, scheduler), two kwok nodes, and one real node (containerd, kubelet,
    kube-proxy) with the project's images imported, which starts in the background
    (:func:`node_namespace` waits for it; on a worker of the control plane's group only once
    a test asks for it)."""
    try:
        binaries = bindir(KUBE_VERSION)
        images = node_images()
        plane = ControlPlane(binaries, tmp_path_factory.mktemp("cluster"), KUBE_VERSION,
                             images=[images[n].archive for n in ("pause", "runtime", "operator")],
                             pause_image=images["pause"].ref)
        plane.start(node=_needs_node_first())
    except (ControlPlaneError, NodeError, HolderError, ImageError) as exc:
        pytest.fail(f"no Kubernetes cluster: {exc}", pytrace=False)
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
    for attempt in range(3):
        # The parameters of one test share the stem. A clean-clone run once got 409
        # AlreadyExists ("object is being deleted") for a name just drawn: the audit log was
        # gone and the cause is not known, so a name that exists is drawn again.
        name = f"t-{stem.strip('-')}-{uuid.uuid4().hex[:8]}"
        try:
            admin.create({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}})
            break
        except ApiError as exc:
            if exc.status != 409 or attempt == 2:
                raise
    # As in a real cluster, pods are admitted only once the namespace has its ServiceAccount.
    wait_for(lambda: admin.get("serviceaccounts", name, "default"),
             what=f"the default ServiceAccount in {name}")
    yield name
    with contextlib.suppress(ApiError):  # no CRD yet: nothing to delete
        admin.request("DELETE", admin.path("inferenceservices", name))
    admin.delete("namespaces", None, name)


@pytest.fixture
def scene(cluster: ControlPlane, admin: Client, installed: Installation, namespace: str,
          tmp_path: Path) -> Scene:
    """One test's namespace, seen and acted on through the real API server."""
    audit = AuditLog(cluster.audit_log)
    return Scene(admin=admin, namespace=namespace, installation=installed, audit=audit,
                 logs=tmp_path / "operator.log", start=audit.mark())


@pytest.fixture(scope="session")
def node_namespace(cluster: ControlPlane, admin: Client, installed: Installation
                   ) -> Iterator[str]:
    """The chart installed for the real node, once a session (its operator pod on the real
    node, started and Ready, takes most of a minute on a busy machine): the namespace its
    operator watches, which the modules using :func:`node` share in turn."""
    try:
        cluster.wait_node()
    except NodeError as exc:
        pytest.fail(f"no real node: {exc}", pytrace=False)
    namespace = f"node-{uuid.uuid4().hex[:6]}"
    admin.create({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}})
    wait_for(lambda: admin.get("serviceaccounts", namespace, "default"),
             what=f"the default ServiceAccount in {namespace}")
    installed_on_node(cluster, admin, namespace, node_images())
    try:
        yield namespace
    finally:
        uninstall(cluster)
        admin.delete("namespaces", None, namespace)


@pytest.fixture(scope="module")
def node(cluster: ControlPlane, admin: Client, node_namespace: str,
         tmp_path_factory: pytest.TempPathFactory) -> Iterator[OnNode]:
    """The real node's namespace for one module; its InferenceServices (and so their pods)
    are gone when the module ends."""
    scene = OnNode(cluster, admin, node_namespace, tmp_path_factory.mktemp("node"))
    try:
        yield scene
    finally:
        scene.delete_all()
