"""Decode, validate and encode the two wire formats the runtime speaks.

* Open Inference Protocol v2 (REST, JSON tensors): one input tensor of datatype ``FP32``,
  ``FP64`` or ``INT64`` and shape ``[n_rows, n_features]``, data flat (row-major) or nested.
  The request-level ``parameters.timeout`` is in microseconds (what ``tritonclient`` sends).
* KServe v1: ``{"instances": [[...], ...]}`` -> ``{"predictions": [...]}``.

Decoders return ``X`` of shape ``(n_rows, n_features)`` float64 or raise
:class:`~tailguard_runtime.errors.InvalidInput` (400 for unparseable JSON, 422 for content) whose
message names the field and what was expected. Encoders return bytes. Pure: no I/O.
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Mapping, Sequence
from urllib.parse import quote

import numpy as np
import orjson

from tailguard_runtime.admission import check_fits
from tailguard_runtime.errors import InvalidInput, PayloadTooLarge

if TYPE_CHECKING:  # only for annotations: the models module fetches and loads files
    from tailguard_runtime.models import OutputSpec

V2_DATATYPES = ("FP32", "FP64", "INT64")
BINARY_DTYPES: Mapping[str, np.dtype[Any]] = {
    "FP32": np.dtype("<f4"), "FP64": np.dtype("<f8"), "INT64": np.dtype("<i8")}
"""How each input datatype is laid out as binary tensor data: little-endian, row-major (the
binary tensor data extension of the v2 REST protocol, as Triton defines it)."""
_NUMBER_TYPES = frozenset((int, float))
INT64_EXACT = 2**53
"""The largest INT64 magnitude a float64 holds exactly (IEEE 754: a 53-bit significand);
larger INT64 values are refused rather than rounded."""
FP32_MAX = float(np.finfo(np.float32).max)
"""The largest finite float32 (about 3.4e38); FP32 data beyond it is refused."""


@dataclass(frozen=True)
class V2Request:
    """A decoded v2 inference request.

    ``x``: ``(n_rows, n_features)`` float64; ``outputs``: requested output names (``None``: all);
    ``timeout_us``: the client's ``parameters.timeout`` in microseconds, if any; ``binary``:
    the outputs to answer as binary tensor data (:func:`encode_v2`).
    """

    x: np.ndarray
    id: str | None
    outputs: tuple[str, ...] | None
    timeout_us: float | None
    binary: frozenset[str] = frozenset()


@dataclass(frozen=True, slots=True)
class V1Request:
    """A decoded KServe v1 ``:predict`` request.

    ``x``: ``(n_rows, n_features)`` float64; ``probabilities``: the client asked for class
    probabilities instead of labels (``"parameters": {"probabilities": true}``).
    """

    x: np.ndarray
    probabilities: bool = False


BODY_BYTES_PER_VALUE = 48
"""Room for one tensor value in a valid body: the longest float64 JSON number (24 characters,
``-2.2250738585072014e-308``), its separator, and the indentation ``json.dumps(indent=4)``
puts before each value of a nested row."""
BODY_OVERHEAD_BYTES = 64 * 1024
"""Room for everything but the values: names, shape, ``id``, ``parameters``, ``outputs``."""


def max_valid_body_bytes(n_features: int, max_rows: int) -> int:
    """The largest body a valid request can have, in bytes: at most ``max_rows`` rows
    (``maxQueueSize``) of ``n_features`` values of :data:`BODY_BYTES_PER_VALUE` each, plus
    :data:`BODY_OVERHEAD_BYTES`. A larger body (or a compressed one inflating past it) is
    refused with 413 before it is parsed; for the digits example (64 features, 512 rows) that is
    about 1.6 MB (1,638,400 bytes)."""
    return BODY_OVERHEAD_BYTES + max_rows * n_features * BODY_BYTES_PER_VALUE


STRUCTURE_SLACK = 64
"""Arrays and objects a valid request may hold beyond one per row: the body, ``inputs`` and
each input, ``shape``, ``outputs``, ``parameters`` and their contents."""


def check_structure(body: bytes, max_rows: int) -> None:
    """Refuse, before parsing, a body holding far more arrays and objects than a request of at
    most ``max_rows`` rows can: a valid one holds one per row (a nested row, a v1 instance)
    plus :data:`STRUCTURE_SLACK`. The limit is twice the rows plus the slack, so a request
    that merely has too many rows is still parsed and gets its own 413 naming them. Counted
    with ``bytes.count`` (about half a millisecond per MB); brackets inside strings count too,
    which only a body no client sends can exceed.

    The JSON parser holds the GIL while it builds a list for every array: 1.6 MB of arrays
    nested 500 deep (5 KB gzipped) took it 0.6 s, stalling the event loop and the model
    thread, where this count takes 3 ms and refuses it.

    Raises:
        InvalidInput: (422: well-formed, but no request) too many arrays or objects for a
            request of ``max_rows`` rows.
    """
    limit = 2 * max_rows + STRUCTURE_SLACK
    found = body.count(b"[") + body.count(b"{")
    if found > limit:
        raise InvalidInput(f"the body holds {found} JSON arrays and objects; a request of at most "
                           f"{max_rows} rows (maxQueueSize) holds about one per row", 422)


def decode_v2(body: bytes, n_features: int, known_outputs: Sequence[str],
              max_rows: int | None = None,
              feature_names: Sequence[str] | None = None,
              binary: bytes | None = None) -> V2Request:
    """Decode and validate a v2 ``/infer`` body for a model with ``n_features`` features.

    The inputs are one tensor ``[n_rows, n_features]``, or, for a model that knows its feature
    names (``feature_names``: scikit-learn's ``feature_names_in_``), one tensor per feature,
    each named for its feature, shaped ``[n_rows]`` or ``[n_rows, 1]``, in any order: they are
    put in the model's order (:func:`_decode_columns`).

    ``max_rows``: refuse a tensor with more rows before converting its data (they could never
    be queued, and converting millions of values would stall the event loop for nothing).

    ``binary``: the bytes after the JSON header of a request that uses the binary tensor data
    extension (``Inference-Header-Content-Length``), or ``None``. An input with
    ``parameters.binary_data_size`` has its values there, in the order of the inputs, as
    :data:`BINARY_DTYPES` lays them out (:class:`BinaryTail`). Outputs are answered in binary
    when the request's ``parameters.binary_data_output`` is true (unless an output says
    ``binary_data: false``) or an output's ``parameters.binary_data`` is true.

    Raises:
        PayloadTooLarge: more than ``max_rows`` rows (413).
        InvalidInput: malformed JSON, or binary data whose declared sizes do not add up to the
            bytes after the header (400); missing or extra inputs, unsupported datatype, wrong
            shape or feature count, element count not matching the shape, non-numeric, boolean
            or non-finite values, ``INT64`` values beyond 2**53 (:data:`INT64_EXACT`), ``FP32``
            values beyond float32's range, unknown requested outputs or ``outputs: []``, a bad
            ``parameters.timeout`` (422).
    """
    return decode_v2_doc(_loads(body), n_features, known_outputs, max_rows, feature_names,
                         binary)


def decode_v2_doc(doc: Any, n_features: int, known_outputs: Sequence[str],
                  max_rows: int | None = None,
                  feature_names: Sequence[str] | None = None,
                  binary: bytes | None = None) -> V2Request:
    """:func:`decode_v2` for a request already parsed from JSON, or built from another
    encoding of the protocol (the gRPC service's :func:`~tailguard_runtime.rpc.tensors.as_v2`
    builds the same mapping, its tensors' values as binary data).

    Raises:
        PayloadTooLarge, InvalidInput: as :func:`decode_v2`.
    """
    if not isinstance(doc, dict):
        raise InvalidInput("request body must be a JSON object with an 'inputs' list")
    inputs = doc.get("inputs")
    tail = BinaryTail(inputs, binary)
    if isinstance(inputs, list) and len(inputs) > 1 and feature_names:
        x = _decode_columns(inputs, feature_names, max_rows, tail)
        return _v2_request(doc, x, known_outputs)
    if not isinstance(inputs, list) or len(inputs) != 1 or not isinstance(inputs[0], dict):
        per_feature = (f", or one tensor per feature named {', '.join(feature_names)}"
                       if feature_names else "")
        raise InvalidInput("'inputs' must be a list of exactly one tensor "
                           f"{{name, shape: [n_rows, {n_features}], datatype, data}}"
                           f"{per_feature}")
    tensor = inputs[0]
    name = tensor.get("name", "input-0")
    datatype = tensor.get("datatype")
    if datatype not in V2_DATATYPES:
        raise InvalidInput(f"inputs[0] ({name}): datatype must be one of "
                           f"{', '.join(V2_DATATYPES)}, got {preview(datatype)}")
    shape = tensor.get("shape")
    if (not isinstance(shape, list) or len(shape) != 2
            or not all(type(d) is int and d >= 0 for d in shape)):
        raise InvalidInput(f"inputs[0] ({name}): shape must be [n_rows, {n_features}], got "
                           f"{preview(shape)}")
    if shape[1] != n_features:
        raise InvalidInput(f"inputs[0] ({name}): expected {n_features} features per row "
                           f"(shape [n_rows, {n_features}]), got shape {shape}")
    if shape[0] == 0:
        raise InvalidInput(f"inputs[0] ({name}): shape {shape} has no rows")
    _check_rows(shape[0], max_rows)
    if tail.has(0):
        x = tail.values(0, f"inputs[0] ({name})", datatype, shape)
        return _v2_request(doc, x.reshape(shape[0], shape[1]), known_outputs)
    data = tensor.get("data")
    if not isinstance(data, list):
        raise InvalidInput(f"inputs[0] ({name}): 'data' must be a list of numbers")
    nested = bool(data) and type(data[0]) is list
    if len(data) != (shape[0] if nested else shape[0] * shape[1]):  # before any conversion
        count = "rows" if nested else "values"
        raise InvalidInput(f"inputs[0] ({name}): shape {shape} needs "
                           f"{shape[0] if nested else shape[0] * shape[1]} {count}, data has "
                           f"{len(data)}")
    x = _json_values(data, f"inputs[0] ({name})", datatype, shape, shape[0] * shape[1],
                     f"flat values or rows of {n_features}")
    return _v2_request(doc, x.reshape(shape[0], shape[1]), known_outputs)


def _json_values(data: list[Any], where: str, datatype: str, shape: Sequence[int], count: int,
                 expected: str) -> np.ndarray:
    """A tensor's JSON ``data`` as float64 (``where``: the tensor, for messages; ``count``: the
    values its ``shape`` needs; ``expected``: what the data should look like, for messages).

    Raises:
        InvalidInput: values that are not finite numbers, INT64 values beyond 2**53, FP32
            values beyond float32's range, or not ``count`` of them (422).
    """
    x = _to_matrix(data, f"{where}.data", datatype == "INT64", expected)
    if datatype == "FP32" and np.abs(x).max(initial=0.0) > FP32_MAX:
        raise InvalidInput(f"{where}.data: FP32 values beyond {FP32_MAX:.7g} are out of "
                           "float32 range; send FP64")
    if x.size != count:
        raise InvalidInput(f"{where}: shape {list(shape)} needs {count} values, data has "
                           f"{x.size}")
    return x


def _v2_request(doc: Mapping[str, Any], x: np.ndarray, known_outputs: Sequence[str]
                ) -> V2Request:
    """The :class:`V2Request` of a decoded body ``doc`` whose inputs gave ``x``.

    Raises:
        InvalidInput: bad ``outputs``, ``id`` or ``parameters`` (422).
    """
    raw_outputs = doc.get("outputs")
    outputs = _requested_outputs(raw_outputs, known_outputs)
    parameters = doc.get("parameters")
    timeout_us = _timeout_us(parameters)
    everything = bool(parameters.get("binary_data_output")) if parameters else False
    binary: set[str] = set(known_outputs) if everything and outputs is None else set()
    for requested in raw_outputs or ():
        asked = requested.get("parameters")
        if asked is not None and not isinstance(asked, dict):
            raise InvalidInput(f"outputs ({preview(requested['name'])}): parameters must be an "
                               f"object, got {preview(asked)}")
        wants = (asked or {}).get("binary_data", everything)
        if wants is True:
            binary.add(requested["name"])
        elif wants is not False:
            raise InvalidInput(f"outputs ({requested['name']}): parameters.binary_data must be "
                               f"true or false, got {preview(wants)}")
    return V2Request(x, _request_id(doc.get("id")), outputs, timeout_us, frozenset(binary))


class BinaryTail:
    """The binary tensor data after a request's JSON header, split among the inputs that
    declare ``parameters.binary_data_size``, in their order.

    Every declared size is checked on construction, before any value is read: each a whole
    number, together exactly the bytes there are.

    Raises:
        InvalidInput: a declared size that is not a non-negative integer, sizes declared with
            no binary data sent, or sizes that do not add up to the bytes after the header (400).
    """

    def __init__(self, inputs: Any, tail: bytes | None) -> None:
        self.tail = tail or b""
        self.spans: dict[int, tuple[int, int]] = {}
        offset = 0
        for i, tensor in enumerate(inputs if isinstance(inputs, list) else ()):
            parameters = tensor.get("parameters") if isinstance(tensor, dict) else None
            size = parameters.get("binary_data_size") if isinstance(parameters, dict) else None
            if size is None:
                continue
            if type(size) is not int or size < 0:
                raise InvalidInput(f"inputs[{i}]: parameters.binary_data_size must be a "
                                   f"non-negative integer, got {preview(size)}", 400)
            if tail is None:
                raise InvalidInput(f"inputs[{i}]: parameters.binary_data_size needs the binary "
                                   "tensor data after a JSON header of the length the "
                                   "Inference-Header-Content-Length header states", 400)
            self.spans[i] = (offset, offset + size)
            offset += size
        if tail is not None and offset != len(tail):
            raise InvalidInput(f"the inputs declare {offset} bytes of binary tensor data "
                               f"(parameters.binary_data_size), but {len(tail)} follow the "
                               "JSON header", 400)

    def has(self, index: int) -> bool:
        """Whether input ``index`` has its values in the binary data."""
        return index in self.spans

    def values(self, index: int, field: str, datatype: str, shape: Sequence[int]) -> np.ndarray:
        """Input ``index``'s values as a flat float64 array of ``prod(shape)`` values.

        Raises:
            InvalidInput: its size is not ``prod(shape)`` values of ``datatype``; a value that
                is not finite, or an INT64 beyond 2**53 (422).
        """
        start, end = self.spans[index]
        dtype = BINARY_DTYPES[datatype]
        count = int(np.prod(shape))
        if end - start != count * dtype.itemsize:
            raise InvalidInput(f"{field}: shape {list(shape)} of {datatype} needs "
                               f"{count * dtype.itemsize} bytes, binary_data_size is "
                               f"{end - start}")
        raw = np.frombuffer(self.tail, dtype=dtype, count=count, offset=start)
        if datatype == "INT64" and count and np.abs(raw).max() > INT64_EXACT:
            raise InvalidInput(f"{field}: INT64 values beyond 2**53 cannot be represented "
                               "exactly; they are refused, not rounded")
        x: np.ndarray = raw.astype(np.float64)
        if not np.isfinite(x).all():
            raise InvalidInput(f"{field}: values must be finite numbers (NaN or infinity in "
                               "the binary data)")
        return x


def _decode_columns(inputs: list[Any], feature_names: Sequence[str],
                    max_rows: int | None, tail: BinaryTail) -> np.ndarray:
    """One tensor per feature (``{name, shape: [n_rows] | [n_rows, 1], datatype, data}``),
    as ``(n_rows, n_features)`` float64 in ``feature_names``' order, each checked as a lone
    tensor is (datatype, shape, element count, finite numbers, INT64 and FP32 ranges).

    Raises:
        PayloadTooLarge: more than ``max_rows`` rows (413).
        InvalidInput: names missing, unknown or given twice, unequal row counts, or a tensor
            that fails its checks (422).
    """
    by_name: dict[str, dict[str, Any]] = {}
    index: dict[str, int] = {}
    for i, tensor in enumerate(inputs):
        name = tensor.get("name") if isinstance(tensor, dict) else None
        if not isinstance(name, str):
            raise InvalidInput(f"inputs[{i}]: a tensor per feature needs its feature's name")
        if name in by_name:
            raise InvalidInput(f"inputs[{i}]: feature {name!r} is given twice")
        by_name[name], index[name] = tensor, i
    missing = [n for n in feature_names if n not in by_name]
    unknown = [n for n in by_name if n not in set(feature_names)]
    if missing or unknown:
        raise InvalidInput("one tensor per feature: "
                           + "; ".join(part for part in (
                               f"missing {', '.join(missing)}" if missing else "",
                               f"unknown {', '.join(unknown)}" if unknown else "") if part)
                           + f" (the model's features: {', '.join(feature_names)})")
    columns = []
    rows: int | None = None
    for name in feature_names:
        tensor = by_name[name]
        datatype = tensor.get("datatype")
        if datatype not in V2_DATATYPES:
            raise InvalidInput(f"inputs ({name}): datatype must be one of "
                               f"{', '.join(V2_DATATYPES)}, got {preview(datatype)}")
        shape = tensor.get("shape")
        if (not isinstance(shape, list) or len(shape) not in (1, 2)
                or not all(type(d) is int and d >= 0 for d in shape)
                or (len(shape) == 2 and shape[1] != 1) or shape[0] == 0):
            raise InvalidInput(f"inputs ({name}): shape must be [n_rows] or [n_rows, 1] with "
                               f"n_rows > 0, got {preview(shape)}")
        if rows is None:
            rows = shape[0]
            _check_rows(rows, max_rows)
        elif shape[0] != rows:
            raise InvalidInput(f"inputs ({name}): {shape[0]} rows, but the first feature has "
                               f"{rows}; every feature needs one value per row")
        if tail.has(index[name]):
            columns.append(tail.values(index[name], f"inputs ({name})", datatype, shape))
            continue
        data = tensor.get("data")
        if not isinstance(data, list) or len(data) != rows:
            raise InvalidInput(f"inputs ({name}): 'data' must be a list of {rows} numbers")
        column = _json_values(data, f"inputs ({name})", datatype, shape, rows,
                              "one number per row")
        columns.append(column.reshape(rows))
    return np.column_stack(columns)


def decode_v1(body: bytes, n_features: int, max_rows: int | None = None) -> V1Request:
    """Decode a KServe v1 ``:predict`` body ``{"instances": [[f0, f1, ...], ...]}``, with
    ``"parameters": {"probabilities": true}`` to ask for each row's class probabilities
    instead of its label (KServe's scikit-learn server answers probabilities for the whole
    server with ``PREDICT_PROBA``; here each request chooses).

    ``max_rows``: as for :func:`decode_v2`.

    Raises:
        PayloadTooLarge: more than ``max_rows`` rows (413).
        InvalidInput: malformed JSON (400); no ``instances`` list, ragged or wrong-width rows,
            non-numeric, boolean or non-finite values, ``parameters`` that is not an object or
            a ``probabilities`` that is not a boolean (422).
    """
    doc = _loads(body)
    instances = doc.get("instances") if isinstance(doc, dict) else None
    if not isinstance(instances, list) or not instances:
        raise InvalidInput(f"body must be {{\"instances\": [[{n_features} numbers], ...]}} "
                           "with at least one row")
    parameters = doc.get("parameters", {})
    if not isinstance(parameters, dict):
        raise InvalidInput(f"parameters must be an object, got {preview(parameters)}")
    probabilities = parameters.get("probabilities", False)
    if type(probabilities) is not bool:
        raise InvalidInput("parameters.probabilities must be true or false, got "
                           f"{preview(probabilities)}")
    _check_rows(len(instances), max_rows)
    x = _to_matrix(instances, "instances", False, f"rows of {n_features} numbers")
    if x.ndim != 2 or x.shape[1] != n_features:
        raise InvalidInput(f"instances: each row must have {n_features} numbers; got an array of "
                           f"shape {list(x.shape)}")
    return V1Request(x, probabilities)


def encode_v2(model_name: str, version: str, request_id: str | None,
              specs: Sequence[OutputSpec], outputs: Sequence[np.ndarray],
              wanted: tuple[str, ...] | None,
              parameters: Mapping[str, str] | None = None,
              binary: frozenset[str] = frozenset()) -> tuple[bytes, int | None]:
    """Encode a v2 inference response; ``outputs`` align with ``specs``, row axis first.

    ``version`` is the served model's version (``model_version``); ``parameters``, when given,
    become the response's ``parameters`` object (the runtime sends ``role`` and ``model_uri``,
    see :func:`served_by`). The outputs named in ``binary`` are sent as binary tensor data:
    ``parameters.binary_data_size`` in the JSON instead of ``data``, their bytes after it in
    order (numbers little-endian; ``BYTES`` as a 4-byte little-endian length and the UTF-8
    bytes of each element).

    Returns the body and, when some output is binary, the JSON header's length (the
    ``Inference-Header-Content-Length`` header), else ``None``.
    """
    tensors = []
    chunks: list[bytes] = []
    for spec, value in zip(specs, outputs):
        if wanted is not None and spec.name not in wanted:
            continue
        tensor: dict[str, Any] = {"name": spec.name, "datatype": spec.datatype,
                                  "shape": list(value.shape)}
        if spec.name in binary:
            raw = binary_tensor(value, spec.datatype)
            tensor["parameters"] = {"binary_data_size": len(raw)}
            chunks.append(raw)
        else:
            tensor["data"] = _flat(value)
        tensors.append(tensor)
    doc: dict[str, Any] = {"model_name": model_name, "model_version": version, "outputs": tensors}
    if request_id is not None:
        doc["id"] = request_id
    if parameters is not None:
        doc["parameters"] = parameters
    header = orjson.dumps(doc, option=orjson.OPT_SERIALIZE_NUMPY)
    if not chunks:
        return header, None
    return b"".join([header, *chunks]), len(header)


OUTPUT_DTYPES = {"FP64": np.dtype("<f8"), "INT64": np.dtype("<i8"), "BOOL": np.dtype("?")}
"""The little-endian layout of each numeric output datatype in binary tensor data."""


def binary_tensor(value: np.ndarray, datatype: str) -> bytes:
    """An output's values as binary tensor data, row-major: numbers little-endian
    (:data:`OUTPUT_DTYPES`), ``BYTES`` as a 4-byte little-endian length and the UTF-8 bytes of
    each element (the layout of Triton's binary tensor data and of gRPC's raw contents)."""
    if datatype == "BYTES":
        parts = []
        for item in value.ravel().tolist():
            encoded = str(item).encode()
            parts.append(len(encoded).to_bytes(4, "little") + encoded)
        return b"".join(parts)
    return np.ascontiguousarray(value, dtype=OUTPUT_DTYPES[datatype]).tobytes()


ROLE_HEADER = "x-tailguard-role"
MODEL_HEADER = "x-tailguard-model"
VERSION_HEADER = "x-tailguard-model-version"


def served_by(role: str, uri: str, version: str) -> list[tuple[bytes, bytes]]:
    """The response headers that say which model answered: ``X-Tailguard-Role`` (``primary``
    or ``fallback``), ``X-Tailguard-Model`` (the model URI) and ``X-Tailguard-Model-Version``,
    as raw ASGI pairs. Characters a header cannot carry (non-ASCII, controls) are
    percent-encoded, as in a URI."""
    return [(ROLE_HEADER.encode(), header_value(role)),
            (MODEL_HEADER.encode(), header_value(uri)),
            (VERSION_HEADER.encode(), header_value(version))]


def header_value(text: str) -> bytes:
    """``text`` as a header value: printable ASCII kept, anything else (non-ASCII, control
    characters) percent-encoded as UTF-8 bytes."""
    return "".join(c if " " <= c <= "~" else quote(c, safe="") for c in text).encode("ascii")


def parse_header_length(value: bytes, v2: bool) -> int:
    """The ``Inference-Header-Content-Length`` header's value: how many bytes of the body are
    the JSON request, before its binary tensor data.

    Raises:
        InvalidInput: not a non-negative decimal integer, or sent to a v1 route (400).
    """
    if not v2:
        raise InvalidInput("binary tensor data (Inference-Header-Content-Length) is part of "
                           "the v2 protocol: send it to /v2/models/{name}/infer", 400)
    text = value.decode("latin-1").strip()
    if not text.isdigit() or len(text) > 12:
        raise InvalidInput("Inference-Header-Content-Length must be the JSON header's length "
                           f"in bytes, got {text[:40]!r}", 400)
    return int(text)


def encode_v1(predictions: np.ndarray) -> bytes:
    """Encode a v1 response ``{"predictions": [...]}``, one entry per row: a label, or, for
    ``(n_rows, n_classes)`` probabilities, a list per row."""
    if predictions.ndim > 1:
        return orjson.dumps({"predictions": np.ascontiguousarray(predictions)},
                            option=orjson.OPT_SERIALIZE_NUMPY)
    return orjson.dumps({"predictions": _flat(predictions)}, option=orjson.OPT_SERIALIZE_NUMPY)


def encode_error(message: str) -> bytes:
    """The protocol's error body ``{"error": message}``."""
    return orjson.dumps({"error": message})


