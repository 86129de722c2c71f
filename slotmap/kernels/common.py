"""Pieces every slot-mapping kernel shares: the per-position formula, the bounded-window
gather and the padding loop (Triton ``@triton.jit`` helpers), and the launchers' checks.

Backend notes, because one code path serves three targets:

* index math stays in int32 (positions are validated to fit): on Ascend, int64 vector
  arithmetic and int32/int64 vector compares fall back to scalar code;
* ``GATHER_AS_FLOAT``: released triton-ascend's ``tl.gather`` takes only float types and int8.
  Production casts the int32 window to float32, which is exact only below 2**24. We split
  each entry into its high and low 16 bits, both exact in float32, gather both and put them
  back together: exact for every int32. It is on by default on the NPU only.
"""

from __future__ import annotations

from typing import Any

import torch
import triton
import triton.language as tl
from torch import Tensor

from slotmap.backend import BACKEND
from slotmap.layout import INT32_MAX, PAD_SLOT_ID, window_size
from slotmap.validate import (
    as_int,
    check_is_tensor,
    check_pad_id,
    check_slot_mapping_inputs,
    resolve_counts,
)

DEFAULT_GATHER_AS_FLOAT = BACKEND.policy == "npu"
# The min-reduction's sentinel, as a compile-time constant the kernels can read.
INT32_MAX_SENTINEL: tl.constexpr = tl.constexpr(INT32_MAX)


@triton.jit
def _block_and_offset(
    pos,  # [TILE] int32 positions
    block_size,  # int: tokens per (attention) block
    kv_cache_block_size,  # int: tokens per physical block (a constexpr in the main kernel)
    BLOCKS_PER_KV_BLOCK: tl.constexpr,
    TOTAL_CP_WORLD_SIZE: tl.constexpr,
    TOTAL_CP_RANK: tl.constexpr,
    CP_KV_CACHE_INTERLEAVE_SIZE: tl.constexpr,
    IS_CIRCULAR: tl.constexpr,
):
    # position -> (logical block, block offset, does this rank store a slot for it?)
    if IS_CIRCULAR:
        # A ring buffer of one block. Negative positions are the padded tail of a sliding
        # window: they get no slot, and must not reach % (C truncates, Python floors).
        has_slot = pos >= 0
        block_indices = tl.zeros_like(pos)
        slot_offsets = tl.where(has_slot, pos, 0) % block_size
    elif TOTAL_CP_WORLD_SIZE > 1:
        # Context parallelism: W physical blocks, one per rank, form a virtual block.
        virtual_block_size = kv_cache_block_size * TOTAL_CP_WORLD_SIZE
        virtual_block_indices = pos // virtual_block_size
        virtual_block_offsets = pos % virtual_block_size
        # The token lives on rank (segment index) % W.
        has_slot = (
            virtual_block_offsets // CP_KV_CACHE_INTERLEAVE_SIZE
        ) % TOTAL_CP_WORLD_SIZE == TOTAL_CP_RANK
        # This rank's segments of the virtual block, packed one after another.
        local_block_offsets = (
            virtual_block_offsets // (TOTAL_CP_WORLD_SIZE * CP_KV_CACHE_INTERLEAVE_SIZE)
        ) * CP_KV_CACHE_INTERLEAVE_SIZE + virtual_block_offsets % CP_KV_CACHE_INTERLEAVE_SIZE
        block_indices = (
            virtual_block_indices * BLOCKS_PER_KV_BLOCK + local_block_offsets // block_size
        )
        slot_offsets = local_block_offsets % block_size
    else:
        # Common case: context parallelism is not used.
        has_slot = pos == pos
        block_indices = pos // block_size
        slot_offsets = pos - block_indices * block_size
    return block_indices, slot_offsets, has_slot


@triton.jit
def _gather_from_window(
    block_table_row_ptr,  # pointer to this request's block-table row, int32
    row_length,  # int: entries in the row (block_table_stride)
    block_indices,  # [TILE] int32 logical blocks
    valid,  # [TILE] bool: lanes that need a physical block
    BLOCK_TABLE_WINDOW_SIZE: tl.constexpr,
    GATHER_AS_FLOAT: tl.constexpr,
):
    # The bounded-window gather: one contiguous load of the block-table entries this tile
    # needs, then each lane picks its own entry from the window.
    # Smallest logical block among valid lanes; the others offer INT32_MAX to the min.
    block_idx_base = tl.min(tl.where(valid, block_indices, INT32_MAX_SENTINEL), axis=0)
    # A tile with no valid lane (another rank's tokens, padded circular tail) still loads a
    # harmless in-row window instead of forming an address from the sentinel.
    block_idx_base = tl.where(block_idx_base == INT32_MAX_SENTINEL, 0, block_idx_base)
    window_indices = block_idx_base + tl.arange(0, BLOCK_TABLE_WINDOW_SIZE)
    window_mask = (window_indices >= 0) & (window_indices < row_length)
    block_table_window = tl.load(block_table_row_ptr + window_indices, mask=window_mask, other=0)
    # Relative index into the window. The launcher checks the window precondition; the
    # clamp only keeps unvalidated input from gathering outside the window.
    relative_block_indices = block_indices - block_idx_base
    in_window = valid & (relative_block_indices >= 0)
    in_window = in_window & (relative_block_indices < BLOCK_TABLE_WINDOW_SIZE)
    relative_block_indices = tl.where(in_window, relative_block_indices, 0)
    if GATHER_AS_FLOAT:
        # Ascend: gather two exact float32 halves (each < 2**16) instead of one inexact one.
        high = (block_table_window >> 16).to(tl.float32)
        low = (block_table_window & 0xFFFF).to(tl.float32)
        high = tl.gather(high, relative_block_indices, 0).to(tl.int32)
        low = tl.gather(low, relative_block_indices, 0).to(tl.int32)
        block_numbers = (high << 16) | low
    else:
        block_numbers = tl.gather(block_table_window, relative_block_indices, 0)
    return block_numbers, block_idx_base


