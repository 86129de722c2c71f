"""The pieces every slot-mapping kernel shares, as the lessons teach them: the per-position
formula, the bounded-window gather and the padding loop (Triton ``@triton.jit`` helpers).

Backend notes, because one code path serves three targets:

* index math stays in int32 (positions are validated to fit): on Ascend, int64 vector
  arithmetic and int32/int64 vector compares fall back to scalar code;
* ``GATHER_AS_FLOAT``: released triton-ascend's ``tl.gather`` takes only float types and int8.
  Production casts the int32 window to float32, which is exact only below 2**24. We split
  each entry into its high and low 16 bits, both exact in float32, gather both and put them
  back together: exact for every int32. It is on by default on the NPU only.
"""

from __future__ import annotations

import triton
import triton.language as tl

from slotmap.layout import INT32_MAX

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