GZIP_MAGIC = b"\x1f\x8b"
"""The first two bytes of a gzip member (RFC 1952, section 2.3.1)."""
GZIP_MIN_BYTES = 18
"""The shortest gzip member: a 10-byte header, an empty deflate block and the 8-byte trailer."""
MAX_DEFLATE_RATIO = 1032
"""The most deflate can compress: 1032 to 1 (zlib's technical details, zlib.net/zlib_tech.html)."""


def check_stated_size(body: bytes, encoding: bytes, limit: int) -> None:
    """Refuse a gzip ``body`` whose trailer states an inflated size over ``limit`` bytes
    (``ISIZE``, the input's length modulo 2**32: RFC 1952, section 2.3.1), without inflating
    it: cheap enough for the event loop. A stated size deflate cannot reach from this many
    bytes (over :data:`MAX_DEFLATE_RATIO` times the body) is not a size but the tail of a
    truncated or padded stream, and is left to :func:`decompress` to name; so is a trailer that
    understates the size, which inflating up to ``limit`` catches. Other encodings pass.

    Raises:
        PayloadTooLarge: the trailer states more than ``limit`` bytes.
    """
    if encoding.strip().lower() != b"gzip" or body[:2] != GZIP_MAGIC \
            or len(body) < GZIP_MIN_BYTES:
        return
    stated = int.from_bytes(body[-4:], "little")
    if limit < stated <= MAX_DEFLATE_RATIO * len(body):
        raise PayloadTooLarge(f"decompressed body would be {stated} bytes (its gzip trailer "
                              f"says), over the limit of {limit} bytes")


