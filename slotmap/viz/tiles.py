"""Lesson 02's figure: requests -> programs -> tiles, masked lanes and the padding program,
from a real run of the production kernel.

``draw_tiles`` poisons the output (and the cells just past its end), launches the production
kernel ``_compute_slot_mapping_kernel`` with production's grid ``(num_reqs + 1,)`` and its
window trace on, and draws what came back: for every program the tiles it ran (from the
trace) and the lanes each tile wrote or masked off, the padding program's tiles, and the
output after the run, where anything still poisoned was never written. ``programs`` launches
a shorter grid, to show what a missing program leaves behind.
"""

from __future__ import annotations

import functools
import random
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from slotmap.i18n import _
from slotmap.viz import draw, style

if TYPE_CHECKING:
    from ipywidgets import VBox
    from matplotlib.figure import Figure


POISON = -999  # every output cell, and the cells past its end, hold this before the launch


@dataclass
class TileRun:
    """What one launch did."""

    lengths: list[int]
    starts: list[int]  # query_start_loc
    positions: list[int]
    block_size: int
    tile_size: int
    max_num_tokens: int
    programs: int  # the launch grid (programs,)
    buffer: list[int]  # the output followed by ``tile_size`` guard cells, after the run
    trace: list[list[int]]  # window trace [num_reqs, tiles]: POISON where no tile ran

    @property
    def num_reqs(self) -> int:
        return len(self.lengths)

    @property
    def num_tokens(self) -> int:
        return self.starts[-1]

    @property
    def output(self) -> list[int]:
        return self.buffer[: self.max_num_tokens]

    def tiles_run(self, request: int) -> list[int]:
        """Start index of every tile that request ``request``'s program ran (from the trace)."""
        row = self.trace[request]
        return [
            self.starts[request] + t * self.tile_size
            for t, base in enumerate(row)
            if base != POISON
        ]

    def request_of(self, token: int) -> int:
        """The request that batch token ``token`` belongs to."""
        return next(q for q in range(self.num_reqs) if token < self.starts[q + 1])

    def padding_tiles(self) -> list[int]:
        """Tiles of the padding program: ``_fill_pad`` walks [num_tokens, max_num_tokens)."""
        return list(range(self.num_tokens, self.max_num_tokens, self.tile_size))


