"""Lesson 07's figures and widgets: a paged KV cache written and read by the real kernels.

* ``draw_paged_attention``: a batch of requests written into a paged cache through the slot
  mapping (production kernel + ``reshape_and_cache``), read back by
  ``paged_decode_attention`` through the block table, compared with dense attention per
  request and head. A ``corruption`` sends one token to a wrong slot and shows the output
  diverge.
* ``draw_cp_attention``: one request split over context-parallel ranks: which rank owns each
  position, each rank's local cache, each rank's share ``exp(lse_r - lse)`` of the softmax,
  and the merged output against dense attention. The ranks run one after the other in this
  process (the notebook also runs them as real processes).

Patches carry a ``gid`` ("slot-q0", "slot-stale", "slot-corrupt", "owner-r1", "local-r1",
"error-bar", ...) so tests can count what a figure shows; each figure keeps its run in
``fig.slotmap_run``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from slotmap.attention import dense_attention, paged_decode_attention, reshape_and_cache
from slotmap.backend import DEVICE
from slotmap.cp_attention import (
    CPProblem,
    batch_of,
    build_rank_state,
    simulate_ranks,
    slot_mapping_of,
)
from slotmap.i18n import N_, _, ngettext, tr
from slotmap.layout import PAD_SLOT_ID
from slotmap.reference import slot_mapping_oracle
from slotmap.viz import style
from slotmap.viz.draw import CENTRE, first_fitting, key, legend, row_label, text_points
from slotmap.viz.style import EDGE, EMPTY, FONT_SIZE, HIGHLIGHT, WIDTH, boxes, request_colour

if TYPE_CHECKING:
    from ipywidgets import VBox
    from matplotlib.figure import Figure


TOLERANCE = 1e-4  # |paged - dense| below this counts as a match (float32 arithmetic)
CORRUPTIONS = (
    N_("none"),
    N_("one token to a free slot"),
    N_("one token to another request's slot"),
)


@dataclass
class PagedRun:
    seq_lens: list[int]
    block_size: int
    corruption: str
    slots: list[int]  # the slot mapping the kernel computed (positions 0..L-1 of each request)
    written: list[int]  # the slots reshape_and_cache was given (corrupted or not)
    requests: list[int]  # request of each token
    positions: list[int]
    block_table: list[list[int]]
    num_blocks: int
    errors: list[list[float]]  # [request][head]: max |paged - dense|
    max_error: float
    corrupted_token: int | None  # the token that went to the wrong slot

    @property
    def holder(self) -> dict[int, tuple[int, int]]:
        """slot -> (request, position) that reshape_and_cache wrote there last."""
        pairs = zip(self.written, self.requests, self.positions, strict=True)
        return {slot: (q, p) for slot, q, p in pairs if slot != PAD_SLOT_ID}

    @property
    def corrupt_slot(self) -> int | None:
        """Where the corrupted token went (None: no corruption)."""
        return None if self.corrupted_token is None else self.written[self.corrupted_token]

    @property
    def lost_slot(self) -> int | None:
        """Where the corrupted token should have gone, left stale."""
        return None if self.corrupted_token is None else self.slots[self.corrupted_token]


def run_paged(
    seq_lens: tuple[int, ...] = (6, 11, 3),
    block_size: int = 4,
    corruption: str = "none",
    num_heads: int = 2,
    head_dim: int = 16,
    seed: int = 0,
) -> PagedRun:
    """Write every position of every request, then one paged decode attention per request."""
    if corruption not in CORRUPTIONS:
        raise ValueError(
            _("corruption must be one of {corruptions}, got {corruption!r}").format(
                corruptions=CORRUPTIONS, corruption=corruption
            )
        )
    problem = CPProblem(
        seq_lens=tuple(seq_lens),
        num_heads=num_heads,
        head_dim=head_dim,
        block_size=block_size,
        seed=seed,
        spare_blocks=2,
        stale_cache=True,
    )
    state = build_rank_state(problem, 1, 0, DEVICE, write_prompt=False)
    dense = state.dense
    query_start_loc, positions, requests = batch_of(list(seq_lens), DEVICE)
    slots = slot_mapping_of(state, query_start_loc, positions)
    expected = slot_mapping_oracle(
        query_start_loc.cpu(), positions.cpu(), state.block_table.cpu(), block_size
    )
    assert torch.equal(slots.cpu(), expected), "the slot-mapping kernel disagrees with the oracle"
    written = slots.clone()
    corrupted_token = None
    if corruption != "none" and len(seq_lens) > 1:
        # The last token of the second request (the longest-lived damage: it is in the window).
        corrupted_token = int(query_start_loc[2]) - 1
        used = set(slots.tolist())
        if corruption == "one token to a free slot":
            num_slots = state.key_cache.shape[0] * block_size
            target = next(s for s in range(num_slots) if s not in used)
        else:
            target = int(slots[0])  # request 0's position 0: two requests now share it
        written[corrupted_token] = target
    key = dense.key[requests, positions].contiguous()
    value = dense.value[requests, positions].contiguous()
    caches = (state.key_cache, state.value_cache)
    if corrupted_token is not None and corruption != "one token to a free slot":
        # Two tokens share one slot: let the corrupted one write last, as a later step would.
        order = [t for t in range(len(written)) if t != corrupted_token] + [corrupted_token]
        index = torch.tensor(order, device=DEVICE)
        for part in (index[:-1], index[-1:]):
            reshape_and_cache(key[part], value[part], *caches, written[part])
    else:
        reshape_and_cache(key, value, *caches, written)
    out = paged_decode_attention(dense.query, *caches, state.block_table, dense.seq_lens)[0]
    dense_out = dense_attention(dense.query, dense.key, dense.value, dense.seq_lens)[0]
    errors = (out - dense_out).abs().amax(dim=-1).cpu()
    return PagedRun(
        seq_lens=list(seq_lens),
        block_size=block_size,
        corruption=corruption,
        slots=slots.cpu().tolist(),
        written=written.cpu().tolist(),
        requests=requests.cpu().tolist(),
        positions=positions.cpu().tolist(),
        block_table=state.block_table.cpu().tolist(),
        num_blocks=state.key_cache.shape[0],
        errors=errors.tolist(),
        max_error=float(errors.max()),
        corrupted_token=corrupted_token,
    )


def draw_paged_attention(
    seq_lens: tuple[int, ...] = (6, 11, 3),
    block_size: int = 4,
    corruption: str = "none",
    seed: int = 0,
    num_heads: int = 2,
) -> Figure:
    """The paged cache after ``reshape_and_cache`` and the attention's error per request and
    head against dense attention; returns a matplotlib Figure.

    The cache row is as wide as the figure at every size: a slot's label (the position it
    holds) and a block's number shrink or go where they would not fit."""
    return draw_paged_run(
        run_paged(tuple(seq_lens), block_size, corruption, seed=seed, num_heads=num_heads)
    )


