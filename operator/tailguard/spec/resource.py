"""The InferenceService resource: its API identity, its typed view, and how to read one.

:func:`parse` validates an object exactly as the API server would
(:func:`tailguard.spec.schema.validate_object`) and types the defaulted result. ``tailguard up``
and the operator both call it, so a spec is accepted locally exactly when the cluster would
accept it. :func:`read_file` is the one reader of a spec file (``up``, ``validate``, ``bench``,
``tune`` and ``report`` use it); it is the only I/O here. No logging.
"""

from __future__ import annotations

import copy
import os
from dataclasses import dataclass
from typing import Any, Mapping

import yaml

from tailguard.spec.schema import SpecError, validate_object
from tailguard_runtime.settings import BatchingSettings, ModelSettings, RuntimeSettings

GROUP = "tailguard.dev"
VERSION = "v1alpha1"
API_VERSION = f"{GROUP}/{VERSION}"
KIND = "InferenceService"
PLURAL = "inferenceservices"


@dataclass(frozen=True)
class ModelRef:
    """``spec.model`` or ``spec.fallback``."""

    uri: str
    format: str
    version: str
    sha256: str | None
    max_bytes: int | None = None
    """``maxBytes``: the download cap of an http(s) model (``None``: the runtime's 1 GiB)."""
    ca_config_map: str | None = None
    """``caConfigMap``: the ConfigMap whose ``ca.crt`` an https model's download trusts."""


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
    grpc_port: int = 8081
    """``spec.grpcPort``: the runtime's gRPC port in each pod."""

    def runtime_settings(self, *, control_secret: str | None = None,
                         drain_grace_seconds: float = RuntimeSettings.drain_grace_seconds
                         ) -> RuntimeSettings:
        """The settings a runtime process serving both roles needs; ``control_secret`` turns
        on ``tailguard up``'s control routes; ``drain_grace_seconds`` is the drain after
        SIGTERM, in seconds (the operator derives it from ``timeoutMs``)."""
        return RuntimeSettings(
            name=self.name,
            models=(_model_settings(self.model, "primary"), _model_settings(self.fallback, "fallback")),
            batching=self.batching,
            stats_window_seconds=float(self.slo.window_seconds),
            slo_p99_ms=float(self.slo.p99_latency_ms),
            drain_grace_seconds=drain_grace_seconds,
            control_secret=control_secret,
            grpc_port=self.grpc_port,
        )


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
        grpc_port=spec["grpcPort"],
    )


def load_file(text: str, source: str = "<input>") -> InferenceService:
    """Parse the one InferenceService in a YAML text (other kinds in the file are ignored).

    Raises:
        SpecError: invalid YAML, no InferenceService, several of them, or an invalid one.
    """
    return parse(find_object(text, source))


@dataclass(frozen=True)
class SpecFile:
    """An InferenceService YAML file as :func:`read_file` read it."""

    text: str
    """The whole file, line ends as written (an edit such as ``tune --write`` keeps its bytes)."""
    written: dict[str, Any]
    """The InferenceService object as written, nothing defaulted."""
    isvc: InferenceService
    """Its typed view, every default filled in."""


def read_file(path: str | os.PathLike[str]) -> SpecFile:
    """Read the YAML file at ``path`` and validate the one InferenceService in it.

    Raises:
        OSError: the file cannot be read.
        SpecError: invalid YAML, not exactly one InferenceService, or an invalid one; the
            YAML and count messages name ``path``.
    """
    with open(path, encoding="utf-8", newline="") as fh:
        text = fh.read()
    written = find_object(text, str(path))
    return SpecFile(text, written, parse(written))


def yaml_problem(source: str, exc: Exception) -> str:
    """One line for a YAML parse error (PyYAML's or ruamel's): ``SOURCE:LINE:COLUMN: not valid
    YAML: problem (context)``, lines and columns counted from 1, as editors and compilers show
    them; without a position, ``SOURCE: not valid YAML: ...`` with the error on one line."""
    problem = getattr(exc, "problem", None)
    mark = getattr(exc, "problem_mark", None)
    if problem is None or mark is None:
        return f"{source}: not valid YAML: {' '.join(str(exc).split())}"
    context = getattr(exc, "context", None)
    return (f"{source}:{mark.line + 1}:{mark.column + 1}: not valid YAML: {problem}"
            + (f" ({context})" if context else ""))


def find_object(text: str, source: str = "<input>") -> dict[str, Any]:
    """The one InferenceService object in a YAML text, as written (nothing defaulted).

    Raises:
        SpecError: invalid YAML, no InferenceService, or several of them.
    """
    try:
        docs = [d for d in yaml.safe_load_all(text) if d is not None]
    except yaml.YAMLError as exc:
        raise SpecError([yaml_problem(source, exc)]) from None
    found = [d for d in docs if isinstance(d, dict) and d.get("kind") == KIND]
    if len(found) != 1:
        raise SpecError([f"{source}: expected exactly one {KIND}, found {len(found)}"])
    return found[0]


def _model_ref(raw: Mapping[str, Any]) -> ModelRef:
    return ModelRef(raw["uri"], raw["format"], raw["version"], raw.get("sha256"),
                    raw.get("maxBytes"), raw.get("caConfigMap"))


def _model_settings(ref: ModelRef, role: str) -> ModelSettings:
    return ModelSettings(uri=ref.uri, role=role, sha256=ref.sha256, version=ref.version,
                         max_bytes=ref.max_bytes)


def as_applied(written: Mapping[str, Any], isvc: InferenceService) -> dict[str, Any]:
    """The object to apply again: ``apiVersion``, ``kind``, ``metadata`` as written, and the
    spec with every default filled in (``isvc.spec``); what ``tailguard validate`` prints.
    ``written`` is the object :func:`find_object` returned, ``isvc`` its :func:`parse`."""
    return {"apiVersion": API_VERSION, "kind": KIND,
            "metadata": copy.deepcopy(dict(written.get("metadata") or {})),
            "spec": copy.deepcopy(isvc.spec)}
