"""The InferenceService CRD's schema, applied as the API server applies it.

The CRD file (``crd/inferenceservice.yaml`` in this package, copied by ``make crds`` from the
repository's ``crds/``, the one source) is the one definition. :func:`validate_object` does what
the API server does on ``kubectl apply``: apply the schema's defaults, check the OpenAPI schema
(types, bounds, patterns, unknown fields), then evaluate the CEL rules
(``x-kubernetes-validations``) with cel-python. The typed view over the result is
:mod:`tailguard.spec.resource`. Pure: no I/O beyond reading the packaged CRD once, no logging.
"""

from __future__ import annotations

import copy
import functools
from importlib import resources
from typing import Any, Iterator, Mapping

import yaml


class SpecError(ValueError):
    """An InferenceService that the CRD refuses. ``errors`` holds one line per problem, each
    starting with the field path (``spec.batching.maxBatchSize: ...``)."""

    def __init__(self, errors: list[str]) -> None:
        super().__init__("; ".join(errors))
        self.errors = errors

    def for_people(self, prefix: str, path: str) -> str:
        """The refusal of the file ``path`` as ``prefix`` (the command) says it: one line for
        one problem, else a heading and one indented line each."""
        if len(self.errors) == 1:
            return f"{prefix}: {path} is not a valid InferenceService: {self.errors[0]}"
        return "\n".join([f"{prefix}: {path} is not a valid InferenceService "
                          f"({len(self.errors)} problems):", *(f"  {line}" for line in self.errors)])


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
