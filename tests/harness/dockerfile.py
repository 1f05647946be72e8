"""A Dockerfile read as docker reads it, for tests that cannot run docker: global ARGs, stages,
stages built FROM an earlier stage, what ``docker build --target`` builds, and what a
``docker build`` command line asks for.

Only what this repository's Dockerfile uses is understood: comments, line continuations, ``ARG``
before the first ``FROM``, ``FROM image [AS name]`` with ``${ARG}`` in the image, and every other
instruction kept as its raw text.
"""

from __future__ import annotations

import json
import posixpath
import re
import shlex
from dataclasses import dataclass, field
from pathlib import Path

from harness import REPO


@dataclass
class Stage:
    """One ``FROM`` and the instructions after it."""

    base: str
    """The ``FROM`` argument with global ARGs filled in: an image, or an earlier stage's name."""
    name: str | None
    instructions: list[tuple[str, str]] = field(default_factory=list)
    """(INSTRUCTION, raw text after it), in order."""

    def args(self, instruction: str) -> list[str]:
        return [a for i, a in self.instructions if i == instruction]

    def exec_form(self, instruction: str) -> list[str]:
        (raw,) = self.args(instruction)
        value = json.loads(raw)
        assert isinstance(value, list), f"{instruction} must use the exec (JSON) form"
        return value

    def env(self) -> dict[str, str]:
        out: dict[str, str] = {}
        for raw in self.args("ENV"):
            for item in shlex.split(raw):
                key, _, value = item.partition("=")
                out[key] = value
        return out

    def copies_from(self) -> list[tuple[str, list[str]]]:
        """``COPY --from=STAGE SRC... DEST``: (STAGE, [SRC..., DEST]) for each."""
        out = []
        for raw in self.args("COPY"):
            words = raw.split()
            if words[0].startswith("--from="):
                out.append((words[0].partition("=")[2], words[1:]))
        return out


@dataclass
class Dockerfile:
    args: dict[str, str]
    """Global ARG defaults (the ARGs before the first FROM)."""
    stages: list[Stage]

    def stage(self, name: str) -> Stage:
        (found,) = [s for s in self.stages if s.name == name]
        return found

    def parent(self, stage: Stage) -> Stage | None:
        """The earlier stage ``stage`` is built FROM, or ``None`` when it starts from an image."""
        before = self.stages[:self.stages.index(stage)]
        named = [s for s in before if s.name is not None and s.name.lower() == stage.base.lower()]
        return named[-1] if named else None

    def chain(self, stage: Stage) -> list[Stage]:
        """``stage`` and the stages it is built FROM, the one starting from an image first."""
        out = [stage]
        while (up := self.parent(out[0])) is not None:
            out.insert(0, up)
        return out

    def image(self, stage: Stage) -> str:
        """The image at the bottom of ``stage``'s chain."""
        return self.chain(stage)[0].base

    def target(self, name: str | None) -> Stage:
        """The stage ``docker build --target NAME`` produces; the last one without ``--target``."""
        return self.stages[-1] if name is None else self.stage(name)

    def env(self, stage: Stage) -> dict[str, str]:
        """The ENV values ``stage`` sees, its chain's included (without expanding ``$VAR``)."""
        out: dict[str, str] = {}
        for s in self.chain(stage):
            out.update(s.env())
        return out

    def runs(self, stage: Stage) -> list[str]:
        """Every RUN of ``stage``'s chain, in order."""
        return [run for s in self.chain(stage) for run in s.args("RUN")]


def parse(path: Path | str) -> Dockerfile:
    """Parse the Dockerfile at ``path`` (relative paths from the repository root)."""
    text = (REPO / path).read_text(encoding="utf-8")
    logical = re.sub(r"\\\n\s*", " ", "\n".join(
        line for line in text.splitlines() if not line.lstrip().startswith("#")))
    args: dict[str, str] = {}
    stages: list[Stage] = []
    for line in logical.splitlines():
        if not line.strip():
            continue
        instruction, _, rest = line.strip().partition(" ")
        instruction = instruction.upper()
        if instruction == "FROM":
            parts = rest.split()
            name = parts[2] if len(parts) == 3 and parts[1].upper() == "AS" else None
            base = re.sub(r"\$\{(\w+)\}", lambda m: args[m.group(1)], parts[0])
            stages.append(Stage(base, name))
        elif instruction == "ARG" and not stages:
            key, _, value = rest.partition("=")
            args[key] = value
        else:
            stages[-1].instructions.append((instruction, rest.strip()))
    return Dockerfile(args, stages)


@dataclass(frozen=True)
class Build:
    """What one ``docker build`` command line asks for."""

    context: str
    dockerfile: str
    """The Dockerfile's path: ``-f`` as given, or ``Dockerfile`` in the context."""
    target: str | None
    tags: tuple[str, ...]


def build_command(argv: list[str]) -> Build:
    """Read ``docker build [--target T] [-t TAG]... [-f FILE] CONTEXT``; other flags fail."""
    assert argv[:2] == ["docker", "build"], argv
    rest = argv[2:]
    values: dict[str, list[str]] = {"--target": [], "-t": [], "-f": []}
    positional = []
    i = 0
    while i < len(rest):
        if rest[i] in values:
            values[rest[i]].append(rest[i + 1])
            i += 2
        else:
            assert not rest[i].startswith("-"), f"unexpected flag {rest[i]} in {argv}"
            positional.append(rest[i])
            i += 1
    (context,) = positional
    assert len(values["--target"]) <= 1 and len(values["-f"]) <= 1, argv
    dockerfile = values["-f"][0] if values["-f"] else posixpath.normpath(
        posixpath.join(context, "Dockerfile"))
    target = values["--target"][0] if values["--target"] else None
    return Build(context, dockerfile, target, tuple(values["-t"]))


def pip_installs(run: str) -> list[list[str]]:
    """The arguments of each ``pip install`` in a RUN's shell text (split at ``&&``)."""
    out = []
    for command in run.split("&&"):
        argv = shlex.split(command)
        for i, word in enumerate(argv[:-1]):
            if (word == "pip" or word.endswith("/pip")) and argv[i + 1] == "install":
                out.append(argv[i + 2:])
    return out


def requirement_extras(requirement: str) -> tuple[str, frozenset[str]]:
    """``.[a,b]`` -> (``.``, {a, b}); a requirement without extras gets an empty set."""
    match = re.fullmatch(r"([^\[\]]+)(?:\[([^\]]*)\])?", requirement)
    assert match is not None, requirement
    extras = match.group(2) or ""
    return match.group(1), frozenset(e.strip() for e in extras.split(",") if e.strip())
