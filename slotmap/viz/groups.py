"""Lesson 06's figures and widgets for KV-cache groups, adaptive tiles and replay padding.

* ``draw_groups``: a full-attention group (paged, blocks of ``full_block_size``) beside a
  sliding-window group (a ring of ``ring_size`` slots per request, lesson 04) for one batch,
  both from ONE launch of the fused kernel ``slotmap.compute_slot_mappings``: its
  ``[num_groups, max_num_tokens]`` output as two rows under the tokens, then each group's
  block table and cache, one group under the other (the slots earlier steps wrote hatched,
  a ring slot two tokens of the batch write edged in red).
* ``draw_tiling``: what ``slotmap.choose_tiling`` picks for a few batch shapes, and what a
  fixed small or large tile would cost there (lanes issued per token, tiles the busiest
  program walks one after another); each batch is also run through the fused kernel with the
  adaptive choice and compared with the reference.
* ``draw_replay``: a prefix-cache hit whose sliding-window group needs the last ``window``
  cached positions recomputed: the fused kernel's slots, then ``slotmap.pad_replayed_slots``
  padding the replayed positions in the prefix-cacheable (full-attention) group only; the
  ring is sized to hold the window and the new tokens (``ring_size_for``).

Patches and texts carry a gid (``token``, ``group0-slot``, ``group1-slot``, ``group1-collision``,
``cache0-slot``, ``replayed``, ``after-pad``, ...) so that a test can read a figure back.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from slotmap.i18n import N_, _, ngettext, tr
from slotmap.viz import draw, style
from slotmap.viz.draw import GAP, SHARED, Canvas, SlotRow, shared_slots

if TYPE_CHECKING:
    from ipywidgets import VBox
    from matplotlib.figure import Figure


__all__ = ["SHARED", "draw_groups", "draw_replay", "draw_tiling", "groups_widget"]


@dataclass
class GroupsRun:
    """One batch, two KV-cache groups, and the fused kernel's output for them."""

    positions: list[list[int]]  # per request
    block_sizes: list[int]  # [full attention, ring]
    tables: list[list[list[int]]]  # per group: one row per request
    used: list[list[int]]  # per group: entries each request's positions use
    num_blocks: list[int]  # per group: physical blocks in its cache
    max_num_tokens: int
    slots: list[list[int]]  # the kernel's [2, max_num_tokens]
    expected: list[list[int]]  # slot_mappings_oracle
    tiling: tuple[int, int]  # (tile, parallel tiles) the launcher chose

    @property
    def num_tokens(self) -> int:
        return sum(len(row) for row in self.positions)

    def ring_collisions(self) -> set[int]:
        return shared_slots(self.slots[1][: self.num_tokens])


def run_groups(
    lengths: Sequence[int] = (6, 3, 1),
    first_positions: Sequence[int] = (0, 9, 21),
    full_block_size: int = 4,
    ring_size: int = 8,
    *,
    padding: int = 2,
    seed: int = 1,
) -> GroupsRun:
    """Build a batch on ``slotmap.DEVICE`` and run both groups in one fused launch."""
    import slotmap

    lengths = [int(n) for n in lengths]
    firsts = [int(p) for p in first_positions][: len(lengths)]
    positions = [list(range(f, f + n)) for f, n in zip(firsts, lengths, strict=True)]
    rng = random.Random(seed)
    full_used = draw.blocks_used(firsts, lengths, full_block_size)
    full_blocks = sum(full_used) + 2  # a shuffled pool two blocks larger than needed
    full_rows = draw.scattered_table(full_used, full_blocks, rng)
    ring_blocks = len(lengths) + 2
    ring_rows = [[b] for b in rng.sample(range(ring_blocks), len(lengths))]
    qsl, pos = draw.batch_tensors(lengths, positions)
    device = qsl.device
    tables = [torch.tensor(t, dtype=torch.int32, device=device) for t in (full_rows, ring_rows)]
    sizes = [full_block_size, ring_size]
    circular = [False, True]
    max_num_tokens = sum(lengths) + padding
    slots = slotmap.compute_slot_mappings(
        qsl, pos, tables, sizes, circular=circular, max_num_tokens=max_num_tokens
    )
    expected = slotmap.slot_mappings_oracle(
        qsl.cpu(),
        pos.cpu(),
        [t.cpu() for t in tables],
        sizes,
        circular=circular,
        max_num_tokens=max_num_tokens,
    )
    return GroupsRun(
        positions,
        sizes,
        [full_rows, ring_rows],
        [full_used, [1 if n else 0 for n in lengths]],
        [full_blocks, ring_blocks],
        max_num_tokens,
        slots.cpu().tolist(),
        expected.tolist(),
        slotmap.choose_tiling(sum(lengths), len(lengths)),
    )


