"""The Helm chart: lint, render with several value sets, validate every object, and check the
promises the chart makes (RBAC, CRD lifecycle, peering, one replica).

Every test runs under Helm 4 and Helm 3.
"""

from __future__ import annotations

import io
import tarfile
from typing import Any, Mapping

import pytest
import yaml

from harness.chart import (
    CHART,
    CLUSTER_SCOPED,
    K8S_VERSION,
    RELEASE_NAMESPACE,
    REPO,
    Helm,
    env_of,
    of_kind,
    one,
    operator_container,
    validate_object,
)
from tailguard.operator.settings import OperatorSettings

REPO_CRD = REPO / "crds" / "inferenceservice.yaml"

VALUE_SETS: dict[str, dict[str, Any] | None] = {
    "default": None,
    "namespaced": {"watchNamespaces": ["team-a", "team-b"]},
    "monitoring": {"prometheusAdapter": {"rules": {"enabled": True, "namespace": "monitoring"}},
                   "podMonitor": {"enabled": True, "labels": {"release": "kps"}},
                   "dashboard": {"enabled": True, "namespace": "monitoring"}},
    "monitoring-namespaced": {"watchNamespaces": ["ml"],
                              "prometheusAdapter": {"rules": {"enabled": True}},
                              "podMonitor": {"enabled": True}, "dashboard": {"enabled": True}},
    "peering": {"peering": {"enabled": True}, "operator": {"replicas": 2}},
    "peering-namespaced": {"peering": {"enabled": True, "name": "ml-operators"},
                           "operator": {"replicas": 3}, "watchNamespaces": ["ml", "ml-staging"]},
    "self-managed": {
        "crds": {"install": False},
        "serviceAccount": {"create": False, "name": "platform-operator"},
        "peering": {"enabled": True, "installCRDs": False},
        "operator": {"image": {"repository": "registry.example/tailguard-operator", "tag": "dev",
                               "pullPolicy": "Always"},
                     "livenessProbe": {"enabled": False}, "podAnnotations": {"a": "b"},
                     "metrics": {"enabled": False, "port": 8081},
                     "guard": {"enabled": False, "readTimeoutSeconds": 2.5, "concurrency": 8},
                     "podLabels": {"team": "ml"}, "nodeSelector": {"pool": "system"},
                     "tolerations": [{"key": "system", "operator": "Exists"}],
                     "priorityClassName": "system-cluster-critical"},
        "runtime": {"image": {"repository": "registry.example/tailguard-runtime", "tag": "dev",
                              "pullPolicy": "Always"},
                    "resources": {"requests": {"cpu": "2", "memory": "1Gi"},
                                  "limits": {"memory": "2Gi"}},
                    "preStopSeconds": 0, "nodeSelector": {"pool": "inference"},
                    "tolerations": [{"key": "gpu", "operator": "Exists"}]},
        "imagePullSecrets": [{"name": "registry"}],
    },
}

NAMESPACED_RESOURCES = {
    ("tailguard.dev", "inferenceservices"): ["get", "list", "watch", "patch"],
    ("tailguard.dev", "inferenceservices/status"): ["patch"],
    ("tailguard.dev", "inferenceservices/finalizers"): ["update"],
    ("", "configmaps"): ["get", "list", "watch", "create", "patch", "delete"],
    ("", "services"): ["get", "list", "watch", "create", "patch"],
    ("apps", "deployments"): ["get", "list", "watch", "create", "patch"],
    ("apps", "replicasets"): ["list"],
    ("autoscaling", "horizontalpodautoscalers"): ["get", "list", "watch", "create", "patch"],
    ("policy", "poddisruptionbudgets"): ["get", "list", "watch", "create", "patch"],
    ("", "pods"): ["get", "list", "watch"],
    ("", "events"): ["create", "patch"],
}
"""What the operator touches in a watched namespace, and the verbs it uses (the children go
with their owner through garbage collection; the operator deletes only a revision ConfigMap
that no ReplicaSet (listed, never written) mounts any more;
`update` on the owner's finalizers is what OwnerReferencesPermissionEnforcement asks of a
controller that sets blockOwnerDeletion; the runtime pods are only read, by the SLO guard)."""


