"""The serving process's garbage-collector settings still collect cyclic garbage on their own."""

from __future__ import annotations

import gc
import weakref
from typing import Iterator

import pytest

from tailguard_runtime.server import GC_THRESHOLDS, tune_garbage_collector


class Node:
    def __init__(self) -> None:
        self.other: Node | None = None


@pytest.fixture
def tuned() -> Iterator[None]:
    before = gc.get_threshold()
    tune_garbage_collector()
    try:
        yield
    finally:
        gc.unfreeze()
        gc.set_threshold(*before)


def cycles(n: int) -> list[weakref.ref[Node]]:
    """``n`` two-node cycles, dropped at once: only the cycle collector can free them."""
    refs = []
    for _ in range(n):
        a, b = Node(), Node()
        a.other, b.other = b, a
        refs.append(weakref.ref(a))
    return refs


def test_young_cycles_are_collected_without_an_explicit_collect(tuned: None) -> None:
    assert gc.isenabled() and gc.get_threshold() == GC_THRESHOLDS
    assert gc.get_freeze_count() > 0  # startup's objects are out of the collector's sight
    refs = cycles(10_000)  # 20,000 tracked objects: under a second of serving
    cycles(10_000)  # more allocations, so that young collections keep running
    alive = sum(ref() is not None for ref in refs)
    assert alive < len(refs) // 10, f"{alive} of {len(refs)} cycles still alive"

