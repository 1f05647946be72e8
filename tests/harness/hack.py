"""The build scripts of ``hack/kube`` and ``hack/image`` as modules: they are stdlib-only
scripts run before any virtualenv exists, so they are loaded from their files rather than
installed."""

from __future__ import annotations

import importlib.util
import sys
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


def load_image() -> ModuleType:
    """``hack/image/build.py`` as a module, registered as ``hack_image_build`` (loaded once)."""
    key = "hack_image_build"
    if key in sys.modules:
        return sys.modules[key]
    spec = importlib.util.spec_from_file_location(key, HACK_IMAGE / "build.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[key] = module
    spec.loader.exec_module(module)
    return module
