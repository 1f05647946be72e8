"""The serving process's garbage-collector settings still collect cyclic garbage on their own,
young or old, without anyone calling gc.collect()."""

from __future__ import annotations

import gc
import weakref
from typing import Iterator

import pytest

from tailguard_runtime.server import CPYTHON_GC_DEFAULTS, GC_THRESHOLDS, tune_garbage_collector


class Node:
    def __init__(self) -> None:
        self.other: Node | None = None


@pytest.fixture
def tuned() -> Iterator[None]:
    before = gc.get_threshold()
    gc.set_threshold(*CPYTHON_GC_DEFAULTS)
    tune_garbage_collector()
    try:
        yield
    finally:
        gc.unfreeze()
        gc.set_threshold(*before)


def cycle() -> Node:
    a, b = Node(), Node()
    a.other, b.other = b, a
    return a


def garbage_cycles(n: int) -> list[weakref.ref[Node]]:
    """``n`` two-node cycles, each garbage as soon as it is made: only the cycle collector can
    free them. Returns weak references to them."""
    return [weakref.ref(cycle()) for _ in range(n)]


def test_young_cycles_are_collected_on_their_own(tuned: None) -> None:
    assert gc.isenabled() and gc.get_threshold() == GC_THRESHOLDS
    refs = garbage_cycles(10_000)
    garbage_cycles(10_000)  # more allocations, so that young collections keep running
    alive = sum(ref() is not None for ref in refs)
    assert alive < len(refs) // 10, f"{alive} of {len(refs)} cycles still alive"


def test_cycles_that_reached_the_old_generation_are_collected_on_their_own(tuned: None) -> None:
    # As in a server that has run a while: the last full collection saw only what serving
    # made (startup's objects are frozen), so CPython's other condition for a full collection,
    # the old generation grown by a quarter since, is met by what follows.
    gc.collect()
    held = [cycle() for _ in range(5_000)]
    garbage_cycles(20 * GC_THRESHOLDS[0])  # young and middle collections: `held` grows old
    refs = [weakref.ref(node) for node in held]
    del held
    # With (700, 3, 100), 300 young collections (210,000 allocations) lead to a full one;
    # allow half as many again. Thresholds that put it further off fail here.
    budget = 315_000
    for _ in range(budget // 2 // 1000):
        garbage_cycles(1000)  # 2,000 tracked objects of garbage each round (and 1,000 refs)
        if all(ref() is None for ref in refs):
            break
    alive = sum(ref() is not None for ref in refs)
    assert alive == 0, f"{alive} old cycles still alive after {budget:,} allocations"
