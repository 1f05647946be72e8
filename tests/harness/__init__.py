"""What the tests share: the repository's root, and one module per kind of thing a test drives.

:mod:`.runtime` runs ``tailguard-runtime`` processes, :mod:`.up` runs ``tailguard up`` and the
CLI, :mod:`.chart` runs Helm, :mod:`.dockerfile` reads the Dockerfile as docker would, :mod:`.kube`
runs a Kubernetes control plane built from upstream, :mod:`.scene` acts on it as a test would,
and :mod:`.hack` loads the build scripts in ``hack/kube``. Imported as the package ``harness``
(``pythonpath`` in ``pyproject.toml``).
"""

from __future__ import annotations

from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
"""The repository's root folder."""
