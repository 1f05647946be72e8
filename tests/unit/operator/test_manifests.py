"""The manifest builders: every object valid for current Kubernetes (strict), and carrying what
a served, autoscaled, politely terminated InferenceService needs."""

from __future__ import annotations

import hashlib
import json
from typing import Any

import kubernetes_validate
import pytest

from harness.scene import BEHAVIOR, example
from tailguard.operator import manifests
from tailguard.operator.settings import OperatorSettings
from tailguard.spec import resource
from tailguard_runtime.settings import RuntimeSettings

KUBERNETES_VERSIONS = ("1.34.0", "1.37.0")
OWNER = manifests.Owner(name="ignored", uid="5a1c3e1e-0000-4000-8000-000000000001")
SHA = "ab" * 32

SPECS = {
    "defaults": example("iris"),
    "digits": example("digits"),
    "behavior": example("iris", scaling={"minReplicas": 2, "maxReplicas": 10,
                                         "targetQueueDepth": 4, "targetCPUUtilization": 60,
                                         "behavior": BEHAVIOR}),
    "files": example("iris",
                     model={"uri": "file:///models/iris-forest.joblib", "sha256": SHA,
                            "version": "2024-06"},
                     fallback={"uri": "file:///models/iris-logreg.joblib", "sha256": "cd" * 32}),
    "on-fallback": example("iris", traffic="fallback"),
    "urls": example("iris",
                    model={"uri": "https://models.example.com/iris.joblib?sig=1", "sha256": SHA,
                           "maxBytes": 50_000_000, "caConfigMap": "private-ca"},
                    fallback={"uri": "http://models.ml.svc/iris-logreg.joblib",
                              "sha256": "cd" * 32}),
    "claims": example("iris", model={"uri": "pvc://models/v2/iris.joblib", "sha256": SHA},
                      fallback={"uri": "builtin://iris/logistic-regression"}),
    "grpc-port": example("iris", grpcPort=9001),
}


def build(name: str, active: str = "primary", **settings: Any) -> list[dict[str, Any]]:
    isvc = resource.parse(SPECS[name])
    owner = manifests.Owner(name=isvc.name, uid=OWNER.uid)
    children: list[dict[str, Any]] = manifests.children(
        isvc, owner, OperatorSettings(**settings), active_role=active)
    return children


