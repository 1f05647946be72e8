"""What a new user reads and runs first: the README's commands and tables, the pages under docs/,
benchmarks/README.md, and `make up` (through `make -n`, which prints what would run without
running it)."""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import pytest

from harness import REPO
from tailguard_runtime.metrics import REJECTION_REASONS

ROOT = REPO
README = (ROOT / "README.md").read_text(encoding="utf-8")
DOCS = sorted((ROOT / "docs").glob("*.md"))
PAGES = [ROOT / "README.md", *DOCS]
"""The pages a user reads: the README and every page under docs/."""
LINKED_PAGES = [*PAGES, ROOT / "benchmarks" / "README.md"]
"""The pages whose relative links must resolve (benchmarks/README.md is linked from them)."""


def page_id(page: Path) -> str:
    return page.resolve().relative_to(ROOT.resolve()).as_posix()


def shell_lines(markdown: str) -> list[str]:
    """The lines of the Markdown's ```bash and ```sh blocks."""
    return [line for block in re.findall(r"```(?:bash|sh)\n(.*?)```", markdown, re.S)
            for line in block.splitlines()]


def test_every_rejection_reason_is_explained_in_the_runtime_page() -> None:
    """The rejection-reason table lives in docs/runtime.md (the README links it)."""
    text = (ROOT / "docs" / "runtime.md").read_text(encoding="utf-8")
    rows = dict(re.findall(r"^\| `(\w+)` \| ([^|]+) \|", text, re.M))
    for reason in REJECTION_REASONS:
        assert reason in rows, f"rejection reason {reason!r} is not in docs/runtime.md's table"


@pytest.mark.parametrize("page", PAGES, ids=page_id)
def test_commands_run_as_printed_from_a_fresh_shell(page: Path) -> None:
    """After `make up`, `tailguard` is in .venv/bin, not on PATH: no command in the README or a
    page under docs/ may start with a bare `tailguard`."""
    bare = [line for line in shell_lines(page.read_text(encoding="utf-8"))
            if re.match(r"\s*tailguard\s", line)]
    assert not bare, bare


def without_fences(markdown: str) -> str:
    """The Markdown without its fenced code blocks."""
    return re.sub(r"^(```|~~~).*?^\1[ \t]*$", "", markdown, flags=re.S | re.M)


def without_code(markdown: str) -> str:
    """The Markdown with its fenced blocks and inline code spans blanked out (a link inside code
    is not one)."""
    return re.sub(r"`[^`\n]*`", "``", without_fences(markdown))


def heading_anchors(markdown: str) -> set[str]:
    """The anchors GitHub gives the page's headings: lower case, punctuation dropped, spaces
    as hyphens, a repeated one numbered."""
    anchors: set[str] = set()
    for heading in re.findall(r"^#{1,6}[ \t]+(.+?)[ \t#]*$", without_fences(markdown), re.M):
        slug = re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")
        anchor, n = slug, 0
        while anchor in anchors:
            n += 1
            anchor = f"{slug}-{n}"
        anchors.add(anchor)
    return anchors


def relative_links(markdown: str) -> list[str]:
    """The targets of the page's inline links and images that point into the repository."""
    targets = re.findall(r"\]\(<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\)", without_code(markdown))
    return [t for t in targets if not re.match(r"[a-z][a-z0-9+.-]*:", t, re.I)]


@pytest.mark.parametrize("page", LINKED_PAGES, ids=page_id)
def test_every_relative_link_points_at_a_file_that_exists(page: Path) -> None:
    """Each relative link in the README, the pages under docs/ and benchmarks/README.md names a
    file or folder that exists, and an anchor into a Markdown page names one of its headings."""
    links = relative_links(page.read_text(encoding="utf-8"))
    broken = []
    for link in links:
        path, _, anchor = link.partition("#")
        target = (page.parent / path).resolve() if path else page
        if not target.exists():
            broken.append(f"{link}: no such file")
        elif anchor and target.suffix == ".md" and anchor not in heading_anchors(
                target.read_text(encoding="utf-8")):
            broken.append(f"{link}: no heading #{anchor} in {page_id(target)}")
    assert not broken, broken


def test_the_link_check_sees_the_readmes_links() -> None:
    """The pattern finds links at all, and knows a broken one and a heading's anchor."""
    links = relative_links(README)
    assert "docs/runtime.md" in links and "docs/guard.md" in links
    assert relative_links("see [`x`](docs/nope.md#a) and `[y](z.md)` and [w](https://x.y/)") == [
        "docs/nope.md#a"]
    assert "hostile-clients-soakpy" in heading_anchors("## Hostile clients (`soak.py`)\n")
    assert "what-make-up-gives-you" in heading_anchors(README)


def test_readme_layout_names_the_charts_pod_monitor() -> None:
    assert (ROOT / "charts" / "tailguard" / "templates" / "podmonitor.yaml").exists()
    layout = README[README.index("## Layout"):]
    assert "PodMonitor" in layout and "ServiceMonitor" not in layout


def test_bench_readme_names_no_development_machine_path() -> None:
    text = (ROOT / "benchmarks" / "README.md").read_text(encoding="utf-8")
    assert not re.search(r"(?<![\w.])/(work|home|Users)/", text)


def make_dry_run(venv: Path, *extra: str) -> str:
    done = subprocess.run(["make", "-n", "-C", str(ROOT), "up", f"VENV={venv}", "PORT=9191",
                           *extra], capture_output=True, text=True, timeout=60,
                          env={**os.environ, "MAKEFLAGS": ""})
    assert done.returncode == 0, done.stderr
    return done.stdout


@pytest.fixture
def installed_venv(tmp_path: Path) -> Path:
    """A stand-in venv folder whose install stamp is newer than pyproject.toml and
    constraints.txt (make -n only compares times; nothing in it runs)."""
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    (venv / "bin" / "python").write_text("")
    stamp = venv / ".installed"
    stamp.write_text("")
    newest = max((ROOT / name).stat().st_mtime for name in ("pyproject.toml", "constraints.txt"))
    os.utime(stamp, (newest + 60, newest + 60))
    return venv


def test_make_up_does_not_reinstall_when_nothing_changed(installed_venv: Path) -> None:
    planned = make_dry_run(installed_venv)
    assert "pip install" not in planned
    assert f"{installed_venv}/bin/tailguard up examples/digits.yaml --port 9191" in planned


@pytest.mark.parametrize("changed", ["pyproject.toml", "constraints.txt"])
def test_make_up_reinstalls_when_the_dependencies_changed(installed_venv: Path,
                                                          changed: str) -> None:
    assert "pip install" in make_dry_run(installed_venv, "-W", changed)


def test_make_tests_workers_run_each_module_as_one_group(request: pytest.FixtureRequest) -> None:
    """Under ``make test`` (pytest-xdist, ``--dist loadgroup``) each worker sees this test's id
    with its group appended, the sign that the groups of ``tests/conftest.py`` reached the
    scheduler: without them a module's server fixtures start once per worker, and the control
    plane twice. pytest 9.2 broke that silently (pytest-dev/pytest-xdist#1386)."""
    if not getattr(request.config.option, "loadgroup", False):
        return  # not under make test: there are no groups to check
    module = request.node.nodeid.split("::", 1)[0]
    assert request.node.nodeid.endswith(f"@{module}"), request.node.nodeid
