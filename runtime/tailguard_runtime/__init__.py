"""tailguard's batching model server: Open Inference Protocol v2 and KServe v1 over HTTP."""

__version__ = "0.1.0"
