"""Child processes of the test run that end with it."""

from __future__ import annotations

import ctypes
import signal

_PRCTL = ctypes.CDLL(None, use_errno=True).prctl  # resolved here, never in a forked child


def end_with_parent() -> None:
    """In a child, before exec: ask Linux to send SIGTERM when the process that started it
    dies (``PR_SET_PDEATHSIG``), so a killed test run leaves nothing running behind."""
    _PRCTL(1, signal.SIGTERM)  # 1 = PR_SET_PDEATHSIG
