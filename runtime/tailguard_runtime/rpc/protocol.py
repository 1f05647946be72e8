"""The message classes of ``inference.GRPCInferenceService``, made from the protocol's
compiled descriptor set (``grpc_predict_v2.binpb``, which ``hack/proto/build.py`` compiles from
the published ``.proto``) in a descriptor pool of this module's own.

A pool of its own, not protobuf's default one: Triton's and KServe's client libraries register
their copies of the same protocol there under the same names (``inference.ModelInferRequest``
...), and two different definitions of one name in the default pool fail the second import, so
a process (a test, a user's script) could not load the runtime beside one of those clients.
Messages from different pools are different classes with the same wire format.
"""

from __future__ import annotations

from importlib import resources
from typing import Any

from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

DESCRIPTOR_SET = "grpc_predict_v2.binpb"
SERVICE = "inference.GRPCInferenceService"
"""The service's full name: calls go to ``/inference.GRPCInferenceService/<Method>``."""


def _load() -> descriptor_pool.DescriptorPool:
    """The pool holding the protocol's descriptors.

    Raises:
        ImportError: the descriptor set was not compiled (``make install`` compiles it).
    """
    try:
        data = resources.files(__package__).joinpath(DESCRIPTOR_SET).read_bytes()
    except FileNotFoundError:
        raise ImportError(f"tailguard_runtime/rpc/{DESCRIPTOR_SET} is missing: compile the gRPC "
                          "protocol with `make install` (or python hack/proto/build.py)") from None
    files = descriptor_pb2.FileDescriptorSet.FromString(data)
    pool = descriptor_pool.DescriptorPool()
    for file in files.file:
        pool.Add(file)
    return pool


POOL = _load()


def message(name: str) -> Any:
    """The message class of ``inference.<name>`` (``ModelInferRequest``,
    ``ModelMetadataResponse.TensorMetadata``, ...).

    Raises:
        KeyError: the protocol has no such message.
    """
    return message_factory.GetMessageClass(POOL.FindMessageTypeByName(f"inference.{name}"))


def methods() -> dict[str, tuple[Any, Any]]:
    """Each method of :data:`SERVICE` by name: its request and response classes."""
    service = POOL.FindServiceByName(SERVICE)
    return {m.name: (message_factory.GetMessageClass(m.input_type),
                     message_factory.GetMessageClass(m.output_type)) for m in service.methods}


ServerLiveResponse = message("ServerLiveResponse")
ServerReadyResponse = message("ServerReadyResponse")
ModelReadyResponse = message("ModelReadyResponse")
ServerMetadataResponse = message("ServerMetadataResponse")
ModelMetadataResponse = message("ModelMetadataResponse")
TensorMetadata = message("ModelMetadataResponse.TensorMetadata")
ModelInferRequest = message("ModelInferRequest")
ModelInferResponse = message("ModelInferResponse")
InferParameter = message("InferParameter")
