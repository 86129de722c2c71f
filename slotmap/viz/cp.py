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
from typing import TYPE_CHECKING

from slotmap.backend import DEVICE
from slotmap.cp import CPBatch, RankEvidence, five_steps, launch_unchecked, local_layout
from slotmap.i18n import _, ngettext
from slotmap.kernels.slot_mapping import compute_slot_mapping
from slotmap.layout import PAD_SLOT_ID
from slotmap.viz import draw, style
from slotmap.viz.draw import ABOVE, first_fitting, key, legend, row_label, text_points
from slotmap.viz.style import EDGE, EMPTY, FONT_SIZE, HIGHLIGHT, PAD, WIDTH, boxes, figure

if TYPE_CHECKING:
    from ipywidgets import VBox
    from matplotlib.figure import Figure


OK = "#1b7f3b"
BLOCK_GAP = 0.35  # space between two logical blocks of a rank's local layout, in cells
AXES_LEFT, AXES_WIDTH = 0.15, 0.83  # the ownership figure's one axes, in figure fractions
rank_colour = style.request_colour  # ranks are told apart like requests


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

    def holders(self, rank: int) -> dict[int, list[int]]:
        """Local position on ``rank`` -> the positions stored there (two or more: a collision)."""
        found: dict[int, list[int]] = {}
        for token, where in enumerate(self.local[rank]):
            if where >= 0:
                found.setdefault(where, []).append(self.positions[token])
        return found

    def local_blocks(self, rank: int) -> int:
        """Logical blocks of ``rank``'s own cache that its positions reach."""
        return -(-(max(self.local[rank], default=-1) + 1) // self.batch.block_size)

    @property
    def collided(self) -> set[int]:
        """Tokens that share a local place with another token on some rank."""
        found = set()
        for rank in range(self.batch.world_size):
            seen: dict[int, int] = {}
            for token, where in enumerate(self.local[rank]):
                if where in seen:
                    found.update({token, seen[where]})
                if where >= 0:
                    seen[where] = token
        return found


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
    batch = CPBatch((seq_len,), block_size, kv_cache_block_size, world_size, interleave, seed=seed)
    valid, message = True, _("compute_slot_mapping accepts this configuration.")
    slots, tables, local = [], [], []
    for rank in range(world_size):
        qsl, positions, table = batch.tensors(rank, DEVICE)
        options = batch.options(rank)
        try:
            out = compute_slot_mapping(qsl, positions, table, block_size, **options)
        except ValueError as error:
            message = _("compute_slot_mapping raises ValueError: {error}").format(error=error)
            valid = False
            out = launch_unchecked(qsl, positions, table, block_size, **options)
        values = out.cpu().tolist()
        rows = table.cpu().tolist()
        slots.append(values)
        tables.append(rows[0])
        local.append(local_layout(values, batch, rows))
    return OwnershipRun(batch, valid, message, slots, tables, local)


def draw_ownership(
    world_size: int = 2,
    rank: int = 0,
    interleave: int = 2,
    kv_cache_block_size: int = 4,
    seq_len: int = 20,
) -> Figure:
    """Positions coloured by their owner, each rank's packed local layout and ``rank``'s slot
    mapping, all from the production kernel run once per rank; returns a Figure."""
    run = run_ownership(world_size, interleave, kv_cache_block_size, seq_len)
    return draw_ownership_run(run, min(rank, world_size - 1))


def draw_ownership_run(run: OwnershipRun, rank: int) -> Figure:
    """Draw an ``OwnershipRun`` (see ``draw_ownership``), ``rank``'s positions outlined."""
    import matplotlib.pyplot as plt

    world, block_size = run.batch.world_size, run.batch.block_size
    # Size the figure from its widest row: a rank's local row is whole blocks with gaps.
    blocks = max(run.local_blocks(r) for r in range(world))
    width = max(len(run.positions), blocks * block_size + BLOCK_GAP * max(0, blocks - 1), 16)
    cell_pt = AXES_WIDTH * WIDTH * 72 / (width + 0.4)  # one position's box, in points
    # Rows, top to bottom (y grows upwards in matplotlib: we count down from the top).
    top = 2.3 + world * 1.5 + 1.8
    style.use_cjk_font()
    fig = plt.figure(figsize=(WIDTH, 0.42 * top + 1.3))
    ax = fig.add_axes([AXES_LEFT, 0.1, AXES_WIDTH, 0.74])
    ax.set_axis_off()
    y = top - 1.6
    _paint_positions(ax, run, rank, y, cell_pt)
    y -= 0.3
    for r in range(world):
        y -= 1.5
        _paint_local(ax, run, r, y, cell_pt, outlined=r == rank)
    y -= 1.4
    _paint_slots(ax, run.slots[rank][: len(run.positions)], rank, y)
    ax.set_xlim(-0.2, width + 0.2)
    ax.set_ylim(y - 0.3, top)
    _ownership_legend(fig, ax, run, rank)
    verdict = (
        _("every position on exactly one rank, packed from local position 0")
        if run.valid and not run.collided
        else _(
            "REJECTED by the launcher (kv_cache_block_size % interleave != 0): "
            "drawn from the kernel launched past its checks; red: collisions"
        )
    )
    b = run.batch
    title = _(
        "W = {ranks}, interleave I = {interleave}, kv block K = {kv_block}: virtual block "
        "V = {virtual}; segment s of I positions lives on rank s mod {world}\n{verdict}"
    ).format(
        ranks=ngettext("{n} rank", "{n} ranks", world).format(n=world),
        interleave=b.interleave,
        kv_block=b.kv_cache_block_size,
        virtual=b.kv_cache_block_size * world,
        world=world,
        verdict=verdict,
    )
    fig.suptitle(
        title,
        fontsize=FONT_SIZE + 1,
        color="black" if run.valid else HIGHLIGHT,
    )
    fig.slotmap_run = run
    return fig


def _paint_positions(ax, run: OwnershipRun, rank: int, y: float, cell_pt: float) -> None:
    """Positions coloured by the rank whose kernel gave them a slot (red: not exactly one),
    ``rank``'s outlined, under brackets of the virtual blocks."""
    n, collided = len(run.positions), run.collided
    owners = [run.owners(token) for token in range(n)]
    colours = [rank_colour(o[0]) if len(o) == 1 else HIGHLIGHT for o in owners]
    gids = [f"position-rank-{o[0]}" if len(o) == 1 else "position-bad" for o in owners]
    labels = [str(p) for p in run.positions]
    patches = boxes(ax, y, colours, labels, gids=gids, text_colour="white")
    for token, (patch, o) in enumerate(zip(patches, owners, strict=True)):
        if o == [rank]:  # the chosen rank's positions, outlined
            patch.set(linewidth=2.0, edgecolor="black")
        if token in collided:
            patch.set(linewidth=2.6, edgecolor=HIGHLIGHT)
    row_label(ax, y, _("position\n(colour: owner)"))
    # Virtual blocks: brackets above the positions, labelled "virtual block 3", "vb 3" or not.
    virtual = run.batch.kv_cache_block_size * run.batch.world_size
    for start in range(0, n, virtual):
        end = min(start + virtual, n)
        xs = [start + 0.05, start + 0.05, end - 0.05, end - 0.05]
        ax.plot(xs, [y + 0.95, y + 1.1, y + 1.1, y + 0.95], color=EDGE, lw=0.8)
        index, room = start // virtual, (end - start) * cell_pt - 4
        names = [_("virtual block {k}").format(k=index), f"vb {index}"]
        text = first_fitting(names, room, FONT_SIZE - 1, "")
        if text:
            at = ((start + end) / 2, y + 1.25)
            ax.text(*at, text, **ABOVE, fontsize=FONT_SIZE - 1, gid="virtual-block-label")


def _paint_local(ax, run: OwnershipRun, r: int, y: float, cell_pt: float, outlined: bool):
    """Rank ``r``'s local layout: the logical blocks of its own cache, packed from local 0, each
    slot labelled with the position it holds; over each block, the physical block it is."""
    holders, block_size = run.holders(r), run.batch.block_size
    blocks = run.local_blocks(r)
    for b in range(blocks):
        x0 = b * (block_size + BLOCK_GAP)
        for o in range(block_size):
            held = holders.get(b * block_size + o, [])
            many = len(held) > 1
            colour = HIGHLIGHT if many else rank_colour(r) if held else EMPTY
            gid = "local-collision" if many else f"local-rank-{r}" if held else "local-empty"
            width = 2.0 if outlined else 0.6
            draw.cell(ax, x0 + o, y, colour, "", gid, linewidth=width)
            if held:
                text, size = _held_label(held, cell_pt)
                font = {"color": "white", "fontsize": size, "gid": "local-label"}
                ax.text(x0 + o + 0.5, y + 0.4, text, **draw.CENTRE, **font)
    # "block 0 → physical 4" over each block where it fits, else "b0→4", else nothing.
    physical = [run.tables[r][b] if b < len(run.tables[r]) else "?" for b in range(blocks)]
    long = [_("block {b} → physical {m}").format(b=b, m=m) for b, m in enumerate(physical)]
    short = [f"b{b}→{m}" for b, m in enumerate(physical)]
    room = (block_size + 0.3) * cell_pt - 3
    labels = first_fitting([long, short], room, FONT_SIZE - 2, [""] * blocks)
    for b, text in enumerate(labels):
        if text:
            at = (b * (block_size + BLOCK_GAP) + block_size / 2, y + 0.88)
            font = {"fontsize": FONT_SIZE - 2, "color": "#555555", "gid": "block-label"}
            ax.text(*at, text, **ABOVE, **font)
    count = sum(1 for v in run.local[r] if v >= 0)
    tokens = ngettext("rank {r}: {n} token", "rank {r}: {n} tokens", count).format(r=r, n=count)
    row_label(ax, y, tokens, color=rank_colour(r))


def _held_label(held: list[int], cell_pt: float) -> tuple[str, float]:
    """A local slot's label and size: its position; two or more (a collision) as "4|8", else
    stacked, else "×2"."""
    names = list(map(str, held))
    if len(held) == 1:
        return names[0], FONT_SIZE
    if text_points("|".join(names), FONT_SIZE - 2) <= cell_pt - 2:
        return "|".join(names), FONT_SIZE - 2
    if len(held) == 2 and text_points("\n".join(names), FONT_SIZE - 3) <= cell_pt - 2:
        return "\n".join(names), FONT_SIZE - 3
    return f"×{len(held)}", FONT_SIZE - 2


def _paint_slots(ax, values: list[int], rank: int, y: float) -> None:
    """``rank``'s slot mapping as the kernel wrote it; a slot taken twice in red."""
    twice = {v for v in values if v != PAD_SLOT_ID and values.count(v) > 1}
    colours = [
        PAD if v == PAD_SLOT_ID else HIGHLIGHT if v in twice else rank_colour(rank) for v in values
    ]
    labels = ["PAD" if v == PAD_SLOT_ID else str(v) for v in values]
    size = FONT_SIZE - (1 if len(values) <= 24 else 2)
    kinds = ["pad" if v == PAD_SLOT_ID else "collision" if v in twice else "" for v in values]
    gids = [f"slot-{kind}" if kind else "slot" for kind in kinds]
    look = {"text_gid": "slot-label", "text_colour": "white", "font_size": size}
    boxes(ax, y, colours, labels, gids=gids, **look)
    row_label(ax, y, _("rank {rank}'s\nslot_mapping").format(rank=rank))


def _ownership_legend(fig, ax, run: OwnershipRun, rank: int) -> None:
    """One row of legend when it fits the figure's width, else two (and room for them)."""
    handles = [key(rank_colour(r), f"rank {r}") for r in range(run.batch.world_size)]
    outlined = _("outlined: rank {rank}'s positions").format(rank=rank)
    handles += [
        key("white", outlined, edge="black", linewidth=2.0),
        key(EMPTY, _("local slot not used yet")),
        key(PAD, _("PAD: another rank's")),
    ]
    if run.collided or any(len(run.owners(t)) != 1 for t in range(len(run.positions))):
        handles.append(key(HIGHLIGHT, _("two positions, one place")))
    em = FONT_SIZE - 1
    entries = sum(text_points(h.get_label(), em) + 4.8 * em for h in handles)
    ncol = len(handles) if entries <= 0.95 * WIDTH * 72 else -(-len(handles) // 2)
    if ncol < len(handles):
        height = fig.get_figheight()
        fig.set_figheight(height + 0.25)
        bottom, tall = (0.1 * height + 0.25) / (height + 0.25), 0.74 * height / (height + 0.25)
        ax.set_position([AXES_LEFT, bottom, AXES_WIDTH, tall])
    legend(fig, handles, loc="lower center", ncol=ncol, fontsize=em, bbox_to_anchor=(0.5, 0.0))


def ownership_widget(
    world_size: int = 2,
    rank: int = 0,
    interleave: int = 2,
    kv_cache_block_size: int = 4,
    seq_len: int = 20,
) -> VBox:
    """``draw_ownership`` with controls for W, the rank, I, the kv block and the length."""
    from slotmap.viz.live import choice, columns, live_figure, slider

    controls = {
        "world_size": slider("world size W", world_size, 1, 4),
        "rank": slider("rank r", rank, 0, world_size - 1),
        "interleave": choice(_("interleave I"), [1, 2, 3, 4, 8], interleave),
        "kv_cache_block_size": choice(_("kv block"), [2, 4, 6, 8], kv_cache_block_size),
        "seq_len": slider(_("positions"), seq_len, 1, 32),
    }

    def follow_world(change) -> None:
        # The rank slider offers only the ranks of the world; moving its max may clamp it.
        controls["rank"].max = change["new"] - 1

    controls["world_size"].observe(follow_world, names="value")
    layout = columns(*[[controls[n] for n in names] for names in COLUMNS])
    return live_figure(draw_ownership, controls, layout)


COLUMNS = (("world_size", "rank"), ("interleave", "kv_cache_block_size"), ("seq_len",))


@dataclass
class FiveStepsRun:
    """The five steps of every position, and the slot the kernel gave it on its owner rank."""

    world_size: int
    interleave: int
    kv_cache_block_size: int
    block_size: int
    steps: list  # five_steps(p, ...) of each position p
    slots: list[int | None]  # the slot on the owner rank (None: not exactly one owner)
    tables: list[list[int]]  # [rank]: the block-table entries its step 5 reads


def run_five_steps(
    world_size: int, interleave: int, kv_cache_block_size: int, block_size: int, num_positions: int
) -> FiveStepsRun:
    """The five steps in Python for positions 0..num_positions-1, and the production kernel run
    once per rank (``run_ownership``) for the slots and the block tables."""
    run = run_ownership(world_size, interleave, kv_cache_block_size, num_positions, block_size)
    layout = (block_size, kv_cache_block_size, world_size, interleave)
    steps = [five_steps(p, *layout) for p in range(num_positions)]
    owners = [run.owners(token) for token in range(num_positions)]
    slots = [run.slots[o[0]][t] if len(o) == 1 else None for t, o in enumerate(owners)]
    used = [
        max((s.block for s in steps if s.owner == r), default=-1) + 1 for r in range(world_size)
    ]
    tables = [run.tables[r][: used[r]] for r in range(world_size)]
    sizes = (world_size, interleave, kv_cache_block_size, block_size)
    return FiveStepsRun(*sizes, steps, slots, tables)


def draw_five_steps(
    world_size: int = 2,
    interleave: int = 2,
    kv_cache_block_size: int = 4,
    block_size: int = 2,
    num_positions: int = 20,
) -> Figure:
    """The five steps of docs/semantics.md §2 for positions 0..num_positions-1, one row per
    step; the slot row is the production kernel's output on the owner rank. Returns a Figure."""
    sizes = (world_size, interleave, kv_cache_block_size, block_size)
    return draw_five_steps_run(run_five_steps(*sizes, num_positions))


def draw_five_steps_run(run: FiveStepsRun) -> Figure:
    """Draw a ``FiveStepsRun`` (see ``draw_five_steps``)."""
    steps, n, world, b = run.steps, len(run.steps), run.world_size, run.block_size
    virtual, per = run.kv_cache_block_size * world, run.kv_cache_block_size // b
    # (gid, label, values, colouring): the gid is the English label's first word.
    rows = [
        ("position", _("position p"), [s.position for s in steps], None),
        ("1.", f"1. vb = p // {virtual}", [s.virtual_block for s in steps], None),
        ("vo", f"   vo = p % {virtual}", [s.virtual_offset for s in steps], None),
        (
            "2.",
            _("2. segment vo // {interleave}").format(interleave=run.interleave),
            [s.segment for s in steps],
            None,
        ),
        (
            "owner",
            _("   owner = segment % {world}").format(world=world),
            [s.owner for s in steps],
            "owner",
        ),
        ("3.", _("3. local offset lo"), [s.local_offset for s in steps], "owner"),
        (
            "4.",
            _("4. block vb·{per} + lo // {b}").format(per=per, b=b),
            [s.block for s in steps],
            "owner",
        ),
        ("offset", _("   offset lo % {b}").format(b=b), [s.offset for s in steps], "owner"),
        ("5.", _("5. slot table[b]·{b} + o").format(b=b), run.slots, "owner"),
    ]
    fig, axes = figure(rows=len(rows), height_per_row=0.42)
    height = fig.get_figheight() + 1.1
    fig.set_figheight(height)
    top, bottom = 1 - 0.75 / height, 0.35 / height
    fig.subplots_adjust(left=0.28, right=0.99, top=top, bottom=bottom, hspace=0.15)
    for ax, (gid, label, values, colour_by) in zip(axes, rows, strict=True):
        owned = colour_by == "owner"
        colours = [rank_colour(s.owner) if owned else EMPTY for s in steps]
        colours = [HIGHLIGHT if v is None else c for c, v in zip(colours, values, strict=True)]
        labels = ["?" if v is None else str(v) for v in values]
        look = {"text_colour": "white" if owned else "black", "font_size": FONT_SIZE - 1}
        boxes(ax, 0, colours, labels, gids=gid, **look)
        row_label(ax, 0, label, family=style.monospace())
        ax.set_xlim(-0.2, n + 0.2)
        ax.set_ylim(-0.1, 0.9)
    # Step 5 needs each rank's block table: show them, so every slot can be checked by hand.
    font = {"va": "bottom", "fontsize": FONT_SIZE, "gid": "block-table"}
    x, y = 0.28 - 0.4 / (n + 0.4) * 0.71, 0.12 / height
    fig.text(x, y, _("block tables"), ha="right", **font)
    x = 0.28 * WIDTH * 72
    for r in range(world):
        text = f"rank {r}: {run.tables[r]}"
        fig.text(x / (WIDTH * 72), y, text, ha="left", color=rank_colour(r), **font)
        x += text_points(text, FONT_SIZE) + 16
    title = _(
        "The five steps, W = {world}, I = {interleave}, K = {kv_block} = {blocks} of B = {b} "
        "(colour: owner rank)\nstep 5 is the slot the production kernel wrote on the owner "
        "rank, with that rank's block table (below)"
    ).format(
        world=world,
        interleave=run.interleave,
        kv_block=run.kv_cache_block_size,
        blocks=ngettext("{n} block", "{n} blocks", per).format(n=per),
        b=b,
    )
    fig.suptitle(title, fontsize=FONT_SIZE + 1)
    fig.slotmap_steps, fig.slotmap_slots, fig.slotmap_tables = steps, run.slots, run.tables
    return fig


def draw_rank_run(evidence: list[RankEvidence], batch: CPBatch) -> Figure:
    """A real multi-process run: the slot each rank's kernel gave each token (all-gathered
    ownership), and the all-reduced number of ranks storing it, which must be 1."""
    import matplotlib.pyplot as plt

    world = len(evidence)
    n = batch.num_tokens
    height = 0.55 * (world + 3) + 1.4
    style.use_cjk_font()
    fig = plt.figure(figsize=(WIDTH, height))
    ax = fig.add_axes([0.17, 0.14, 0.81, 0.68])
    ax.set_axis_off()
    starts = batch.query_start_loc
    request = [next(q for q in range(len(batch.lengths)) if t < starts[q + 1]) for t in range(n)]
    y = world + 2.0
    labels, gids = [str(p) for p in batch.positions], [f"position-request-{q}" for q in request]
    boxes(ax, y, [EMPTY] * n, labels, gids=gids, font_size=FONT_SIZE - 1)
    for q in range(len(batch.lengths)):
        if starts[q + 1] > starts[q]:
            wide = starts[q + 1] - starts[q] >= 3
            name = _("request {request}").format(request=q) if wide else f"r{q}"
            at = (starts[q] + starts[q + 1]) / 2
            ax.text(at, y + 0.95, name, **ABOVE, fontsize=FONT_SIZE - 1)
        if q:
            ax.axvline(starts[q], color=EDGE, lw=1.2, ymin=0.02, ymax=0.98)
    row_label(ax, y, _("position"))
    for e in evidence:
        y -= 1.0
        stored = e.owners[e.rank]
        values = e.slots[:n]
        colours = [rank_colour(e.rank) if s else EMPTY for s in stored]
        labels = [str(v) if s else "" for v, s in zip(values, stored, strict=True)]
        gids = [f"slot-rank-{e.rank}" if s else "slot-none" for s in stored]
        boxes(ax, y, colours, labels, gids=gids, text_colour="white", font_size=FONT_SIZE - 1)
        caption = _("rank {rank} (pid {pid})\nslots").format(rank=e.rank, pid=e.pid)
        row_label(ax, y, caption, fontsize=FONT_SIZE - 1, color=rank_colour(e.rank))
    y -= 1.2
    counts = evidence[0].owner_count
    colours = [OK if c == 1 else HIGHLIGHT for c in counts]
    gids = ["count-ok" if c == 1 else "count-bad" for c in counts]
    look = {"text_colour": "white", "font_size": FONT_SIZE - 1}
    boxes(ax, y, colours, [str(c) for c in counts], gids=gids, **look)
    row_label(ax, y, _("ranks storing it\n(all_reduce sum)"), fontsize=FONT_SIZE - 1)
    ax.set_xlim(-0.2, max(n, 16) + 0.2)
    ax.set_ylim(y - 0.2, world + 3.4)
    handles = [key(rank_colour(e.rank), f"rank {e.rank}") for e in evidence]
    handles += [key(OK, _("stored exactly once")), key(HIGHLIGHT, _("not exactly once"))]
    legend(fig, handles, loc="lower center", ncol=len(handles), bbox_to_anchor=(0.5, 0.0))
    proved = all(e.proved for e in evidence)
    collisions = sum(len(e.collisions) for e in evidence)
    verdict = (
        _("the ranks proved it: every token has exactly one slot")
        if proved
        else _("NOT PROVED: {collisions} collision(s); {note}").format(
            collisions=collisions, note=(evidence[0].notes or [_("see notes")])[0]
        )
    )
    title = _(
        "{world} processes over {communication} (W = {world_size}, I = {interleave}, kv block "
        "{kv_block}): each ran the production kernel on {device}\n{verdict}"
    ).format(
        world=world,
        communication=evidence[0].communication,
        world_size=batch.world_size,
        interleave=batch.interleave,
        kv_block=batch.kv_cache_block_size,
        device=evidence[0].device,
        verdict=verdict,
    )
    fig.suptitle(
        title,
        fontsize=FONT_SIZE + 1,
        color="black" if proved else HIGHLIGHT,
    )
    return fig