@triton.jit
def _guess_requests(
    query_start_loc_ptr,  # [num_reqs + 1], int32
    num_reqs,  # int: requests in the batch
    num_tokens,  # int: real tokens in the batch
    tile_start,  # int: first batch token of the tile
    TILE_BLOCK_SIZE: tl.constexpr,
):
    # The token grid's fast case: the tile is a run of one-token (decode) requests, token t
    # being request t at the batch's front or request t - (num_tokens - num_reqs) at its
    # back. Returns each lane's guessed request; ``likely``, from two scalar loads: the guess
    # starts at the tile's first token and its last lane's request ends after the tile's last
    # token (qsl[g_0] == t_0, qsl[g_0 + n] == t_0 + n; a branch on it waits for no
    # reduction); and ``lane_ok``, each lane's own end (qsl[g_i + 1] == t_i + 1), which
    # ``_guess_is_right`` folds after the block-table load. The loads wait for nothing, so
    # they fly together with the positions.
    lane = tl.arange(0, TILE_BLOCK_SIZE)
    offsets = tile_start + lane
    real = offsets < num_tokens
    shift = num_tokens - num_reqs
    first_guess = tl.where(tile_start >= shift, tile_start - shift, tile_start)
    guess = first_guess + lane
    stops = tl.load(query_start_loc_ptr + guess + 1, mask=real & (guess < num_reqs), other=-1)
    n = tl.minimum(num_tokens - tile_start, TILE_BLOCK_SIZE)  # real lanes, >= 1
    start = tl.load(query_start_loc_ptr + first_guess, mask=first_guess < num_reqs, other=-1)
    stop = tl.load(query_start_loc_ptr + first_guess + n, mask=first_guess + n <= num_reqs,
                   other=-1)  # fmt: skip
    likely = (start == tile_start) & (stop == tile_start + n)
    return guess, likely.to(tl.int32), (stops == offsets + 1) | ~real


@triton.jit
def _guess_is_right(likely, lane_ok):
    # The whole check of ``_guess_requests``'s guess: the first start and every lane's end.
    return likely & tl.min(lane_ok.to(tl.int32), 0)  # 1: right


@triton.jit
def _request_ends(
    query_start_loc_ptr,  # [num_reqs + 1], int32
    num_reqs,  # int: requests in the batch
    REQ_LANES: tl.constexpr,  # a power of two >= num_reqs
):
    # Every request's end, query_start_loc[1..num_reqs], in one load; INT32_MAX past them.
    j = tl.arange(0, REQ_LANES)
    return tl.load(query_start_loc_ptr + 1 + j, mask=j < num_reqs, other=INT32_MAX_SENTINEL)


@triton.jit
def _sample_request_ends(
    query_start_loc_ptr,  # [num_reqs + 1], int32
    num_reqs,  # int: requests in the batch
    TILE_BLOCK_SIZE: tl.constexpr,
):
    # The first and the last TILE / 2 request ends, one a lane (every end when num_reqs <=
    # TILE), INT32_MAX past them; the first end of the back half; and how many ends lie
    # between the halves, sampled by neither.
    half: tl.constexpr = TILE_BLOCK_SIZE // 2
    lane = tl.arange(0, TILE_BLOCK_SIZE)
    middle = tl.maximum(num_reqs - TILE_BLOCK_SIZE, 0)
    j = tl.where(lane < half, lane, lane + middle)
    ends = tl.load(query_start_loc_ptr + 1 + j, mask=j < num_reqs, other=INT32_MAX_SENTINEL)
    back_first = tl.load(query_start_loc_ptr + 1 + half + middle,
                         mask=half + middle < num_reqs, other=INT32_MAX_SENTINEL)  # fmt: skip
    return ends, back_first, middle


@triton.jit
def _sampled_request(
    ends,  # [TILE] int32: _sample_request_ends's sample
    back_first,  # int: its back half's first end
    middle,  # int: ends between its halves
    num_reqs,  # int: requests in the batch
    num_tokens,  # int: real tokens in the batch
    tile_start,  # int: first batch token of the tile
    TILE_BLOCK_SIZE: tl.constexpr,
):
    # The request of the tile's first token, and whether the whole tile lies inside it, from
    # the sample alone (one reduction, no further load). The request is the number of ends
    # at or below the token: every middle end is once the back half's first end is. Exact,
    # and the answer settled, where that request's own end was sampled (one of the first
    # TILE / 2 requests or of the last TILE / 2 - 1; any request when num_reqs <= TILE) and
    # no sampled end falls inside the tile; otherwise the caller falls back to the histogram.
    half: tl.constexpr = TILE_BLOCK_SIZE // 2
    last = tl.minimum(tile_start + TILE_BLOCK_SIZE, num_tokens) - 1
    # Both counts in one sum: ends at or below the first token in the low 16 bits, ends
    # inside the tile (after the first token, at or below the last) in the high ones.
    packed = tl.where(ends <= tile_start, 1, tl.where(ends <= last, 1 << 16, 0))
    counts = tl.sum(packed, 0)
    req = (counts & 0xFFFF) + tl.where(back_first <= tile_start, middle, 0)
    sampled_end = (req < half) | (req >= half + middle)
    settled = sampled_end & (req < num_reqs) & ((counts >> 16) == 0)
    return req, settled.to(tl.int32)


