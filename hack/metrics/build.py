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
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "kube"))
import gotools  # noqa: E402
from gotools import Program  # noqa: E402

HERE = Path(__file__).resolve().parent
PREFIX = "metrics"

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


def target_dir() -> Path:
    """Where the binaries of the current pins live."""
    return gotools.target_dir(PREFIX, HERE, PROGRAMS)


def build(*, log: bool = True) -> Path:
    """The folder holding every binary of :data:`PROGRAMS`, building them if the cache lacks
    them (a cold build takes about 10 minutes on 2 cores, most of it Prometheus and the
    adapter).

    Raises:
        BuildError: no usable Go, or a failed build.
    """
    return gotools.build(PREFIX, HERE, PROGRAMS, log=log)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Build (or find cached) metrics-server, "
                                                 "Prometheus and prometheus-adapter.")
    parser.parse_args(argv)
    return gotools.main(build)


if __name__ == "__main__":
    sys.exit(main())
