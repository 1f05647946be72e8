"""A `tailguard up` child process: started on a free port, its banner read, its output kept.

One way to run a local InferenceService from another program: ``tailguard bench SPEC.yaml``
starts its target with it, and the end-to-end tests and the SLO-guard benchmark use the same.
:func:`start_up` runs ``python -m tailguard.cli.main up SPEC --port 0`` (stdout and stderr
merged) and returns once the banner names the port; :class:`UpProcess` keeps reading what the
process prints, and stops it by its PID (SIGINT: drain and exit, then SIGKILL after 30 s).
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

TAILGUARD = [sys.executable, "-m", "tailguard.cli.main"]
WAIT_S = 60.0
"""Upper bound on waiting for a line the process is expected to print (s): for the banner,
how long it may print nothing."""


class UpFailed(RuntimeError):
    """`tailguard up` exited or printed no banner in time; the message holds what it printed."""


class UpProcess:
    """A running `tailguard up` process, its base URL, and what it printed (read from its
    start by a thread of its own)."""

    def __init__(self, proc: subprocess.Popen[str], port: int = 0) -> None:
        self.proc = proc
        self.printed: list[str] = []
        self.port, self.base = port, f"http://127.0.0.1:{port}"
        self._lines = threading.Condition()
        self._ended = False  # its output ended (the process exited)
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            with self._lines:
                self.printed.append(line)
                self._lines.notify_all()
        with self._lines:
            self._ended = True
            self._lines.notify_all()

    def wait_for_banner(self, banner: re.Pattern[str], quiet_s: float) -> bool:
        """Wait for a printed line matching ``banner`` and take the port in its group 1;
        False when the process's output ends first, or it prints nothing for ``quiet_s``
        seconds."""
        checked = 0
        with self._lines:
            while True:
                for line in self.printed[checked:]:
                    match = banner.search(line)
                    if match:
                        self.port = int(match.group(1))
                        self.base = f"http://127.0.0.1:{self.port}"
                        return True
                checked = len(self.printed)
                if self._ended:
                    return False
                if not self._lines.wait(quiet_s) and len(self.printed) == checked:
                    return False

    def text(self) -> str:
        """Everything printed so far."""
        return "".join(self.printed)

    @property
    def grpc_port(self) -> int:
        """The gRPC port the banner names (its ``gRPC HOST:PORT`` line).

        Raises:
            UpFailed: the banner has no such line.
        """
        found = self.wait_for(r"^  gRPC +\S+:(\d+) ")
        if not found:
            raise UpFailed("tailguard up printed no gRPC line:\n" + self.text())
        return int(found[0].group(1))

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
        if self.proc.poll() is None:
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


def start_up(spec: Path | str, timeout_s: float = WAIT_S, env: Mapping[str, str] | None = None,
             cwd: Path | str | None = None, extra_args: tuple[str, ...] = (),
             host: str | None = None, own_session: bool = False) -> UpProcess:
    """Start `tailguard up SPEC --port 0` (``env`` adds variables) and wait for its banner.

    ``host`` is passed as ``--host``; the banner must then show it (``http://[::]:PORT`` for an
    IPv6 address). :attr:`UpProcess.base` is always ``http://127.0.0.1:PORT``. With
    ``own_session`` it runs in a session of its own, so a Ctrl-C at the terminal reaches only
    the caller, which stops it by PID (:meth:`UpProcess.stop`).

    Raises:
        UpFailed: the process exited before its banner, or printed nothing for ``timeout_s``
            seconds (it is killed); the message carries what it printed. The wait is for
            silence, not a deadline: on a busy machine a model can take most of a minute to
            load, and each model's line restarts the wait.
    """
    shown = f"[{host}]" if host and ":" in host else host or "127.0.0.1"
    banner = re.compile(rf"on http://{re.escape(shown)}:(\d+)")
    proc = subprocess.Popen([*TAILGUARD, "up", str(spec), "--port", "0", *extra_args,
                             *(["--host", host] if host else [])],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=cwd,
                            stdin=subprocess.DEVNULL, env={**os.environ, **(env or {})},
                            start_new_session=own_session)
    up = UpProcess(proc)
    if up.wait_for_banner(banner, timeout_s):
        return up
    proc.kill()
    up.wait()
    raise UpFailed("tailguard up did not start:\n" + up.text())
