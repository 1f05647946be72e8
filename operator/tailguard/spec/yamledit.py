"""Write new values into an InferenceService YAML file without disturbing anything else.

``tailguard tune --write`` sets ``spec.batching.maxBatchSize`` and ``maxWaitMs``. A person's
file has comments, an order and a layout of their own, and a tool that rewrites it loses them.
:func:`set_batching` reads the file with ruamel.yaml's round-trip loader only to find where each
value is written (line and column), then replaces exactly those characters: every other byte of
the file stays as it was. A key that is not written yet (or a file without a ``batching`` block)
is added through ruamel.yaml's round-trip dumper, which keeps comments and order.

Pure: text in, text out; the caller reads and writes the file.
"""

from __future__ import annotations

import io
import re
from typing import Any, Mapping

from ruamel.yaml import YAML
from ruamel.yaml.comments import CommentedMap
from ruamel.yaml.error import YAMLError

from tailguard.spec.resource import KIND, yaml_problem
from tailguard.spec.schema import SpecError

_SCALAR = re.compile(r"[^\s,}\]#]+")
"""A plain scalar as written in block or flow style (ends at a space, comma, brace or comment)."""


def set_batching(text: str, values: Mapping[str, int], source: str = "<input>") -> str:
    """Return ``text`` with ``spec.batching.<key>`` set to each of ``values`` (e.g.
    ``{"maxBatchSize": 32, "maxWaitMs": 2}``) in the one InferenceService document.

    Values already written (block or flow style, any indentation, quoted or not) are replaced
    in place: only their characters change. Missing keys, or a missing ``batching`` block, are
    added by a round-trip dump of the stream, which keeps comments and key order.

    Raises:
        SpecError: not valid YAML, not exactly one InferenceService, or ``spec`` /
            ``spec.batching`` not a mapping.
    """
    yaml = _yaml()
    try:
        docs = list(yaml.load_all(text))
    except YAMLError as exc:
        raise SpecError([yaml_problem(source, exc)]) from None
    found = [d for d in docs if isinstance(d, dict) and d.get("kind") == KIND]
    if len(found) != 1:
        raise SpecError([f"{source}: expected exactly one {KIND}, found {len(found)}"])
    spec = found[0].get("spec")
    if not isinstance(spec, CommentedMap):
        raise SpecError([f"{source}: spec: expected a mapping"])
    batching = spec.get("batching")
    if batching is not None and not isinstance(batching, CommentedMap):
        raise SpecError([f"{source}: spec.batching: expected a mapping"])
    if batching is None or any(key not in batching for key in values):
        return _dump_with(yaml, docs, spec, values)
    lines = text.splitlines(keepends=True)
    # Replace from the end of the file backwards so earlier positions stay valid.
    places = sorted(((*batching.lc.value(key), key) for key in values), reverse=True)
    for line, col, key in places:
        written = _SCALAR.match(lines[line], col)
        if written is None:  # pragma: no cover - ruamel points at the value it parsed
            raise SpecError([f"{source}: spec.batching.{key}: cannot find its value"])
        lines[line] = lines[line][:col] + str(int(values[key])) + lines[line][written.end():]
    return "".join(lines)


def _dump_with(yaml: YAML, docs: list[Any], spec: CommentedMap,
               values: Mapping[str, int]) -> str:
    batching = spec.get("batching")
    if batching is None:
        batching = CommentedMap()
        after = list(spec).index("fallback") + 1 if "fallback" in spec else len(spec)
        spec.insert(after, "batching", batching)
    for key, value in values.items():
        batching[key] = int(value)
    out = io.StringIO()
    yaml.dump_all(docs, out)
    return out.getvalue()


def _yaml() -> YAML:
    yaml = YAML(typ="rt")
    yaml.preserve_quotes = True
    return yaml
