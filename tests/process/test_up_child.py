"""How :mod:`tailguard.up.child` waits for a child's banner: for as long as the child keeps
printing, until it falls silent for the wait's length or its output ends. The children here
are real processes (``python -c``) that print on a schedule."""

from __future__ import annotations

import re
import subprocess
import sys
import time

from tailguard.up.child import UpProcess

BANNER = re.compile(r"on http://127\.0\.0\.1:(\d+)")


def child(script: str) -> UpProcess:
    return UpProcess(subprocess.Popen([sys.executable, "-u", "-c", script],
                                      stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                      text=True, stdin=subprocess.DEVNULL))


def test_a_child_that_keeps_printing_is_waited_for_past_the_wait_s_length() -> None:
    """Six lines 0.4 s apart, then the banner: 2.4 s in all against a 1.5 s wait."""
    up = child("import time\n"
               "for k in range(6):\n"
               "    print(f'model {k} ready', flush=True); time.sleep(0.4)\n"
               "print('serving on http://127.0.0.1:43211', flush=True)\n"
               "time.sleep(30)\n")
    try:
        assert up.wait_for_banner(BANNER, quiet_s=1.5), up.text()
        assert (up.port, up.base) == (43211, "http://127.0.0.1:43211")
        assert up.text().count("ready") == 6
    finally:
        up.stop()


def test_a_child_silent_for_the_wait_s_length_is_given_up_on() -> None:
    up = child("import time\nprint('loading', flush=True)\ntime.sleep(30)\n")
    try:
        started = time.monotonic()
        assert not up.wait_for_banner(BANNER, quiet_s=1.0)
        assert time.monotonic() - started < 20  # the silence, not the child's 30 s sleep
        assert up.text() == "loading\n"
    finally:
        up.stop()


def test_a_child_that_exits_before_its_banner_is_given_up_on_at_once() -> None:
    up = child("print('spec.slo: Field required')\nraise SystemExit(2)\n")
    started = time.monotonic()
    assert not up.wait_for_banner(BANNER, quiet_s=60.0)
    assert time.monotonic() - started < 30
    assert up.wait() == 2
    assert up.text() == "spec.slo: Field required\n"
