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

import functools
from dataclasses import dataclass

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
from slotmap.layout import PAD_SLOT_ID
from slotmap.reference import slot_mapping_oracle
from slotmap.viz.style import (
    EDGE,
    EMPTY,
    FONT_SIZE,
    HIGHLIGHT,
    WIDTH,
    boxes,
    request_colour,
)

TOLERANCE = 1e-4  # |paged - dense| below this counts as a match (float32 arithmetic)
CORRUPTIONS = ("none", "one token to a free slot", "one token to another request's slot")


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
        raise ValueError(f"corruption must be one of {CORRUPTIONS}, got {corruption!r}")
    problem = CPProblem(
        seq_lens=tuple(seq_lens), num_heads=num_heads, head_dim=head_dim,
        block_size=block_size, seed=seed, spare_blocks=2, stale_cache=True,
    )  # fmt: skip
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
    if corrupted_token is not None and corruption != "one token to a free slot":
        # Two tokens share one slot: let the corrupted one write last, as a later step would.
        order = [t for t in range(len(written)) if t != corrupted_token] + [corrupted_token]
        index = torch.tensor(order, device=DEVICE)
        reshape_and_cache(key[index[:-1]], value[index[:-1]], state.key_cache, state.value_cache,
                          written[index[:-1]])  # fmt: skip
        reshape_and_cache(key[index[-1:]], value[index[-1:]], state.key_cache, state.value_cache,
                          written[index[-1:]])  # fmt: skip
    else:
        reshape_and_cache(key, value, state.key_cache, state.value_cache, written)
    out, _ = paged_decode_attention(
        dense.query, state.key_cache, state.value_cache, state.block_table, dense.seq_lens
    )
    dense_out, _ = dense_attention(dense.query, dense.key, dense.value, dense.seq_lens)
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


@functools.lru_cache(maxsize=1024)
def _text_width(text: str, font_size: float) -> float:
    """Width of ``text`` in points at ``font_size`` (the default font), without drawing it."""
    from matplotlib.font_manager import FontProperties
    from matplotlib.textpath import TextToPath

    width, _, _ = TextToPath().get_text_width_height_descent(
        text, FontProperties(size=font_size), ismath=False
    )
    return width


def _plural(count: int, noun: str) -> str:
    return f"{count} {noun}" if count == 1 else f"{count} {noun}s"


