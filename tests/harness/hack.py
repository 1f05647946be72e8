"""The build scripts of ``hack/kube`` and ``hack/image`` as modules: they are stdlib-only
scripts run before any virtualenv exists, so they are loaded from their files rather than
installed."""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys
from pathlib import Path
from types import ModuleType

from harness import REPO

HACK_KUBE = REPO / "hack" / "kube"
"""The folder of ``build.py`` and ``gomod.py``."""


def load(name: str) -> ModuleType:
    """``hack/kube/<name>.py`` as a module (loaded once, then taken from ``sys.modules``).
    ``build.py`` imports ``gomod`` by its bare name, so ``gomod`` is registered under that name
    and loaded first: both then share one copy."""
    key = name if name == "gomod" else f"hack_kube_{name}"
    if key in sys.modules:
        return sys.modules[key]
    if name == "build":
        load("gomod")
    spec = importlib.util.spec_from_file_location(key, HACK_KUBE / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[key] = module
    spec.loader.exec_module(module)
    return module


HACK_IMAGE = REPO / "hack" / "image"
"""The folder of the image builder ``build.py`` (and the pause program's sources)."""


def load_build(folder: str) -> ModuleType:
    """``hack/<folder>/build.py`` (the image builder, the metrics pipeline's, containerd's) as
    a module, registered as ``hack_<folder>_build`` (loaded once)."""
    key = f"hack_{folder}_build"
    if key in sys.modules:
        return sys.modules[key]
    spec = importlib.util.spec_from_file_location(key, REPO / "hack" / folder / "build.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[key] = module
    spec.loader.exec_module(module)
    return module


def load_image() -> ModuleType:
    """``hack/image/build.py`` as a module (:func:`load_build`)."""
    return load_build("image")


def built(variable: str, folder: str, error: type[Exception]) -> Path:
    """The folder of the binaries ``hack/<folder>/build.py`` builds: ``$<variable>`` when set
    (``make test`` sets it after building), else what the script builds or finds cached (its
    progress goes to our stderr, its folder is its last line).

    Raises:
        error: the build failed or Go is missing (the script's last line says which).
    """
    explicit = os.environ.get(variable)
    if explicit:
        return Path(explicit)
    script = REPO / "hack" / folder / "build.py"
    done = subprocess.run([shutil.which("python3") or "python3", str(script)],
                          stdout=subprocess.PIPE, text=True)
    if done.returncode != 0:
        raise error(f"{script} failed (exit {done.returncode}); see its last line above")
    return Path(done.stdout.strip().splitlines()[-1])
