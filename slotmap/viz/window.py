"""Lesson 03's figures and widgets: the bounded-window gather, drawn from real kernel runs.

* ``draw_windows``: for one request, which block-table entries each tile's window loaded (the
  window bases the kernel recorded with ``window_trace``) and which entries its lanes picked
  (read back from the slots the kernel wrote).
* ``draw_window_failure``: what goes wrong when the window precondition breaks (positions
  shuffled across tiles) or the window loses its +1, and what the launcher says about it.

Patches carry a ``gid`` ("token", "entry", "picked", "window", "wrong", ...) so tests can
count what a figure shows.
"""

from __future__ import annotations

import random
import textwrap
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from slotmap.backend import DEVICE
from slotmap.exercises.lesson03 import launch_production_with_window
from slotmap.i18n import ENGLISH, N_, _, language, tr
from slotmap.kernels.slot_mapping import compute_slot_mapping
from slotmap.layout import cdiv, next_power_of_2, window_size
from slotmap.reference import slot_mapping_oracle, window_bases_oracle
from slotmap.viz.draw import key, legend, row_label
from slotmap.viz.style import EDGE, EMPTY, FONT_SIZE, HIGHLIGHT, boxes, figure, monospace

if TYPE_CHECKING:
    from ipywidgets import VBox
    from matplotlib.figure import Figure


TILE_COLOURS = ("#0072B2", "#E69F00", "#009E73", "#CC79A7", "#56B4E9", "#D55E00")
WINDOW_FILL = "#fff4c2"  # entries a window loaded that no lane picked
PAST_ROW = "#ffffff"  # window entries past the row's end: masked, never loaded
FAILURE_MODES = (N_("contiguous"), N_("shuffled across tiles"), N_("window without its +1"))


def tile_colour(tile: int) -> str:
    return TILE_COLOURS[tile % len(TILE_COLOURS)]


def example_block_table(entries: int, seed: int = 3) -> list[int]:
    """A block-table row of distinct, shuffled physical blocks (as an allocator leaves them)."""
    numbers = list(range(10, 10 + 2 * entries))
    random.Random(seed).shuffle(numbers)
    return numbers[:entries]


def _request(positions: list[int], row: list[int]):
    """(query_start_loc, positions, block_table) of one request on the active backend."""
    qsl = torch.tensor([0, len(positions)], dtype=torch.int32, device=DEVICE)
    pos = torch.tensor(positions, dtype=torch.int64, device=DEVICE)
    return qsl, pos, torch.tensor([row], dtype=torch.int32, device=DEVICE)