def run_tiles(
    lengths: Sequence[int] = (5, 11, 3),
    block_size: int = 4,
    tile_size: int = 4,
    padding: int = 6,
    *,
    programs: int | None = None,
    seed: int = 0,
) -> TileRun:
    """Launch the production kernel on a poisoned, guarded output (on ``slotmap.DEVICE``).

    Request q holds positions 0 .. lengths[q] - 1 (a prefill). ``programs`` (default
    ``num_reqs + 1``, production's grid) can launch fewer programs: the kernel takes the last
    one as the padding program whatever the grid, and it pads from where the requests it
    knows end, so the tokens of the requests left without a program come out as PAD_ID.
    """
    import slotmap
    from slotmap.kernels.slot_mapping import _compute_slot_mapping_kernel, window_kernel_constants
    from slotmap.layout import SlotLayout

    device = slotmap.DEVICE
    lengths = [int(n) for n in lengths]
    num_reqs = len(lengths)
    programs = num_reqs + 1 if programs is None else int(programs)
    if not 1 <= programs <= num_reqs + 1:
        raise ValueError(
            _("programs must be in 1..{high}, got {programs}").format(
                high=num_reqs + 1, programs=programs
            )
        )
    starts = draw.starts_of(lengths)
    positions = [p for n in lengths for p in range(n)]
    blocks = [max(1, -(-n // block_size)) for n in lengths]
    # Few physical blocks, so that slots stay short enough to print inside a cell.
    table = draw.scattered_table(blocks, sum(blocks) + 6, random.Random(seed))
    max_num_tokens = starts[-1] + padding
    tiles = max((-(-n // tile_size) for n in lengths), default=0) + 1

    qsl = torch.tensor(starts, dtype=torch.int32, device=device)
    pos = torch.tensor(positions + [0] * tile_size, dtype=torch.int64, device=device)
    block_table = torch.tensor(table, dtype=torch.int32, device=device)
    buffer = torch.full((max_num_tokens + tile_size,), POISON, dtype=torch.int32, device=device)
    out = buffer[:max_num_tokens]
    trace = torch.full((max(num_reqs, 1), tiles), POISON, dtype=torch.int32, device=device)
    if programs == num_reqs + 1:
        slotmap.compute_slot_mapping(
            qsl,
            pos[: len(positions)],
            block_table,
            block_size,
            max_num_tokens=max_num_tokens,
            out=out,
            tile_size=tile_size,
            parallel_tiles=1,
            window_trace=trace[:num_reqs],
        )
    else:
        # The launcher always launches num_reqs + 1 programs: call the kernel itself.
        _compute_slot_mapping_kernel[(programs, 1)](
            starts[-1],
            max_num_tokens,
            qsl,
            pos,
            block_table,
            block_table.stride(0),
            block_size,
            out,
            **window_kernel_constants(SlotLayout.of(block_size), tile_size),
            window_trace_ptr=trace,
            window_trace_width=tiles,
            TRACE_WINDOWS=True,
        )
    return TileRun(
        lengths,
        starts,
        positions,
        block_size,
        tile_size,
        max_num_tokens,
        programs,
        buffer.cpu().tolist(),
        trace.cpu().tolist()[:num_reqs],
    )


def draw_tiles(
    lengths: Sequence[int] = (5, 11, 3),
    block_size: int = 4,
    tile_size: int = 4,
    padding: int = 6,
    *,
    programs: int | None = None,
    seed: int = 0,
) -> Figure:
    """Run the kernel (``run_tiles``) and draw programs, tiles, masked lanes and the output.

    Patches carry a gid for tests: ``lane`` (a lane that stored), ``masked`` (a lane masked
    off), ``tile`` (a tile's outline), ``out`` / ``out-pad`` / ``unwritten`` / ``guard``
    (the output after the run).
    """
    return draw_run(
        run_tiles(lengths, block_size, tile_size, padding, programs=programs, seed=seed)
    )


def draw_run(run: TileRun) -> Figure:
    """Draw a ``TileRun`` (see ``draw_tiles``)."""
    tile = run.tile_size
    width = run.max_num_tokens + tile
    padding_program = run.programs - 1  # the kernel's padding program: the last one
    missing = list(range(padding_program, run.num_reqs))  # requests no program handled
    rows = run.programs + 2 + (1 if missing else 0)
    cell_inches = style.WIDTH * 0.8 / max(width, 16)
    font = max(5.5, min(style.FONT_SIZE, cell_inches * 72 * 0.36))
    row_inches = max(cell_inches * 1.25, 0.3)
    fig, (ax,) = style.figure(1, height_per_row=(rows + 1.6) * row_inches)
    ax.set_xlim(-0.2 * max(width, 16), max(width, 16) + 0.2)
    ax.set_ylim(rows + 0.1, -1.0)
    cell = functools.partial(draw.cell, ax, size=font, linewidth=0.5)

    # Row 0: the batch as the kernel sees it.
    draw.row_label(ax, 0, _("batch (position)"), -0.3)
    for token in range(run.num_tokens):
        colour = style.request_colour(run.request_of(token))
        cell(token, 0, colour, run.positions[token], "batch", text_colour="white")
    for token in range(run.num_tokens, run.max_num_tokens):
        cell(token, 0, style.PAD, "", "batch-pad")
    for x in range(run.max_num_tokens, width):
        cell(x, 0, "white", "", "past-end", hatch="...", edge=style.PAD)
    _paint_programs(ax, cell, run)
    if missing:
        names = ", ".join(str(q) for q in missing)
        at = (run.max_num_tokens / 2, 1.3 + run.programs + 0.4)
        note = _(
            "no program ran for request {requests}: the last program always pads "
            "(from query_start_loc[{program}])"
        ).format(requests=names, program=padding_program)
        ax.text(*at, note, **draw.CENTRE, fontsize=style.FONT_SIZE, color=style.HIGHLIGHT)
    _paint_output(ax, cell, run, rows - 0.6)
    handles = [
        draw.key("white", _("a tile ({lanes} lanes)").format(lanes=tile), "black", linewidth=1.6),
        draw.key("white", _("masked lane"), style.PAD, hatch="xxx"),
        draw.key(style.PAD, "PAD_ID (-1)"),
        draw.key("white", _("past the output's end"), style.PAD, hatch="..."),
        draw.key("white", _("? never written"), style.HIGHLIGHT),
        draw.key(style.PAD, _("a token no program computed"), style.HIGHLIGHT),
    ]
    draw.legend(ax, handles, loc="upper center", bbox_to_anchor=(0.5, 0.0), ncol=3)
    title = _(
        "grid ({programs},): {requests} requests, TILE_BLOCK_SIZE={tile}, "
        "num_tokens={num_tokens}, max_num_tokens={max_num_tokens}"
    ).format(
        programs=run.programs,
        requests=run.num_reqs,
        tile=tile,
        num_tokens=run.num_tokens,
        max_num_tokens=run.max_num_tokens,
    )
    ax.set_title(title, fontsize=style.FONT_SIZE + 1)
    return fig


def _paint_programs(ax, cell, run: TileRun) -> None:
    """One row per program: the tiles it ran (outlined) and the lanes of each, masked past its
    request's end (the padding program's: past max_num_tokens)."""
    from matplotlib.patches import Rectangle

    tile, output = run.tile_size, run.output
    for program in range(run.programs):
        y = 1.3 + program
        if program == run.programs - 1:  # the kernel's padding program: the last one
            draw.row_label(ax, y, _("program {program} (padding)").format(program=program), -0.3)
            colour, text, end, starts = style.PAD, "black", run.max_num_tokens, run.padding_tiles()
        else:
            colour = style.request_colour(program)
            caption = _("program {program} (request {program})").format(program=program)
            draw.row_label(ax, y, caption, -0.3, color=colour)
            text, end, starts = "white", run.starts[program + 1], run.tiles_run(program)
        for start in starts:
            for x in range(start, start + tile):
                if x < end:
                    cell(x, y, colour, output[x], "lane", text_colour=text)
                else:
                    cell(x, y, "white", "", "masked", hatch="xxx", edge=style.PAD)
            frame = Rectangle((start - 0.06, y - 0.08), tile + 0.12, 0.96, fill=False, gid="tile")
            ax.add_artist(frame)
            frame.set(edgecolor="black", linewidth=1.6)


def _paint_output(ax, cell, run: TileRun, y: float) -> None:
    """The output after the run, and the guard cells past its end: a cell still poisoned was
    never written; a guard cell written is a store out of bounds."""
    draw.row_label(ax, y, _("slot_mapping after the run"), -0.3)
    red = style.HIGHLIGHT
    for x, value in enumerate(run.buffer):
        if x >= run.max_num_tokens and value != POISON:
            cell(x, y, red, value, "guard-written", edge=style.PAD)
        elif x >= run.max_num_tokens:
            cell(x, y, "white", "", "guard", hatch="...", edge=style.PAD)
        elif value == POISON:
            cell(x, y, "white", "?", "unwritten", text_colour=red, edge=red)
        elif x >= run.num_tokens:
            cell(x, y, style.PAD, value, "out-pad")
        elif run.request_of(x) >= run.programs - 1:  # its request had no program
            cell(x, y, style.PAD, value, "lost", edge=red)
        else:
            cell(x, y, style.request_colour(run.request_of(x)), value, "out", text_colour="white")


def tiles_widget(
    lengths: Sequence[int] = (5, 11, 3), tile_size: int = 4, padding: int = 6
) -> VBox:
    """Sliders for three request lengths, the tile size and the padding tail, and a switch
    that launches one program fewer; every change re-runs the kernel and redraws."""
    import ipywidgets as widgets

    from slotmap.viz.live import choice, live_figure, request_sliders, slider, split_columns

    controls = request_sliders(lengths, 12)
    controls["tile_size"] = choice(_("tile size"), [2, 4, 8], tile_size, wide=False)
    controls["padding"] = slider(_("padding tail"), padding, 0, 10, False)
    fewer = _("launch one program fewer")
    controls["short"] = widgets.Checkbox(value=False, description=fewer)

    def redraw(request_0, request_1, request_2, tile_size, padding, short):
        counts = [request_0, request_1, request_2]
        programs = len(counts) if short else None
        return draw_tiles(counts, 4, tile_size, padding, programs=programs)

    return live_figure(redraw, controls, split_columns(controls, 3))
