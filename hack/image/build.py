"""Build the project's container images without Docker, as OCI image archives, into a cache
outside the clone.

Builds the ``runtime`` and ``operator`` targets of the root ``Dockerfile`` and a ``pause``
sandbox image, each as a tar file in the OCI image-layout format that containerd imports
(``ctr -n k8s.io images import FILE``):

* the base root filesystem (layer 1, shared): ``debootstrap --variant=minbase bookworm`` plus
  Debian's ``python3.11``, then the ``RUN`` lines of the Dockerfile's ``base`` stage (the
  ``tailguard`` user, uid/gid 10001) run in a chroot; apt lists, docs and man pages dropped;
* the virtual environment ``/opt/tailguard`` of each target (layer 2): made in a chroot on an
  overlay of the base, offline, from a wheelhouse downloaded on the host and the project's own
  wheel, with the extras the Dockerfile's build stage of that target installs; then ``pip
  check`` and the checks of the target's own ``RUN`` lines, as the Dockerfile runs them;
* the image config (Env, User, ExposedPorts, Entrypoint, Cmd, WorkingDir, Labels) read from the
  Dockerfile's ``base`` stage and the target's stage: the Dockerfile is the one source;
* ``pause``: our static Go program in ``hack/image/pause/`` at ``/pause``, user 65535.

Layers are uncompressed tars (``application/vnd.oci.image.layer.v1.tar``) with sorted entries,
numeric owners, modes, symlinks and hard links kept. Every piece is cached under a digest of
its inputs: the base root filesystem (package list, the ``base`` stage's RUN lines, builder
version), the wheelhouse (constraints.txt, pyproject.toml), each image archive (the sources the
Docker build context sends, the Dockerfile and this file) and the pause image (its Go sources and
the Go version). An unchanged checkout rebuilds nothing; a source change rebuilds only the
``/opt/tailguard`` layers. A lock file makes a second concurrent caller wait and then reuse.

Usage::

    python3 hack/image/build.py              # archives stay in the cache
    python3 hack/image/build.py --out DIR    # and are linked (or copied) into DIR

Prints one line per image on stdout: ``<archive path>\\t<image reference>``; progress goes to
stderr, one line per step with the seconds it took. Needs root (debootstrap, chroot, mounts),
``debootstrap``, ``unshare`` (util-linux), a Python with pip and Go 1.26.

The cache lives in ``$TAILGUARD_IMAGE_CACHE``, else ``$XDG_CACHE_HOME/tailguard/images``, else
``~/.cache/tailguard/images``. Stdlib only: it runs before any virtualenv exists.
"""
from __future__ import annotations

import argparse
import contextlib
import datetime
import fcntl
import hashlib
import io
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import tarfile
import time
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent
DOCKERFILE = REPO / "Dockerfile"
PAUSE_SRC = HERE / "pause"

BUILDER_VERSION = "1"
"""Bump to rebuild every cached piece (part of every cache key)."""
SUITE = "bookworm"
MIRROR = "http://deb.debian.org/debian"
"""Debian mirror for debootstrap; ``$TAILGUARD_DEBIAN_MIRROR`` overrides it."""
PACKAGES = ("python3.11",)
"""Installed on top of debootstrap's minbase. No ``python3.11-venv``: the venv is made
``--without-pip`` and pip comes from the wheelhouse (python3.11-venv drags in distutils and the
``python3`` metapackage, and debootstrap cannot resolve its dependency alternatives)."""
PYTHON = "/usr/bin/python3.11"
VENV = "/opt/tailguard"
DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
BASE_IMAGE_ENV = {"PATH": DEFAULT_PATH, "LANG": "C.UTF-8"}
"""What ``FROM python:3.11-slim-bookworm`` contributes to the environment and our base
root filesystem stands in for (``$PATH`` in the Dockerfile's ENV expands to this PATH)."""
STRIP = ("var/cache/apt/archives", "var/cache/apt/pkgcache.bin", "var/cache/apt/srcpkgcache.bin",
         "var/lib/apt/lists", "usr/share/man", "usr/share/info", "usr/share/lintian",
         "var/log", "etc/resolv.conf", "etc/hostname")
"""Removed from the base root filesystem (folders are emptied, not removed); /usr/share/doc
keeps only the copyright files."""
EMPTY_IN_LAYER = ("dev", "proc", "sys")
"""Folders kept empty in the base layer (the runtime mounts them)."""
GLIBC_MINOR = 36
"""bookworm's glibc is 2.36: wheels tagged manylinux up to 2.36 run on it."""
PAUSE_REF = "tailguard.dev/pause:1.0"
PAUSE_USER = "65535:65535"
LAYER_TYPE = "application/vnd.oci.image.layer.v1.tar"
CONFIG_TYPE = "application/vnd.oci.image.config.v1+json"
MANIFEST_TYPE = "application/vnd.oci.image.manifest.v1+json"
INDEX_TYPE = "application/vnd.oci.image.index.v1+json"
TARGETS = ("runtime", "operator")
CONTEXT = ("pyproject.toml", "README.md", "constraints.txt", "runtime/tailguard_runtime",
           "operator/tailguard")