def decompress(body: bytes, encoding: bytes, limit: int) -> bytes:
    """Undo a ``Content-Encoding`` of ``gzip`` or ``deflate`` (``identity`` passes through).

    A gzip body whose trailer states more than ``limit`` is refused before any of it is
    inflated (:func:`check_stated_size`); inflating never goes past ``limit + 1`` bytes.

    Raises:
        InvalidInput: another encoding (415); a corrupt stream, a bad checksum or length, a
            stream that does not end, or bytes after its end (trailing junk, a second gzip
            member) (400).
        PayloadTooLarge: the decompressed body would exceed ``limit`` bytes.
    """
    name = encoding.strip().lower()
    if name == b"identity":
        return body
    if name not in (b"gzip", b"deflate"):
        raise InvalidInput(f"Content-Encoding {name.decode(errors='replace')!r} is not supported; "
                           "use gzip, deflate or none", 415)
    check_stated_size(body, name, limit)
    inflater = zlib.decompressobj(wbits=47 if name == b"gzip" else 15)  # 47: gzip or zlib header
    try:
        out = inflater.decompress(body, limit + 1)
    except zlib.error as exc:
        raise InvalidInput(f"body is not valid {name.decode()} data: {exc}", 400) from None
    if len(out) > limit or inflater.unconsumed_tail:
        raise PayloadTooLarge(f"decompressed body exceeds the limit of {limit} bytes")
    # zlib checks the CRC/Adler-32 trailer only once it reaches it: a stream must end, and
    # end the body (no junk, no second gzip member: RFC 9110 names one coding, one stream)
    if not inflater.eof:
        raise InvalidInput(f"body is not valid {name.decode()} data: the stream is truncated "
                           "(no end and checksum)", 400)
    if inflater.unused_data:
        raise InvalidInput(f"body is not valid {name.decode()} data: "
                           f"{len(inflater.unused_data)} bytes follow the end of the stream "
                           "(trailing data or a second member)", 400)
    return out


