"""The images, the chart, the operator's manifests, the examples and the kind path agree.

No Docker engine or cluster runs here, so this is how the cluster path stays coherent by
construction: image names and tags, the port, the config path and the entry commands are read
from each place that states them (the Dockerfile, chart values and templates, manifests.py,
scripts/kind-demo.sh in DRY_RUN mode, kind-config.yaml, examples/) and compared.
"""

from __future__ import annotations

import json
import os
import posixpath
import re
import subprocess
import sys
import tomllib
from pathlib import Path
from typing import Any, Mapping

import pytest
import yaml

from harness.chart import (
    CHART,
    REPO,
    Helm,
    demo_commands,
    env_of,
    find_commands,
    flag_values,
    of_kind,
    one,
    operator_container,
    validate_object,
)
from harness.dockerfile import Stage, build_command, parse, pip_installs, requirement_extras
from tailguard.operator import manifests
from tailguard.operator.peering import Peering
from tailguard.operator.settings import OperatorSettings
from tailguard.spec import resource
from tailguard_runtime.models import load_dataset
from tailguard_runtime.settings import RuntimeSettings
from tailguard_runtime.wire import decode_v2

PYPROJECT = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))
VERSION = PYPROJECT["project"]["version"]
CHART_META = yaml.safe_load((CHART / "Chart.yaml").read_text(encoding="utf-8"))
VALUES = yaml.safe_load((CHART / "values.yaml").read_text(encoding="utf-8"))
RUNTIME_IMAGE = f"tailguard/runtime:{VERSION}"
OPERATOR_IMAGE = f"tailguard/operator:{VERSION}"
CLI_ENV = {"TAILGUARD_NAMESPACES", "TAILGUARD_PEERING", "TAILGUARD_LIVENESS_ENDPOINT"}
"""Variables the chart sets that `tailguard operator` itself reads (the rest are
OperatorSettings fields)."""
POD_LABELS = {"app.kubernetes.io/name", "app.kubernetes.io/instance",
              "app.kubernetes.io/component", "app.kubernetes.io/managed-by",
              "tailguard.dev/inferenceservice", "tailguard.dev/role"}


# --- the Dockerfile --------------------------------------------------------------------------

DOCKERFILE = parse("Dockerfile")
TARGETS = {"runtime": RUNTIME_IMAGE, "operator": OPERATOR_IMAGE}
"""Each final target of the Dockerfile and the image it is tagged as."""
EXTRAS = {"runtime": frozenset(), "operator": frozenset({"operator"})}
"""The extras of `tailguard` each target installs (pyproject.toml's optional-dependencies)."""
VENV = "/opt/tailguard"


def options(argv: list[str]) -> dict[str, str]:
    """``--flag value`` pairs of a command line."""
    assert len(argv) % 2 == 0 and all(a.startswith("--") for a in argv[::2]), argv
    return dict(zip(argv[::2], argv[1::2]))


def docker_ignored(path: str, patterns: list[str]) -> bool:
    """Whether .dockerignore ``patterns`` leave ``path`` (relative, '/'-separated) out of the
    build context: the last pattern matching the path or one of its parent folders decides;
    ``!`` re-includes."""
    excluded = False
    for pattern in patterns:
        negate = pattern.startswith("!")
        pattern = pattern.lstrip("!").strip("/")
        regex = "".join("(.*/)?" if tok == "**/" else ".*" if tok == "**" else "[^/]*"
                        if tok == "*" else "[^/]" if tok == "?" else re.escape(tok)
                        for tok in re.findall(r"\*\*/|\*\*|\*|\?|[^*?]+", pattern))
        parts = path.split("/")
        prefixes = ["/".join(parts[:i]) for i in range(1, len(parts) + 1)]
        if any(re.fullmatch(regex, p) for p in prefixes):
            excluded = not negate
    return excluded


def venv_source(target: str) -> Stage:
    """The build stage whose virtual environment the target's final stage copies: the only
    ``COPY --from`` of the target's chain."""
    final = DOCKERFILE.target(target)
    copies = [c for s in DOCKERFILE.chain(final) for c in s.copies_from()]
    assert copies == [(copies[0][0], [VENV, VENV])], copies
    return DOCKERFILE.stage(copies[0][0])