def draw_paged_run(run: PagedRun) -> Figure:
    """Draw a ``PagedRun`` (see ``draw_paged_attention``)."""
    import matplotlib.pyplot as plt

    block_size = run.block_size
    style.use_cjk_font()
    fig = plt.figure(figsize=(WIDTH, 5.0))
    cache_ax = fig.add_axes([CACHE_LEFT, 0.5, CACHE_RIGHT - CACHE_LEFT, 0.36])
    cache_ax.set_axis_off()
    _paint_paged_cache(fig, cache_ax, run)
    _paint_errors(fig.add_axes([0.1, 0.1, 0.59, 0.28]), run)
    requests = range(len(run.seq_lens))
    handles = [key(request_colour(q), _("request {request}").format(request=q)) for q in requests]
    handles.append(key(EMPTY, _("stale (never written)")))
    if run.corrupted_token is not None:
        handles.append(key(HIGHLIGHT, _("corrupted write")))
        handles.append(key(EMPTY, _("the slot it should have written"), HIGHLIGHT, linewidth=2))
    legend(fig, handles, loc="center left", bbox_to_anchor=(0.72, 0.25))
    t = run.corrupted_token
    what = (
        _("every token written to the slot the kernel computed")
        if t is None
        else _(
            "token {token} (request {request}, position {position}) written to "
            "slot {written} instead of {slot}"
        ).format(
            token=t,
            request=run.requests[t],
            position=run.positions[t],
            written=run.written[t],
            slot=run.slots[t],
        )
    )
    verdict = (
        _("every request matches dense attention (max error {error})").format(
            error=f"{run.max_error:.1e}"
        )
        if run.max_error <= TOLERANCE
        else _("DIVERGED, max error {error}").format(error=f"{run.max_error:.2f}")
    )
    blocks = run.num_blocks
    title = _("Paged KV cache: {blocks} of B = {slots}\n{what}: {verdict}").format(
        blocks=ngettext("{n} physical block", "{n} physical blocks", blocks).format(n=blocks),
        slots=ngettext("{n} slot", "{n} slots", block_size).format(n=block_size),
        what=what,
        verdict=verdict,
    )
    fig.suptitle(title, fontsize=FONT_SIZE + 1)
    fig.slotmap_run = run
    return fig