def parse_timeout_header(value: bytes) -> float:
    """Parse ``X-Request-Timeout-Ms`` (milliseconds, > 0) into seconds.

    Raises:
        InvalidInput: not a positive finite number (400).
    """
    try:
        ms = float(value)
    except ValueError:
        ms = float("nan")
    if not (ms > 0 and ms < float("inf")):
        raise InvalidInput(f"X-Request-Timeout-Ms must be a positive number of milliseconds, "
                           f"got {value.decode(errors='replace')!r}", 400)
    return ms / 1000.0


def preview(value: Any, limit: int = 40) -> str:
    """``value`` as JSON for an error message, cut to ``limit`` characters. A value nested too
    deep for orjson's encoder (254 levels) is named by its type: rendering an error must never
    fail itself."""
    try:
        return orjson.dumps(value).decode()[:limit]
    except TypeError:  # orjson.JSONEncodeError: recursion limit, or an unsupported object
        return f"a {type(value).__name__} nested too deep to show"


def _check_rows(n_rows: int, max_rows: int | None) -> None:
    if max_rows is not None:
        check_fits(n_rows, max_rows)


def _loads(body: bytes) -> Any:
    try:
        return orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        raise InvalidInput(json_error(body, exc), 400) from None


def json_error(body: bytes, exc: ValueError) -> str:
    """The message for a body that is not JSON: what the parser found, and a hint when the
    body holds ``NaN`` or ``Infinity`` (Python's ``json.dumps`` writes them; JSON has no such
    numbers)."""
    message = f"malformed JSON: the body is not valid JSON ({exc})"
    if b"NaN" in body or b"Infinity" in body:
        message += "; NaN and Infinity are not valid JSON numbers"
    return message


