"""hack/containerd/build.py, without building: its pinned module names exactly containerd's
three commands as its tools, at the version the script's docstring gives, and the cache folder
follows the pin."""

from __future__ import annotations

import importlib.util
import re
import sys
from types import ModuleType

from harness import REPO

FOLDER = REPO / "hack" / "containerd"
MODULE, VERSION = "github.com/containerd/containerd/v2", "v2.4.2"


def load() -> ModuleType:
    key = "hack_containerd_build"
    if key not in sys.modules:
        spec = importlib.util.spec_from_file_location(key, FOLDER / "build.py")
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[key] = module
        spec.loader.exec_module(module)
    return sys.modules[key]


def test_the_module_pins_containerds_three_commands_and_nothing_else() -> None:
    build = load()
    gomod = (FOLDER / "go.mod").read_text()
    tools = re.search(r"^tool \(\n(.*?)^\)", gomod, re.M | re.S)
    assert tools is not None, gomod
    assert sorted(tools.group(1).split()) == sorted(p.package for p in build.PROGRAMS.values())
    assert sorted(build.PROGRAMS) == ["containerd", "containerd-shim-runc-v2", "ctr"]
    assert re.search(rf"^\s+{re.escape(MODULE)} {re.escape(VERSION)}\b", gomod, re.M), gomod
    assert f"{MODULE} {VERSION}/go.mod h1:" in (FOLDER / "go.sum").read_text()
    assert VERSION in (FOLDER / "build.py").read_text()


def test_the_cache_folder_follows_the_pin(monkeypatch) -> None:
    build = load()
    before = build.target_dir()
    assert before.name.startswith("containerd-")
    monkeypatch.setattr(build, "PROGRAMS", {**build.PROGRAMS, "ctr": build.Program(
        build.PROGRAMS["ctr"].package, "no_btrfs", ".")})
    assert build.target_dir() != before
