"""Fixtures for the operator tests: a namespace of their own on the real control plane, with
the chart installed and its operator run per test (``scene.operator()``)."""

from __future__ import annotations

from pathlib import Path

import pytest
from harness import Scene
from kubecluster.audit import AuditLog
from kubecluster.client import Client
from kubecluster.controlplane import ControlPlane
from kubecluster.install import Installation


@pytest.fixture
def scene(cluster: ControlPlane, admin: Client, installed: Installation, namespace: str,
          tmp_path: Path) -> Scene:
    """One test's namespace, seen and acted on through the real API server."""
    audit = AuditLog(cluster.audit_log)
    return Scene(admin=admin, namespace=namespace, installation=installed, audit=audit,
                 logs=tmp_path / "operator.log", start=audit.mark())
