"""Lesson 05's figures and widget: context parallelism, drawn from real kernel runs.

* ``draw_ownership``: one request of ``seq_len`` positions split over ``world_size`` ranks.
  The production kernel runs once per rank (``cp_rank = r``, each rank with its own block
  table); the top row colours every position by the rank whose kernel gave it a slot, the
  rows below show each rank's packed local layout (logical blocks of its own cache, each box
  labelled with the position it holds), and the last row the chosen rank's raw slot mapping.
  A configuration the launcher rejects (``kv_cache_block_size % interleave != 0``) is run
  through the production kernel launched past the launcher's checks, and its collisions are
  drawn in red.
* ``draw_five_steps``: the five context-parallel steps (docs/semantics.md §2) as a table, one
  column per position; the last row is the slot the kernel gave on the owner rank.
* ``draw_rank_run``: the evidence of a real multi-process run (``slotmap.cp``): who stored
  each token (all-gathered), the slots, and the all-reduced count that must be 1.

Patches carry a ``gid`` (``position-rank-R``, ``local-rank-R``, ``local-collision``,
``slot``, ``slot-pad``, ``count-ok``, ``count-bad``, ...) so tests can count what a figure
shows.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

from slotmap.backend import DEVICE
from slotmap.cp import CPBatch, RankEvidence, five_steps, launch_unchecked, local_layout
from slotmap.kernels.slot_mapping import compute_slot_mapping
from slotmap.layout import PAD_SLOT_ID
from slotmap.viz.style import (
    EDGE,
    EMPTY,
    FONT_SIZE,
    HIGHLIGHT,
    PAD,
    WIDTH,
    boxes,
    request_colour,
)

OK = "#1b7f3b"
BLOCK_GAP = 0.35  # space between two logical blocks of a rank's local layout, in cells


def rank_colour(rank: int) -> str:
    return request_colour(rank)


@dataclass
class OwnershipRun:
    """One request run through the kernel on every rank."""

    batch: CPBatch
    valid: bool  # the launcher accepts the configuration
    launcher_message: str  # what compute_slot_mapping says about it
    slots: list[list[int]]  # [rank][token], from the kernel
    tables: list[list[int]]  # [rank] -> block-table row of the request
    local: list[list[int]]  # [rank][token]: local position, -1 where the rank stores nothing

    @property
    def positions(self) -> list[int]:
        return self.batch.positions

    def owners(self, token: int) -> list[int]:
        return [r for r in range(self.batch.world_size) if self.slots[r][token] != PAD_SLOT_ID]


def run_ownership(
    world_size: int,
    interleave: int,
    kv_cache_block_size: int,
    seq_len: int,
    block_size: int | None = None,
    seed: int = 0,
) -> OwnershipRun:
    """One request of positions 0..seq_len-1 through the production kernel, once per rank."""
    block_size = block_size or kv_cache_block_size
    batch = CPBatch((seq_len,), block_size, kv_cache_block_size, world_size, interleave,
                    seed=seed)  # fmt: skip
    valid, message = True, "compute_slot_mapping accepts this configuration."
    slots, tables, local = [], [], []
    for rank in range(world_size):
        qsl, positions, table = batch.tensors(rank, DEVICE)
        options = batch.options(rank)
        try:
            out = compute_slot_mapping(qsl, positions, table, block_size, **options)
        except ValueError as error:
            valid, message = False, f"compute_slot_mapping raises ValueError: {error}"
            out = launch_unchecked(qsl, positions, table, block_size, **options)
        values = out.cpu().tolist()
        rows = table.cpu().tolist()
        slots.append(values)
        tables.append(rows[0])
        local.append(local_layout(values, batch, rows))
    return OwnershipRun(batch, valid, message, slots, tables, local)


@lru_cache(maxsize=1024)
def text_width_pt(text: str, font_size: float) -> float:
    """How wide ``text`` is drawn at ``font_size``, in points (the widest of its lines)."""
    from matplotlib.textpath import TextPath

    return max(TextPath((0, 0), line or " ", size=font_size).get_extents().width
               for line in text.split("\n"))  # fmt: skip


def fitting(candidates: list[list[str]], room_pt: float, font_size: float) -> list[str]:
    """The first list of labels that all fit in ``room_pt`` points each; empty labels when
    none does (a label that does not fit is dropped rather than drawn over its neighbour)."""
    for labels in candidates:
        if all(text_width_pt(label, font_size) <= room_pt for label in labels):
            return labels
    return [""] * len(candidates[0]) if candidates else []


def _label(ax, y: float, text: str, colour: str = "black") -> None:
    ax.text(-0.4, y + 0.4, text, ha="right", va="center", fontsize=FONT_SIZE, color=colour)


def draw_ownership(
    world_size: int = 2,
    rank: int = 0,
    interleave: int = 2,
    kv_cache_block_size: int = 4,
    seq_len: int = 20,
):
    """Positions coloured by their owner, each rank's packed local layout and ``rank``'s slot
    mapping, all from the production kernel run once per rank; returns a Figure."""
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch, Rectangle

    rank = min(rank, world_size - 1)
    run = run_ownership(world_size, interleave, kv_cache_block_size, seq_len)
    block_size = run.batch.block_size
    virtual = kv_cache_block_size * world_size
    n = seq_len
    counts = [sum(1 for v in run.local[r] if v >= 0) for r in range(world_size)]
    # Size the figure from its widest row: a rank's local row is whole blocks with gaps.
    local_blocks = max(-(-(max(run.local[r], default=-1) + 1) // block_size)
                       for r in range(world_size))  # fmt: skip
    local_width = local_blocks * block_size + BLOCK_GAP * max(0, local_blocks - 1)
    width = max(n, local_width, 16)
    axes_left, axes_width = 0.15, 0.83
    cell_pt = axes_width * WIDTH * 72 / (width + 0.4)  # one position's box, in points

    # Rows, top to bottom (y grows upwards in matplotlib: we count down from the top).
    rows = 2.3 + world_size * 1.5 + 1.8
    fig = plt.figure(figsize=(WIDTH, 0.42 * rows + 1.3))
    ax = fig.add_axes([axes_left, 0.1, axes_width, 0.74])
    ax.set_axis_off()
    top = rows
    y_pos = top - 1.6

    # 1. Positions, coloured by the rank whose kernel gave them a slot.
    collided = set()
    for r in range(world_size):
        seen: dict[int, int] = {}
        for token, where in enumerate(run.local[r]):
            if where < 0:
                continue
            if where in seen:
                collided.update({token, seen[where]})
            seen[where] = token
    colours, gids = [], []
    for token in range(n):
        owners = run.owners(token)
        if len(owners) == 1:
            colours.append(rank_colour(owners[0]))
            gids.append(f"position-rank-{owners[0]}")
        else:
            colours.append(HIGHLIGHT)
            gids.append("position-bad")
    patches = boxes(ax, y_pos, colours, [str(p) for p in run.positions], text_colour="white")
    for patch, gid, token in zip(patches, gids, range(n), strict=True):
        patch.set_gid(gid)
        if run.owners(token) == [rank]:  # the chosen rank's positions, outlined
            patch.set_linewidth(2.0)
            patch.set_edgecolor("black")
        if token in collided:
            patch.set_edgecolor(HIGHLIGHT)
            patch.set_linewidth(2.6)
    _label(ax, y_pos, "position\n(colour: owner)")
    # Virtual blocks: brackets above the positions, labelled as fits ("virtual block 3",
    # "vb 3", or nothing).
    for start in range(0, n, virtual):
        end = min(start + virtual, n)
        xs = [start + 0.05, start + 0.05, end - 0.05, end - 0.05]
        ax.plot(xs, [y_pos + 0.95, y_pos + 1.1, y_pos + 1.1, y_pos + 0.95], color=EDGE, lw=0.8)
        index = start // virtual
        (text,) = fitting([[f"virtual block {index}"], [f"vb {index}"]],
                          (end - start) * cell_pt - 4, FONT_SIZE - 1)  # fmt: skip
        if text:
            ax.text((start + end) / 2, y_pos + 1.25, text, ha="center", va="bottom",
                    fontsize=FONT_SIZE - 1, gid="virtual-block-label")  # fmt: skip

    # 2. Each rank's local layout: logical blocks of its own cache, packed from local 0.
    y = y_pos - 0.3
    for r in range(world_size):
        y -= 1.5
        holders: dict[int, list[int]] = {}
        for token, where in enumerate(run.local[r]):
            if where >= 0:
                holders.setdefault(where, []).append(run.positions[token])
        blocks = -(-(max(holders, default=-1) + 1) // block_size)
        for b in range(blocks):
            x0 = b * (block_size + BLOCK_GAP)
            for o in range(block_size):
                held = holders.get(b * block_size + o, [])
                colour = HIGHLIGHT if len(held) > 1 else rank_colour(r) if held else EMPTY
                gid = ("local-collision" if len(held) > 1 else f"local-rank-{r}" if held
                       else "local-empty")  # fmt: skip
                patch = Rectangle((x0 + o, y), 1, 0.8, facecolor=colour, edgecolor=EDGE,
                                  linewidth=2.0 if r == rank else 0.6, gid=gid)  # fmt: skip
                ax.add_patch(patch)
                if held:
                    # Two or more positions in one place: "4|8", else stacked, else "×2".
                    names = list(map(str, held))
                    text, size = "|".join(names), FONT_SIZE if len(held) == 1 else FONT_SIZE - 2
                    if len(held) > 1 and text_width_pt(text, size) > cell_pt - 2:
                        text, size = "\n".join(names), FONT_SIZE - 3
                        if len(held) > 2 or text_width_pt(text, size) > cell_pt - 2:
                            text, size = f"×{len(held)}", FONT_SIZE - 2
                    ax.text(x0 + o + 0.5, y + 0.4, text, ha="center", va="center",
                            color="white", fontsize=size, gid="local-label")  # fmt: skip
        # "block 0 → physical 4" over each block where it fits, else "b0→4", else nothing.
        physical = [run.tables[r][b] if b < len(run.tables[r]) else "?" for b in range(blocks)]
        long = [f"block {b} → physical {m}" for b, m in enumerate(physical)]
        short = [f"b{b}→{m}" for b, m in enumerate(physical)]
        room = (block_size + 0.3) * cell_pt - 3
        for b, text in enumerate(fitting([long, short], room, FONT_SIZE - 2)):
            if text:
                ax.text(b * (block_size + BLOCK_GAP) + block_size / 2, y + 0.88, text,
                        ha="center", va="bottom", fontsize=FONT_SIZE - 2, color="#555555",
                        gid="block-label")  # fmt: skip
        _label(
            ax, y, f"rank {r}: {counts[r]} token{'' if counts[r] == 1 else 's'}", rank_colour(r)
        )

    # 3. The chosen rank's slot mapping, as the kernel wrote it.
    y -= 1.4
    values = run.slots[rank][:n]
    twice = {v for v in values if v != PAD_SLOT_ID and values.count(v) > 1}
    slot_colours = [PAD if v == PAD_SLOT_ID else HIGHLIGHT if v in twice else rank_colour(rank)
                    for v in values]  # fmt: skip
    before = len(ax.texts)
    patches = boxes(ax, y, slot_colours, ["PAD" if v == PAD_SLOT_ID else str(v) for v in values],
                    text_colour="white", font_size=FONT_SIZE - (1 if n <= 24 else 2))  # fmt: skip
    for text in ax.texts[before:]:
        text.set_gid("slot-label")
    for patch, v in zip(patches, values, strict=True):
        patch.set_gid("slot-pad" if v == PAD_SLOT_ID else "slot-collision" if v in twice
                      else "slot")  # fmt: skip
    _label(ax, y, f"rank {rank}'s\nslot_mapping")

    ax.set_xlim(-0.2, width + 0.2)
    ax.set_ylim(y - 0.3, top)
    handles = [Patch(facecolor=rank_colour(r), edgecolor=EDGE, label=f"rank {r}")
               for r in range(world_size)]  # fmt: skip
    handles.append(Patch(facecolor="white", edgecolor="black", linewidth=2.0,
                         label=f"outlined: rank {rank}'s positions"))  # fmt: skip
    handles.append(Patch(facecolor=EMPTY, edgecolor=EDGE, label="local slot not used yet"))
    handles.append(Patch(facecolor=PAD, edgecolor=EDGE, label="PAD: another rank's"))
    if collided or any(len(run.owners(t)) != 1 for t in range(n)):
        handles.append(
            Patch(facecolor=HIGHLIGHT, edgecolor=EDGE, label="two positions, one place")
        )
    # One row of legend when it fits the figure's width, else two (and room for them).
    em = FONT_SIZE - 1
    entries = sum(text_width_pt(h.get_label(), em) + 4.8 * em for h in handles)
    ncol = len(handles) if entries <= 0.95 * WIDTH * 72 else -(-len(handles) // 2)
    if ncol < len(handles):
        height = fig.get_figheight()
        fig.set_figheight(height + 0.25)
        ax.set_position([axes_left, (0.1 * height + 0.25) / (height + 0.25), axes_width,
                         0.74 * height / (height + 0.25)])  # fmt: skip
    fig.legend(handles=handles, loc="lower center", ncol=ncol, fontsize=em, frameon=False,
               bbox_to_anchor=(0.5, 0.0))  # fmt: skip
    verdict = (
        "every position on exactly one rank, packed from local position 0"
        if run.valid and not collided
        else "REJECTED by the launcher (kv_cache_block_size % interleave != 0): "
        "drawn from the kernel launched past its checks; red: collisions"
    )
    fig.suptitle(
        f"W = {world_size} rank{'s' if world_size > 1 else ''}, interleave I = {interleave}, "
        f"kv block K = {kv_cache_block_size}: "
        f"virtual block V = {virtual}; segment s of I positions lives on rank s mod {world_size}"
        f"\n{verdict}",
        fontsize=FONT_SIZE + 1,
        color="black" if run.valid else HIGHLIGHT,
    )
    fig.slotmap_run = run
    return fig


def ownership_widget(
    world_size: int = 2,
    rank: int = 0,
    interleave: int = 2,
    kv_cache_block_size: int = 4,
    seq_len: int = 20,
):
    """``draw_ownership`` with controls for W, the rank, I, the kv block and the length."""
    import ipywidgets as widgets

    from slotmap.viz.live import columns, live_figure

    style = {"description_width": "initial"}
    controls = {
        "world_size": widgets.IntSlider(value=world_size, min=1, max=4,
                                        description="world size W", style=style),
        "rank": widgets.IntSlider(value=rank, min=0, max=world_size - 1,
                                  description="rank r", style=style),
        "interleave": widgets.Dropdown(options=[1, 2, 3, 4, 8], value=interleave,
                                       description="interleave I", style=style),
        "kv_cache_block_size": widgets.Dropdown(options=[2, 4, 6, 8], value=kv_cache_block_size,
                                                description="kv block", style=style),
        "seq_len": widgets.IntSlider(value=seq_len, min=1, max=32,
                                     description="positions", style=style),
    }  # fmt: skip

    def follow_world(change) -> None:
        # The rank slider offers only the ranks of the world; moving its max may clamp it.
        controls["rank"].max = change["new"] - 1

    controls["world_size"].observe(follow_world, names="value")
    layout = columns(
        [controls["world_size"], controls["rank"]],
        [controls["interleave"], controls["kv_cache_block_size"]],
        [controls["seq_len"]],
    )
    return live_figure(draw_ownership, controls, layout)


def draw_five_steps(
    world_size: int = 2,
    interleave: int = 2,
    kv_cache_block_size: int = 4,
    block_size: int = 2,
    num_positions: int = 20,
):
    """The five steps of docs/semantics.md §2 for positions 0..num_positions-1, one row per
    step; the slot row is the production kernel's output on the owner rank. Returns a Figure."""
    from slotmap.viz.style import figure

    run = run_ownership(world_size, interleave, kv_cache_block_size, num_positions, block_size)
    steps = [five_steps(p, block_size, kv_cache_block_size, world_size, interleave)
             for p in range(num_positions)]  # fmt: skip
    virtual = kv_cache_block_size * world_size
    per = kv_cache_block_size // block_size
    slots = []
    for token in range(num_positions):
        owners = run.owners(token)
        slots.append(run.slots[owners[0]][token] if len(owners) == 1 else None)
    rows = [
        ("position p", [s.position for s in steps], None),
        (f"1. vb = p // {virtual}", [s.virtual_block for s in steps], None),
        (f"   vo = p % {virtual}", [s.virtual_offset for s in steps], None),
        (f"2. segment vo // {interleave}", [s.segment for s in steps], None),
        (f"   owner = segment % {world_size}", [s.owner for s in steps], "owner"),
        ("3. local offset lo", [s.local_offset for s in steps], "owner"),
        (f"4. block vb·{per} + lo // {block_size}", [s.block for s in steps], "owner"),
        (f"   offset lo % {block_size}", [s.offset for s in steps], "owner"),
        (f"5. slot table[b]·{block_size} + o", slots, "owner"),
    ]
    fig, axes = figure(rows=len(rows), height_per_row=0.42)
    height = fig.get_figheight() + 1.1
    fig.set_figheight(height)
    fig.subplots_adjust(left=0.28, right=0.99, top=1 - 0.75 / height, bottom=0.35 / height,
                        hspace=0.15)  # fmt: skip
    for ax, (label, values, colour_by) in zip(axes, rows, strict=True):
        if colour_by == "owner":
            colours = [rank_colour(s.owner) for s in steps]
            text_colour = "white"
        else:
            colours = [EMPTY] * len(values)
            text_colour = "black"
        if label.startswith("5."):
            colours = [c if v is not None else HIGHLIGHT for c, v in zip(colours, values,
                                                                         strict=True)]  # fmt: skip
        patches = boxes(ax, 0, colours, ["?" if v is None else str(v) for v in values],
                        text_colour=text_colour, font_size=FONT_SIZE - 1)  # fmt: skip
        for patch in patches:
            patch.set_gid(label.split()[0])
        ax.text(-0.4, 0.4, label, ha="right", va="center", fontsize=FONT_SIZE, family="monospace")
        ax.set_xlim(-0.2, num_positions + 0.2)
        ax.set_ylim(-0.1, 0.9)
    # Step 5 needs each rank's block table: show them, so every slot can be checked by hand.
    used = [max((s.block for s in steps if s.owner == r), default=-1) + 1
            for r in range(world_size)]  # fmt: skip
    tables = [run.tables[r][: used[r]] for r in range(world_size)]
    fig.text(0.28 - 0.4 / (num_positions + 0.4) * 0.71, 0.12 / height, "block tables",
             ha="right", va="bottom", fontsize=FONT_SIZE, gid="block-table")  # fmt: skip
    x = 0.28 * WIDTH * 72
    for r in range(world_size):
        text = f"rank {r}: {tables[r]}"
        fig.text(x / (WIDTH * 72), 0.12 / height, text, ha="left", va="bottom",
                 fontsize=FONT_SIZE, color=rank_colour(r), gid="block-table")  # fmt: skip
        x += text_width_pt(text, FONT_SIZE) + 16
    fig.suptitle(
        f"The five steps, W = {world_size}, I = {interleave}, K = {kv_cache_block_size} = "
        f"{per} block{'s' if per > 1 else ''} of B = {block_size} (colour: owner rank)\n"
        f"step 5 is the slot the production kernel wrote on the owner rank, with that rank's "
        f"block table (below)",
        fontsize=FONT_SIZE + 1,
    )
    fig.slotmap_steps = steps
    fig.slotmap_slots = slots
    fig.slotmap_tables = tables
    return fig