"""What the Docker build context sends (.dockerignore): the inputs of the project's wheel."""


class BuildError(Exception):
    """An image cannot be built here (message says why, in one line)."""


# --- the Dockerfile -------------------------------------------------------------------------


@dataclass
class Stage:
    """One ``FROM`` of the Dockerfile and the instructions after it, in order."""

    base: str
    name: str | None
    instructions: list[tuple[str, str]] = field(default_factory=list)

    def args(self, instruction: str) -> list[str]:
        """The raw text after each ``instruction`` (upper case) of this stage."""
        return [text for i, text in self.instructions if i == instruction]


def parse_dockerfile(path: Path = DOCKERFILE) -> list[Stage]:
    """The stages of the Dockerfile at ``path``, global ARGs filled into ``FROM``.

    Understands comments, line continuations, ``ARG`` before the first ``FROM``, ``FROM image
    [AS name]``; other instructions are kept as raw text.

    Raises:
        BuildError: the file is missing or has an instruction before the first FROM.
    """
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as err:
        raise BuildError(f"cannot read {path}: {err.strerror}") from None
    lines = [line for line in text.splitlines() if not line.lstrip().startswith("#")]
    logical = re.sub(r"\\\n\s*", " ", "\n".join(lines))
    args: dict[str, str] = {}
    stages: list[Stage] = []
    for line in logical.splitlines():
        instruction, _, rest = line.strip().partition(" ")
        instruction, rest = instruction.upper(), rest.strip()
        if not instruction:
            continue
        if instruction == "FROM":
            words = rest.split()
            name = words[2] if len(words) == 3 and words[1].upper() == "AS" else None
            image = re.sub(r"\$\{(\w+)\}", lambda m: args.get(m.group(1), ""), words[0])
            stages.append(Stage(image, name))
        elif instruction == "ARG" and not stages:
            key, _, value = rest.partition("=")
            args[key] = value
        elif not stages:
            raise BuildError(f"{path}: {instruction} before the first FROM")
        else:
            stages[-1].instructions.append((instruction, rest))
    return stages


def stage_chain(stages: list[Stage], name: str) -> list[Stage]:
    """Stage ``name`` and the earlier stages it is built FROM, the one FROM an image first.

    Raises:
        BuildError: the Dockerfile has no stage ``name``.
    """
    def find(wanted: str, before: int) -> Stage | None:
        named = [s for s in stages[:before] if s.name and s.name.lower() == wanted.lower()]
        return named[-1] if named else None

    top = find(name, len(stages))
    if top is None:
        raise BuildError(f"the Dockerfile has no stage {name!r}")
    chain = [top]
    while (up := find(chain[0].base, stages.index(chain[0]))) is not None:
        chain.insert(0, up)
    return chain


def _json_list(stage: Stage, instruction: str) -> list[str] | None:
    """The exec (JSON) form of the stage's last ``instruction``, or None if it has none."""
    found = stage.args(instruction)
    if not found:
        return None
    value = json.loads(found[-1])
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise BuildError(f"{instruction} {found[-1]} must use the exec (JSON list) form")
    return value


def _pairs(text: str) -> list[tuple[str, str]]:
    """``K=V K2="v 2"`` (ENV, LABEL) as (key, value) pairs; the old ``ENV K V`` form too."""
    words = shlex.split(text)
    if words and "=" not in words[0]:
        return [(words[0], text.split(None, 1)[1] if len(words) > 1 else "")]
    return [tuple(w.split("=", 1)) for w in words]  # type: ignore[misc]


def _expand(value: str, env: dict[str, str]) -> str:
    return re.sub(r"\$(?:\{(\w+)\}|(\w+))",
                  lambda m: env.get(m.group(1) or m.group(2), ""), value)


