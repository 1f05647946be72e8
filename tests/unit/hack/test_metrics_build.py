"""hack/metrics/build.py, without building: each program's pinned module names exactly that
program as its tool, at the version the script's comments and the docs give."""

from __future__ import annotations

import re

import pytest

from harness import REPO
from harness.hack import load_build

FOLDER = REPO / "hack" / "metrics"
VERSIONS = {"metrics-server": ("sigs.k8s.io/metrics-server", "v0.8.0"),
            "prometheus-adapter": ("sigs.k8s.io/prometheus-adapter", "v0.12.0"),
            "prometheus": ("github.com/prometheus/prometheus", "v0.316.0")}


@pytest.mark.parametrize("name", sorted(VERSIONS))
def test_each_program_is_the_one_tool_of_its_pinned_module(name: str) -> None:
    build = load_build("metrics")
    gomod = (FOLDER / name / "go.mod").read_text()
    assert re.findall(r"^tool (\S+)$", gomod, re.M) == [build.PROGRAMS[name].package]
    module, version = VERSIONS[name]
    assert re.search(rf"^\s+{re.escape(module)} {re.escape(version)}\b", gomod, re.M), gomod
    assert f"{module} {version}/go.mod h1:" in (FOLDER / name / "go.sum").read_text()


def test_the_cache_folder_follows_every_pin(tmp_path, monkeypatch) -> None:
    build = load_build("metrics")
    before = build.target_dir()
    monkeypatch.setattr(build, "PROGRAMS", {**build.PROGRAMS, "prometheus": build.Program(
        build.PROGRAMS["prometheus"].package, "enable_kubernetes_sd")})
    assert build.target_dir() != before
