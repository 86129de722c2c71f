"""The direct slot-mapping kernel: every lane loads its own block-table entry.

This is how the upstream GPU kernel does it. It needs no window, so it has no window
precondition and takes positions in any order; on a GPU it is the faster design. On an
Ascend NPU a per-lane (gather-style) load becomes a scalar load per token, which is why the
production NPU kernel loads a window instead. Same launcher arguments and result as
``compute_slot_mapping``.
"""

from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl
from torch import Tensor

from slotmap.kernels.common import _block_and_offset
from slotmap.kernels.launch import (
    LaunchKnobs,
    Plan,
    check_grid,
    check_launch_device,
    fast_launch,
    hot_plan,
    launch_shape,
    remember_plan,
)
from slotmap.kernels.slot_mapping import _pad_outside_requests, slot_mapping_args
from slotmap.kernels.token_grid import (
    _fill_token_grid_pad,
    _token_grid_entries,
    _token_grid_requests,
    token_launch_shape,
    use_token_grid,
)
from slotmap.layout import PAD_SLOT_ID, SlotLayout
from slotmap.validate import check_slot_mapping_inputs, resolve_counts


@triton.jit(do_not_specialize=["num_tokens", "max_num_tokens", "parallel_tiles"])
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
    parallel_tiles=1,  # programs per request along grid axis 1 (runtime: one compile)
):
    # slot = block_table[q, pos // block_size] * block_size + pos % block_size, one load a lane
    req_idx = tl.program_id(0)
    part = tl.program_id(1)  # program (q, p) handles tiles p, p + P, p + 2P, ... of request q
    if req_idx == tl.num_programs(0) - 1:
        _pad_outside_requests(
            slot_mapping_ptr,
            query_start_loc_ptr,
            req_idx,
            num_tokens,
            max_num_tokens,
            part,
            parallel_tiles,
            PAD_ID,
            TILE_BLOCK_SIZE,
        )
        return

    # Both inside [0, num_tokens] whatever int32 query_start_loc holds (unvalidated).
    start_idx = tl.minimum(tl.maximum(tl.load(query_start_loc_ptr + req_idx), 0), num_tokens)
    end_idx = tl.minimum(tl.maximum(tl.load(query_start_loc_ptr + req_idx + 1), 0), num_tokens)
    block_table_row_ptr = block_table_ptr + req_idx * block_table_stride
    for tile_start in range(
        start_idx + part * TILE_BLOCK_SIZE, end_idx, parallel_tiles * TILE_BLOCK_SIZE
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
        # In the output's width: an int64 output holds slots past 2**31 without wrapping.
        slot_ids = block_numbers.to(slot_mapping_ptr.dtype.element_ty) * block_size + slot_offsets
        slot_ids = tl.where(has_slot, slot_ids, PAD_ID)
        tl.store(slot_mapping_ptr + offsets, slot_ids, mask=mask)


@triton.jit(do_not_specialize=["num_tokens", "max_num_tokens", "num_reqs"])
def _compute_slot_mapping_direct_tokens_kernel(
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
    num_reqs=0,  # int: requests in the batch (the token grid does not say it)
    REQ_LANES: tl.constexpr = 1,  # a power of two >= num_reqs
    PAD_TILE_SIZE: tl.constexpr = 1024,  # padding entries a padding program writes
    EARLY_ENDS: tl.constexpr = True,  # sample the request ends before the guess is checked
):
    # The same formula on the token grid (GPU): program i maps tokens [i*TILE, (i+1)*TILE)
    # of whichever requests they belong to. Its position loads need nothing from
    # query_start_loc, so the two loads fly together; a decode batch needs a few programs
    # instead of one a request. Programs after the last token tile write the padding tail.
    tile_idx = tl.program_id(0)
    token_tiles = tl.cdiv(num_tokens, TILE_BLOCK_SIZE)
    if tile_idx >= token_tiles:
        _fill_token_grid_pad(
            slot_mapping_ptr,
            tile_idx,
            token_tiles,
            max_num_tokens,
            PAD_ID,
            TILE_BLOCK_SIZE,
            PAD_TILE_SIZE,
        )
        return

    tile_start = tile_idx * TILE_BLOCK_SIZE
    offsets = tile_start + tl.arange(0, TILE_BLOCK_SIZE)
    mask = offsets < num_tokens
    pos = tl.load(positions_ptr + offsets, mask=mask, other=0).to(tl.int32)
    # Each lane's request, answered at once (a likely decode run: the guess; else the tile's
    # first token's request); checked after the block-table load, off its chain.
    req_idx, likely, lane_ok, one = _token_grid_requests(
        query_start_loc_ptr, num_reqs, num_tokens, tile_start, TILE_BLOCK_SIZE, EARLY_ENDS
    )
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
    # Each lane loads its own entry from its own request's row, masked to the table.
    in_row = mask & has_slot & (block_indices >= 0) & (block_indices < block_table_stride)
    block_numbers, _ = _token_grid_entries(
        query_start_loc_ptr,
        num_reqs,
        num_tokens,
        tile_start,
        block_table_ptr,
        block_table_stride,
        query_start_loc_ptr,
        num_reqs,
        block_indices,
        in_row,
        req_idx,
        likely,
        lane_ok,
        one,
        TILE_BLOCK_SIZE,
        REQ_LANES,
        EARLY_ENDS,
        False,
    )
    # In the output's width: an int64 output holds slots past 2**31 without wrapping.
    slot_ids = block_numbers.to(slot_mapping_ptr.dtype.element_ty) * block_size + slot_offsets
    # Lanes past num_tokens in the last token tile are padding too.
    slot_ids = tl.where(mask & has_slot, slot_ids, PAD_ID)
    tl.store(slot_mapping_ptr + offsets, slot_ids, mask=offsets < max_num_tokens)


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
    token_parallel: bool | None = None,
) -> Tensor:
    """Slot of every batch token, one block-table load per token (no window precondition).

    Same arguments and result as ``compute_slot_mapping`` and ``slot_mapping_oracle``;
    ``tile_size``, ``parallel_tiles`` and ``num_warps`` as there.

    ``token_parallel``: launch on the token grid (program i maps batch tokens
    ``[i * tile, (i + 1) * tile)`` and finds their requests itself) instead of production's
    request grid. None: ``use_token_grid`` decides (the token grid on the GPU and the
    interpreter for batches of short requests; the request grid on the NPU and for long
    requests or large batches).
    """
    layout = SlotLayout.of(
        block_size, kv_cache_block_size, cp_world_size, cp_rank, cp_interleave, circular, pad_id
    )
    knobs = LaunchKnobs.of(tile_size, parallel_tiles, num_warps, None, token_parallel)
    key = ("direct", layout, knobs, num_tokens, max_num_tokens)
    tensors = (query_start_loc, positions, (block_table,), None, out)
    plan = None if validate else hot_plan(key, num_tokens, max_num_tokens, tensors)
    if plan is None:
        num_tokens, max_num_tokens = resolve_counts(
            *tensors[:2], num_tokens, max_num_tokens, validate
        )
        check_slot_mapping_inputs(
            layout, *tensors[:2], block_table, num_tokens, max_num_tokens, out=out, full=validate
        )
        check_launch_device(positions)
        plan = direct_plan(
            layout,
            knobs,
            num_tokens,
            max_num_tokens,
            query_start_loc.numel() - 1,
            block_table.shape[0],
        )
        if out is None:
            out = torch.empty(max_num_tokens, dtype=torch.int32, device=positions.device)
        remember_plan(key, plan, (*tensors[:4], out))
    args = slot_mapping_args(
        num_tokens,
        max_num_tokens or num_tokens,
        query_start_loc,
        positions,
        block_table,
        layout.block_size,
        out,
    )
    if not fast_launch(plan, args):  # Triton's C launcher, else its JIT
        plan.kernel[plan.grid](*args, **plan.constants, **plan.runtime)
    return out


