"""Lesson 01's figure: token -> logical block -> physical block -> slot, from a real kernel run.

``draw_paged`` builds a batch (request lengths, block size, a shuffled pool of physical
blocks), runs the production kernel ``slotmap.compute_slot_mapping`` on the active backend
and draws what it returned: the batch's tokens and their slots, each request's block-table
row, and the KV cache with every slot a token landed in coloured by its request.
``paged_widget`` redraws it on every change of its sliders.
"""

from __future__ import annotations

import functools
import random
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from slotmap.i18n import _, ngettext
from slotmap.viz import draw, style

if TYPE_CHECKING:
    from ipywidgets import VBox
    from matplotlib.figure import Figure


CACHE_GAP = 0.8  # space between two physical blocks in the KV-cache picture, in cells
TABLE_GAP = 0.6  # space between two block-table entries: the arrows leave down it
LANE = 0.16  # height of one arrow's lane in the band between the table and the cache
LINE_HEIGHT = 1.9  # from one line of the KV-cache picture to the next
EMPTY = style.EMPTY


@dataclass
class PagedBatch:
    """One batch for the figure, and the slot mapping the kernel returned for it."""

    lengths: list[int]
    positions: list[list[int]]  # per request
    block_table: list[list[int]]  # one row per request (unused entries are 0)
    blocks_used: list[int]  # entries of each row that the request's positions use
    block_size: int
    num_physical_blocks: int
    max_num_tokens: int
    slots: list[int]  # the kernel's output, [max_num_tokens]

    @property
    def num_tokens(self) -> int:
        return sum(self.lengths)

    @property
    def earlier(self) -> dict[int, int]:
        """slot -> request of the positions before each request's first one: tokens written by
        earlier steps."""
        found = draw.earlier(self.positions, self.block_table, self.block_size)
        return {slot: request for slot, (request, _) in found.items()}


def paged_batch(
    lengths: Sequence[int],
    block_size: int,
    *,
    first_positions: Sequence[int] | None = None,
    num_physical_blocks: int | None = None,
    max_num_tokens: int | None = None,
    seed: int = 0,
) -> PagedBatch:
    """Build a batch and run the production kernel on it (on ``slotmap.DEVICE``).

    Request q holds positions ``first_positions[q] ..`` (0 by default: a prefill). Its
    physical blocks are drawn, without repeats, from a shuffled pool of
    ``num_physical_blocks`` (default: a few more than needed), so that a request's blocks
    are scattered over the cache as they are in a real paged cache.
    """
    import slotmap

    lengths = [int(n) for n in lengths]
    firsts = [0] * len(lengths) if first_positions is None else [int(p) for p in first_positions]
    positions = [list(range(f, f + n)) for f, n in zip(firsts, lengths, strict=True)]
    used = draw.blocks_used(firsts, lengths, block_size)
    needed = sum(used)
    if num_physical_blocks is None:
        num_physical_blocks = max(needed + 3, 8)
    if num_physical_blocks < needed:
        raise ValueError(
            _("the batch needs {needed} physical blocks, the cache has only {available}").format(
                needed=needed, available=num_physical_blocks
            )
        )
    table = draw.scattered_table(used, num_physical_blocks, random.Random(seed))
    num_tokens = sum(lengths)
    max_num_tokens = num_tokens if max_num_tokens is None else max(max_num_tokens, num_tokens)
    qsl, pos = draw.batch_tensors(lengths, positions)
    block_table = torch.tensor(table, dtype=torch.int32, device=qsl.device)
    slots = slotmap.compute_slot_mapping(
        qsl, pos, block_table, block_size, max_num_tokens=max_num_tokens
    )
    return PagedBatch(
        lengths,
        positions,
        table,
        used,
        block_size,
        num_physical_blocks,
        max_num_tokens,
        slots.cpu().tolist(),
    )


