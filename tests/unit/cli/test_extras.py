"""The optional parts of the distribution: which command needs which extra, and what a user
without it is told."""

from __future__ import annotations

import argparse
import re
import tomllib

import pytest

from harness import REPO
from tailguard.cli import extras, main


def test_the_extras_are_the_ones_pyproject_declares() -> None:
    declared = tomllib.loads((REPO / "pyproject.toml").read_text())["project"][
        "optional-dependencies"]
    for extra, modules in extras.EXTRAS.items():
        names = {re.split(r"[<>=\[ ]", spec, maxsplit=1)[0].lower() for spec in declared[extra]}
        assert names == set(modules), extra


def test_a_module_names_its_extra() -> None:
    assert extras.extra_of("kubernetes.client.rest") == "operator"
    assert extras.extra_of("kopf") == "operator"
    assert extras.extra_of("matplotlib.figure") == "tools"
    assert extras.extra_of("numpy") is None and extras.extra_of(None) is None


def test_a_missing_extra_is_one_line_before_any_work(monkeypatch: pytest.MonkeyPatch,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr(extras.importlib.util, "find_spec",
                        lambda name: None if name == "matplotlib" else object())
    assert extras.require("tune", "tools") is False
    assert extras.require("operator", "operator") is True
    err = capsys.readouterr().err
    assert err == ("tailguard tune: needs the tools extra, which is not installed "
                   "(pip install 'tailguard[tools]')\n")


def test_an_import_of_a_missing_extra_mid_command_exits_1_with_one_line(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    def needs_kopf(args: argparse.Namespace) -> int:
        raise ModuleNotFoundError("No module named 'kopf'", name="kopf")

    def needs_other(args: argparse.Namespace) -> int:
        raise ModuleNotFoundError("No module named 'nothere'", name="nothere")

    parser = main._parser()
    monkeypatch.setattr(main, "_parser", lambda: parser)
    parser._subparsers._group_actions[0].choices["operator"].set_defaults(func=needs_kopf)
    assert main.main(["operator"]) == 1
    assert capsys.readouterr().err == ("tailguard operator: needs the operator extra, which is "
                                       "not installed (pip install 'tailguard[operator]')\n")
    parser._subparsers._group_actions[0].choices["operator"].set_defaults(func=needs_other)
    with pytest.raises(ModuleNotFoundError):  # not an extra's: a real bug, shown as one
        main.main(["operator"])
