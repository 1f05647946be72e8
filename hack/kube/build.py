"""Build the Kubernetes control plane the tests run on, once, into a cache outside the clone.

Builds ``etcd``, ``kube-apiserver``, ``kube-controller-manager``, ``kube-scheduler``,
``kubectl``, and the node's ``kubelet`` and ``kube-proxy`` from the pinned module in ``hack/kube/<tag>/`` (see ``gomod.py``) and ``kwok`` from
``hack/kwok/``, with the local Go toolchain (``GOTOOLCHAIN=local``), ``CGO_ENABLED=0`` and
``-trimpath``. The cache folder is keyed by the tag and a digest of every file that pins the
build (go.mod, go.sum, our etcd main), so a change of pins builds anew and an unchanged checkout
reuses what is there. Prints the folder holding the binaries as its last line.

Usage::

    python3 hack/kube/build.py                 # the default tag
    python3 hack/kube/build.py --tag v1.34.4   # another pinned tag

The cache lives in ``$TAILGUARD_KUBE_CACHE``, else ``$XDG_CACHE_HOME/tailguard/kube``, else
``~/.cache/tailguard/kube``. Stdlib only: it runs before any virtualenv exists.
"""
from __future__ import annotations

import argparse
import fcntl
import hashlib
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable, Iterable

sys.path.insert(0, str(Path(__file__).resolve().parent))
from gomod import ETCD_MAIN, HERE, TOOLS, go_env, staging_version, unresolved, write_etcd_main  # noqa: E402

DEFAULT_TAG = "v1.37.2"
"""The newest Kubernetes release whose go.mod ``go`` line (1.26.0) this machine's Go 1.26.8
builds; k8s.io/kubernetes v1.38 is not released."""
KWOK = HERE.parent / "kwok"
BINARIES = ("etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler", "kubectl",
            "kubelet", "kube-proxy", "kwok")
KWOK_STAGES = "kwok-stages.yaml"
"""kwok's own stages (its module's ``kustomize/stage`` files), copied beside the binaries: plain
``kwok`` plays no stage unless told, and only ``kwokctl`` bundles these defaults."""
_STAGE_FILES = ("node/fast/node-initialize.yaml",
                "node/heartbeat-with-lease/node-heartbeat-with-lease.yaml",
                "pod/fast/pod-ready.yaml", "pod/fast/pod-complete.yaml",
                "pod/fast/pod-delete.yaml")
MIN_GO = (1, 26)


class BuildError(Exception):
    """The control plane cannot be built here (message says why, in one line)."""


def cache_root() -> Path:
    """Where built control planes live (one subfolder per tag and pin digest)."""
    explicit = os.environ.get("TAILGUARD_KUBE_CACHE")
    if explicit:
        return Path(explicit)
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "tailguard" / "kube"


def module_dir(tag: str) -> Path:
    """The pinned Go module of ``tag``.

    Raises:
        BuildError: ``tag`` has no pinned module here, or its go.mod still has ``v0.0.0``.
    """
    staging_version(tag)  # refuses a malformed tag
    folder = HERE / tag
    if not (folder / "go.mod").is_file() or not (folder / "go.sum").is_file():
        pinned = sorted(p.name for p in HERE.glob("v1.*") if (p / "go.sum").is_file())
        raise BuildError(f"no pinned module for {tag} in {HERE} (pinned: {', '.join(pinned)}); "
                         f"create it with: python3 hack/kube/gomod.py {tag}")
    left = unresolved((folder / "go.mod").read_text())
    if left:
        raise BuildError(f"{folder / 'go.mod'} still requires staging modules at v0.0.0: "
                         f"{', '.join(left)}; regenerate it with hack/kube/gomod.py")
    return folder


