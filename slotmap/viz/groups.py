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

import torch

from slotmap.viz import style
from slotmap.viz.hybrid import GAP, Canvas, plural

SHARED = "#9ecae1"  # a slot of a prefix-cached block that other requests share


def _tensors(lengths: Sequence[int], positions: Sequence[Sequence[int]]):
    import slotmap

    starts = [0]
    for n in lengths:
        starts.append(starts[-1] + n)
    qsl = torch.tensor(starts, dtype=torch.int32, device=slotmap.DEVICE)
    flat = [p for row in positions for p in row]
    return qsl, torch.tensor(flat, dtype=torch.int64, device=slotmap.DEVICE)


def _paged_table(
    firsts: Sequence[int], lengths: Sequence[int], block_size: int, rng: random.Random
) -> tuple[list[list[int]], list[int], int]:
    """(rows, entries used per row, physical blocks in the cache): each request's blocks drawn
    without repeats from a shuffled pool two blocks larger than needed."""
    used = [
        (f + n - 1) // block_size + 1 if n else 0 for f, n in zip(firsts, lengths, strict=True)
    ]
    num_blocks = sum(used) + 2
    pool = rng.sample(range(num_blocks), sum(used))
    width = max(max(used, default=0), 1)
    rows, taken = [], 0
    for count in used:
        rows.append(pool[taken : taken + count] + [0] * (width - count))
        taken += count
    return rows, used, num_blocks


def shared_slots(slots: Sequence[int]) -> set[int]:
    """Slots (not PAD) that two tokens of a batch write: in a ring, a collision."""
    return {s for s in slots if s >= 0 and slots.count(s) > 1}


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
    full_rows, full_used, full_blocks = _paged_table(firsts, lengths, full_block_size, rng)
    ring_blocks = len(lengths) + 2
    ring_rows = [[b] for b in rng.sample(range(ring_blocks), len(lengths))]
    qsl, pos = _tensors(lengths, positions)
    device = slotmap.DEVICE
    tables = [torch.tensor(t, dtype=torch.int32, device=device) for t in (full_rows, ring_rows)]
    sizes = [full_block_size, ring_size]
    circular = [False, True]
    max_num_tokens = sum(lengths) + padding
    slots = slotmap.compute_slot_mappings(
        qsl, pos, tables, sizes, circular=circular, max_num_tokens=max_num_tokens
    )
    expected = slotmap.slot_mappings_oracle(
        qsl.cpu(), pos.cpu(), [t.cpu() for t in tables], sizes, circular=circular,
        max_num_tokens=max_num_tokens,
    )  # fmt: skip
    return GroupsRun(positions, sizes, [full_rows, ring_rows],
                     [full_used, [1 if n else 0 for n in lengths]], [full_blocks, ring_blocks],
                     max_num_tokens, slots.cpu().tolist(), expected.tolist(),
                     slotmap.choose_tiling(sum(lengths), len(lengths)))  # fmt: skip


