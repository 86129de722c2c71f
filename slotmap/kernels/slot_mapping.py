"""The production slot-mapping kernel (the bounded-window gather) and its launcher.

Same parameter names and order as vLLM's and vllm-ascend's ``_compute_slot_mapping_kernel``
(SPEC.md section 3), so that the production code reads familiar after the course. Our only
additions come after the production parameters, with defaults.
"""

from __future__ import annotations

import triton
import triton.language as tl
from torch import Tensor

from slotmap.kernels.common import (
    _block_and_offset,
    _fill_pad,
    _gather_from_window,
    launch_cached_plan,
    launch_slot_mapping,
)
from slotmap.layout import PAD_SLOT_ID, PRODUCTION_TILE


@triton.jit(do_not_specialize=["num_tokens", "max_num_tokens"])
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
    PARALLEL_TILES: tl.constexpr = 1,  # programs per request along grid axis 1 (1: production)
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
        _fill_pad(
            slot_mapping_ptr,
            num_tokens + part * TILE_BLOCK_SIZE,
            max_num_tokens,
            PARALLEL_TILES,
            PAD_ID,
            TILE_BLOCK_SIZE,
        )
        return

    start_idx = tl.load(query_start_loc_ptr + req_idx)
    end_idx = tl.load(query_start_loc_ptr + req_idx + 1)
    # Inside [0, num_tokens) even with unvalidated input: never write outside the output.
    start_idx = tl.maximum(start_idx, 0)
    end_idx = tl.minimum(end_idx, num_tokens)
    block_table_row_ptr = block_table_ptr + req_idx * block_table_stride

    # One tile of TILE_BLOCK_SIZE tokens at a time; lanes past the request's end are masked.
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
        valid = mask & has_slot
        block_numbers, window_base = _gather_from_window(
            block_table_row_ptr,
            block_table_stride,
            block_indices,
            valid,
            BLOCK_TABLE_WINDOW_SIZE,
            GATHER_AS_FLOAT,
        )
        slot_ids = block_numbers * block_size + slot_offsets
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

    query_start_loc: [num_reqs + 1] int32; positions: [>= num_tokens] int64;
    block_table: [max_num_reqs, max_num_blocks_per_req] int32 (attention-block numbers; see
    ``slotmap.expand_block_table`` for hybrid blocks). Returns [max_num_tokens] int32, or
    writes ``out`` (int32 or int64, e.g. a persistent buffer for graph capture).

    ``num_tokens`` defaults to ``query_start_loc[-1]`` (one device sync); ``max_num_tokens``
    to ``num_tokens``. ``validate=False`` skips the checks that read tensor contents (pass
    ``num_tokens`` too, and no sync remains). ``tile_size`` is TILE_BLOCK_SIZE (None: 1024,
    production's, except on the GPU, where a decode batch gets a 64-lane tile);
    ``gather_as_float`` None means the backend's default (True on the NPU).
    ``parallel_tiles`` (programs per request) and ``num_warps`` (GPU only) None choose by
    backend (``launch_shape``): production's one program per request on the NPU, long
    requests spread over several programs on the GPU.
    ``window_trace`` (a teaching aid): an int32 [num_reqs, tiles] tensor; the kernel writes
    the window base of tile t of request q (the first block-table entry its window loaded)
    at ``[q, t]`` and leaves tiles that do not exist untouched
    (``slotmap.window_bases_oracle`` says what to expect).
    Same arguments and result as ``slotmap.slot_mapping_oracle``.
    """
    # The hot path (see slotmap.kernels.common): a cached plan and structural checks only.
    num_reqs = query_start_loc.numel() - 1 if isinstance(query_start_loc, Tensor) else -1
    key = (
        "window", num_reqs, num_tokens, max_num_tokens, block_size,
        kv_cache_block_size, cp_world_size, cp_rank, cp_interleave, circular, pad_id, tile_size,
        parallel_tiles, num_warps, gather_as_float,
    )  # fmt: skip
    if not validate and window_trace is None and launch_cached_plan(
        key,
        query_start_loc, positions, block_table, block_size, out, num_tokens, max_num_tokens,
    ):  # fmt: skip
        return out
    if window_trace is not None and tile_size is None:
        tile_size = PRODUCTION_TILE  # traces are read against the lessons' 1024 tiles
    return launch_slot_mapping(
        _compute_slot_mapping_kernel, key,
        query_start_loc, positions, block_table, block_size,
        num_tokens=num_tokens, max_num_tokens=max_num_tokens,
        kv_cache_block_size=kv_cache_block_size, cp_world_size=cp_world_size, cp_rank=cp_rank,
        cp_interleave=cp_interleave, circular=circular, pad_id=pad_id, out=out,
        validate=validate, tile_size=tile_size, parallel_tiles=parallel_tiles,
        num_warps=num_warps, window=True, gather_as_float=gather_as_float,
        window_trace=window_trace,
    )  # fmt: skip