def grants(rules: list[Mapping[str, Any]]) -> dict[tuple[str, str], list[str]]:
    """``(apiGroup, resource) -> verbs`` of a rule list (one rule may name several of each)."""
    out: dict[tuple[str, str], list[str]] = {}
    for rule in rules:
        assert not rule.get("resourceNames") and not rule.get("nonResourceURLs")
        for group in rule["apiGroups"]:
            for resource in rule["resources"]:
                key = (group, resource)
                assert key not in out, f"{key} granted twice"
                out[key] = list(rule["verbs"])
    return out


@pytest.mark.parametrize("name", VALUE_SETS)
def test_lint_strict(helm: Helm, name: str) -> None:
    helm.lint(VALUE_SETS[name])


@pytest.mark.parametrize("name", VALUE_SETS)
def test_every_rendered_object_validates(helm: Helm, name: str) -> None:
    objs = helm.template(VALUE_SETS[name])
    assert objs
    # CRDs for custom objects whose CRD this value set leaves out (peering.installCRDs=false).
    crds = of_kind(helm.template(VALUE_SETS["peering"]), "CustomResourceDefinition")
    seen = set()
    for obj in objs:
        validate_object(obj, [*objs, *crds])
        meta = obj["metadata"]
        key = (obj["apiVersion"].split("/")[0], obj["kind"], meta.get("namespace"), meta["name"])
        assert key not in seen, f"rendered twice: {key}"
        seen.add(key)
        if obj["kind"] in CLUSTER_SCOPED:
            assert "namespace" not in meta, f"{obj['kind']}/{meta['name']} is cluster-scoped"
        else:
            assert meta.get("namespace"), f"{obj['kind']}/{meta['name']} names no namespace"
        assert meta["labels"]["app.kubernetes.io/managed-by"] == "Helm"


def test_default_install_renders_only_the_operator_and_its_crd(helm: Helm) -> None:
    objs = helm.template()
    assert sorted(obj["kind"] for obj in objs) == [
        "ClusterRole", "ClusterRoleBinding", "CustomResourceDefinition", "Deployment",
        "ServiceAccount"]


def test_crd_is_the_repository_crd_kept_on_uninstall(helm: Helm) -> None:
    """The chart renders the repository's CRD (only the chart's labels added), as a template so
    that upgrades reach it, and `helm uninstall` keeps it."""
    crd = dict(one(helm.template(), "CustomResourceDefinition"))
    assert crd["metadata"]["annotations"]["helm.sh/resource-policy"] == "keep"
    assert crd["metadata"]["labels"]["app.kubernetes.io/name"] == "tailguard"
    expected = yaml.safe_load(REPO_CRD.read_text(encoding="utf-8"))
    crd["metadata"] = {k: v for k, v in crd["metadata"].items() if k != "labels"}
    assert crd == expected


def test_crd_off_renders_no_inferenceservice_crd(helm: Helm) -> None:
    objs = helm.template({"crds": {"install": False}})
    assert not of_kind(objs, "CustomResourceDefinition")


def test_packaged_chart_carries_the_crd_and_dashboard_byte_for_byte(helm: Helm) -> None:
    """files/inferenceservice.yaml is a copy of crds/ (`make crds`); `helm package` stores it,
    so a packaged chart installs the same CRD."""
    out = helm.scratch / "pkg"
    helm.run("package", str(CHART), "--destination", str(out))
    (archive,) = out.glob("tailguard-*.tgz")
    with tarfile.open(archive) as tar:
        def read(name: str) -> bytes:
            member = tar.extractfile(f"tailguard/{name}")
            assert member is not None, name
            return member.read()

        packaged = read("files/inferenceservice.yaml")
        assert packaged == (CHART / "files/inferenceservice.yaml").read_bytes()
        assert packaged.endswith(REPO_CRD.read_bytes())
        assert read("dashboards/tailguard.json") == (CHART / "dashboards/tailguard.json").read_bytes()
        assert yaml.safe_load(io.BytesIO(read("Chart.yaml")))["name"] == "tailguard"


