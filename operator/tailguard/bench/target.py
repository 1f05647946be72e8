"""What ``tailguard bench`` sends, and where: the target URL, the model's metadata, the rows.

:func:`parse_url` checks a served InferenceService's URL (``http://host:port/v2/models/NAME``);
:func:`read_metadata` reads its Open Inference Protocol v2 model metadata (feature count,
datatype, the model URI tailguard reports); :func:`choose_rows` takes rows from ``--rows`` or from
the builtin model's own dataset and never invents any; :func:`encode_bodies` turns them into v2
request bodies, :func:`encode_messages` into gRPC ``ModelInferRequest`` messages. Every refusal is a :class:`BenchRefused` with a one-line message.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

import numpy as np

MAX_BODIES = 1024
"""Distinct request bodies pre-encoded and sent in turn."""
DATATYPES = ("FP64", "FP32", "INT64", "INT32")
RAW_LAYOUTS = {"FP64": "<f8", "FP32": "<f4", "INT64": "<i8"}
"""How a datatype's values are laid out as bytes (binary tensor data, gRPC raw contents)."""


class BenchRefused(Exception):
    """The target or the options cannot be benchmarked; ``str()`` is one line saying why."""


@dataclass(frozen=True)
class TargetURL:
    """``base`` (``http://host:port``), ``host``, ``port`` and ``name`` of the InferenceService."""

    base: str
    host: str
    port: int
    name: str

    @property
    def model_path(self) -> str:
        return f"/v2/models/{self.name}"


@dataclass(frozen=True)
class ModelInput:
    """From the v2 metadata: ``features`` per row, the tensor ``datatype``, the reported ``uri``
    (tailguard's ``parameters.uri``; None from servers that do not report one)."""

    features: int
    datatype: str
    uri: str | None


def parse_url(url: str) -> TargetURL:
    """Check ``http://host:port/v2/models/NAME`` (a trailing ``/infer`` is accepted).

    Raises BenchRefused for another scheme or path."""
    parts = urlsplit(url)
    segments = [s for s in parts.path.split("/") if s]
    if segments[-1:] == ["infer"]:
        segments = segments[:-1]
    if parts.scheme != "http" or not parts.hostname or len(segments) != 3 or segments[:2] != [
            "v2", "models"]:
        raise BenchRefused(f"{url}: expected http://HOST:PORT/v2/models/NAME (the served "
                           "InferenceService) or an InferenceService YAML file")
    port = parts.port or 80
    host = parts.hostname
    return TargetURL(f"http://{host}:{port}", host, port, segments[2])


def read_metadata(target: TargetURL, timeout_s: float = 10.0) -> ModelInput:
    """``GET /v2/models/NAME`` and read the first input's shape ``[-1, features]`` and datatype.

    Raises BenchRefused when the server does not answer, answers non-200, or the metadata has
    no 2-D input with a known feature count and a numeric datatype."""
    import httpx

    url = target.base + target.model_path
    try:
        reply = httpx.get(url, timeout=timeout_s)
    except httpx.HTTPError as exc:
        raise BenchRefused(f"no answer from {url} ({type(exc).__name__}); is the "
                           "InferenceService served there?") from exc
    if reply.status_code != 200:
        raise BenchRefused(f"{url} answered {reply.status_code}: {reply.text[:200]}")
    try:
        doc = reply.json()
        first = doc["inputs"][0]
        shape, datatype = list(first["shape"]), str(first["datatype"])
        features = int(shape[-1])
    except (ValueError, KeyError, IndexError, TypeError) as exc:
        raise BenchRefused(f"{url}: model metadata without inputs[0].shape and datatype") from exc
    if len(shape) != 2 or features < 1 or datatype not in DATATYPES:
        raise BenchRefused(f"{url}: input shape {shape} {datatype}; bench sends 2-D "
                           f"[rows, features] tensors of {'/'.join(DATATYPES)}")
    params = doc.get("parameters") if isinstance(doc.get("parameters"), dict) else {}
    uri = params.get("uri") or params.get("model_uri")
    return ModelInput(features, datatype, str(uri) if uri else None)


def load_rows_file(path: str) -> np.ndarray:
    """Rows from a ``.npy`` (no pickles) or ``.csv`` file (comma-separated numbers, an optional
    header line), as float64 ``(n_rows, n_features)``. Raises BenchRefused naming the problem."""
    file = Path(path)
    try:
        if file.suffix == ".npy":
            rows = np.load(file, allow_pickle=False)
        elif file.suffix == ".csv":
            try:
                rows = np.loadtxt(file, delimiter=",", ndmin=2)
            except ValueError:
                rows = np.loadtxt(file, delimiter=",", ndmin=2, skiprows=1)
        else:
            raise BenchRefused(f"--rows {path}: expected a .npy or .csv file")
    except (OSError, ValueError) as exc:
        raise BenchRefused(f"--rows {path}: cannot read: {exc}") from exc
    rows = np.asarray(rows)
    if rows.ndim != 2 or rows.shape[0] < 1 or rows.dtype.kind not in "fiu":
        raise BenchRefused(f"--rows {path}: expected a 2-D numeric array of rows, got shape "
                           f"{list(rows.shape)} {rows.dtype}")
    return rows.astype(np.float64)