@triton.jit
def _histogram_requests(
    ends,  # [REQ_LANES] int32: _request_ends
    tile_start,  # int: first batch token of the tile
    TILE_BLOCK_SIZE: tl.constexpr,
):
    # Any tile: a token's request is the number of request ends at or below it. A histogram
    # of where the ends fall in the tile and its running sum count them for every lane
    # without a [TILE, num_reqs] compare. Empty requests share an end with the next one and
    # are skipped by the count.
    lane = tl.arange(0, TILE_BLOCK_SIZE)
    rel = ends - tile_start  # <= 0: ended before the tile, counts for every lane
    past = rel >= TILE_BLOCK_SIZE  # ends after the tile: counts for no lane
    bins = tl.minimum(tl.maximum(rel, 0), TILE_BLOCK_SIZE - 1)
    req_idx = tl.cumsum(tl.histogram(bins, TILE_BLOCK_SIZE), 0)
    # The ends past the tile went to the last bin, which only the last lane sums.
    past_count = tl.sum(past.to(tl.int32), 0)
    return req_idx - tl.where(lane == TILE_BLOCK_SIZE - 1, past_count, 0)


@triton.jit
def _token_grid_requests(
    query_start_loc_ptr,  # [num_reqs + 1], int32
    num_reqs,  # int: requests in the batch
    num_tokens,  # int: real tokens in the batch
    tile_start,  # int: first batch token of the tile
    TILE_BLOCK_SIZE: tl.constexpr,
    EARLY_ENDS: tl.constexpr,  # the batch cannot be all decode: sample the request ends now
):
    # The token grid's first answer to "which request is each lane's token in", for the
    # block-table load to use at once; ``_token_grid_settle`` checks it after that load.
    # A likely decode run takes the guess; any other tile of a batch that cannot be all
    # decode takes its first token's request (right for a long request's tiles), counted on
    # a sample of the request ends: one load a lane and one reduction, not a load of every
    # end (H200, mixed batch: 2.0 -> 1.9 us; benchmarks/NOTES.md). Only a tile that the
    # answer does not settle loads every end, after the block-table load.
    req_idx, likely, lane_ok = _guess_requests(
        query_start_loc_ptr, num_reqs, num_tokens, tile_start, TILE_BLOCK_SIZE
    )
    one = likely * 0  # the tile lies inside one request, as sampled
    if EARLY_ENDS:
        ends, back_first, middle = _sample_request_ends(
            query_start_loc_ptr, num_reqs, TILE_BLOCK_SIZE
        )
        first_req, one = _sampled_request(
            ends, back_first, middle, num_reqs, num_tokens, tile_start, TILE_BLOCK_SIZE
        )
        req_idx = tl.where(likely == 1, req_idx, first_req)
    return req_idx, likely, lane_ok, one


@triton.jit
def _token_grid_settle(
    query_start_loc_ptr,  # [num_reqs + 1], int32
    num_reqs,  # int: requests in the batch
    num_tokens,  # int: real tokens in the batch
    tile_start,  # int: first batch token of the tile
    req_idx,  # [TILE] int32: _token_grid_requests's answer
    likely,  # int: _token_grid_requests's
    lane_ok,  # [TILE] bool: _token_grid_requests's
    one,  # int: _token_grid_requests's
    TILE_BLOCK_SIZE: tl.constexpr,
    REQ_LANES: tl.constexpr,  # a power of two >= num_reqs
    EARLY_ENDS: tl.constexpr,
):
    # After the first block-table load, off its chain: was ``req_idx`` right? Returns
    # (1, req_idx) if so, else (0, every lane's request by a histogram of all the request
    # ends), which the kernel loads again. Only tiles across requests that are not a decode
    # run, tiles of a request in the batch's middle, or batches that break the guess's
    # pattern pay for that.
    settled = _guess_is_right(likely, lane_ok)
    if EARLY_ENDS:
        settled = tl.where(likely == 1, settled, one)
    if settled == 0:
        ends = _request_ends(query_start_loc_ptr, num_reqs, REQ_LANES)
        req_idx = _histogram_requests(ends, tile_start, TILE_BLOCK_SIZE)
    return settled, req_idx


