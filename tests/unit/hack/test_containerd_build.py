"""hack/containerd/build.py, without building: its pinned module names exactly containerd's
three commands as its tools, at the version the script's docstring gives, and the cache folder
follows the pin."""

from __future__ import annotations

import re

from harness import REPO
from harness.hack import load_build

FOLDER = REPO / "hack" / "containerd"
MODULE, VERSION = "github.com/containerd/containerd/v2", "v2.4.2"


def test_the_module_pins_containerds_three_commands_and_nothing_else() -> None:
    build = load_build("containerd")
    gomod = (FOLDER / "go.mod").read_text()
    tools = re.search(r"^tool \(\n(.*?)^\)", gomod, re.M | re.S)
    assert tools is not None, gomod
    assert sorted(tools.group(1).split()) == sorted(p.package for p in build.PROGRAMS.values())
    assert sorted(build.PROGRAMS) == ["containerd", "containerd-shim-runc-v2", "ctr"]
    assert re.search(rf"^\s+{re.escape(MODULE)} {re.escape(VERSION)}\b", gomod, re.M), gomod
    assert f"{MODULE} {VERSION}/go.mod h1:" in (FOLDER / "go.sum").read_text()
    assert VERSION in (FOLDER / "build.py").read_text()


def test_the_cache_folder_follows_the_pin(monkeypatch) -> None:
    build = load_build("containerd")
    before = build.target_dir()
    assert before.name.startswith("containerd-")
    monkeypatch.setattr(build, "PROGRAMS", {**build.PROGRAMS, "ctr": build.Program(
        build.PROGRAMS["ctr"].package, "no_btrfs", ".")})
    assert build.target_dir() != before