def test_cluster_wide_rbac_is_one_cluster_role_with_exactly_the_verbs_used(helm: Helm) -> None:
    objs = helm.template()
    assert not of_kind(objs, "Role") and not of_kind(objs, "RoleBinding")
    rules = grants(one(objs, "ClusterRole")["rules"])
    assert rules == {**NAMESPACED_RESOURCES,
                     ("apiextensions.k8s.io", "customresourcedefinitions"): ["list", "watch"]}
    binding = one(objs, "ClusterRoleBinding")
    assert binding["roleRef"]["name"] == one(objs, "ClusterRole")["metadata"]["name"]
    assert binding["subjects"] == [{"kind": "ServiceAccount",
                                    "name": one(objs, "ServiceAccount")["metadata"]["name"],
                                    "namespace": RELEASE_NAMESPACE}]


def test_namespaced_rbac_is_a_role_per_watched_namespace(helm: Helm) -> None:
    objs = helm.template(VALUE_SETS["namespaced"])
    roles = of_kind(objs, "Role")
    assert [r["metadata"]["namespace"] for r in roles] == ["team-a", "team-b"]
    for role in roles:
        assert grants(role["rules"]) == NAMESPACED_RESOURCES
    bindings = of_kind(objs, "RoleBinding")
    assert [b["metadata"]["namespace"] for b in bindings] == ["team-a", "team-b"]
    for binding in bindings:
        assert binding["roleRef"] == {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role",
                                      "name": roles[0]["metadata"]["name"]}
        assert binding["subjects"][0]["namespace"] == RELEASE_NAMESPACE
    # What kopf still needs cluster-wide: CRDs, and namespace names to match its namespaces.
    assert grants(one(objs, "ClusterRole")["rules"]) == {
        ("apiextensions.k8s.io", "customresourcedefinitions"): ["list", "watch"],
        ("", "namespaces"): ["list", "watch"]}
    assert env_of(operator_container(objs))["TAILGUARD_NAMESPACES"] == "team-a,team-b"


@pytest.mark.parametrize("name", VALUE_SETS)
def test_no_rule_grants_more_than_the_operator_uses(helm: Helm, name: str) -> None:
    objs = helm.template(VALUE_SETS[name])
    for role in of_kind(objs, "ClusterRole") + of_kind(objs, "Role"):
        for rule in role["rules"]:
            assert "*" not in rule["verbs"] + rule["resources"] + rule["apiGroups"]
            assert not {"deletecollection", "escalate", "bind",
                        "impersonate"} & set(rule["verbs"]), rule
            if "delete" in rule["verbs"]:  # only unused revision ConfigMaps
                assert rule["resources"] == ["configmaps"], rule
            if "update" in rule["verbs"]:  # only for blockOwnerDeletion on children
                assert rule["resources"] == ["inferenceservices/finalizers"], rule
            assert not {"secrets", "pods/exec"} & set(rule["resources"]), rule
            if "pods" in rule["resources"]:  # the SLO guard's pod watch: read only
                assert rule["resources"] == ["pods"] and rule["verbs"] == [
                    "get", "list", "watch"], rule