@triton.jit
def _load_row_entries(
    block_table_ptr,  # this group's block table, int32
    block_table_stride,  # int: entries per row
    idx_mapping_ptr,  # [num_reqs], int32: batch index -> block-table row (if HAS_IDX_MAPPING)
    num_rows,  # int: rows of the block table (idx_mapping's entries must be below it)
    req_idx,  # [TILE] int32: each lane's request
    num_reqs,  # int: requests in the batch
    block_indices,  # [TILE] int32: each lane's logical block
    in_row,  # [TILE] bool: lanes with an entry to load
    HAS_IDX_MAPPING: tl.constexpr,
):
    # block_table[row(q), b] for every lane, each lane its own load (the token grid: a
    # tile may span requests), and whether the lane's row exists. Lanes of no request
    # (q >= num_reqs) load nothing, nor lanes whose unvalidated idx_mapping row is outside
    # [0, num_rows): their tokens get PAD_ID.
    in_batch = in_row & (req_idx < num_reqs)
    if HAS_IDX_MAPPING:
        row_idx = tl.load(idx_mapping_ptr + req_idx, mask=in_batch, other=0)
        row_ok = (row_idx >= 0) & (row_idx < num_rows)
    else:
        row_idx = req_idx
        row_ok = req_idx == req_idx
    entries = tl.load(
        block_table_ptr + row_idx * block_table_stride + block_indices,
        mask=in_batch & row_ok,
        other=0,
    )
    return entries, row_ok


@triton.jit
def _token_grid_entries(
    query_start_loc_ptr,  # [num_reqs + 1], int32
    num_reqs,  # int: requests in the batch
    num_tokens,  # int: real tokens in the batch
    tile_start,  # int: first batch token of the tile
    block_table_ptr,  # this group's block table, int32
    block_table_stride,  # int: entries per row
    idx_mapping_ptr,  # [num_reqs], int32 (if HAS_IDX_MAPPING)
    num_rows,  # int: rows of the block table
    block_indices,  # [TILE] int32: each lane's logical block
    in_row,  # [TILE] bool: lanes with an entry to load
    req_idx,  # [TILE] int32: _token_grid_requests's answer
    likely,  # int: _token_grid_requests's
    lane_ok,  # [TILE] bool: _token_grid_requests's
    one,  # int: _token_grid_requests's
    TILE_BLOCK_SIZE: tl.constexpr,
    REQ_LANES: tl.constexpr,
    EARLY_ENDS: tl.constexpr,
    HAS_IDX_MAPPING: tl.constexpr,
):
    # Both token kernels' block-table entries (and _load_row_entries's row_ok): load with the
    # first answer at once, then settle it (off the load's chain) and load again only where
    # it was wrong.
    block_numbers, row_ok = _load_row_entries(
        block_table_ptr, block_table_stride, idx_mapping_ptr, num_rows, req_idx, num_reqs,
        block_indices, in_row, HAS_IDX_MAPPING,
    )  # fmt: skip
    settled, req_idx = _token_grid_settle(
        query_start_loc_ptr, num_reqs, num_tokens, tile_start, req_idx, likely, lane_ok, one,
        TILE_BLOCK_SIZE, REQ_LANES, EARLY_ENDS,
    )  # fmt: skip
    if settled == 0:
        block_numbers, row_ok = _load_row_entries(
            block_table_ptr, block_table_stride, idx_mapping_ptr, num_rows, req_idx, num_reqs,
            block_indices, in_row, HAS_IDX_MAPPING,
        )  # fmt: skip
    return block_numbers, row_ok


@triton.jit
def _fill_pad(
    slot_mapping_ptr,  # output row
    first,  # int: first index to fill
    stop,  # int: one past the last index to fill
    step_tiles,  # int: tiles between two tiles of this program (parallel padding programs)
    PAD_ID: tl.constexpr,
    TILE_BLOCK_SIZE: tl.constexpr,
):
    # Write PAD_ID to [first, stop): the padding tail keeps the output shape fixed for graphs.
    for tile_start in range(first, stop, step_tiles * TILE_BLOCK_SIZE):
        offsets = tile_start + tl.arange(0, TILE_BLOCK_SIZE)
        tl.store(slot_mapping_ptr + offsets, PAD_ID, mask=offsets < stop)


@triton.jit
def _fill_token_grid_pad(
    slot_mapping_ptr,  # output row
    tile_idx,  # int: this program's index on the token grid (>= token_tiles)
    token_tiles,  # int: programs that map tokens, cdiv(num_tokens, TILE)
    max_num_tokens,  # int: length of the output row
    PAD_ID: tl.constexpr,
    TILE_BLOCK_SIZE: tl.constexpr,
    PAD_TILE_SIZE: tl.constexpr,
):
    # The token grid's padding programs: the tail after the last token tile (whose own lanes
    # past num_tokens it pads itself), PAD_TILE_SIZE entries a program.
    first = token_tiles * TILE_BLOCK_SIZE + (tile_idx - token_tiles) * PAD_TILE_SIZE
    offsets = first + tl.arange(0, PAD_TILE_SIZE)
    tl.store(slot_mapping_ptr + offsets, PAD_ID, mask=offsets < max_num_tokens)


def check_launch_device(tensor: Tensor) -> None:
    """Triton compiles for one device: refuse tensors on another before the launch."""
    if BACKEND.interpreted:
        if tensor.device.type != "cpu":
            raise ValueError(
                f"inputs are on {tensor.device}, but slotmap runs Triton's CPU interpreter: "
                "move them to the cpu or choose another backend with SLOTMAP_BACKEND"
            )
    elif tensor.device.type != BACKEND.device:
        raise ValueError(
            f"inputs are on {tensor.device}, but slotmap's backend is {BACKEND.name}: "
            f"move them to {BACKEND.device}"
        )


def check_int32_extent(name: str, tensor: Tensor) -> None:
    """Kernels index in int32: a tensor they index must have fewer than 2**31 elements."""
    if tensor.numel() > INT32_MAX:
        raise ValueError(f"{name} has {tensor.numel()} elements: more than int32 indexing allows")


