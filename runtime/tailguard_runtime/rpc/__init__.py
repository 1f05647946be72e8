"""The Open Inference Protocol's gRPC service (``inference.GRPCInferenceService``).

:mod:`~tailguard_runtime.rpc.tensors` converts its messages (pure);
:mod:`~tailguard_runtime.rpc.service` serves them on the runtime's event loop, into the same
batches as the REST routes. The message classes are generated from the protocol's published
``.proto`` by ``hack/proto/build.py`` into ``generated/`` (not in git).
"""