CACHE_LEFT, CACHE_RIGHT = 0.1, 0.99  # the cache row's axes, in figure fractions
CACHE_GAP = 0.35  # between two physical blocks of the cache row, in slots


def _paint_paged_cache(fig, ax, run: PagedRun) -> None:
    """Physical blocks side by side, each of B slots, each slot labelled with the position it
    holds (written by reshape_and_cache through the slot mapping); the block table above."""
    block_size, holder = run.block_size, run.holder
    x_max = run.num_blocks * (block_size + CACHE_GAP)
    points_per_unit = (CACHE_RIGHT - CACHE_LEFT) * WIDTH * 72 / (x_max + 0.2)
    # The widest label of each row at the largest font that fits (a slot is 1 unit wide,
    # a block B units plus the gap); a row whose labels fit at no size loses them.
    sizes = (FONT_SIZE - 1, FONT_SIZE - 2)
    widest = str(max(run.seq_lens) - 1)
    slot_font = next((f for f in sizes if text_points(widest, f) <= 0.9 * points_per_unit), None)
    room = (block_size + CACHE_GAP * 0.6) * points_per_unit
    last = str(run.num_blocks - 1)
    block_font = next((f for f in sizes if text_points(last, f) <= room), None)
    for block in range(run.num_blocks):
        x0 = block * (block_size + CACHE_GAP)
        colours, labels, gids = [], [], []
        for slot in range(block * block_size, (block + 1) * block_size):
            request, position = holder.get(slot, (None, None))
            if slot == run.lost_slot:
                colour, label, gid = EMPTY, "?", "slot-lost"
            elif slot == run.corrupt_slot:
                colour, label, gid = HIGHLIGHT, str(position), "slot-corrupt"
            elif request is not None:
                colour, label, gid = request_colour(request), str(position), f"slot-q{request}"
            else:
                colour, label, gid = EMPTY, "", "slot-stale"
            colours.append(colour)
            labels.append(label)
            gids.append(gid)
        patches = boxes(
            ax,
            0,
            colours,
            labels if slot_font else None,
            x0=x0,
            text_colour="white",
            font_size=slot_font or FONT_SIZE,
        )
        for patch, gid in zip(patches, gids, strict=True):
            patch.set_gid(gid)
            if gid == "slot-lost":
                patch.set(edgecolor=HIGHLIGHT, linewidth=2.0)
        if block_font:
            ax.text(x0 + block_size / 2, -0.3, str(block), **CENTRE, fontsize=block_font)
    for text in ax.texts:
        if text.get_text() == "?":
            text.set_color(HIGHLIGHT)
    # Row captions, in the margin left of the cache.
    x = -0.2 - 0.08 * 72 / points_per_unit
    row_label(ax, 0, _("slot\n(position\nit holds)"), x, fontsize=FONT_SIZE - 1)
    if block_font:
        row_label(ax, -0.7, _("physical block"), x, fontsize=FONT_SIZE - 1)
    rows = "   ".join(
        f"q{q}: {row[: -(-n // block_size)]}"
        for q, (row, n) in enumerate(zip(run.block_table, run.seq_lens, strict=True))
    )
    table = _("block table  {rows}").format(rows=rows)
    # One line across the whole figure, at the largest font that fits.
    sizes = [FONT_SIZE, FONT_SIZE - 1, FONT_SIZE - 2, FONT_SIZE - 3]
    table_font = next((f for f in sizes if text_points(table, f) <= 0.98 * WIDTH * 72), sizes[-1])
    y = 0.5 + 0.36 * (1.25 + 0.6) / 2.1
    fig.text(0.01, y, table, fontsize=table_font, va="center", gid="block-table")
    ax.set_xlim(-0.2, x_max)
    ax.set_ylim(-0.6, 1.5)


