"""The one Markdown table writer."""

from __future__ import annotations

from tailguard._util.markdown import table


def test_a_table_aligns_numbers_right_and_keeps_every_cell_inside_its_column() -> None:
    text = table(["name", "ms"], [["a|b", 1.5], ["two\nlines", None]], align="lr")
    assert text.splitlines() == ["| name | ms |", "|---|---:|", "| a\\|b | 1.5 |",
                                 "| two lines | - |"]


def test_a_table_with_no_rows_is_its_head() -> None:
    assert table(["a", "b", "c"], []) == "| a | b | c |\n|---|---|---|"
