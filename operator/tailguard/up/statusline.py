"""What ``tailguard up`` shows while it serves: one status line, rewritten in place on a
terminal (rich's ``Live``), one plain line per report elsewhere (a pipe, a log file, CI).

Messages (the SLO guard's decisions) are written through the same object, so on a terminal
they appear above the live line instead of tearing it.
"""

from __future__ import annotations

from types import TracebackType
from typing import TextIO

from rich.console import Console
from rich.live import Live
from rich.text import Text


class StatusLine:
    """The live line and the messages above it, over ``out``.

    ``terminal``: rewrite one line in place (default: whether ``out`` is a terminal). Use as a
    context manager around serving; :meth:`update` replaces the line, :meth:`write` takes
    messages as a text file would (whole lines are shown as they complete).
    """

    def __init__(self, out: TextIO, *, terminal: bool | None = None) -> None:
        self.out = out
        self.terminal = out.isatty() if terminal is None else terminal
        self._pending = ""
        self._live: Live | None = None
        if self.terminal:
            console = Console(file=out, force_terminal=True, highlight=False)
            self._live = Live(console=console, auto_refresh=False, transient=False,
                              redirect_stdout=False, redirect_stderr=False)

    def __enter__(self) -> StatusLine:
        if self._live is not None:
            self._live.start()
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        if self._live is not None:
            self._live.stop()  # the last line stays, and the cursor moves below it

    def update(self, line: str) -> None:
        """Show ``line`` as the status line."""
        if self._live is not None:
            self._live.update(Text(line), refresh=True)
        else:
            self.out.write(line + "\n")
            self.out.flush()

    def write(self, text: str) -> int:
        """Write messages; each complete line is shown above the status line."""
        self._pending += text
        *lines, self._pending = self._pending.split("\n")
        for line in lines:
            if self._live is not None:
                self._live.console.print(Text(line))
            else:
                self.out.write(line + "\n")
        return len(text)

    def flush(self) -> None:
        """Flush ``out`` (whole lines are written at once; a partial one waits for its end)."""
        self.out.flush()

    def isatty(self) -> bool:
        """``False``: writers need not handle the terminal themselves."""
        return False
