"""harness.kube.metrics, without a cluster: the Prometheus scrape configs made from a
PodMonitor, and the API objects that give the pipeline its access and register its APIs."""

from __future__ import annotations

import base64
from typing import Any

import pytest

from harness.kube.holder import NODE_IP
from harness.kube.metrics import access_objects, scrape_configs

MONITOR: dict[str, Any] = {
    "apiVersion": "monitoring.coreos.com/v1", "kind": "PodMonitor",
    "metadata": {"name": "tailguard-runtime", "namespace": "tailguard-system"},
    "spec": {
        "namespaceSelector": {"matchNames": ["team-a", "team-b"]},
        "selector": {"matchLabels": {"app.kubernetes.io/managed-by": "tailguard-operator",
                                     "app.kubernetes.io/name": "tailguard-runtime"}},
        "podMetricsEndpoints": [{"port": "http", "path": "/metrics", "interval": "5s"}],
    },
}
ACCESS = {"api_server": "https://127.0.0.1:6443", "ca_file": "/ca.crt", "token_file": "/token"}


def test_a_pod_monitor_becomes_one_pod_discovery_job_per_endpoint() -> None:
    (config,) = scrape_configs(MONITOR, **ACCESS)
    assert config["job_name"] == "podMonitor/tailguard-system/tailguard-runtime/0"
    assert config["scrape_interval"] == "5s" and config["metrics_path"] == "/metrics"
    (discovery,) = config["kubernetes_sd_configs"]
    assert discovery["role"] == "pod" and discovery["api_server"] == ACCESS["api_server"]
    assert discovery["namespaces"] == {"names": ["team-a", "team-b"]}
    assert discovery["authorization"] == {"credentials_file": "/token"}
    keeps = [r for r in config["relabel_configs"] if r.get("action") == "keep"]
    assert keeps == [
        {"action": "keep",
         "source_labels": ["__meta_kubernetes_pod_label_app_kubernetes_io_managed_by",
                           "__meta_kubernetes_pod_labelpresent_app_kubernetes_io_managed_by"],
         "regex": "(tailguard\\-operator);true"},
        {"action": "keep",
         "source_labels": ["__meta_kubernetes_pod_label_app_kubernetes_io_name",
                           "__meta_kubernetes_pod_labelpresent_app_kubernetes_io_name"],
         "regex": "(tailguard\\-runtime);true"},
        {"action": "keep", "source_labels": ["__meta_kubernetes_pod_container_port_name"],
         "regex": "http"}]
    targets = {r["target_label"]: r.get("source_labels", r.get("replacement"))
               for r in config["relabel_configs"] if "target_label" in r}
    # The labels the chart's adapter rules resolve to Kubernetes objects.
    assert targets["namespace"] == ["__meta_kubernetes_namespace"]
    assert targets["pod"] == ["__meta_kubernetes_pod_name"]
    assert targets["job"] == "tailguard-system/tailguard-runtime"


def test_any_namespace_discovers_every_namespace() -> None:
    monitor = {**MONITOR, "spec": {**MONITOR["spec"], "namespaceSelector": {"any": True}}}
    (config,) = scrape_configs(monitor, **ACCESS)
    assert "namespaces" not in config["kubernetes_sd_configs"][0]


@pytest.mark.parametrize("change", [
    {"selector": {"matchExpressions": [{"key": "a", "operator": "Exists"}]}},
    {"podMetricsEndpoints": [{"targetPort": 8080}]},
    {"podMetricsEndpoints": [{"port": "http", "relabelings": [{"action": "drop"}]}]},
])
def test_what_is_not_translated_is_refused(change: dict[str, Any]) -> None:
    with pytest.raises(ValueError):
        scrape_configs({**MONITOR, "spec": {**MONITOR["spec"], **change}}, **ACCESS)


def test_both_apis_are_registered_with_the_ca_and_lead_to_the_node_address() -> None:
    objects = access_objects(b"PEM")
    services = {o["spec"]["group"] + "/" + o["spec"]["version"]: o["spec"]
                for o in objects if o["kind"] == "APIService"}
    assert set(services) == {"metrics.k8s.io/v1beta1", "custom.metrics.k8s.io/v1beta1",
                             "custom.metrics.k8s.io/v1beta2"}
    assert all(base64.b64decode(s["caBundle"]) == b"PEM" for s in services.values())
    slices = [o for o in objects if o["kind"] == "EndpointSlice"]
    assert {s["endpoints"][0]["addresses"][0] for s in slices} == {NODE_IP}
    delegators = {o["subjects"][0]["name"] for o in objects
                  if o["kind"] == "ClusterRoleBinding"
                  and o["roleRef"]["name"] == "system:auth-delegator"}
    assert delegators == {"metrics-server", "prometheus-adapter"}
