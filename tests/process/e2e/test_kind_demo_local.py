"""The pieces of scripts/kind-demo.sh that can run without Docker, run against a real
`tailguard up` (what `make up` starts): the traffic step refuses a port where the laptop's
server answers, its header check reads which model answered from a real reply, and the load
program (scripts/kind-load.py) drives a real server and reports replies by status.

The rest of the demo is checked statically in tests/process/chart/test_kind_demo.py.
"""

from __future__ import annotations

import re
import socket
import subprocess
import sys
from pathlib import Path
from typing import Iterator

import pytest
import yaml

from harness.up import EXAMPLE, ROOT, Up, start_up

SCRIPT = ROOT / "scripts" / "kind-demo.sh"
LOAD = ROOT / "scripts" / "kind-load.py"


def demo_request() -> str:
    """The v2 request body the demo sends (its REQUEST variable)."""
    (body,) = re.findall(r"^REQUEST='(.*)'$", SCRIPT.read_text(encoding="utf-8"), re.M)
    return body


@pytest.fixture(scope="module")
def laptop() -> Iterator[Up]:
    """`tailguard up examples/digits.yaml`, as `make up` runs it (on a free port)."""
    server = start_up(EXAMPLE)
    try:
        yield server
    finally:
        server.stop()


def test_traffic_refuses_a_port_where_the_laptops_server_answers(laptop: Up) -> None:
    """Were the forward's port taken by `make up`, every check would pass against the laptop:
    the step stops before it asks the cluster anything."""
    done = subprocess.run(["bash", str(SCRIPT), "traffic"], cwd=ROOT, capture_output=True,
                          text=True, timeout=60,
                          env={"PATH": "/usr/bin:/bin", "LOCAL_PORT": str(laptop.port)})
    assert done.returncode == 1, (done.stdout, done.stderr)
    assert (f"kind-demo: something already answers on 127.0.0.1:{laptop.port} (make up?); "
            "stop it or set LOCAL_PORT") in done.stderr
    assert "+ kubectl" not in done.stdout + done.stderr


def test_header_check_reads_which_model_answered(laptop: Up, tmp_path: Path) -> None:
    """The script's ``header`` function, on the headers curl saved from a real reply."""
    headers = str(tmp_path / "headers")
    curl = subprocess.run(["curl", "-fsS", "-D", headers, "-o", "/dev/null", "-H",
                           "Content-Type: application/json", "--data", demo_request(),
                           f"{laptop.base}/v2/models/digits/infer"],
                          capture_output=True, text=True, timeout=60)
    assert curl.returncode == 0, curl.stderr
    define = re.search(r"^header\(\) \{\n.*?^\}\n", SCRIPT.read_text(encoding="utf-8"),
                       re.S | re.M)
    assert define is not None
    read = subprocess.run(["bash", "-c", define.group(0) + 'header "$1" "$2"; header "$3" "$2"',
                           "header", "X-Tailguard-Role", headers, "x-tailguard-model"],
                          capture_output=True, text=True, timeout=60)
    assert read.returncode == 0, read.stderr
    uri = yaml.safe_load(EXAMPLE.read_text(encoding="utf-8"))["spec"]["model"]["uri"]
    assert read.stdout.splitlines() == ["primary", uri]


def test_load_program_drives_a_real_server_and_counts_by_status(laptop: Up) -> None:
    done = subprocess.run([sys.executable, str(LOAD), f"{laptop.base}/v2/models/digits/infer",
                           "2", "4", demo_request()], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    last = done.stdout.splitlines()[-1]
    match = re.fullmatch(r"t=\d+s 200=(\d+)", last)
    assert match and int(match.group(1)) > 0, done.stdout


def test_load_program_counts_refused_connections_and_stops_on_time() -> None:
    """Nothing listens on a port of 127.0.0.1 that was just closed: every request fails with
    a connection error, counted by name, and the program still ends after SECONDS."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    done = subprocess.run([sys.executable, str(LOAD), f"http://127.0.0.1:{port}/", "1", "2",
                           "{}"], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert re.fullmatch(r"t=\d+s URLError=\d+", done.stdout.splitlines()[-1]), done.stdout


def test_load_program_says_how_to_call_it() -> None:
    done = subprocess.run([sys.executable, str(LOAD)], capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 2
    assert done.stderr.strip() == "usage: python kind-load.py URL SECONDS WORKERS BODY"