def direct_plan(
    layout: SlotLayout,
    knobs: LaunchKnobs,
    num_tokens: int,
    max_num_tokens: int,
    num_reqs: int,
    req_capacity: int,
) -> Plan:
    """The direct kernels' launch for a batch: arithmetic only, no tensor read (the launcher,
    ``SlotMapper`` and warm-up). ``req_capacity``: the block table's rows."""
    if use_token_grid(num_tokens, num_reqs, knobs.token_parallel, knobs.parallel_tiles):
        # The token grid: program i maps batch tokens [i * tile, (i + 1) * tile), then
        # padding programs write the tail.
        kernel = _compute_slot_mapping_direct_tokens_kernel
        tile, grid, options = token_launch_shape(
            num_tokens,
            max_num_tokens,
            num_reqs,
            knobs.tile_size,
            knobs.num_warps,
            req_capacity=req_capacity,
        )
    else:  # production's request grid, as the window kernel's
        kernel = _compute_slot_mapping_direct_kernel
        tile, parallel, options = launch_shape(num_tokens, num_reqs, *knobs.request_grid())
        grid = (num_reqs + 1, parallel)
    runtime = {"parallel_tiles": parallel} if kernel is _compute_slot_mapping_direct_kernel else {}
    if "num_reqs" in options:  # the token kernel's runtime argument
        runtime["num_reqs"] = options.pop("num_reqs")
    constants = _direct_constants(layout, kernel, tile, tuple(options.items()))
    return Plan(kernel, check_grid(grid), constants, runtime)


@functools.lru_cache(maxsize=256)
def _direct_constants(layout: SlotLayout, kernel: object, tile: int, options: tuple) -> dict:
    # One dict a variant, shared by its plans (never modified): built once, not per launch.
    return layout.constants() | dict(options) | {"TILE_BLOCK_SIZE": tile}
