"""The project's images for the real node, as ``hack/image/build.py`` builds them (cached)."""

from __future__ import annotations

import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

from harness import REPO

BUILDER = REPO / "hack" / "image" / "build.py"


class ImageError(RuntimeError):
    """The images could not be built (the builder's last line says why)."""


@dataclass(frozen=True)
class Image:
    """One OCI archive and the reference containerd gives it on import."""

    archive: Path
    ref: str

    @property
    def repository(self) -> str:
        """The reference without its tag, as a chart's ``image.repository`` takes it."""
        return self.ref.rpartition(":")[0]

    @property
    def tag(self) -> str:
        return self.ref.rpartition(":")[2]


def node_images() -> dict[str, Image]:
    """``pause``, ``runtime`` and ``operator``, built or found in the cache.

    Raises:
        ImageError: the builder failed (its progress and error went to our stderr).
    """
    done = subprocess.run([shutil.which("python3") or "python3", str(BUILDER)],
                          stdout=subprocess.PIPE, text=True)
    if done.returncode != 0:
        raise ImageError(f"{BUILDER} failed (exit {done.returncode}); see its last line above")
    images = {}
    for line in done.stdout.splitlines():
        archive, _, ref = line.partition("\t")
        name = ref.rpartition("/")[2].partition(":")[0]
        images[name] = Image(Path(archive), ref)
    missing = {"pause", "runtime", "operator"} - set(images)
    if missing:
        raise ImageError(f"{BUILDER} printed no {', '.join(sorted(missing))} image")
    return images
