"""Lesson 06's hybrid-blocks figure and widget, drawn from real kernel runs.

``draw_hybrid`` builds a batch whose KV-cache manager hands out physical KV blocks of K =
``kv_cache_block_size`` tokens, each K/B = ``blocks_per_kv_block`` attention blocks of B =
``block_size`` tokens (the course's notation), expands its block table into attention
blocks (``slotmap.expand_block_table``), runs the production kernel
``slotmap.compute_slot_mapping`` on the active backend and draws what it returned: the
batch's tokens and slots, each request's two block tables (every physical KV block above the
attention blocks it holds) and the KV cache, each physical block split into its attention
blocks, the slots earlier steps wrote hatched. ``hybrid_widget`` redraws it on every change
of its sliders.

It paints on ``viz.draw.Canvas``, the cell grid of lesson 06's other figures (``viz.groups``).
Patches and texts carry a gid (``token``, ``slot``, ``kv-entry``, ``attention-entry``,
``cache-slot``, ``cache-earlier``, ``cache-empty``, ...) so that a test can read a figure back.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from slotmap.i18n import N_, _, ngettext
from slotmap.viz import draw, style
from slotmap.viz.draw import GAP, MAX_CELLS, MIN_FONT, Canvas

if TYPE_CHECKING:
    from ipywidgets import VBox
    from matplotlib.figure import Figure


__all__ = ["MAX_CELLS", "MIN_FONT", "HybridRun", "draw_hybrid", "hybrid_widget", "run_hybrid"]


@dataclass
class HybridRun:
    """One batch with hybrid blocks, and the slot mapping the kernel returned for it."""

    block_size: int  # the attention block (the kernel's block_size)
    blocks_per_kv_block: int
    positions: list[list[int]]  # per request
    kv_table: list[list[int]]  # the manager's table: physical KV blocks (unused entries 0)
    table: list[list[int]]  # expand_block_table(kv_table): attention blocks
    kv_used: list[int]  # physical KV blocks each request's positions reach
    num_kv_blocks: int  # physical KV blocks in the cache
    max_num_tokens: int
    slots: list[int]  # the kernel's output, [max_num_tokens]
    expected: list[int]  # slot_mapping_oracle on the same inputs
    whole: list[int]  # the oracle with whole KV blocks: block_size = kv, unexpanded table

    @property
    def kv_cache_block_size(self) -> int:
        return self.block_size * self.blocks_per_kv_block

    @property
    def num_tokens(self) -> int:
        return sum(len(row) for row in self.positions)


def run_hybrid(
    lengths: Sequence[int] = (7, 10),
    block_size: int = 2,
    blocks_per_kv_block: int = 3,
    *,
    first_positions: Sequence[int] | None = None,
    padding: int = 0,
    seed: int = 5,
) -> HybridRun:
    """Build a batch on ``slotmap.DEVICE``, expand its table and run the production kernel.

    Request q holds positions ``first_positions[q] ..`` (0: a prefill); its physical KV
    blocks are drawn without repeats from a shuffled pool a few blocks larger than needed.
    """
    import slotmap

    kv = block_size * blocks_per_kv_block
    lengths = [int(n) for n in lengths]
    firsts = [0] * len(lengths) if first_positions is None else [int(p) for p in first_positions]
    positions = [list(range(f, f + n)) for f, n in zip(firsts, lengths, strict=True)]
    kv_used = draw.blocks_used(firsts, lengths, kv)
    num_kv_blocks = sum(kv_used) + 2
    kv_table = draw.scattered_table(kv_used, num_kv_blocks, random.Random(seed))
    qsl, pos = draw.batch_tensors(lengths, positions)
    kv_blocks = torch.tensor(kv_table, dtype=torch.int32, device=qsl.device)
    table = slotmap.expand_block_table(kv_blocks, blocks_per_kv_block)
    max_num_tokens = sum(lengths) + padding
    counts = {"max_num_tokens": max_num_tokens}
    slots = slotmap.compute_slot_mapping(
        qsl, pos, table, block_size, kv_cache_block_size=kv, **counts
    )
    expected = slotmap.slot_mapping_oracle(
        qsl.cpu(), pos.cpu(), table.cpu(), block_size, kv_cache_block_size=kv, **counts
    )
    whole = slotmap.slot_mapping_oracle(qsl.cpu(), pos.cpu(), kv_blocks.cpu(), kv, **counts)
    return HybridRun(
        block_size,
        blocks_per_kv_block,
        positions,
        kv_table,
        table.cpu().tolist(),
        kv_used,
        num_kv_blocks,
        max_num_tokens,
        slots.cpu().tolist(),
        expected.tolist(),
        whole.tolist(),
    )


def draw_hybrid(
    lengths: Sequence[int] = (7, 10),
    block_size: int = 2,
    blocks_per_kv_block: int = 3,
    *,
    first_positions: Sequence[int] | None = None,
    padding: int = 0,
    seed: int = 5,
) -> Figure:
    """Run the kernel with hybrid blocks and draw tokens, both block tables and the cache."""
    run = run_hybrid(
        lengths,
        block_size,
        blocks_per_kv_block,
        first_positions=first_positions,
        padding=padding,
        seed=seed,
    )
    return draw_hybrid_run(run)


def draw_hybrid_run(run: HybridRun) -> Figure:
    """Draw a ``HybridRun`` (see ``draw_hybrid``).

    The lesson's notation: B = ``block_size`` (the attention block), K =
    ``kv_cache_block_size`` (the physical KV block), K/B = ``BLOCKS_PER_KV_BLOCK``.
    """
    size, per, kv = run.block_size, run.blocks_per_kv_block, run.kv_cache_block_size
    table_width = len(run.table[0]) if run.table else 0
    width = float(max(run.max_num_tokens, table_width, 2 * kv + GAP, 24))
    per_line = max(1, int((width + GAP) // (kv + GAP)))
    y_table = 3.7
    y_cache = y_table + len(run.positions) * 2.9 + 2.0
    canvas = Canvas(width, y_cache + -(-run.num_kv_blocks // per_line) * 2.3)

    canvas.heading(0, _("batch tokens (colour: request)"))
    slot_row = draw.SlotRow(_("kernel's slot"), run.slots, "slot", "pad-slot")
    canvas.token_rows(0, run.positions, [slot_row], run.max_num_tokens)

    _paint_tables(canvas, run, y_table)
    _paint_kv_cache(canvas, run, y_cache)
    agree = run.slots == run.expected
    same = run.slots[: run.num_tokens] == run.whole[: run.num_tokens]
    verdict = _("kernel = reference") if agree else _("KERNEL DIFFERS FROM THE REFERENCE")
    verdict += (
        _("; the same slots as whole KV blocks (block_size = K, unexpanded table)")
        if same
        else _("; NOT the slots of whole KV blocks")
    )
    title = _(
        "Hybrid blocks: K = K/B x B = {per} x {size} = {kv}; "
        "slot = expanded[q, p // B] * B + p % B with B = {size}\n"
        "slotmap.compute_slot_mapping: {verdict}"
    )
    canvas.title(title.format(per=per, size=size, kv=kv, verdict=verdict))
    canvas.fig.slotmap_run = run
    return canvas.fig


def _paint_tables(canvas: Canvas, run: HybridRun, y_table: float) -> None:
    """Block tables: the manager's entry k spans the attention blocks k * K/B .. (k + 1) * K/B
    - 1 that expand_block_table puts under it."""
    size, per, kv = run.block_size, run.blocks_per_kv_block, run.kv_cache_block_size
    heading = _(
        "block tables: the manager's physical KV blocks (K = {kv}) over the "
        "attention blocks (B = {size}) the kernel indexes"
    ).format(
        kv=ngettext("{n} token", "{n} tokens", kv).format(n=kv),
        size=ngettext("{n} token", "{n} tokens", size).format(n=size),
    )
    canvas.heading(y_table, heading)
    for request, (kv_row, row) in enumerate(zip(run.kv_table, run.table, strict=True)):
        y = y_table + request * 2.6
        canvas.row_title(y, _("request {request}: KV blocks").format(request=request))
        canvas.row_title(y + 1, _("attention blocks"))
        for k, physical in enumerate(kv_row):
            used = k < run.kv_used[request]
            colour = style.request_colour(request) if used else style.EMPTY
            kind, white = ("entry" if used else "unused"), {"text_colour": "white"}
            label = physical if used else ""
            canvas.cell(k * per, y, colour, label, f"kv-{kind}", wide=per, linewidth=1.4, **white)
            for j in range(per):
                label = row[k * per + j] if used else ""
                canvas.cell(k * per + j, y + 1, colour, label, f"attention-{kind}", **white)
        # The kernel's logical (attention) block b reads entry b of the expanded row.
        for a in range(len(row)):
            canvas.note(a + 0.5, y + 1.9, f"{a}", ha="center", va="top")
        canvas.note(-0.25, y + 1.9, _("logical block"), ha="right", va="top")


KV_CAPTIONS = (
    N_("KV block {k}: slots {first}-{last}"),
    N_("KV block {k}: {first}-{last}"),
    N_("KV block {k}"),
    "KV {k}",
    "{k}",
)


def _paint_kv_cache(canvas: Canvas, run: HybridRun, y_cache: float) -> None:
    """Physical KV block k = attention blocks k * K/B .. (k + 1) * K/B - 1, K slots; what
    earlier steps wrote: the positions before each request's first one (a later chunk)."""
    size, per, kv = run.block_size, run.blocks_per_kv_block, run.kv_cache_block_size
    earlier = draw.earlier(run.positions, run.kv_table, kv)
    heading = (
        _(
            "KV cache: {blocks} of K = {slots}, each K/B = {per} (numbered above) of B = {size}"
            "\nlabel: the position stored there; hatched: written by earlier steps"
        )
        if earlier
        else _(
            "KV cache: {blocks} of K = {slots}, each K/B = {per} (numbered above) of B = {size}"
            "\nlabel: the position stored there"
        )
    )
    blocks = run.num_kv_blocks
    heading = heading.format(
        blocks=ngettext("{n} physical KV block", "{n} physical KV blocks", blocks).format(
            n=blocks
        ),
        slots=ngettext("{n} slot", "{n} slots", kv).format(n=kv),
        per=ngettext("{n} attention block", "{n} attention blocks", per).format(n=per),
        size=size,
    )
    canvas.heading(y_cache - 0.45, heading)
    canvas.row_title(y_cache, _("slots"))
    landed = draw.landed(run.positions, run.slots)
    look = {"formats": KV_CAPTIONS, "line_height": 2.3, "caption_gid": "kv-block-label"}
    origins = canvas.cache(
        y_cache, kv, run.num_kv_blocks, landed, "cache", earlier=earlier, **look
    )
    # Attention-block borders inside each physical block, and the physical block's outline.
    for physical, (x0, y) in enumerate(origins):
        for j in range(per):
            canvas.cell(x0 + j * size, y, "none", "", "attention-block", wide=size, linewidth=1.6)
            at = (x0 + j * size + size / 2, y - 0.08)
            canvas.note(*at, str(physical * per + j), ha="center", va="bottom")
        canvas.cell(x0, y, "none", "", "kv-block", wide=kv, linewidth=2.2, edge="black")


def hybrid_widget(
    lengths: Sequence[int] = (7, 10), block_size: int = 2, blocks_per_kv_block: int = 3
) -> VBox:
    """Sliders for two request lengths, where request 1 starts, the attention block B and
    K/B, the attention blocks per KV block; every change re-runs the kernel and redraws."""
    from slotmap.viz.live import live_figure, slider, split_columns

    controls = {
        "request_0": slider(_("request {request}").format(request=0), lengths[0], 0, 14, False),
        "request_1": slider(_("request {request}").format(request=1), lengths[1], 0, 14, False),
        "first_1": slider(_("request 1 starts at"), 0, 0, 12),
        "block_size": slider(_("B (attention block)"), block_size, 1, 4),
        "blocks_per_kv_block": slider(_("K/B (blocks per KV block)"), blocks_per_kv_block, 1, 4),
        "seed": slider(_("shuffle"), 5, 0, 20, wide=False),
    }

    def redraw(request_0, request_1, first_1, block_size, blocks_per_kv_block, seed):
        firsts = (0, first_1)
        pair = (request_0, request_1)
        return draw_hybrid(
            pair, block_size, blocks_per_kv_block, first_positions=firsts, seed=seed
        )

    return live_figure(redraw, controls, split_columns(controls, 3))
