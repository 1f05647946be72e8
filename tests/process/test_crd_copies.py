"""One source for the CRD (``crds/``), copied into the operator package and the chart by
``make crds`` (``hack/copy_crds.py``); no symlinks anywhere in the repository.

The chart and the package once reached ``crds/`` through a chain of symlinks, which a checkout
without symlink support turns into one-line text files: the chart then renders no CRD and
``schema.crd()`` reads a path instead of YAML.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import yaml

from harness import REPO
from tailguard.spec import schema

ROOT = REPO
SCRIPT = ROOT / "hack" / "copy_crds.py"
COPIES = ("operator/tailguard/spec/crd", "charts/tailguard/files")


def copy_crds(root: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(SCRIPT), "--root", str(root), *args],
                          capture_output=True, text=True, timeout=60)


def test_the_repository_copies_equal_crds() -> None:
    done = copy_crds(ROOT, "--check")
    assert done.returncode == 0, done.stderr
    source = (ROOT / "crds" / "inferenceservice.yaml").read_bytes()
    for folder in COPIES:
        copy = ROOT / folder / "inferenceservice.yaml"
        assert not copy.is_symlink() and copy.read_bytes().endswith(source), copy
    assert yaml.safe_load(source) == schema.crd()


def test_the_repository_tracks_no_symlink() -> None:
    """git records a link as mode 120000; CI and every checkout get real files only."""
    listing = subprocess.run(["git", "ls-files", "-s"], cwd=ROOT, capture_output=True,
                             text=True, timeout=60, check=True).stdout
    links = [line.split("\t", 1)[1] for line in listing.splitlines() if line.startswith("120000")]
    assert links == []


def test_make_crds_runs_the_copy_step() -> None:
    done = subprocess.run(["make", "-n", "-C", str(ROOT), "crds"], capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert "hack/copy_crds.py" in done.stdout


def test_check_names_each_stale_copy_and_the_copy_step_fixes_it(tmp_path: Path) -> None:
    (tmp_path / "crds").mkdir()
    source = tmp_path / "crds" / "widget.yaml"
    source.write_text("kind: CustomResourceDefinition\nmetadata: {name: widgets.example}\n")
    assert copy_crds(tmp_path, "--check").returncode == 1  # no copies yet

    assert copy_crds(tmp_path).returncode == 0
    assert copy_crds(tmp_path, "--check").returncode == 0
    copies = [tmp_path / folder / "widget.yaml" for folder in COPIES]
    for copy in copies:
        assert yaml.safe_load(copy.read_text()) == yaml.safe_load(source.read_text())
        assert copy.read_text().startswith("# A copy of crds/widget.yaml")

    # An edit of the source makes both copies stale, and --check says which and what to run.
    source.write_text(source.read_text() + "spec: {group: example}\n")
    stale = copy_crds(tmp_path, "--check")
    assert stale.returncode == 1
    for folder in COPIES:
        assert f"{folder}/widget.yaml differs from crds/widget.yaml; run `make crds`" in stale.stderr

    # A link left in place of a copy is replaced by a real file.
    copies[1].unlink()
    copies[1].symlink_to(source)
    wrote = copy_crds(tmp_path)
    assert wrote.returncode == 0 and sorted(wrote.stdout.split()) == sorted(
        ["wrote", "wrote", *(f"{folder}/widget.yaml" for folder in COPIES)])
    assert not copies[1].is_symlink()
    assert copy_crds(tmp_path, "--check").returncode == 0
    assert yaml.safe_load(copies[0].read_text())["spec"] == {"group": "example"}