def _paint_errors(ax, run: PagedRun) -> None:
    """The error of each (request, head) against dense attention, on a log scale."""
    errors = [e for per_head in run.errors for e in per_head]
    heads = len(run.errors[0]) if run.errors else 1
    labels = [
        f"q{q} h{h}" if heads > 1 else f"q{q}"
        for q in range(len(run.errors))
        for h in range(heads)
    ]
    colours = [
        HIGHLIGHT if e > TOLERANCE else request_colour(q)
        for q, per_head in enumerate(run.errors)
        for e in per_head
    ]
    bars = [max(e, 1e-9) for e in errors]
    drawn = ax.bar(range(len(bars)), bars, color=colours, edgecolor=EDGE, linewidth=0.6)
    for patch in drawn:
        patch.set_gid("error-bar")
    for index, error in enumerate(errors):
        if error == 0:  # a bar of height 0 on a log scale: say so rather than show nothing
            ax.text(index, 3e-9, _("0 (exact)"), ha="center", fontsize=FONT_SIZE - 1)
    ax.set_yscale("log")
    ax.set_ylim(1e-9, 10)
    # Plain tick labels: the log axis's default 10^k labels are mathtext, slow to lay out.
    ax.set_yticks([1e-8, 1e-6, 1e-4, 1e-2, 1], ["1e-8", "1e-6", "1e-4", "0.01", "1"])
    ax.minorticks_off()
    ax.axhline(TOLERANCE, color=EDGE, linestyle="--", linewidth=0.8)
    at = (len(bars) - 0.6, TOLERANCE * 1.6)
    ax.text(*at, _("tolerance"), ha="right", fontsize=FONT_SIZE - 1)
    ax.set_xticks(range(len(bars)), labels, fontsize=FONT_SIZE - 1)
    ax.tick_params(axis="y", labelsize=FONT_SIZE - 1)
    ax.set_ylabel(_("max |paged - dense|"), fontsize=FONT_SIZE)
    title = (
        _("paged attention against dense attention, per request and head")
        if heads > 1
        else _("paged attention against dense attention, per request (one head)")
    )
    ax.set_title(title, fontsize=FONT_SIZE)


def paged_attention_widget(block_size: int = 4, longest: int = 11, num_heads: int = 1) -> VBox:
    """``draw_paged_attention`` with sliders for the block size and the longest request, and
    a corruption to apply. One head by default: a wrong slot damages every head of a request
    alike, and the interpreted attention kernel runs one program per (request, head), so a
    second head would only make every move slower."""
    from slotmap.viz.live import choice, live_figure, slider

    controls = {
        "block_size": slider(_("block size B"), block_size, 1, 8),
        "longest": slider(_("request 1's length"), longest, 1, 24),
        "corruption": choice(_("corruption"), [(tr(c), c) for c in CORRUPTIONS], "none"),
    }

    def redraw(block_size: int, longest: int, corruption: str):
        return draw_paged_attention((6, longest, 3), block_size, corruption, num_heads=num_heads)

    return live_figure(redraw, controls)


# ---------------------------------------------------------------------------------------------
# Context parallelism
# ---------------------------------------------------------------------------------------------
@dataclass
class CPAttentionRun:
    """One request decoding its last position over the ranks, run one after the other."""

    seq_len: int
    interleave: int
    block_size: int
    owner: list[int]  # position -> the rank whose slot mapping gave it a slot
    local_lens: list[int]  # [rank]: positions it stores
    tables: list[list[int]]  # [rank]: its own block-table row
    lses: list[list[float]]  # [rank][head]: its partial lse (-inf: it owns nothing)
    shares: list[list[float]]  # [rank][head]: its weight exp(lse_r - lse) in the merge
    errors: list[dict]  # simulate_ranks' errors against dense attention

    @property
    def world_size(self) -> int:
        return len(self.local_lens)