def test_rbac_covers_every_child_the_operator_builds(helm: Helm) -> None:
    """The kinds manifests.py builds are exactly the children the Role lets it create."""
    from tailguard.operator import manifests
    from tailguard.operator.settings import OperatorSettings
    from tailguard.spec import resource

    isvc = resource.load_file((REPO / "examples/digits.yaml").read_text(encoding="utf-8"))
    children = manifests.children(isvc, manifests.Owner("digits", "uid-1"), OperatorSettings(),
                                  active_role="primary")
    built = {(c["apiVersion"].rpartition("/")[0], c["kind"].lower() + "s") for c in children}
    rules = grants(one(helm.template(), "ClusterRole")["rules"])
    creatable = {key for key, verbs in rules.items() if "create" in verbs and key[1] != "events"}
    assert built == creatable


def test_peering_cluster_wide(helm: Helm) -> None:
    objs = helm.template(VALUE_SETS["peering"])
    crds = {c["metadata"]["name"]: c for c in of_kind(objs, "CustomResourceDefinition")}
    assert set(crds) == {"inferenceservices.tailguard.dev", "clusterkopfpeerings.kopf.dev",
                         "kopfpeerings.kopf.dev"}
    assert crds["clusterkopfpeerings.kopf.dev"]["spec"]["scope"] == "Cluster"
    peering = one(objs, "ClusterKopfPeering")
    assert peering["metadata"]["name"] == "tailguard"
    # A hook: created after the CRDs exist, even on the first install.
    assert peering["metadata"]["annotations"]["helm.sh/hook"] == "post-install,post-upgrade"
    assert grants(one(objs, "ClusterRole")["rules"])[("kopf.dev", "clusterkopfpeerings")] == [
        "get", "list", "watch", "patch"]  # get: the resync reads it (operator/peering.py)
    deployment = one(objs, "Deployment")
    assert deployment["spec"]["replicas"] == 2
    assert deployment["spec"]["strategy"] == {  # peering keeps old and new apart; whole, so an
        "type": "RollingUpdate",                # upgrade to Recreate owns what it removes
        "rollingUpdate": {"maxSurge": "25%", "maxUnavailable": "25%"}}
    env = env_of(operator_container(objs))
    assert env["TAILGUARD_PEERING"] == "tailguard"
    pod_id = [e for e in operator_container(objs)["env"] if e["name"] == "POD_ID"]
    assert pod_id[0]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.name"


def test_peering_namespaced_has_a_peering_object_per_namespace(helm: Helm) -> None:
    objs = helm.template(VALUE_SETS["peering-namespaced"])
    assert not of_kind(objs, "ClusterKopfPeering")
    peerings = of_kind(objs, "KopfPeering")
    assert [(p["metadata"]["namespace"], p["metadata"]["name"]) for p in peerings] == [
        ("ml", "ml-operators"), ("ml-staging", "ml-operators")]
    for role in of_kind(objs, "Role"):
        assert grants(role["rules"])[("kopf.dev", "kopfpeerings")] == [
            "get", "list", "watch", "patch"]
    assert ("kopf.dev", "clusterkopfpeerings") not in grants(one(objs, "ClusterRole")["rules"])
    assert env_of(operator_container(objs))["TAILGUARD_PEERING"] == "ml-operators"


def test_without_peering_one_replica_standalone_and_recreate(helm: Helm) -> None:
    objs = helm.template()
    deployment = one(objs, "Deployment")
    assert deployment["spec"]["replicas"] == 1
    assert deployment["spec"]["strategy"] == {"type": "Recreate"}
    assert env_of(operator_container(objs))["TAILGUARD_PEERING"] == ""
    assert not [c for c in of_kind(objs, "CustomResourceDefinition")
                if c["spec"]["group"] == "kopf.dev"]
    err = helm.template_error({"operator": {"replicas": 2}})
    assert "operator.replicas > 1 needs peering.enabled=true" in err


def test_peering_crds_can_be_left_to_another_kopf_operator(helm: Helm) -> None:
    objs = helm.template(VALUE_SETS["self-managed"])
    assert not of_kind(objs, "CustomResourceDefinition")
    assert of_kind(objs, "ClusterKopfPeering")