def by_kind(children: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [c for c in children if c["kind"] == kind]


@pytest.mark.parametrize("version", KUBERNETES_VERSIONS)
@pytest.mark.parametrize("name", sorted(SPECS))
def test_every_child_validates_strictly(name: str, version: str) -> None:
    for active in manifests.ROLES:
        for obj in build(name, active):
            kubernetes_validate.validate(obj, version, strict=True)


def test_url_models_get_a_download_folder_sized_by_their_cap_and_their_ca() -> None:
    deployments = {d["metadata"]["name"]: d["spec"]["template"]["spec"]
                   for d in by_kind(build("urls"), "Deployment")}
    sizes, cas = {}, {}
    for name, pod in deployments.items():
        (container,) = pod["containers"]
        env = {e["name"]: e["value"] for e in container["env"]}
        mounts = {m["name"]: m for m in container["volumeMounts"]}
        volumes = {v["name"]: v for v in pod["volumes"]}
        assert env["TAILGUARD_MODEL_CACHE"] == mounts["models"]["mountPath"] \
            == "/var/cache/tailguard/models"
        sizes[name] = volumes["models"]["emptyDir"]["sizeLimit"]
        assert container["startupProbe"]["failureThreshold"] * \
            container["startupProbe"]["periodSeconds"] >= 900  # a 10-minute attempt, retries
        if "model-ca" in volumes:
            assert mounts["model-ca"] == {"name": "model-ca", "readOnly": True,
                                          "mountPath": "/etc/tailguard/model-ca"}
            assert env["TAILGUARD_MODEL_CA_FILE"] == "/etc/tailguard/model-ca/ca.crt"
            cas[name] = volumes["model-ca"]["configMap"]
        else:
            assert "TAILGUARD_MODEL_CA_FILE" not in env
    assert sizes == {"iris-primary": str(50_000_000 + 2**20),
                     "iris-fallback": str(2**30 + 2**20)}
    assert cas == {"iris-primary": {"name": "private-ca",
                                    "items": [{"key": "ca.crt", "path": "ca.crt"}]}}
    for deployment in by_kind(build("defaults"), "Deployment"):
        volumes = deployment["spec"]["template"]["spec"]["volumes"]
        assert {"models", "model-ca"}.isdisjoint(v["name"] for v in volumes)


def test_a_claim_model_mounts_its_claim_read_only_in_its_role_only() -> None:
    pods = {d["metadata"]["name"]: d["spec"]["template"]["spec"]
            for d in by_kind(build("claims"), "Deployment")}
    primary, fallback = pods["iris-primary"], pods["iris-fallback"]
    (container,) = primary["containers"]
    assert {"name": "model-claim", "persistentVolumeClaim": {"claimName": "models",
                                                              "readOnly": True}} \
        in primary["volumes"]
    assert {"name": "model-claim", "mountPath": "/mnt/pvc/models", "readOnly": True} \
        in container["volumeMounts"]
    assert {"name": "TAILGUARD_PVC_ROOT", "value": "/mnt/pvc"} in container["env"]
    assert "model-claim" not in {v["name"] for v in fallback["volumes"]}
    assert manifests.cluster_problems(resource.parse(example(
        "iris", model={"uri": "pvc://models/iris.joblib"}))) == [
        "spec.model.sha256: required in a cluster for a pvc:// model (pvc://models/iris.joblib)"]


def test_children_are_named_labelled_and_owned() -> None:
    children = build("defaults")
    isvc = resource.parse(SPECS["defaults"])
    revision = {role: f"iris-{role}-" + manifests.config_checksum(isvc, role)[:10]
                for role in manifests.ROLES}
    assert [(c["kind"], c["metadata"]["name"]) for c in children] == [
        ("ConfigMap", "iris-traffic"), ("ConfigMap", revision["primary"]),
        ("ConfigMap", revision["fallback"]), ("Deployment", "iris-primary"),
        ("Deployment", "iris-fallback"), ("Service", "iris"),
        ("HorizontalPodAutoscaler", "iris-primary"), ("HorizontalPodAutoscaler", "iris-fallback"),
        ("PodDisruptionBudget", "iris-primary"), ("PodDisruptionBudget", "iris-fallback")]
    for child in children:
        meta = child["metadata"]
        assert meta["namespace"] == "default"
        assert meta["ownerReferences"] == [{
            "apiVersion": "tailguard.dev/v1alpha1", "kind": "InferenceService", "name": "iris",
            "uid": OWNER.uid, "controller": True, "blockOwnerDeletion": True}]
        assert meta["labels"]["app.kubernetes.io/name"] == "tailguard-runtime"
        assert meta["labels"]["app.kubernetes.io/instance"] == "iris"
        assert meta["labels"]["app.kubernetes.io/component"] == "predictor"
        assert meta["labels"]["app.kubernetes.io/managed-by"] == "tailguard-operator"
        assert meta["labels"]["app.kubernetes.io/part-of"] == "tailguard"
        assert meta["labels"]["tailguard.dev/inferenceservice"] == "iris"
        role = meta["name"].removeprefix("iris-").partition("-")[0]
        if role in manifests.ROLES:
            assert meta["labels"]["tailguard.dev/role"] == role
        else:
            assert "tailguard.dev/role" not in meta["labels"]


@pytest.mark.parametrize("role", manifests.ROLES)
def test_the_pods_serve_one_role_and_terminate_gracefully(role: str) -> None:
    deployment = next(d for d in by_kind(build("digits"), "Deployment")
                      if d["metadata"]["name"] == f"digits-{role}")
    template = deployment["spec"]["template"]
    pod = template["spec"]
    (container,) = pod["containers"]
    assert container["image"] == "tailguard/runtime:0.1.0"
    assert container["command"] == ["tailguard-runtime", "--config", "/etc/tailguard/runtime.json",
                                    "--traffic", "/etc/tailguard/traffic.json", "--role", role, "--host", "0.0.0.0", "--port", "8080",
                                    "--termination-log", "/dev/termination-log"]
    assert container["ports"] == [{"name": "http", "containerPort": 8080, "protocol": "TCP"},
                                  {"name": "grpc", "containerPort": 8081, "protocol": "TCP"}]
    assert container["readinessProbe"]["httpGet"]["path"] == "/v2/health/ready"
    assert container["livenessProbe"]["httpGet"]["path"] == "/v2/health/live"
    assert container["startupProbe"]["httpGet"]["port"] == "http"
    assert {e["name"]: e["value"] for e in container["env"]} == {
        "OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    assert set(container["resources"]["requests"]) == {"cpu", "memory"}
    assert container["resources"]["limits"] == {"memory": "1Gi"}  # no CPU limit
    assert {"name": "config", "mountPath": "/etc/tailguard", "readOnly": True} in \
        container["volumeMounts"]
    revision = manifests.config_checksum(resource.parse(SPECS["digits"]), role)[:10]
    assert pod["volumes"][0] == {"name": "config", "projected": {"sources": [
        {"configMap": {"name": f"digits-{role}-{revision}",
                       "items": [{"key": "runtime.json", "path": "runtime.json"}]}},
        {"configMap": {"name": "digits-traffic",
                       "items": [{"key": "traffic.json", "path": "traffic.json"}]}}]}}
    assert manifests.config_maps_named(deployment) == {f"digits-{role}-{revision}",
                                                       "digits-traffic"}
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert container["securityContext"]["allowPrivilegeEscalation"] is False
    pre_stop = int(container["lifecycle"]["preStop"]["exec"]["command"][-1].split()[-1])
    config = json.loads(manifests.config_map(resource.parse(SPECS["digits"]), OWNER, "primary")[
        "data"]["runtime.json"])
    assert pod["terminationGracePeriodSeconds"] > pre_stop + config["drainGraceSeconds"]
    assert deployment["spec"]["selector"]["matchLabels"] == {
        "app.kubernetes.io/name": "tailguard-runtime", "app.kubernetes.io/instance": "digits",
        "tailguard.dev/role": role}
    assert deployment["spec"]["selector"]["matchLabels"].items() <= \
        template["metadata"]["labels"].items()
    assert deployment["spec"]["replicas"] == 1
    assert template["metadata"]["annotations"][manifests.CHECKSUM_ANNOTATION]


def test_the_runtime_reads_its_revisions_config_map_and_a_switch_rolls_no_pods() -> None:
    isvc = resource.parse(SPECS["files"])
    primary_map, fallback_map = (manifests.config_map(isvc, OWNER, role)
                                 for role in manifests.ROLES)
    assert primary_map["immutable"] is True and fallback_map["immutable"] is True
    config = json.loads(primary_map["data"]["runtime.json"])
    assert "activeModel" not in config
    assert manifests.config_checksum(isvc, "primary") == hashlib.sha256(json.dumps(
        config, sort_keys=True).encode()).hexdigest()
    settings = RuntimeSettings.from_config(config)
    assert settings.name == "iris"
    assert [(m.role, m.uri, m.sha256) for m in settings.models] == [
        ("primary", "file:///models/iris-forest.joblib", SHA)]
    assert [(m.role, m.uri, m.sha256) for m in RuntimeSettings.from_config(json.loads(
        fallback_map["data"]["runtime.json"])).models] == [
        ("fallback", "file:///models/iris-logreg.joblib", "cd" * 32)]
    assert settings.batching == isvc.batching
    assert settings.stats_window_seconds == isvc.slo.window_seconds
    assert settings.drain_grace_seconds == config["drainGraceSeconds"]
    assert config["models"][0]["version"] == "2024-06"
    for role in manifests.ROLES:
        traffic = manifests.traffic_config_map(isvc, OWNER, role)
        assert traffic["metadata"]["name"] == "iris-traffic" and "immutable" not in traffic
        assert json.loads(traffic["data"]["traffic.json"]) == {"activeModel": role}
        assert not manifests.is_revision_config(traffic)
    assert manifests.is_revision_config(primary_map)

    primary, fallback = (manifests.deployment(isvc, OWNER, role, OperatorSettings())
                         for role in manifests.ROLES)
    checksums = [d["spec"]["template"]["metadata"]["annotations"][manifests.CHECKSUM_ANNOTATION]
                 for d in (primary, fallback)]
    assert checksums == [manifests.config_checksum(isvc, role) for role in manifests.ROLES]


def test_each_role_rolls_only_when_what_it_serves_changes() -> None:
    def sums(isvc: resource.InferenceService) -> dict[str, str]:
        return {role: manifests.config_checksum(isvc, role) for role in manifests.ROLES}

    base = sums(resource.parse(example("iris")))
    assert base["primary"] != base["fallback"]
    batching = sums(resource.parse(example("iris", batching={"maxBatchSize": 8})))
    assert all(batching[role] != base[role] for role in manifests.ROLES)
    primary = sums(resource.parse(example(
        "iris", model={"uri": "builtin://iris/random-forest?trees=7"})))
    assert primary["primary"] != base["primary"] and primary["fallback"] == base["fallback"]
    fallback = sums(resource.parse(example(
        "iris", fallback={"uri": "builtin://iris/random-forest?trees=3"})))
    assert fallback["fallback"] != base["fallback"] and fallback["primary"] == base["primary"]
    assert sums(resource.parse(example("iris", traffic="fallback"))) == base


def test_the_service_selects_the_active_role() -> None:
    for active in manifests.ROLES:
        (service,) = by_kind(build("defaults", active), "Service")
        assert service["spec"]["selector"]["tailguard.dev/role"] == active
        assert service["spec"]["ports"] == [
            {"name": "http", "port": 80, "targetPort": "http", "protocol": "TCP"},
            {"name": "grpc", "port": 8081, "targetPort": "grpc", "protocol": "TCP",
             "appProtocol": "grpc"}]


def test_grpc_port_reaches_the_pods_the_service_and_the_runtime_config() -> None:
    objects = build("grpc-port")
    (service,) = by_kind(objects, "Service")
    assert service["spec"]["ports"][1]["port"] == 9001
    for deployment in by_kind(objects, "Deployment"):
        (container,) = deployment["spec"]["template"]["spec"]["containers"]
        assert container["ports"][1] == {"name": "grpc", "containerPort": 9001, "protocol": "TCP"}
    for config_map in by_kind(objects, "ConfigMap")[1:]:
        assert json.loads(config_map["data"]["runtime.json"])["grpcPort"] == 9001


def test_each_role_autoscales_on_queue_depth_and_cpu() -> None:
    hpas = by_kind(build("behavior"), "HorizontalPodAutoscaler")
    assert [h["spec"]["scaleTargetRef"]["name"] for h in hpas] == ["iris-primary", "iris-fallback"]
    for hpa in hpas:
        assert hpa["spec"]["minReplicas"] == 2 and hpa["spec"]["maxReplicas"] == 10
        pods, cpu = hpa["spec"]["metrics"]
        assert pods == {"type": "Pods", "pods": {
            "metric": {"name": "tailguard_queue_depth"},
            "target": {"type": "AverageValue", "averageValue": "4"}}}
        assert cpu["resource"] == {"name": "cpu", "target": {"type": "Utilization",
                                                             "averageUtilization": 60}}
        assert hpa["spec"]["behavior"] == BEHAVIOR
    (default_hpa, _) = by_kind(build("defaults"), "HorizontalPodAutoscaler")
    assert "behavior" not in default_hpa["spec"]
    raised = manifests.autoscaler(resource.parse(SPECS["defaults"]), OWNER, "fallback", 3)
    assert raised["spec"]["minReplicas"] == 3


def test_each_role_has_a_disruption_budget() -> None:
    for pdb in by_kind(build("defaults"), "PodDisruptionBudget"):
        role = pdb["metadata"]["name"].rpartition("-")[2]
        assert pdb["spec"]["maxUnavailable"] == 1
        assert pdb["spec"]["selector"]["matchLabels"]["tailguard.dev/role"] == role


def test_operator_settings_reach_the_pods() -> None:
    (deployment, _) = by_kind(build("defaults", runtime_image="registry.example/rt:9",
                                    cpu_request="2", memory_limit="3Gi", pre_stop_seconds=0),
                              "Deployment")
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    assert container["image"] == "registry.example/rt:9"
    assert container["resources"]["requests"]["cpu"] == "2"
    assert container["resources"]["limits"] == {"memory": "3Gi"}
    assert container["lifecycle"]["preStop"]["exec"]["command"] == [
        "sh", "-c", "kill -USR1 1; exec sleep 0"]
    assert "nodeSelector" not in deployment["spec"]["template"]["spec"]
    assert "tolerations" not in deployment["spec"]["template"]["spec"]


def test_runtime_pods_go_where_the_settings_place_them() -> None:
    toleration = {"key": "tailguard.dev/node", "operator": "Exists", "effect": "NoSchedule"}
    for deployment in by_kind(build("defaults", runtime_node_selector={"type": "real"},
                                    runtime_tolerations=[toleration]), "Deployment"):
        pod = deployment["spec"]["template"]["spec"]
        assert pod["nodeSelector"] == {"type": "real"}
        assert pod["tolerations"] == [toleration]


def test_cluster_problems_name_the_missing_checksum() -> None:
    assert manifests.cluster_problems(resource.parse(SPECS["files"])) == []
    bare = resource.parse(example("iris", fallback={"uri": "file:///models/x.joblib"}))
    (problem,) = manifests.cluster_problems(bare)
    assert problem.startswith("spec.fallback.sha256: required")


def test_a_bad_role_is_refused() -> None:
    isvc = resource.parse(SPECS["defaults"])
    with pytest.raises(ValueError, match="active_role"):
        manifests.children(isvc, OWNER, OperatorSettings(), active_role="canary")
    with pytest.raises(ValueError, match="role"):
        manifests.child_name("iris", "Deployment", None)


def test_urls_and_timings() -> None:
    isvc = resource.parse(example("iris", batching={"timeoutMs": 30000}))
    assert manifests.service_url(isvc) == "http://iris.default.svc/v2/models/iris/infer"
    assert manifests.drain_grace_seconds(isvc) == 35
    assert manifests.drain_grace_seconds(resource.parse(SPECS["defaults"])) == 10
    assert manifests.termination_grace_seconds(isvc, OperatorSettings()) == 5 + 35 + 10


def test_the_validator_is_not_silent() -> None:
    """Guard for the strict validation above: a misspelt field fails it."""
    (deployment, _) = by_kind(build("defaults"), "Deployment")
    deployment["spec"]["template"]["spec"]["containers"][0]["cpuLimit"] = "1"
    with pytest.raises(kubernetes_validate.ValidationError, match="cpuLimit"):
        kubernetes_validate.validate(deployment, KUBERNETES_VERSIONS[0], strict=True)
