"""Helpers for the end-to-end tests: a real `tailguard up` process, and the `tailguard` command.

:func:`start_up` runs ``python -m tailguard_operator.cli up SPEC --port 0`` (stdout and stderr
merged) and returns once the banner names the port; :class:`Up` keeps reading what the process
prints. :func:`run_cli` runs one `tailguard` command to completion. Every process listens on
127.0.0.1 only and is stopped by PID.

This module has a name of its own (not ``conftest``) so that test modules can import it.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Mapping

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "digits.yaml"
TAILGUARD = [sys.executable, "-m", "tailguard_operator.cli"]
WAIT_S = 60.0
"""Upper bound on waiting for a line the process is expected to print (never a timed
assertion: reaching it means the line never came)."""


class Up:
    """A running `tailguard up` process, its base URL, and what it printed."""

    def __init__(self, proc: subprocess.Popen[str], port: int, printed: list[str]) -> None:
        self.proc, self.port, self.printed = proc, port, printed
        self.base = f"http://127.0.0.1:{port}"
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.printed.append(line)

    def text(self) -> str:
        """Everything printed so far."""
        return "".join(self.printed)

    def wait_for(self, pattern: str, count: int = 1) -> list[re.Match[str]]:
        """Wait until ``pattern`` matched ``count`` printed lines (at most :data:`WAIT_S`);
        return the matches."""
        deadline = time.monotonic() + WAIT_S
        while True:
            found = [m for line in list(self.printed) if (m := re.search(pattern, line))]
            if len(found) >= count or time.monotonic() > deadline or (
                    self.proc.poll() is not None and not self._reader.is_alive()):
                return found
            time.sleep(0.02)

    def stop(self, sig: int = signal.SIGINT) -> int:
        """Signal the process, wait for it (kill after 30 s), and return its exit code."""
        self.proc.send_signal(sig)
        return self.wait()

    def wait(self) -> int:
        """Wait for the process to exit (kill after 30 s); return its exit code."""
        try:
            code = self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            code = self.proc.wait()
        self._reader.join(10)
        assert self.proc.stdout is not None
        self.proc.stdout.close()
        return code


def start_up(spec: Path, timeout_s: float = 60.0, env: Mapping[str, str] | None = None,
             host: str | None = None) -> Up:
    """Start `tailguard up SPEC --port 0` in the repository root; ``env`` adds variables,
    ``host`` is passed as ``--host`` (the banner must then show it, e.g. ``http://[::]:PORT``).
    :attr:`Up.base` is always ``http://127.0.0.1:PORT``."""
    shown = re.escape(f"[{host}]" if host and ":" in host else host or "127.0.0.1")
    proc = subprocess.Popen([*TAILGUARD, "up", str(spec), "--port", "0",
                             *(["--host", host] if host else [])], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, cwd=ROOT,
                            env={**os.environ, **(env or {})})
    deadline = time.monotonic() + timeout_s
    seen: list[str] = []
    assert proc.stdout is not None
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line:
            break
        seen.append(line)
        match = re.search(rf"on http://{shown}:(\d+)", line)
        if match:
            return Up(proc, int(match.group(1)), seen)
    proc.kill()
    proc.wait()
    proc.stdout.close()
    raise AssertionError("tailguard up did not start:\n" + "".join(seen))


def run_cli(*args: str, env: Mapping[str, str] | None = None,
            cwd: Path = ROOT) -> subprocess.CompletedProcess[str]:
    """Run ``tailguard ARGS`` to completion (at most 120 s) and return what it did."""
    return subprocess.run([*TAILGUARD, *args], capture_output=True, text=True, timeout=120,
                          cwd=cwd, env={**os.environ, **(env or {})})


def one_line_failure(done: subprocess.CompletedProcess[str]) -> str:
    """Assert that a command failed the way every `tailguard` error path must: a non-zero exit,
    nothing on stdout, exactly one line on stderr and no traceback. Returns that line."""
    assert done.returncode != 0, (done.stdout, done.stderr)
    assert "Traceback" not in done.stderr, done.stderr
    assert done.stdout == "", done.stdout
    lines = done.stderr.splitlines()
    assert len(lines) == 1, done.stderr
    return lines[0]