def _to_matrix(data: list[Any], field: str, integers: bool, expected: str) -> np.ndarray:
    _check_numbers(data, field, integers, expected)
    try:
        x = np.array(data, dtype=np.float64)
    except ValueError:
        raise InvalidInput(f"{field}: rows must all have the same length") from None
    return x


def _check_numbers(values: list[Any], field: str, integers: bool, expected: str,
                   depth: int = 1) -> None:
    """Reject anything but finite numbers (bools, strings and nulls included), flat or as rows
    (at most two levels: a matrix)."""
    kinds = set(map(type, values))
    if kinds <= _NUMBER_TYPES:
        if integers and float in kinds:
            raise InvalidInput(f"{field}: INT64 tensor holds non-integer values")
        if integers and values and (max(values) > INT64_EXACT or min(values) < -INT64_EXACT):
            raise InvalidInput(f"{field}: INT64 values beyond 2**53 cannot be represented "
                               "exactly; they are refused, not rounded")
        return
    if list in kinds:
        if depth >= 2:
            raise InvalidInput(f"{field}: nested deeper than rows of numbers; expected {expected}")
        for row in values:
            if type(row) is not list:
                raise InvalidInput(f"{field}: mixes nested lists with {type(row).__name__} values")
            _check_numbers(row, field, integers, expected, depth + 1)
        return
    bad = next(v for v in values if type(v) not in _NUMBER_TYPES)
    raise InvalidInput(f"{field}: values must be numbers, got {preview(bad)}")