def image_config(target: str, stages: list[Stage] | None = None) -> dict[str, Any]:
    """The OCI image ``config`` object of ``target`` (a final stage of the Dockerfile): Env
    (``K=V`` strings, ``$VAR`` expanded as docker does, on top of :data:`BASE_IMAGE_ENV`),
    User, ExposedPorts, Entrypoint, Cmd, WorkingDir and Labels of the target's stage chain.
    Keys without a value are left out.

    Raises:
        BuildError: no such stage, or an ENTRYPOINT/CMD not in the exec form.
    """
    chain = stage_chain(stages if stages is not None else parse_dockerfile(), target)
    env = dict(BASE_IMAGE_ENV)
    labels: dict[str, str] = {}
    ports: dict[str, dict[str, Any]] = {}
    user = workdir = ""
    entrypoint: list[str] | None = None
    cmd: list[str] | None = None
    for stage in chain:
        for instruction, text in stage.instructions:
            if instruction == "ENV":
                for key, value in _pairs(text):
                    env[key] = _expand(value, env)
            elif instruction == "LABEL":
                labels.update(_pairs(text))
            elif instruction == "USER":
                user = _expand(text, env)
            elif instruction == "WORKDIR":
                workdir = os.path.join(workdir or "/", _expand(text, env))
            elif instruction == "EXPOSE":
                for port in text.split():
                    ports[port if "/" in port else f"{port}/tcp"] = {}
        found_entry, found_cmd = _json_list(stage, "ENTRYPOINT"), _json_list(stage, "CMD")
        if found_entry is not None:
            entrypoint, cmd = found_entry, None  # docker resets an inherited CMD here
        if found_cmd is not None:
            cmd = found_cmd
    config: dict[str, Any] = {"Env": [f"{k}={v}" for k, v in env.items()]}
    found: list[tuple[str, Any]] = [("User", user), ("ExposedPorts", ports),
                                    ("Entrypoint", entrypoint), ("Cmd", cmd),
                                    ("WorkingDir", workdir), ("Labels", labels)]
    for key, value in found:
        if value:
            config[key] = value
    return config


def build_stage(target: str, stages: list[Stage] | None = None) -> str:
    """The name of the build stage ``target`` copies ``/opt/tailguard`` from
    (``COPY --from=STAGE /opt/tailguard ...``).

    Raises:
        BuildError: the target copies /opt/tailguard from no stage.
    """
    stages = stages if stages is not None else parse_dockerfile()
    sources = [text.split()[0].partition("=")[2] for stage in stage_chain(stages, target)
               for text in stage.args("COPY")
               if text.startswith("--from=") and VENV in text.split()[1:-1]]
    if not sources:
        raise BuildError(f"stage {target!r} copies {VENV} from no build stage")
    return sources[-1]


def build_extras(target: str, stages: list[Stage] | None = None) -> list[str]:
    """The extras of the project that the build stage of ``target`` installs: the stage the
    target copies ``/opt/tailguard`` from, its chain's ``pip install ... .[extra,...]``.

    Raises:
        BuildError: the target copies /opt/tailguard from no stage.
    """
    stages = stages if stages is not None else parse_dockerfile()
    extras: set[str] = set()
    for stage in stage_chain(stages, build_stage(target, stages)):
        for run in stage.args("RUN"):
            for command in run.split("&&"):
                words = shlex.split(command)
                if any(w.endswith("pip") for w in words[:1]) and words[1:2] == ["install"]:
                    for word in words[2:]:
                        match = re.fullmatch(r"\.\[([^\]]*)\]", word)
                        if match:
                            extras.update(e.strip() for e in match.group(1).split(","))
    return sorted(e for e in extras if e)


def checks(target: str, stages: list[Stage] | None = None) -> list[str]:
    """The shell text of every RUN of ``target``'s own stage (the checks the Dockerfile runs on
    the final image, e.g. ``python -c "import ..."``)."""
    stages = stages if stages is not None else parse_dockerfile()
    return stage_chain(stages, target)[-1].args("RUN")


# --- the cache, steps and commands ----------------------------------------------------------


def cache_root() -> Path:
    """Where built pieces live: ``$TAILGUARD_IMAGE_CACHE``, else
    ``$XDG_CACHE_HOME/tailguard/images``, else ``~/.cache/tailguard/images``."""
    explicit = os.environ.get("TAILGUARD_IMAGE_CACHE")
    if explicit:
        return Path(explicit)
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "tailguard" / "images"


def _digest(*parts: str | bytes | Path) -> str:
    """12 hex digits of sha256 over ``parts`` (a Path: its relative name and contents; a
    folder: every file under it, sorted, without __pycache__)."""
    h = hashlib.sha256(BUILDER_VERSION.encode())
    for part in parts:
        if isinstance(part, Path):
            files = [part] if part.is_file() else sorted(
                p for p in part.rglob("*") if p.is_file() and "__pycache__" not in p.parts
                and p.suffix != ".pyc")
            for f in files:
                rel = f.relative_to(REPO) if f.is_relative_to(REPO) else f
                h.update(str(rel).encode() + b"\0" + f.read_bytes() + b"\0")
        else:
            h.update((part.encode() if isinstance(part, str) else part) + b"\0")
    return h.hexdigest()[:12]


