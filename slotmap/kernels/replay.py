"""Replay padding: keep a prefix-cache hit from rewriting shared cached blocks.

On a prefix-cache hit with a sliding-window group, the engine recomputes ("replays") the
last ``window`` tokens before the cached prefix ends, because the sliding-window cache needs
their KV. Those positions already sit in cached blocks that other requests share. Writing
them again would not be wrong for this request, but would put bytes into a shared block that
differ from what its other readers wrote; so in every prefix-cacheable group their slot
becomes PAD_ID, and the KV write skips them. Groups that are not prefix-cacheable keep their
slots.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence

import torch
import triton
import triton.language as tl
from torch import Tensor

from slotmap.kernels.launch import check_grid, check_launch_device, check_tile
from slotmap.layout import PAD_SLOT_ID, PRODUCTION_TILE
from slotmap.validate import as_int, check_pad_id, check_replay_inputs


@triton.jit(do_not_specialize=["num_tokens", "window"])
def _pad_replayed_slots_kernel(
    num_tokens,  # int: real tokens in the batch
    query_start_loc_ptr,  # [num_reqs + 1], int32
    positions_ptr,  # [>= num_tokens], int64
    replay_start_ptr,  # [num_reqs], int32: first replayed position, 0 = no replay
    window,  # int: replayed positions per request
    prefix_cacheable_ptr,  # [num_groups], int32: 1 if the group's blocks are prefix-cached
    slot_mappings_ptr,  # [num_groups, >= num_tokens], int32, modified in place
    slot_mappings_stride,  # int: elements between two groups' rows
    PAD_ID: tl.constexpr,
    TILE_BLOCK_SIZE: tl.constexpr,
):
    # slot_mappings[g, t] = PAD_ID where replay_start[q] > 0 and pos in [start, start + window)
    group_idx = tl.program_id(0)
    req_idx = tl.program_id(1)
    if tl.load(prefix_cacheable_ptr + group_idx) == 0:
        return
    replay_start = tl.load(replay_start_ptr + req_idx)
    if replay_start <= 0:
        return
    replay_end = replay_start + window
    slot_mapping_ptr = slot_mappings_ptr + group_idx * slot_mappings_stride
    # Both inside [0, num_tokens] whatever int32 query_start_loc holds (unvalidated).
    start_idx = tl.minimum(tl.maximum(tl.load(query_start_loc_ptr + req_idx), 0), num_tokens)
    end_idx = tl.minimum(tl.maximum(tl.load(query_start_loc_ptr + req_idx + 1), 0), num_tokens)
    for tile_start in range(start_idx, end_idx, TILE_BLOCK_SIZE):
        offsets = tile_start + tl.arange(0, TILE_BLOCK_SIZE)
        mask = offsets < end_idx
        pos = tl.load(positions_ptr + offsets, mask=mask, other=0).to(tl.int32)
        replayed = mask & (pos >= replay_start) & (pos < replay_end)
        tl.store(slot_mapping_ptr + offsets, PAD_ID, mask=replayed)


def pad_replayed_slots(
    slot_mappings: Tensor,
    query_start_loc: Tensor,
    positions: Tensor,
    replay_start: Tensor,
    window: int,
    prefix_cacheable: Sequence[bool],
    *,
    num_tokens: int | None = None,
    pad_id: int = PAD_SLOT_ID,
    validate: bool = True,
    tile_size: int = PRODUCTION_TILE,
) -> Tensor:
    """Pad replayed positions in every prefix-cacheable group, in place.

    slot_mappings: [num_groups, >= num_tokens] int32 or int64 (from ``compute_slot_mappings``);
    replay_start: [num_reqs] int32; prefix_cacheable: one flag per group.
    Returns ``slot_mappings``. Same arguments and result as ``slotmap.replay_padding_oracle``.
    """
    tile_size = as_int("tile_size", tile_size)
    check_tile(tile_size)
    window = as_int("window", window)
    pad_id = check_pad_id(pad_id)
    num_tokens = check_replay_inputs(
        slot_mappings,
        query_start_loc,
        positions,
        replay_start,
        window,
        prefix_cacheable,
        num_tokens=as_int("num_tokens", num_tokens, optional=True),
        full=validate,
        pad_id=pad_id,
    )
    check_launch_device(positions)
    num_reqs = query_start_loc.numel() - 1
    num_groups = slot_mappings.shape[0]
    if num_reqs == 0 or num_groups == 0 or not any(prefix_cacheable):
        return slot_mappings
    check_grid((num_groups, num_reqs))
    cacheable = _flags(tuple(bool(c) for c in prefix_cacheable), positions.device)
    _pad_replayed_slots_kernel[(num_groups, num_reqs)](
        num_tokens,
        query_start_loc,
        positions,
        replay_start,
        window,
        cacheable,
        slot_mappings,
        slot_mappings.stride(0),
        PAD_ID=pad_id,
        TILE_BLOCK_SIZE=tile_size,
    )
    return slot_mappings


@functools.lru_cache(maxsize=32)
def _flags(prefix_cacheable: tuple[bool, ...], device: torch.device) -> Tensor:
    # One host-to-device copy per set of flags, not per step: a serving loop (and a graph
    # capture) launches with the same groups every step.
    return torch.tensor(prefix_cacheable, dtype=torch.int32, device=device)
