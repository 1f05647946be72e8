"""The Open Inference Protocol's gRPC service (``inference.GRPCInferenceService``).

:mod:`~tailguard_runtime.rpc.protocol` makes the message classes from the protocol's published
``.proto``, compiled by ``hack/proto/build.py`` (not in git);
:mod:`~tailguard_runtime.rpc.tensors` converts the messages (pure);
:mod:`~tailguard_runtime.rpc.service` serves them on the runtime's event loop, into the same
batches as the REST routes.
"""