def _cache_layout(batch: PagedBatch, width: float) -> tuple[int, float]:
    """(physical blocks per line, width of a block with its gap) for a cache ``width`` wide."""
    block_width = batch.block_size + CACHE_GAP
    per_line = max(1, int((width + CACHE_GAP) // block_width))
    return per_line, block_width


Point = tuple[float, float]


def _crossings(paths: list[list[Point]]) -> int:
    """How many times two different right-angled paths cross."""
    segments = [[(a, b) for a, b in zip(path, path[1:], strict=False) if a != b] for path in paths]
    count = 0
    for i, first in enumerate(segments):
        for second in segments[i + 1 :]:
            for a, b in first:
                for c, d in second:
                    for (h0, h1), (v0, v1) in (((a, b), (c, d)), ((c, d), (a, b))):
                        if h0[1] == h1[1] and v0[0] == v1[0]:  # horizontal x vertical
                            x_low, x_high = sorted((h0[0], h1[0]))
                            y_low, y_high = sorted((v0[1], v1[1]))
                            count += x_low < v0[0] < x_high and y_low < h0[1] < y_high
    return count


def _arrow_paths(batch, entry_patches, block_origin, entry, y_band, table_rows):
    """A right-angled path for each used block-table entry: out of the entry's right edge
    into the gap after it, down to its own lane under the table, across to the gap left of
    the physical block's column, down to the block and into its left edge. The lanes are
    ordered to keep crossings few."""
    legs = {}  # (request, b) -> (start, gap x, drop x, target)
    into_gap: dict[float, list[tuple[int, tuple[int, int]]]] = {}
    for request, b in entry_patches:
        x0, y = block_origin[int(batch.block_table[request][b])]
        into_gap.setdefault(x0, []).append((y, (request, b)))
    drop_x = {}
    for x0, arrivals in into_gap.items():
        # A deeper block's path drops nearer its block, so it passes the others' last legs.
        arrivals.sort(key=lambda item: (item[0], item[1]))
        for k, (_depth, key) in enumerate(arrivals):
            drop_x[key] = x0 - CACHE_GAP * (k + 1) / (len(arrivals) + 1)
    for (request, b), patch in entry_patches.items():
        x0, y = block_origin[int(batch.block_table[request][b])]
        right, middle = patch.get_x() + entry, patch.get_y() + 0.4
        # Later rows leave nearer their entry, so an earlier row's path passes their stubs.
        gap_x = right + TABLE_GAP * (table_rows - request) / (table_rows + 1)
        legs[(request, b)] = ((right, middle), gap_x, drop_x[(request, b)], (x0, y + 0.4))

    def paths_for(order):
        paths = {}
        for lane, key in enumerate(order):
            start, gap_x, drop, target = legs[key]
            y_lane = y_band + (lane + 1) * LANE
            paths[key] = [
                start,
                (gap_x, start[1]),
                (gap_x, y_lane),
                (drop, y_lane),
                (drop, target[1]),
                target,
            ]
        return paths

    # Start with the farthest drop on the top lane (no crossing between two paths that go
    # the same way without nesting), then swap neighbours while that removes crossings.
    order = sorted(legs, key=lambda key: (-legs[key][2], key))
    best = _crossings(list(paths_for(order).values()))
    improved = True
    while improved and best:
        improved = False
        for i in range(len(order) - 1):
            trial = order[:i] + [order[i + 1], order[i]] + order[i + 2 :]
            count = _crossings(list(paths_for(trial).values()))
            if count < best:
                order, best, improved = trial, count, True
    return paths_for(order)


def draw_paged(
    lengths: Sequence[int] = (5, 11, 3),
    block_size: int = 4,
    *,
    first_positions: Sequence[int] | None = None,
    num_physical_blocks: int | None = None,
    max_num_tokens: int | None = None,
    seed: int = 0,
) -> Figure:
    """Run the kernel on a batch and draw token -> logical block -> physical block -> slot.

    Patches and texts carry a gid (``token``, ``slot``, ``table-entry``, ``cache-slot``,
    ``cache-label``, ...) so that a test can read the figure back.
    """
    batch = paged_batch(
        lengths,
        block_size,
        first_positions=first_positions,
        num_physical_blocks=num_physical_blocks,
        max_num_tokens=max_num_tokens,
        seed=seed,
    )
    return draw_batch(batch)


def draw_batch(batch: PagedBatch) -> Figure:
    """Draw a ``PagedBatch`` (see ``draw_paged``): the batch's tokens and slots, the block
    tables, the KV cache, and an arrow from each used table entry to its physical block."""
    from matplotlib.patches import FancyArrowPatch
    from matplotlib.path import Path

    # Everything is measured in cells: one token, one table entry or one slot is 1 wide.
    width = max(batch.max_num_tokens, 20.0)
    per_line, block_width = _cache_layout(batch, width)
    cache_lines = -(-batch.num_physical_blocks // per_line)
    width = max(width, per_line * block_width - CACHE_GAP)
    # Rows from the top (y grows downwards in this layout); the band under the table holds
    # one horizontal lane per arrow.
    y_table = 3.6
    y_band = y_table + (len(batch.lengths) - 1) * 1.15 + 0.8 + 0.3
    y_cache = y_band + (sum(batch.blocks_used) + 1) * LANE + 0.2
    height = y_cache + cache_lines * LINE_HEIGHT + 0.3

    cell_inches = style.WIDTH * 0.86 / width
    font = max(5.5, min(style.FONT_SIZE, cell_inches * 72 * 0.36))
    row_inches = max(cell_inches, 0.26)  # rows stay tall enough for their text
    # Cells are sized in inches above, so the axes fill the figure: only the title sits
    # outside them (matplotlib's default margins left an empty band around the picture).
    axes_inches, title_inches = max(2.5, (height + 1.5) * row_inches), 0.45
    fig, (ax,) = style.figure(1, height_per_row=axes_inches + title_inches)
    top = 1 - title_inches / (axes_inches + title_inches)
    fig.subplots_adjust(left=0.01, right=0.99, bottom=0.01, top=top)
    ax.set_xlim(-0.14 * width, width + 0.3)
    ax.set_ylim(height + 0.2, -1.3)
    cell = functools.partial(draw.cell, ax, size=font)

    _paint_tokens(ax, cell, batch)
    entry = max(1.0, min(2.5, width / 20))  # a table entry is wider than a cell in wide figures
    entries = _paint_tables(ax, cell, batch, y_table, entry, font)
    origins = _paint_cache(ax, cell, batch, y_cache, per_line, height, font)
    # Arrows: block-table entry -> the physical block it names, on right-angled paths
    # through the gaps (never across a block or an entry), ending on the block's left edge.
    paths = _arrow_paths(batch, entries, origins, entry, y_band, len(batch.lengths))
    for request, path in paths.items():
        colour = style.request_colour(request[0])
        arrow = FancyArrowPatch(
            path=Path(path),
            arrowstyle="-|>",
            linewidth=0.9,
            color=colour,
            alpha=0.75,
            mutation_scale=8,
            gid="block-arrow",
        )
        ax.add_artist(arrow)
    title = _(
        "slot = block_table[q, p // {b}] * {b} + p % {b}: {tokens} tokens of {requests} "
        "requests, max_num_tokens={max_num_tokens} (slotmap.compute_slot_mapping)"
    )
    tokens, requests = batch.num_tokens, len(batch.lengths)
    title = title.format(
        b=batch.block_size, tokens=tokens, requests=requests, max_num_tokens=batch.max_num_tokens
    )
    ax.set_title(title, fontsize=style.FONT_SIZE + 1)
    return fig


def _paint_tokens(ax, cell, batch: PagedBatch) -> None:
    """Each token coloured by its request, labelled with its position, and under it the slot
    the kernel wrote for it; the padding tail hatched."""
    draw.row_label(ax, 0, _("token's position"), -0.2)
    draw.row_label(ax, 1, _("kernel's slot"), -0.2)
    token = 0
    for request, positions in enumerate(batch.positions):
        colour = style.request_colour(request)
        for position in positions:
            cell(token, 0, colour, position, "token", text_colour="white")
            cell(token, 1, colour, batch.slots[token], "slot", text_colour="white")
            token += 1
    for pad in range(batch.num_tokens, batch.max_num_tokens):
        cell(pad, 0, style.PAD, "", "pad-token", hatch="///")
        cell(pad, 1, style.PAD, batch.slots[pad], "pad-slot")
    ax.text(0, -0.35, _("batch tokens (colour: request)"), fontsize=style.FONT_SIZE, va="bottom")


def _paint_tables(ax, cell, batch: PagedBatch, y_table: float, entry: float, font: float):
    """Row q maps request q's logical block b to a physical block; returns the patch of every
    used entry, keyed (request, b)."""
    caption = _("block table (entry b: logical block b -> physical block)")
    ax.text(0, y_table - 0.75, caption, fontsize=style.FONT_SIZE, va="bottom")
    pitch = entry + TABLE_GAP
    for b in range(len(batch.block_table[0]) if batch.block_table else 0):
        at = (b * pitch + entry / 2, y_table - 0.1)
        ax.text(*at, f"b={b}", ha="center", va="bottom", fontsize=font * 0.85, color=style.EDGE)
    patches = {}
    size = style.FONT_SIZE if entry > 1 else font
    for request, row in enumerate(batch.block_table):
        y = y_table + request * 1.15
        draw.row_label(ax, y, _("request {request}").format(request=request), -0.2)
        for b, physical in enumerate(row):
            used = b < batch.blocks_used[request]
            colour, label = (style.request_colour(request), physical) if used else (EMPTY, "")
            gid = "table-entry" if used else "table-unused"
            patch = cell(
                b * pitch, y, colour, label, gid, text_colour="white", wide=entry, size=size
            )
            if used:
                patches[(request, b)] = patch
    return patches


def _paint_cache(ax, cell, batch: PagedBatch, y_cache: float, per_line: int, height, font):
    """Physical blocks of block_size slots: a slot is coloured where the kernel put a token
    (label: that token's position), hatched where an earlier step did, empty elsewhere.
    Returns each block's (x, y)."""
    block_size, block_width = batch.block_size, batch.block_size + CACHE_GAP
    landed, earlier = draw.landed(batch.positions, batch.slots), batch.earlier
    slots = ngettext("{n} slot", "{n} slots", block_size).format(n=block_size)
    # Under the cache, so that no arrow runs through it.
    caption = (
        _(
            "KV cache: {blocks} physical blocks of {slots} (label: position stored there; "
            "hatched: written by earlier steps)"
        )
        if earlier
        else _("KV cache: {blocks} physical blocks of {slots} (label: position stored there)")
    ).format(blocks=batch.num_physical_blocks, slots=slots)
    ax.text(0, height - 0.35, caption, fontsize=style.FONT_SIZE, va="bottom")
    origins: dict[int, tuple[float, float]] = {}
    label_font = font * 0.8
    x_range = ax.get_xlim()[1] - ax.get_xlim()[0]
    block_inches = (block_width - CACHE_GAP / 2) * style.WIDTH * 0.98 / x_range
    for physical in range(batch.num_physical_blocks):
        line, column = divmod(physical, per_line)
        x0, y = column * block_width, y_cache + line * LINE_HEIGHT
        origins[physical] = (x0, y)
        first = physical * block_size
        last = first + block_size - 1
        labels = [
            _("block {k} · slots {first}-{last}").format(k=physical, first=first, last=last),
            _("block {k}").format(k=physical),
            str(physical),
        ]
        # The longest label that fits under the block (narrow blocks' labels overlapped).
        fits = [t for t in labels if _ems(t) * label_font * 0.6 / 72 <= block_inches]
        label = fits[0] if fits else labels[-1]
        ax.text(
            x0 + block_size / 2,
            y + 0.85,
            label,
            **draw.BELOW,
            fontsize=label_font,
            color=style.EDGE,
        )
        for offset in range(block_size):
            slot = first + offset
            if slot in landed:
                request, position = landed[slot]
                colour = style.request_colour(request)
                cell(x0 + offset, y, colour, position, "cache-slot", text_colour="white")
            elif slot in earlier:
                edge = style.request_colour(earlier[slot])
                cell(x0 + offset, y, EMPTY, "", "cache-earlier", hatch="////", edge=edge)
            else:
                cell(x0 + offset, y, EMPTY, "", "cache-empty")
    return origins


def _ems(text: str) -> float:
    """Width of ``text`` in Latin characters: a CJK one is as wide as about 1.7 of them."""
    return sum(1.7 if ord(c) >= 0x2E80 else 1.0 for c in text)


def paged_widget(lengths: Sequence[int] = (5, 11, 3), block_size: int = 4, seed: int = 0) -> VBox:
    """Sliders for three request lengths, the block size, the padding tail and the shuffle of
    physical blocks; every change re-runs the kernel and redraws (``slotmap.viz.live``)."""
    from slotmap.viz.live import live_figure, request_sliders, slider, split_columns

    controls = request_sliders(lengths, 16)
    controls["block_size"] = slider(_("block size"), block_size, 1, 8, False)
    controls["padding"] = slider(_("padding tail"), 2, 0, 8, False)
    controls["seed"] = slider(_("shuffle"), seed, 0, 20, False)

    def redraw(request_0, request_1, request_2, block_size, padding, seed):
        counts = [request_0, request_1, request_2]
        return draw_paged(counts, block_size, seed=seed, max_num_tokens=sum(counts) + padding)

    return live_figure(redraw, controls, split_columns(controls, 3))
