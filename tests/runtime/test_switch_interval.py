"""The serving process's GIL switch interval: 1 ms in place of CPython's 5 ms default, unless
whoever runs the process chose one."""

from __future__ import annotations

import sys
from typing import Iterator

import pytest

from tailguard_runtime.server import (CPYTHON_SWITCH_INTERVAL_S, SWITCH_INTERVAL_S,
                                      tune_switch_interval)


@pytest.fixture
def restored() -> Iterator[None]:
    before = sys.getswitchinterval()
    try:
        yield
    finally:
        sys.setswitchinterval(before)


def test_the_default_interval_is_shortened(restored: None) -> None:
    sys.setswitchinterval(CPYTHON_SWITCH_INTERVAL_S)
    tune_switch_interval()
    assert sys.getswitchinterval() == pytest.approx(SWITCH_INTERVAL_S)


def test_an_interval_someone_chose_is_kept(restored: None) -> None:
    sys.setswitchinterval(0.002)
    tune_switch_interval()
    assert sys.getswitchinterval() == pytest.approx(0.002)