@dataclass
class WindowRun:
    """One request through the production kernel, with its window trace."""

    positions: list[int]
    block_table_row: list[int]
    block_size: int
    tile_size: int
    window: int
    slots: list[int]  # what the kernel wrote
    expected: list[int]  # the oracle
    bases: list[int]  # window base of each tile, as the kernel recorded it
    expected_bases: list[int]  # window_bases_oracle

    @property
    def tiles(self) -> int:
        return len(self.bases)

    def tile_tokens(self, tile: int) -> range:
        start = tile * self.tile_size
        return range(start, min(start + self.tile_size, len(self.positions)))

    def picked_entries(self, tile: int) -> set[int]:
        """Block-table entries the tile's lanes picked, read back from the kernel's slots."""
        index_of = {block: entry for entry, block in enumerate(self.block_table_row)}
        return {
            index_of.get(self.slots[token] // self.block_size, -1)
            for token in self.tile_tokens(tile)
        }


def run_windows(
    tile_size: int, block_size: int, first_position: int, num_tokens: int
) -> WindowRun:
    """One request of ``num_tokens`` contiguous positions from ``first_position``, through
    ``compute_slot_mapping`` with a window trace."""
    positions = list(range(first_position, first_position + num_tokens))
    entries = (positions[-1] // block_size + 1 if positions else 1) + 2
    row = example_block_table(entries)
    qsl, pos, table = _request(positions, row)
    tiles = cdiv(num_tokens, tile_size)
    trace = torch.full((1, max(tiles, 1)), -1, dtype=torch.int32, device=DEVICE)
    options = {"tile_size": tile_size, "window_trace": trace}
    slots = compute_slot_mapping(qsl, pos, table, block_size, **options).cpu().tolist()
    expected = slot_mapping_oracle(qsl.cpu(), pos.cpu(), table.cpu(), block_size).tolist()
    bases = window_bases_oracle(qsl.cpu(), pos.cpu(), block_size, tile_size=tile_size)[0]
    window = window_size(tile_size, block_size)
    traced = trace.cpu()[0, :tiles].tolist()
    return WindowRun(positions, row, block_size, tile_size, window, slots, expected, traced, bases)


def _window_outline(ax, base: int, window: int, row_length: int, y: float, colour: str):
    """A thick frame around entries [base, base + window); the part past the row is dashed."""
    from matplotlib.patches import Rectangle

    inside = max(0, min(window, row_length - base))
    frame = Rectangle((base - 0.08, y - 0.12), inside + 0.16, 1.04, fill=False, gid="window")
    frame.set(edgecolor=colour, linewidth=2.4)
    ax.add_artist(frame)
    if inside < window:
        past = Rectangle((base + inside, y - 0.12), window - inside, 1.04, fill=False)
        past.set(edgecolor=colour, linewidth=1.4, linestyle="--", gid="window-past-row")
        ax.add_artist(past)
    return frame


def draw_windows(
    tile_size: int = 8, block_size: int = 4, first_position: int = 5, num_tokens: int = 22
) -> Figure:
    """Which block-table entries each tile's window loaded, and which its lanes picked.

    Runs ``compute_slot_mapping`` on the active backend for one request of ``num_tokens``
    contiguous positions from ``first_position``; returns a matplotlib Figure.
    """
    return draw_windows_run(run_windows(tile_size, block_size, first_position, num_tokens))


def draw_windows_run(run: WindowRun) -> Figure:
    """Draw a ``WindowRun`` (see ``draw_windows``)."""
    tile_size, block_size = run.tile_size, run.block_size
    row = run.block_table_row
    width = max(len(run.positions), len(row) + run.window)
    fig, axes = figure(rows=1 + run.tiles, height_per_row=0.7)
    fig.set_figheight(fig.get_figheight() + 1.2)  # title, legend, entry numbers
    height = fig.get_figheight()
    top, bottom = 1 - 0.95 / height, 0.3 / height
    fig.subplots_adjust(left=0.2, right=0.98, top=top, bottom=bottom, hspace=0.5)
    colours = [tile_colour(t) for t in range(run.tiles) for _ in run.tile_tokens(t)]
    labels = [str(p) for p in run.positions]
    boxes(axes[0], 0, colours, labels, gids="token", text_colour="white", font_size=FONT_SIZE - 1)
    row_label(axes[0], 0, _("positions\n(by tile)"), -0.6)
    mismatched = [t for t in range(run.tiles) if run.bases[t] != run.expected_bases[t]]
    for tile in range(run.tiles):
        _paint_tile(axes[1 + tile], run, tile, tile in mismatched)
    grey = {"color": "#555555", "fontsize": FONT_SIZE - 1}
    for entry in range(len(row)):
        axes[-1].text(entry + 0.5, -0.2, str(entry), ha="center", va="top", **grey)
    axes[-1].text(-0.6, -0.45, _("entry = logical block"), ha="right", va="center", **grey)
    for ax in axes:
        ax.set_xlim(-0.2, width + 0.2)
        ax.set_ylim(-0.3, 1.05)
    wrong = sum(g != e for g, e in zip(run.slots, run.expected, strict=True))
    verdict = (
        _("kernel's slots = reference")
        if wrong == 0
        else _("{wrong} slots differ from the reference").format(wrong=wrong)
    )
    trace = (
        _("recorded window bases = window_bases_oracle")
        if not mismatched
        else _("window bases of tiles {tiles} differ from window_bases_oracle").format(
            tiles=mismatched
        )
    )
    title = _(
        "One request, blocks of {block_size}, tiles of {tile_size}: BLOCK_TABLE_WINDOW_SIZE = "
        "next_pow2(cdiv({tile_size}, {block_size}) + 1) = {window}\n{verdict}; {trace}"
    )
    sizes = {"block_size": block_size, "tile_size": tile_size, "window": run.window}
    fig.suptitle(title.format(**sizes, verdict=verdict, trace=trace), fontsize=FONT_SIZE + 1)
    handles = [
        key(tile_colour(0), _("picked by a lane of the tile")),
        key(WINDOW_FILL, _("loaded by the window, unused")),
        key(EMPTY, _("not loaded")),
        key("none", _("the window"), linewidth=2.4),
        key("none", _("past the row: masked"), linestyle="--"),
    ]
    legend(fig, handles, loc="upper right", bbox_to_anchor=(0.98, 1 - 0.5 / height), ncol=5)
    fig.slotmap_run = run  # what was drawn, for tests and curious learners
    return fig


def _paint_tile(ax, run: WindowRun, tile: int, mismatched: bool) -> None:
    """The block-table row as tile ``tile`` saw it: the entries its lanes picked, those its
    window loaded unused, the rest; its window framed (in red where the trace disagrees)."""
    row, base, picked = run.block_table_row, run.bases[tile], run.picked_entries(tile)
    fills = [
        tile_colour(tile)
        if e in picked
        else WINDOW_FILL
        if base <= e < base + run.window
        else EMPTY
        for e in range(len(row))
    ]
    gids = ["picked" if e in picked else "entry" for e in range(len(row))]
    boxes(ax, 0, fills, [str(b) for b in row], gids=gids, font_size=FONT_SIZE - 1)
    for entry in picked:
        ax.texts[entry].set_color("white")
    _window_outline(ax, base, run.window, len(row), 0, HIGHLIGHT if mismatched else EDGE)
    tokens = run.tile_tokens(tile)
    first, last = run.positions[tokens[0]], run.positions[tokens[-1]]
    caption = _("tile {tile}: positions {first}–{last}\nwindow = entries {base}–{end}").format(
        tile=tile, first=first, last=last, base=base, end=base + run.window - 1
    )
    row_label(ax, 0, caption, -0.6)


# ---------------------------------------------------------------------------------------------
# What goes wrong
# ---------------------------------------------------------------------------------------------
@dataclass
class FailureRun:
    mode: str
    positions: list[int]
    block_table_row: list[int]
    block_size: int
    tile_size: int
    window: int  # the window the kernel ran with
    slots: list[int]
    expected: list[int]
    launcher_message: str  # what compute_slot_mapping (validate=True) said
    accepted: bool = True  # whether it accepted the input

    @property
    def wrong_tokens(self) -> list[int]:
        return [
            t for t, (g, e) in enumerate(zip(self.slots, self.expected, strict=True)) if g != e
        ]


def run_failure(
    mode: str, tile_size: int, block_size: int, first_position: int, num_tokens: int, seed: int
) -> FailureRun:
    """One request through the kernel with the window precondition broken (or not)."""
    if mode not in FAILURE_MODES:
        raise ValueError(
            _("mode must be one of {modes}, got {mode!r}").format(modes=FAILURE_MODES, mode=mode)
        )
    positions = list(range(first_position, first_position + num_tokens))
    if mode == "shuffled across tiles":
        random.Random(seed).shuffle(positions)
    entries = max(positions) // block_size + 1
    row = example_block_table(entries, seed)
    qsl, pos, table = _request(positions, row)
    try:
        compute_slot_mapping(qsl, pos, table, block_size, tile_size=tile_size)
        message, accepted = _("compute_slot_mapping accepts this input."), True
    except ValueError as error:
        message = _("compute_slot_mapping raises ValueError: {error}").format(error=error)
        accepted = False
    if mode == "window without its +1":
        window = next_power_of_2(cdiv(tile_size, block_size))
        slots = launch_production_with_window(
            qsl, pos, table, block_size, window=window, tile_size=tile_size
        )
        message += _(
            " (Its window has the +1. This run launches the production kernel with "
            "BLOCK_TABLE_WINDOW_SIZE = next_pow2(cdiv({tile_size}, {block_size})) = {window}.)"
        ).format(tile_size=tile_size, block_size=block_size, window=window)
    else:
        window = window_size(tile_size, block_size)
        options = {"tile_size": tile_size, "validate": False}
        slots = compute_slot_mapping(qsl, pos, table, block_size, **options)
    expected = slot_mapping_oracle(qsl.cpu(), pos.cpu(), table.cpu(), block_size).tolist()
    sizes = (block_size, tile_size, window)
    found = slots.cpu().tolist()
    return FailureRun(mode, positions, row, *sizes, found, expected, message, accepted)


def draw_window_failure(
    mode: str = "shuffled across tiles",
    tile_size: int = 8,
    block_size: int = 4,
    first_position: int = 3,
    num_tokens: int = 24,
    seed: int = 0,
) -> Figure:
    """Positions, the reference's slots and the kernel's slots for one request; wrong slots
    in red, the launcher's verdict underneath. ``mode``: one of ``FAILURE_MODES``."""
    return draw_failure_run(
        run_failure(mode, tile_size, block_size, first_position, num_tokens, seed)
    )


def draw_failure_run(run: FailureRun) -> Figure:
    """Draw a ``FailureRun`` (see ``draw_window_failure``)."""
    mode, tile_size, block_size, num_tokens = (
        run.mode,
        run.tile_size,
        run.block_size,
        len(run.positions),
    )
    fig, axes = figure(rows=4, height_per_row=0.62)
    fig.subplots_adjust(left=0.16, right=0.98, top=0.84, bottom=0.02, hspace=0.3)
    wrong = set(run.wrong_tokens)
    tiles = [t // tile_size for t in range(num_tokens)]
    rows = [
        (_("positions\n(by tile)"), [tile_colour(t) for t in tiles], run.positions, "token"),
        (_("reference\nslots"), [EMPTY] * num_tokens, run.expected, "expected"),
        (
            _("kernel\nslots"),
            [HIGHLIGHT if t in wrong else "#8fd19e" for t in range(num_tokens)],
            run.slots,
            "kernel",
        ),
    ]
    for ax, (label, colours, values, gid) in zip(axes, rows, strict=False):
        text_colour = "white" if gid == "token" else "black"
        labels = [str(v) for v in values]
        gids = ["wrong" if gid == "kernel" and t in wrong else gid for t in range(len(values))]
        look = {"font_size": FONT_SIZE - 1, "text_colour": text_colour}
        boxes(ax, 0, colours, labels, gids=gids, **look)
        row_label(ax, 0, label, -0.5)
        ax.set_xlim(-0.2, max(num_tokens, 1) + 0.2)
        ax.set_ylim(-0.2, 1.0)
    ok = run.accepted
    # A CJK character is twice as wide as a monospace Latin one.
    columns = 108 if language() == ENGLISH else 60
    text = "\n".join(textwrap.wrap(run.launcher_message, columns))
    font = {
        "fontsize": FONT_SIZE - 0.5,
        "family": monospace(),
        "color": "black" if ok else HIGHLIGHT,
    }
    at = (0.02, axes[3].get_position().y1)  # in the figure, on the verdict's axes
    axes[3].text(*at, text, ha="left", va="top", transform=fig.transFigure, **font)
    title = _(
        "{mode}: blocks of {block_size}, tiles of {tile_size}, window of {window} "
        "entries — {wrong} of {tokens} slots wrong (red)"
    ).format(
        mode=tr(mode),
        block_size=block_size,
        tile_size=tile_size,
        window=run.window,
        wrong=len(wrong),
        tokens=num_tokens,
    )
    fig.suptitle(title, fontsize=FONT_SIZE + 1)
    fig.slotmap_run = run
    return fig


# ---------------------------------------------------------------------------------------------
# Widgets
# ---------------------------------------------------------------------------------------------
def window_widget(
    tile_size: int = 8, block_size: int = 4, first_position: int = 5, num_tokens: int = 22
) -> VBox:
    """``draw_windows`` with sliders for the tile size, block size, first position, length."""
    from slotmap.viz.live import choice, live_figure, slider

    controls = {
        "tile_size": choice(_("tile size"), [4, 8, 16, 32], tile_size),
        "block_size": slider(_("block size"), block_size, 1, 16),
        "first_position": slider(_("first position"), first_position, 0, 40),
        "num_tokens": slider(_("tokens"), num_tokens, 1, 40),
    }
    return live_figure(draw_windows, controls)


def window_failure_widget(
    mode: str = "shuffled across tiles",
    tile_size: int = 8,
    block_size: int = 4,
    first_position: int = 3,
    num_tokens: int = 24,
) -> VBox:
    """``draw_window_failure`` with a dropdown for what to break and sliders for the sizes."""
    from slotmap.viz.live import choice, live_figure, slider

    controls = {
        "mode": choice(_("break"), [(tr(m), m) for m in FAILURE_MODES], mode),
        "tile_size": choice(_("tile size"), [4, 8, 16], tile_size),
        "block_size": slider(_("block size"), block_size, 1, 8),
        "first_position": slider(_("first position"), first_position, 0, 16),
        "num_tokens": slider(_("tokens"), num_tokens, 1, 32),
        "seed": slider(_("shuffle seed"), 0, 0, 9),
    }
    return live_figure(draw_window_failure, controls)