def pin_digest(tag: str) -> str:
    """A digest of every file that decides what gets built for ``tag`` (12 hex digits)."""
    digest = hashlib.sha256(tag.encode())
    folder = module_dir(tag)
    digest.update(ETCD_MAIN.encode())
    for path in (folder / "go.mod", folder / "go.sum", KWOK / "go.mod", KWOK / "go.sum"):
        digest.update(path.name.encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()[:12]


def find_go() -> str:
    """The ``go`` command, at least Go 1.26: ``$GO`` if set, else ``go`` on PATH, else the
    usual install places.

    Raises:
        BuildError: no Go, or too old a Go.
    """
    explicit = os.environ.get("GO")
    go = (explicit if explicit and os.access(explicit, os.X_OK) else None) if explicit else (
        shutil.which("go") or next((p for p in ("/usr/local/go/bin/go", "/usr/lib/go/bin/go")
                                    if os.access(p, os.X_OK)), None))
    if go is None:
        where = f"$GO ({explicit}) is not an executable" if explicit else "no `go` on PATH"
        raise BuildError("the tests run a Kubernetes control plane built from source and need Go "
                         f"{MIN_GO[0]}.{MIN_GO[1]} or newer: {where} "
                         "(install Go, e.g. from your distribution or go.dev/dl)")
    out = subprocess.run([go, "env", "GOVERSION"], capture_output=True, text=True,
                         env=go_env()).stdout.strip()
    try:
        major, minor = (int(x) for x in out.removeprefix("go").split(".")[:2])
    except ValueError:
        raise BuildError(f"cannot tell the version of {go} (it said {out!r})") from None
    if (major, minor) < MIN_GO:
        raise BuildError(f"{go} is {out}; building Kubernetes needs Go "
                         f"{MIN_GO[0]}.{MIN_GO[1]} or newer")
    return go


def ldflags(tag: str) -> str:
    """Linker flags: strip symbols, and stamp the version ``/version`` and kubectl report
    (without it they say ``v0.0.0-master``, which helm refuses for a chart's kubeVersion)."""
    major, minor = tag.removeprefix("v").split(".")[:2]
    pkg = "k8s.io/component-base/version"
    return " ".join(["-s", "-w", f"-X {pkg}.gitVersion={tag}", f"-X {pkg}.gitMajor={major}",
                     f"-X {pkg}.gitMinor={minor}", f"-X {pkg}.gitTreeState=clean"])


def build(tag: str, *, log: bool = True) -> Path:
    """The folder holding the binaries (and kwok's stages) for ``tag``, building them if
    the cache lacks them.

    Raises:
        BuildError: no usable Go, no pinned module, or a failed build.
    """
    folder = module_dir(tag)
    target = cache_root() / f"{tag}-{pin_digest(tag)}"
    return cached(target, (*BINARIES, KWOK_STAGES),
                  lambda staging: _build_into(staging, folder, tag, target, log))


def cached(target: Path, files: Iterable[str], make: Callable[[Path], None]) -> Path:
    """``target``, once it holds every one of ``files``: else ``make(staging)`` fills a
    staging folder beside it, which then replaces it. One build per target at a time (a lock
    file beside it): the others wait, then reuse what it built.

    Raises:
        BuildError: from ``make``.
    """
    names = tuple(files)

    def complete() -> bool:
        return all((target / name).is_file() for name in names)

    if complete():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with open(target.parent / f"{target.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if complete():
            return target
        staging = target.with_name(target.name + f".partial-{os.getpid()}")
        try:
            make(staging)
            shutil.rmtree(target, ignore_errors=True)
            staging.rename(target)
        finally:
            shutil.rmtree(staging, ignore_errors=True)
    return target


def _build_into(staging: Path, folder: Path, tag: str, target: Path, log: bool) -> None:
    """Build every binary into ``staging`` and copy kwok's stages there.

    Raises:
        BuildError: no usable Go, or a failed build.
    """
    go = find_go()
    write_etcd_main(folder)
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    flags = ["-trimpath", "-ldflags", ldflags(tag), "-o", str(staging) + os.sep]
    steps = [(folder, [*TOOLS, "./etcd"], "etcd, kube-apiserver, kube-controller-manager, "
              "kube-scheduler, kubectl, kubelet, kube-proxy"),
             (KWOK, ["sigs.k8s.io/kwok/cmd/kwok"], "kwok")]
    for cwd, packages, what in steps:
        started = time.monotonic()
        if log:
            print(f"building {what} ({tag}) into {target} "
                  "(a cold build takes about 11 minutes on 2 cores; it is cached) ...",
                  file=sys.stderr, flush=True)
        done = subprocess.run([go, "build", *flags, *packages], cwd=cwd, env=go_env())
        if done.returncode != 0:
            raise BuildError(f"go build failed in {cwd} (exit {done.returncode}); see above")
        if log:
            print(f"  built {what} in {time.monotonic() - started:.0f} s", file=sys.stderr,
                  flush=True)
    listed = subprocess.run([go, "list", "-m", "-f", "{{.Dir}}", "sigs.k8s.io/kwok"], cwd=KWOK,
                            env=go_env(), capture_output=True, text=True)
    if listed.returncode != 0:
        raise BuildError(f"go list -m sigs.k8s.io/kwok failed: {listed.stderr.strip()}")
    kwok_src = Path(listed.stdout.strip())
    (staging / KWOK_STAGES).write_text("\n---\n".join(
        (kwok_src / "kustomize" / "stage" / rel).read_text() for rel in _STAGE_FILES))
    missing = [name for name in BINARIES if not (staging / name).is_file()]
    if missing:
        raise BuildError(f"the build produced no {', '.join(missing)}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Build (or find cached) Kubernetes binaries.")
    parser.add_argument("--tag", default=os.environ.get("TAILGUARD_KUBE_VERSION", DEFAULT_TAG),
                        help=f"Kubernetes release tag (default {DEFAULT_TAG}, or "
                             "$TAILGUARD_KUBE_VERSION)")
    args = parser.parse_args(argv)
    try:
        print(build(args.tag))
    except BuildError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
