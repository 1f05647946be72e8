"""The optional parts of the distribution and the commands that need them.

The base install (what the runtime image carries) serves and measures on one machine; the
``operator`` extra adds the Kubernetes client and kopf (``tailguard operator`` and every
``--cluster``), the ``tools`` extra adds matplotlib (the plots of ``tune`` and ``report``).
"""

from __future__ import annotations

import importlib.util
import sys

EXTRAS = {"operator": ("kopf", "kubernetes", "urllib3"), "tools": ("matplotlib",)}
"""Each extra and the top-level modules it brings (``pyproject.toml``)."""


def extra_of(module: str | None) -> str | None:
    """The extra that brings the top-level module ``module``, or ``None``."""
    top = (module or "").split(".", 1)[0]
    return next((extra for extra, mods in EXTRAS.items() if top in mods), None)


def missing_line(command: str, extra: str) -> str:
    """The one line a command prints when its extra is not installed."""
    return (f"tailguard {command}: needs the {extra} extra, which is not installed "
            f"(pip install 'tailguard[{extra}]')")


def require(command: str, extra: str) -> bool:
    """Whether every module of ``extra`` can be imported; if not, print :func:`missing_line`
    on stderr first. Checked before long work starts, so a missing plot library does not end
    a tune run at its last step."""
    if all(importlib.util.find_spec(module) is not None for module in EXTRAS[extra]):
        return True
    print(missing_line(command, extra), file=sys.stderr)
    return False