def distributions(extras: frozenset[str]) -> set[str]:
    """The names of the distributions `tailguard[EXTRAS]` requires directly, its own extras
    followed (``test`` asks for ``tailguard[operator,tools]``)."""
    project = PYPROJECT["project"]
    names: set[str] = set()
    todo = [project["dependencies"], *(project["optional-dependencies"][e] for e in extras)]
    while todo:
        for requirement in todo.pop():
            name, more = requirement_extras(re.split(r"[<>=!~;\s]", requirement)[0])
            if name == project["name"]:
                todo.extend(project["optional-dependencies"][e] for e in more)
            else:
                names.add(name.lower())
    return names


@pytest.mark.parametrize("target", TARGETS)
def test_image_is_multi_stage_slim_non_root_without_compilers(target: str) -> None:
    final = DOCKERFILE.target(target)
    assert final.name == target
    build = venv_source(target)
    chain = DOCKERFILE.chain(final)
    assert not set(map(id, chain)) & set(map(id, DOCKERFILE.chain(build)))  # not FROM a build
    assert DOCKERFILE.image(build) == DOCKERFILE.image(final)
    assert DOCKERFILE.image(final).startswith("python:3.11-slim")
    required = PYPROJECT["project"]["requires-python"]
    assert required == ">=3.11"
    # Everything installs into a virtual environment that the final stage copies.
    # ... pinned to the versions CI tests (constraints.txt).
    assert any("pip install -c constraints.txt ." in run for run in DOCKERFILE.runs(build))
    # The compilers stay in the build stages.
    assert any("build-essential" in run for run in DOCKERFILE.runs(build))
    assert DOCKERFILE.env(final)["PATH"].startswith(f"{VENV}/bin:")
    for run in DOCKERFILE.runs(final):
        assert "apt-get" not in run and "pip install" not in run, run
    assert [user for s in chain for user in s.args("USER")] == ["10001:10001"]
    assert any("--uid 10001" in run and "--gid 10001" in run for run in DOCKERFILE.runs(final))
    labels = " ".join(label for s in chain for label in s.args("LABEL"))
    assert f'org.opencontainers.image.title="tailguard-{target}"' in labels
    assert 'org.opencontainers.image.licenses="Apache-2.0"' in labels


@pytest.mark.parametrize("target", TARGETS)
def test_each_target_copies_the_venv_of_its_own_build_with_its_extras(target: str) -> None:
    """The runtime installs `tailguard` without extras, the operator with exactly
    `operator`; each final stage copies its own build stage's environment, so neither carries
    what the other needs (nor matplotlib, which only `tailguard[tools]` brings)."""
    build = venv_source(target)
    assert [venv_source(t).name for t in TARGETS].count(build.name) == 1
    installs = []
    for run in DOCKERFILE.runs(build):
        installs += pip_installs(run)
        commands = [command.split() for command in run.split("&&")]
        for i, command in enumerate(commands):
            if "install" in command and command[command.index("install") - 1].endswith("pip"):
                # the environment's own pip checks right after each install, in the same RUN
                assert commands[i + 1:i + 2] == [[f"{VENV}/bin/pip", "check"]], run
                assert command[0] == f"{VENV}/bin/pip", run
    assert installs
    extras: set[str] = set()
    for argv in installs:
        assert argv[:2] == ["-c", "constraints.txt"], argv
        for requirement in argv[2:]:
            where, more = requirement_extras(requirement)
            assert where == ".", argv  # the distribution in the build context
            extras |= more
    assert extras == EXTRAS[target]
    carried = distributions(EXTRAS[target])
    assert "matplotlib" not in carried
    if target == "operator":
        assert {"kopf", "kubernetes"} <= carried
    else:
        assert not {"kopf", "kubernetes"} & carried
    assert set(PYPROJECT["project"]["optional-dependencies"]) >= EXTRAS[target]


