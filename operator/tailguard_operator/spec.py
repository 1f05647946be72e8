"""The InferenceService spec: defaults, validation and typed views, all from the CRD.

The CRD file (``crd/inferenceservice.yaml``, copied by ``make crds`` from the repository's
``crds/``, the one source) is the one definition. :func:`parse` does what the API server does on ``kubectl apply``: apply the
schema's defaults, check the OpenAPI schema (types, bounds, patterns, unknown fields), then
evaluate the CEL rules (``x-kubernetes-validations``) with cel-python. ``tailguard up`` and the
operator both call it, so a spec is accepted locally exactly when the cluster would accept it.
Pure: no I/O beyond reading the packaged CRD once, no logging.
"""

from __future__ import annotations

import copy
import functools
from dataclasses import dataclass
from importlib import resources
from typing import Any, Iterator, Mapping

import yaml

from tailguard_runtime.settings import BatchingSettings, ModelSettings, RuntimeSettings

GROUP = "tailguard.dev"
VERSION = "v1alpha1"
API_VERSION = f"{GROUP}/{VERSION}"
KIND = "InferenceService"
PLURAL = "inferenceservices"


class SpecError(ValueError):
    """An InferenceService that the CRD refuses. ``errors`` holds one line per problem, each
    starting with the field path (``spec.batching.maxBatchSize: ...``)."""

    def __init__(self, errors: list[str]) -> None:
        super().__init__("; ".join(errors))
        self.errors = errors


@dataclass(frozen=True)
class ModelRef:
    """``spec.model`` or ``spec.fallback``."""

    uri: str
    format: str
    version: str
    sha256: str | None


@dataclass(frozen=True)
class SLO:
    """``spec.slo``: the p99 promise (ms) and how windows (s) judge it. ``max_error_rate`` is a
    share of admitted requests (0 to 1)."""

    p99_latency_ms: int
    window_seconds: int
    breach_windows: int
    recover_windows: int
    min_samples: int
    max_error_rate: float = 0.01


@dataclass(frozen=True)
class Scaling:
    """``spec.scaling``: HPA bounds and targets (cluster only). ``behavior`` is HPA v2's,
    verbatim, or ``None``."""

    min_replicas: int
    max_replicas: int
    target_queue_depth: int
    target_cpu_utilization: int
    behavior: dict[str, Any] | None


@dataclass(frozen=True)
class InferenceService:
    """A validated InferenceService with every default applied.

    ``spec`` keeps the defaulted camelCase mapping (what the API server would store).
    """

    name: str
    namespace: str
    model: ModelRef
    fallback: ModelRef
    batching: BatchingSettings
    slo: SLO
    scaling: Scaling
    automatic_rollback: bool
    traffic: str
    spec: dict[str, Any]

    def runtime_settings(self, *, control_secret: str | None = None) -> RuntimeSettings:
        """The settings a runtime process serving both roles needs; ``control_secret`` turns
        on ``tailguard up``'s control routes."""
        return RuntimeSettings(
            name=self.name,
            models=(_model_settings(self.model, "primary"), _model_settings(self.fallback, "fallback")),
            batching=self.batching,
            stats_window_seconds=float(self.slo.window_seconds),
            slo_p99_ms=float(self.slo.p99_latency_ms),
            control_secret=control_secret,
        )


@functools.cache
def crd() -> dict[str, Any]:
    """The InferenceService CustomResourceDefinition as a dict (read once, then cached)."""
    text = resources.files(__package__).joinpath("crd/inferenceservice.yaml").read_text("utf-8")
    return yaml.safe_load(text)  # type: ignore[no-any-return]


def object_schema() -> dict[str, Any]:
    """The ``openAPIV3Schema`` of the served version."""
    return crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]  # type: ignore[no-any-return]


def apply_defaults(schema: Mapping[str, Any], value: Any) -> Any:
    """Return a copy of ``value`` with the schema's defaults filled in, as the API server does:
    a missing property gets its ``default`` (then defaulted itself); present objects and array
    items are defaulted recursively; a missing property without a default stays missing."""
    if isinstance(value, dict) and "properties" in schema:
        out = dict(value)
        for key, sub in schema["properties"].items():
            if key not in out and "default" in sub:
                out[key] = copy.deepcopy(sub["default"])
            if key in out:
                out[key] = apply_defaults(sub, out[key])
        return out
    if isinstance(value, list) and "items" in schema:
        return [apply_defaults(schema["items"], item) for item in value]
    return value


def validate_object(obj: Mapping[str, Any]) -> dict[str, Any]:
    """Default and validate a whole InferenceService object; return the defaulted copy.

    Raises:
        SpecError: schema violations (all of them, sorted by field), else failed CEL rules.
    """
    schema = object_schema()
    defaulted: dict[str, Any] = apply_defaults(schema, dict(obj))
    errors = sorted(_schema_errors(defaulted))
    if errors:
        raise SpecError(errors)
    failed = [f"{path}: {message}" for path, message in _cel_failures(schema, defaulted, "")]
    if failed:
        raise SpecError(failed)
    return defaulted