@contextlib.contextmanager
def _step(what: str, log: bool) -> Iterator[None]:
    started = time.monotonic()
    yield
    if log:
        print(f"[image] {what}: {time.monotonic() - started:.1f} s", file=sys.stderr, flush=True)


def _run(argv: list[str], what: str, **kwargs: Any) -> str:
    """Run ``argv``, capturing its output; on failure print the output's tail to stderr.

    Raises:
        BuildError: the command is missing or fails.
    """
    try:
        done = subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                              errors="replace", **kwargs)
    except FileNotFoundError:
        raise BuildError(f"{argv[0]} not found (needed for {what})") from None
    if done.returncode != 0:
        tail = "\n".join(done.stdout.splitlines()[-40:])
        print(tail, file=sys.stderr)
        raise BuildError(f"{what} failed (exit {done.returncode}); its output's last lines "
                         "are above")
    return str(done.stdout)


def _need(command: str, hint: str) -> str:
    found = shutil.which(command) or next(
        (p for p in (f"/usr/sbin/{command}", f"/sbin/{command}") if os.access(p, os.X_OK)), None)
    if found is None:
        raise BuildError(f"{command} not found: {hint}")
    return found


def _fresh(path: Path) -> Path:
    """``path`` with ``.partial-<pid>`` appended, removed first if a previous run left it."""
    partial = path.with_name(f"{path.name}.partial-{os.getpid()}")
    _remove(partial)
    return partial


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    elif path.exists() or path.is_symlink():
        path.unlink()


def _publish(partial: Path, final: Path) -> Path:
    _remove(final)
    partial.rename(final)
    return final


# --- layers and archives --------------------------------------------------------------------


@dataclass(frozen=True)
class Layer:
    """An uncompressed layer tar on disk and its digest (sha256 hex = its diff_id)."""

    path: Path
    sha256: str
    size: int


def _walk(root: Path, rel: str, empty: tuple[str, ...]) -> Iterator[str]:
    """Paths under ``root/rel`` (``rel`` included), depth first, names sorted; the contents of
    folders named in ``empty`` are skipped."""
    yield rel
    full = root / rel
    if full.is_dir() and not full.is_symlink() and rel not in empty:
        for name in sorted(os.listdir(full)):
            yield from _walk(root, f"{rel}/{name}" if rel != "." else name, empty)


def write_layer(root: Path, paths: list[str], out: Path,
                empty: tuple[str, ...] = ()) -> Layer:
    """Write the tree ``root/<path>`` of each of ``paths`` (relative, e.g. ``opt/tailguard``)
    into the uncompressed tar ``out``: entries sorted, numeric owners and modes kept (no user
    names), mtimes in whole seconds, symlinks and hard links (within the layer) kept, sockets
    left out. A path's parent folders are written first (with their own metadata).

    Raises:
        OSError: a path cannot be read.
    """
    names: list[str] = []
    for path in paths:
        parts = Path(path).parts
        names += [str(Path(*parts[:i])) for i in range(1, len(parts))
                  if str(Path(*parts[:i])) not in names]
        names += list(_walk(root, path, empty))
    h = hashlib.sha256()

    class _Hashing(io.RawIOBase):
        def __init__(self, raw: io.BufferedWriter) -> None:
            self.raw = raw

        def writable(self) -> bool:
            return True

        def write(self, data: Any) -> int:
            h.update(data)
            return self.raw.write(data)

    with open(out, "wb") as raw, tarfile.open(fileobj=_Hashing(raw), mode="w|",
                                              format=tarfile.PAX_FORMAT) as tar:
        for name in names:
            info = tar.gettarinfo(str(root / name), arcname=name)
            if info is None:  # a socket
                continue
            info.mtime = int(info.mtime)
            info.uname = info.gname = ""
            if info.isreg():
                with open(root / name, "rb") as f:
                    tar.addfile(info, f)
            else:
                tar.addfile(info)
    return Layer(out, h.hexdigest(), out.stat().st_size)


def _json_bytes(value: Any) -> bytes:
    return json.dumps(value, indent=None, separators=(",", ":"), sort_keys=True).encode()