def draw_paged_attention(
    seq_lens: tuple[int, ...] = (6, 11, 3),
    block_size: int = 4,
    corruption: str = "none",
    seed: int = 0,
    num_heads: int = 2,
):
    """The paged cache after ``reshape_and_cache`` and the attention's error per request and
    head against dense attention; returns a matplotlib Figure.

    The cache row is as wide as the figure at every size: a slot's label (the position it
    holds) and a block's number shrink or go where they would not fit."""
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    run = run_paged(tuple(seq_lens), block_size, corruption, seed=seed, num_heads=num_heads)
    fig = plt.figure(figsize=(WIDTH, 5.0))
    left, right = 0.1, 0.99
    cache_ax = fig.add_axes([left, 0.5, right - left, 0.36])
    error_ax = fig.add_axes([0.1, 0.1, 0.59, 0.28])
    cache_ax.set_axis_off()

    # The cache: physical blocks side by side, each of B slots, each slot labelled with the
    # position it holds (written by reshape_and_cache through the slot mapping).
    gap = 0.35
    x_max = run.num_blocks * (block_size + gap)
    points_per_unit = (right - left) * WIDTH * 72 / (x_max + 0.2)
    # The widest label of each row at the largest font that fits (a slot is 1 unit wide,
    # a block B units plus the gap); a row whose labels fit at no size loses them.
    widest_position = str(max(run.seq_lens) - 1)
    slot_font = next(
        (f for f in (FONT_SIZE - 1, FONT_SIZE - 2)
         if _text_width(widest_position, f) <= 0.9 * points_per_unit),
        None,
    )  # fmt: skip
    block_font = next(
        (f for f in (FONT_SIZE - 1, FONT_SIZE - 2)
         if _text_width(str(run.num_blocks - 1), f) <= (block_size + gap * 0.6) * points_per_unit),
        None,
    )  # fmt: skip
    holder: dict[int, tuple[int, int]] = {}
    for token, slot in enumerate(run.written):
        if slot != PAD_SLOT_ID:
            holder[slot] = (run.requests[token], run.positions[token])
    corrupt_slot = run.written[run.corrupted_token] if run.corrupted_token is not None else None
    lost_slot = run.slots[run.corrupted_token] if run.corrupted_token is not None else None
    for block in range(run.num_blocks):
        x0 = block * (block_size + gap)
        colours, labels, gids = [], [], []
        for offset in range(block_size):
            slot = block * block_size + offset
            if slot == lost_slot:
                colours.append(EMPTY)
                labels.append("?")
                gids.append("slot-lost")
            elif slot in holder:
                request, position = holder[slot]
                colours.append(HIGHLIGHT if slot == corrupt_slot else request_colour(request))
                labels.append(str(position))
                gids.append("slot-corrupt" if slot == corrupt_slot else f"slot-q{request}")
            else:
                colours.append(EMPTY)
                labels.append("")
                gids.append("slot-stale")
        patches = boxes(cache_ax, 0, colours, labels if slot_font else None, x0=x0,
                        text_colour="white", font_size=slot_font or FONT_SIZE)  # fmt: skip
        for patch, gid in zip(patches, gids, strict=True):
            patch.set_gid(gid)
            if gid == "slot-lost":
                patch.set_edgecolor(HIGHLIGHT)
                patch.set_linewidth(2.0)
        if block_font:
            cache_ax.text(x0 + block_size / 2, -0.3, str(block), ha="center", va="center",
                          fontsize=block_font)  # fmt: skip
    for text in cache_ax.texts:
        if text.get_text() == "?":
            text.set_color(HIGHLIGHT)
    # Row captions, in the margin left of the cache.
    cache_ax.text(-0.2 - 0.08 * 72 / points_per_unit, 0.4, "slot\n(position\nit holds)",
                  ha="right", va="center", fontsize=FONT_SIZE - 1)  # fmt: skip
    if block_font:
        cache_ax.text(-0.2 - 0.08 * 72 / points_per_unit, -0.3, "physical block", ha="right",
                      va="center", fontsize=FONT_SIZE - 1)  # fmt: skip
    rows = "   ".join(
        f"q{q}: {row[: -(-n // block_size)]}"
        for q, (row, n) in enumerate(zip(run.block_table, run.seq_lens, strict=True))
    )
    table = f"block table  {rows}"
    # One line across the whole figure, at the largest font that fits.
    table_font = next(
        (f for f in (FONT_SIZE, FONT_SIZE - 1, FONT_SIZE - 2, FONT_SIZE - 3)
         if _text_width(table, f) <= 0.98 * WIDTH * 72),
        FONT_SIZE - 3,
    )  # fmt: skip
    fig.text(0.01, 0.5 + 0.36 * (1.25 + 0.6) / 2.1, table, fontsize=table_font, va="center",
             gid="block-table")  # fmt: skip
    cache_ax.set_xlim(-0.2, x_max)
    cache_ax.set_ylim(-0.6, 1.5)

    # The error of each (request, head) against dense attention, on a log scale.
    bars, labels, colours = [], [], []
    for q, per_head in enumerate(run.errors):
        for h, error in enumerate(per_head):
            bars.append(max(error, 1e-9))
            labels.append(f"q{q} h{h}" if len(per_head) > 1 else f"q{q}")
            colours.append(HIGHLIGHT if error > TOLERANCE else request_colour(q))
    drawn = error_ax.bar(range(len(bars)), bars, color=colours, edgecolor=EDGE, linewidth=0.6)
    for patch in drawn:
        patch.set_gid("error-bar")
    for index, error in enumerate(e for per_head in run.errors for e in per_head):
        if error == 0:  # a bar of height 0 on a log scale: say so rather than show nothing
            error_ax.text(index, 3e-9, "0 (exact)", ha="center", fontsize=FONT_SIZE - 1)
    error_ax.set_yscale("log")
    error_ax.set_ylim(1e-9, 10)
    # Plain tick labels: the log axis's default 10^k labels are mathtext, slow to lay out.
    error_ax.set_yticks([1e-8, 1e-6, 1e-4, 1e-2, 1], ["1e-8", "1e-6", "1e-4", "0.01", "1"])
    error_ax.minorticks_off()
    error_ax.axhline(TOLERANCE, color=EDGE, linestyle="--", linewidth=0.8)
    error_ax.text(
        len(bars) - 0.6, TOLERANCE * 1.6, "tolerance", ha="right", fontsize=FONT_SIZE - 1
    )
    error_ax.set_xticks(range(len(bars)), labels, fontsize=FONT_SIZE - 1)
    error_ax.tick_params(axis="y", labelsize=FONT_SIZE - 1)
    error_ax.set_ylabel("max |paged - dense|", fontsize=FONT_SIZE)
    per = "per request and head" if num_heads > 1 else "per request (one head)"
    error_ax.set_title(f"paged attention against dense attention, {per}", fontsize=FONT_SIZE)

    handles = [Patch(facecolor=request_colour(q), edgecolor=EDGE, label=f"request {q}")
               for q in range(len(run.seq_lens))]  # fmt: skip
    handles.append(Patch(facecolor=EMPTY, edgecolor=EDGE, label="stale (never written)"))
    if run.corrupted_token is not None:
        handles.append(Patch(facecolor=HIGHLIGHT, edgecolor=EDGE, label="corrupted write"))
        handles.append(Patch(facecolor=EMPTY, edgecolor=HIGHLIGHT, linewidth=2,
                             label="the slot it should have written"))  # fmt: skip
    fig.legend(handles=handles, loc="center left", bbox_to_anchor=(0.72, 0.25),
               fontsize=FONT_SIZE - 1, frameon=False)  # fmt: skip
    if run.corrupted_token is not None:
        t = run.corrupted_token
        what = (
            f"token {t} (request {run.requests[t]}, position {run.positions[t]}) written to "
            f"slot {run.written[t]} instead of {run.slots[t]}"
        )
    else:
        what = "every token written to the slot the kernel computed"
    verdict = (
        f"every request matches dense attention (max error {run.max_error:.1e})"
        if run.max_error <= TOLERANCE
        else f"DIVERGED, max error {run.max_error:.2f}"
    )
    fig.suptitle(
        f"Paged KV cache: {_plural(run.num_blocks, 'physical block')} of B = "
        f"{_plural(block_size, 'slot')}\n{what}: {verdict}",
        fontsize=FONT_SIZE + 1,
    )
    fig.slotmap_run = run
    return fig


