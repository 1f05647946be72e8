"""Programs built from pinned Go modules of our own, once, into the cache beside the control
plane's (``hack/metrics/build.py``: the metrics pipeline; ``hack/containerd/build.py``: the
real node's container runtime).

A set of programs lives in one folder of ``hack/``; each program's module is a subfolder (or
the folder itself) holding a go.mod whose ``tool`` lines name the packages to build, and the
go.sum ``go get -tool PACKAGE@VERSION`` wrote: the program's own dependency graph, pinned. They
are built with the local toolchain (``GOTOOLCHAIN=local``), ``CGO_ENABLED=0`` and
``-trimpath``. The cache folder is named by the set's prefix and a digest of every go.mod,
go.sum and build tag of the set, so a change of pins builds anew. Stdlib only.
"""
from __future__ import annotations

import hashlib
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable, NamedTuple

from build import BuildError, cache_root, cached, find_go
from gomod import go_env


class Program(NamedTuple):
    """One binary: its Go package (a ``tool`` of its module), its build tags, and the folder
    of its module under the set's folder (``""``: a subfolder named as the binary; ``"."``:
    the set's folder itself)."""

    package: str
    tags: str = ""
    module: str = ""

    def folder(self, name: str, here: Path) -> Path:
        """Where the module that builds binary ``name`` lives, for a set in ``here``."""
        return here / (self.module or name)


def pin_digest(here: Path, programs: dict[str, Program]) -> str:
    """A digest of every file and tag that decides what a set builds (12 hex digits)."""
    digest = hashlib.sha256()
    for name, program in sorted(programs.items()):
        digest.update(f"{name} {program.package} {program.tags}\0".encode())
        for file in ("go.mod", "go.sum"):
            digest.update((program.folder(name, here) / file).read_bytes() + b"\0")
    return digest.hexdigest()[:12]


def target_dir(prefix: str, here: Path, programs: dict[str, Program]) -> Path:
    """Where the binaries of a set's current pins live."""
    return cache_root() / f"{prefix}-{pin_digest(here, programs)}"


def build(prefix: str, here: Path, programs: dict[str, Program], *, log: bool = True) -> Path:
    """The folder holding every binary of ``programs``, building them if the cache lacks them.

    Raises:
        BuildError: no usable Go, or a failed build.
    """
    target = target_dir(prefix, here, programs)
    return cached(target, programs, lambda staging: _build_into(staging, target, here,
                                                                  programs, log))


def _build_into(staging: Path, target: Path, here: Path, programs: dict[str, Program],
                log: bool) -> None:
    go = find_go()
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    for name, program in programs.items():
        started = time.monotonic()
        if log:
            print(f"building {name} into {target} ...", file=sys.stderr, flush=True)
        args = [go, "build", "-trimpath", "-ldflags", "-s -w", "-o", str(staging / name)]
        if program.tags:
            args += ["-tags", program.tags]
        folder = program.folder(name, here)
        done = subprocess.run([*args, program.package], cwd=folder, env=go_env())
        if done.returncode != 0:
            raise BuildError(f"go build {program.package} failed in {folder} "
                             f"(exit {done.returncode}); see above")
        if log:
            print(f"  built {name} in {time.monotonic() - started:.0f} s", file=sys.stderr,
                  flush=True)


def main(make: Callable[[], Path]) -> int:
    """A build script's main: print the folder ``make()`` returns, or one line saying why
    there is none (exit 2)."""
    try:
        print(make())
    except BuildError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    return 0
