"""What the chart, image and kind-path tests share: repository paths and a Helm runner."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
from pathlib import Path
from typing import Any, Mapping, Sequence

import jsonschema
import kubernetes_validate
import pytest
import yaml

from harness import REPO

CHART = REPO / "charts" / "tailguard"
K8S_VERSION: str = kubernetes_validate.latest_version()
"""The newest Kubernetes version kubernetes-validate has schemas for: rendering and validation
both use it."""
RELEASE = "tailguard"
RELEASE_NAMESPACE = "tailguard-system"
INSTALL_HINT = ("run `bash scripts/install-helm.sh .ci/bin` and put .ci/bin on PATH, or point "
                "$HELM (Helm 4) and $HELM3 (Helm 3) at the binaries")


class Helm:
    """One Helm binary, run against the chart with values written to a scratch folder."""

    def __init__(self, path: str, major: int, scratch: Path) -> None:
        self.path = path
        self.major = major
        self.scratch = scratch

    def run(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        """Run ``helm ARGS``; with ``check``, fail the test with Helm's stderr on a non-zero exit."""
        proc = subprocess.run([self.path, *args], capture_output=True, text=True, timeout=120,
                              env={**os.environ, "HELM_CACHE_HOME": str(self.scratch / "cache"),
                                   "HELM_CONFIG_HOME": str(self.scratch / "config"),
                                   "HELM_DATA_HOME": str(self.scratch / "data")})
        if check and proc.returncode != 0:
            pytest.fail(f"helm {' '.join(args)} (Helm {self.major}) exited {proc.returncode}:\n"
                        f"{proc.stderr}")
        return proc

    def values_args(self, values: Mapping[str, Any] | None) -> list[str]:
        """``-f FILE`` for ``values`` (nothing for ``None``)."""
        if values is None:
            return []
        path = self.scratch / f"values-{len(list(self.scratch.glob('values-*')))}.yaml"
        path.write_text(yaml.safe_dump(dict(values)), encoding="utf-8")
        return ["-f", str(path)]

    def template_args(self, values: Mapping[str, Any] | None, extra: Sequence[str] = ()) -> list[str]:
        return ["template", RELEASE, str(CHART), "--namespace", RELEASE_NAMESPACE,
                "--kube-version", K8S_VERSION, "--include-crds",
                *self.values_args(values), *extra]

    def template(self, values: Mapping[str, Any] | None = None,
                 extra: Sequence[str] = ()) -> list[dict[str, Any]]:
        """Render the chart; return its objects in order (hooks included)."""
        out = self.run(*self.template_args(values, extra)).stdout
        return [doc for doc in yaml.safe_load_all(out) if doc]

    def template_error(self, values: Mapping[str, Any] | None = None,
                       extra: Sequence[str] = ()) -> str:
        """Render the chart expecting a refusal; return Helm's stderr."""
        proc = self.run(*self.template_args(values, extra), check=False)
        assert proc.returncode != 0, f"Helm {self.major} rendered values it should refuse"
        return proc.stderr

    def lint(self, values: Mapping[str, Any] | None = None) -> subprocess.CompletedProcess[str]:
        return self.run("lint", "--strict", str(CHART), "--namespace", RELEASE_NAMESPACE,
                        "--kube-version", K8S_VERSION, *self.values_args(values))


def demo_commands(step: str) -> list[list[str]]:
    """The commands ``scripts/kind-demo.sh STEP`` runs, as argv lists: its ``DRY_RUN=1`` output
    (lines starting ``+ ``, shell-quoted), a trailing ``&`` dropped."""
    proc = subprocess.run(["bash", str(REPO / "scripts/kind-demo.sh"), step], cwd=REPO,
                          capture_output=True, text=True, timeout=60,
                          env={**os.environ, "DRY_RUN": "1"})
    assert proc.returncode == 0, proc.stderr
    lines = (proc.stdout + proc.stderr).splitlines()
    return [shlex.split(line[2:].rstrip(" &")) for line in lines if line.startswith("+ ")]


def find_commands(commands: Sequence[list[str]], *prefix: str) -> list[list[str]]:
    """The commands whose argv starts with ``prefix``, in order."""
    return [c for c in commands if c[:len(prefix)] == list(prefix)]


def flag_values(argv: Sequence[str], name: str) -> list[str]:
    """Every value given to ``name`` as a separate argument (``--flag value``)."""
    return [argv[i + 1] for i, a in enumerate(argv) if a == name]


CLUSTER_SCOPED = {"ClusterRole", "ClusterRoleBinding", "CustomResourceDefinition",
                  "ClusterKopfPeering", "Namespace"}


def of_kind(objs: Sequence[Mapping[str, Any]], kind: str) -> list[Mapping[str, Any]]:
    """The objects of one kind, in render order."""
    return [obj for obj in objs if obj["kind"] == kind]


