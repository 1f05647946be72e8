"""The Kubernetes client module without a cluster: its errors."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest
import yaml

from tailguard.operator import kube
from tailguard.spec import resource


def test_an_unreachable_server_and_missing_credentials_are_kube_errors(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with socket.socket() as sock:  # a port with nothing listening
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    config = {"apiVersion": "v1", "kind": "Config", "current-context": "x",
              "clusters": [{"name": "x", "cluster": {"server": f"http://127.0.0.1:{port}"}}],
              "users": [{"name": "x", "user": {"token": "t"}}],
              "contexts": [{"name": "x", "context": {"cluster": "x", "user": "x"}}]}
    path = tmp_path / "config"
    path.write_text(yaml.safe_dump(config))
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    kube.connect(kubeconfig=str(path))
    with pytest.raises(kube.KubeError) as unreachable:
        kube.get(resource.KIND, "default", "iris")
    assert unreachable.value.reason == "Unreachable"
    with pytest.raises(kube.KubeError, match="no Kubernetes credentials"):
        kube.connect(kubeconfig=str(tmp_path / "absent"))
