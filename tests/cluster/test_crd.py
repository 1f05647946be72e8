"""The CRD on the real API server: installed by helm, re-applied by kubectl, every example
accepted, every refusal the README lists refused naming the field, and ``tailguard validate``
agreeing with ``kubectl apply --dry-run=server`` on all of them."""

from __future__ import annotations

import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
import yaml

from harness import REPO
from harness.kube.client import Client
from harness.kube.controlplane import ControlPlane
from harness.kube.install import CRD_NAME, Installation
from harness.scene import EXAMPLES, INVALID, example
from tailguard.spec import schema

SERVER_FIELD = {
    "unknown field": 'unknown field "spec.modle"',
    "no SLO": "spec.slo: Required value",
    "bad policy type": "spec.scaling.behavior.scaleUp.policies[0].type",
    "unknown behavior field": 'unknown field "spec.scaling.behavior.scaleSideways"',
}
"""Where the API server words a field differently from ``tailguard validate``."""
NAMES = {"upper case": "Iris", "too long": "a" * 55, "leading digit": "9lives"}
COLUMNS = ["NAME", "ACTIVE", "P99-MS", "SLO-MS", "QUEUE", "REPLICAS", "READY", "SLO", "AGE"]


def invalid_body(case: str, namespace: str) -> dict[str, Any]:
    changes, _ = INVALID[case]
    body = example("iris", namespace=namespace, **changes)
    body["spec"] = {k: v for k, v in body["spec"].items() if v is not None}
    return body


def validate(path: Path) -> subprocess.CompletedProcess[str]:
    """``tailguard validate FILE``."""
    return subprocess.run([str(Path(sys.executable).with_name("tailguard")), "validate",
                           str(path)], capture_output=True, text=True, timeout=60)


def server_dry_run(cluster: ControlPlane, path: Path, namespace: str
                   ) -> subprocess.CompletedProcess[str]:
    """``kubectl apply --dry-run=server -f FILE`` (strict field validation, kubectl's default)."""
    return cluster.kubectl("apply", "--dry-run=server", "-n", namespace, "-f", str(path),
                           check=False)


def both(cluster: ControlPlane, path: Path, namespace: str
         ) -> tuple[subprocess.CompletedProcess[str], subprocess.CompletedProcess[str]]:
    """:func:`server_dry_run` and :func:`validate` of ``path``, run side by side."""
    with ThreadPoolExecutor(1) as pool:
        local = pool.submit(validate, path)
        return server_dry_run(cluster, path, namespace), local.result()


def test_helm_installed_the_crd_and_kubectl_can_take_it_over(
        cluster: ControlPlane, admin: Client, installed: Installation) -> None:
    crd = admin.get("customresourcedefinitions", None, CRD_NAME)
    assert crd is not None
    assert crd["metadata"]["annotations"]["helm.sh/resource-policy"] == "keep"
    assert crd["metadata"]["labels"]["app.kubernetes.io/managed-by"] == "Helm"
    stored = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    assert stored == schema.object_schema()  # nothing pruned or rewritten
    # The README's other path, for a release with crds.install=false: the same file applied
    # server-side. A dry run: a real one would take the fields from helm's field manager, and
    # the next `helm upgrade` (server-side apply in Helm 4) would conflict with kubectl's.
    done = cluster.kubectl("apply", "--server-side", "--force-conflicts", "--dry-run=server",
                           "-f", str(REPO / "crds" / "inferenceservice.yaml"))
    assert "serverside-applied (server dry run)" in done.stdout


@pytest.mark.parametrize("path", sorted(EXAMPLES.glob("*.yaml")), ids=lambda p: p.name)
def test_every_example_is_applied_and_listed_with_the_readme_columns(
        cluster: ControlPlane, installed: Installation, namespace: str, path: Path) -> None:
    assert validate(path).returncode == 0
    done = cluster.kubectl("apply", "-n", namespace, "-f", str(path))
    assert f"inferenceservice.tailguard.dev/{path.stem} created" in done.stdout
    table = cluster.kubectl("get", "tgis", "-n", namespace).stdout.splitlines()
    assert table[0].split() == COLUMNS
    assert table[1].split()[0] == path.stem
    short = cluster.kubectl("get", "tailguard", "-n", namespace, "-o", "name").stdout
    assert f"inferenceservice.tailguard.dev/{path.stem}" in short  # the category works too


def test_absent_blocks_get_every_default_from_the_server(
        admin: Client, installed: Installation, namespace: str) -> None:
    created = admin.create(example("iris", namespace=namespace))
    assert created["spec"]["batching"] == {"maxBatchSize": 32, "maxWaitMs": 0,
                                           "maxQueueSize": 256, "timeoutMs": 1000}
    assert created["spec"]["scaling"] == {"minReplicas": 1, "maxReplicas": 5,
                                          "targetQueueDepth": 8, "targetCPUUtilization": 80}
    assert created["spec"]["rollback"] == {"automatic": True}
    assert created["spec"]["traffic"] == "primary"
    assert created["spec"]["model"]["version"] == "1"
    local = schema.validate_object(example("iris", namespace=namespace))
    assert local["spec"] == created["spec"]  # tailguard up fills in exactly the same


@pytest.mark.parametrize("case", sorted(INVALID))
def test_refusals_come_from_the_server_naming_the_field_and_validate_agrees(
        cluster: ControlPlane, installed: Installation, namespace: str, tmp_path: Path,
        case: str) -> None:
    path = tmp_path / "isvc.yaml"
    path.write_text(yaml.safe_dump(invalid_body(case, namespace)))
    server, local = both(cluster, path, namespace)
    assert server.returncode != 0, server.stdout
    assert local.returncode != 0, local.stdout
    assert SERVER_FIELD.get(case, INVALID[case][1]) in server.stderr, server.stderr
    assert INVALID[case][1] in local.stderr, local.stderr


@pytest.mark.parametrize("case", sorted(NAMES))
def test_names_that_cannot_name_the_children_are_refused_by_both(
        cluster: ControlPlane, installed: Installation, namespace: str, tmp_path: Path,
        case: str) -> None:
    body = example("iris", namespace=namespace)
    body["metadata"]["name"] = NAMES[case]
    path = tmp_path / "isvc.yaml"
    path.write_text(yaml.safe_dump(body))
    server, local = both(cluster, path, namespace)
    assert server.returncode != 0 and local.returncode != 0
    assert "metadata.name" in server.stderr and "metadata.name" in local.stderr


@pytest.mark.parametrize("changes", [
    {"slo": {"p99LatencyMs": 1}},                       # maxWaitMs defaults to 0 < 1
    {"batching": {"maxBatchSize": 256}},                # maxQueueSize defaults to 256
    {"scaling": {"minReplicas": 5}},                    # maxReplicas defaults to 5
    {"slo": {"p99LatencyMs": 25, "breachWindows": 6}},  # recoverWindows defaults to 6
], ids=["wait", "batch", "replicas", "windows"])
def test_rules_see_the_defaults_on_both_sides(
        cluster: ControlPlane, installed: Installation, namespace: str, tmp_path: Path,
        changes: dict[str, Any]) -> None:
    path = tmp_path / "isvc.yaml"
    path.write_text(yaml.safe_dump(example("iris", namespace=namespace, **changes)))
    server, local = both(cluster, path, namespace)
    assert server.returncode == 0, server.stderr
    assert local.returncode == 0, local.stderr
