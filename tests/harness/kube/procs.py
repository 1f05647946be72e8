"""Child processes of the test run that end with it."""

from __future__ import annotations

import contextlib
import ctypes
import signal
import subprocess

_PRCTL = ctypes.CDLL(None, use_errno=True).prctl  # resolved here, never in a forked child


def end_with_parent() -> None:
    """In a child, before exec: ask Linux to send SIGTERM when the process that started it
    dies (``PR_SET_PDEATHSIG``), so a killed test run leaves nothing running behind. Linux
    sends it when the *thread* that started the child ends: a thread that starts children
    must outlive them."""
    _PRCTL(1, signal.SIGTERM)  # 1 = PR_SET_PDEATHSIG


def end(proc: subprocess.Popen[bytes], timeout: float = 15) -> None:
    """SIGTERM ``proc`` (if still running) and wait up to ``timeout`` seconds, then SIGKILL it
    and wait up to 5 s more."""
    if proc.poll() is None:
        proc.terminate()
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=5)
