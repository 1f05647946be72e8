#!/usr/bin/env python3
"""Copy the CRDs from ``crds/`` (the one source) to the two places that ship them.

    python3 hack/copy_crds.py           # write the copies (make crds)
    python3 hack/copy_crds.py --check   # exit 1, naming each copy that differs (tests, CI)

Each ``crds/NAME.yaml`` goes to:

- ``operator/tailguard/spec/crd/NAME.yaml``: package data, read by ``spec.crd()`` in
  ``tailguard up``, the operator and its image (which installs only the Python packages);
- ``charts/tailguard/files/NAME.yaml``: what the chart's ``templates/crd.yaml`` renders.

Real files, not links: a checkout without symlink support (Windows without developer mode,
some archive tools) would turn a link into a one-line text file and break both. Each copy starts
with a comment naming its source; the rest is the source byte for byte. Standard library only,
so it runs before any install.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SOURCE_DIR = "crds"
COPY_DIRS = ("operator/tailguard/spec/crd", "charts/tailguard/files")


def header(source: str) -> str:
    """The comment each copy starts with; ``source`` is the repository-relative source path."""
    return (f"# A copy of {source}, written by `make crds` (hack/copy_crds.py): edit that file,\n"
            "# then run `make crds`; tests/test_crd_copies.py fails while the copies differ.\n")


def expected(root: Path) -> dict[Path, bytes]:
    """Every copy under ``root`` and the bytes it must hold.

    Raises:
        FileNotFoundError: ``root/crds`` holds no ``*.yaml`` file.
    """
    sources = sorted((root / SOURCE_DIR).glob("*.yaml"))
    if not sources:
        raise FileNotFoundError(f"no CRD in {root / SOURCE_DIR}")
    out: dict[Path, bytes] = {}
    for source in sources:
        text = header(f"{SOURCE_DIR}/{source.name}").encode() + source.read_bytes()
        for copy_dir in COPY_DIRS:
            out[root / copy_dir / source.name] = text
    return out


def stale(root: Path) -> list[Path]:
    """The copies under ``root`` that are missing, are links, or differ from their source."""
    return [path for path, text in expected(root).items()
            if path.is_symlink() or not path.is_file() or path.read_bytes() != text]


def write(root: Path) -> list[Path]:
    """Write every stale copy under ``root`` (a link is replaced by a file); return them."""
    changed = stale(root)
    wanted = expected(root)
    for path in changed:
        if path.is_symlink():
            path.unlink()
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(wanted[path])
    return changed


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true",
                        help="write nothing; exit 1 if a copy differs from crds/")
    parser.add_argument("--root", type=Path, default=REPO, help="repository root")
    args = parser.parse_args(argv)
    if args.check:
        bad = stale(args.root)
        for path in bad:
            print(f"{path.relative_to(args.root)} differs from {SOURCE_DIR}/{path.name}; "
                  "run `make crds`", file=sys.stderr)
        return 1 if bad else 0
    for path in write(args.root):
        print(f"wrote {path.relative_to(args.root)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
