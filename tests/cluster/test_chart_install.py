"""The chart on the real control plane: installed by the real helm, its RBAC exactly what the
operator needs (checked by the API server's own authorizer), an upgrade, an uninstall that
keeps the CRD and every InferenceService, and a release that watches only some namespaces."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from harness.kube.client import Client, wait_for
from harness.kube.controlplane import ControlPlane
from harness.kube.install import (
    CHART,
    CRD_NAME,
    RELEASE,
    RELEASE_NAMESPACE,
    REPO,
    Installation,
    apply_peering_crds,
    helm,
    helm3_binary,
    helm_binary,
    install,
)

EXAMPLE = yaml.safe_load((REPO / "examples" / "iris.yaml").read_text())


def can_i(cluster: ControlPlane, user: str, verb: str, resource: str,
          namespace: str | None = None) -> bool:
    """``kubectl auth can-i`` as ``user`` (the admin impersonates it)."""
    where = ["-n", namespace] if namespace else ["--all-namespaces"]
    done = cluster.kubectl("auth", "can-i", verb, resource, "--as", user, *where, check=False)
    return done.stdout.strip() == "yes"


def test_the_release_is_deployed_on_the_servers_version(cluster: ControlPlane,
                                                        installed: Installation) -> None:
    status = json.loads(helm(cluster, "status", RELEASE, "-n", RELEASE_NAMESPACE,
                             "-o", "json").stdout)
    assert status["info"]["status"] == "deployed"
    server = json.loads(cluster.kubectl("version", "-o", "json").stdout)["serverVersion"]
    assert server["gitVersion"] == cluster.version  # what helm checked kubeVersion against


@pytest.mark.parametrize("verb,resource,allowed", [
    ("patch", "inferenceservices.tailguard.dev", True),
    ("patch", "inferenceservices.tailguard.dev/status", True),
    ("watch", "inferenceservices.tailguard.dev", True),
    ("create", "deployments.apps", True),
    ("patch", "horizontalpodautoscalers.autoscaling", True),
    ("create", "poddisruptionbudgets.policy", True),
    ("create", "events", True),
    ("list", "customresourcedefinitions.apiextensions.k8s.io", True),
    ("update", "deployments.apps", False),       # never a PUT
    ("delete", "deployments.apps", False),       # the garbage collector deletes children
    ("delete", "inferenceservices.tailguard.dev", False),
    ("update", "inferenceservices.tailguard.dev", False),
    ("get", "secrets", False),
    ("create", "pods", False),
    ("list", "namespaces", False),               # cluster-wide kopf does not list them
    ("patch", "events", True),                  # a repeated Event's count
    ("get", "events", False),
])
def test_the_operator_may_do_exactly_what_it_does(cluster: ControlPlane, installed: Installation,
                                                  verb: str, resource: str,
                                                  allowed: bool) -> None:
    assert can_i(cluster, installed.user, verb, resource) is allowed


def test_an_upgrade_and_an_uninstall_keep_the_crd_and_every_inferenceservice(
        cluster: ControlPlane, admin: Client, installed: Installation, namespace: str) -> None:
    admin.create({**EXAMPLE, "metadata": {"name": "iris", "namespace": namespace}})
    done = helm(cluster, "upgrade", RELEASE, str(REPO / "charts" / "tailguard"),
                "-n", RELEASE_NAMESPACE, "--reuse-values",
                "--set", "operator.resources.requests.cpu=100m")
    assert "has been upgraded" in done.stdout
    deployment = admin.get("deployments", RELEASE_NAMESPACE, f"{RELEASE}-operator")
    assert deployment is not None
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    assert container["resources"]["requests"]["cpu"] == "100m"

    helm(cluster, "uninstall", RELEASE, "-n", RELEASE_NAMESPACE, "--wait")
    try:
        assert admin.get("customresourcedefinitions", None, CRD_NAME) is not None
        assert admin.get("inferenceservices", namespace, "iris") is not None
        wait_for(lambda: admin.get("deployments", RELEASE_NAMESPACE,
                                   f"{RELEASE}-operator") is None, what="operator gone")
        assert not can_i(cluster, installed.user, "patch", "inferenceservices.tailguard.dev")
    finally:  # the other tests need it back: install again over the kept CRD
        helm(cluster, "install", RELEASE, str(REPO / "charts" / "tailguard"),
             "-n", RELEASE_NAMESPACE)
        installed.refresh()
    assert admin.get("inferenceservices", namespace, "iris") is not None


def test_a_release_that_watches_some_namespaces_needs_nothing_more(
        cluster: ControlPlane, admin: Client, installed: Installation, namespace: str,
        tmp_path: Path) -> None:
    """A second release (the CRD left to the first) watching one namespace: a Role there, and
    a ClusterRole only for what kopf needs cluster-wide. Its operator serves that namespace,
    and the API server refuses it anywhere else."""
    other = f"{namespace[:50]}-x"
    admin.create({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": other}})
    team = install(cluster, admin, {"crds": {"install": False},
                                    "watchNamespaces": [namespace]},
                   release="team", namespace=f"{namespace[:50]}-op")
    try:
        assert can_i(cluster, team.user, "patch", "deployments.apps", namespace)
        assert not can_i(cluster, team.user, "patch", "deployments.apps", other)
        assert not can_i(cluster, team.user, "get", "inferenceservices.tailguard.dev", other)
        assert can_i(cluster, team.user, "list", "namespaces")  # kopf matches names with it
        admin.create({**EXAMPLE, "metadata": {"name": "iris", "namespace": namespace}})
        proc = team.start_operator(tmp_path / "team.log")  # the watches alone must do it
        try:
            wait_for(lambda: (admin.get("inferenceservices", namespace, "iris") or {}).get(
                "status", {}).get("observedGeneration") == 1, what="status from the team's "
                "operator")
            wait_for(lambda: len(admin.list("deployments", namespace)) == 2,
                     what="its Deployments")
        finally:
            assert team.stop_operator(proc) == 0, (tmp_path / "team.log").read_text()[-3000:]
        assert "Forbidden" not in (tmp_path / "team.log").read_text()
    finally:
        helm(cluster, "uninstall", "team", "-n", team.namespace, "--wait")
        admin.delete("namespaces", None, other)
        admin.delete("namespaces", None, team.namespace)


@pytest.mark.parametrize("major", [4, 3])
def test_peering_can_be_turned_on_and_off_by_an_upgrade(
        cluster: ControlPlane, admin: Client, installed: Installation, major: int) -> None:
    """A release upgraded from peering to none and back, by Helm 4 (which applies server-side)
    and by Helm 3: the operator Deployment's strategy follows, Recreate then RollingUpdate."""
    binary = helm_binary() if major == 4 else helm3_binary()
    release, namespace = f"peer-h{major}", f"peer-h{major}-system"
    apply_peering_crds(cluster)  # outside the release: kopf operators share them
    base = ["-n", namespace, "--set", "crds.install=false", "--set", "peering.installCRDs=false",
            "--set", f"peering.name={release}"]
    helm(cluster, "install", release, str(CHART), "--create-namespace", *base,
         "--set", "peering.enabled=true", binary=binary)
    try:
        for enabled, strategy in ((False, "Recreate"), (True, "RollingUpdate")):
            helm(cluster, "upgrade", release, str(CHART), *base,
                 "--set", f"peering.enabled={str(enabled).lower()}", binary=binary)
            (stored,) = admin.list("deployments", namespace)  # the operator's
            assert stored["spec"]["strategy"]["type"] == strategy, stored["spec"]["strategy"]
            assert ("rollingUpdate" in stored["spec"]["strategy"]) is enabled
    finally:
        helm(cluster, "uninstall", release, "-n", namespace, "--wait", binary=binary)
        admin.delete("namespaces", None, namespace)


