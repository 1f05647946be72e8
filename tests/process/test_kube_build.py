"""hack/kube: the go.mod written from a Kubernetes release's own, and the build's refusals."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from harness.hack import HACK_KUBE as HACK
from harness.hack import load

build = load("build")
gomod = load("gomod")

UPSTREAM = """module k8s.io/kubernetes

go 1.26.0

godebug default=go1.26

require (
\tgo.etcd.io/etcd/client/v3 v3.7.0
\tk8s.io/api v0.0.0
\tk8s.io/client-go v0.0.0
\tk8s.io/utils v0.0.0-20260210185600-b8788abfbbc2
)

require go.etcd.io/etcd/server/v3 v3.7.0 // indirect

replace (
\tk8s.io/api => ./staging/src/k8s.io/api
\tk8s.io/client-go => ./staging/src/k8s.io/client-go
\tk8s.io/sample-controller => ./staging/src/k8s.io/sample-controller
)
"""


def test_every_required_staging_module_is_pinned_to_the_release() -> None:
    text = gomod.render("v1.37.2", UPSTREAM)
    assert "go 1.26.0" in text and "godebug default=go1.26" in text
    assert "\tk8s.io/kubernetes v1.37.2" in text
    assert "\tgo.etcd.io/etcd/server/v3 v3.7.0" in text
    for module in ("k8s.io/api", "k8s.io/client-go"):
        assert f"\t{module} v0.37.2" in text
        assert f"\t{module} => {module} v0.37.2" in text
    # Replaced but never required upstream: not always published, so not pinned.
    assert "sample-controller" not in text
    assert "k8s.io/utils" not in text  # a pseudo-version, not a staging module
    assert gomod.unresolved(text) == []


def test_a_leftover_v0_0_0_is_found_and_refused() -> None:
    assert gomod.unresolved(UPSTREAM) == ["k8s.io/api", "k8s.io/client-go"]
    with pytest.raises(gomod.GoModError, match="release tag"):
        gomod.render("v1.37", UPSTREAM)
    with pytest.raises(gomod.GoModError, match="staging"):
        gomod.render("v1.37.2", "module k8s.io/kubernetes\n\ngo 1.26.0\n")


@pytest.mark.parametrize("tag", sorted(p.name for p in HACK.glob("v1.*")))
def test_the_committed_modules_match_their_release(tag: str) -> None:
    text = (HACK / tag / "go.mod").read_text()
    assert gomod.unresolved(text) == []
    assert f"k8s.io/kubernetes {tag}" in text
    assert (HACK / tag / "go.sum").stat().st_size > 0
    assert build.ldflags(tag).count(f"gitVersion={tag}") == 1


def test_without_go_the_build_stops_with_one_line(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, str(HACK / "build.py")], capture_output=True, text=True, timeout=60,
        env={**os.environ, "GO": str(tmp_path / "no-go"), "TAILGUARD_KUBE_CACHE": str(tmp_path)})
    assert done.returncode == 2
    assert done.stdout == ""
    (line,) = done.stderr.strip().splitlines()
    assert line.startswith("error: the tests run a Kubernetes control plane built from source")
    assert "is not an executable" in line


def test_an_unpinned_release_is_refused_naming_the_fix(tmp_path: Path) -> None:
    done = subprocess.run([sys.executable, str(HACK / "build.py"), "--tag", "v1.30.0"],
                          capture_output=True, text=True, timeout=60,
                          env={**os.environ, "TAILGUARD_KUBE_CACHE": str(tmp_path)})
    assert done.returncode == 2
    assert "python3 hack/kube/gomod.py v1.30.0" in done.stderr
