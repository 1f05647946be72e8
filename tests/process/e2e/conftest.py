"""Fixtures of the end-to-end tests (helpers that tests import live in :mod:`harness.up`)."""

from __future__ import annotations

from typing import Iterator

import pytest

from harness.up import IRIS, Up, start_up


@pytest.fixture(scope="module")
def iris() -> Iterator[Up]:
    """`tailguard up examples/iris.yaml`, one process per test module (modules switch its
    traffic), serving once its banner is out; stopped with Ctrl-C after the module."""
    server = start_up(IRIS)
    try:
        server.wait_for(r"^Ctrl-C drains and stops\.")
        yield server
    finally:
        server.stop()
