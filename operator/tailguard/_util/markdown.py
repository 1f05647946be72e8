"""The one Markdown table writer of the tools (``tailguard report``'s card, the raw model table,
the benchmarks' tables)."""

from __future__ import annotations

from typing import Any, Iterable, Sequence


def table(head: Sequence[str], rows: Iterable[Sequence[Any]], align: str = "") -> str:
    """A GitHub-flavoured Markdown table, as lines joined by newlines (no trailing newline).

    ``align`` has one letter per column, ``l`` (the default for a missing letter) or ``r``
    (numbers); ``None`` cells are written ``-``; a ``|`` or newline inside a cell is escaped
    or folded so a cell never breaks the table.
    """
    rule = ["---:" if align[i:i + 1] == "r" else "---" for i in range(len(head))]
    lines = ["| " + " | ".join(head) + " |", "|" + "|".join(rule) + "|"]
    lines += ["| " + " | ".join(_cell(v) for v in row) + " |" for row in rows]
    return "\n".join(lines)


def _cell(value: Any) -> str:
    text = "-" if value is None else str(value)
    return text.replace("|", "\\|").replace("\n", " ")
