"""One look for every lesson's figure: colours, sizes and the boxes most figures are made of."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure


# Requests are told apart by colour in every figure (colour-blind-safe Okabe-Ito order).
REQUEST_COLOURS = ("#0072B2", "#E69F00", "#009E73", "#CC79A7", "#56B4E9", "#D55E00", "#F0E442")
EMPTY = "#f2f2f2"  # a slot or entry nobody uses
PAD = "#bdbdbd"  # PAD_ID / no slot
EDGE = "#4d4d4d"
HIGHLIGHT = "#d62728"  # what went wrong
FONT_SIZE = 9
WIDTH = 10.0  # inches: fits JupyterLab's default notebook width


# Chinese text: a subset of Noto Sans CJK SC shipped with the course (scripts/cjk_font.py makes
# it), the fallback for every glyph the default font lacks.
CJK_FONT = Path(__file__).resolve().parent / "fonts" / "NotoSansCJKsc-Regular-subset.otf"


def use_cjk_font() -> str:
    """Register the course's Chinese font with matplotlib and put it after the default family
    (a glyph DejaVu Sans lacks comes from it); returns its family name. Idempotent."""
    from matplotlib import font_manager, rcParams

    name = font_manager.FontProperties(fname=CJK_FONT).get_name()
    if str(CJK_FONT) not in {font.fname for font in font_manager.fontManager.ttflist}:
        font_manager.fontManager.addfont(str(CJK_FONT))
    if name not in rcParams["font.family"]:
        rcParams["font.family"] = [*rcParams["font.family"], name]
    return name


def monospace() -> list[str]:
    """The font family of a monospace text: a generic family resolves to one font, so the
    Chinese font is its own fallback after it."""
    return ["monospace", use_cjk_font()]


def request_colour(request: int) -> str:
    return REQUEST_COLOURS[request % len(REQUEST_COLOURS)]


def figure(
    rows: int = 1, height_per_row: float = 1.4, width: float = WIDTH, **kwargs: Any
) -> tuple[Figure, list[Axes]]:
    """A figure of ``rows`` stacked axes with the course's defaults, axes without spines."""
    import matplotlib.pyplot as plt

    use_cjk_font()
    fig, axes = plt.subplots(
        rows, 1, figsize=(width, height_per_row * rows), squeeze=False, **kwargs
    )
    for ax in axes[:, 0]:
        ax.set_axis_off()
    return fig, list(axes[:, 0])


def boxes(
    ax,
    y: float,
    colours: Sequence[str],
    labels: Sequence[str] | None = None,
    *,
    gids: Sequence[str] | str | None = None,
    text_gid: str | None = None,
    x0: float = 0.0,
    width: float = 1.0,
    height: float = 0.8,
    text_colour: str = "black",
    edge: str = EDGE,
    font_size: float = FONT_SIZE,
) -> list:
    """A row of labelled boxes starting at ``x0``; returns the Rectangle patches. ``gids``
    (one for all, or one a box) and ``text_gid`` tag them, so that tests can count them."""
    from matplotlib.patches import Rectangle

    if gids is None or isinstance(gids, str):
        gids = [gids] * len(colours)
    patches = []
    for index, (colour, gid) in enumerate(zip(colours, gids, strict=True)):
        x = x0 + index * width
        patch = Rectangle((x, y), width, height, facecolor=colour, edgecolor=edge, gid=gid)
        patch.set_linewidth(0.6)
        ax.add_artist(patch)
        patches.append(patch)
        if labels is not None and labels[index] != "":
            font = {"fontsize": font_size, "color": text_colour, "gid": text_gid}
            ax.text(
                x + width / 2, y + height / 2, str(labels[index]), ha="center", va="center", **font
            )
    return patches
