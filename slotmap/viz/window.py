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

import torch

from slotmap.backend import DEVICE
from slotmap.exercises.lesson03 import launch_production_with_window
from slotmap.kernels.slot_mapping import compute_slot_mapping
from slotmap.layout import cdiv, next_power_of_2, window_size
from slotmap.reference import slot_mapping_oracle, window_bases_oracle
from slotmap.viz.style import EDGE, EMPTY, FONT_SIZE, HIGHLIGHT, boxes, figure

TILE_COLOURS = ("#0072B2", "#E69F00", "#009E73", "#CC79A7", "#56B4E9", "#D55E00")
WINDOW_FILL = "#fff4c2"  # entries a window loaded that no lane picked
PAST_ROW = "#ffffff"  # window entries past the row's end: masked, never loaded
FAILURE_MODES = ("contiguous", "shuffled across tiles", "window without its +1")


def tile_colour(tile: int) -> str:
    return TILE_COLOURS[tile % len(TILE_COLOURS)]


def example_block_table(entries: int, seed: int = 3) -> list[int]:
    """A block-table row of distinct, shuffled physical blocks (as an allocator leaves them)."""
    numbers = list(range(10, 10 + 2 * entries))
    random.Random(seed).shuffle(numbers)
    return numbers[:entries]


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
    qsl = torch.tensor([0, num_tokens], dtype=torch.int32, device=DEVICE)
    pos = torch.tensor(positions, dtype=torch.int64, device=DEVICE)
    table = torch.tensor([row], dtype=torch.int32, device=DEVICE)
    tiles = cdiv(num_tokens, tile_size)
    trace = torch.full((1, max(tiles, 1)), -1, dtype=torch.int32, device=DEVICE)
    slots = compute_slot_mapping(
        qsl, pos, table, block_size, tile_size=tile_size, window_trace=trace
    )
    expected = slot_mapping_oracle(qsl.cpu(), pos.cpu(), table.cpu(), block_size)
    oracle_bases = window_bases_oracle(qsl.cpu(), pos.cpu(), block_size, tile_size=tile_size)
    return WindowRun(
        positions,
        row,
        block_size,
        tile_size,
        window_size(tile_size, block_size),
        slots.cpu().tolist(),
        expected.tolist(),
        trace.cpu()[0, :tiles].tolist(),
        oracle_bases[0],
    )


def _window_outline(ax, base: int, window: int, row_length: int, y: float, colour: str):
    """A thick frame around entries [base, base + window); the part past the row is dashed."""
    from matplotlib.patches import Rectangle

    inside = max(0, min(window, row_length - base))
    frame = Rectangle(
        (base - 0.08, y - 0.12),
        inside + 0.16,
        1.04,
        fill=False,
        edgecolor=colour,
        linewidth=2.4,
        gid="window",
    )
    ax.add_artist(frame)
    if inside < window:
        ax.add_artist(
            Rectangle(
                (base + inside, y - 0.12),
                window - inside,
                1.04,
                fill=False,
                edgecolor=colour,
                linewidth=1.4,
                linestyle="--",
                gid="window-past-row",
            )
        )
    return frame