def paged_attention_widget(block_size: int = 4, longest: int = 11, num_heads: int = 1):
    """``draw_paged_attention`` with sliders for the block size and the longest request, and
    a corruption to apply. One head by default: a wrong slot damages every head of a request
    alike, and the interpreted attention kernel runs one program per (request, head), so a
    second head would only make every move slower."""
    import ipywidgets as widgets

    from slotmap.viz.live import live_figure

    style = {"description_width": "initial"}
    controls = {
        "block_size": widgets.IntSlider(
            value=block_size, min=1, max=8, description="block size B", style=style
        ),
        "longest": widgets.IntSlider(
            value=longest, min=1, max=24, description="request 1's length", style=style
        ),
        "corruption": widgets.Dropdown(
            options=CORRUPTIONS, value="none", description="corruption", style=style
        ),
    }

    def draw(block_size: int, longest: int, corruption: str):
        return draw_paged_attention((6, longest, 3), block_size, corruption, num_heads=num_heads)

    return live_figure(draw, controls)


# ---------------------------------------------------------------------------------------------
# Context parallelism
# ---------------------------------------------------------------------------------------------
RANK_COLOURS = ("#0072B2", "#E69F00", "#009E73", "#CC79A7")


def rank_colour(rank: int) -> str:
    return RANK_COLOURS[rank % len(RANK_COLOURS)]