def parse(obj: Mapping[str, Any], *, default_namespace: str = "default") -> InferenceService:
    """Validate an InferenceService object (as ``kubectl apply`` takes it) and type it.

    Raises:
        SpecError: wrong apiVersion/kind, missing name, or anything :func:`validate_object`
            refuses.
    """
    if obj.get("apiVersion") != API_VERSION or obj.get("kind") != KIND:
        raise SpecError([f"apiVersion/kind: expected {API_VERSION} {KIND}, got "
                         f"{obj.get('apiVersion')!r} {obj.get('kind')!r}"])
    metadata = obj.get("metadata") or {}
    if not isinstance(metadata, dict) or not metadata.get("name"):
        raise SpecError(["metadata.name: required"])
    full = validate_object(obj)
    spec = full["spec"]
    scaling = spec["scaling"]
    slo = spec["slo"]
    return InferenceService(
        name=metadata["name"],
        namespace=metadata.get("namespace") or default_namespace,
        model=_model_ref(spec["model"]),
        fallback=_model_ref(spec["fallback"]),
        batching=BatchingSettings.from_spec(spec["batching"]),
        slo=SLO(slo["p99LatencyMs"], slo["windowSeconds"], slo["breachWindows"],
                slo["recoverWindows"], slo["minSamples"], float(slo["maxErrorRate"])),
        scaling=Scaling(scaling["minReplicas"], scaling["maxReplicas"],
                        scaling["targetQueueDepth"], scaling["targetCPUUtilization"],
                        scaling.get("behavior")),
        automatic_rollback=spec["rollback"]["automatic"],
        traffic=spec["traffic"],
        spec=spec,
    )


def load_file(text: str, source: str = "<input>") -> InferenceService:
    """Parse the one InferenceService in a YAML text (other kinds in the file are ignored).

    Raises:
        SpecError: invalid YAML, no InferenceService, several of them, or an invalid one.
    """
    return parse(find_object(text, source))


def find_object(text: str, source: str = "<input>") -> dict[str, Any]:
    """The one InferenceService object in a YAML text, as written (nothing defaulted).

    Raises:
        SpecError: invalid YAML, no InferenceService, or several of them.
    """
    try:
        docs = [d for d in yaml.safe_load_all(text) if d is not None]
    except yaml.YAMLError as exc:
        raise SpecError([f"{source}: not valid YAML: {exc}"]) from None
    found = [d for d in docs if isinstance(d, dict) and d.get("kind") == KIND]
    if len(found) != 1:
        raise SpecError([f"{source}: expected exactly one {KIND}, found {len(found)}"])
    return found[0]


def _model_ref(raw: Mapping[str, Any]) -> ModelRef:
    return ModelRef(raw["uri"], raw["format"], raw["version"], raw.get("sha256"))


def _model_settings(ref: ModelRef, role: str) -> ModelSettings:
    return ModelSettings(uri=ref.uri, role=role, sha256=ref.sha256, version=ref.version)


def _schema_errors(obj: Any) -> Iterator[str]:
    import jsonschema

    validator = jsonschema.Draft202012Validator(_strict_schema())
    for error in validator.iter_errors(obj):
        path = ".".join(str(p) for p in error.absolute_path) or "(root)"
        if error.validator == "pattern" and "description" in error.schema:
            yield f"{path}: {error.instance!r} is not valid: expected {error.schema['description']}"
        else:
            yield f"{path}: {error.message}"


@functools.cache
def _strict_schema() -> dict[str, Any]:
    """The schema with ``additionalProperties: false`` wherever properties are listed and
    unknown fields are not preserved: the API server's strict field validation."""
    return forbid_unknown(object_schema())  # type: ignore[no-any-return]


def forbid_unknown(schema: Any) -> Any:
    """A copy of a CRD schema with ``additionalProperties: false`` wherever properties are
    listed and unknown fields are not preserved: what the API server would prune (or, with
    strict field validation, refuse) becomes a JSON-schema error. A root ``metadata`` stays
    open: the schema only restricts its ``name``; the rest is the API server's ObjectMeta."""
    out = _closed(schema)
    if isinstance(schema, dict) and "metadata" in schema.get("properties", {}):
        out["properties"]["metadata"] = copy.deepcopy(schema["properties"]["metadata"])
    return out


def _closed(schema: Any) -> Any:
    if isinstance(schema, dict):
        out = {k: _closed(v) for k, v in schema.items()}
        if "properties" in schema and not schema.get("x-kubernetes-preserve-unknown-fields"):
            out["additionalProperties"] = False
        return out
    if isinstance(schema, list):
        return [_closed(v) for v in schema]
    return schema


def _cel_failures(schema: Mapping[str, Any], value: Any, path: str) -> Iterator[tuple[str, str]]:
    for rule in schema.get("x-kubernetes-validations", []):
        if not _cel_program(rule["rule"])(value):
            yield (path + rule.get("fieldPath", "")).lstrip("."), rule["message"]
    if isinstance(value, dict):
        for key, sub in schema.get("properties", {}).items():
            if key in value and key != "metadata":
                yield from _cel_failures(sub, value[key], f"{path}.{key}")
    elif isinstance(value, list) and "items" in schema:
        for i, item in enumerate(value):
            yield from _cel_failures(schema["items"], item, f"{path}[{i}]")


@functools.cache
def _cel_program(rule: str) -> Any:
    """Compile one CEL rule into ``value -> bool`` (``self`` bound to ``value``)."""
    import celpy
    from celpy.adapter import json_to_cel

    env = celpy.Environment()
    program = env.program(env.compile(rule))

    def evaluate(value: Any) -> bool:
        return bool(program.evaluate({"self": json_to_cel(value)}))

    return evaluate


def as_applied(written: Mapping[str, Any], isvc: InferenceService) -> dict[str, Any]:
    """The object to apply again: ``apiVersion``, ``kind``, ``metadata`` as written, and the
    spec with every default filled in (``isvc.spec``); what ``tailguard validate`` prints.
    ``written`` is the object :func:`find_object` returned, ``isvc`` its :func:`parse`."""
    return {"apiVersion": API_VERSION, "kind": KIND,
            "metadata": copy.deepcopy(dict(written.get("metadata") or {})),
            "spec": copy.deepcopy(isvc.spec)}
