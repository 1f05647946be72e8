"""Build the cluster's metrics pipeline, once, into a cache outside the clone.

The HPA reads two metrics APIs, and the tests run the upstream programs that serve them:

- ``metrics-server`` (``metrics.k8s.io``: CPU and memory the kubelets report; ``kubectl top``),
- ``prometheus`` (scrapes the runtime pods' ``/metrics``, found through the API server),
- ``prometheus-adapter`` (``custom.metrics.k8s.io``: Prometheus series, by the chart's rules).

Each is built from a module of its own here, ``hack/metrics/<name>/`` (a go.mod with one
``tool`` line and the go.sum ``go get -tool PACKAGE@VERSION`` wrote: the program's own
dependency graph, pinned), with the local toolchain (``GOTOOLCHAIN=local``), ``CGO_ENABLED=0``
and ``-trimpath``. Not one module for all three: their Kubernetes libraries differ by several
minors (0.30 to 0.35), which one module graph would force to the newest. Not ``go install
PACKAGE@VERSION`` either: the proxy serves prometheus-adapter's v0.12.0 but not its version
list, which ``go install`` reads to check for deprecation, and refuses. Prometheus is built
with only its ``kubernetes`` service discovery (build tags
``remove_all_sd,enable_kubernetes_sd``): the other discoveries pull in every cloud's SDK.
Debian's own ``prometheus`` package (2.42) was tried first and is built without the
``kubernetes`` discovery.

To move a pin: ``cd hack/metrics/NAME && go get -tool PACKAGE@VERSION``.

The cache folder is keyed by a digest of every go.mod and go.sum here and the tags, so a
change of pins builds anew.
Prints the folder holding the binaries as its last line.

Usage::

    python3 hack/metrics/build.py

The cache lives beside the control plane's (``hack/kube/build.py``): ``$TAILGUARD_KUBE_CACHE``,
else ``$XDG_CACHE_HOME/tailguard/kube``, else ``~/.cache/tailguard/kube``. Stdlib only.
"""
from __future__ import annotations

import argparse
import hashlib
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import NamedTuple

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "kube"))
from build import BuildError, cache_root, cached, find_go  # noqa: E402
from gomod import go_env  # noqa: E402

HERE = Path(__file__).resolve().parent


class Program(NamedTuple):
    """One binary: its Go package (the ``tool`` of its module folder) and its build tags."""

    package: str
    tags: str = ""


PROGRAMS: dict[str, Program] = {
    # v0.8.0: the release the issue names (v0.9.x is served but not an approved release).
    "metrics-server": Program("sigs.k8s.io/metrics-server/cmd/metrics-server"),
    # v0.12.0: the last release of kubernetes-sigs/prometheus-adapter (2024).
    "prometheus-adapter": Program("sigs.k8s.io/prometheus-adapter/cmd/adapter"),
    # v0.316.0: Prometheus 3.x publishes its Go module as v0.3MM.P for v3.MM.P.
    "prometheus": Program("github.com/prometheus/prometheus/cmd/prometheus",
                          "remove_all_sd,enable_kubernetes_sd"),
}
"""Binary name (and module folder) to what builds it; the versions are in the folders'
go.mod files."""


def pin_digest() -> str:
    """A digest of every file and tag that decides what gets built (12 hex digits)."""
    digest = hashlib.sha256()
    for name, program in sorted(PROGRAMS.items()):
        digest.update(f"{name} {program.package} {program.tags}\0".encode())
        for file in ("go.mod", "go.sum"):
            digest.update((HERE / name / file).read_bytes() + b"\0")
    return digest.hexdigest()[:12]


def target_dir() -> Path:
    """Where the binaries of the current pins live."""
    return cache_root() / f"metrics-{pin_digest()}"


def build(*, log: bool = True) -> Path:
    """The folder holding every binary of :data:`PROGRAMS`, building them if the cache lacks
    them (a cold build takes about 10 minutes on 2 cores, most of it Prometheus and the
    adapter).

    Raises:
        BuildError: no usable Go, or a failed build.
    """
    target = target_dir()
    return cached(target, PROGRAMS, lambda staging: _build_into(staging, target, log))


def _build_into(staging: Path, target: Path, log: bool) -> None:
    go = find_go()
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    for name, program in PROGRAMS.items():
        started = time.monotonic()
        if log:
            print(f"building {name} into {target} ...", file=sys.stderr, flush=True)
        args = [go, "build", "-trimpath", "-ldflags", "-s -w", "-o", str(staging / name)]
        if program.tags:
            args += ["-tags", program.tags]
        done = subprocess.run([*args, program.package], cwd=HERE / name, env=go_env())
        if done.returncode != 0:
            raise BuildError(f"go build {program.package} failed in {HERE / name} "
                             f"(exit {done.returncode}); see above")
        if log:
            print(f"  built {name} in {time.monotonic() - started:.0f} s", file=sys.stderr,
                  flush=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Build (or find cached) metrics-server, "
                                                 "Prometheus and prometheus-adapter.")
    parser.parse_args(argv)
    try:
        print(build())
    except BuildError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
