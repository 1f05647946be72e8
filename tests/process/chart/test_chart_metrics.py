"""The Grafana dashboard and the prometheus-adapter rules ask only for series the runtime
exports (tailguard_runtime.metrics), with labels those series carry, and the adapter serves the
metric the operator's HPAs scale on."""

from __future__ import annotations

import json
import re
from typing import Any, Iterator

import pytest
import yaml
from prometheus_client.metrics import MetricWrapperBase

from harness.chart import CHART, Helm, one
from tailguard_runtime import metrics

DASHBOARD = CHART / "dashboards" / "tailguard.json"
TARGET_LABELS = {"namespace", "pod", "container", "endpoint", "job", "instance"}
"""Labels Prometheus adds to every series a PodMonitor scrapes."""
PROMQL_WORDS = {"by", "without", "on", "ignoring", "group_left", "group_right", "bool",
                "offset", "le"}
METRIC_NAME = re.compile(r"\btailguard_[a-z0-9_]+")


def exported_series() -> dict[str, set[str]]:
    """Every series name the runtime exports -> its labels, from the metric objects declared in
    tailguard_runtime.metrics (histograms export ``_bucket``/``_sum``/``_count``, counters
    ``_total``)."""
    out: dict[str, set[str]] = {}
    for value in vars(metrics).values():
        if not isinstance(value, MetricWrapperBase):
            continue
        for family in value.collect():
            labels = set(value._labelnames)  # the declared label names (no public accessor)
            if family.type == "histogram":
                out[f"{family.name}_bucket"] = labels | {"le"}
                out[f"{family.name}_sum"] = labels
                out[f"{family.name}_count"] = labels
            elif family.type == "counter":
                out[f"{family.name}_total"] = labels
            else:
                out[family.name] = labels
    return out


def dashboard_queries(dashboard: dict[str, Any]) -> Iterator[str]:
    """Every PromQL expression of the dashboard: panel targets and variable queries."""
    for panel in dashboard["panels"]:
        for target in panel["targets"]:
            yield target["expr"]
    for variable in dashboard["templating"]["list"]:
        if variable["type"] == "query":
            yield variable["query"]["query"]


def check_query(expr: str, series: dict[str, set[str]], implied: tuple[str, ...] = ()) -> None:
    """Metric names exist; labels in matchers and grouping clauses exist on them. ``implied``:
    series the expression reads without naming them (an adapter's ``<<.Series>>``)."""
    names = METRIC_NAME.findall(expr) + list(implied)
    assert names, f"no tailguard series in {expr}"
    for name in names:
        assert name in series, f"{name} is not exported by tailguard_runtime.metrics: {expr}"
    allowed = set().union(*(series[n] for n in names)) | TARGET_LABELS
    used = set()
    for group in re.findall(r"\b(?:by|without)\s*\(([^)]*)\)", expr):
        used |= {label.strip() for label in group.split(",") if label.strip()}
    for matchers in re.findall(r"\{([^}]*)\}", expr):
        used |= set(re.findall(r"([a-zA-Z_][a-zA-Z0-9_]*)\s*(?:=~|!~|!=|=)", matchers))
    used -= {"__name__"}
    # Adapter templates (<<.GroupBy>>) stand for the resource labels the rule maps.
    used = {label for label in used if not label.startswith("<<")}
    assert used <= allowed, f"labels {sorted(used - allowed)} are not on {names}: {expr}"


def test_runtime_exports_what_the_contract_names() -> None:
    series = exported_series()
    assert {"tailguard_request_duration_seconds_bucket", "tailguard_queue_wait_seconds_bucket",
            "tailguard_batch_size_rows_bucket", "tailguard_batch_duration_seconds_bucket",
            "tailguard_queue_depth", "tailguard_in_flight_requests", "tailguard_requests_total",
            "tailguard_rejections_total", "tailguard_active_model"} <= set(series)
    assert series["tailguard_requests_total"] == {"model", "version", "role", "code"}


def test_dashboard_queries_only_exported_series_and_labels() -> None:
    dashboard = json.loads(DASHBOARD.read_text(encoding="utf-8"))
    series = exported_series()
    queries = list(dashboard_queries(dashboard))
    assert queries
    for expr in queries:
        check_query(expr, series)
    for variable in dashboard["templating"]["list"]:
        if variable["type"] == "query":
            metric, label = re.fullmatch(r"label_values\((\w+)(?:\{[^}]*\})?,\s*(\w+)\)",
                                         variable["query"]["query"]).groups()  # type: ignore[union-attr]
            assert label in series[metric] | TARGET_LABELS


