"""How ``make test`` groups the tests on its pytest-xdist workers (``--dist loadgroup``)."""

from __future__ import annotations

import pytest

NODE_GROUP, CONTROL_PLANE_GROUP = "kube-node", "kube"
"""The pytest-xdist groups of the tests that use the control plane: those on the real node,
and those that need only the control plane and its kwok nodes. Each worker that runs either
group starts a control plane of its own; a worker of the second starts the real node only if
a test asks for it (one session that runs both groups)."""
BESIDE_THE_NODE = frozenset({"test_chart_install.py"})
"""Control-plane modules in :data:`NODE_GROUP` all the same: they run first on its worker, so
the real node starts (most of a minute) while they run. Only one: the real node's tests alone
are the suite's longest group."""


def xdist_group_of(item: pytest.Item, uses_cluster: bool) -> str:
    """The pytest-xdist group of ``item`` (``uses_cluster``: it asks for the control plane)."""
    if not uses_cluster:
        return item.nodeid.split("::", 1)[0]  # module by module
    if "node_namespace" in getattr(item, "fixturenames", ()) or item.path.name in BESIDE_THE_NODE:
        return NODE_GROUP
    return CONTROL_PLANE_GROUP
