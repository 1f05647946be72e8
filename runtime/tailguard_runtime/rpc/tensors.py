"""The gRPC messages of the Open Inference Protocol (:mod:`~tailguard_runtime.rpc.protocol`),
to and from what the runtime serves.

A ``ModelInferRequest`` is turned into the mapping a v2 REST body decodes to, with every
input's values as binary tensor data (the raw bytes of ``raw_input_contents``, or the typed
``contents`` packed little-endian), and decoded by :func:`~tailguard_runtime.wire.decode_v2_doc`:
one set of checks (datatypes, shapes, feature names, finite values, INT64 and FP32 ranges) for
every encoding. Answers go out as ``raw_output_contents``, the form Triton's server sends and
``tritonclient.grpc``'s ``as_numpy`` reads. Pure: no I/O.
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

import numpy as np

from tailguard_runtime.errors import InvalidInput
from tailguard_runtime.models import OutputSpec
from tailguard_runtime.rpc import protocol as pb
from tailguard_runtime.wire import BINARY_DTYPES, V2Request, binary_tensor, decode_v2_doc

CONTENTS_FIELD = {"FP32": "fp32_contents", "FP64": "fp64_contents", "INT64": "int64_contents"}
"""Where each input datatype's values go in ``InferTensorContents`` (the protocol's table)."""


def parameter_value(parameter: Any) -> bool | int | str | None:
    """An ``InferParameter``'s value (whichever of its ``oneof`` is set), or ``None``."""
    choice = parameter.WhichOneof("parameter_choice")
    return None if choice is None else getattr(parameter, choice)


def parameters_of(parameters: Mapping[str, Any]) -> dict[str, Any]:
    """A ``map<string, InferParameter>`` as a plain mapping of values."""
    return {key: parameter_value(value) for key, value in parameters.items()}


def as_v2(request: Any) -> tuple[dict[str, Any], bytes]:
    """``request`` as a v2 REST request mapping and its binary tensor data.

    Raises:
        InvalidInput: ``raw_input_contents`` given for some inputs but not all, or together
            with ``contents``; values in a ``contents`` field other than the datatype's
            (:data:`CONTENTS_FIELD`); a value count or byte count that does not match the
            input's shape (422).
    """
    raw = list(request.raw_input_contents)
    if raw and len(raw) != len(request.inputs):
        raise InvalidInput(f"raw_input_contents has {len(raw)} entries for "
                           f"{len(request.inputs)} inputs; give one per input, in order")
    inputs: list[dict[str, Any]] = []
    chunks: list[bytes] = []
    for i, tensor in enumerate(request.inputs):
        where = f"inputs[{i}] ({tensor.name})"
        shape = list(tensor.shape)
        doc: dict[str, Any] = {"name": tensor.name, "datatype": tensor.datatype,
                               "shape": shape, "parameters": parameters_of(tensor.parameters)}
        inputs.append(doc)
        count = int(np.prod(shape)) if all(d >= 0 for d in shape) else None
        dtype = BINARY_DTYPES.get(tensor.datatype)
        filled = [f.name for f, _ in tensor.contents.ListFields()] \
            if tensor.HasField("contents") else []
        if raw:
            if filled:
                raise InvalidInput(f"{where}: values are in raw_input_contents, so contents "
                                   f"must be empty; it has {', '.join(filled)}")
            data = raw[i]
            if dtype is not None and count is not None and len(data) != count * dtype.itemsize:
                raise InvalidInput(f"{where}: shape {shape} of {tensor.datatype} needs "
                                   f"{count * dtype.itemsize} bytes, raw_input_contents[{i}] "
                                   f"has {len(data)}")
        elif dtype is None:
            continue  # an unsupported datatype: decode_v2_doc names it
        else:
            field = CONTENTS_FIELD[tensor.datatype]
            stray = [name for name in filled if name != field]
            if stray:
                raise InvalidInput(f"{where}: {tensor.datatype} values go in contents.{field}, "
                                   f"got {', '.join(f'contents.{n}' for n in stray)}")
            values = getattr(tensor.contents, field)
            if count is not None and len(values) != count:
                raise InvalidInput(f"{where}: shape {shape} needs {count} values, "
                                   f"contents.{field} has {len(values)}")
            data = np.asarray(values, dtype=dtype).tobytes()
        doc["parameters"]["binary_data_size"] = len(data)
        chunks.append(data)
    body: dict[str, Any] = {"inputs": inputs}
    if request.id:
        body["id"] = request.id
    if request.parameters:
        body["parameters"] = parameters_of(request.parameters)
    if request.outputs:
        body["outputs"] = [{"name": o.name} for o in request.outputs]
    return body, b"".join(chunks)


def decode_infer(request: Any, n_features: int, known_outputs: Sequence[str],
                 max_rows: int, feature_names: Sequence[str] | None) -> V2Request:
    """Decode and validate ``request`` exactly as a v2 REST body with binary tensor data
    (:func:`~tailguard_runtime.wire.decode_v2_doc`).

    Raises:
        PayloadTooLarge: more than ``max_rows`` rows (413).
        InvalidInput: as :func:`as_v2` and :func:`~tailguard_runtime.wire.decode_v2` (400,
            422).
    """
    doc, binary = as_v2(request)
    return decode_v2_doc(doc, n_features, known_outputs, max_rows, feature_names, binary)


def encode_infer(model_name: str, version: str, request_id: str | None,
                 specs: Sequence[OutputSpec], outputs: Sequence[np.ndarray],
                 wanted: tuple[str, ...] | None,
                 parameters: Mapping[str, str]) -> Any:
    """A ``ModelInferResponse``: the ``wanted`` outputs (``None``: all) of ``specs``, each
    tensor's values in ``raw_output_contents`` in the same order (as
    :func:`~tailguard_runtime.wire.binary_tensor` lays them out); ``parameters`` become string
    parameters (``role``, ``model_uri``)."""
    response = pb.ModelInferResponse(model_name=model_name, model_version=version,
                                     id=request_id or "")
    for key, text in parameters.items():
        response.parameters[key].string_param = text
    for spec, value in zip(specs, outputs):
        if wanted is not None and spec.name not in wanted:
            continue
        response.outputs.add(name=spec.name, datatype=spec.datatype, shape=value.shape)
        response.raw_output_contents.append(binary_tensor(value, spec.datatype))
    return response


def tensor_metadata(tensors: Sequence[Mapping[str, Any]]) -> list[Any]:
    """The v2 metadata's ``inputs`` or ``outputs`` list as ``TensorMetadata`` messages."""
    return [pb.TensorMetadata(name=t["name"], datatype=t["datatype"], shape=t["shape"])
            for t in tensors]