def write_archive(out: Path, ref: str, layers: list[Layer], config: dict[str, Any],
                  history: list[str]) -> Path:
    """Write the OCI image-layout tar ``out`` of one linux/amd64 image named ``ref``:
    ``oci-layout``, ``index.json`` (the manifest annotated with ``io.containerd.image.name``
    = ``ref`` and ``org.opencontainers.image.ref.name`` = its tag), ``blobs/sha256/``: the
    layers, the image config (``config``, ``rootfs.diff_ids``, one history entry per layer
    with ``history``'s text) and the manifest.

    Raises:
        OSError: a layer cannot be read or ``out`` written.
    """
    now = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    image = {"created": now, "architecture": "amd64", "os": "linux", "config": config,
             "rootfs": {"type": "layers", "diff_ids": [f"sha256:{la.sha256}" for la in layers]},
             "history": [{"created": now, "created_by": text} for text in history]}
    config_blob = _json_bytes(image)
    config_sha = hashlib.sha256(config_blob).hexdigest()
    config_desc = {"mediaType": CONFIG_TYPE, "size": len(config_blob),
                   "digest": f"sha256:{config_sha}"}
    manifest = _json_bytes({"schemaVersion": 2, "mediaType": MANIFEST_TYPE, "config": config_desc,
                            "layers": [{"mediaType": LAYER_TYPE, "size": la.size,
                                        "digest": f"sha256:{la.sha256}"} for la in layers]})
    manifest_digest = "sha256:" + hashlib.sha256(manifest).hexdigest()
    tag = ref.rpartition(":")[2] if ":" in ref.rpartition("/")[2] else "latest"
    index = _json_bytes({"schemaVersion": 2, "mediaType": INDEX_TYPE, "manifests": [
        {"mediaType": MANIFEST_TYPE, "digest": manifest_digest, "size": len(manifest),
         "platform": {"architecture": "amd64", "os": "linux"},
         "annotations": {"io.containerd.image.name": ref,
                         "org.opencontainers.image.ref.name": tag}}]})

    def member(tar: tarfile.TarFile, name: str, data: bytes | None = None,
               path: Path | None = None) -> None:
        info = tarfile.TarInfo(name)
        info.mode, info.mtime = 0o644, 0
        if data is None and path is None:
            info.type, info.mode = tarfile.DIRTYPE, 0o755
            tar.addfile(info)
        elif path is not None:
            info.size = path.stat().st_size
            with open(path, "rb") as f:
                tar.addfile(info, f)
        else:
            assert data is not None
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))

    with tarfile.open(out, "w", format=tarfile.PAX_FORMAT) as tar:
        member(tar, "oci-layout", b'{"imageLayoutVersion":"1.0.0"}')
        member(tar, "index.json", index)
        member(tar, "blobs")
        member(tar, "blobs/sha256")
        for layer in layers:
            member(tar, f"blobs/sha256/{layer.sha256}", path=layer.path)
        member(tar, f"blobs/sha256/{config_sha}", config_blob)
        member(tar, f"blobs/sha256/{manifest_digest.split(':')[1]}", manifest)
    return out


def _load_layer(folder: Path) -> Layer:
    meta = json.loads((folder / "layer.json").read_text())
    return Layer(folder / "layer.tar", meta["sha256"], meta["size"])


def _save_layer(folder: Path, layer: Layer) -> None:
    (folder / "layer.json").write_text(json.dumps({"sha256": layer.sha256, "size": layer.size}))


# --- the pieces -----------------------------------------------------------------------------


def base_key(stages: list[Stage]) -> str:
    """The cache key of the base root filesystem: suite, packages, the ``base`` stage's RUN
    lines, what is stripped, the builder version."""
    runs = "\n".join(stage_chain(stages, "base")[-1].args("RUN"))
    return _digest(SUITE, *PACKAGES, runs, *STRIP, *EMPTY_IN_LAYER)


def build_base(stages: list[Stage], log: bool = True) -> tuple[Path, Layer]:
    """The base root filesystem folder and its layer, built if the cache lacks them:
    debootstrap, the base stage's RUN lines in a chroot, then stripping (several minutes cold).

    Raises:
        BuildError: no debootstrap/chroot, not root, or a failed step.
    """
    folder = cache_root() / f"base-{SUITE}-{base_key(stages)}"
    if (folder / "layer.json").is_file():
        if log:
            print(f"[image] base rootfs: cached ({folder.name})", file=sys.stderr)
        return folder / "rootfs", _load_layer(folder)
    debootstrap = _need("debootstrap", "apt-get install debootstrap")
    chroot = _need("chroot", "apt-get install coreutils")
    if os.geteuid() != 0:
        raise BuildError("building the base root filesystem needs root (debootstrap, chroot)")
    staging = _fresh(folder)
    rootfs = staging / "rootfs"
    staging.mkdir(parents=True)
    mirror = os.environ.get("TAILGUARD_DEBIAN_MIRROR", MIRROR)
    with _step(f"debootstrap {SUITE} minbase + {' '.join(PACKAGES)} from {mirror}", log):
        _run([debootstrap, "--variant=minbase", f"--include={','.join(PACKAGES)}", SUITE,
              str(rootfs), mirror], "debootstrap")
    with _step("base stage RUN lines (user tailguard 10001) in chroot, strip", log):
        for run in stage_chain(stages, "base")[-1].args("RUN"):
            _run([chroot, str(rootfs), "/bin/sh", "-ec", run], f"RUN {run[:40]}...",
                 env={"PATH": DEFAULT_PATH, "LANG": "C.UTF-8"})
        for rel in STRIP:
            path = rootfs / rel
            if path.is_dir() and not path.is_symlink():
                for child in path.iterdir():
                    _remove(child)
            elif path.exists() or path.is_symlink():
                path.unlink()
        doc = rootfs / "usr/share/doc"
        for path in sorted(doc.rglob("*"), reverse=True):
            if path.is_file() or path.is_symlink():
                if path.name != "copyright":
                    path.unlink()
            elif path.is_dir() and not any(path.iterdir()):
                path.rmdir()
    with _step("base layer tar", log):
        layer = write_layer(rootfs, sorted(os.listdir(rootfs)), staging / "layer.tar",
                            empty=EMPTY_IN_LAYER)
        _save_layer(staging, layer)
    _publish(staging, folder)
    return folder / "rootfs", _load_layer(folder)