def _cache(
    canvas: Canvas,
    x0: float,
    width: float,
    y: float,
    block_size: int,
    num_blocks: int,
    landed: dict[int, tuple[int, int]],
    gid: str,
    *,
    collisions: set[int] = frozenset(),
    shared: dict[int, int] | None = None,
    earlier: dict[int, tuple[int, int]] | None = None,
) -> int:
    """A KV cache of ``num_blocks`` blocks in the columns [x0, x0 + width); returns its lines.

    ``landed``: slot -> (request, position) written by this batch; ``shared``: slot ->
    position held by a prefix-cached block (hatched, in SHARED); ``earlier``: slot ->
    (request, position) written by an earlier step (hatched, edged in the request's colour).
    """
    per_line = max(1, int((width + GAP) // (block_size + GAP)))
    widest = num_blocks - 1
    caption = canvas.caption_format(
        ["block {k} · slots {first}-{last}", "block {k}: {first}-{last}", "block {k}", "{k}"],
        {"k": widest, "first": widest * block_size, "last": (widest + 1) * block_size - 1},
        block_size + GAP * 0.8,
    )  # fmt: skip
    shared = shared or {}
    earlier = earlier or {}
    for physical in range(num_blocks):
        line, column = divmod(physical, per_line)
        bx = x0 + column * (block_size + GAP)
        by = y + line * 2.0
        for offset in range(block_size):
            slot = physical * block_size + offset
            if slot in collisions:
                request, position = landed[slot]
                canvas.cell(bx + offset, by, style.request_colour(request), position,
                            f"{gid}-collision", text_colour="white", edge=style.HIGHLIGHT,
                            linewidth=2.4)  # fmt: skip
            elif slot in landed:
                request, position = landed[slot]
                canvas.cell(bx + offset, by, style.request_colour(request), position,
                            f"{gid}-slot", text_colour="white")  # fmt: skip
            elif slot in shared:
                canvas.cell(bx + offset, by, SHARED, shared[slot], f"{gid}-shared",
                            hatch="///")  # fmt: skip
            elif slot in earlier:
                canvas.earlier(bx + offset, by, *earlier[slot], f"{gid}-earlier")
            else:
                canvas.cell(bx + offset, by, style.EMPTY, "", f"{gid}-empty")
        first = physical * block_size
        label = caption.format(k=physical, first=first, last=first + block_size - 1)
        canvas.note(bx + block_size / 2, by + 0.95, label, ha="center", va="top",
                    gid=f"{gid}-caption")  # fmt: skip
    return -(-num_blocks // per_line)


def _landed(positions: Sequence[Sequence[int]], slots: Sequence[int]) -> dict:
    landed, token = {}, 0
    for request, row in enumerate(positions):
        for position in row:
            if slots[token] >= 0:
                landed[slots[token]] = (request, position)
            token += 1
    return landed


def _earlier(
    positions: Sequence[Sequence[int]], rows: Sequence[Sequence[int]], block_size: int
) -> dict:
    """slot -> (request, position) of the positions before each request's first one: the
    tokens earlier steps wrote."""
    found = {}
    for request, row in enumerate(positions):
        for p in range(row[0] if row else 0):
            found[rows[request][p // block_size] * block_size + p % block_size] = (request, p)
    return found


def _table_rows(canvas, x0, y, rows, used, label_x=None):
    """Block-table rows, one per request, coloured by request where used."""
    for request, row in enumerate(rows):
        if label_x is not None:
            canvas.note(label_x, y + request + 0.4, f"request {request}", ha="right",
                        va="center", color="black")  # fmt: skip
        for b, physical in enumerate(row):
            on = b < used[request]
            canvas.cell(x0 + b, y + request, style.request_colour(request) if on else style.EMPTY,
                        physical if on else "", "table-entry" if on else "table-unused",
                        text_colour="white")  # fmt: skip


def draw_groups(
    lengths: Sequence[int] = (6, 3, 1),
    first_positions: Sequence[int] = (0, 9, 21),
    full_block_size: int = 4,
    ring_size: int = 8,
    *,
    padding: int = 2,
    seed: int = 1,
):
    """One fused launch, two groups: the output rows, then each group's table and cache."""
    run = run_groups(lengths, first_positions, full_block_size, ring_size, padding=padding,
                     seed=seed)  # fmt: skip
    return draw_groups_run(run)


def draw_groups_run(run: GroupsRun):
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
    canvas.heading(0, "batch tokens (colour: request; grey: padding) and the fused kernel's "
                   "slot_mappings rows")  # fmt: skip
    canvas.row_title(0, "token's position")
    canvas.row_title(1, "group 0: full")
    canvas.row_title(2, "group 1: ring")
    token = 0
    for request, row in enumerate(run.positions):
        colour = style.request_colour(request)
        for position in row:
            canvas.cell(token, 0, colour, position, "token", text_colour="white")
            canvas.cell(token, 1, colour, run.slots[0][token], "group0-slot", text_colour="white")
            ring = run.slots[1][token]
            hit = ring in collisions
            canvas.cell(token, 2, colour, ring, "group1-collision" if hit else "group1-slot",
                        text_colour="white", edge=style.HIGHLIGHT if hit else style.EDGE,
                        linewidth=2.4 if hit else 0.6)  # fmt: skip
            token += 1
    pad_label = "PAD" if canvas.fits("PAD", 1) else ""
    for pad in range(run.num_tokens, run.max_num_tokens):
        canvas.cell(pad, 0, style.PAD, "", "pad-token", hatch="///")
        for g in (0, 1):
            canvas.cell(pad, 1 + g, style.PAD, pad_label, f"group{g}-pad", size=canvas.small)

    # Group 0: its block table, then its cache; group 1 below, the same way.
    canvas.heading(y_table[0], f"group 0: full attention, paged, blocks of "
                   f"{plural(full_size, 'slot')}: its block table")  # fmt: skip
    _table_rows(canvas, 0, y_table[0], run.tables[0], run.used[0], label_x=-0.25)
    canvas.heading(y_cache[0], "its KV cache (label: position; hatched: written by earlier "
                   "steps; under a block: its number and slots)")  # fmt: skip
    canvas.row_title(y_cache[0], "slots")
    _cache(canvas, 0, width, y_cache[0], full_size, run.num_blocks[0],
           _landed(run.positions, run.slots[0]), "cache0",
           earlier=_earlier(run.positions, run.tables[0], full_size))  # fmt: skip
    canvas.heading(y_table[1], f"group 1: sliding window, a ring of {ring_size} slots a "
                   "request: its block table (one ring each)")  # fmt: skip
    _table_rows(canvas, 0, y_table[1], run.tables[1], run.used[1], label_x=-0.25)
    canvas.heading(y_cache[1], "its KV cache (label: position; red edge: two tokens of this "
                   "step, one slot)")  # fmt: skip
    canvas.row_title(y_cache[1], "slots")
    _cache(canvas, 0, width, y_cache[1], ring_size, run.num_blocks[1],
           _landed(run.positions, run.slots[1]), "cache1", collisions=collisions)  # fmt: skip

    tile, parallel = run.tiling
    verdict = "kernel = reference" if run.slots == run.expected else "KERNEL DIFFERS"
    warning = (
        f"red: a chunk longer than the ring ({plural(ring_size, 'slot')}) writes a ring slot "
        "twice (lesson 04's collision)"
        if collisions
        else f"no ring slot written twice (every chunk fits its ring of {ring_size})"
    )
    canvas.title(
        f"One launch, grid (2 groups, {requests} requests + 1, {parallel}), tile {tile}, "
        f"max_num_tokens {run.max_num_tokens}: slotmap.compute_slot_mappings: {verdict}\n"
        f"group 0 slot = table0[q, p // {full_size}] * {full_size} + p % {full_size};   "
        f"group 1 slot = ring[q] * {ring_size} + p % {ring_size}\n{warning}"
    )
    canvas.fig.slotmap_run = run
    return canvas.fig


def groups_widget(lengths: Sequence[int] = (6, 3, 1), first_positions: Sequence[int] = (0, 9, 21)):
    """Sliders for three request lengths, the positions requests 1 and 2 start at (each its
    own slider; request 0 is a prefill from 0), the full-attention block size and the ring
    size; every change re-runs the fused kernel."""
    import ipywidgets as widgets

    from slotmap.viz.live import columns, live_figure

    wide = {"description_width": "initial"}
    controls = {
        f"request_{q}": widgets.IntSlider(value=n, min=0, max=10, description=f"request {q}")
        for q, n in enumerate(lengths)
    }
    for q in (1, 2):
        controls[f"start_{q}"] = widgets.IntSlider(
            value=first_positions[q], min=0, max=MAX_START,
            description=f"request {q} starts at", style=wide,
        )  # fmt: skip
    controls["full_block_size"] = widgets.IntSlider(
        value=4, min=1, max=8, description="full block size", style=wide
    )
    controls["ring_size"] = widgets.IntSlider(
        value=8, min=2, max=12, description="ring slots", style=wide
    )
    names = list(controls)
    layout = columns([controls[n] for n in names[:3]], [controls[n] for n in names[3:]])

    def draw(request_0, request_1, request_2, start_1, start_2, full_block_size, ring_size):
        return draw_groups((request_0, request_1, request_2), (0, start_1, start_2),
                           full_block_size, ring_size)  # fmt: skip

    return live_figure(draw, controls, layout)


MAX_START = 24  # the groups widget's latest start: 24 + 10 tokens, 34 <= hybrid.MAX_CELLS


# ---------------------------------------------------------------------------------------------
# Adaptive tiles
# ---------------------------------------------------------------------------------------------
TILING_SHAPES = (
    ("decode\n32 x 1", (1,) * 32),
    ("short chunks\n8 x 40", (40,) * 8),
    ("prefill\n2 x 2048", (2048, 2048)),
    ("skewed\n2 x 1536 + 32 x 1", (1536, 1536) + (1,) * 32),
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
        qsl, pos = _tensors(lengths, positions)
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
        rows.append(TilingRow(name, tuple(lengths), chosen, costs,
                              bool(torch.equal(slots.cpu(), expected.cpu()))))  # fmt: skip
    return rows


def draw_tiling(shapes=TILING_SHAPES):
    """Bars: lanes issued per token and the busiest program's tiles, for three tilings."""
    import matplotlib.pyplot as plt
    import numpy as np

    rows = run_tiling(shapes)
    fig, (lanes_ax, walk_ax) = plt.subplots(1, 2, figsize=(style.WIDTH, 3.8))
    fig.subplots_adjust(left=0.07, right=0.99, top=0.76, bottom=0.3, wspace=0.22)
    x = np.arange(len(rows))
    colours = (style.request_colour(0), style.PAD, style.request_colour(1))
    labels = ("adaptive (choose_tiling)", "fixed tile 16, 1 program a request",
              "fixed tile 1024, 1 program a request")  # fmt: skip
    for k, (colour, label) in enumerate(zip(colours, labels, strict=True)):
        lanes = [list(r.costs.values())[k][0] for r in rows]
        walks = [list(r.costs.values())[k][1] for r in rows]
        for ax, values in ((lanes_ax, lanes), (walk_ax, walks)):
            bars = ax.bar(x + (k - 1) * 0.27, values, 0.27, color=colour, edgecolor=style.EDGE,
                          label=label, linewidth=0.6)  # fmt: skip
            for bar in bars:
                bar.set_gid(f"tiling-{k}")
            ax.bar_label(bars, fmt="%.4g", fontsize=style.FONT_SIZE - 2, padding=1)
    for ax, title in (
        (lanes_ax, "lanes issued per real token (1 = no masked lane)"),
        (walk_ax, "tiles the busiest program walks, one after another"),
    ):
        ax.set_xticks(x, [r.name for r in rows], fontsize=style.FONT_SIZE - 1)
        ax.set_yscale("log")
        ax.set_title(title, fontsize=style.FONT_SIZE)
        ax.tick_params(axis="y", labelsize=style.FONT_SIZE - 1)
        ax.spines[["top", "right"]].set_visible(False)
        ax.margins(y=0.25)
    for i, r in enumerate(rows):
        lanes_ax.annotate(f"picks {r.chosen[0]} x {r.chosen[1]}", (i, 0), xytext=(0, -38),
                          textcoords="offset points", xycoords=("data", "axes fraction"),
                          ha="center", fontsize=style.FONT_SIZE - 1,
                          color=style.request_colour(0))  # fmt: skip
    fig.legend(*lanes_ax.get_legend_handles_labels(), loc="lower center", ncol=3,
               fontsize=style.FONT_SIZE - 1, frameon=False)  # fmt: skip
    verdict = (
        "every batch run through the fused kernel with its adaptive tiling: kernel = reference"
        if all(r.agrees for r in rows)
        else "KERNEL DIFFERS FROM THE REFERENCE on " + ", ".join(r.name for r in rows)
    )
    fig.suptitle(
        "choose_tiling(num_tokens, num_reqs) -> (tile, programs a request): a 16-lane tile for "
        "decode batches,\n1024 lanes for the rest, and several programs a request once the "
        "batch holds more than one tile\n" + verdict,
        fontsize=style.FONT_SIZE + 1,
    )
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
    full_table, full_used, num_blocks = _paged_table(firsts, spans, block_size, rng)
    ring_table = [[b] for b in rng.sample(range(4), 2)]
    qsl, pos = _tensors(lengths, positions)
    device = slotmap.DEVICE
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
    return ReplayRun(cached, window, positions, [replay_start, 0], block_size, ring_size,
                     full_table, full_used, num_blocks, before.cpu().tolist(),
                     after.cpu().tolist(), expected.tolist())  # fmt: skip


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
):
    """Run the fused kernel and the replay padding; draw the slots and the shared blocks."""
    run = run_replay(cached_blocks, window, new_tokens, block_size, ring_size)
    return draw_replay_run(run)


def draw_replay_run(run: ReplayRun):
    """Draw a ``ReplayRun`` (see ``draw_replay``)."""
    b = run.block_size
    width = float(max(run.num_tokens, 26))  # cells wide enough for "PAD" at the cells' size
    y_table = 6.3
    y_cache = y_table + 2 + 1.4
    per_line = max(1, int((width + GAP) // (b + GAP)))
    replayed = run.replayed()
    collisions = run.ring_collisions()
    canvas = Canvas(width, y_cache + -(-run.num_blocks // per_line) * 2.0 + 0.2, left=0.2,
                    title_lines=4 if collisions else 3)  # fmt: skip

    rows = [
        ("token's position", None, "token"),
        ("group 0 (full, cacheable)", run.before[0], "before"),
        ("then pad_replayed_slots", run.after[0], "after"),
        (f"group 1 (ring of {run.ring_size}), after it", run.after[1], "ring"),
    ]
    canvas.heading(0, "batch tokens (colour: request; red outline: replayed position)")
    token = 0
    for request, row in enumerate(run.positions):
        colour = style.request_colour(request)
        for position in row:
            for y, (_, values, gid) in enumerate(rows):
                label = position if values is None else values[token]
                pad = label == -1
                edge = style.HIGHLIGHT if replayed[token] and y < 2 else style.EDGE
                kind = f"{gid}-pad" if pad else gid
                if y == 0 and replayed[token]:
                    kind = "replayed"
                if gid == "ring" and label in collisions:
                    edge, kind = style.HIGHLIGHT, "ring-collision"
                canvas.cell(token, y * 1.2, style.PAD if pad else colour,
                            "PAD" if pad else label, kind,
                            text_colour="black" if pad else "white", edge=edge,
                            linewidth=2.2 if edge == style.HIGHLIGHT else 0.6)  # fmt: skip
            token += 1
    for y, (title, _, _) in enumerate(rows):
        canvas.row_title(y * 1.2, title)

    # The full-attention group's block table: request 0's first blocks are shared.
    shared_blocks = run.cached // b
    canvas.heading(
        y_table,
        f"group 0's block table: request 0's first {shared_blocks} blocks come from the prefix "
        "cache, shared with other requests (hatched)",
    )
    for request, row in enumerate(run.full_table):
        canvas.note(-0.25, y_table + request + 0.4, f"request {request}", ha="right",
                    va="center", color="black")  # fmt: skip
        for k, physical in enumerate(row):
            on = k < run.full_used[request]
            is_shared = request == 0 and k < shared_blocks
            canvas.cell(k, y_table + request,
                        SHARED if is_shared else style.request_colour(request) if on
                        else style.EMPTY, physical if on else "",
                        "shared-entry" if is_shared else "table-entry" if on else "table-unused",
                        text_colour="black" if is_shared else "white",
                        hatch="///" if is_shared else None)  # fmt: skip

    # The cache: shared blocks hold the cached prefix; this batch's writes after the padding.
    landed = _landed(run.positions, run.after[0])
    shared = {}
    for p in range(run.cached):
        physical = run.full_table[0][p // b]
        shared[physical * b + p % b] = p
    for slot in landed:
        shared.pop(slot, None)
    canvas.heading(y_cache, "group 0's KV cache after this step (hatched blue: the shared "
                   "prefix; in a request's colour: its earlier steps)")  # fmt: skip
    canvas.row_title(y_cache, "slots")
    earlier = _earlier(run.positions[1:], run.full_table[1:], b)
    earlier = {slot: (1, p) for slot, (_, p) in earlier.items()}  # request 1's earlier steps
    _cache(canvas, 0, width, y_cache, b, run.num_blocks, landed, "cache0", shared=shared,
           earlier=earlier)  # fmt: skip

    first = run.replay_start[0]
    agree = run.after == run.expected
    verdict = "kernels = reference" if agree else "KERNELS DIFFER FROM THE REFERENCE"
    span = (
        f"replays positions {first}..{first + run.window - 1} (replay_start {first}, "
        f"window {run.window})"
        if first > 0
        else f"replay_start {first}: nothing is padded (0 means no replay)"
    )
    lines = [
        f"Prefix-cache hit: request 0 finds positions 0..{run.cached - 1} cached and {span}",
        "the prefix-cacheable group pads them (its shared blocks keep their bytes), the ring "
        "keeps its slots",
        f"slotmap.compute_slot_mappings, then slotmap.pad_replayed_slots: {verdict}",
    ]
    if collisions:
        lines.append(
            f"red in the ring row: a ring of {run.ring_size} slots is too small for the "
            f"{len(run.positions[0])} positions request 0 writes (the ring must hold w + new "
            "tokens)"
        )
    canvas.title("\n".join(lines))
    canvas.fig.slotmap_run = run
    return canvas.fig


def replay_widget(cached_blocks: int = 3, window: int = 5, new_tokens: int = 3):
    """Sliders for the cached prefix (in blocks of 4), the sliding window and the new tokens;
    every change re-runs the fused kernel and the replay padding."""
    import ipywidgets as widgets

    from slotmap.viz.live import live_figure

    wide = {"description_width": "initial"}
    controls = {
        "cached_blocks": widgets.IntSlider(
            value=cached_blocks, min=2, max=5, description="cached blocks (of 4)", style=wide
        ),
        "window": widgets.IntSlider(
            value=window, min=0, max=7, description="sliding window", style=wide
        ),
        "new_tokens": widgets.IntSlider(
            value=new_tokens, min=1, max=6, description="new tokens", style=wide
        ),
    }
    return live_figure(draw_replay, controls)
