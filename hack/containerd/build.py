"""Build the real node's container runtime, once, into a cache outside the clone.

The test cluster's real node (``tests/harness/kube/node.py``) runs ``containerd`` (its CRI
plugin serves the kubelet), the runc shim ``containerd-shim-runc-v2`` that containerd starts
per pod, and ``ctr`` (the images are imported with it). All three are built from one pinned
module here, ``hack/containerd/`` (a go.mod whose three ``tool`` lines are the three commands of
``github.com/containerd/containerd/v2``, and its go.sum), with the local toolchain,
``CGO_ENABLED=0`` and ``-trimpath`` (``hack/kube/gotools.py``).

Why not Debian's containerd: the package is 1.6, which kubelet 1.37 counts as losing support in
Kubernetes 1.38 (it wants containerd 2.x). v2.4.2 is the newest release the Go module proxy
served here on 2026-12-07. The node still uses Debian's ``runc`` (1.1.5, which this kernel's
hybrid cgroup layout runs) and CNI plugins.

To move the pin: ``cd hack/containerd && go get -tool PACKAGE@VERSION`` for each of the three.

Prints the folder holding the binaries as its last line (about 90 s cold with a warm Go module
cache). Usage::

    python3 hack/containerd/build.py

The cache lives beside the control plane's (``hack/kube/build.py``). Stdlib only.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "kube"))
import gotools  # noqa: E402
from gotools import Program  # noqa: E402

HERE = Path(__file__).resolve().parent
PREFIX = "containerd"
MODULE = "github.com/containerd/containerd/v2"

PROGRAMS: dict[str, Program] = {
    name: Program(f"{MODULE}/cmd/{name}", module=".")
    for name in ("containerd", "containerd-shim-runc-v2", "ctr")
}
"""Binary name to what builds it; the version is in this folder's go.mod."""


def target_dir() -> Path:
    """Where the binaries of the current pin live."""
    return gotools.target_dir(PREFIX, HERE, PROGRAMS)


def build(*, log: bool = True) -> Path:
    """The folder holding ``containerd``, ``containerd-shim-runc-v2`` and ``ctr``, building
    them if the cache lacks them.

    Raises:
        BuildError: no usable Go, or a failed build.
    """
    return gotools.build(PREFIX, HERE, PROGRAMS, log=log)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Build (or find cached) containerd, its runc "
                                                 "shim and ctr.")
    parser.parse_args(argv)
    return gotools.main(build)


if __name__ == "__main__":
    sys.exit(main())