def test_helm_renders_what_the_server_accepts(cluster: ControlPlane,
                                              installed: Installation) -> None:
    """Every optional part of the chart (peering, namespaced RBAC) passes the API server's
    own validation (a server-side dry run), not only a schema check. The Prometheus Operator
    and Grafana objects need CRDs this cluster does not have, so they stay off."""
    values = {"peering": {"enabled": True}, "operator": {"replicas": 2},
              "watchNamespaces": ["default"], "prometheusAdapter": {"rules": {"enabled": True}}}
    path = cluster.workdir / "dry-run-values.yaml"
    path.write_text(yaml.safe_dump(values))
    rendered = helm(cluster, "template", "dry", str(REPO / "charts" / "tailguard"),
                    "-n", "default", "-f", str(path), "--set", "crds.install=false").stdout
    docs = [d for d in yaml.safe_load_all(rendered) if d]
    crds = [d for d in docs if d["kind"] == "CustomResourceDefinition"]
    assert sorted(d["metadata"]["name"] for d in crds) == [
        "clusterkopfpeerings.kopf.dev", "kopfpeerings.kopf.dev"]
    # kopf's peering CRDs for real (a dry run cannot create a CRD and its objects at once).
    cluster.kubectl("apply", "-f", "-", input=yaml.safe_dump_all(crds))
    cluster.kubectl("wait", "--for=condition=Established", "--timeout=30s",
                    *(f"crd/{d['metadata']['name']}" for d in crds))
    rest = yaml.safe_dump_all([d for d in docs if d not in crds])
    done = cluster.kubectl("apply", "--dry-run=server", "-n", "default", "-f", "-",
                           input=rest, check=False)
    assert done.returncode == 0, done.stderr
    assert "deployment.apps/dry-tailguard-operator created (server dry run)" in done.stdout
    assert "kopfpeering.kopf.dev/tailguard created (server dry run)" in done.stdout