def draw_groups(
    lengths: Sequence[int] = (6, 3, 1),
    first_positions: Sequence[int] = (0, 9, 21),
    full_block_size: int = 4,
    ring_size: int = 8,
    *,
    padding: int = 2,
    seed: int = 1,
) -> Figure:
    """One fused launch, two groups: the output rows, then each group's table and cache."""
    run = run_groups(
        lengths, first_positions, full_block_size, ring_size, padding=padding, seed=seed
    )
    return draw_groups_run(run)


def draw_groups_run(run: GroupsRun) -> Figure:
    """Draw a ``GroupsRun`` (see ``draw_groups``): the launch's two output rows under the
    tokens, then group 0's block table and cache, then group 1's, each over the full width
    (the figure is as wide as its widest row: the tokens or group 0's block table)."""
    full_size, ring_size = run.block_sizes
    requests = len(run.positions)
    table_width = max((len(row) for row in run.tables[0]), default=1)
    width = float(max(run.max_num_tokens, table_width, 2 * ring_size + GAP, 30))
    # The widget's sliders keep width <= hybrid.MAX_CELLS, where every label fits its cell.
    per_line = [max(1, int((width + GAP) // (size + GAP))) for size in run.block_sizes]
    lines = [-(-n // p) for n, p in zip(run.num_blocks, per_line, strict=True)]
    y_table = [5.0, 0.0]
    y_cache = [y_table[0] + requests + 1.6, 0.0]
    y_table[1] = y_cache[0] + lines[0] * 2.0 + 1.2
    y_cache[1] = y_table[1] + requests + 1.6
    canvas = Canvas(width, y_cache[1] + lines[1] * 2.0 + 0.2, title_lines=3)
    collisions = run.ring_collisions()

    # The launch's output: one row per group under the batch's tokens.
    canvas.heading(
        0,
        _(
            "batch tokens (colour: request; grey: padding) and the fused kernel's "
            "slot_mappings rows"
        ),
    )
    rows = [
        SlotRow(_("group 0: full"), run.slots[0], "group0-slot", "group0-pad"),
        SlotRow(_("group 1: ring"), run.slots[1], "group1-slot", "group1-pad", collisions),
    ]
    canvas.token_rows(0, run.positions, rows, run.max_num_tokens)

    # Group 0: its block table, then its cache; group 1 below, the same way.
    slots = ngettext("{n} slot", "{n} slots", full_size).format(n=full_size)
    full = _("group 0: full attention, paged, blocks of {slots}").format(slots=slots)
    earlier = draw.earlier(run.positions, run.tables[0], full_size)
    hatched = _("hatched: written by earlier steps; under a block: its number and slots")
    _paint_group(canvas, run, 0, y_table[0], y_cache[0], full, hatched, earlier=earlier)
    ring = _("group 1: sliding window, a ring of {ring_size} slots a request").format(
        ring_size=ring_size
    )
    red = _("red edge: two tokens of this step, one slot")
    _paint_group(canvas, run, 1, y_table[1], y_cache[1], ring, red, collisions=collisions)

    tile, parallel = run.tiling
    verdict = _("kernel = reference") if run.slots == run.expected else _("KERNEL DIFFERS")
    warning = (
        _(
            "red: a chunk longer than the ring ({slots}) writes a ring slot "
            "twice (lesson 04's collision)"
        ).format(slots=ngettext("{n} slot", "{n} slots", ring_size).format(n=ring_size))
        if collisions
        else _("no ring slot written twice (every chunk fits its ring of {ring_size})").format(
            ring_size=ring_size
        )
    )
    title = _(
        "One launch, grid (2 groups, {requests} requests + 1, {parallel}), tile {tile}, "
        "max_num_tokens {max_num_tokens}: slotmap.compute_slot_mappings: {verdict}\n"
        "group 0 slot = table0[q, p // {full_size}] * {full_size} + p % {full_size};   "
        "group 1 slot = ring[q] * {ring_size} + p % {ring_size}\n{warning}"
    )
    canvas.title(
        title.format(
            requests=requests,
            parallel=parallel,
            tile=tile,
            max_num_tokens=run.max_num_tokens,
            verdict=verdict,
            full_size=full_size,
            ring_size=ring_size,
            warning=warning,
        )
    )
    canvas.fig.slotmap_run = run
    return canvas.fig


def _paint_group(canvas, run: GroupsRun, g: int, y_table, y_cache, name, legend, **marks):
    """Group ``g``'s block table, then its cache with what this batch wrote (``marks``: the
    cache's ``earlier`` or ``collisions``)."""
    table = _("{name}: its block table (one ring each)") if g else _("{name}: its block table")
    canvas.heading(y_table, table.format(name=name))
    canvas.table_rows(0, y_table, run.tables[g], run.used[g], label_x=-0.25)
    canvas.heading(y_cache, _("its KV cache (label: position; {legend})").format(legend=legend))
    canvas.row_title(y_cache, _("slots"))
    landed = draw.landed(run.positions, run.slots[g])
    canvas.cache(y_cache, run.block_sizes[g], run.num_blocks[g], landed, f"cache{g}", **marks)


def groups_widget(
    lengths: Sequence[int] = (6, 3, 1), first_positions: Sequence[int] = (0, 9, 21)
) -> VBox:
    """Sliders for three request lengths, the positions requests 1 and 2 start at (each its
    own slider; request 0 is a prefill from 0), the full-attention block size and the ring
    size; every change re-runs the fused kernel."""
    from slotmap.viz.live import live_figure, request_sliders, slider, split_columns

    controls = request_sliders(lengths, 10)
    for q in (1, 2):
        starts = _("request {request} starts at").format(request=q)
        controls[f"start_{q}"] = slider(starts, first_positions[q], 0, MAX_START)
    controls["full_block_size"] = slider(_("full block size"), 4, 1, 8)
    controls["ring_size"] = slider(_("ring slots"), 8, 2, 12)

    def redraw(request_0, request_1, request_2, start_1, start_2, full_block_size, ring_size):
        lengths, firsts = (request_0, request_1, request_2), (0, start_1, start_2)
        return draw_groups(lengths, firsts, full_block_size, ring_size)

    return live_figure(redraw, controls, split_columns(controls, 3))


MAX_START = 24  # the groups widget's latest start: 24 + 10 tokens, 34 <= hybrid.MAX_CELLS


# ---------------------------------------------------------------------------------------------
# Adaptive tiles
# ---------------------------------------------------------------------------------------------
TILING_SHAPES = (
    (N_("decode\n32 x 1"), (1,) * 32),
    (N_("short chunks\n8 x 40"), (40,) * 8),
    (N_("prefill\n2 x 2048"), (2048, 2048)),
    (N_("skewed\n2 x 1536 + 32 x 1"), (1536, 1536) + (1,) * 32),
)


def tiling_cost(lengths: Sequence[int], tile: int, parallel: int) -> tuple[float, int]:
    """(lanes issued per real token, tiles the busiest program walks one after another) of a
    launch that spreads each request over ``parallel`` programs of ``tile`` lanes."""
    tiles = [-(-n // tile) for n in lengths]
    lanes = sum(t * tile for t in tiles)
    return lanes / max(sum(lengths), 1), max((-(-t // parallel) for t in tiles), default=0)


@dataclass
class TilingRow:
    name: str
    lengths: tuple[int, ...]
    chosen: tuple[int, int]  # choose_tiling's (tile, parallel tiles)
    costs: dict[str, tuple[float, int]]  # tiling label -> tiling_cost
    agrees: bool  # the fused kernel, with the chosen tiling, matched the reference


def run_tiling(shapes=TILING_SHAPES, block_size: int = 16) -> list[TilingRow]:
    """choose_tiling for each batch shape, the costs of three tilings, and one fused launch
    per shape (adaptive tiling) checked against the reference."""
    import slotmap

    rows = []
    for name, lengths in shapes:
        chosen = slotmap.choose_tiling(sum(lengths), len(lengths))
        positions = [list(range(5, 5 + n)) for n in lengths]
        qsl, pos = draw.batch_tensors(lengths, positions)
        width = (5 + max(lengths)) // block_size + 1
        entries = torch.randperm(len(lengths) * width, generator=torch.Generator().manual_seed(0))
        table = entries.view(len(lengths), width).to(torch.int32).to(slotmap.DEVICE)
        slots = slotmap.compute_slot_mappings(qsl, pos, [table], [block_size])
        expected = slotmap.slot_mappings_torch(qsl, pos, [table], [block_size])
        costs = {
            f"adaptive: {chosen[0]} x {chosen[1]}": tiling_cost(lengths, *chosen),
            "fixed 16 x 1": tiling_cost(lengths, 16, 1),
            "fixed 1024 x 1": tiling_cost(lengths, 1024, 1),
        }
        rows.append(
            TilingRow(
                name, tuple(lengths), chosen, costs, bool(torch.equal(slots.cpu(), expected.cpu()))
            )
        )
    return rows


def draw_tiling(shapes=TILING_SHAPES) -> Figure:
    """Bars: lanes issued per token and the busiest program's tiles, for three tilings."""
    import matplotlib.pyplot as plt
    import numpy as np

    rows = run_tiling(shapes)
    style.use_cjk_font()
    fig, (lanes_ax, walk_ax) = plt.subplots(1, 2, figsize=(style.WIDTH, 3.8))
    fig.subplots_adjust(left=0.07, right=0.99, top=0.76, bottom=0.3, wspace=0.22)
    x = np.arange(len(rows))
    colours = (style.request_colour(0), style.PAD, style.request_colour(1))
    labels = (
        _("adaptive (choose_tiling)"),
        _("fixed tile 16, 1 program a request"),
        _("fixed tile 1024, 1 program a request"),
    )
    for k, (colour, label) in enumerate(zip(colours, labels, strict=True)):
        lanes = [list(r.costs.values())[k][0] for r in rows]
        walks = [list(r.costs.values())[k][1] for r in rows]
        for ax, values in ((lanes_ax, lanes), (walk_ax, walks)):
            look = {"color": colour, "edgecolor": style.EDGE, "label": label, "linewidth": 0.6}
            bars = ax.bar(x + (k - 1) * 0.27, values, 0.27, **look)
            for bar in bars:
                bar.set_gid(f"tiling-{k}")
            ax.bar_label(bars, fmt="%.4g", fontsize=style.FONT_SIZE - 2, padding=1)
    for ax, title in (
        (lanes_ax, _("lanes issued per real token (1 = no masked lane)")),
        (walk_ax, _("tiles the busiest program walks, one after another")),
    ):
        ax.set_xticks(x, [tr(r.name) for r in rows], fontsize=style.FONT_SIZE - 1)
        ax.set_yscale("log")
        ax.set_title(title, fontsize=style.FONT_SIZE)
        ax.tick_params(axis="y", labelsize=style.FONT_SIZE - 1)
        ax.spines[["top", "right"]].set_visible(False)
        ax.margins(y=0.25)
    for i, r in enumerate(rows):
        where = {
            "xytext": (0, -38),
            "textcoords": "offset points",
            "xycoords": ("data", "axes fraction"),
        }
        font = {"ha": "center", "fontsize": style.FONT_SIZE - 1, "color": style.request_colour(0)}
        picks = _("picks {tile} x {programs}").format(tile=r.chosen[0], programs=r.chosen[1])
        lanes_ax.annotate(picks, (i, 0), **where, **font)
    draw.legend(fig, lanes_ax.get_legend_handles_labels()[0], loc="lower center", ncol=3)
    verdict = (
        _("every batch run through the fused kernel with its adaptive tiling: kernel = reference")
        if all(r.agrees for r in rows)
        else _("KERNEL DIFFERS FROM THE REFERENCE on {shapes}").format(
            shapes=", ".join(tr(r.name) for r in rows)
        )
    )
    title = _(
        "choose_tiling(num_tokens, num_reqs) -> (tile, programs a request): a 16-lane tile for "
        "decode batches,\n1024 lanes for the rest, and several programs a request once the "
        "batch holds more than one tile\n"
    )
    fig.suptitle(title + verdict, fontsize=style.FONT_SIZE + 1)
    fig.slotmap_rows = rows
    return fig


# ---------------------------------------------------------------------------------------------
# Replay padding
# ---------------------------------------------------------------------------------------------
@dataclass
class ReplayRun:
    """A prefix-cache hit with replay, its two groups' slots before and after the padding."""

    cached: int  # request 0 found positions [0, cached) in shared prefix-cached blocks
    window: int  # positions replayed: [cached - window, cached)
    positions: list[list[int]]
    replay_start: list[int]  # per request, 0: no replay
    block_size: int  # the full-attention group's
    ring_size: int
    full_table: list[list[int]]
    full_used: list[int]
    num_blocks: int
    before: list[list[int]]  # compute_slot_mappings
    after: list[list[int]]  # pad_replayed_slots(before, ...), prefix_cacheable = [True, False]
    expected: list[list[int]]  # replay_padding_oracle on the reference's slots

    @property
    def num_tokens(self) -> int:
        return sum(len(row) for row in self.positions)

    def ring_collisions(self) -> set[int]:
        return shared_slots(self.after[1][: self.num_tokens])

    def prefix_slots(self) -> dict[int, int]:
        """slot -> position of request 0's cached prefix, in its shared blocks."""
        b, row = self.block_size, self.full_table[0]
        return {row[p // b] * b + p % b: p for p in range(self.cached)}

    def replayed(self) -> list[bool]:
        """Per batch token: is its position replayed?"""
        flags = []
        for request, row in enumerate(self.positions):
            first = self.replay_start[request]
            flags += [first > 0 and first <= p < first + self.window for p in row]
        return flags


def run_replay(
    cached_blocks: int = 3,
    window: int = 5,
    new_tokens: int = 3,
    block_size: int = 4,
    ring_size: int | None = None,
    *,
    decode_position: int = 9,
    seed: int = 2,
) -> ReplayRun:
    """Request 0 hits ``cached_blocks`` full blocks of the prefix cache and recomputes the last
    ``window`` cached positions before its ``new_tokens``; request 1 decodes one token.

    ``ring_size`` None: the sliding-window group's ring holds what this step writes into it,
    ``window + new_tokens`` slots (at least 8), as an engine sizes it; a smaller ring given
    explicitly makes two positions share a ring slot (``ReplayRun.ring_collisions``).
    """
    import slotmap

    if ring_size is None:
        ring_size = ring_size_for(window, new_tokens)
    cached = cached_blocks * block_size
    replay_start = max(cached - window, 0)
    positions = [
        list(range(replay_start, cached + new_tokens)),
        [decode_position],
    ]
    lengths = [len(row) for row in positions]
    firsts = [0, 0]  # both rows hold every block from position 0 on
    spans = [cached + new_tokens, decode_position + 1]
    rng = random.Random(seed)
    full_used = draw.blocks_used(firsts, spans, block_size)
    num_blocks = sum(full_used) + 2
    full_table = draw.scattered_table(full_used, num_blocks, rng)
    ring_table = [[b] for b in rng.sample(range(4), 2)]
    qsl, pos = draw.batch_tensors(lengths, positions)
    device = qsl.device
    tables = [torch.tensor(t, dtype=torch.int32, device=device) for t in (full_table, ring_table)]
    sizes, circular, cacheable = [block_size, ring_size], [False, True], [True, False]
    starts = torch.tensor([replay_start, 0], dtype=torch.int32, device=device)
    before = slotmap.compute_slot_mappings(qsl, pos, tables, sizes, circular=circular)
    after = slotmap.pad_replayed_slots(before.clone(), qsl, pos, starts, window, cacheable)
    reference = slotmap.slot_mappings_oracle(
        qsl.cpu(), pos.cpu(), [t.cpu() for t in tables], sizes, circular=circular
    )
    expected = slotmap.replay_padding_oracle(
        reference, qsl.cpu(), pos.cpu(), starts.cpu(), window, cacheable
    )
    return ReplayRun(
        cached,
        window,
        positions,
        [replay_start, 0],
        block_size,
        ring_size,
        full_table,
        full_used,
        num_blocks,
        before.cpu().tolist(),
        after.cpu().tolist(),
        expected.tolist(),
    )


def ring_size_for(window: int, new_tokens: int) -> int:
    """The replay figure's ring: it must hold the ``window`` replayed positions and the
    ``new_tokens`` of the step, or two of them would share a slot (lesson 04)."""
    return max(8, window + new_tokens)


def draw_replay(
    cached_blocks: int = 3,
    window: int = 5,
    new_tokens: int = 3,
    block_size: int = 4,
    ring_size: int | None = None,
) -> Figure:
    """Run the fused kernel and the replay padding; draw the slots and the shared blocks."""
    run = run_replay(cached_blocks, window, new_tokens, block_size, ring_size)
    return draw_replay_run(run)


def draw_replay_run(run: ReplayRun) -> Figure:
    """Draw a ``ReplayRun`` (see ``draw_replay``)."""
    b = run.block_size
    width = float(max(run.num_tokens, 26))  # cells wide enough for "PAD" at the cells' size
    y_table = 6.3
    y_cache = y_table + 2 + 1.4
    per_line = max(1, int((width + GAP) // (b + GAP)))
    collisions = run.ring_collisions()
    height = y_cache + -(-run.num_blocks // per_line) * 2.0 + 0.2
    canvas = Canvas(width, height, left=0.2, title_lines=4 if collisions else 3)

    _paint_replay_rows(canvas, run)
    _paint_shared_table(canvas, run, y_table)
    # The cache: shared blocks hold the cached prefix; this batch's writes after the padding.
    landed = draw.landed(run.positions, run.after[0])
    shared = {slot: p for slot, p in run.prefix_slots().items() if slot not in landed}
    canvas.heading(
        y_cache,
        _(
            "group 0's KV cache after this step (hatched blue: the shared prefix; in a "
            "request's colour: its earlier steps)"
        ),
    )
    canvas.row_title(y_cache, _("slots"))
    earlier = draw.earlier(run.positions[1:], run.full_table[1:], b)
    earlier = {slot: (1, p) for slot, (_, p) in earlier.items()}  # request 1's earlier steps
    canvas.cache(y_cache, b, run.num_blocks, landed, "cache0", shared=shared, earlier=earlier)

    first = run.replay_start[0]
    agree = run.after == run.expected
    verdict = _("kernels = reference") if agree else _("KERNELS DIFFER FROM THE REFERENCE")
    span = (
        _("replays positions {first}..{last} (replay_start {first}, window {window})").format(
            first=first, last=first + run.window - 1, window=run.window
        )
        if first > 0
        else _("replay_start {first}: nothing is padded (0 means no replay)").format(first=first)
    )
    lines = [
        _("Prefix-cache hit: request 0 finds positions 0..{last} cached and {span}").format(
            last=run.cached - 1, span=span
        ),
        _(
            "the prefix-cacheable group pads them (its shared blocks keep their bytes), the "
            "ring keeps its slots"
        ),
        _("slotmap.compute_slot_mappings, then slotmap.pad_replayed_slots: {verdict}").format(
            verdict=verdict
        ),
    ]
    if collisions:
        lines.append(
            _(
                "red in the ring row: a ring of {ring_size} slots is too small for the "
                "{positions} positions request 0 writes (the ring must hold w + new tokens)"
            ).format(ring_size=run.ring_size, positions=len(run.positions[0]))
        )
    canvas.title("\n".join(lines))
    canvas.fig.slotmap_run = run
    return canvas.fig


def _paint_replay_rows(canvas: Canvas, run: ReplayRun) -> None:
    """The batch's positions, group 0's slots before and after the padding, and the ring's:
    replayed positions outlined in red in the first two rows, a ring collision in the last."""
    rows = [
        (_("token's position"), None, "token"),
        (_("group 0 (full, cacheable)"), run.before[0], "before"),
        (_("then pad_replayed_slots"), run.after[0], "after"),
        (
            _("group 1 (ring of {ring_size}), after it").format(ring_size=run.ring_size),
            run.after[1],
            "ring",
        ),
    ]
    canvas.heading(0, _("batch tokens (colour: request; red outline: replayed position)"))
    replayed, collisions = run.replayed(), run.ring_collisions()
    token = 0
    for request, row in enumerate(run.positions):
        colour = style.request_colour(request)
        for position in row:
            for y, (_title, values, gid) in enumerate(rows):
                label = position if values is None else values[token]
                pad = label == -1
                edge = style.HIGHLIGHT if replayed[token] and y < 2 else style.EDGE
                kind = f"{gid}-pad" if pad else gid
                if y == 0 and replayed[token]:
                    kind = "replayed"
                if gid == "ring" and label in collisions:
                    edge, kind = style.HIGHLIGHT, "ring-collision"
                look = {"edge": edge, "linewidth": 2.2 if edge == style.HIGHLIGHT else 0.6}
                look["text_colour"] = "black" if pad else "white"
                fill, text = (style.PAD, "PAD") if pad else (colour, label)
                canvas.cell(token, y * 1.2, fill, text, kind, **look)
            token += 1
    for y, (title, _values, _gid) in enumerate(rows):
        canvas.row_title(y * 1.2, title)


def _paint_shared_table(canvas: Canvas, run: ReplayRun, y_table: float) -> None:
    """The full-attention group's block table: request 0's first blocks are shared."""
    shared_blocks = run.cached // run.block_size
    canvas.heading(
        y_table,
        _(
            "group 0's block table: request 0's first {blocks} blocks come from the prefix "
            "cache, shared with other requests (hatched)"
        ).format(blocks=shared_blocks),
    )
    for request, row in enumerate(run.full_table):
        at = (-0.25, y_table + request + 0.4)
        name = _("request {request}").format(request=request)
        canvas.note(*at, name, ha="right", va="center", color="black")
        for k, physical in enumerate(row):
            on, is_shared = k < run.full_used[request], request == 0 and k < shared_blocks
            if is_shared:
                look = (SHARED, "shared-entry", {"text_colour": "black", "hatch": "///"})
            elif on:
                look = (style.request_colour(request), "table-entry", {"text_colour": "white"})
            else:
                look = (style.EMPTY, "table-unused", {"text_colour": "white"})
            fill, gid, extra = look
            canvas.cell(k, y_table + request, fill, physical if on else "", gid, **extra)


def replay_widget(cached_blocks: int = 3, window: int = 5, new_tokens: int = 3) -> VBox:
    """Sliders for the cached prefix (in blocks of 4), the sliding window and the new tokens;
    every change re-runs the fused kernel and the replay padding."""
    from slotmap.viz.live import live_figure, slider

    controls = {
        "cached_blocks": slider(_("cached blocks (of 4)"), cached_blocks, 2, 5),
        "window": slider(_("sliding window"), window, 0, 7),
        "new_tokens": slider(_("new tokens"), new_tokens, 1, 6),
    }
    return live_figure(draw_replay, controls)
