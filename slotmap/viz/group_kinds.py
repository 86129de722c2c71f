"""Lesson 06's figure of a hybrid model's three kinds of KV-cache group in one launch.

``draw_group_kinds`` runs the fused kernel ``slotmap.compute_slot_mappings`` once per context-
parallel rank on one batch: a full-attention group sharded across the ranks (allocation blocks
of ``kv_block_size`` tokens, its table counting kernel blocks of ``kernel_block_size``), a
sliding-window group that is not sharded (every position maps on every rank) and a Mamba
state group that is disabled (no table at all). The batch holds a prefill, a decode and a
dummy request (``idx_mapping`` -1, as CUDA-graph padding adds), and the host passes a padded
token count; the output buffer held an earlier step's slots before each launch. The figure
shows the tokens, then each rank's three output rows as the kernel wrote them.

Patches and texts carry a gid (``token``, ``dummy-token``, ``slot``, ``pad``, ``tail``) so
that a test can read the figure back; ``fig.slotmap_run`` is the ``GroupKindsRun`` drawn.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

import slotmap
from slotmap.i18n import N_, _, tr
from slotmap.viz import style

__all__ = ["GroupKindsRun", "draw_group_kinds", "run_group_kinds"]

GROUP_NAMES = (
    N_("full attention (sharded)"),
    N_("sliding window (not sharded)"),
    N_("Mamba state (off)"),
)
STALE = 4242  # what the output buffer held before each launch: an earlier step's slot


@dataclass
class GroupKindsRun:
    """One batch through the fused kernel on every CP rank."""

    positions: list[int]  # the real tokens', then the padded count's zeros
    requests: list[int]  # each real token's request
    dummy: list[bool]  # per request: idx_mapping -1
    real: int  # query_start_loc[num_reqs]
    num_tokens: int  # the host's padded count
    max_num_tokens: int
    options: dict  # the launcher's keyword arguments, less cp_rank
    tables: list  # per group: its block table (None for the disabled group)
    block_sizes: list[int]  # per group: its allocation block
    slots: list[list[list[int]]]  # [rank][group][token]: what the kernel wrote
    expected: list[list[list[int]]]  # the same from slotmap.slot_mappings_oracle


def run_group_kinds(
    cp_world_size: int = 2,
    kv_block_size: int = 4,
    kernel_block_size: int = 2,
    window_block_size: int = 4,
    prefill: int = 7,
    decode_position: int = 13,
    dummy_tokens: int = 2,
    padded: int = 2,
) -> GroupKindsRun:
    """Run the batch (a prefill of ``prefill`` tokens from position 0, a decode at
    ``decode_position``, a dummy request of ``dummy_tokens``, a host count ``padded`` past the
    real tokens) through the fused kernel on every rank, into a buffer holding stale slots."""
    device = slotmap.DEVICE
    lengths = [prefill, 1, dummy_tokens]
    positions = list(range(prefill)) + [decode_position] + [0] * dummy_tokens
    requests = [q for q, n in enumerate(lengths) for _ in range(n)]
    real = len(positions)
    num_tokens = real + padded
    max_num_tokens = num_tokens + 2
    top = max(positions)
    # Distinct physical blocks, readable: group 0's row q starts at 10 * (q + 1).
    per = kv_block_size // kernel_block_size
    full_width = (top // (kv_block_size * cp_world_size) + 1) * per
    window_width = top // window_block_size + 1
    full = [[10 * (q + 1) + b for b in range(full_width)] for q in range(2)]
    window = [[50 + 10 * q + b for b in range(window_width)] for q in range(2)]
    qsl = torch.tensor([0, prefill, prefill + 1, real], dtype=torch.int32, device=device)
    pos = torch.tensor(positions + [0] * padded, dtype=torch.int64, device=device)
    tables = [
        torch.tensor(full, dtype=torch.int32, device=device),
        torch.tensor(window, dtype=torch.int32, device=device),
        None,  # the state group has no block table to read
    ]
    options = dict(
        idx_mapping=torch.tensor([0, 1, -1], dtype=torch.int32, device=device),
        kernel_block_sizes=[kernel_block_size, window_block_size, 1],
        slot_mapping_enabled=[True, True, False],
        dcp_sharded=[True, False, False],
        cp_world_size=cp_world_size,
        cp_interleave=1,
        num_tokens=num_tokens,
        max_num_tokens=max_num_tokens,
    )
    sizes = [kv_block_size, window_block_size, 1]
    slots, expected = [], []
    for rank in range(cp_world_size):
        out = torch.full((3, max_num_tokens), STALE, dtype=torch.int32, device=device)
        slotmap.compute_slot_mappings(qsl, pos, tables, sizes, cp_rank=rank, out=out, **options)
        slots.append(out.cpu().tolist())
        oracle = slotmap.slot_mappings_oracle(qsl, pos, tables, sizes, cp_rank=rank, **options)
        expected.append(oracle.cpu().tolist())
    dummy = [False, False, True]
    return GroupKindsRun(
        positions + [0] * padded,
        requests,
        dummy,
        real,
        num_tokens,
        max_num_tokens,
        options,
        tables,
        sizes,
        slots,
        expected,
    )


def draw_group_kinds(**parameters: int):
    """The figure of ``run_group_kinds(**parameters)``: the tokens, then each rank's rows."""
    run = run_group_kinds(**parameters)
    world = len(run.slots)
    rows = 1 + world * 3
    fig, (ax,) = style.figure(1, height_per_row=0.34 * (rows + 2.5))
    x0 = 5.2  # room for the row captions
    width = run.max_num_tokens
    ax.set_xlim(0, x0 + width + 0.2)

    def caption(y: float, text: str, **font) -> None:
        ax.text(x0 - 0.2, y + 0.4, text, ha="right", va="center", fontsize=style.FONT_SIZE, **font)

    # The tokens: position, coloured by request; a dummy request's in grey; the padded
    # count's and the tail's entries belong to no request.
    colours, labels, gids = [], [], []
    for t in range(width):
        if t < run.real:
            q = run.requests[t]
            colours.append(style.PAD if run.dummy[q] else style.request_colour(q))
            labels.append(str(run.positions[t]))
            gids.append("dummy-token" if run.dummy[q] else "token")
        else:
            colours.append(style.EMPTY)
            labels.append("")
            gids.append("tail")
    style.boxes(ax, 0, colours, labels, gids=gids, x0=x0, text_colour="white")
    caption(0, _("positions"))
    ax.text(
        x0 + run.real, 1.05, _("real count"), ha="center", va="bottom", fontsize=style.FONT_SIZE
    )
    ax.text(
        x0 + run.num_tokens, 1.05, "num_tokens", ha="center", va="bottom", fontsize=style.FONT_SIZE
    )

    y = -1.3
    for rank in range(world):
        for g, name in enumerate(GROUP_NAMES):
            row = run.slots[rank][g]
            colours = [style.PAD if s < 0 else style.EMPTY for s in row]
            labels = ["–" if s < 0 else str(s) for s in row]
            gids = ["pad" if s < 0 else "slot" for s in row]
            style.boxes(ax, y, colours, labels, gids=gids, x0=x0)
            caption(y, _("rank {rank} · {group}").format(rank=rank, group=tr(name)))
            y -= 1.0
        y -= 0.3
    for x in (run.real, run.num_tokens):
        ax.plot([x0 + x, x0 + x], [1.0, y + 1.3], color=style.EDGE, lw=0.8, ls="--")
    note = _(
        "–: PAD_ID (no slot).  Grey positions: a dummy request (idx_mapping -1).\n"
        "Before each launch the buffer held {stale} everywhere (an earlier step's slots)."
    ).format(stale=STALE)
    ax.text(x0, y + 0.3, note, ha="left", va="center", fontsize=style.FONT_SIZE)
    ax.set_ylim(y - 0.5, 1.6)
    fig.slotmap_run = run
    return fig