def check_tile(tile_size: int) -> None:
    if tile_size < 1 or tile_size & (tile_size - 1):
        raise ValueError(f"tile_size must be a power of two, got {tile_size}")


def check_grid(grid: tuple[int, ...]) -> None:
    """Launch-grid limits: axes 1 and 2 of a CUDA grid, and an Ascend coreDim, are <= 65535."""
    limited = grid if BACKEND.policy == "npu" else grid[1:]
    if any(n > 65535 for n in limited):
        raise ValueError(f"launch grid {grid} exceeds 65535 programs along an axis")


def check_window_trace(window_trace: Tensor, num_reqs: int) -> None:
    """The trace is written in place: one contiguous int32 row per request."""
    if window_trace.dtype != torch.int32 or window_trace.dim() != 2:
        raise ValueError(
            f"window_trace must be a 2-D int32 tensor, got {window_trace.dtype} "
            f"with shape {tuple(window_trace.shape)}"
        )
    if window_trace.shape[0] != num_reqs or not window_trace.is_contiguous():
        raise ValueError(
            f"window_trace must be contiguous with one row per request ({num_reqs}), "
            f"got shape {tuple(window_trace.shape)}"
        )
    check_launch_device(window_trace)


# ---------------------------------------------------------------------------------------------
# The hot path: ``validate=False`` with ``num_tokens`` and ``out`` given, as a serving loop
# calls it. Triton's own ``kernel[grid](...)`` costs ~19 µs of Python on the H200's host, and
# the full argument checks cost as much again. A launch plan (grid and compile-time constants)
# depends only on the integer arguments, so it is worked out (and checked) once and cached;
# each hot call then only re-checks the tensors' structure (dtype, rank, device, contiguity,
# sizes) before launching. Anything unusual falls through to the full checks and their errors.
# ---------------------------------------------------------------------------------------------
LAUNCH_DEVICE_TYPE = "cpu" if BACKEND.interpreted else BACKEND.device
_PLANS: dict[tuple, list] = {}
_PLANS_SIZE = 256


def remember_plan(key: tuple, plan: list) -> None:
    """Store a launch plan ``[grid, constants, last tensors, kernel]`` whose integer arguments
    passed the full checks."""
    if len(_PLANS) >= _PLANS_SIZE:
        _PLANS.clear()
    _PLANS[key] = plan


def tensor_geometry(a: Tensor, b: Tensor, c: Tensor, d: Tensor) -> tuple:
    """What ``set_``, ``resize_`` or assigning ``.data`` can change on a tensor object and
    the kernels' bounds rely on, in as few reads as cover it: each tensor's first address
    and element count (a new storage, dtype or device moves the address; a shrink or a
    re-typed view changes the count), the block table's shape (its rows and row length bound
    the reads) and the output's contiguity (a stride-0 output covers one element).
    Attribute reads, no device sync."""
    return (
        a.data_ptr(), a.numel(), b.data_ptr(), b.numel(), c.data_ptr(), c.shape,
        d.data_ptr(), d.numel(), d.is_contiguous(),
    )  # fmt: skip


def same_tensors(seen: tuple, a: Tensor, b: Tensor, c: Tensor, d: Tensor | None) -> bool:
    """The very tensor objects of the plan's last launch (a serving loop's persistent
    buffers), with the geometry they had then: their structure was checked then, and an
    object shrunk or re-typed since (``set_``, ``resize_``, ``.data``) goes the full way.
    Identity first: ``==`` on tensors would compare their contents."""
    return (
        len(seen) == 5
        and seen[0] is a
        and seen[1] is b
        and seen[2] is c
        and seen[3] is d
        and seen[4] == tensor_geometry(a, b, c, d)
    )


def hot_inputs_ok(
    query_start_loc: Tensor,
    positions: Tensor,
    block_table: Tensor,
    out: Tensor | None,
    num_tokens: int | None,
    max_num_tokens: int | None,
) -> bool:
    """The structural checks the kernels rely on, as a handful of attribute reads. Not
    tensors at all (a list, say): False, and the full checks name them."""
    try:
        return _hot_inputs_ok(
            query_start_loc, positions, block_table, out, num_tokens, max_num_tokens
        )
    except (AttributeError, TypeError):
        return False


def _hot_inputs_ok(
    query_start_loc: Tensor,
    positions: Tensor,
    block_table: Tensor,
    out: Tensor | None,
    num_tokens: int | None,
    max_num_tokens: int | None,
) -> bool:
    if out is None or num_tokens is None:
        return False
    if max_num_tokens is None:
        max_num_tokens = num_tokens
    device = positions.device
    index = positions.get_device()  # an int: cheaper to compare than torch.device objects
    return (
        positions.dtype is torch.int64
        and query_start_loc.dtype is torch.int32
        and block_table.dtype is torch.int32
        and (out.dtype is torch.int32 or out.dtype is torch.int64)
        and device.type == LAUNCH_DEVICE_TYPE
        and query_start_loc.get_device() == index
        and block_table.get_device() == index
        and out.get_device() == index
        and positions.is_contiguous()
        and query_start_loc.is_contiguous()
        and block_table.is_contiguous()
        and out.is_contiguous()
        and len(positions.shape) == 1
        and len(query_start_loc.shape) == 1
        and len(block_table.shape) == 2
        and out.shape == (max_num_tokens,)
        and 0 <= num_tokens <= max_num_tokens
        and positions.shape[0] >= num_tokens
        and block_table.shape[0] >= query_start_loc.shape[0] - 1
        and 1 <= block_table.shape[1] <= INT32_MAX // max(block_table.shape[0], 1)
    )