def draw_rank_run(evidence: list[RankEvidence], batch: CPBatch):
    """A real multi-process run: the slot each rank's kernel gave each token (all-gathered
    ownership), and the all-reduced number of ranks storing it, which must be 1."""
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    world = len(evidence)
    n = batch.num_tokens
    height = 0.55 * (world + 3) + 1.4
    fig = plt.figure(figsize=(WIDTH, height))
    ax = fig.add_axes([0.17, 0.14, 0.81, 0.68])
    ax.set_axis_off()
    starts = batch.query_start_loc
    request = [next(q for q in range(len(batch.lengths)) if t < starts[q + 1]) for t in range(n)]
    y = world + 2.0
    patches = boxes(ax, y, [EMPTY] * n, [str(p) for p in batch.positions],
                    font_size=FONT_SIZE - 1)  # fmt: skip
    for patch, q in zip(patches, request, strict=True):
        patch.set_gid(f"position-request-{q}")
    for q in range(len(batch.lengths)):
        if starts[q + 1] > starts[q]:
            wide = starts[q + 1] - starts[q] >= 3
            ax.text((starts[q] + starts[q + 1]) / 2, y + 0.95, f"request {q}" if wide else f"r{q}",
                    ha="center", va="bottom", fontsize=FONT_SIZE - 1)  # fmt: skip
        if q:
            ax.axvline(starts[q], color=EDGE, lw=1.2, ymin=0.02, ymax=0.98)
    ax.text(-0.4, y + 0.4, "position", ha="right", va="center", fontsize=FONT_SIZE)
    for e in evidence:
        y -= 1.0
        stored = e.owners[e.rank]
        values = e.slots[:n]
        colours = [rank_colour(e.rank) if s else EMPTY for s in stored]
        labels = [str(v) if s else "" for v, s in zip(values, stored, strict=True)]
        patches = boxes(ax, y, colours, labels, text_colour="white", font_size=FONT_SIZE - 1)
        for patch, s in zip(patches, stored, strict=True):
            patch.set_gid(f"slot-rank-{e.rank}" if s else "slot-none")
        ax.text(-0.4, y + 0.4, f"rank {e.rank} (pid {e.pid})\nslots", ha="right", va="center",
                fontsize=FONT_SIZE - 1, color=rank_colour(e.rank))  # fmt: skip
    y -= 1.2
    counts = evidence[0].owner_count
    patches = boxes(ax, y, [OK if c == 1 else HIGHLIGHT for c in counts], [str(c) for c in counts],
                    text_colour="white", font_size=FONT_SIZE - 1)  # fmt: skip
    for patch, c in zip(patches, counts, strict=True):
        patch.set_gid("count-ok" if c == 1 else "count-bad")
    ax.text(-0.4, y + 0.4, "ranks storing it\n(all_reduce sum)", ha="right", va="center",
            fontsize=FONT_SIZE - 1)  # fmt: skip
    ax.set_xlim(-0.2, max(n, 16) + 0.2)
    ax.set_ylim(y - 0.2, world + 3.4)
    handles = [Patch(facecolor=rank_colour(e.rank), edgecolor=EDGE, label=f"rank {e.rank}")
               for e in evidence]  # fmt: skip
    handles += [Patch(facecolor=OK, edgecolor=EDGE, label="stored exactly once"),
                Patch(facecolor=HIGHLIGHT, edgecolor=EDGE, label="not exactly once")]  # fmt: skip
    fig.legend(handles=handles, loc="lower center", ncol=len(handles), fontsize=FONT_SIZE - 1,
               frameon=False, bbox_to_anchor=(0.5, 0.0))  # fmt: skip
    proved = all(e.proved for e in evidence)
    collisions = sum(len(e.collisions) for e in evidence)
    verdict = (
        "the ranks proved it: every token has exactly one slot"
        if proved
        else f"NOT PROVED: {collisions} collision(s); " + (evidence[0].notes or ["see notes"])[0]
    )
    fig.suptitle(
        f"{world} processes over {evidence[0].communication} (W = {batch.world_size}, "
        f"I = {batch.interleave}, kv block {batch.kv_cache_block_size}): each ran the "
        f"production kernel on {evidence[0].device}\n{verdict}",
        fontsize=FONT_SIZE + 1,
        color="black" if proved else HIGHLIGHT,
    )
    return fig