def draw_windows(
    tile_size: int = 8, block_size: int = 4, first_position: int = 5, num_tokens: int = 22
):
    """Which block-table entries each tile's window loaded, and which its lanes picked.

    Runs ``compute_slot_mapping`` on the active backend for one request of ``num_tokens``
    contiguous positions from ``first_position``; returns a matplotlib Figure.
    """
    run = run_windows(tile_size, block_size, first_position, num_tokens)
    row = run.block_table_row
    width = max(len(run.positions), len(row) + run.window)
    fig, axes = figure(rows=1 + run.tiles, height_per_row=0.7)
    fig.set_figheight(fig.get_figheight() + 1.2)  # title, legend, entry numbers
    height = fig.get_figheight()
    fig.subplots_adjust(
        left=0.2, right=0.98, top=1 - 0.95 / height, bottom=0.3 / height, hspace=0.5
    )
    token_ax = axes[0]
    colours = [tile_colour(t) for t in range(run.tiles) for _ in run.tile_tokens(t)]
    for patch in boxes(
        token_ax,
        0,
        colours,
        [str(p) for p in run.positions],
        text_colour="white",
        font_size=FONT_SIZE - 1,
    ):
        patch.set_gid("token")
    token_ax.text(-0.6, 0.4, "positions\n(by tile)", ha="right", va="center", fontsize=FONT_SIZE)
    mismatched = [t for t in range(run.tiles) if run.bases[t] != run.expected_bases[t]]
    for tile in range(run.tiles):
        ax = axes[1 + tile]
        base = run.bases[tile]
        picked = run.picked_entries(tile)
        fills = []
        for entry in range(len(row)):
            if entry in picked:
                fills.append(tile_colour(tile))
            elif base <= entry < base + run.window:
                fills.append(WINDOW_FILL)
            else:
                fills.append(EMPTY)
        patches = boxes(ax, 0, fills, [str(b) for b in row], font_size=FONT_SIZE - 1)
        for entry, patch in enumerate(patches):
            patch.set_gid("picked" if entry in picked else "entry")
        for entry in picked:
            ax.texts[entry].set_color("white")
        _window_outline(
            ax, base, run.window, len(row), 0, HIGHLIGHT if tile in mismatched else EDGE
        )
        tokens = run.tile_tokens(tile)
        first, last = run.positions[tokens[0]], run.positions[tokens[-1]]
        ax.text(
            -0.6,
            0.4,
            f"tile {tile}: positions {first}–{last}\nwindow = entries "
            f"{base}–{base + run.window - 1}",
            ha="right",
            va="center",
            fontsize=FONT_SIZE,
        )
    for entry in range(len(row)):
        axes[-1].text(
            entry + 0.5,
            -0.2,
            str(entry),
            ha="center",
            va="top",
            color="#555555",
            fontsize=FONT_SIZE - 1,
        )
    axes[-1].text(
        -0.6,
        -0.45,
        "entry = logical block",
        ha="right",
        va="center",
        color="#555555",
        fontsize=FONT_SIZE - 1,
    )
    for ax in axes:
        ax.set_xlim(-0.2, width + 0.2)
        ax.set_ylim(-0.3, 1.05)
    wrong = sum(g != e for g, e in zip(run.slots, run.expected, strict=True))
    verdict = (
        "kernel's slots = reference"
        if wrong == 0
        else (f"{wrong} slots differ from the reference")
    )
    trace = (
        "recorded window bases = window_bases_oracle"
        if not mismatched
        else (f"window bases of tiles {mismatched} differ from window_bases_oracle")
    )
    fig.suptitle(
        f"One request, blocks of {block_size}, tiles of {tile_size}: BLOCK_TABLE_WINDOW_SIZE = "
        f"next_pow2(cdiv({tile_size}, {block_size}) + 1) = {run.window}\n{verdict}; {trace}",
        fontsize=FONT_SIZE + 1,
    )
    from matplotlib.patches import Patch

    fig.legend(
        handles=[
            Patch(facecolor=tile_colour(0), edgecolor=EDGE, label="picked by a lane of the tile"),
            Patch(facecolor=WINDOW_FILL, edgecolor=EDGE, label="loaded by the window, unused"),
            Patch(facecolor=EMPTY, edgecolor=EDGE, label="not loaded"),
            Patch(facecolor="none", edgecolor=EDGE, linewidth=2.4, label="the window"),
            Patch(facecolor="none", edgecolor=EDGE, linestyle="--", label="past the row: masked"),
        ],
        loc="upper right",
        bbox_to_anchor=(0.98, 1 - 0.5 / height),
        ncol=5,
        fontsize=FONT_SIZE - 1,
        frameon=False,
    )
    fig.slotmap_run = run  # what was drawn, for tests and curious learners
    return fig


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
        raise ValueError(f"mode must be one of {FAILURE_MODES}, got {mode!r}")
    positions = list(range(first_position, first_position + num_tokens))
    if mode == "shuffled across tiles":
        random.Random(seed).shuffle(positions)
    entries = max(positions) // block_size + 1
    row = example_block_table(entries, seed)
    qsl = torch.tensor([0, num_tokens], dtype=torch.int32, device=DEVICE)
    pos = torch.tensor(positions, dtype=torch.int64, device=DEVICE)
    table = torch.tensor([row], dtype=torch.int32, device=DEVICE)
    try:
        compute_slot_mapping(qsl, pos, table, block_size, tile_size=tile_size)
        message = "compute_slot_mapping accepts this input."
    except ValueError as error:
        message = f"compute_slot_mapping raises ValueError: {error}"
    if mode == "window without its +1":
        window = next_power_of_2(cdiv(tile_size, block_size))
        slots = launch_production_with_window(
            qsl, pos, table, block_size, window=window, tile_size=tile_size
        )
        message += (
            f" (Its window has the +1. This run launches the production kernel with "
            f"BLOCK_TABLE_WINDOW_SIZE = next_pow2(cdiv({tile_size}, {block_size})) = {window}.)"
        )
    else:
        window = window_size(tile_size, block_size)
        slots = compute_slot_mapping(
            qsl, pos, table, block_size, tile_size=tile_size, validate=False
        )
    expected = slot_mapping_oracle(qsl.cpu(), pos.cpu(), table.cpu(), block_size)
    return FailureRun(
        mode,
        positions,
        row,
        block_size,
        tile_size,
        window,
        slots.cpu().tolist(),
        expected.tolist(),
        message,
    )