def launch_cached_plan(
    key: tuple,
    query_start_loc: Tensor,
    positions: Tensor,
    block_table: Tensor,
    block_size: int,
    out: Tensor | None,
    num_tokens: int | None,
    max_num_tokens: int | None,
) -> bool:
    """A hot call: launch the plan cached under ``key`` (a launcher's integer arguments; the
    plan holds the kernel, grid and constants) and return True, when there is one and the
    tensors pass the structural checks.
    False: the caller goes the full way (``launch_slot_mapping``)."""
    plan = _PLANS.get(key)
    # The kernel takes these two as given: anything but an int (a float or numpy integer
    # equal to a cached one) goes the full way, which coerces or names it.
    if plan is None or type(num_tokens) is not int or type(block_size) is not int:
        return False
    if not same_tensors(plan[2], query_start_loc, positions, block_table, out):
        if not hot_inputs_ok(
            query_start_loc, positions, block_table, out, num_tokens, max_num_tokens
        ):
            return False
        plan[2] = (
            query_start_loc, positions, block_table, out,
            tensor_geometry(query_start_loc, positions, block_table, out),
        )  # fmt: skip
    grid, constants, _, kernel = plan
    kernel[grid](
        num_tokens, out.shape[0], query_start_loc, positions, block_table,
        block_table.stride(0), block_size, out, **constants,
    )  # fmt: skip
    return True


# Programs one launch may spread over the parallel-tile axis (grid axis 1 allows 65535).
MAX_PARALLEL_PROGRAMS = 16384
DECODE_TILE = 64  # the GPU's tile for batches of one- or two-token requests


