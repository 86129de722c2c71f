"""The direct slot-mapping kernel: every lane loads its own block-table entry.

This is how the upstream GPU kernel does it. It needs no window, so it has no window
precondition and takes positions in any order; on a GPU it is the faster design. On an
Ascend NPU a per-lane (gather-style) load becomes a scalar load per token, which is why the
production NPU kernel loads a window instead. Same launcher arguments and result as
``compute_slot_mapping``.
"""

from __future__ import annotations

import triton
import triton.language as tl
from torch import Tensor

from slotmap.kernels.common import (
    _block_and_offset,
    _fill_pad,
    launch_cached_plan,
    launch_slot_mapping,
)
from slotmap.layout import PAD_SLOT_ID


@triton.jit(do_not_specialize=["num_tokens", "max_num_tokens"])
def _compute_slot_mapping_direct_kernel(
    num_tokens,  # int: real tokens in the batch
    max_num_tokens,  # int: length of slot_mapping
    query_start_loc_ptr,  # [num_reqs + 1], int32
    positions_ptr,  # [>= num_tokens], int64
    block_table_ptr,  # [max_num_reqs, block_table_stride], int32
    block_table_stride,  # int
    block_size,  # int
    slot_mapping_ptr,  # [max_num_tokens], int32
    KV_CACHE_BLOCK_SIZE: tl.constexpr,
    BLOCKS_PER_KV_BLOCK: tl.constexpr,
    TOTAL_CP_WORLD_SIZE: tl.constexpr,
    TOTAL_CP_RANK: tl.constexpr,
    CP_KV_CACHE_INTERLEAVE_SIZE: tl.constexpr,
    PAD_ID: tl.constexpr,
    TILE_BLOCK_SIZE: tl.constexpr,
    IS_CIRCULAR: tl.constexpr = False,
    PARALLEL_TILES: tl.constexpr = 1,  # programs per request along grid axis 1
):
    # slot = block_table[q, pos // block_size] * block_size + pos % block_size, one load a lane
    req_idx = tl.program_id(0)
    part = tl.program_id(1)  # program (q, p) handles tiles p, p + P, p + 2P, ... of request q
    if req_idx == tl.num_programs(0) - 1:
        _fill_pad(
            slot_mapping_ptr,
            num_tokens + part * TILE_BLOCK_SIZE,
            max_num_tokens,
            PARALLEL_TILES,
            PAD_ID,
            TILE_BLOCK_SIZE,
        )
        return

    start_idx = tl.maximum(tl.load(query_start_loc_ptr + req_idx), 0)
    end_idx = tl.minimum(tl.load(query_start_loc_ptr + req_idx + 1), num_tokens)
    block_table_row_ptr = block_table_ptr + req_idx * block_table_stride
    for tile_start in range(
        start_idx + part * TILE_BLOCK_SIZE, end_idx, PARALLEL_TILES * TILE_BLOCK_SIZE
    ):
        offsets = tile_start + tl.arange(0, TILE_BLOCK_SIZE)
        mask = offsets < end_idx
        pos = tl.load(positions_ptr + offsets, mask=mask, other=0).to(tl.int32)
        block_indices, slot_offsets, has_slot = _block_and_offset(
            pos,
            block_size,
            KV_CACHE_BLOCK_SIZE,
            BLOCKS_PER_KV_BLOCK,
            TOTAL_CP_WORLD_SIZE,
            TOTAL_CP_RANK,
            CP_KV_CACHE_INTERLEAVE_SIZE,
            IS_CIRCULAR,
        )
        # Each lane loads its own entry; the row mask keeps unvalidated input in bounds.
        in_row = mask & has_slot & (block_indices >= 0) & (block_indices < block_table_stride)
        block_numbers = tl.load(block_table_row_ptr + block_indices, mask=in_row, other=0)
        slot_ids = block_numbers * block_size + slot_offsets
        slot_ids = tl.where(has_slot, slot_ids, PAD_ID)
        tl.store(slot_mapping_ptr + offsets, slot_ids, mask=mask)


def compute_slot_mapping_direct(
    query_start_loc: Tensor,
    positions: Tensor,
    block_table: Tensor,
    block_size: int,
    *,
    num_tokens: int | None = None,
    max_num_tokens: int | None = None,
    kv_cache_block_size: int | None = None,
    cp_world_size: int = 1,
    cp_rank: int = 0,
    cp_interleave: int = 1,
    circular: bool = False,
    pad_id: int = PAD_SLOT_ID,
    out: Tensor | None = None,
    validate: bool = True,
    tile_size: int | None = None,
    parallel_tiles: int | None = None,
    num_warps: int | None = None,
) -> Tensor:
    """Slot of every batch token, one block-table load per token (no window precondition).

    Same arguments and result as ``compute_slot_mapping`` and ``slot_mapping_oracle``;
    ``tile_size``, ``parallel_tiles`` and ``num_warps`` as there.
    """
    # The hot path (see slotmap.kernels.common): a cached plan and structural checks only.
    key = (
        "direct", query_start_loc.numel() - 1, num_tokens, max_num_tokens, block_size,
        kv_cache_block_size, cp_world_size, cp_rank, cp_interleave, circular, pad_id, tile_size,
        parallel_tiles, num_warps,
    )  # fmt: skip
    if not validate and launch_cached_plan(
        _compute_slot_mapping_direct_kernel, key,
        query_start_loc, positions, block_table, block_size, out, num_tokens, max_num_tokens,
    ):  # fmt: skip
        return out
    return launch_slot_mapping(
        _compute_slot_mapping_direct_kernel, key,
        query_start_loc, positions, block_table, block_size,
        num_tokens=num_tokens, max_num_tokens=max_num_tokens,
        kv_cache_block_size=kv_cache_block_size, cp_world_size=cp_world_size, cp_rank=cp_rank,
        cp_interleave=cp_interleave, circular=circular, pad_id=pad_id, out=out,
        validate=validate, tile_size=tile_size, parallel_tiles=parallel_tiles,
        num_warps=num_warps, window=False,
    )  # fmt: skip
