"""The production slot-mapping kernel (the bounded-window gather) and its launcher.

Same parameter names and order as vLLM's and vllm-ascend's ``_compute_slot_mapping_kernel``
(docs/semantics.md §3), so that the production code reads familiar after the course. Our only
additions come after the production parameters, with defaults.
"""

from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl
from torch import Tensor

from slotmap.kernels.common import _block_and_offset, _fill_pad, _gather_from_window
from slotmap.kernels.launch import (
    DEFAULT_GATHER_AS_FLOAT,
    LaunchKnobs,
    Plan,
    check_grid,
    check_launch_device,
    check_window_trace,
    fast_launch,
    hot_plan,
    remember_plan,
    request_grid,
    warps_option,
)
from slotmap.layout import PAD_SLOT_ID, PRODUCTION_TILE, SlotLayout, window_size
from slotmap.validate import check_slot_mapping_inputs, resolve_counts


@triton.jit
def _real_token_count(query_start_loc_ptr, num_reqs, num_tokens):
    # query_start_loc[num_reqs], within [0, num_tokens]: a padded host count must not leave
    # the gap after the real tokens holding an earlier step's slots.
    return tl.minimum(tl.maximum(tl.load(query_start_loc_ptr + num_reqs), 0), num_tokens)


@triton.jit
def _pad_outside_requests(
    slot_mapping_ptr,  # output row
    query_start_loc_ptr,  # [num_reqs + 1], int32
    num_reqs,  # int: requests in the batch
    num_tokens,  # int: tokens in the batch (or a padded count: the multi-group kernels)
    max_num_tokens,  # int: length of the output row
    part,  # int: this padding program's index among the parallel ones
    parallel_tiles,  # int: padding programs
    PAD_ID: tl.constexpr,
    TILE_BLOCK_SIZE: tl.constexpr,
):
    # The padding programs' work: PAD_ID from the last request's end to max_num_tokens. That
    # end, query_start_loc[num_reqs] within [0, num_tokens], is num_tokens on valid input and
    # the real count under a padded one (whose gap must not keep an earlier step's slots).
    # Unvalidated input only: also the tokens before the first request's start, which no
    # request holds, so that every entry is written whatever query_start_loc holds.
    first = tl.minimum(tl.maximum(tl.load(query_start_loc_ptr), 0), num_tokens)
    tail = _real_token_count(query_start_loc_ptr, num_reqs, num_tokens) + part * TILE_BLOCK_SIZE
    _fill_pad(slot_mapping_ptr, tail, max_num_tokens, parallel_tiles, PAD_ID, TILE_BLOCK_SIZE)
    head = part * TILE_BLOCK_SIZE
    _fill_pad(slot_mapping_ptr, head, first, parallel_tiles, PAD_ID, TILE_BLOCK_SIZE)