def one(objs: Sequence[Mapping[str, Any]], kind: str) -> Mapping[str, Any]:
    """The only object of ``kind``; fails the test if there are none or several."""
    found = of_kind(objs, kind)
    assert len(found) == 1, f"expected one {kind}, found {len(found)}"
    return found[0]


def operator_container(objs: Sequence[Mapping[str, Any]]) -> Mapping[str, Any]:
    """The operator Deployment's only container."""
    containers = one(objs, "Deployment")["spec"]["template"]["spec"]["containers"]
    assert len(containers) == 1
    return containers[0]  # type: ignore[no-any-return]


def env_of(container: Mapping[str, Any]) -> dict[str, str]:
    """A container's plain ``value`` environment variables."""
    return {e["name"]: e["value"] for e in container.get("env", []) if "value" in e}


def validate_object(obj: Mapping[str, Any], rendered: Sequence[Mapping[str, Any]]) -> None:
    """Validate one rendered object, strictly, for :data:`K8S_VERSION`.

    Built-in kinds go through kubernetes-validate. It has no schema for custom kinds (it raises
    ``SchemaNotFoundError``, which its CLI merely prints as a warning), so an object of a CRD
    rendered alongside is checked against that CRD's ``openAPIV3Schema``, and a PodMonitor
    (whose CRD comes from the Prometheus Operator) against the fields the chart relies on.
    Anything else unknown fails.
    """
    try:
        kubernetes_validate.validate(dict(obj), K8S_VERSION, strict=True)
        return
    except kubernetes_validate.ValidationError as exc:
        path = ".".join(str(p) for p in exc.path)
        pytest.fail(f"{obj['kind']}/{obj['metadata']['name']}: {path}: {exc.message}")
    except kubernetes_validate.SchemaNotFoundError:
        pass
    group, _, version = obj["apiVersion"].rpartition("/")
    for crd in of_kind(rendered, "CustomResourceDefinition"):
        if crd["spec"]["group"] == group and crd["spec"]["names"]["kind"] == obj["kind"]:
            served = [v for v in crd["spec"]["versions"] if v["name"] == version and v["served"]]
            assert served, f"{obj['apiVersion']} is not served by {crd['metadata']['name']}"
            scope = crd["spec"]["scope"]
            assert ("namespace" in obj["metadata"]) == (scope == "Namespaced"), \
                f"{obj['kind']}/{obj['metadata']['name']} vs its CRD's scope {scope}"
            schema = _plain_schema(served[0]["schema"]["openAPIV3Schema"])
            schema["properties"] = {"apiVersion": {"type": "string"}, "kind": {"type": "string"},
                                    "metadata": {"type": "object"}, **schema["properties"]}
            jsonschema.validate(dict(obj), schema)
            return
    if (group, obj["kind"]) == ("monitoring.coreos.com", "PodMonitor"):
        check_pod_monitor(obj)
        return
    pytest.fail(f"no schema for {obj['apiVersion']} {obj['kind']}")


def check_pod_monitor(obj: Mapping[str, Any]) -> None:
    """The PodMonitor fields the chart sets, with the types monitoring.coreos.com/v1 has."""
    assert obj["apiVersion"] == "monitoring.coreos.com/v1"
    spec = obj["spec"]
    assert set(spec) <= {"namespaceSelector", "selector", "podMetricsEndpoints"}, set(spec)
    ns = spec["namespaceSelector"]
    assert ns == {"any": True} or (set(ns) == {"matchNames"} and ns["matchNames"]
                                   and all(isinstance(n, str) for n in ns["matchNames"])), ns
    labels = spec["selector"]["matchLabels"]
    assert labels and all(isinstance(v, str) for v in labels.values())
    for endpoint in spec["podMetricsEndpoints"]:
        assert set(endpoint) <= {"port", "path", "interval"}, set(endpoint)
        assert isinstance(endpoint["port"], str) and endpoint["path"].startswith("/")
        assert is_duration(endpoint["interval"]), endpoint["interval"]


def is_duration(text: str) -> bool:
    """A Prometheus duration such as ``15s`` or ``1m``."""
    return re.fullmatch(r"[0-9]+(ms|s|m|h)", text) is not None


def _plain_schema(schema: Any) -> Any:
    """An OpenAPI v3 structural schema as plain JSON Schema: drop the ``x-kubernetes-*`` keys
    (honouring ``x-kubernetes-preserve-unknown-fields``) and forbid unknown fields elsewhere, as
    the API server's strict field validation does."""
    if isinstance(schema, list):
        return [_plain_schema(s) for s in schema]
    if not isinstance(schema, dict):
        return schema
    out = {k: _plain_schema(v) for k, v in schema.items() if not k.startswith("x-kubernetes-")}
    if "properties" in schema and not schema.get("x-kubernetes-preserve-unknown-fields"):
        out.setdefault("additionalProperties", False)
    if out.get("type") == "object" and "properties" not in out:
        out.pop("additionalProperties", None)
    return out
