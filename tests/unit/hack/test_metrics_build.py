"""hack/metrics/build.py, without building: each program's pinned module names exactly that
program as its tool, at the version the script's comments and the docs give."""

from __future__ import annotations

import importlib.util
import re
import sys
from types import ModuleType

import pytest

from harness import REPO

FOLDER = REPO / "hack" / "metrics"
VERSIONS = {"metrics-server": ("sigs.k8s.io/metrics-server", "v0.8.0"),
            "prometheus-adapter": ("sigs.k8s.io/prometheus-adapter", "v0.12.0"),
            "prometheus": ("github.com/prometheus/prometheus", "v0.316.0")}


def load() -> ModuleType:
    key = "hack_metrics_build"
    if key not in sys.modules:
        spec = importlib.util.spec_from_file_location(key, FOLDER / "build.py")
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[key] = module
        spec.loader.exec_module(module)
    return sys.modules[key]


@pytest.mark.parametrize("name", sorted(VERSIONS))
def test_each_program_is_the_one_tool_of_its_pinned_module(name: str) -> None:
    build = load()
    gomod = (FOLDER / name / "go.mod").read_text()
    assert re.findall(r"^tool (\S+)$", gomod, re.M) == [build.PROGRAMS[name].package]
    module, version = VERSIONS[name]
    assert re.search(rf"^\s+{re.escape(module)} {re.escape(version)}\b", gomod, re.M), gomod
    assert f"{module} {version}/go.mod h1:" in (FOLDER / name / "go.sum").read_text()


def test_the_cache_folder_follows_every_pin(tmp_path, monkeypatch) -> None:
    build = load()
    before = build.target_dir()
    monkeypatch.setattr(build, "PROGRAMS", {**build.PROGRAMS, "prometheus": build.Program(
        build.PROGRAMS["prometheus"].package, "enable_kubernetes_sd")})
    assert build.target_dir() != before
