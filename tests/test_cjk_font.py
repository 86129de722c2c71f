"""Figures render Chinese with the font the course ships (slotmap/viz/fonts/, made by
scripts/cjk_font.py), on a machine with no CJK font of its own."""

from __future__ import annotations

import io
import warnings
from pathlib import Path

import pytest

pytest.importorskip("matplotlib")

ROOT = Path(__file__).resolve().parents[1]
CHINESE = "槽位映射：块表把逻辑块号翻译为物理块号（上下文并行、环形缓存、预填充与解码）"


def render(text: str) -> list[str]:
    """Draw ``text`` in a course figure's title, box label and legend; the glyph warnings."""
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib import pyplot as plt

    from slotmap.viz import style

    fig, (ax,) = style.figure(1)
    ax.set_title(text)
    style.boxes(ax, 0, ["#ffffff"], [text[:4]])
    ax.plot([0, 1], [0, 1], label=text[-6:])
    ax.legend()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for kind in ("png", "svg"):
            fig.savefig(io.BytesIO(), format=kind)
    plt.close(fig)
    return [str(w.message) for w in caught if "missing from" in str(w.message)]


def test_a_figure_with_chinese_text_has_every_glyph():
    assert render(CHINESE) == []
    assert render("全角标点：，。；？！“引号” 与 half-width (1, 2)") == []


def test_without_the_course_font_the_same_figure_misses_glyphs(monkeypatch):
    """The check above can fail: DejaVu Sans alone lacks every hanzi."""
    from matplotlib import font_manager, rcParams

    from slotmap.viz import style

    monkeypatch.setattr(style, "use_cjk_font", lambda: "DejaVu Sans")
    monkeypatch.setitem(rcParams, "font.family", ["DejaVu Sans"])
    font_manager.fontManager.__dict__.pop("_findfont_cached", None)
    assert any("missing from font" in w for w in render(CHINESE))


def test_the_font_has_every_character_the_course_writes_in_chinese():
    """A translation that uses a character the shipped subset lacks fails here: run
    scripts/cjk_font.py again (it reads the same sources)."""
    from fontTools.ttLib import TTFont

    from slotmap.viz.style import CJK_FONT

    import_path = ROOT / "scripts"
    import sys

    sys.path.insert(0, str(import_path))
    try:
        import cjk_font
    finally:
        sys.path.remove(str(import_path))
    cmap = TTFont(CJK_FONT).getBestCmap()
    needed = {c for c in cjk_font.course_characters(ROOT) if not c.isspace()}
    dejavu_has = {c for c in needed if ord(c) < 0x2E80}  # Latin, Greek, arrows: DejaVu Sans
    lacking = sorted(c for c in needed - dejavu_has if ord(c) not in cmap)
    assert lacking == [], "".join(lacking)
    assert CJK_FONT.stat().st_size < 3 * 1024 * 1024
