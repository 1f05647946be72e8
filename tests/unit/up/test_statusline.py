"""tailguard up's status line: rewritten in place on a terminal, plain lines elsewhere, and
the guard's messages shown above it."""

from __future__ import annotations

import io
import re

from tailguard.up.statusline import StatusLine


def test_off_a_terminal_every_report_and_message_is_a_plain_line() -> None:
    out = io.StringIO()
    with StatusLine(out) as shown:
        assert shown.terminal is False
        shown.update("digits: p99=3.1ms")
        shown.write("digits: rolled")
        shown.write(" back\nand more")  # whole lines appear as they complete
        shown.update("digits: p99=2.9ms")
        shown.write("\n")
    assert out.getvalue() == ("digits: p99=3.1ms\ndigits: rolled back\ndigits: p99=2.9ms\n"
                              "and more\n")


def test_on_a_terminal_the_line_is_redrawn_and_messages_go_above_it() -> None:
    out = io.StringIO()
    with StatusLine(out, terminal=True) as shown:
        shown.update("digits: p99=3.1ms")
        shown.write("digits: SLO breached, rolled back to the fallback\n")
        shown.update("digits: p99=2.9ms")
    text = out.getvalue()
    plain = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", text)
    assert "\x1b[" in text  # cursor control: the line is rewritten, not appended
    message = plain.index("rolled back to the fallback")
    assert plain.index("p99=3.1ms") < message < plain.index("p99=2.9ms")
    assert plain.endswith("p99=2.9ms\n")  # the last report stays, the cursor below it
    assert shown.isatty() is False  # writers never draw on the terminal themselves
