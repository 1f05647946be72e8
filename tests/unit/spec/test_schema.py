"""The InferenceService CRD: a structural schema the API server accepts, examples it accepts,
and invalid specs it refuses naming the field (schema and CEL rules, defaults applied first)."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Iterator

import jsonschema
import pytest
import yaml

from harness import REPO
from harness.scene import EXAMPLES, INVALID, example
from tailguard.spec import resource, schema

ROOT = REPO
SCHEMA = schema.object_schema()


def nodes(schema: dict[str, Any], path: str = "") -> Iterator[tuple[str, dict[str, Any]]]:
    """Every schema node below ``schema`` with its dotted path (``[]`` for array items)."""
    yield path, schema
    for key, sub in (schema.get("properties") or {}).items():
        yield from nodes(sub, f"{path}.{key}" if path else key)
    if isinstance(schema.get("items"), dict):
        yield from nodes(schema["items"], f"{path}[]")
    if isinstance(schema.get("additionalProperties"), dict):
        yield from nodes(schema["additionalProperties"], f"{path}{{}}")


def test_the_repository_copy_is_the_packaged_one() -> None:
    assert yaml.safe_load((ROOT / "crds" / "inferenceservice.yaml").read_text()) == schema.crd()


def test_the_crd_serves_one_version_with_status_and_a_distinct_short_name() -> None:
    crd = schema.crd()
    assert crd["metadata"]["name"] == f"{resource.PLURAL}.{resource.GROUP}"
    assert crd["spec"]["scope"] == "Namespaced"
    assert "isvc" not in crd["spec"]["names"]["shortNames"]  # KServe's
    (version,) = crd["spec"]["versions"]
    assert version["name"] == resource.VERSION and version["served"] and version["storage"]
    assert version["subresources"] == {"status": {}}


def test_the_schema_bounds_what_users_write() -> None:
    """Our own rules, beyond what the API server requires (its checks run in
    test_crd_cluster.py): every spec list and string is bounded, nothing in the spec keeps
    unknown fields, and only kopf's bookkeeping does in the status."""
    for path, node in nodes(SCHEMA):
        if node.get("type") == "array":
            assert "maxItems" in node, f"{path}: unbounded list"
        if node.get("type") == "string" and path.startswith("spec"):
            assert {"maxLength", "enum", "pattern"} & set(node), f"{path}: unbounded string"
    preserved = [p for p, n in nodes(SCHEMA) if n.get("x-kubernetes-preserve-unknown-fields")]
    assert preserved == ["status.kopf"]


def test_object_defaults_are_written_in_full() -> None:
    """The API server checks an object's ``default`` against its CEL rules as written, before
    nested defaults would fill it: a default must already hold every defaulted field."""
    for path, node in nodes(SCHEMA):
        if isinstance(node.get("default"), dict):
            assert node["default"] == schema.apply_defaults(node, {}), path
            errors = list(jsonschema.Draft202012Validator(node).iter_errors(node["default"]))
            assert not errors, (path, errors)


def test_printer_columns_point_at_declared_fields() -> None:
    (version,) = schema.crd()["spec"]["versions"]
    declared = {p for p, _ in nodes(SCHEMA)}
    for column in version["additionalPrinterColumns"]:
        path = column["jsonPath"].lstrip(".").split("[")[0]
        assert path in declared or path.startswith("metadata."), column


@pytest.mark.parametrize("path", sorted(EXAMPLES.glob("*.yaml")), ids=lambda p: p.name)
def test_every_example_is_accepted(path: Path) -> None:
    isvc = resource.load_file(path.read_text(), str(path))
    assert isvc.name == path.stem




@pytest.mark.parametrize("case", sorted(INVALID))
def test_invalid_specs_are_refused_naming_the_field(case: str) -> None:
    changes, field = INVALID[case]
    body = example("iris", **changes)
    body["spec"] = {k: v for k, v in body["spec"].items() if v is not None}
    with pytest.raises(schema.SpecError) as refused:
        resource.parse(body)
    assert any(field in error for error in refused.value.errors), refused.value.errors


@pytest.mark.parametrize("name", ["Iris", "a" * 55, "9lives"])
def test_names_that_cannot_name_the_children_are_refused(name: str) -> None:
    body = example("iris")
    body["metadata"]["name"] = name
    with pytest.raises(schema.SpecError, match="metadata.name"):
        resource.parse(body)


def test_cel_rules_see_the_defaults() -> None:
    """``maxWaitMs`` defaults to 0, below any SLO; ``maxQueueSize`` defaults to 256."""
    assert resource.parse(example("iris", slo={"p99LatencyMs": 1})).batching.max_wait_ms == 0
    assert resource.parse(example("iris", batching={"maxBatchSize": 256})).batching.max_batch_size \
        == 256