def wheelhouse_requirements(stages: list[Stage]) -> list[str]:
    """Requirements the wheelhouse must satisfy: the project's dependencies and those of every
    extra a target's build stage installs, pip, and the project's build-system requirements."""
    meta = tomllib.loads((REPO / "pyproject.toml").read_text())
    reqs = list(meta["project"]["dependencies"])
    for target in TARGETS:
        for extra in build_extras(target, stages):
            reqs += meta["project"]["optional-dependencies"][extra]
    return [*reqs, "pip", *meta["build-system"]["requires"]]


def build_wheelhouse(stages: list[Stage], log: bool = True) -> Path:
    """A folder of binary wheels for CPython 3.11 on manylinux x86_64 (glibc <= 2.36), pinned
    by constraints.txt (copied in as ``constraints.txt``), downloaded if the cache lacks it.

    Raises:
        BuildError: pip cannot download a requirement (no network, or no binary wheel).
    """
    folder = cache_root() / f"wheels-{_digest(REPO / 'constraints.txt', REPO / 'pyproject.toml')}"
    if (folder / "constraints.txt").is_file():
        if log:
            print(f"[image] wheelhouse: cached ({folder.name})", file=sys.stderr)
        return folder
    staging = _fresh(folder)
    platforms = [a for minor in range(17, GLIBC_MINOR + 1)
                 for a in ("--platform", f"manylinux_2_{minor}_x86_64")]
    platforms += [a for p in ("manylinux2014_x86_64", "manylinux2010_x86_64",
                              "manylinux1_x86_64") for a in ("--platform", p)]
    with _step("wheelhouse (pip download, binary wheels only)", log):
        _run([sys.executable, "-m", "pip", "download", "--quiet", "--disable-pip-version-check",
              "--dest", str(staging), "--constraint", str(REPO / "constraints.txt"),
              "--only-binary=:all:", *platforms, "--python-version", "3.11",
              "--implementation", "cp", "--abi", "cp311", "--abi", "abi3", "--abi", "none",
              *wheelhouse_requirements(stages)], "pip download of the wheelhouse")
        shutil.copyfile(REPO / "constraints.txt", staging / "constraints.txt")
    return _publish(staging, folder)