def test_operator_pod_is_locked_down(helm: Helm) -> None:
    objs = helm.template()
    pod = one(objs, "Deployment")["spec"]["template"]["spec"]
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["runAsUser"] == 10001
    assert pod["serviceAccountName"] == one(objs, "ServiceAccount")["metadata"]["name"]
    container = operator_container(objs)
    assert container["securityContext"] == {"allowPrivilegeEscalation": False,
                                            "readOnlyRootFilesystem": True,
                                            "capabilities": {"drop": ["ALL"]}}
    assert "cpu" not in container["resources"].get("limits", {})
    # The liveness probe asks the endpoint the operator is told to serve.
    endpoint = env_of(container)["TAILGUARD_LIVENESS_ENDPOINT"]
    port = {p["name"]: p["containerPort"] for p in container["ports"]}
    probe = container["livenessProbe"]["httpGet"]
    assert endpoint == f"http://0.0.0.0:{port[probe['port']]}{probe['path']}"


def test_overridden_values_reach_the_operator(helm: Helm) -> None:
    objs = helm.template(VALUE_SETS["self-managed"])
    assert not of_kind(objs, "ServiceAccount")
    container = operator_container(objs)
    assert container["image"] == "registry.example/tailguard-operator:dev"
    assert container["imagePullPolicy"] == "Always"
    assert "livenessProbe" not in container and "ports" not in container
    env = env_of(container)
    assert (env["TAILGUARD_METRICS_PORT"], env["TAILGUARD_GUARD"]) == ("0", "false")
    assert (env["TAILGUARD_GUARD_READ_TIMEOUT_SECONDS"], env["TAILGUARD_GUARD_CONCURRENCY"]) \
        == ("2.5", "8")
    assert "TAILGUARD_LIVENESS_ENDPOINT" not in env_of(container)
    env = env_of(container)
    assert env["TAILGUARD_RUNTIME_IMAGE"] == "registry.example/tailguard-runtime:dev"
    assert env["TAILGUARD_IMAGE_PULL_POLICY"] == "Always"
    assert (env["TAILGUARD_CPU_REQUEST"], env["TAILGUARD_MEMORY_REQUEST"],
            env["TAILGUARD_MEMORY_LIMIT"], env["TAILGUARD_PRE_STOP_SECONDS"]) == (
        "2", "1Gi", "2Gi", "0")
    settings = OperatorSettings.from_env(env)
    assert settings.runtime_node_selector == {"pool": "inference"}
    assert settings.runtime_tolerations == [{"key": "gpu", "operator": "Exists"}]
    pod = one(objs, "Deployment")["spec"]["template"]
    assert pod["spec"]["serviceAccountName"] == "platform-operator"
    assert pod["spec"]["imagePullSecrets"] == [{"name": "registry"}]
    assert pod["metadata"]["labels"]["team"] == "ml"
    assert one(objs, "ClusterRoleBinding")["subjects"][0]["name"] == "platform-operator"


@pytest.mark.parametrize("values, complaint", [
    ({"operator": {"replicaz": 2}}, "replicaz"),
    ({"runtime": {"resources": {"requests": {"cpu": "1", "memory": "1Gi"},
                                "limits": {"memory": "1Gi", "cpu": "1"}}}}, "cpu"),
    ({"watchNamespaces": ["Not_A_Namespace"]}, "watchNamespaces"),
    ({"runtime": {"image": {"repository": "x", "tag": "", "pullPolicy": "Sometimes"}}},
     "pullPolicy"),
])
def test_values_schema_refuses_mistakes(helm: Helm, values: dict[str, Any], complaint: str) -> None:
    assert complaint in helm.template_error(values)


def test_kubernetes_older_than_1_29_is_refused(helm: Helm) -> None:
    proc = helm.run("template", "tailguard", str(CHART), "--kube-version", "1.28.0", check=False)
    assert proc.returncode != 0 and "kubeVersion" in proc.stderr
    assert K8S_VERSION >= "1.29"