def test_build_context_holds_what_the_image_copies_and_little_else() -> None:
    patterns = [line.strip() for line in (REPO / ".dockerignore").read_text().splitlines()
                if line.strip() and not line.startswith("#")]
    copies = [copy.split() for stage in DOCKERFILE.stages for copy in stage.args("COPY")]
    sources = [src for copy in copies if not copy[0].startswith("--from=") for src in copy[:-1]]
    assert sorted(sources) == ["README.md", "constraints.txt", "operator/tailguard/",
                               "pyproject.toml", "runtime/tailguard_runtime/"]
    for source in sources:
        root = REPO / source
        assert root.exists(), source
        files = [root] if root.is_file() else [p for p in root.rglob("*") if p.is_file()]
        for file in files:
            rel = file.relative_to(REPO).as_posix()
            if "__pycache__" not in rel:
                assert not docker_ignored(rel, patterns), f"{rel} is needed but .dockerignore drops it"
    for outside in ("tests/harness/chart.py", "benchmarks/refmodel.py", ".git/HEAD", "charts/tailguard/Chart.yaml",
                    "runtime/tailguard_runtime/__pycache__/x.pyc", "Dockerfile"):
        assert docker_ignored(outside, patterns), outside


def test_runtime_image_entry_point_and_environment() -> None:
    final = DOCKERFILE.target("runtime")
    assert DOCKERFILE.target(None) is final  # `docker build .` builds the runtime
    assert final.exec_form("ENTRYPOINT") == ["tailguard-runtime"]
    cmd = options(final.exec_form("CMD"))
    assert cmd == {"--config": "/etc/tailguard/runtime.json", "--host": "0.0.0.0",
                   "--port": str(manifests.PORT)}
    # HTTP, and the gRPC service at the CRD's default grpcPort
    assert final.args("EXPOSE") == [f"{manifests.PORT} {RuntimeSettings.grpc_port}"]
    env = DOCKERFILE.env(final)
    for var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
        assert env[var] == "1"
    # The build fails if a bundled demo dataset cannot be read offline.
    assert any("load_dataset(n) for n in DATASETS" in run for run in final.args("RUN"))


def test_operator_image_entry_point_and_health_port(helm4: Helm) -> None:
    final = DOCKERFILE.target("operator")
    assert final.exec_form("ENTRYPOINT") == ["tailguard", "operator"]
    # The build fails if the operator's modules or the packaged CRD are missing.
    assert any("import tailguard.operator.handlers, tailguard.spec.schema as s; s.crd()" in run
               for run in final.args("RUN"))
    container = operator_container(helm4.template())
    assert "command" not in container and "args" not in container  # the image's entry point
    endpoint = env_of(container)["TAILGUARD_LIVENESS_ENDPOINT"]
    assert final.args("EXPOSE") == [endpoint.split(":")[2].split("/")[0]]