@triton.jit(do_not_specialize=["num_tokens", "max_num_tokens", "parallel_tiles"])
def _compute_slot_mapping_kernel(
    num_tokens,  # int: real tokens in the batch (= query_start_loc[num_reqs])
    max_num_tokens,  # int: length of slot_mapping (a persistent buffer; past num_tokens: PAD_ID)
    query_start_loc_ptr,  # [num_reqs + 1], int32: request q owns tokens [qsl[q], qsl[q+1])
    positions_ptr,  # [>= num_tokens], int64: each token's position in its request
    block_table_ptr,  # [max_num_reqs, block_table_stride], int32: logical -> physical block
    block_table_stride,  # int: entries per block-table row
    block_size,  # int: tokens per (attention) block
    slot_mapping_ptr,  # [max_num_tokens], int32: output slot of every token
    KV_CACHE_BLOCK_SIZE: tl.constexpr,  # tokens per physical KV-cache block
    BLOCKS_PER_KV_BLOCK: tl.constexpr,  # KV_CACHE_BLOCK_SIZE // block_size (hybrid blocks)
    TOTAL_CP_WORLD_SIZE: tl.constexpr,  # context-parallel ranks (1: no CP)
    TOTAL_CP_RANK: tl.constexpr,  # this rank
    CP_KV_CACHE_INTERLEAVE_SIZE: tl.constexpr,  # tokens per CP segment
    PAD_ID: tl.constexpr,  # "no slot" (-1)
    TILE_BLOCK_SIZE: tl.constexpr,  # tokens per tile (a tile, not a KV block; 1024)
    BLOCK_TABLE_WINDOW_SIZE: tl.constexpr,  # next_pow2(cdiv(TILE, block_size) + 1)
    IS_CIRCULAR: tl.constexpr = False,  # ring-buffer cache: one block per row
    GATHER_AS_FLOAT: tl.constexpr = False,  # gather the window as exact float32 halves (NPU)
    window_trace_ptr=None,  # [num_reqs, window_trace_width], int32: window base of each tile
    window_trace_width=0,  # int: tiles recorded per request
    TRACE_WINDOWS: tl.constexpr = False,  # teaching aid: record where each tile's window starts
    parallel_tiles=1,  # programs per request along grid axis 1 (1: production)
):
    # slot = block_table[q, pos // block_size] * block_size + pos % block_size
    # e.g. block_size 4, row [7, 2]: positions 0..5 -> slots 28 29 30 31 8 9
    req_idx = tl.program_id(0)
    # Our addition for the GPU: program (q, p) handles tiles p, p + P, p + 2P, ... of request
    # q, so one long request is spread over P programs. With P == 1 (production's grid, and
    # the NPU's default) the loop below walks every tile of the request, as production does.
    part = tl.program_id(1)

    # The last program only pads [num_tokens, max_num_tokens) with PAD_ID.
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

    start_idx = tl.load(query_start_loc_ptr + req_idx)
    end_idx = tl.load(query_start_loc_ptr + req_idx + 1)
    # Both inside [0, num_tokens] even with unvalidated input (any int32): the tiles below
    # then address only the batch's tokens, never outside the positions or the output.
    start_idx = tl.minimum(tl.maximum(start_idx, 0), num_tokens)
    end_idx = tl.minimum(tl.maximum(end_idx, 0), num_tokens)
    block_table_row_ptr = block_table_ptr + req_idx * block_table_stride

    # One tile of TILE_BLOCK_SIZE tokens at a time; lanes past the request's end are masked.
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
        valid = mask & has_slot
        block_numbers, window_base = _gather_from_window(
            block_table_row_ptr,
            block_table_stride,
            block_indices,
            valid,
            BLOCK_TABLE_WINDOW_SIZE,
            GATHER_AS_FLOAT,
        )
        # In the output's width: an int64 output holds slots past 2**31 without wrapping.
        slot_ids = block_numbers.to(slot_mapping_ptr.dtype.element_ty) * block_size + slot_offsets
        slot_ids = tl.where(has_slot, slot_ids, PAD_ID)
        tl.store(slot_mapping_ptr + offsets, slot_ids, mask=mask)
        if TRACE_WINDOWS:
            # The window covered block-table entries [window_base, window_base + WINDOW).
            tile_index = (tile_start - start_idx) // TILE_BLOCK_SIZE
            trace_ptr = window_trace_ptr + req_idx * window_trace_width + tile_index
            tl.store(trace_ptr, window_base, mask=tile_index < window_trace_width)