def test_dashboard_shows_what_the_issue_asks_for() -> None:
    dashboard = json.loads(DASHBOARD.read_text(encoding="utf-8"))
    exprs = "\n".join(dashboard_queries(dashboard))
    for q in ("0.5", "0.95", "0.99"):
        assert f"histogram_quantile({q}, sum by (le) (rate(tailguard_request_duration_seconds_bucket" in exprs
    assert "tailguard_slo_p99_latency_seconds" in exprs  # the SLO line, from the runtime
    assert "tailguard_queue_depth" in exprs
    assert "tailguard_batch_size_rows" in exprs
    assert "sum by (code) (rate(tailguard_requests_total" in exprs
    assert "sum by (reason) (rate(tailguard_rejections_total" in exprs
    assert 'code=~"5.."' in exprs
    assert "tailguard_active_model" in exprs
    variables = {v["name"] for v in dashboard["templating"]["list"]}
    assert variables == {"datasource", "namespace", "service"}


def test_dashboard_layout_is_well_formed() -> None:
    dashboard = json.loads(DASHBOARD.read_text(encoding="utf-8"))
    ids = [p["id"] for p in dashboard["panels"]]
    assert len(ids) == len(set(ids))
    for panel in dashboard["panels"]:
        grid = panel["gridPos"]
        assert grid["x"] >= 0 and grid["w"] > 0 and grid["x"] + grid["w"] <= 24, panel["title"]
        assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}
        refs = [t["refId"] for t in panel["targets"]]
        assert len(refs) == len(set(refs)), panel["title"]


def test_dashboard_configmap_carries_the_file(helm: Helm) -> None:
    objs = helm.template({"dashboard": {"enabled": True, "namespace": "monitoring"}})
    cm = one(objs, "ConfigMap")
    assert cm["metadata"]["namespace"] == "monitoring"
    assert cm["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert json.loads(cm["data"]["tailguard.json"]) == json.loads(DASHBOARD.read_text("utf-8"))


@pytest.fixture
def adapter_rules(helm: Helm) -> list[dict[str, Any]]:
    objs = helm.template({"prometheusAdapter": {"rules": {"enabled": True,
                                                          "namespace": "monitoring"}}})
    cm = one(objs, "ConfigMap")
    assert cm["metadata"]["name"] == "tailguard-adapter-rules"
    assert cm["metadata"]["namespace"] == "monitoring"
    assert list(cm["data"]) == ["config.yaml"]  # the key prometheus-adapter reads
    config = yaml.safe_load(cm["data"]["config.yaml"])
    assert list(config) == ["rules"]
    return config["rules"]  # type: ignore[no-any-return]


def test_adapter_rules_read_exported_series_per_pod(adapter_rules: list[dict[str, Any]]) -> None:
    series = exported_series()
    for rule in adapter_rules:
        check_query(rule["seriesQuery"], series)
        (name,) = METRIC_NAME.findall(rule["seriesQuery"])
        check_query(rule["metricsQuery"], series, implied=(name,))
        assert re.fullmatch(rule["name"]["matches"], name)
        assert rule["resources"]["overrides"]["pod"] == {"resource": "pod"}
        assert rule["resources"]["overrides"]["namespace"] == {"resource": "namespace"}
        assert "<<.Series>>{<<.LabelMatchers>>}" in rule["metricsQuery"]
        assert "<<.GroupBy>>" in rule["metricsQuery"]


def test_adapter_serves_the_metric_the_operator_scales_on(
        adapter_rules: list[dict[str, Any]]) -> None:
    from harness.chart import REPO
    from tailguard.operator import manifests
    from tailguard.spec import resource
    from tailguard.spec.resource import load_file

    served = {rule["name"]["as"] for rule in adapter_rules}
    assert served == {"tailguard_queue_depth", "tailguard_request_duration_p99_seconds"}
    isvc = load_file((REPO / "examples/digits.yaml").read_text(encoding="utf-8"))
    hpa = manifests.autoscaler(isvc, manifests.Owner("digits", "uid-1"), "primary")
    pods_metrics = [m["pods"]["metric"]["name"] for m in hpa["spec"]["metrics"]
                    if m["type"] == "Pods"]
    assert pods_metrics == [manifests.QUEUE_DEPTH_METRIC] and pods_metrics[0] in served
    assert resource.KIND == "InferenceService"
    p99 = [r for r in adapter_rules if r["name"]["as"].endswith("_p99_seconds")]
    assert p99[0]["metricsQuery"].startswith("histogram_quantile(0.99, ")
