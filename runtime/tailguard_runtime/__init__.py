"""tailguard's batching model server: Open Inference Protocol v2 and KServe v1 over HTTP."""

from importlib.metadata import version

__version__ = version("tailguard")
"""The installed distribution's version (``pyproject.toml``), the one version of every part."""