def draw_window_failure(
    mode: str = "shuffled across tiles",
    tile_size: int = 8,
    block_size: int = 4,
    first_position: int = 3,
    num_tokens: int = 24,
    seed: int = 0,
):
    """Positions, the reference's slots and the kernel's slots for one request; wrong slots
    in red, the launcher's verdict underneath. ``mode``: one of ``FAILURE_MODES``."""
    run = run_failure(mode, tile_size, block_size, first_position, num_tokens, seed)
    fig, axes = figure(rows=4, height_per_row=0.62)
    fig.subplots_adjust(left=0.16, right=0.98, top=0.84, bottom=0.02, hspace=0.3)
    wrong = set(run.wrong_tokens)
    tiles = [t // tile_size for t in range(num_tokens)]
    rows = [
        ("positions\n(by tile)", [tile_colour(t) for t in tiles], run.positions, "token"),
        ("reference\nslots", [EMPTY] * num_tokens, run.expected, "expected"),
        (
            "kernel\nslots",
            [HIGHLIGHT if t in wrong else "#8fd19e" for t in range(num_tokens)],
            run.slots,
            "kernel",
        ),
    ]
    for ax, (label, colours, values, gid) in zip(axes, rows, strict=False):
        patches = boxes(
            ax,
            0,
            colours,
            [str(v) for v in values],
            font_size=FONT_SIZE - 1,
            text_colour="white" if gid == "token" else "black",
        )
        for token, patch in enumerate(patches):
            patch.set_gid("wrong" if gid == "kernel" and token in wrong else gid)
        ax.text(-0.5, 0.4, label, ha="right", va="center", fontsize=FONT_SIZE)
        ax.set_xlim(-0.2, max(num_tokens, 1) + 0.2)
        ax.set_ylim(-0.2, 1.0)
    verdict = axes[3]
    ok = run.launcher_message.startswith("compute_slot_mapping accepts")
    verdict.text(
        0.02,
        verdict.get_position().y1,
        "\n".join(textwrap.wrap(run.launcher_message, 108)),
        ha="left",
        va="top",
        fontsize=FONT_SIZE - 0.5,
        color="black" if ok else HIGHLIGHT,
        family="monospace",
        transform=fig.transFigure,
    )
    fig.suptitle(
        f"{mode}: blocks of {block_size}, tiles of {tile_size}, window of {run.window} "
        f"entries — {len(wrong)} of {num_tokens} slots wrong (red)",
        fontsize=FONT_SIZE + 1,
    )
    fig.slotmap_run = run
    return fig


# ---------------------------------------------------------------------------------------------
# Widgets
# ---------------------------------------------------------------------------------------------
def window_widget(
    tile_size: int = 8, block_size: int = 4, first_position: int = 5, num_tokens: int = 22
):
    """``draw_windows`` with sliders for the tile size, block size, first position, length."""
    import ipywidgets as widgets

    from slotmap.viz.live import live_figure

    style = {"description_width": "initial"}
    controls = {
        "tile_size": widgets.Dropdown(
            options=[4, 8, 16, 32], value=tile_size, description="tile size", style=style
        ),
        "block_size": widgets.IntSlider(
            value=block_size, min=1, max=16, description="block size", style=style
        ),
        "first_position": widgets.IntSlider(
            value=first_position, min=0, max=40, description="first position", style=style
        ),
        "num_tokens": widgets.IntSlider(
            value=num_tokens, min=1, max=40, description="tokens", style=style
        ),
    }
    return live_figure(draw_windows, controls)


def window_failure_widget(
    mode: str = "shuffled across tiles",
    tile_size: int = 8,
    block_size: int = 4,
    first_position: int = 3,
    num_tokens: int = 24,
):
    """``draw_window_failure`` with a dropdown for what to break and sliders for the sizes."""
    import ipywidgets as widgets

    from slotmap.viz.live import live_figure

    style = {"description_width": "initial"}
    controls = {
        "mode": widgets.Dropdown(
            options=list(FAILURE_MODES), value=mode, description="break", style=style
        ),
        "tile_size": widgets.Dropdown(
            options=[4, 8, 16], value=tile_size, description="tile size", style=style
        ),
        "block_size": widgets.IntSlider(
            value=block_size, min=1, max=8, description="block size", style=style
        ),
        "first_position": widgets.IntSlider(
            value=first_position, min=0, max=16, description="first position", style=style
        ),
        "num_tokens": widgets.IntSlider(
            value=num_tokens, min=1, max=32, description="tokens", style=style
        ),
        "seed": widgets.IntSlider(value=0, min=0, max=9, description="shuffle seed", style=style),
    }
    return live_figure(draw_window_failure, controls)
