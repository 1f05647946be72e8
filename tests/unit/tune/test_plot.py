"""The tune plot is a real PNG with the grid, the SLO line and the chosen point."""

from __future__ import annotations

from pathlib import Path

from PIL import Image

from tailguard.tune.grid import PointResult, Policy
from tailguard.tune.plot import plot_tune
from tailguard.tune.rawtable import RawRow

TABLE = [RawRow(1, 50, 1.0, 1.2, 1_000), RawRow(8, 40, 1.5, 1.8, 5_300)]
POINTS = [PointResult(Policy(b, w), rps, 1.0, 2.0, p99, p99 <= 50)
          for b, w, rps, p99 in ((8, 0, 900, 10), (32, 0, 2_000, 30), (8, 5, 950, 20),
                                 (32, 5, 2_100, 60))]


def colours(path: Path) -> set[tuple[int, ...]]:
    with Image.open(path) as image:
        assert image.format == "PNG" and image.size == (1500, 480)
        return {c for _, c in image.convert("RGB").getcolors(maxcolors=1 << 20) or []}


def test_the_plot_is_a_png_with_the_chosen_point_marked(tmp_path: Path) -> None:
    marked = plot_tune(tmp_path / "marked.png", POINTS, TABLE, 50, Policy(32, 0), title="t")
    plain = plot_tune(tmp_path / "plain.png", POINTS, TABLE, 50, None)
    gold = (255, 215, 0)  # matplotlib's "gold", the chosen point's star
    assert gold in colours(marked)
    assert gold not in colours(plain)
    assert (255, 0, 0) in colours(plain)  # the SLO line


def test_invalid_points_are_crossed_in_purple(tmp_path: Path) -> None:
    lagged = PointResult(Policy(64, 0), 2_500, 1.0, 2.0, 80, False, "lag", invalid=True)
    crossed = plot_tune(tmp_path / "crossed.png", [*POINTS, lagged], TABLE, 50, None)
    plain = plot_tune(tmp_path / "plain.png", POINTS, TABLE, 50, None)
    purple = (128, 0, 128)  # matplotlib's "purple"
    assert purple in colours(crossed) and purple not in colours(plain)
    assert lagged.verdict == "invalid" and POINTS[0].verdict == "meets the SLO"


def test_points_without_answers_are_left_out_of_the_p99_panel(tmp_path: Path) -> None:
    points = [*POINTS, PointResult(Policy(128, 0), 0.0, None, None, None, False, "no answers")]
    path = plot_tune(tmp_path / "p.png", points, [], 50, None)
    assert path.stat().st_size > 10_000


def test_the_raw_table_and_sweep_plots_are_pngs(tmp_path: Path) -> None:
    from tailguard.tune.plot import plot_raw, plot_sweep

    raw = plot_raw(tmp_path / "raw.png", {"primary": [r.as_dict() for r in TABLE],
                                          "fallback": [r.as_dict() for r in TABLE]})
    runs = [{"offered_rps": rate, "achieved_rps": rate * 0.98, "latency_ms": {"p99": p99}}
            for rate, p99 in ((25, 10.0), (50, 20.0), (100, None))]
    sweep = plot_sweep(tmp_path / "sweep.png", runs, 50)
    for path in (raw, sweep):
        with Image.open(path) as image:
            assert image.format == "PNG" and image.size == (1000, 400)
    assert (255, 0, 0) in colours_of(sweep)  # the SLO line


def colours_of(path: Path) -> set[tuple[int, ...]]:
    with Image.open(path) as image:
        return {c for _, c in image.convert("RGB").getcolors(maxcolors=1 << 20) or []}