def launch_shape(
    num_tokens: int,
    num_reqs: int,
    tile_size: int | None,
    parallel_tiles: int | None,
    num_warps: int | None,
) -> tuple[int, int, dict]:
    """(tile, parallel tiles per request, launch options) of a single-group launch.

    Chosen by backend from the batch's size alone, without a device sync, so that a captured
    graph replays the same grid. None picks; a number is taken as given.

    * NPU: production's launch, TILE_BLOCK_SIZE 1024 and grid ``(num_reqs + 1,)`` (a grid
      should not exceed the AI-core count); no ``num_warps`` (Ascend has no warps).
    * GPU (measured on the H200, benchmarks/NOTES.md):
      - tile: 1024, except a batch of one- or two-token requests on average (decode), which
        gets a 64-lane tile on one warp: a 1024-lane tile there costs 4 idle warps a request
        (decode 1024: 3.3 µs against 2.2 µs in a graph);
      - parallel tiles: a request of ``mean`` tokens is spread over ``cdiv(mean, tile)``
        programs, and a batch of more than one tile over at least 2, so that the few long
        prefills of a skewed batch (whose mean says nothing about them) walk half as many
        tiles (PERF.md: 65 programs walking 64 tiles each left the H200 under 10% of its
        bandwidth);
      - warps: one per 128 lanes (1 to 8), four positions a thread (two 16-byte loads).
    * CPU interpreter: the NPU's tile (the lessons' TILE_BLOCK_SIZE), the GPU's parallel
      tiles, so that the CPU suite runs the GPU's grid.
    """
    mean = -(-num_tokens // max(num_reqs, 1))
    if tile_size is None:
        gpu = BACKEND.policy == "cuda"
        tile_size = DECODE_TILE if gpu and mean <= 2 else 1024
    check_tile(tile_size)
    if parallel_tiles is None:
        if BACKEND.policy == "npu":
            parallel_tiles = 1
        else:
            parallel_tiles = -(-mean // tile_size)
            if tile_size > DECODE_TILE and num_tokens > tile_size:
                parallel_tiles = max(parallel_tiles, 2)
            budget = max(MAX_PARALLEL_PROGRAMS // (num_reqs + 1), 1)
            parallel_tiles = min(max(parallel_tiles, 1), budget)
    if parallel_tiles < 1:
        raise ValueError(f"parallel_tiles must be >= 1, got {parallel_tiles}")
    return tile_size, parallel_tiles, warps_option(tile_size, num_warps)


# The token grid (the direct kernels on the GPU): program i maps batch tokens
# [i * TILE, (i + 1) * TILE), whichever requests they belong to, and finds each token's
# request itself (``_token_grid_requests``, then ``_token_grid_entries``); the programs after
# the last token tile write the padding tail, PAD_TILE entries each. On a decode batch the
# chain of dependent loads shrinks from query_start_loc -> position -> block table -> store
# to position -> block table -> store, on a few programs instead of one a request (H200,
# graph of 20: decode 1024 from 2.22 to 1.80 us; benchmarks/NOTES.md).
MAX_TOKEN_GRID_REQS = 4096  # a tile the first answer does not settle loads every end
MAX_TOKEN_GRID_TOKENS = 1 << 16  # larger: bandwidth-bound, where the request grid is as fast
MAX_TOKEN_GRID_MEAN = 64  # longer requests on average: the request grid's tiles are as fast
TOKENS_PER_GRID = 256  # the tile spreads a batch over about this many programs (>= 32 lanes)
PAD_TILE = 1024  # entries of the padding tail a padding program writes


def use_token_grid(
    num_tokens: int, num_reqs: int, token_parallel: bool | None, parallel_tiles: int | None
) -> bool:
    """Whether a direct launch takes the token grid: as asked, else (``token_parallel``
    None) the GPU's and the interpreter's choice for a batch of short requests: at most
    MAX_TOKEN_GRID_MEAN tokens a request on average, MAX_TOKEN_GRID_TOKENS tokens and
    MAX_TOKEN_GRID_REQS requests, and no ``parallel_tiles`` given. Never by default on the
    NPU, where production's request grid is the design (a per-lane block-table load is a
    scalar load there, and ``tl.histogram`` has not run on triton-ascend)."""
    if token_parallel is None:
        return (
            BACKEND.policy != "npu"
            and parallel_tiles is None
            and num_reqs <= MAX_TOKEN_GRID_REQS
            and num_tokens <= MAX_TOKEN_GRID_TOKENS
            and num_tokens <= MAX_TOKEN_GRID_MEAN * max(num_reqs, 1)
        )
    if token_parallel and parallel_tiles is not None:
        raise ValueError("parallel_tiles belongs to the request grid: not with token_parallel")
    if token_parallel and num_reqs > MAX_TOKEN_GRID_REQS:
        raise ValueError(
            f"token_parallel takes at most {MAX_TOKEN_GRID_REQS} requests, got {num_reqs}"
        )
    return bool(token_parallel)


def token_launch_shape(
    num_tokens: int,
    max_num_tokens: int,
    num_reqs: int,
    tile_size: int | None,
    num_warps: int | None,
) -> tuple[int, tuple[int], dict]:
    """(tile, grid, launch options) of a token-grid launch; None picks, a number is taken.

    * tile: on the GPU ``next_power_of_2(num_tokens / TOKENS_PER_GRID)`` within 32..1024; the
      interpreter takes the lessons' 1024. Swept on the H200 (benchmarks/NOTES.md): small
      tiles on one warp win on decode and mixed batches (no cross-warp reduction);
    * warps: one up to 64 lanes, 4 above;
    * the kernel's ``num_reqs``, ``REQ_LANES`` (request ends a miss loads) and
      ``PAD_TILE_SIZE``, and ``EARLY_ENDS``: a batch that cannot be all decode
      (``num_tokens != num_reqs``) samples the request ends up front, beside the positions;
      a possible decode batch loads them only when its guess misses.
    """
    if tile_size is None:
        if BACKEND.policy == "cpu":
            tile_size = 1024
        else:
            wanted = triton.next_power_of_2(max(-(-num_tokens // TOKENS_PER_GRID), 1))
            tile_size = min(max(wanted, 32), 1024)
    check_tile(tile_size)
    if num_warps is None and BACKEND.policy != "npu":
        num_warps = 1 if tile_size <= 64 else 4
    token_tiles = -(-num_tokens // tile_size)
    pad_programs = -(-max(max_num_tokens - token_tiles * tile_size, 0) // PAD_TILE)
    options = warps_option(tile_size, num_warps)
    options.update(
        num_reqs=num_reqs,
        REQ_LANES=triton.next_power_of_2(max(num_reqs, 1)),
        PAD_TILE_SIZE=PAD_TILE,
        EARLY_ENDS=num_tokens != num_reqs,
    )
    return tile_size, (max(token_tiles + pad_programs, 1),), options


def warps_option(tile_size: int, num_warps: int | None) -> dict:
    """Launch options: GPU (and interpreter, which ignores it) ``num_warps``; none on the NPU."""
    if BACKEND.policy == "npu":
        if num_warps is not None:
            raise ValueError("num_warps has no meaning on the NPU backend")
        return {}
    if num_warps is not None and (num_warps < 1 or num_warps & (num_warps - 1)):
        raise ValueError(f"num_warps must be a power of two, got {num_warps}")
    return {"num_warps": num_warps or min(max(tile_size // 128, 1), 8)}


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


def slot_mapping_constants(
    block_size: int,
    tile_size: int,
    *,
    kv_cache_block_size: int | None = None,
    cp_world_size: int = 1,
    cp_rank: int = 0,
    cp_interleave: int = 1,
    pad_id: int = PAD_SLOT_ID,
    circular: bool = False,
    parallel_tiles: int | None = 1,
    window: bool = True,
    gather_as_float: bool | None = None,
) -> dict:
    """The compile-time constants of a single-group kernel; by default production's plain case.

    ``parallel_tiles`` None: the token grid's kernel, which has no request axis to split.

    ``window``: the window kernel's (``_compute_slot_mapping_kernel``), which adds
    BLOCK_TABLE_WINDOW_SIZE and GATHER_AS_FLOAT (None: the backend's default) to the direct
    kernel's. A launch that wants another window overrides BLOCK_TABLE_WINDOW_SIZE.
    """
    if kv_cache_block_size is None:
        kv_cache_block_size = block_size
    constants = dict(
        KV_CACHE_BLOCK_SIZE=kv_cache_block_size,
        BLOCKS_PER_KV_BLOCK=kv_cache_block_size // block_size,
        TOTAL_CP_WORLD_SIZE=cp_world_size,
        TOTAL_CP_RANK=cp_rank,
        CP_KV_CACHE_INTERLEAVE_SIZE=cp_interleave,
        PAD_ID=pad_id,
        TILE_BLOCK_SIZE=tile_size,
        IS_CIRCULAR=circular,
    )
    if parallel_tiles is not None:
        constants["PARALLEL_TILES"] = parallel_tiles
    if window:
        constants["BLOCK_TABLE_WINDOW_SIZE"] = window_size(tile_size, block_size)
        constants["GATHER_AS_FLOAT"] = (
            DEFAULT_GATHER_AS_FLOAT if gather_as_float is None else gather_as_float
        )
    return constants


def launch_slot_mapping(
    kernel: Any,
    key: tuple,
    query_start_loc: Tensor,
    positions: Tensor,
    block_table: Tensor,
    block_size: int,
    *,
    num_tokens: int | None,
    max_num_tokens: int | None,
    kv_cache_block_size: int | None,
    cp_world_size: int,
    cp_rank: int,
    cp_interleave: int,
    circular: bool,
    pad_id: int,
    out: Tensor | None,
    validate: bool,
    tile_size: int | None,
    parallel_tiles: int | None,
    num_warps: int | None,
    window: bool,
    gather_as_float: bool | None = None,
    window_trace: Tensor | None = None,
    token_kernel: Any = None,
    token_parallel: bool | None = None,
) -> Tensor:
    """What a single-group launcher does after a miss of its hot path, shared by window and
    direct: check the arguments, allocate ``out`` on the inputs' device when the caller gave
    none, launch ``kernel`` and cache its plan under ``key`` for the hot path. Returns ``out``.

    ``window``: ``kernel`` is the window kernel, which adds the window precondition and its
    constants. ``window_trace`` (window kernel only) is checked and passed on, never cached.
    ``token_kernel`` (direct only): the same formula on the token grid, launched instead of
    ``kernel`` when ``use_token_grid`` says so.
    """
    for name, tensor in (("query_start_loc", query_start_loc), ("positions", positions),
                         ("block_table", block_table)):  # fmt: skip
        check_is_tensor(name, tensor)
    block_size = as_int("block_size", block_size)
    num_tokens = as_int("num_tokens", num_tokens, optional=True)
    max_num_tokens = as_int("max_num_tokens", max_num_tokens, optional=True)
    kv_cache_block_size = as_int("kv_cache_block_size", kv_cache_block_size, optional=True)
    cp_world_size = as_int("cp_world_size", cp_world_size)
    cp_rank = as_int("cp_rank", cp_rank)
    cp_interleave = as_int("cp_interleave", cp_interleave)
    pad_id = check_pad_id(pad_id)
    tile_size = as_int("tile_size", tile_size, optional=True)
    parallel_tiles = as_int("parallel_tiles", parallel_tiles, optional=True)
    num_warps = as_int("num_warps", num_warps, optional=True)
    num_reqs = query_start_loc.numel() - 1
    if num_tokens is None:
        # The launch shape depends on the batch: read num_tokens first (one device sync).
        num_tokens, _ = resolve_counts(query_start_loc, positions, None, max_num_tokens, validate)
    tokens = token_kernel is not None and use_token_grid(
        num_tokens, num_reqs, token_parallel, parallel_tiles
    )
    if tokens:  # the token grid's shape needs max_num_tokens: worked out after the checks
        kernel, parallel_tiles, options = token_kernel, None, {}
    else:
        tile_size, parallel_tiles, options = launch_shape(
            num_tokens, num_reqs, tile_size, parallel_tiles, num_warps
        )
    if kv_cache_block_size is None:
        kv_cache_block_size = block_size
    num_tokens, max_num_tokens = check_slot_mapping_inputs(
        query_start_loc, positions, block_table, block_size,
        num_tokens=num_tokens, max_num_tokens=max_num_tokens,
        kv_cache_block_size=kv_cache_block_size, cp_world_size=cp_world_size, cp_rank=cp_rank,
        cp_interleave=cp_interleave, circular=circular, out=out, full=validate,
        tile_size=tile_size if window else None, pad_id=pad_id,
    )  # fmt: skip
    check_launch_device(positions)
    check_int32_extent("block_table", block_table)
    if tokens:
        tile_size, grid, options = token_launch_shape(
            num_tokens, max_num_tokens, num_reqs, tile_size, num_warps
        )
    else:
        grid = (num_reqs + 1, parallel_tiles)
    check_grid(grid)
    if out is None:
        out = torch.empty(max_num_tokens, dtype=torch.int32, device=positions.device)
    constants = slot_mapping_constants(
        block_size, tile_size, kv_cache_block_size=kv_cache_block_size,
        cp_world_size=cp_world_size, cp_rank=cp_rank, cp_interleave=cp_interleave,
        pad_id=pad_id, circular=circular, parallel_tiles=parallel_tiles, window=window,
        gather_as_float=gather_as_float,
    )  # fmt: skip
    constants.update(options)
    trace = {}
    if window_trace is None:
        remember_plan(key, [grid, constants, (), kernel])
    else:
        check_window_trace(window_trace, num_reqs)
        trace = dict(
            window_trace_ptr=window_trace,
            window_trace_width=window_trace.shape[1],
            TRACE_WINDOWS=True,
        )
    args = slot_mapping_args(
        num_tokens, max_num_tokens, query_start_loc, positions, block_table, block_size, out
    )
    kernel[grid](*args, **constants, **trace)
    return out
