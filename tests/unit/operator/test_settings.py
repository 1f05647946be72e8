"""Operator settings from the environment the Helm chart sets."""

from __future__ import annotations

import pytest

from tailguard.operator.settings import OperatorSettings


def test_defaults_and_overrides() -> None:
    assert OperatorSettings.from_env({}) == OperatorSettings()
    settings = OperatorSettings.from_env({
        "TAILGUARD_RUNTIME_IMAGE": "registry.example/rt:2", "TAILGUARD_CPU_REQUEST": "1",
        "TAILGUARD_PRE_STOP_SECONDS": "0", "TAILGUARD_RETRY_DELAY_SECONDS": "2.5",
        "TAILGUARD_NAMESPACES": "a,b",  # the CLI's, not ours: ignored here
    })
    assert settings.runtime_image == "registry.example/rt:2"
    assert settings.cpu_request == "1"
    assert settings.pre_stop_seconds == 0
    assert settings.retry_delay_seconds == 2.5


@pytest.mark.parametrize(("name", "value"), [("TAILGUARD_PRE_STOP_SECONDS", "soon"),
                                             ("TAILGUARD_RETRY_DELAY_SECONDS", "0"),
                                             ("TAILGUARD_RUN_AS_USER", "-1")])
def test_bad_numbers_are_refused_naming_the_variable(name: str, value: str) -> None:
    with pytest.raises(ValueError, match=name):
        OperatorSettings.from_env({name: value})


def test_runtime_placement_is_read_as_json() -> None:
    settings = OperatorSettings.from_env({
        "TAILGUARD_RUNTIME_NODE_SELECTOR": '{"type": "real"}',
        "TAILGUARD_RUNTIME_TOLERATIONS": '[{"key": "k", "operator": "Exists"}]'})
    assert settings.runtime_node_selector == {"type": "real"}
    assert settings.runtime_tolerations == [{"key": "k", "operator": "Exists"}]


@pytest.mark.parametrize(("name", "value", "problem"), [
    ("TAILGUARD_RUNTIME_NODE_SELECTOR", "type=real", "not JSON"),
    ("TAILGUARD_RUNTIME_NODE_SELECTOR", '{"replicas": 2}', "object of strings"),
    ("TAILGUARD_RUNTIME_TOLERATIONS", '{"key": "k"}', "list of objects")])
def test_bad_placement_is_refused_naming_the_variable(name: str, value: str,
                                                       problem: str) -> None:
    with pytest.raises(ValueError, match=f"{name}: .*{problem}"):
        OperatorSettings.from_env({name: value})
