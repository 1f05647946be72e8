"""The `tailguard` command as a user meets it: --version, --help for every subcommand, every
error path as one clear line and a non-zero exit (no traceback), and `validate` printing a spec
that can be applied again. All over the real CLI; the only servers are sockets on 127.0.0.1."""

from __future__ import annotations

import argparse
import socket
from pathlib import Path
from typing import Iterator

import pytest
import yaml

from harness.up import ROOT, one_line_failure, run_cli
from tailguard.cli.main import _parser
from tailguard_runtime import __version__

IRIS = ROOT / "examples" / "iris.yaml"
DIGITS = ROOT / "examples" / "digits.yaml"


def subcommands() -> dict[str, argparse.ArgumentParser]:
    action = next(a for a in _parser()._actions if isinstance(a, argparse._SubParsersAction))
    return dict(action.choices)


@pytest.fixture
def closed_port() -> int:
    """A port on 127.0.0.1 that nothing listens on (bound, then released)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.fixture
def no_kubeconfig(tmp_path: Path) -> dict[str, str]:
    """An environment with no kubeconfig anywhere and no in-cluster credentials."""
    return {"KUBECONFIG": str(tmp_path / "missing-kubeconfig"), "HOME": str(tmp_path),
            "KUBERNETES_SERVICE_HOST": ""}


@pytest.fixture
def unreachable_kubeconfig(tmp_path: Path, closed_port: int) -> Iterator[dict[str, str]]:
    """A kubeconfig whose API server is 127.0.0.1 on a closed port."""
    path = tmp_path / "kubeconfig"
    path.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": "closed",
        "clusters": [{"name": "closed", "cluster": {
            "server": f"https://127.0.0.1:{closed_port}", "insecure-skip-tls-verify": True}}],
        "contexts": [{"name": "closed", "context": {"cluster": "closed", "user": "u"}}],
        "users": [{"name": "u", "user": {"token": "not-a-real-token"}}]}))
    yield {"KUBECONFIG": str(path), "HOME": str(tmp_path)}


def test_version() -> None:
    done = run_cli("--version")
    assert done.returncode == 0 and done.stdout.strip() == f"tailguard {__version__}"


@pytest.mark.parametrize("command", sorted(subcommands()))
def test_help_describes_every_argument_without_markup(command: str) -> None:
    done = run_cli(command, "--help")
    assert done.returncode == 0, done.stderr
    assert "``" not in done.stdout
    parser = subcommands()[command]
    assert parser.description, command
    for action in parser._actions:
        assert action.help, f"{command} {action.dest} has no help text"
        assert action.help.split()[0] in done.stdout


def test_top_level_help_lists_every_command() -> None:
    done = run_cli("--help")
    assert done.returncode == 0 and "``" not in done.stdout
    for command in subcommands():
        assert command in done.stdout


@pytest.mark.parametrize("command", ["rollback", "rollforward", "status"])
def test_cluster_commands_without_a_kubeconfig_are_one_line(command: str,
                                                            no_kubeconfig: dict[str, str]) -> None:
    line = one_line_failure(run_cli(command, "digits", "--cluster", env=no_kubeconfig))
    assert line.startswith(f"tailguard {command}: no Kubernetes credentials"), line


@pytest.mark.parametrize("command", ["rollback", "rollforward", "status"])
def test_cluster_commands_against_an_unreachable_api_server_are_one_line(
        command: str, unreachable_kubeconfig: dict[str, str], closed_port: int) -> None:
    line = one_line_failure(run_cli(command, "digits", "--cluster", env=unreachable_kubeconfig))
    assert line.startswith(f"tailguard {command}: cannot reach the Kubernetes API server at "
                           f"127.0.0.1:{closed_port} (Connection refused)"), line


def test_operator_without_credentials_is_one_line(no_kubeconfig: dict[str, str]) -> None:
    line = one_line_failure(run_cli("operator", env=no_kubeconfig))
    assert line.startswith("tailguard operator: no Kubernetes credentials"), line


@pytest.mark.parametrize("command", ["rollback", "rollforward", "status"])
def test_local_commands_with_nothing_listening_are_one_line(command: str,
                                                            closed_port: int) -> None:
    line = one_line_failure(run_cli(command, "digits", "--port", str(closed_port)))
    assert line.startswith(f"tailguard {command}: no local tailguard up answers on "
                           f"127.0.0.1:{closed_port}"), line


@pytest.mark.parametrize("command", ["up", "validate"])
def test_a_missing_file_is_one_line(command: str, tmp_path: Path) -> None:
    done = run_cli(command, str(tmp_path / "nope.yaml"))
    assert done.returncode == 2
    assert one_line_failure(done) == (f"tailguard {command}: cannot read {tmp_path / 'nope.yaml'}: "
                                      "No such file or directory")


@pytest.mark.parametrize("command", ["up", "validate"])
def test_an_invalid_spec_with_one_problem_is_one_line(command: str, tmp_path: Path) -> None:
    spec = tmp_path / "bad.yaml"
    spec.write_text(IRIS.read_text() + "  batching:\n    maxBatchSize: 0\n")
    done = run_cli(command, str(spec), *(["--port", "0"] * (command == "up")))
    assert done.returncode == 2  # bad input, the same for every command
    line = one_line_failure(done)
    assert line == (f"tailguard {command}: {spec} is not a valid InferenceService: "
                    "spec.batching.maxBatchSize: 0 is less than the minimum of 1")


def test_a_busy_port_under_make_names_port(tmp_path: Path) -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen(1)
        port = busy.getsockname()[1]
        plain = run_cli("up", str(IRIS), "--port", str(port), env={"MAKELEVEL": ""})
        made = run_cli("up", str(IRIS), "--port", str(port), env={"MAKELEVEL": "1"})
    assert one_line_failure(plain).endswith("(use --port to pick another port)")
    assert one_line_failure(made).endswith("(use make up PORT=<port> to pick another port)")


# -- validate ----------------------------------------------------------------------------------


def test_validate_prints_yaml_that_validates_again_unchanged(tmp_path: Path) -> None:
    first = run_cli("validate", str(IRIS))
    assert first.returncode == 0, first.stderr
    doc = yaml.safe_load(first.stdout)
    assert doc["apiVersion"] == "tailguard.dev/v1alpha1" and doc["kind"] == "InferenceService"
    assert doc["metadata"] == {"name": "iris"}
    assert doc["spec"]["batching"] == {"maxBatchSize": 32, "maxWaitMs": 0, "maxQueueSize": 256,
                                       "timeoutMs": 1000}  # defaults filled in
    assert doc["spec"]["traffic"] == "primary"
    again = tmp_path / "again.yaml"
    again.write_text(first.stdout)
    second = run_cli("validate", str(again))
    assert second.returncode == 0, second.stderr
    assert second.stdout == first.stdout
    assert "--models" in first.stderr  # the note that models were not loaded


def test_validate_models_accepts_a_drop_in_fallback() -> None:
    done = run_cli("validate", str(IRIS), "--models")
    assert done.returncode == 0, done.stderr
    assert yaml.safe_load(done.stdout)["metadata"]["name"] == "iris"
    assert "the fallback is a drop-in (4 features, 3 classes)" in done.stderr


def test_validate_models_refuses_a_fallback_of_another_shape(tmp_path: Path) -> None:
    spec = tmp_path / "mixed.yaml"
    spec.write_text(DIGITS.read_text().replace("builtin://digits/logistic-regression",
                                               "builtin://iris/logistic-regression"))
    assert run_cli("validate", str(spec)).returncode == 0  # the schema cannot see it
    line = one_line_failure(run_cli("validate", str(spec), "--models"))
    assert line == (f"tailguard validate: {spec}: builtin://iris/logistic-regression: fallback "
                    "expects 4 features but the primary builtin://digits/random-forest?trees=200 "
                    "expects 64")


def test_validate_models_refuses_a_model_file_that_does_not_exist(tmp_path: Path) -> None:
    spec = tmp_path / "missing.yaml"
    spec.write_text(IRIS.read_text().replace("builtin://iris/random-forest",
                                             "file:///no/such/model.joblib"))
    plain = run_cli("validate", str(spec))
    assert plain.returncode == 0 and "sha256" in plain.stderr  # may live inside an image
    line = one_line_failure(run_cli("validate", str(spec), "--models"))
    assert line.startswith(f"tailguard validate: {spec}: file:///no/such/model.joblib: "
                           "no such file"), line