def _requested_outputs(raw: Any, known: Sequence[str]) -> tuple[str, ...] | None:
    if raw is None:
        return None
    if not isinstance(raw, list) or not all(isinstance(o, dict) and "name" in o for o in raw):
        raise InvalidInput("'outputs' must be a list of {\"name\": ...} objects")
    if not raw:
        raise InvalidInput(f"outputs: an empty list asks for no output; omit 'outputs' for all "
                           f"of {list(known)}, or name at least one")
    names = tuple(o["name"] for o in raw)
    unknown = [n for n in names if n not in known]
    if unknown:
        shown = [n if isinstance(n, str) else preview(n) for n in unknown]
        raise InvalidInput(f"outputs: unknown output(s) {shown}; this model has {list(known)}")
    return names


def _request_id(raw: Any) -> str | None:
    if raw is None or isinstance(raw, str):
        return raw
    raise InvalidInput("'id' must be a string")


def _timeout_us(parameters: Any) -> float | None:
    if parameters is None:
        return None
    if not isinstance(parameters, dict):
        raise InvalidInput("'parameters' must be an object")
    timeout = parameters.get("timeout")
    if timeout is None:
        return None
    if type(timeout) not in _NUMBER_TYPES or not timeout > 0:
        raise InvalidInput(f"parameters.timeout must be a positive number of microseconds, "
                           f"got {preview(timeout)}")
    return float(timeout)


def _flat(value: np.ndarray) -> Any:
    flat = value.ravel()
    if flat.dtype.kind in "OUS":
        return [str(v) for v in flat.tolist()]
    return flat