def project_wheel(wheelhouse: Path, out: Path, log: bool = True) -> Path:
    """Build the project's wheel into ``out`` from a copy of the Docker build context (so the
    checkout gets no build/ or egg-info), offline with the wheelhouse's setuptools.

    Raises:
        BuildError: no pip in this Python, or the build fails.
    """
    with _step("project wheel", log):
        context = out / "context"
        for rel in CONTEXT:
            src = REPO / rel
            if src.is_dir():
                shutil.copytree(src, context / rel,
                                ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
            else:
                (context / rel).parent.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(src, context / rel)
        _run([sys.executable, "-m", "pip", "wheel", "--quiet", "--disable-pip-version-check",
              "--no-deps", "--no-index", "--find-links", str(wheelhouse), "--wheel-dir",
              str(out), str(context)], "pip wheel of the project")
        shutil.rmtree(context)
    (wheel,) = out.glob("tailguard-*.whl")
    return wheel


def _chroot_script(rootfs: Path, work: Path, mounts: dict[str, Path], script: str,
                   env: dict[str, str]) -> str:
    """Run ``script`` (sh) as root in a chroot on an overlay of ``rootfs`` (changes land in
    ``work/upper``), with ``mounts`` (path in the chroot -> host folder) bound read-only and
    /proc mounted, in a private mount and PID namespace: nothing stays mounted afterwards."""
    unshare = _need("unshare", "apt-get install util-linux")
    for name in ("upper", "work", "merged"):
        (work / name).mkdir(parents=True, exist_ok=True)
    merged = work / "merged"
    outer = ["set -e",
             f"mount -t overlay overlay -o lowerdir={rootfs},upperdir={work / 'upper'},"
             f"workdir={work / 'work'} {merged}"]
    for inside, host in mounts.items():
        outer += [f"mkdir -p {merged}{inside}", f"mount --bind {host} {merged}{inside}",
                  f"mount -o remount,bind,ro {merged}{inside}"]
    outer += [f"mount -t proc proc {merged}/proc",
              f'exec chroot {merged} /usr/bin/env -i {" ".join(f"{k}={shlex.quote(v)}" for k, v in env.items())} '
              f'/bin/sh -ec "$1"']
    return _run([unshare, "--mount", "--pid", "--fork", "--propagation", "private",
                 "/bin/sh", "-c", "\n".join(outer), "sh", script], "the venv build in a chroot")


def build_venv(target: str, stages: list[Stage], rootfs: Path, wheelhouse: Path, wheel: Path,
               work: Path, seed: Path | None = None, log: bool = True) -> Path:
    """Make ``/opt/tailguard`` for ``target`` as the Dockerfile's build stage does (a venv, pip,
    the project with the stage's extras under constraints.txt, ``pip check``) and run the
    target's own RUN checks, in a chroot whose changes land in ``work/upper``. With ``seed`` (the
    ``upper`` folder of the build stage this one is built FROM, e.g. ``build`` for
    ``build-operator``) the environment starts as a copy of that one, as in the Dockerfile.
    Returns the folder holding ``opt/tailguard``.

    Raises:
        BuildError: an install or a check fails.
    """
    extras = build_extras(target, stages)
    requirement = f"/project/{wheel.name}" + (f"[{','.join(extras)}]" if extras else "")
    (pip_wheel,) = wheelhouse.glob("pip-*.whl")
    config = image_config(target, stages)
    env = dict(item.split("=", 1) for item in config["Env"])
    env.update(HOME="/root", PIP_NO_CACHE_DIR="1", PIP_DISABLE_PIP_VERSION_CHECK="1")
    pip = f"{VENV}/bin/pip"
    upper = work / "upper"
    upper.mkdir(parents=True)
    script = [f"{PYTHON} -m venv --without-pip {VENV}",
              f"{VENV}/bin/python /wheels/{pip_wheel.name}/pip install --quiet --no-index "
              f"/wheels/{pip_wheel.name}"]
    if seed is not None:
        script = [f"cp -a /seed/opt/tailguard {VENV}"]
    script += [f"{pip} install --quiet --no-index --find-links /wheels "
               f"-c /wheels/constraints.txt '{requirement}'",
               f"{pip} check",
               *checks(target, stages),
               f"{VENV}/bin/tailguard-runtime --help >/dev/null",
               f"{VENV}/bin/tailguard --help >/dev/null"]
    what = "pip install " + (f".[{','.join(extras)}]" if extras else ".") + (
        " on a copy of the stage below" if seed else "")
    with _step(f"{target}: venv {VENV} ({what}, pip check, RUN checks)", log):
        mounts = {"/wheels": wheelhouse, "/project": wheel.parent}
        _chroot_script(rootfs, work, {**mounts, "/seed": seed} if seed else mounts,
                       "\n".join(script), env)
    return upper


def project_version() -> str:
    """The ``version`` of pyproject.toml (the images' tag)."""
    return str(tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"])


def image_ref(target: str) -> str:
    """The reference containerd gives ``target``'s image: ``docker.io/tailguard/<target>:<v>``
    (what ``tailguard/<target>:<v>`` in a pod spec normalises to)."""
    return f"docker.io/tailguard/{target}:{project_version()}"


def build_images(log: bool = True) -> list[tuple[Path, str]]:
    """Build (or find cached) the runtime and operator archives: (archive path, reference).
    Archives of older sources are removed once a new one is in place.

    Raises:
        BuildError: a missing tool, no network for a cold build, or a failed step.
    """
    stages = parse_dockerfile()
    rootfs, base_layer = build_base(stages, log)
    wheelhouse = build_wheelhouse(stages, log)
    sources = _digest(base_key(stages), wheelhouse.name, *[REPO / rel for rel in CONTEXT],
                      DOCKERFILE, Path(__file__).resolve())
    out: list[tuple[Path, str]] = []
    scratch = _fresh(cache_root() / f"scratch-{sources}")
    built: dict[str, Path] = {}  # build stage name -> its upper folder
    wheel: Path | None = None
    try:
        for target in TARGETS:
            ref = image_ref(target)
            archive = cache_root() / f"{target}-{sources}.oci.tar"
            out.append((archive, ref))
            if archive.is_file():
                if log:
                    print(f"[image] {target}: cached ({archive.name})", file=sys.stderr)
                continue
            if wheel is None:
                (scratch / "wheel").mkdir(parents=True)
                wheel = project_wheel(wheelhouse, scratch / "wheel", log)
            stage = build_stage(target, stages)
            below = [s.name for s in stage_chain(stages, stage)[:-1] if s.name in built]
            upper = build_venv(target, stages, rootfs, wheelhouse, wheel, scratch / target,
                               built[below[-1]] if below else None, log)
            built[stage] = upper
            with _step(f"{target}: venv layer tar + archive", log):
                layer = write_layer(upper, [VENV.lstrip("/")], scratch / f"{target}.tar")
                partial = _fresh(archive)
                write_archive(partial, ref, [base_layer, layer], image_config(target, stages),
                              [f"debootstrap {SUITE} minbase + {' '.join(PACKAGES)}; base stage",
                               f"{VENV}: pip install .[{','.join(build_extras(target, stages))}]"])
                _publish(partial, archive)
                (scratch / f"{target}.tar").unlink()
            for old in cache_root().glob(f"{target}-*.oci.tar"):
                if old != archive:
                    old.unlink()
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return out


def find_go() -> str:
    """The ``go`` command: ``$GO``, else ``go`` on PATH, else /usr/local/go/bin/go.

    Raises:
        BuildError: no Go found.
    """
    for candidate in (os.environ.get("GO"), shutil.which("go"), "/usr/local/go/bin/go"):
        if candidate and os.access(candidate, os.X_OK):
            return candidate
    raise BuildError("go not found: install Go 1.26 (e.g. from go.dev/dl) or set $GO")


def build_pause(log: bool = True) -> tuple[Path, str]:
    """Build (or find cached) the pause image archive: (archive path, reference).

    Raises:
        BuildError: no Go, or the build fails.
    """
    go = find_go()
    env = {**os.environ, "CGO_ENABLED": "0", "GOTOOLCHAIN": "local", "GOOS": "linux",
           "GOARCH": "amd64", "GOFLAGS": "-mod=mod"}
    version = _run([go, "version"], "go version", env=env).strip()
    key = _digest(version, PAUSE_SRC / "go.mod", PAUSE_SRC / "main.go", PAUSE_REF, PAUSE_USER,
                  Path(__file__).resolve())
    archive = cache_root() / f"pause-{key}.oci.tar"
    if archive.is_file():
        if log:
            print(f"[image] pause: cached ({archive.name})", file=sys.stderr)
        return archive, PAUSE_REF
    staging = _fresh(cache_root() / f"pause-{key}")
    try:
        with _step("pause: go build + archive", log):
            (staging / "root").mkdir(parents=True)
            _run([go, "build", "-trimpath", "-ldflags", "-s -w -buildid=", "-o",
                  str(staging / "root" / "pause"), "."], "go build of hack/image/pause",
                 cwd=PAUSE_SRC, env=env)
            os.chmod(staging / "root" / "pause", 0o755)
            os.chown(staging / "root" / "pause", 0, 0)
            layer = write_layer(staging / "root", ["pause"], staging / "layer.tar")
            config = {"Env": [f"PATH={DEFAULT_PATH}"], "User": PAUSE_USER,
                      "Entrypoint": ["/pause"]}
            partial = _fresh(archive)
            write_archive(partial, PAUSE_REF, [layer], config, ["/pause from hack/image/pause"])
            _publish(partial, archive)
        for old in cache_root().glob("pause-*.oci.tar"):
            if old != archive:
                old.unlink()
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return archive, PAUSE_REF


def build_all(out_dir: Path | None = None, log: bool = True) -> list[tuple[Path, str]]:
    """Build (or find cached) all three archives under one lock; with ``out_dir``, hard-link
    (or copy) them there as ``<name>-<tag>.oci.tar``. Returns (archive path, reference) pairs.

    Raises:
        BuildError: a step failed.
    """
    root = cache_root()
    root.mkdir(parents=True, exist_ok=True)
    with open(root / "build.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # a concurrent caller waits here, then reuses
        built = [*build_images(log), build_pause(log)]
    if out_dir is None:
        return built
    out_dir.mkdir(parents=True, exist_ok=True)
    placed = []
    for archive, ref in built:
        name, _, tag = ref.rpartition("/")[2].partition(":")
        dest = out_dir / f"{name}-{tag}.oci.tar"
        _remove(dest)
        try:
            os.link(archive, dest)
        except OSError:
            shutil.copyfile(archive, dest)
        placed.append((dest, ref))
    return placed


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Build (or find cached) tailguard's OCI image "
                                     "archives: runtime, operator, pause.")
    parser.add_argument("--out", type=Path, help="also place the archives in this folder")
    args = parser.parse_args(argv)
    try:
        for archive, ref in build_all(args.out):
            print(f"{archive}\t{ref}")
    except BuildError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
