"""Fixtures for the operator tests: a fake Kubernetes API over HTTP, a kubeconfig pointing at
it, and the real kopf operator running against it in a thread.

The fake (``fakeapi.py``) is seeded as a cluster with the operator installed would be: the
``default`` Namespace, the InferenceService CRD object, and its resource served with the
``status`` subresource. Nothing here talks to anything but 127.0.0.1.
"""

from __future__ import annotations

import contextlib
import copy
from pathlib import Path
from typing import Callable, Iterator

import pytest
import yaml
from fakeapi import FakeApiServer, Resource
from harness import NAMESPACE, OPERATOR_ARGS
from kopf.testing import KopfRunner

from tailguard_operator import spec


@pytest.fixture
def fake(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeApiServer]:
    """A running fake API with the CRD installed, and ``$KUBECONFIG`` pointing at it."""
    crd = spec.crd()
    served = crd["spec"]["versions"][0]
    with FakeApiServer() as server:
        server.add_resource(Resource(spec.GROUP, served["name"], crd["spec"]["names"]["plural"],
                                     crd["spec"]["names"]["kind"],
                                     status="status" in served.get("subresources", {})))
        server.create(None, copy.deepcopy(crd))
        config = {
            "apiVersion": "v1", "kind": "Config", "current-context": "fake",
            "clusters": [{"name": "fake", "cluster": {"server": server.url}}],
            "users": [{"name": "fake", "user": {"token": "fake-token"}}],
            "contexts": [{"name": "fake", "context": {"cluster": "fake", "user": "fake",
                                                       "namespace": NAMESPACE}}],
        }
        path = tmp_path / "kubeconfig"
        path.write_text(yaml.safe_dump(config))
        monkeypatch.setenv("KUBECONFIG", str(path))
        monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
        monkeypatch.setenv("TAILGUARD_RETRY_DELAY_SECONDS", "0.5")
        yield server


@pytest.fixture
def operator(fake: FakeApiServer) -> Callable[..., contextlib.AbstractContextManager[KopfRunner]]:
    """A factory of operator runs: ``with operator(): ...`` runs kopf against the fake for
    the duration of the block (twice in a row for a restart); ``operator(ARGS)`` passes other
    ``kopf`` arguments than :data:`harness.OPERATOR_ARGS`."""

    @contextlib.contextmanager
    def run(args: list[str] = OPERATOR_ARGS) -> Iterator[KopfRunner]:
        with KopfRunner(args, timeout=30) as runner:
            yield runner
        assert runner.exit_code == 0, runner.output
        assert runner.exception is None

    return run