def compute_slot_mapping(
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
    gather_as_float: bool | None = None,
    window_trace: Tensor | None = None,
) -> Tensor:
    """Slot of every batch token, with the production bounded-window kernel.

    Same arguments and result as ``slotmap.slot_mapping_oracle`` (docs/semantics.md §1-§2),
    and the launch's own: ``validate=False`` skips the checks that read tensor contents (with
    ``num_tokens`` and ``out`` given, no sync remains and a cached plan launches);
    ``tile_size``, ``parallel_tiles``, ``num_warps`` and ``gather_as_float`` force a launch
    choice (None: the backend's, ``slotmap.kernels.launch``); ``window_trace``, a teaching aid,
    an int32 [num_reqs, tiles] tensor that receives each tile's window base
    (``slotmap.window_bases_oracle`` says what to expect).
    """
    layout = SlotLayout.of(
        block_size, kv_cache_block_size, cp_world_size, cp_rank, cp_interleave, circular, pad_id
    )
    if window_trace is not None and tile_size is None:
        tile_size = PRODUCTION_TILE  # traces are read against the lessons' 1024 tiles
    knobs = LaunchKnobs.of(tile_size, parallel_tiles, num_warps, gather_as_float)
    key = ("window", layout, knobs, num_tokens, max_num_tokens)
    tensors = (query_start_loc, positions, (block_table,), None, out)
    cached = not validate and window_trace is None
    plan = hot_plan(key, num_tokens, max_num_tokens, tensors) if cached else None
    if plan is None:
        num_tokens, max_num_tokens = resolve_counts(
            *tensors[:2], num_tokens, max_num_tokens, validate
        )
        plan = window_plan(layout, knobs, num_tokens, query_start_loc.numel() - 1)
        check_slot_mapping_inputs(
            layout,
            *tensors[:2],
            block_table,
            num_tokens,
            max_num_tokens,
            out=out,
            full=validate,
            tile_size=plan.constants["TILE_BLOCK_SIZE"],
        )
        check_launch_device(positions)
        if out is None:
            out = torch.empty(max_num_tokens, dtype=torch.int32, device=positions.device)
        if cached:
            remember_plan(key, plan, (*tensors[:4], out))
    trace = {} if window_trace is None else window_trace_arguments(window_trace, query_start_loc)
    args = slot_mapping_args(
        num_tokens,
        max_num_tokens or num_tokens,
        query_start_loc,
        positions,
        block_table,
        layout.block_size,
        out,
    )
    if trace or not fast_launch(plan, args):  # Triton's C launcher, else its JIT
        plan.kernel[plan.grid](*args, **plan.constants, **plan.runtime, **trace)
    return out


def window_plan(layout: SlotLayout, knobs: LaunchKnobs, num_tokens: int, num_reqs: int) -> Plan:
    """The window kernel's launch for a batch of ``num_tokens`` tokens in ``num_reqs``
    requests: arithmetic only, no tensor read (the launcher, ``SlotMapper`` and warm-up)."""
    tile, parallel = request_grid(num_tokens, num_reqs, knobs.tile_size, knobs.parallel_tiles)
    # Production's request grid: program (q, p) maps tiles p, p + P, ... of request q; the
    # last row of programs pads the tail.
    grid = check_grid((num_reqs + 1, parallel))
    constants = _window_constants(layout, knobs, tile)
    return Plan(_compute_slot_mapping_kernel, grid, constants, {"parallel_tiles": parallel})


@functools.lru_cache(maxsize=256)
def _window_constants(layout: SlotLayout, knobs: LaunchKnobs, tile: int) -> dict:
    # One dict a variant, shared by its plans (never modified): built once, not per launch.
    constants = window_kernel_constants(layout, tile, 1, knobs.window_gather_as_float)
    del constants["parallel_tiles"]
    return constants | warps_option(tile, knobs.num_warps)


def window_trace_arguments(window_trace: Tensor, query_start_loc: Tensor) -> dict:
    """The window kernel's trace arguments, checked."""
    check_window_trace(window_trace, query_start_loc.numel() - 1)
    width = window_trace.shape[1]
    return dict(window_trace_ptr=window_trace, window_trace_width=width, TRACE_WINDOWS=True)


def window_kernel_constants(
    layout: SlotLayout,
    tile_size: int,
    parallel_tiles: int = 1,
    gather_as_float: bool | None = None,
) -> dict:
    """The window kernel's compile-time constants: the layout's, the tile, the window that
    fits it, the gather mode (None: the backend's) and the programs per request."""
    if gather_as_float is None:
        gather_as_float = DEFAULT_GATHER_AS_FLOAT
    return layout.constants() | dict(
        TILE_BLOCK_SIZE=tile_size,
        BLOCK_TABLE_WINDOW_SIZE=window_size(tile_size, layout.block_size),
        GATHER_AS_FLOAT=gather_as_float,
        parallel_tiles=parallel_tiles,
    )


def slot_mapping_args(
    num_tokens: int,
    max_num_tokens: int,
    query_start_loc: Tensor,
    positions: Tensor,
    block_table: Tensor,
    block_size: int,
    out: Tensor,
) -> tuple:
    """The runtime arguments of a single-group kernel, in the production kernel's order."""
    return (
        num_tokens,
        max_num_tokens,
        query_start_loc,
        positions,
        block_table,
        block_table.stride(0),
        block_size,
        out,
    )
