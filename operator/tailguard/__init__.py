"""tailguard's control plane and the tools that drive the runtime.

One subpackage per room; a room imports only from the rooms below it (``docs/architecture.md``,
enforced by import-linter from ``pyproject.toml``): ``cli`` over ``report``, ``tune``, ``bench``,
then ``up`` and ``operator`` (independent of each other), ``guard``, ``spec``, ``_util``, and
below all of them the data plane, ``tailguard_runtime``.
"""