def run_cp_attention(
    seq_len: int, world_size: int, interleave: int, block_size: int
) -> CPAttentionRun:
    """``simulate_ranks`` on one request of ``seq_len`` positions: what each rank stored and
    how much of the merged softmax it carries."""
    problem = CPProblem(
        seq_lens=(seq_len,), num_heads=2, head_dim=16, block_size=block_size, interleave=interleave
    )
    run = simulate_ranks(problem, world_size)
    states = run["states"]
    lses, merged_lse = run["lses"].cpu(), run["merged"][1].cpu()
    finite = torch.isfinite(lses)
    shares = torch.where(finite, torch.exp(lses - merged_lse[None]), torch.zeros_like(lses))
    # Owner of each position: the rank whose slot mapping gave it a slot (prompt + new token).
    owner = [-1] * seq_len
    for state in states:
        for position, slot in enumerate(state.prompt_slots.cpu().tolist()):
            if slot != PAD_SLOT_ID:
                owner[position] = state.rank
        if state.slot_mapping.cpu().tolist()[0] != PAD_SLOT_ID:
            owner[seq_len - 1] = state.rank
    return CPAttentionRun(
        seq_len,
        interleave,
        block_size,
        owner,
        [int(s.local_lens[0]) for s in states],
        [s.block_table[0].cpu().tolist() for s in states],
        lses[:, 0].tolist(),
        shares[:, 0].tolist(),
        run["errors"],
    )


def draw_cp_attention(
    seq_len: int = 13, world_size: int = 2, interleave: int = 2, block_size: int = 4
) -> Figure:
    """One request decoding position ``seq_len - 1`` over ``world_size`` ranks: ownership,
    local caches, each rank's weight exp(lse_r - lse) and the merged error; a Figure."""
    return draw_cp_attention_run(run_cp_attention(seq_len, world_size, interleave, block_size))


