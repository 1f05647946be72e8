"""`tune --write`: the batching values change, every other byte of the file stays."""

from __future__ import annotations

import difflib
from pathlib import Path

import pytest

from harness import REPO
from tailguard.spec.resource import load_file
from tailguard.spec.schema import SpecError
from tailguard.spec.yamledit import set_batching

ROOT = REPO

HAND_WRITTEN = """\
# Our digits service -- tuned by hand, then by tailguard tune.
---
apiVersion: v1
kind: ConfigMap          # another kind in the same file: left alone
metadata: {name: notes}
data:
  maxBatchSize: "7"      # not the InferenceService's
---
apiVersion: tailguard.dev/v1alpha1
kind: InferenceService
metadata:
    name: digits   # four-space indentation, on purpose
    labels: {team: "ml",   tier: 'gold'}
spec:
    traffic: primary          # order is ours: traffic first
    model:
        uri: builtin://digits/random-forest?trees=200
    batching:
        maxQueueSize: 512     # rows
        maxBatchSize:   64    # was picked by hand
        timeoutMs: 1000
        maxWaitMs: 0
    fallback: {uri: builtin://digits/logistic-regression}
    slo: {p99LatencyMs: 50,  windowSeconds: 10}   # flow style, odd spacing
"""


def changed_lines(before: str, after: str) -> list[tuple[str, str]]:
    """The (old, new) line pairs that differ; the line count must be the same."""
    a, b = before.splitlines(keepends=True), after.splitlines(keepends=True)
    assert len(a) == len(b)
    return [(x, y) for x, y in zip(a, b) if x != y]


def test_only_the_two_values_change_in_a_hand_written_file() -> None:
    after = set_batching(HAND_WRITTEN, {"maxBatchSize": 32, "maxWaitMs": 2})
    assert changed_lines(HAND_WRITTEN, after) == [
        ("        maxBatchSize:   64    # was picked by hand\n",
         "        maxBatchSize:   32    # was picked by hand\n"),
        ("        maxWaitMs: 0\n", "        maxWaitMs: 2\n")]
    isvc = load_file(after)
    assert (isvc.batching.max_batch_size, isvc.batching.max_wait_ms) == (32, 2)


@pytest.mark.parametrize("example", sorted((ROOT / "examples").glob("*.yaml")),
                         ids=lambda p: p.name)
def test_every_example_keeps_its_comments_and_fields_byte_for_byte(example: Path) -> None:
    text = example.read_text()
    after = set_batching(text, {"maxBatchSize": 128, "maxWaitMs": 3})
    diff = [line for line in difflib.ndiff(text.splitlines(), after.splitlines())
            if line[:1] in "+-"]
    # only the two values change; an example without a batching block gains one, nothing else
    assert all(line.split(":")[0].strip("+- ") in ("batching", "maxBatchSize", "maxWaitMs")
               for line in diff), diff
    assert all(line.startswith("+") for line in diff) or len(diff) == 4, diff
    isvc = load_file(after)
    assert (isvc.batching.max_batch_size, isvc.batching.max_wait_ms) == (128, 3)
    before = load_file(text)
    assert isvc.slo == before.slo and isvc.model == before.model


def test_flow_style_batching_changes_in_place() -> None:
    text = ("kind: InferenceService  # x\napiVersion: tailguard.dev/v1alpha1\nmetadata: {name: a}\n"
            "spec:\n  model: {uri: builtin://iris/random-forest}\n"
            "  fallback: {uri: builtin://iris/logistic-regression}\n"
            "  batching: {maxBatchSize: 64,maxWaitMs: 0, maxQueueSize: 512}  # flow\n"
            "  slo: {p99LatencyMs: 50}\n")
    after = set_batching(text, {"maxBatchSize": 8, "maxWaitMs": 12})
    assert changed_lines(text, after) == [
        ("  batching: {maxBatchSize: 64,maxWaitMs: 0, maxQueueSize: 512}  # flow\n",
         "  batching: {maxBatchSize: 8,maxWaitMs: 12, maxQueueSize: 512}  # flow\n")]


def test_a_missing_batching_block_is_added_and_comments_stay() -> None:
    text = ("# top comment\napiVersion: tailguard.dev/v1alpha1\nkind: InferenceService\n"
            "metadata: {name: a}\nspec:\n  model: {uri: builtin://iris/random-forest}  # primary\n"
            "  fallback: {uri: builtin://iris/logistic-regression}\n"
            "  slo: {p99LatencyMs: 50}   # the promise\n")
    after = set_batching(text, {"maxBatchSize": 16, "maxWaitMs": 1})
    assert "# top comment" in after and "# primary" in after and "# the promise" in after
    isvc = load_file(after)
    assert (isvc.batching.max_batch_size, isvc.batching.max_wait_ms) == (16, 1)
    keys = list(load_file(after).spec)
    assert keys.index("batching") == keys.index("fallback") + 1


def test_files_without_one_inference_service_are_refused() -> None:
    with pytest.raises(SpecError, match="expected exactly one InferenceService, found 0"):
        set_batching("kind: ConfigMap\n", {"maxBatchSize": 1})
    with pytest.raises(SpecError, match="not valid YAML"):
        set_batching("a: [\n", {"maxBatchSize": 1})
    with pytest.raises(SpecError, match="spec.batching: expected a mapping"):
        set_batching("kind: InferenceService\nspec:\n  batching: 3\n", {"maxBatchSize": 1})


def test_windows_line_ends_stay_as_they_are() -> None:
    text = HAND_WRITTEN.replace("\n", "\r\n")
    after = set_batching(text, {"maxBatchSize": 32, "maxWaitMs": 2})
    assert after.count("\r\n") == text.count("\r\n") and "\n" not in after.replace("\r\n", "")
    assert after == set_batching(HAND_WRITTEN, {"maxBatchSize": 32, "maxWaitMs": 2}).replace(
        "\n", "\r\n")