def choose_rows(model: ModelInput, rows_file: str | None) -> tuple[np.ndarray, str]:
    """The rows to send and where they came from: ``rows_file``, else the dataset of a
    ``builtin://DATASET/...`` model. Raises BenchRefused when neither fits (a ``file://`` or
    unknown model without ``--rows``; a feature count that does not match the metadata)."""
    if rows_file is not None:
        rows, source = load_rows_file(rows_file), rows_file
    elif model.uri and model.uri.startswith("builtin://"):
        from tailguard_runtime.models import load_dataset

        dataset = model.uri[len("builtin://"):].split("/", 1)[0]
        try:
            rows, _ = load_dataset(dataset)
        except KeyError as exc:
            raise BenchRefused(f"{model.uri}: unknown builtin dataset {dataset!r}; give --rows "
                               "FILE") from exc
        source = f"scikit-learn's {dataset} dataset ({model.uri})"
    else:
        what = model.uri or "a model that does not report its URI"
        raise BenchRefused(f"{what}: no rows to send; give --rows FILE (.npy or .csv) with "
                           f"{model.features} features per row (bench never invents rows)")
    if rows.shape[1] != model.features:
        raise BenchRefused(f"rows from {source} have {rows.shape[1]} features; the model "
                           f"expects {model.features}")
    return rows, source


def encode_bodies(rows: np.ndarray, datatype: str, rows_per_request: int,
                  limit: int = MAX_BODIES, *, binary: bool = False) -> tuple[bytes, ...]:
    """v2 infer bodies of ``rows_per_request`` consecutive rows each (wrapping around), as many
    as cover ``rows`` once, at most ``limit``: ``{"inputs": [{"name": "input-0", "shape": [k,
    F], "datatype": ..., "data": [...]}]}`` with integers for INT datatypes.

    ``binary``: the binary tensor data extension instead: the JSON header (the input's
    ``parameters.binary_data_size``, and ``binary_data_output`` so the answer is binary too)
    followed by the rows, little-endian, as :func:`binary_header_length` finds them.
    """
    cast = int if datatype.startswith("INT") else float
    layout = RAW_LAYOUTS.get(datatype)
    if binary and layout is None:
        raise BenchRefused(f"--binary: the model's datatype {datatype} has no binary layout")
    bodies = []
    for block in request_rows(rows, rows_per_request, limit):
        tensor = {"name": "input-0", "shape": [rows_per_request, rows.shape[1]],
                  "datatype": datatype}
        if binary:
            raw = np.ascontiguousarray(block, dtype=layout).tobytes()
            header = json.dumps({"inputs": [{**tensor, "parameters": {
                "binary_data_size": len(raw)}}], "parameters": {"binary_data_output": True}},
                separators=(",", ":")).encode()
            bodies.append(header + raw)
            continue
        data = [cast(v) for v in block.ravel().tolist()]
        bodies.append(json.dumps({"inputs": [{**tensor, "data": data}]},
                                 separators=(",", ":")).encode())
    return tuple(bodies)


def encode_messages(rows: np.ndarray, datatype: str, rows_per_request: int, model: str,
                    limit: int = MAX_BODIES) -> tuple[bytes, ...]:
    """The rows of :func:`encode_bodies`, as serialized gRPC ``ModelInferRequest`` messages
    for ``model`` (the values in ``raw_input_contents``, little-endian, as ``tritonclient.grpc``
    sends them).

    Raises:
        BenchRefused: ``rows_per_request`` below 1, or a datatype with no raw layout.
    """
    from tailguard_runtime.rpc import protocol

    layout = RAW_LAYOUTS.get(datatype)
    if layout is None:
        raise BenchRefused(f"--protocol grpc: the model's datatype {datatype} has no raw layout")
    tensor = protocol.message("ModelInferRequest.InferInputTensor")
    return tuple(protocol.ModelInferRequest(model_name=model, inputs=[tensor(
        name="input-0", datatype=datatype, shape=[rows_per_request, rows.shape[1]])],
        raw_input_contents=[np.ascontiguousarray(block, dtype=layout).tobytes()]
    ).SerializeToString() for block in request_rows(rows, rows_per_request, limit))


def request_rows(rows: np.ndarray, rows_per_request: int, limit: int = MAX_BODIES
                 ) -> list[np.ndarray]:
    """``rows`` cut into requests of ``rows_per_request`` consecutive rows (wrapping around), as
    many as cover ``rows`` once, at least one and at most ``limit``.

    Raises:
        BenchRefused: ``rows_per_request`` below 1.
    """
    if rows_per_request < 1:
        raise BenchRefused("--rows-per-request must be >= 1")
    n = rows.shape[0]
    return [rows[[(k * rows_per_request + j) % n for j in range(rows_per_request)]]
            for k in range(max(1, min(limit, n // rows_per_request)))]


def binary_header_length(body: bytes) -> int:
    """The length in bytes of the JSON header that starts a body :func:`encode_bodies` made
    with ``binary`` (the ``Inference-Header-Content-Length`` to send with it), found by
    decoding the JSON document at its start (latin-1 maps each byte to one character).

    Raises:
        ValueError: the body does not start with a JSON document.
    """
    return json.JSONDecoder().raw_decode(body.decode("latin-1"))[1]