def draw_cp_attention(
    seq_len: int = 13, world_size: int = 2, interleave: int = 2, block_size: int = 4
):
    """One request decoding position ``seq_len - 1`` over ``world_size`` ranks: ownership,
    local caches, each rank's weight exp(lse_r - lse) and the merged error; a Figure."""
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    problem = CPProblem(
        seq_lens=(seq_len,), num_heads=2, head_dim=16, block_size=block_size,
        interleave=interleave,
    )  # fmt: skip
    run = simulate_ranks(problem, world_size)
    states = run["states"]
    lses, merged_lse = run["lses"].cpu(), run["merged"][1].cpu()
    shares = torch.where(
        torch.isfinite(lses), torch.exp(lses - merged_lse[None]), torch.zeros_like(lses)
    )  # [W, 1, H]
    # Owner of each position: the rank whose slot mapping gave it a slot (prompt + new token).
    owner = [-1] * seq_len
    for state in states:
        prompt = state.prompt_slots.cpu().tolist()
        for position, slot in enumerate(prompt):
            if slot != PAD_SLOT_ID:
                owner[position] = state.rank
        if state.slot_mapping.cpu().tolist()[0] != PAD_SLOT_ID:
            owner[seq_len - 1] = state.rank
    rows = 1 + world_size
    top, row_height, bottom = 0.8, 0.72, 0.15  # inches
    fig_height = top + row_height * rows + bottom
    fig = plt.figure(figsize=(WIDTH, fig_height))

    def row_axes(index: int):
        y = (fig_height - top - (index + 1) * row_height) / fig_height
        ax = fig.add_axes([0.11, y, 0.62, 0.9 * row_height / fig_height])
        ax.set_axis_off()
        return ax, y

    # One horizontal scale for every row, so a box is the same size everywhere.
    local_blocks = max(-(-int(s.local_lens[0]) // block_size) for s in states)
    width = max(seq_len, 8, local_blocks * (block_size + 0.3))
    block_points = block_size * 0.62 * WIDTH * 72 / (width + 0.2)

    def block_label(rank: int, physical: int) -> str:
        """Under a local block: whose cache it is in, if that fits under the block."""
        for label in (f"rank {rank}'s block {physical}", f"r{rank} block {physical}"):
            if _text_width(label, FONT_SIZE - 2) <= 0.95 * block_points:
                return label
        return str(physical)

    owner_ax, _ = row_axes(0)
    patches = boxes(owner_ax, 0, [rank_colour(r) for r in owner],
                    [str(p) for p in range(seq_len)], text_colour="white",
                    font_size=FONT_SIZE - 1)  # fmt: skip
    for patch, r in zip(patches, owner, strict=True):
        patch.set_gid(f"owner-r{r}")
    patches[-1].set_edgecolor(HIGHLIGHT)
    patches[-1].set_linewidth(2.2)
    owner_ax.set_xlim(-0.1, width + 0.1)
    owner_ax.set_ylim(-0.5, 0.9)
    owner_ax.text(-0.4, 0.4, "position\n(owner)", ha="right", va="center", fontsize=FONT_SIZE)
    local_axes = []
    for state in states:
        r = state.rank
        ax, y = row_axes(r + 1)
        local_axes.append(ax)
        owned = [p for p in range(seq_len) if owner[p] == r]
        n = int(state.local_lens[0])
        table = state.block_table[0].cpu().tolist()
        x = 0.0
        for logical in range(-(-n // block_size) if n else 0):
            chunk = owned[logical * block_size : (logical + 1) * block_size]
            drawn = boxes(ax, 0, [rank_colour(r)] * len(chunk), [str(p) for p in chunk], x0=x,
                          text_colour="white", font_size=FONT_SIZE - 1)  # fmt: skip
            drawn += boxes(ax, 0, [EMPTY] * (block_size - len(chunk)), None,
                           x0=x + len(chunk))  # fmt: skip
            for patch in drawn[: len(chunk)]:
                patch.set_gid(f"local-r{r}")
            # Each rank numbers the blocks of its own cache: rank 0's block 4 and rank 1's
            # block 4 are different memory.
            ax.text(x + block_size / 2, -0.25, block_label(r, table[logical]), ha="center",
                    va="center", fontsize=FONT_SIZE - 2)  # fmt: skip
            x += block_size + 0.3
        if n == 0:
            ax.text(0, 0.4, "owns no position: lse = -inf, weight 0", va="center",
                    fontsize=FONT_SIZE, color="#555555")  # fmt: skip
        ax.set_xlim(-0.1, width + 0.1)
        ax.set_ylim(-0.5, 0.9)
        ax.text(-0.4, 0.4, f"rank {r}\n{_plural(n, 'position')}", ha="right", va="center",
                fontsize=FONT_SIZE)  # fmt: skip
        share = ", ".join(f"h{h} {float(shares[r, 0, h]):.2f}" for h in range(shares.shape[2]))
        lse_text = ", ".join(
            f"h{h} {float(v):.2f}" if torch.isfinite(v) else f"h{h} -inf"
            for h, v in enumerate(lses[r, 0])
        )
        fig.text(0.75, y + 0.5 * row_height / fig_height, f"lse: {lse_text}\nweight: {share}",
                 fontsize=FONT_SIZE - 1, va="center")  # fmt: skip
    errors = run["errors"][0]
    fig.legend(
        handles=[Patch(facecolor=rank_colour(r), edgecolor=EDGE, label=f"rank {r}")
                 for r in range(world_size)]
        + [Patch(facecolor="white", edgecolor=HIGHLIGHT, linewidth=2, label="new token")],
        loc="center right", bbox_to_anchor=(0.99, 1 - (top + 0.5 * row_height) / fig_height),
        fontsize=FONT_SIZE - 1,
        frameon=False, ncol=2,
    )  # fmt: skip
    fig.suptitle(
        f"Context-parallel decode of position {seq_len - 1}: W = {_plural(world_size, 'rank')}, "
        f"interleave I = {interleave}, block size B = {block_size}. Each rank attends to the "
        "positions it stores;\n"
        f"the merge weighs rank r by exp(lse_r - lse). Merged vs dense attention: max error "
        f"{errors['merged_out']:.1e} (out), {errors['merged_lse']:.1e} (lse)",
        fontsize=FONT_SIZE + 1,
    )
    fig.slotmap_run = {
        "owner": owner,
        "local_lens": [int(s.local_lens[0]) for s in states],
        "shares": shares[:, 0].tolist(),
        "errors": run["errors"],
        "local_axes": local_axes,
    }
    return fig


def cp_attention_widget(seq_len: int = 13, world_size: int = 2, interleave: int = 2):
    """``draw_cp_attention`` with sliders for the length, the ranks and the interleave
    (block size 4: interleaves 1, 2 and 4 divide it)."""
    import ipywidgets as widgets

    from slotmap.viz.live import live_figure

    style = {"description_width": "initial"}
    controls = {
        "seq_len": widgets.IntSlider(
            value=seq_len, min=1, max=24, description="sequence length", style=style
        ),
        "world_size": widgets.IntSlider(
            value=world_size, min=1, max=4, description="ranks W", style=style
        ),
        "interleave": widgets.Dropdown(
            options=[1, 2, 4], value=interleave, description="interleave I", style=style
        ),
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