def test_entry_points_are_the_distributions_console_scripts() -> None:
    scripts = PYPROJECT["project"]["scripts"]
    assert scripts == {"tailguard": "tailguard.cli.main:main",
                       "tailguard-runtime": "tailguard_runtime.main:main"}
    proc = subprocess.run([sys.executable, "-c", "import sys; from tailguard.cli.main import "
                           "main; sys.exit(main(['operator', '--help']))"],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr


def test_runtime_accepts_the_command_the_operator_gives_it(tmp_path: Path) -> None:
    """argparse takes the pod's command; the process then fails only on the missing config."""
    container = _runtime_container("primary", OperatorSettings())
    argv = container["command"][1:]
    config = options(argv)["--config"]
    argv[argv.index(config)] = str(tmp_path / "missing.json")
    proc = subprocess.run([sys.executable, "-m", "tailguard_runtime", *argv],
                          capture_output=True, text=True, timeout=120,
                          env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert "usage:" not in proc.stderr and "FileNotFoundError" in proc.stderr, proc.stderr


# --- the operator's manifests ---------------------------------------------------------------

def _digits() -> resource.InferenceService:
    return resource.load_file((REPO / "examples/digits.yaml").read_text(encoding="utf-8"))


def _runtime_pod(role: str, settings: OperatorSettings) -> Mapping[str, Any]:
    deployment = manifests.deployment(_digits(), manifests.Owner("digits", "uid-1"), role,
                                      settings)
    return deployment["spec"]["template"]  # type: ignore[no-any-return]


def _runtime_container(role: str, settings: OperatorSettings) -> dict[str, Any]:
    (container,) = _runtime_pod(role, settings)["spec"]["containers"]
    return container  # type: ignore[no-any-return]


@pytest.mark.parametrize("role", manifests.ROLES)
def test_runtime_pods_run_the_image_as_its_dockerfile_says(role: str) -> None:
    final = DOCKERFILE.target("runtime")
    pod = _runtime_pod(role, OperatorSettings())
    container = _runtime_container(role, OperatorSettings())
    command = container["command"]
    assert command[:1] == final.exec_form("ENTRYPOINT")
    # The kubelet reads a container's termination message at its default path.
    assert "terminationMessagePath" not in container
    assert options(command[1:]) == {**options(final.exec_form("CMD")), "--role": role,
                                    "--traffic": "/etc/tailguard/traffic.json",
                                    "--termination-log": "/dev/termination-log"}
    http, grpc = (int(port) for port in final.args("EXPOSE")[0].split())
    assert container["ports"] == [{"name": "http", "containerPort": http, "protocol": "TCP"},
                                  {"name": "grpc", "containerPort": grpc, "protocol": "TCP"}]
    config = options(command[1:])["--config"]
    mounts = {m["mountPath"]: m["name"] for m in container["volumeMounts"]}
    volume = {v["name"]: v for v in pod["spec"]["volumes"]}[mounts[posixpath.dirname(config)]]
    traffic = options(command[1:])["--traffic"]
    assert posixpath.dirname(traffic) == posixpath.dirname(config)
    assert {(item["path"], source["configMap"]["name"]) for source in volume["projected"]["sources"]
            for item in source["configMap"]["items"]} == {
        (posixpath.basename(config), manifests.config_map_name(
            "digits", role, pod["metadata"]["annotations"][manifests.CHECKSUM_ANNOTATION])),
        (posixpath.basename(traffic), manifests.child_name("digits", "ConfigMap"))}
    (user,) = [u for stage in DOCKERFILE.chain(final) for u in stage.args("USER")]
    uid = int(user.split(":")[0])
    assert pod["spec"]["securityContext"]["runAsUser"] == uid
    env = {e["name"]: e["value"] for e in container["env"]}
    assert all(DOCKERFILE.env(final)[k] == v for k, v in env.items() if k.endswith("_THREADS"))
    assert POD_LABELS <= set(pod["metadata"]["labels"])
    assert pod["metadata"]["labels"]["tailguard.dev/role"] == role


def test_pod_monitor_selects_the_runtime_pods_on_their_http_port(helm4: Helm) -> None:
    objs = helm4.template({"podMonitor": {"enabled": True}})
    monitors = {m["metadata"]["name"].rsplit("-", 1)[1]: m["spec"]
                for m in of_kind(objs, "PodMonitor")}
    assert set(monitors) == {"runtime", "operator"}
    # the operator's own /metrics (tailguard_rollbacks_total), on its port named metrics
    operator = one(objs, "Deployment")["spec"]["template"]
    assert monitors["operator"]["selector"]["matchLabels"].items() <= \
        operator["metadata"]["labels"].items()
    (ports,) = [c["ports"] for c in operator["spec"]["containers"]]
    assert {"name": "metrics", "containerPort": 8081, "protocol": "TCP"} in ports
    assert env_of(operator_container(objs))["TAILGUARD_METRICS_PORT"] == "8081"
    assert [e["port"] for e in monitors["operator"]["podMetricsEndpoints"]] == ["metrics"]
    monitor = monitors["runtime"]
    for role in manifests.ROLES:
        pod = _runtime_pod(role, OperatorSettings())
        labels = pod["metadata"]["labels"]
        assert monitor["selector"]["matchLabels"].items() <= labels.items()
        (container,) = pod["spec"]["containers"]
        ports = {p["name"] for p in container["ports"]}
        assert [e["port"] for e in monitor["podMetricsEndpoints"]] == ["http"]
        assert "http" in ports and monitor["podMetricsEndpoints"][0]["path"] == "/metrics"


def test_chart_environment_configures_the_operator(helm4: Helm) -> None:
    env = env_of(operator_container(helm4.template()))
    fields = {f"TAILGUARD_{name.upper()}" for name in OperatorSettings.__dataclass_fields__}
    assert set(env) - {"POD_ID"} <= fields | CLI_ENV, set(env) - fields - CLI_ENV
    settings = OperatorSettings.from_env(env)
    container = _runtime_container("primary", settings)
    assert container["image"] == RUNTIME_IMAGE
    assert container["imagePullPolicy"] == VALUES["runtime"]["image"]["pullPolicy"]
    assert container["resources"] == VALUES["runtime"]["resources"]


def test_operator_defaults_match_the_chart_defaults() -> None:
    """`tailguard operator` run by hand (outside the chart) builds the same pods."""
    settings = OperatorSettings()
    runtime = VALUES["runtime"]
    assert settings.runtime_image == RUNTIME_IMAGE
    assert settings.image_pull_policy == runtime["image"]["pullPolicy"]
    assert settings.cpu_request == runtime["resources"]["requests"]["cpu"]
    assert settings.memory_request == runtime["resources"]["requests"]["memory"]
    assert settings.memory_limit == runtime["resources"]["limits"]["memory"]
    assert settings.pre_stop_seconds == runtime["preStopSeconds"]


def _operator_kopf_run(helm: Helm, monkeypatch: pytest.MonkeyPatch, values: dict[str, Any],
                       pod: str) -> dict[str, Any]:
    """Run `tailguard operator` (the image's entry point) in the environment the chart gives
    pod ``pod``, up to the call of ``kopf.run``; return that call's keyword arguments."""
    import kopf

    from tailguard.cli import main
    from tailguard.operator import handlers, kube

    env = env_of(operator_container(helm.template(values)))
    for var in CLI_ENV:
        monkeypatch.delenv(var, raising=False)
    for var, value in {**env, "POD_ID": pod}.items():
        monkeypatch.setenv(var, value)
    calls: list[dict[str, Any]] = []
    monkeypatch.setattr(kopf, "configure", lambda **_: None)
    monkeypatch.setattr(kopf, "run", lambda *a, **kw: calls.append({"args": a, **kw}))
    # `tailguard operator` checks credentials before kopf starts; there are none here
    monkeypatch.setattr(kube, "connect", lambda **_: None)
    served: list[int] = []  # the operator's /metrics port: noted, not bound
    monkeypatch.setattr(handlers, "start_http_server", served.append)
    main.main(["operator"])
    assert len(calls) == 1 and not calls[0]["args"], calls
    return calls[0]


def test_operator_command_runs_kopf_as_the_chart_configures_it(
        helm4: Helm, monkeypatch: pytest.MonkeyPatch) -> None:
    """The chart's watched namespaces, peering and liveness endpoint reach kopf.run."""
    run = _operator_kopf_run(helm4, monkeypatch, {}, "tailguard-operator-a")
    assert run.get("clusterwide") is True and not run.get("namespaces"), run
    assert run.get("standalone") is True and not run.get("peering_name"), run
    assert run["memo"].peering is None, run
    assert run.get("liveness_endpoint") == "http://0.0.0.0:8080/healthz", run

    values = {"watchNamespaces": ["ml", "ml-staging"], "operator": {"replicas": 2},
              "peering": {"enabled": True, "name": "ml-operators"}}
    runs = [_operator_kopf_run(helm4, monkeypatch, values, pod)
            for pod in ("tailguard-operator-a", "tailguard-operator-b")]
    for run in runs:
        assert not run.get("clusterwide") and list(run["namespaces"]) == ["ml", "ml-staging"], run
        assert run.get("peering_name") == "ml-operators" and not run.get("standalone"), run
        # the resync pauses by kopf's rule too: it knows the peering object and the priority
        assert run["memo"].peering == Peering("ml-operators", run["priority"]), run
    # kopf pauses every replica when peers share a priority: replicas must differ.
    assert runs[0].get("priority") != runs[1].get("priority"), runs


# --- versions, images and the kind path -----------------------------------------------------

def test_versions_agree() -> None:
    assert CHART_META["version"] == CHART_META["appVersion"] == VERSION
    assert VALUES["runtime"]["image"] == {"repository": "tailguard/runtime", "tag": "",
                                          "pullPolicy": "IfNotPresent"}
    assert VALUES["operator"]["image"]["repository"] == "tailguard/operator"
    text = (REPO / "Dockerfile").read_text(encoding="utf-8")
    for target, image in TARGETS.items():
        assert f"docker build --target {target} -t {image} ." in text


@pytest.fixture(scope="module")
def demo() -> list[list[str]]:
    """The commands `scripts/kind-demo.sh all` runs, as argv lists."""
    return demo_commands("all")


def test_kind_script_builds_loads_and_creates_what_the_files_name(demo: list[list[str]]) -> None:
    kind_config = yaml.safe_load((REPO / "kind-config.yaml").read_text(encoding="utf-8"))
    assert kind_config["kind"] == "Cluster" and kind_config["apiVersion"] == "kind.x-k8s.io/v1alpha4"
    assert [n["role"] for n in kind_config["nodes"]][0] == "control-plane"
    cluster = kind_config["name"]
    assert find_commands(demo, "kind", "create", "cluster") == [
        ["kind", "create", "cluster", "--name", cluster, "--config", "kind-config.yaml"]]
    builds = find_commands(demo, "docker", "build")
    assert builds == [
        ["docker", "build", "--target", "runtime", "-t", RUNTIME_IMAGE, "."],
        ["docker", "build", "--target", "operator", "-t", OPERATOR_IMAGE, "."]]
    for argv in builds:  # the repository's Dockerfile, each image from its own target
        build = build_command(argv)
        assert (build.context, build.dockerfile) == (".", "Dockerfile")
        assert build.tags == (TARGETS[build.target or ""],)
        assert parse(build.dockerfile).target(build.target).name == build.target
    assert find_commands(demo, "kind", "load") == [
        ["kind", "load", "docker-image", RUNTIME_IMAGE, "--name", cluster],
        ["kind", "load", "docker-image", OPERATOR_IMAGE, "--name", cluster]]
    assert find_commands(demo, "kind", "delete") == [["kind", "delete", "cluster", "--name", cluster]]


def test_kind_script_installs_the_chart_with_values_it_has(demo: list[list[str]], helm4: Helm) -> None:
    (install,) = find_commands(demo, "helm", "upgrade", "--install", "tailguard", "charts/tailguard")
    sets = [arg for flag in ("--set",) for arg in flag_values(install, flag)]
    namespace = flag_values(install, "--namespace")[0]
    objs = helm4.template(None, [f"--set={s}" for s in sets])
    for obj in objs:
        validate_object(obj, objs)
    container = operator_container(objs)
    assert container["image"] == OPERATOR_IMAGE
    assert env_of(container)["TAILGUARD_RUNTIME_IMAGE"] == RUNTIME_IMAGE
    assert len(of_kind(objs, "PodMonitor")) == 2  # the runtime pods' and the operator's
    assert one(objs, "Deployment")["metadata"]["namespace"] == "tailguard-system"
    assert namespace == "tailguard-system"

    # prometheus-adapter reads the chart's rules ConfigMap, in its own namespace, and the
    # Prometheus that kube-prometheus-stack runs.
    (adapter,) = find_commands(demo, "helm", "upgrade", "--install", "prometheus-adapter")
    adapter_sets = dict(s.split("=", 1) for s in flag_values(adapter, "--set"))
    adapter_ns = flag_values(adapter, "--namespace")[0]
    rules = [o for o in objs if o["kind"] == "ConfigMap" and "config.yaml" in o.get("data", {})]
    assert [(r["metadata"]["name"], r["metadata"]["namespace"]) for r in rules] == [
        (adapter_sets["rules.existing"], adapter_ns)]
    (stack,) = find_commands(demo, "helm", "upgrade", "--install", "kps")
    stack_sets = dict(s.split("=", 1) for s in flag_values(stack, "--set"))
    stack_ns = flag_values(stack, "--namespace")[0]
    assert adapter_sets["prometheus.url"] == (
        f"http://{stack_sets['fullnameOverride']}-prometheus.{stack_ns}.svc")
    assert stack_sets["prometheus.prometheusSpec.podMonitorSelectorNilUsesHelmValues"] == "false"
    dashboards = [o for o in objs if o["kind"] == "ConfigMap" and "tailguard.json" in o["data"]]
    assert dashboards[0]["metadata"]["labels"]["grafana_dashboard"] == "1"


def test_kind_script_serves_rolls_back_and_asks_the_right_questions(demo: list[list[str]]) -> None:
    (apply,) = find_commands(demo, "kubectl", "apply")
    example_path = flag_values(apply, "-f")[0]
    example = yaml.safe_load((REPO / example_path).read_text(encoding="utf-8"))
    name = example["metadata"]["name"]
    waits = find_commands(demo, "kubectl", "wait")
    assert waits[0][-3:] == [f"inferenceservice/{name}", "--timeout", "600s"]
    assert "--for=condition=Ready" in waits[0]

    patches = find_commands(demo, "kubectl", "patch")
    roles = []
    for patch in patches:
        assert patch[4:6] == ["inferenceservice", name] and flag_values(patch, "--type") == ["merge"]
        body = json.loads(flag_values(patch, "-p")[0])
        patched = {**example, "spec": {**example["spec"], **body["spec"]}}
        roles.append(resource.parse(patched).traffic)
    assert roles == ["fallback", "primary"]
    assert [w for w in waits[1:] if "--for=jsonpath={.status.activeModel}=fallback" in w]

    posts = [c for c in find_commands(demo, "curl") if "--data" in c]
    assert posts
    x_features = load_dataset(example["spec"]["model"]["uri"].split("/")[2])[0].shape[1]
    for post in posts:
        assert post[-1].endswith(f"/v2/models/{name}/infer")
        request = decode_v2(flag_values(post, "--data")[0].encode(), x_features,
                            ["predict", "predict_proba"])
        assert request.x.shape == (1, x_features)
    forwards = find_commands(demo, "kubectl", "port-forward")
    assert forwards and all(f"service/{name}" in f for f in forwards)


@pytest.mark.parametrize("example", sorted(p.name for p in (REPO / "examples").glob("*.yaml")))
def test_examples_run_in_a_cluster_as_they_are(example: str) -> None:
    isvc = resource.load_file((REPO / "examples" / example).read_text(encoding="utf-8"))
    assert manifests.cluster_problems(isvc) == []


def test_scripts_document_themselves() -> None:
    """(test_kind_demo.py runs `bash -n` and shellcheck on every script.)"""
    proc = subprocess.run(["bash", str(REPO / "scripts/kind-demo.sh"), "help"],
                          capture_output=True, text=True, timeout=30)
    assert proc.returncode == 0 and "DRY_RUN=1" in proc.stdout
    pins = re.findall(r'"(\S+)\s+(v[0-9.]+)\s+(\S+==\S+)\s+([0-9a-f]+)"',
                      (REPO / "scripts/install-helm.sh").read_text(encoding="utf-8"))
    assert [(p[0], p[1][:2]) for p in pins] == [("helm", "v4"), ("helm3", "v3")]
    assert all(len(p[3]) == 64 for p in pins)
    doc = (REPO / "docs/kind.md").read_text(encoding="utf-8")
    for needle in (RUNTIME_IMAGE, OPERATOR_IMAGE, "scripts/kind-demo.sh", "sha256",
                   "kind-config.yaml", "rules.existing=tailguard-adapter-rules"):
        assert needle in doc, needle