def draw_cp_attention_run(run: CPAttentionRun) -> Figure:
    """Draw a ``CPAttentionRun`` (see ``draw_cp_attention``)."""
    import matplotlib.pyplot as plt

    seq_len, world_size, block_size = run.seq_len, run.world_size, run.block_size
    fig_height = ROW_TOP + ROW_HEIGHT * (1 + world_size) + 0.15
    style.use_cjk_font()
    fig = plt.figure(figsize=(WIDTH, fig_height))
    # One horizontal scale for every row, so a box is the same size everywhere.
    local_blocks = max(-(-n // block_size) for n in run.local_lens)
    width = max(seq_len, 8, local_blocks * (block_size + 0.3))

    def row_axes(index: int):
        y = (fig_height - ROW_TOP - (index + 1) * ROW_HEIGHT) / fig_height
        ax = fig.add_axes([0.11, y, 0.62, 0.9 * ROW_HEIGHT / fig_height])
        ax.set_axis_off()
        ax.set_xlim(-0.1, width + 0.1)
        ax.set_ylim(-0.5, 0.9)
        return ax, y

    owner_ax = row_axes(0)[0]
    colours, labels = [request_colour(r) for r in run.owner], [str(p) for p in range(seq_len)]
    gids = [f"owner-r{r}" for r in run.owner]
    patches = boxes(
        owner_ax, 0, colours, labels, gids=gids, text_colour="white", font_size=FONT_SIZE - 1
    )
    patches[-1].set(edgecolor=HIGHLIGHT, linewidth=2.2)
    row_label(owner_ax, 0, _("position\n(owner)"))
    block_points = block_size * 0.62 * WIDTH * 72 / (width + 0.2)
    local_axes = []
    for r in range(world_size):
        ax, y = row_axes(r + 1)
        local_axes.append(ax)
        _paint_local_cache(ax, run, r, block_points)
        lse = ", ".join(
            f"h{h} {v:.2f}" if v > -math.inf else f"h{h} -inf" for h, v in enumerate(run.lses[r])
        )
        share = ", ".join(f"h{h} {v:.2f}" for h, v in enumerate(run.shares[r]))
        at = (0.75, y + 0.5 * ROW_HEIGHT / fig_height)
        weights = _("lse: {lse}\nweight: {weight}").format(lse=lse, weight=share)
        fig.text(*at, weights, fontsize=FONT_SIZE - 1, va="center")
    handles = [key(request_colour(r), f"rank {r}") for r in range(world_size)]
    handles.append(key("white", _("new token"), HIGHLIGHT, linewidth=2))
    anchor = (0.99, 1 - (ROW_TOP + 0.5 * ROW_HEIGHT) / fig_height)
    legend(fig, handles, loc="center right", bbox_to_anchor=anchor, ncol=2)
    errors = run.errors[0]
    title = _(
        "Context-parallel decode of position {position}: W = {ranks}, interleave I = "
        "{interleave}, block size B = {block_size}. Each rank attends to the positions it "
        "stores;\nthe merge weighs rank r by exp(lse_r - lse). Merged vs dense attention: max "
        "error {out} (out), {lse} (lse)"
    ).format(
        position=seq_len - 1,
        ranks=ngettext("{n} rank", "{n} ranks", world_size).format(n=world_size),
        interleave=run.interleave,
        block_size=block_size,
        out=f"{errors['merged_out']:.1e}",
        lse=f"{errors['merged_lse']:.1e}",
    )
    fig.suptitle(title, fontsize=FONT_SIZE + 1)
    fig.slotmap_run = {
        "owner": run.owner,
        "local_lens": run.local_lens,
        "shares": run.shares,
        "errors": run.errors,
        "local_axes": local_axes,
    }
    return fig


ROW_TOP, ROW_HEIGHT = 0.8, 0.72  # the CP figure's title band and each row, in inches


def _paint_local_cache(ax, run: CPAttentionRun, r: int, block_points: float) -> None:
    """Rank ``r``'s own cache: its logical blocks, each under the physical block of its own
    cache it is (rank 0's block 4 and rank 1's block 4 are different memory)."""
    owned = [p for p in range(run.seq_len) if run.owner[p] == r]
    n, size, x = run.local_lens[r], run.block_size, 0.0
    for logical in range(-(-n // size) if n else 0):
        chunk = owned[logical * size : (logical + 1) * size]
        colours, labels = [request_colour(r)] * len(chunk), [str(p) for p in chunk]
        look = {"x0": x, "text_colour": "white", "font_size": FONT_SIZE - 1}
        boxes(ax, 0, colours, labels, gids=f"local-r{r}", **look)
        boxes(ax, 0, [EMPTY] * (size - len(chunk)), None, x0=x + len(chunk))
        physical = run.tables[r][logical]
        names = [
            _("rank {rank}'s block {block}").format(rank=r, block=physical),
            _("r{rank} block {block}").format(rank=r, block=physical),
        ]
        label = first_fitting(names, 0.95 * block_points, FONT_SIZE - 2, str(physical))
        ax.text(x + size / 2, -0.25, label, **CENTRE, fontsize=FONT_SIZE - 2)
        x += size + 0.3
    if n == 0:
        note = _("owns no position: lse = -inf, weight 0")
        ax.text(0, 0.4, note, va="center", fontsize=FONT_SIZE, color="#555555")
    row_label(
        ax, 0, ngettext("rank {r}\n{n} position", "rank {r}\n{n} positions", n).format(r=r, n=n)
    )


def cp_attention_widget(seq_len: int = 13, world_size: int = 2, interleave: int = 2) -> VBox:
    """``draw_cp_attention`` with sliders for the length, the ranks and the interleave
    (block size 4: interleaves 1, 2 and 4 divide it)."""
    from slotmap.viz.live import choice, live_figure, slider

    controls = {
        "seq_len": slider(_("sequence length"), seq_len, 1, 24),
        "world_size": slider(_("ranks W"), world_size, 1, 4),
        "interleave": choice(_("interleave I"), [1, 2, 4], interleave),
    }
    return live_figure(draw_cp_attention, controls)


__all__ = [
    "CORRUPTIONS",
    "cp_attention_widget",
    "draw_cp_attention",
    "draw_paged_attention",
    "paged_attention_widget",
    "run_paged",
]
